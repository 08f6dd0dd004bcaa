//! Checked text values: references, e-mail addresses, bounded free text, metadata and
//! idempotency keys.
//!
//! Every string a merchant sends ends up in a durable record, in webhooks and on the dashboard,
//! so its size and alphabet are bounded once, here, at the moment it is built or deserialised
//! (docs/api.md § Idempotency, Payments, Payouts). The rest of the engine can then store and echo these values
//! without checking them again.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize, Serializer};

/// Which rule a text value broke.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum TextError {
    /// The value must contain at least one character.
    #[error("must not be empty")]
    Empty,
    /// The value has more characters than allowed.
    #[error("must be at most {max} characters long")]
    TooLong {
        /// The limit that was exceeded, in characters.
        max: usize,
    },
    /// The value contains a character outside its allowed alphabet.
    #[error("contains a character that is not allowed")]
    InvalidChar,
    /// The value is not shaped like `local@domain.tld`.
    #[error("must be an e-mail address like name@example.com")]
    InvalidEmail,
    /// The metadata object has too many keys.
    #[error("metadata must have at most {max} keys")]
    TooManyKeys {
        /// The maximum number of keys.
        max: usize,
    },
    /// A metadata key is empty, too long or contains a control character.
    #[error("metadata keys must be 1 to 100 characters without control characters")]
    InvalidKey,
    /// A metadata value is longer than allowed.
    #[error("metadata value for key `{key}` must be at most {max} characters long")]
    ValueTooLong {
        /// The key whose value is too long, so the client can find it.
        key: String,
        /// The limit, in characters.
        max: usize,
    },
}

/// Whether `c` is one of the ASCII control characters refused in free text (U+0000 to U+001F
/// and U+007F); they break logs, CSV exports and terminal output.
fn is_forbidden_control(c: char) -> bool {
    c <= '\u{1f}' || c == '\u{7f}'
}

/// Checks the character count against `1..=max` without counting past the limit.
fn check_length(value: &str, max: usize) -> Result<(), TextError> {
    if value.is_empty() {
        return Err(TextError::Empty);
    }
    if value.chars().nth(max).is_some() {
        return Err(TextError::TooLong { max });
    }
    Ok(())
}

/// Implements the conversions shared by the string newtypes that have a `check` function:
/// display, borrowing, parsing, and the `String` round trip serde uses.
macro_rules! checked_string {
    ($ty:ident) => {
        impl $ty {
            /// Checks `value` and keeps a copy of it.
            pub fn parse(value: &str) -> Result<$ty, TextError> {
                Self::check(value)?;
                Ok($ty(value.to_string()))
            }

            /// The checked value.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// Gives back the checked value without copying it.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $ty {
            type Err = TextError;

            fn from_str(value: &str) -> Result<$ty, TextError> {
                $ty::parse(value)
            }
        }

        impl TryFrom<String> for $ty {
            type Error = TextError;

            fn try_from(value: String) -> Result<$ty, TextError> {
                $ty::check(&value)?;
                Ok($ty(value))
            }
        }

        impl From<$ty> for String {
            fn from(value: $ty) -> String {
                value.0
            }
        }
    };
}

/// A payment reference: chosen by the merchant or generated as a `pay_…` id.
///
/// The alphabet `[A-Za-z0-9_-]` is safe in URL paths and store keys without escaping, which is
/// why the API restricts it to that.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Reference(String);

impl Reference {
    /// Longest accepted reference.
    pub const MAX_LEN: usize = 64;

    fn check(value: &str) -> Result<(), TextError> {
        check_length(value, Self::MAX_LEN)?;
        if !value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
            return Err(TextError::InvalidChar);
        }
        Ok(())
    }
}

checked_string!(Reference);

/// An e-mail address, checked for shape only.
///
/// Full RFC 5322 validation would accept addresses no provider can use and still not prove the
/// mailbox exists, so only the structure is checked: one `@`, a non-empty local part, and a
/// domain with a dot and no empty labels.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Email(String);

impl Email {
    /// Longest accepted address, the practical limit of SMTP paths.
    pub const MAX_LEN: usize = 254;

