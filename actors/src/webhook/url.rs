//! The merchant's webhook URL (docs/api.md § Webhook delivery): `http://` or `https://` in the sandbox; in production
//! `https://` only, and never a host that is or resolves to an address that is not global unicast (loopback,
//! private, link-local, shared, reserved, documentation, multicast, and IPv6 forms that carry such an IPv4
//! address). The same check runs when the URL is set and again before each delivery (a name can be made to
//! resolve elsewhere later).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs};

use awc::http::Uri;

/// Longest URL accepted; a webhook URL has no reason to be longer.
pub const MAX_URL_LEN: usize = 2048;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("not a valid absolute URL")]
    Malformed,
    #[error("the URL is longer than {MAX_URL_LEN} characters")]
    TooLong,
    #[error("the URL must start with https:// (or http:// in the sandbox)")]
    Scheme,
    #[error("production webhooks must use https://")]
    HttpInProduction,
    #[error("the host {0} is not a public address (loopback, private, link-local, reserved or multicast)")]
    ForbiddenAddress(String),
    #[error("the host {0} does not resolve")]
    Unresolvable(String),
}

/// A URL that passed the checks of its environment at the time it was checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookUrl(String);

impl WebhookUrl {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Parses and checks `text`; `production` applies the production rules above, which resolve the host
    /// (blocking DNS): call it where blocking is acceptable, or on a blocking thread.
    pub fn parse(text: &str, production: bool) -> Result<WebhookUrl, UrlError> {
        if text.len() > MAX_URL_LEN {
            return Err(UrlError::TooLong);
        }
        let uri: Uri = text.parse().map_err(|_| UrlError::Malformed)?;
        let host = uri.host().filter(|h| !h.is_empty()).ok_or(UrlError::Malformed)?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(UrlError::Scheme),
        };
        if production {
            if !https {
                return Err(UrlError::HttpInProduction);
            }
            check_host(host, uri.port_u16().unwrap_or(443))?;
        }
        Ok(WebhookUrl(text.to_owned()))
    }
}

/// Refuses a host that is, or resolves to, an address a public webhook must not reach. A host written as a
/// number in any form a resolver accepts (`2130706433`, `0177.0.0.1`, `0x7f.1`, `127.1`) is read as the
/// address it means, so the answer does not depend on the resolver.
pub fn check_host(host: &str, port: u16) -> Result<(), UrlError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addresses: Vec<IpAddr> = match bare.parse::<IpAddr>().ok().or_else(|| loose_ipv4(bare).map(IpAddr::V4)) {
        Some(ip) => vec![ip],
        None => (bare, port)
            .to_socket_addrs()
            .map_err(|_| UrlError::Unresolvable(host.to_owned()))?
            .map(|a| a.ip())
            .collect(),
    };
    if addresses.is_empty() {
        return Err(UrlError::Unresolvable(host.to_owned()));
    }
    match addresses.iter().find(|ip| forbidden(ip)) {
        Some(_) => Err(UrlError::ForbiddenAddress(host.to_owned())),
        None => Ok(()),
    }
}

/// An IPv4 address in the forms `inet_aton` accepts: one to four parts, each decimal, octal (leading `0`) or
/// hexadecimal (`0x`), the last part filling the remaining bytes (`127.1` is 127.0.0.1, `2130706433` too).
pub fn loose_ipv4(text: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for part in &parts {
        let (digits, radix) = match part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            Some(hex) => (hex, 16),
            None if part.len() > 1 && part.starts_with('0') => (&part[1..], 8),
            None => (*part, 10),
        };
        if digits.is_empty() && radix != 16 {
            return None;
        }
        let value = if digits.is_empty() { 0 } else { u64::from_str_radix(digits, radix).ok()? };
        values.push(value);
    }
    let (last, head) = values.split_last()?;
    if head.iter().any(|v| *v > 255) || *last >= 1u64 << (8 * (5 - values.len())) {
        return None;
    }
    let mut address = head.iter().enumerate().fold(0u64, |acc, (i, v)| acc | (v << (24 - 8 * i)));
    address |= last;
    Some(Ipv4Addr::from(address as u32))
}

