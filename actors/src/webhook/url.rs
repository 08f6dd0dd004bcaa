//! The merchant's webhook URL (docs/api.md § Webhook delivery): `http://` or `https://` in the sandbox; in production
//! `https://` only, and never a host that is or resolves to a loopback, private, link-local or unspecified
//! address. The same check runs when the URL is set and again before each delivery (a name can be made to
//! resolve elsewhere later).

use std::net::{IpAddr, ToSocketAddrs};

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
    #[error("the host {0} is a loopback, private, link-local or unspecified address")]
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

/// Refuses a host that is, or resolves to, an address a public webhook must not reach.
pub fn check_host(host: &str, port: u16) -> Result<(), UrlError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addresses: Vec<IpAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => (bare, port)
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

pub fn forbidden(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback() || v4.is_private() || v4.is_link_local() || v4.is_unspecified() || v4.is_broadcast()
                // 100.64.0.0/10, carrier-grade NAT: private in practice.
                || (v4.octets()[0] == 100 && (v4.octets()[1] & 0xc0) == 64)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden(&IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || (first & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
        }
    }
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

    #[test]
    fn malformed_urls_are_refused() {
        for bad in ["", "example.com", "ftp://example.com", "https://", "http:///path"] {
            assert!(WebhookUrl::parse(bad, false).is_err(), "{bad}");
        }
        assert_eq!(WebhookUrl::parse(&format!("https://a.com/{}", "x".repeat(3000)), false), Err(UrlError::TooLong));
    }
}