    fn check(value: &str) -> Result<(), TextError> {
        check_length(value, Self::MAX_LEN)?;
        if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(TextError::InvalidChar);
        }
        let mut parts = value.split('@');
        let (Some(local), Some(domain), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(TextError::InvalidEmail);
        };
        // Splitting on dots finds a missing dot, a leading or trailing dot and `..` in one pass:
        // each of them except the missing dot shows up as an empty label.
        let has_empty_label = domain.split('.').any(str::is_empty);
        if local.is_empty() || !domain.contains('.') || has_empty_label {
            return Err(TextError::InvalidEmail);
        }
        Ok(())
    }
}

checked_string!(Email);

/// Free text of 1 to `MAX` characters without ASCII control characters.
///
/// The text is kept exactly as sent, without trimming, so what the merchant reads back is what
/// it wrote. Newlines are control characters and are therefore refused.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct BoundedText<const MAX: usize>(String);

/// A payment or payout description (at most 500 characters, docs/api.md § Payments).
pub type Description = BoundedText<500>;
/// A customer or beneficiary name.
pub type Name = BoundedText<200>;
/// A reason, such as a refund reason or a payout rejection reason.
pub type Reason = BoundedText<500>;

impl<const MAX: usize> BoundedText<MAX> {
    /// Longest accepted text, in characters.
    pub const MAX_LEN: usize = MAX;

    fn check(value: &str) -> Result<(), TextError> {
        check_length(value, MAX)?;
        if value.chars().any(is_forbidden_control) {
            return Err(TextError::InvalidChar);
        }
        Ok(())
    }

    /// Checks `value` and keeps a copy of it.
    pub fn parse(value: &str) -> Result<BoundedText<MAX>, TextError> {
        Self::check(value)?;
        Ok(BoundedText(value.to_string()))
    }

    /// The checked text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Gives back the checked text without copying it.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl<const MAX: usize> fmt::Display for BoundedText<MAX> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<const MAX: usize> AsRef<str> for BoundedText<MAX> {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl<const MAX: usize> FromStr for BoundedText<MAX> {
    type Err = TextError;

    fn from_str(value: &str) -> Result<BoundedText<MAX>, TextError> {
        BoundedText::parse(value)
    }
}

impl<const MAX: usize> TryFrom<String> for BoundedText<MAX> {
    type Error = TextError;

    fn try_from(value: String) -> Result<BoundedText<MAX>, TextError> {
        Self::check(&value)?;
        Ok(BoundedText(value))
    }
}

impl<const MAX: usize> From<BoundedText<MAX>> for String {
    fn from(value: BoundedText<MAX>) -> String {
        value.0
    }
}

/// Merchant metadata: a flat object of string keys to string values.
///
/// The limits (50 keys, keys up to 100 characters, values up to 500) keep a record's size
/// bounded whatever the merchant sends. Non-string values are refused by the type itself:
/// deserialisation goes through `BTreeMap<String, String>`. The sorted map also makes the JSON
/// output stable, which matters for signed webhook bodies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(try_from = "BTreeMap<String, String>")]
pub struct Metadata(BTreeMap<String, String>);

impl Metadata {
    /// Most keys accepted.
    pub const MAX_KEYS: usize = 50;
    /// Longest key, in characters.
    pub const MAX_KEY_LEN: usize = 100;
    /// Longest value, in characters.
    pub const MAX_VALUE_LEN: usize = 500;

    /// No metadata, the value used when a request leaves the field out.
    pub fn empty() -> Metadata {
        Metadata(BTreeMap::new())
    }

    /// Checks every limit and keeps the map.
    pub fn new(map: BTreeMap<String, String>) -> Result<Metadata, TextError> {
        if map.len() > Self::MAX_KEYS {
            return Err(TextError::TooManyKeys { max: Self::MAX_KEYS });
        }
        for (key, value) in &map {
            let key_ok = check_length(key, Self::MAX_KEY_LEN).is_ok() && !key.chars().any(is_forbidden_control);
            if !key_ok {
                return Err(TextError::InvalidKey);
            }
            if value.chars().nth(Self::MAX_VALUE_LEN).is_some() {
                return Err(TextError::ValueTooLong { key: key.clone(), max: Self::MAX_VALUE_LEN });
            }
        }
        Ok(Metadata(map))
    }

    /// The same metadata with `key` set to `value`, checked against every limit.
    pub fn with(&self, key: &str, value: &str) -> Result<Metadata, TextError> {
        let mut map = self.0.clone();
        map.insert(key.to_owned(), value.to_owned());
        Metadata::new(map)
    }