/// True for every address a public webhook must not reach: anything not globally routable unicast.
pub fn forbidden(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(*v4),
        IpAddr::V6(v6) => forbidden_v6(*v6),
    }
}

/// IPv4 ranges that are not global unicast (RFC 6890 and its updates).
const FORBIDDEN_V4: &[(u32, u8)] = &[
    (0x0000_0000, 8),  // 0.0.0.0/8, "this network"
    (0x0a00_0000, 8),  // 10.0.0.0/8, private
    (0x6440_0000, 10), // 100.64.0.0/10, carrier-grade NAT
    (0x7f00_0000, 8),  // 127.0.0.0/8, loopback
    (0xa9fe_0000, 16), // 169.254.0.0/16, link-local
    (0xac10_0000, 12), // 172.16.0.0/12, private
    (0xc000_0000, 24), // 192.0.0.0/24, IETF protocol assignments
    (0xc000_0200, 24), // 192.0.2.0/24, documentation
    (0xc058_6300, 24), // 192.88.99.0/24, 6to4 relays (deprecated)
    (0xc0a8_0000, 16), // 192.168.0.0/16, private
    (0xc612_0000, 15), // 198.18.0.0/15, benchmarking
    (0xc633_6400, 24), // 198.51.100.0/24, documentation
    (0xcb00_7100, 24), // 203.0.113.0/24, documentation
    (0xe000_0000, 4),  // 224.0.0.0/4, multicast
    (0xf000_0000, 4),  // 240.0.0.0/4, reserved, and the broadcast address
];

fn forbidden_v4(v4: Ipv4Addr) -> bool {
    let bits = u32::from(v4);
    FORBIDDEN_V4.iter().any(|(net, len)| bits >> (32 - len) == net >> (32 - len))
}

