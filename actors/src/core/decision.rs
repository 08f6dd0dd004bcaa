//! What goes out of the core: the records a merchant owns, and the [`Decision`] an accepted change produces
//! (journal event with its ledger entries, balances after it, new transaction, webhook notifications).

use serde::{Deserialize, Serialize};

use crate::domain::ledger::{Balances, Entry};
use crate::domain::links::Link;
use crate::domain::money::Currency;
use crate::domain::records::{Payment, Payout, TransactionType};
use crate::domain::status::{EventKind, Trigger};
use crate::domain::time::Timestamp;

/// A record of one of the kinds a merchant owns.
// Moved one at a time, never stored in bulk: the size difference costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Record {
    Payment(Payment),
    Payout(Payout),
    Link(Link),
}

impl Record {
    pub fn key(&self) -> &str {
        match self {
            Record::Payment(p) => p.reference.as_str(),
            Record::Payout(o) => &o.id,
            Record::Link(l) => &l.id,
        }
    }
}

/// One line of a merchant's journal: what changed, and the money it moved.
///
/// The store's binary encoding is positional, and a replay decodes only the first four fields (the store's
/// `LedgerLine`), so the fields that move money come first and their order is part of the stored format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEvent {
    /// Position in this merchant's journal, from 1, without gaps.
    pub seq: u64,
    pub at: Timestamp,
    #[serde(rename = "devise")]
    pub currency: Currency,
    pub entries: Vec<Entry>,
    pub trigger: Trigger,
    /// Payment reference, payout id or link id.
    pub reference: String,
    /// Status after the change, as the API names it.
    #[serde(rename = "statut")]
    pub status: String,
}

/// A webhook notification caused by a change, with the exact body bytes that will be signed and sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxItem {
    pub id: String,
    pub event: EventKind,
    pub reference: String,
    pub body: String,
}

/// A new money movement that must appear in the transaction list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTransaction {
    pub kind: TransactionType,
    pub transaction_id: String,
    /// The reference this transaction is found by (payment reference, `rmb_…` or `ret_…`).
    pub reference: String,
    /// The record that holds it (the payment for a refund).
    pub owner: String,
    /// The merchant's own reference for it, besides `reference` (a payout's), by which it is found too.
    pub alias: Option<String>,
}

/// An accepted change, ready to be persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub record: Record,
    pub journal: JournalEvent,
    pub balances: Balances,
    pub created: Option<NewTransaction>,
    pub outbox: Vec<OutboxItem>,
    /// The link the change also moves, written with it: a payment through a link that succeeded counts in
    /// the link's `nombre_paiements` and `montant_encaisse` in the same durable write.
    pub linked: Option<Link>,
}

// Moved once per command, never stored in bulk: the size difference costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    Changed(Box<Decision>),
    /// A duplicate, late or out-of-order notice: nothing to write.
    Unchanged(Record),
}