    /// The value stored under `key`, if any.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// The entries in key order.
    pub fn iter(&self) -> std::collections::btree_map::Iter<'_, String, String> {
        self.0.iter()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The underlying map, for callers that need map operations.
    pub fn as_map(&self) -> &BTreeMap<String, String> {
        &self.0
    }
}

impl TryFrom<BTreeMap<String, String>> for Metadata {
    type Error = TextError;

    fn try_from(map: BTreeMap<String, String>) -> Result<Metadata, TextError> {
        Metadata::new(map)
    }
}

impl From<Metadata> for BTreeMap<String, String> {
    fn from(metadata: Metadata) -> BTreeMap<String, String> {
        metadata.0
    }
}

impl Serialize for Metadata {
    /// Writes the plain JSON object; done by hand because serde's `into` would clone the map.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'a> IntoIterator for &'a Metadata {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// The value of an `Idempotency-Key` header.
///
/// HTTP header values are printable ASCII, so the key is restricted to U+0020..U+007E; the
/// 255-character bound keeps the idempotency index small.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Longest accepted key.
    pub const MAX_LEN: usize = 255;

    fn check(value: &str) -> Result<(), TextError> {
        check_length(value, Self::MAX_LEN)?;
        if !value.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(TextError::InvalidChar);
        }
        Ok(())
    }
}

