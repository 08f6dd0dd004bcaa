//! What Caisse keeps about the provider side of a transaction, beside the API's record: the adapter that
//! carries it (fixed when the transaction is created, so a later change of the routes cannot send its status
//! queries to another provider), where the customer's browser returns, and the provider's own reference for
//! it (pawaPay `providerTransactionId`, MTN `financialTransactionId`), which is what a customer's receipt and
//! the provider's support desk quote.
//!
//! None of it is part of the API's objects (docs/api.md § Payments): the dashboard's detail shows it.

use serde::{Deserialize, Serialize};

/// The name of a provider API Caisse speaks (`pawapay`, `mtn_momo`, `sandbox`, ...), as the configuration's
/// `[adapters.*]` sections and the callback paths `/v1/notifications/{adapter}` spell it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AdapterName(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderFieldError {
    #[error("an adapter name is 1 to 32 characters of a-z, 0-9 and _")]
    AdapterName,
    #[error("a provider reference is 1 to {MAX_REFERENCE_LEN} printable ASCII characters without spaces")]
    Reference,
    #[error("not an absolute http:// or https:// URL of at most {MAX_RETURN_URL_LEN} characters")]
    ReturnUrl,
    #[error("the return URL must start with https:// in production")]
    ReturnUrlNotHttps,
}

impl AdapterName {
    pub fn parse(text: &str) -> Result<AdapterName, ProviderFieldError> {
        if super::records::is_short_code(text) {
            Ok(AdapterName(text.to_owned()))
        } else {
            Err(ProviderFieldError::AdapterName)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Longest provider reference kept; the providers' own are far shorter (UUIDs, digits).
pub const MAX_REFERENCE_LEN: usize = 100;

/// A provider's reference for a transaction. It comes from a provider's answer, which is untrusted input:
/// anything but a short run of printable ASCII is refused rather than stored and shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ProviderReference(String);

impl ProviderReference {
    pub fn parse(text: &str) -> Result<ProviderReference, ProviderFieldError> {
        let ok = (1..=MAX_REFERENCE_LEN).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_graphic());
        if ok {
            Ok(ProviderReference(text.to_owned()))
        } else {
            Err(ProviderFieldError::Reference)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Longest `url_retour` accepted.
pub const MAX_RETURN_URL_LEN: usize = 2048;

/// Where a provider that needs the customer's browser sends it back (`url_retour`). Caisse never fetches it,
/// so unlike a webhook URL its host is not checked; it is only a well-formed http(s) URL, https in production.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ReturnUrl(String);

impl ReturnUrl {
    pub fn parse(text: &str, production: bool) -> Result<ReturnUrl, ProviderFieldError> {
        let rest = match text.split_once("://") {
            Some(("https", rest)) => rest,
            Some(("http", _)) if production => return Err(ProviderFieldError::ReturnUrlNotHttps),
            Some(("http", rest)) => rest,
            _ => return Err(ProviderFieldError::ReturnUrl),
        };
        let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let ok = text.len() <= MAX_RETURN_URL_LEN
            && !host.is_empty()
            && !host.contains('@')
            && text.bytes().all(|b| b.is_ascii_graphic());
        if ok {
            Ok(ReturnUrl(text.to_owned()))
        } else {
            Err(ProviderFieldError::ReturnUrl)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

macro_rules! string_conversions {
    ($($ty:ident => $parse:expr),*) => {$(
        impl TryFrom<String> for $ty {
            type Error = ProviderFieldError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                $parse(&value)
            }
        }

        impl From<$ty> for String {
            fn from(value: $ty) -> String {
                value.0
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    )*};
}

// A stored return URL was checked by the rules of its environment when it was accepted; read back, it is
// held only to the shape every environment accepts.
string_conversions!(
    AdapterName => AdapterName::parse,
    ProviderReference => ProviderReference::parse,
    ReturnUrl => |text: &str| ReturnUrl::parse(text, false)
);

/// How a transaction reaches its provider, decided once when it is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderRoute {
    pub adapter: AdapterName,
    pub return_url: Option<ReturnUrl>,
}

/// Everything kept about a transaction's provider side; either part may be missing (a transaction created
/// before the store kept routes, or one the provider has not yet given a reference for).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderTrail {
    pub route: Option<ProviderRoute>,
    pub reference: Option<ProviderReference>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapter_names_are_checked() {
        assert!(AdapterName::parse("mtn_momo").is_ok());
        for bad in ["", "MTN", "a b", &"a".repeat(33)] {
            assert!(AdapterName::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn provider_references_refuse_what_a_hostile_answer_could_carry() {
        assert!(ProviderReference::parse("1234567890").is_ok());
        assert!(ProviderReference::parse("ABC.123-x_9").is_ok());
        for bad in ["", "a b", "é", "line\nbreak", &"a".repeat(MAX_REFERENCE_LEN + 1)] {
            assert!(ProviderReference::parse(bad).is_err(), "{bad:?}");
        }
        // Printable markup is kept as text; the dashboard escapes everything it shows.
        assert!(ProviderReference::parse("<script>").is_ok());
    }

    #[test]
    fn return_urls_follow_the_environment() {
        assert!(ReturnUrl::parse("https://shop.example/merci?c=42", true).is_ok());
        assert!(ReturnUrl::parse("http://localhost:3000/merci", false).is_ok());
        assert_eq!(ReturnUrl::parse("http://shop.example/", true), Err(ProviderFieldError::ReturnUrlNotHttps));
        for bad in ["shop.example", "ftp://x", "https://", "https:///path", "https://a b", "javascript:alert(1)"] {
            assert!(ReturnUrl::parse(bad, false).is_err(), "{bad:?}");
        }
        assert!(ReturnUrl::parse(&format!("https://a/{}", "x".repeat(MAX_RETURN_URL_LEN)), false).is_err());
    }
}
