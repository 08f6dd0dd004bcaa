//! Payment links (docs/api.md § Payment links): the link record, exactly the API's object, and the rules that
//! read it without changing it (what status it has now, whether it takes a payment).
//!
//! A link belongs to its merchant's actor like a payment does: it is created and deactivated through it, and
//! its counters move in the same durable write as the `succes` of a payment made through it, so
//! `nombre_paiements` and `montant_encaisse` are exact however many customers pay at once.

use serde::{Deserialize, Serialize};

use super::money::{Amount, Currency};
use super::provider::ReturnUrl;
use super::records::ProviderCode;
use super::status::LinkStatus;
use super::text::{Description, Metadata, Reference};
use super::time::Timestamp;

/// The metadata key that ties a payment to the link it was made through. Caisse sets it; a merchant cannot
/// (the API refuses it in a payment's metadata), so a link's counters count only its own payments.
pub const LINK_METADATA_KEY: &str = "lien_id";

/// How many payments a link takes.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LinkUsage {
    /// The link closes (`paye`) at its first payment that reaches `succes`.
    #[serde(rename = "unique")]
    Once,
    /// The link takes payments until it is deactivated or expires.
    #[serde(rename = "multiple")]
    Many,
}

impl LinkUsage {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkUsage::Once => "unique",
            LinkUsage::Many => "multiple",
        }
    }

    pub fn parse(text: &str) -> Option<LinkUsage> {
        [LinkUsage::Once, LinkUsage::Many].into_iter().find(|u| u.as_str() == text)
    }
}

/// A payment link, exactly the API's object (the stored `statut` never says `expire`: see [`Link::as_of`]).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub id: String,
    /// Where customers pay: `{public_url}/payer/{id}`, fixed when the link is made, because it is what the
    /// merchant printed and shared.
    pub url: String,
    pub reference: Option<Reference>,
    #[serde(rename = "statut")]
    pub status: LinkStatus,
    #[serde(rename = "montant")]
    pub amount: Amount,
    #[serde(rename = "devise")]
    pub currency: Currency,
    pub description: Description,
    #[serde(rename = "fournisseurs")]
    pub providers: Vec<ProviderCode>,
    pub usage: LinkUsage,
    pub expire_at: Option<Timestamp>,
    #[serde(rename = "url_retour")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub return_url: Option<ReturnUrl>,
    pub metadata: Metadata,
    /// Payments made through the link that reached `succes`.
    #[serde(rename = "nombre_paiements")]
    pub payments: u64,
    /// The sum of their `montant`.
    #[serde(rename = "montant_encaisse")]
    pub collected: Amount,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Link {
    /// The link as it stands at `now`: an `actif` link past its `expire_at` is `expire`.
    pub fn as_of(&self, now: Timestamp) -> Link {
        Link { status: self.status_at(now), ..self.clone() }
    }

    pub fn status_at(&self, now: Timestamp) -> LinkStatus {
        match (self.status, self.expire_at) {
            (LinkStatus::Active, Some(end)) if now >= end => LinkStatus::Expired,
            (status, _) => status,
        }
    }

    /// Whether a customer may start a payment through the link at `now`.
    pub fn takes_payments(&self, now: Timestamp) -> bool {
        self.status_at(now) == LinkStatus::Active
    }
}

/// The id of the link a payment was made through, if any.
pub fn link_of(metadata: &Metadata) -> Option<&str> {
    metadata.get(LINK_METADATA_KEY)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample_link() -> Link {
        let at = Timestamp::from_unix_ms(1_700_000_000_000);
        Link {
            id: "lnk_01JD0000000000000000000000".into(),
            url: "https://pay.example.com/payer/lnk_01JD0000000000000000000000".into(),
            reference: None,
            status: LinkStatus::Active,
            amount: Amount::new(5000).unwrap(),
            currency: Currency::parse("XOF").unwrap(),
            description: Description::parse("Frais de scolarité").unwrap(),
            providers: vec![ProviderCode::parse("mtn_momo").unwrap()],
            usage: LinkUsage::Once,
            expire_at: Some(at.plus_ms(60_000)),
            return_url: None,
            metadata: Metadata::empty(),
            payments: 0,
            collected: Amount::ZERO,
            created_at: at,
            updated_at: at,
        }
    }

    #[test]
    fn a_link_expires_at_its_expire_at_and_not_before() {
        let link = sample_link();
        let end = link.expire_at.unwrap();
        assert_eq!(link.status_at(Timestamp::from_unix_ms(end.unix_ms() - 1)), LinkStatus::Active);
        assert_eq!(link.status_at(end), LinkStatus::Expired);
        assert_eq!(link.as_of(end).status, LinkStatus::Expired);
        assert!(!link.takes_payments(end));
        let paid = Link { status: LinkStatus::Paid, ..link };
        assert_eq!(paid.status_at(end), LinkStatus::Paid, "a closed link keeps why it closed");
    }

    #[test]
    fn the_api_object_has_the_documented_fields() {
        let value = serde_json::to_value(sample_link()).unwrap();
        let fields: Vec<_> = value.as_object().unwrap().keys().cloned().collect();
        assert_eq!(fields.len(), 16);
        assert_eq!(value["statut"], "actif");
        assert_eq!(value["usage"], "unique");
        assert_eq!(value["montant_encaisse"], 0);
        assert_eq!(value["nombre_paiements"], 0);
        assert_eq!(value["fournisseurs"], serde_json::json!(["mtn_momo"]));
        assert!(value["url_retour"].is_null());
        let back: Link = serde_json::from_value(value).unwrap();
        assert_eq!(back, sample_link());
    }
}