checked_string!(IdempotencyKey);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_accepts_its_alphabet() {
        let max = "a".repeat(64);
        for good in ["a", "Z", "cmd-42_B", "pay_01JD3ZK0ABCDEFGHJKMNPQRSTV", max.as_str()] {
            let reference = Reference::parse(good).unwrap();
            assert_eq!(reference.as_str(), good);
            assert_eq!(Reference::try_from(good.to_string()).unwrap(), reference);
        }
    }

    #[test]
    fn reference_rejects_bad_values() {
        assert_eq!(Reference::parse(""), Err(TextError::Empty));
        assert_eq!(Reference::parse(&"a".repeat(65)), Err(TextError::TooLong { max: 64 }));
        for bad in ["a b", "a/b", "a.b", "é", "a\n", "a%20"] {
            assert_eq!(Reference::parse(bad), Err(TextError::InvalidChar), "{bad:?}");
        }
    }

    #[test]
    fn email_accepts_plain_addresses() {
        let long_local = format!("{}@example.com", "a".repeat(254 - "@example.com".len()));
        for good in ["a@b.co", "jean.dupont+caisse@example.com", "x@sub.domain.example", long_local.as_str()] {
            assert_eq!(Email::parse(good).unwrap().as_str(), good);
        }
    }

    #[test]
    fn email_rejects_bad_values() {
        assert_eq!(Email::parse(""), Err(TextError::Empty));
        let too_long = format!("{}@example.com", "a".repeat(255 - "@example.com".len()));
        assert_eq!(Email::parse(&too_long), Err(TextError::TooLong { max: 254 }));
        for bad in ["a @b.co", "a@b.co ", "a\t@b.co", "a@b\u{7}.co", "a@b\u{a0}.co"] {
            assert_eq!(Email::parse(bad), Err(TextError::InvalidChar), "{bad:?}");
        }
        for bad in
            ["ab.co", "a@@b.co", "a@b@c.co", "@b.co", "a@", "a@localhost", "a@.b.co", "a@b.co.", "a@b..co", "a@."]
        {
            assert_eq!(Email::parse(bad), Err(TextError::InvalidEmail), "{bad:?}");
        }
    }

    #[test]
    fn bounded_text_counts_characters() {
        let max = "é".repeat(200);
        assert_eq!(Name::parse(&max).unwrap().as_str(), max);
        assert_eq!(Name::parse(&"é".repeat(201)), Err(TextError::TooLong { max: 200 }));
        assert_eq!(Description::parse(&"x".repeat(500)).unwrap().as_str().len(), 500);
        assert_eq!(Description::parse(&"x".repeat(501)), Err(TextError::TooLong { max: 500 }));
        assert_eq!(Reason::MAX_LEN, 500);
    }

    #[test]
    fn bounded_text_keeps_spaces_and_refuses_controls() {
        for good in [" padded ", "Café crème ☕", "tab-free"] {
            assert_eq!(Description::parse(good).unwrap().as_str(), good);
        }
        assert_eq!(Reason::parse(""), Err(TextError::Empty));
        for bad in ["line\nbreak", "nul\0", "tab\t", "del\u{7f}", "esc\u{1b}[0m"] {
            assert_eq!(Description::parse(bad), Err(TextError::InvalidChar), "{bad:?}");
        }
    }

    #[test]
    fn metadata_accepts_within_limits() {
        assert!(Metadata::empty().is_empty());
        assert_eq!(Metadata::default(), Metadata::empty());
        let mut map = BTreeMap::new();
        for i in 0..50 {
            map.insert(format!("k{i}"), "v".repeat(500));
        }
        map.insert("k0".to_string(), String::new());
        let metadata = Metadata::new(map).unwrap();
        assert_eq!(metadata.len(), 50);
        assert_eq!(metadata.get("k0"), Some(""));
        assert_eq!(metadata.get("absent"), None);
        assert_eq!(metadata.iter().count(), 50);
        let long_key = BTreeMap::from([("é".repeat(100), "line\nbreak ok".to_string())]);
        assert!(Metadata::new(long_key).is_ok());
    }

    #[test]
    fn metadata_rejects_broken_limits() {
        let too_many: BTreeMap<_, _> = (0..51).map(|i| (format!("k{i}"), String::new())).collect();
        assert_eq!(Metadata::new(too_many), Err(TextError::TooManyKeys { max: 50 }));
        for bad_key in [String::new(), "k".repeat(101), "a\nb".to_string()] {
            let map = BTreeMap::from([(bad_key, "v".to_string())]);
            assert_eq!(Metadata::new(map), Err(TextError::InvalidKey));
        }
        let map = BTreeMap::from([("order".to_string(), "v".repeat(501))]);
        assert_eq!(Metadata::new(map), Err(TextError::ValueTooLong { key: "order".to_string(), max: 500 }));
    }

    #[test]
    fn metadata_serde_is_a_string_object() {
        let metadata: Metadata = serde_json::from_str(r#"{"b":"2","a":"1"}"#).unwrap();
        assert_eq!(metadata.get("a"), Some("1"));
        assert_eq!(serde_json::to_string(&metadata).unwrap(), r#"{"a":"1","b":"2"}"#);
        assert_eq!(serde_json::to_string(&Metadata::empty()).unwrap(), "{}");
        assert!(serde_json::from_str::<Metadata>(r#"{"a":1}"#).is_err());
        assert!(serde_json::from_str::<Metadata>(r#"{"a":null}"#).is_err());
        assert!(serde_json::from_str::<Metadata>(r#"["a"]"#).is_err());
        let long = format!(r#"{{"a":"{}"}}"#, "v".repeat(501));
        assert!(serde_json::from_str::<Metadata>(&long).is_err());
    }

    #[test]
    fn idempotency_key_accepts_printable_ascii() {
        let max = "k".repeat(255);
        for good in ["a", "order 42 / retry ~1", "550e8400-e29b-41d4-a716-446655440000", max.as_str()] {
            assert_eq!(IdempotencyKey::parse(good).unwrap().as_str(), good);
        }
    }

    #[test]
    fn idempotency_key_rejects_bad_values() {
        assert_eq!(IdempotencyKey::parse(""), Err(TextError::Empty));
        assert_eq!(IdempotencyKey::parse(&"k".repeat(256)), Err(TextError::TooLong { max: 255 }));
        for bad in ["tab\tkey", "new\nline", "del\u{7f}", "clé"] {
            assert_eq!(IdempotencyKey::parse(bad), Err(TextError::InvalidChar), "{bad:?}");
        }
    }

    #[test]
    fn string_types_serde_through_their_checks() {
        let reference: Reference = serde_json::from_str("\"cmd-1\"").unwrap();
        assert_eq!(serde_json::to_string(&reference).unwrap(), "\"cmd-1\"");
        assert!(serde_json::from_str::<Reference>("\"a b\"").is_err());
        let email: Email = serde_json::from_str("\"a@b.co\"").unwrap();
        assert_eq!(String::from(email), "a@b.co");
        assert!(serde_json::from_str::<Email>("\"nope\"").is_err());
        let name: Name = serde_json::from_str("\"Awa\"").unwrap();
        assert_eq!(serde_json::to_string(&name).unwrap(), "\"Awa\"");
        assert!(serde_json::from_str::<Name>("\"\"").is_err());
        assert!(serde_json::from_str::<IdempotencyKey>("\"\\u0001\"").is_err());
    }
}
