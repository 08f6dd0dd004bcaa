//! Who the client is, for throttling and logs: the TCP peer, or, when the peer is one of the operator's
//! `trusted_proxies`, the address that proxy saw, read from `X-Forwarded-For`.
//!
//! `X-Forwarded-For` is a list each proxy appends to, so only its right end is trustworthy: it is read from the
//! right, skipping addresses of trusted proxies, and the first other address is the client. A client can put
//! anything at the left end; it is never read past the first untrusted address.

use std::net::IpAddr;

/// One `trusted_proxies` entry: an address block in CIDR notation (`10.0.0.0/8`, `::1/128`, or a bare
/// address for one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (address, prefix) = match text.trim().split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text.trim(), None),
        };
        let network: IpAddr = address.parse().map_err(|_| format!("`{text}` is not an address or CIDR block"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(|| format!("`{text}`: bad prefix"))?,
        };
        Ok(Cidr { network, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                masked(u128::from(u32::from(net)), 32, self.prefix)
                    == masked(u128::from(u32::from(ip)), 32, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                masked(u128::from(net), 128, self.prefix) == masked(u128::from(ip), 128, self.prefix)
            }
            _ => false,
        }
    }
}

fn masked(bits: u128, width: u32, prefix: u8) -> u128 {
    let host_bits = width - u32::from(prefix);
    if host_bits >= 128 {
        0
    } else {
        bits >> host_bits
    }
}

/// The client's address: the peer, or what trusted proxies in front of it saw (see the module's doc).
pub fn client_address(peer: Option<IpAddr>, forwarded_for: Option<&str>, trusted: &[Cidr]) -> Option<IpAddr> {
    let peer = peer?;
    let is_trusted = |ip: IpAddr| trusted.iter().any(|cidr| cidr.contains(ip));
    if !is_trusted(peer) {
        return Some(peer);
    }
    let mut client = peer;
    // Bounded: a header of thousands of entries says nothing more than its right end.
    for hop in forwarded_for.unwrap_or_default().rsplit(',').take(32) {
        let Ok(ip) = hop.trim().parse::<IpAddr>() else { break };
        client = ip;
        if !is_trusted(ip) {
            break;
        }
    }
    Some(client)
}

/// The client's address of a request: [`client_address`] over every `X-Forwarded-For` line it carries, in
/// order. A proxy may add its own line after one the client sent, and reading only the first line would then
/// read the client's words.
pub fn of_request(req: &actix_web::HttpRequest, trusted: &[Cidr]) -> Option<IpAddr> {
    let lines: Vec<&str> = req.headers().get_all("x-forwarded-for").filter_map(|v| v.to_str().ok()).collect();
    let forwarded = (!lines.is_empty()).then(|| lines.join(","));
    client_address(req.peer_addr().map(|a| a.ip()), forwarded.as_deref(), trusted)
}

/// The address a throttle counts a client under: an IPv6 address by its /64, the block one subscriber is
/// given, so that its 2^64 addresses are not as many clients; an IPv4 client of a dual-stack listener
/// (`::ffff:a.b.c.d`) as itself.
pub fn counted(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::from([s[0], s[1], s[2], s[3], 0, 0, 0, 0]))
            }
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttles_count_ipv6_by_its_64_block() {
        assert_eq!(counted(ip("2001:db8:1:2:aaaa::1")), counted(ip("2001:db8:1:2:bbbb::9")));
        assert_ne!(counted(ip("2001:db8:1:2::1")), counted(ip("2001:db8:1:3::1")));
        assert_eq!(counted(ip("192.0.2.7")), ip("192.0.2.7"));
        assert_eq!(counted(ip("::ffff:192.0.2.7")), ip("192.0.2.7"), "IPv4 through a dual-stack listener");
    }

    /// Every line of the header is read, in order: a line a trusted proxy adds after the client's own is the
    /// one that names the client.
    #[test]
    fn every_forwarded_line_is_read() {
        let trusted = [Cidr::parse("10.0.0.0/8").unwrap()];
        let req = actix_web::test::TestRequest::default()
            .peer_addr("10.0.0.5:4000".parse().unwrap())
            .append_header(("X-Forwarded-For", "6.6.6.6"))
            .append_header(("X-Forwarded-For", "198.51.100.7"))
            .to_http_request();
        assert_eq!(of_request(&req, &trusted), Some(ip("198.51.100.7")));
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn blocks_are_parsed_and_matched() {
        let private = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(private.contains(ip("10.1.2.3")) && !private.contains(ip("11.0.0.1")));
        assert!(private.contains(ip("::ffff:10.9.9.9")), "an IPv4-mapped address is its IPv4 one");
        assert!(Cidr::parse("127.0.0.1").unwrap().contains(ip("127.0.0.1")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        assert!(Cidr::parse("fd00::/8").unwrap().contains(ip("fd12::1")));
        for bad in ["10.0.0.0/33", "nope", "10.0.0.0/x", "::/129"] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_the_right_end_behind_trusted_proxies_counts() {
        let trusted = [Cidr::parse("10.0.0.0/8").unwrap()];
        let proxy = Some(ip("10.0.0.5"));
        // Not from a trusted proxy: the header is ignored.
        assert_eq!(client_address(Some(ip("203.0.113.9")), Some("1.2.3.4"), &trusted), Some(ip("203.0.113.9")));
        // From the proxy: the last untrusted hop; a forged left end is not read.
        assert_eq!(client_address(proxy, Some("6.6.6.6, 198.51.100.7"), &trusted), Some(ip("198.51.100.7")));
        assert_eq!(client_address(proxy, Some("198.51.100.7, 10.0.0.9"), &trusted), Some(ip("198.51.100.7")));
        // Without a usable header the proxy itself is what is known.
        assert_eq!(client_address(proxy, None, &trusted), proxy);
        assert_eq!(client_address(proxy, Some("garbage"), &trusted), proxy);
        assert_eq!(client_address(Some(ip("10.0.0.5")), Some("1.2.3.4"), &[]), Some(ip("10.0.0.5")));
    }
}