fn forbidden_v6(v6: Ipv6Addr) -> bool {
    let bits = u128::from(v6);
    let within = |net: u128, len: u32| bits >> (128 - len) == net >> (128 - len);
    // Forms that carry an IPv4 address are judged by it.
    let embedded = |shift: u32| Ipv4Addr::from((bits >> shift) as u32);
    if within(0, 96) {
        // ::/96: the unspecified and loopback addresses, and the deprecated IPv4-compatible ::a.b.c.d.
        return bits <= 1 || forbidden_v4(embedded(0));
    }
    if within(0xffff_0000_0000, 96) {
        return forbidden_v4(embedded(0)); // ::ffff:a.b.c.d, IPv4-mapped
    }
    if within(0x0064_ff9b << 96, 96) {
        return forbidden_v4(embedded(0)); // 64:ff9b::/96, NAT64
    }
    if within(0x2002 << 112, 16) {
        return forbidden_v4(embedded(80)); // 2002::/16, 6to4: the IPv4 address follows the prefix
    }
    const FORBIDDEN: &[(u128, u32)] = &[
        (0x0064_ff9b_0001 << 80, 48), // 64:ff9b:1::/48, local-use NAT64
        (0x0100 << 112, 64),          // 100::/64, discard-only
        (0x2001 << 112, 32),          // 2001::/32, Teredo (its IPv4 address is obfuscated: refused)
        (0x2001_0002 << 96, 48),      // 2001:2::/48, benchmarking
        (0x2001_0010 << 96, 28),      // 2001:10::/28, ORCHID
        (0x2001_0db8 << 96, 32),      // 2001:db8::/32, documentation
        (0xfc00 << 112, 7),           // fc00::/7, unique local
        (0xfe80 << 112, 10),          // fe80::/10, link-local
        (0xfec0 << 112, 10),          // fec0::/10, site-local (deprecated)
        (0xff00 << 112, 8),           // ff00::/8, multicast
    ];
    FORBIDDEN.iter().any(|(net, len)| within(*net, *len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_accepts_http_and_loopback() {
        assert!(WebhookUrl::parse("http://127.0.0.1:9000/hook", false).is_ok());
        assert!(WebhookUrl::parse("https://example.com/hook", false).is_ok());
    }

    #[test]
    fn production_refuses_http_and_private_hosts() {
        let p = true;
        assert_eq!(WebhookUrl::parse("http://example.com/h", p), Err(UrlError::HttpInProduction));
        for host in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.1.1",
            "172.16.0.1",
            "169.254.1.1",
            "0.0.0.0",
            "[::1]",
            "[fe80::1]",
            "[fd00::1]",
            "[::ffff:127.0.0.1]",
            "localhost",
        ] {
            let url = format!("https://{host}/hook");
            assert!(matches!(WebhookUrl::parse(&url, p), Err(UrlError::ForbiddenAddress(_))), "{url}");
        }
        assert!(WebhookUrl::parse("https://8.8.8.8/hook", p).is_ok());
    }

    /// Every range, in every textual form a URL can carry it: canonical, decimal, octal, hex, short, bracketed
    /// IPv6, mapped, compatible, NAT64 and 6to4.
    #[test]
    fn every_non_global_destination_is_refused_in_every_form() {
        let refused = [
            "0.1.2.3",
            "10.0.0.1",
            "100.64.0.1",
            "100.127.255.254",
            "127.0.0.1",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.1",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.0.1",
            "198.18.0.1",
            "198.19.255.1",
            "198.51.100.1",
            "203.0.113.1",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            // The same addresses written as a resolver reads numbers.
            "2130706433",
            "0177.0.0.1",
            "0x7f.0.0.1",
            "0x7f000001",
            "127.1",
            "127.0.1",
            "0",
            "0xa9fea9fe",
            "012.0.0.1",
            "0300.0250.1.1",
            // IPv6.
            "[::]",
            "[::1]",
            "[::ffff:127.0.0.1]",
            "[::ffff:7f00:1]",
            "[::127.0.0.1]",
            "[::10.0.0.1]",
            "[64:ff9b::127.0.0.1]",
            "[64:ff9b::a00:1]",
            "[64:ff9b:1::1]",
            "[2002:7f00:1::1]",
            "[2002:a9fe:a9fe::]",
            "[2001::1]",
            "[2001:0:4136:e378::1]",
            "[2001:db8::1]",
            "[2001:2::1]",
            "[2001:10::1]",
            "[100::1]",
            "[fc00::1]",
            "[fd12:3456::1]",
            "[fe80::1]",
            "[febf::1]",
            "[fec0::1]",
            "[ff02::1]",
            "[ff0e::1]",
        ];
        for host in refused {
            let url = format!("https://{host}/hook");
            assert!(matches!(WebhookUrl::parse(&url, true), Err(UrlError::ForbiddenAddress(_))), "{url}");
        }
        let allowed = [
            "8.8.8.8",
            "1.1.1.1",
            "100.63.255.255",
            "100.128.0.1",
            "172.32.0.1",
            "192.0.1.1",
            "198.17.255.255",
            "223.255.255.255",
            "134744072",
            "0x08080808",
            "[2606:4700:4700::1111]",
            "[::ffff:8.8.8.8]",
            "[64:ff9b::808:808]",
            "[2002:808:808::1]",
        ];
        for host in allowed {
            let url = format!("https://{host}/hook");
            assert_eq!(WebhookUrl::parse(&url, true).map(|u| u.as_str().to_owned()), Ok(url.clone()), "{url}");
        }
    }

    #[test]
    fn loose_ipv4_reads_what_inet_aton_reads() {
        let read = |t: &str| loose_ipv4(t).map(|a| a.to_string());
        assert_eq!(read("127.1").as_deref(), Some("127.0.0.1"));
        assert_eq!(read("10.1.2").as_deref(), Some("10.1.0.2"));
        assert_eq!(read("0x7f.0.0.01").as_deref(), Some("127.0.0.1"));
        assert_eq!(read("4294967295").as_deref(), Some("255.255.255.255"));
        for not_a_number in ["", "example", "1.2.3.4.5", "256.1.1.1", "4294967296", "08.1.1.1", "1..1", "1.2.3.256"] {
            assert_eq!(read(not_a_number), None, "{not_a_number}");
        }
    }

    #[test]
    fn malformed_urls_are_refused() {
        for bad in ["", "example.com", "ftp://example.com", "https://", "http:///path"] {
            assert!(WebhookUrl::parse(bad, false).is_err(), "{bad}");
        }
        assert_eq!(WebhookUrl::parse(&format!("https://a.com/{}", "x".repeat(3000)), false), Err(UrlError::TooLong));
    }
}
