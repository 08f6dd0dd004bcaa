//! Domain value types shared by every part of the engine.
//!
//! Each submodule owns one family of checked types (money, phone numbers, text, identifiers,
//! time). Values are validated once, when they are built or deserialised, so the rest of the
//! engine can rely on them without re-checking. `status` holds the state machines as data,
//! `ledger` the double-entry rules, `records` the stored records and the webhook body.

pub mod ids;
pub mod ledger;
pub mod money;
pub mod phone;
pub mod records;
pub mod status;
pub mod text;
pub mod time;

pub use ids::{new_id, new_id_at, random_base62, validate_id, IdError, IdKind, MerchantId, MERCHANT_ID_LEN};
pub use money::{format_major, Amount, Currency, CurrencyInfo, FeeRule, MoneyError, CURRENCIES};
pub use phone::{Phone, PhoneError};
pub use text::{BoundedText, Description, Email, IdempotencyKey, Metadata, Motif, Name, Reference, TextError};
pub use time::{parse_duration_ms, TimeError, Timestamp};
