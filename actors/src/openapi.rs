//! OpenAPI schemas of the checked value types, so that the service's API document is derived from the very
//! types it serializes (feature `openapi`). Each newtype is described by what it looks like on the wire.

use std::borrow::Cow;

use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

use crate::domain::ids::MerchantId;
use crate::domain::money::{Amount, Currency};
use crate::domain::phone::Phone;
use crate::domain::records::ProviderCode;
use crate::domain::text::{BoundedText, Email, Metadata, Reference};
use crate::domain::time::Timestamp;

fn string(description: &str, pattern: Option<&str>, max_length: Option<usize>) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(description))
        .pattern(pattern)
        .max_length(max_length)
        .into()
}

macro_rules! schema {
    ($ty:ty, $name:literal, $body:expr) => {
        impl PartialSchema for $ty {
            fn schema() -> RefOr<Schema> {
                $body
            }
        }
        impl ToSchema for $ty {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed($name)
            }
        }
    };
}

schema!(
    Amount,
    "Amount",
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
        .minimum(Some(0))
        .description(Some("Integer amount in the currency's smallest unit (1050 EUR = 10.50 EUR)."))
        .into()
);
schema!(
    Currency,
    "Currency",
    string("ISO 4217 code of a supported currency (GET /v1/devises).", Some("^[A-Z]{3}$"), Some(3))
);
schema!(Phone, "Phone", string("E.164 phone number, e.g. +22997000001.", Some(r"^\+[1-9][0-9]{7,14}$"), Some(16)));
schema!(Reference, "Reference", string("1 to 64 of A-Z a-z 0-9 _ -.", Some("^[A-Za-z0-9_-]{1,64}$"), Some(64)));
schema!(Email, "Email", string("E-mail address.", None, Some(254)));
schema!(
    ProviderCode,
    "ProviderCode",
    string("Provider code (GET /v1/fournisseurs).", Some("^[a-z0-9_]{1,32}$"), Some(32))
);
schema!(MerchantId, "MerchantId", string("Merchant id, mch_ + 26 characters.", None, Some(30)));
schema!(
    Timestamp,
    "Timestamp",
    ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
        .description(Some("RFC 3339 timestamp: written in UTC with Z; read with Z or an offset."))
        .into()
);
schema!(
    Metadata,
    "Metadata",
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .additional_properties(Some(ObjectBuilder::new().schema_type(Type::String).max_length(Some(500))))
        .max_properties(Some(50))
        .description(Some("Free key/value data: at most 50 keys, string values of at most 500 characters."))
        .into()
);

impl<const MAX: usize> PartialSchema for BoundedText<MAX> {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new().schema_type(Type::String).min_length(Some(1)).max_length(Some(MAX)).into()
    }
}

impl<const MAX: usize> ToSchema for BoundedText<MAX> {
    fn name() -> Cow<'static, str> {
        Cow::Owned(format!("Text{MAX}"))
    }
}
