//! Domain value types shared by every part of the engine.
//!
//! Each submodule owns one family of checked types (money, phone numbers, text, identifiers,
//! time). Values are validated once, when they are built or deserialised, so the rest of the
//! engine can rely on them without re-checking. `status` holds the state machines as data,
//! `ledger` the double-entry rules, `records` the stored records and the webhook body, `provider` what is kept about a transaction's
//! provider side, `links` the payment links.

pub mod ids;
pub mod ledger;
pub mod links;
pub mod money;
pub mod phone;
pub mod provider;
pub mod records;
pub mod status;
pub mod text;
pub mod time;

pub use ids::{new_id, new_id_at, random_base62, validate_id, IdError, IdKind, MerchantId, MERCHANT_ID_LEN};
pub use money::{format_major, Amount, Currency, CurrencyInfo, FeeRule, MoneyError, CURRENCIES};
pub use phone::{Phone, PhoneError};
pub use text::{BoundedText, Description, Email, IdempotencyKey, Metadata, Name, Reason, Reference, TextError};
pub use time::{parse_duration_ms, TimeError, Timestamp};

/// Deserialises a value written as a string through its checked constructor, reading the string in place:
/// serde's `try_from = "String"` would allocate a `String` per value only to parse and drop it.
fn parse_str<'de, D, T, E>(
    deserializer: D,
    expecting: &'static str,
    parse: fn(&str) -> Result<T, E>,
) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    E: std::fmt::Display,
{
    struct Parse<T, E> {
        expecting: &'static str,
        parse: fn(&str) -> Result<T, E>,
    }

    impl<T, E: std::fmt::Display> serde::de::Visitor<'_> for Parse<T, E> {
        type Value = T;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.expecting)
        }

        fn visit_str<Err: serde::de::Error>(self, text: &str) -> Result<T, Err> {
            (self.parse)(text).map_err(Err::custom)
        }
    }

    deserializer.deserialize_str(Parse { expecting, parse })
}
