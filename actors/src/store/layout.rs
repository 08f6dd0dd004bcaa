//! The sled backend's layout: which tree holds what, how keys are built, and how values are encoded.
//!
//! Keys that belong to a merchant start with its 30-byte id, so one merchant's data is one contiguous range
//! per tree. The journal is keyed by `merchant ++ seq` (big endian) so a merchant's events read back in order;
//! the transaction index is keyed by `merchant ++ ULID of the transaction id`, which sorts by creation time,
//! so listing newest first is a reverse range scan. Values are JSON: readable with any sled dump, and the
//! record structs already are the API's shapes.
//!
//! A notification is one `outbox` record, body included. Stores written by earlier versions kept bodies apart
//! in `outbox_body` (so that saving an attempt did not rewrite the body); their records have an empty body,
//! and reading them still takes it from there. Since changes reach sled through the overlay, a notification
//! delivered at its first attempt reaches sled once, created and delivered, so one key does better than two.

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::writer::Op;
use super::StoreError;
use crate::core::Record;
use crate::domain::ids::{MerchantId, MERCHANT_ID_LEN};
use crate::domain::records::TransactionType;
use crate::domain::status::{PaymentStatus, PayoutStatus, RefundStatus};
use crate::domain::time::Timestamp;

// Tree indexes into `SledStore::trees`; `TREE_NAMES` gives their on-disk names.
pub(super) const MERCHANTS: usize = 0;
pub(super) const MERCHANT_KEYS: usize = 1;
pub(super) const MERCHANT_EMAILS: usize = 2;
pub(super) const JOURNAL: usize = 3;
pub(super) const SNAPSHOTS: usize = 4;
pub(super) const PAYMENTS: usize = 5;
pub(super) const PAYOUTS: usize = 6;
pub(super) const REFS: usize = 7;
pub(super) const TX_INDEX: usize = 8;
pub(super) const TX_OWNER: usize = 9;
pub(super) const IDEMPOTENCY: usize = 10;
pub(super) const OUTBOX: usize = 11;
pub(super) const OUTBOX_DUE: usize = 12;
pub(super) const PENDING: usize = 13;
pub(super) const OUTBOX_BY_MERCHANT: usize = 14;
pub(super) const OUTBOX_BODY: usize = 15;
pub(super) const TREE_NAMES: [&str; 16] = [
    "merchants",
    "merchant_keys",
    "merchant_emails",
    "journal",
    "snapshots",
    "payments",
    "payouts",
    "refs",
    "tx_index",
    "tx_owner",
    "idempotency",
    "outbox",
    "outbox_due",
    "pending",
    "outbox_by_merchant",
    "outbox_body",
];

/// The order an overlay layer applied on one thread reaches the trees in: records first, then what points at
/// them. Nothing depends on it while running, since readers find a layer in the overlay until all of it is
/// in sled; it keeps sled's own state tidy between the trees of a layer (the log's replay at start applies
/// this way), and it lists the trees a layer may touch.
pub(super) const APPLY_ORDER: [usize; 16] = [
    MERCHANTS,
    MERCHANT_KEYS,
    MERCHANT_EMAILS,
    JOURNAL,
    SNAPSHOTS,
    PAYMENTS,
    PAYOUTS,
    IDEMPOTENCY,
    OUTBOX_BODY,
    OUTBOX,
    REFS,
    TX_OWNER,
    TX_INDEX,
    PENDING,
    OUTBOX_BY_MERCHANT,
    OUTBOX_DUE,
];

pub(super) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| StoreError::Corrupt(format!("encode: {e}")))
}

pub(super) fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

pub(super) fn mkey(merchant: &MerchantId, rest: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(MERCHANT_ID_LEN + rest.len());
    key.extend_from_slice(merchant.as_bytes());
    key.extend_from_slice(rest);
    key
}

pub(super) fn journal_key(merchant: &MerchantId, seq: u64) -> Vec<u8> {
    mkey(merchant, &seq.to_be_bytes())
}

pub(super) fn key_hash(secret_key: &str) -> Vec<u8> {
    Sha256::digest(secret_key.as_bytes()).to_vec()
}

pub(super) fn due_key(at: Timestamp, id: &str) -> Vec<u8> {
    let mut key = at.unix_ms().to_be_bytes().to_vec();
    key.extend_from_slice(id.as_bytes());
    key
}

/// `tag ++ created_ms ++ merchant ++ owner`: the `pending` tree lists what still waits for a provider, per
/// kind and oldest first, so the expiry sweep and the restart resubmission read only what they need.
pub(super) fn pending_key(kind: TransactionType, created_at: Timestamp, merchant: &MerchantId, owner: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + 8 + MERCHANT_ID_LEN + owner.len());
    key.push(kind.tag());
    key.extend_from_slice(&created_at.unix_ms().to_be_bytes());
    key.extend_from_slice(merchant.as_bytes());
    key.extend_from_slice(owner.as_bytes());
    key
}

/// Keeps the `pending` tree in step with a record: present exactly while the record waits for a provider.
pub(super) fn pending_ops(m: &MerchantId, record: &Record, ops: &mut Vec<Op>) {
    let mut set = |key: Vec<u8>, waiting: bool| {
        ops.push(if waiting { Op::Insert(PENDING, key, Vec::new()) } else { Op::Remove(PENDING, key) })
    };
    match record {
        Record::Payment(p) => {
            let owner = p.reference.as_str();
            let waiting = matches!(p.statut, PaymentStatus::Initie | PaymentStatus::EnCours);
            set(pending_key(TransactionType::Paiement, p.created_at, m, owner), waiting);
            if let Some(r) = &p.remboursement {
                let waiting = r.statut == RefundStatus::EnCours;
                set(pending_key(TransactionType::Remboursement, r.created_at, m, owner), waiting);
            }
        }
        Record::Payout(o) => {
            let waiting = o.statut == PayoutStatus::EnAttente;
            set(pending_key(TransactionType::Retrait, o.created_at, m, &o.id), waiting);
        }
    }
}

/// `tag ++ owner ++ 0 ++ reference`: which record holds a transaction, and the reference it is found by.
pub(super) fn pointer(kind: TransactionType, owner: &str, reference: &str) -> Vec<u8> {
    let mut value = Vec::with_capacity(2 + owner.len() + reference.len());
    value.push(kind.tag());
    value.extend_from_slice(owner.as_bytes());
    value.push(0);
    value.extend_from_slice(reference.as_bytes());
    value
}

pub(super) fn parse_pointer(bytes: &[u8]) -> Result<(TransactionType, &str, &str), StoreError> {
    let corrupt = || StoreError::Corrupt("bad transaction pointer".into());
    let (&tag, rest) = bytes.split_first().ok_or_else(corrupt)?;
    let kind = TransactionType::from_tag(tag).ok_or_else(corrupt)?;
    let split = rest.iter().position(|b| *b == 0).ok_or_else(corrupt)?;
    let owner = std::str::from_utf8(&rest[..split]).map_err(|_| corrupt())?;
    let reference = std::str::from_utf8(&rest[split + 1..]).map_err(|_| corrupt())?;
    Ok((kind, owner, reference))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_apply_order_names_every_tree_once() {
        let mut order = APPLY_ORDER.to_vec();
        order.sort_unstable();
        assert_eq!(order, (0..TREE_NAMES.len()).collect::<Vec<_>>());
    }

    #[test]
    fn records_are_applied_before_the_indexes_that_point_at_them() {
        let at = |tree| APPLY_ORDER.iter().position(|t| *t == tree).unwrap();
        for (record, index) in [
            (OUTBOX_BODY, OUTBOX),
            (OUTBOX, OUTBOX_DUE),
            (OUTBOX, OUTBOX_BY_MERCHANT),
            (PAYMENTS, TX_INDEX),
            (PAYMENTS, REFS),
            (PAYOUTS, TX_INDEX),
            (PAYMENTS, PENDING),
            (MERCHANTS, MERCHANT_KEYS),
            (JOURNAL, TX_OWNER),
        ] {
            assert!(at(record) < at(index), "{} must come before {}", TREE_NAMES[record], TREE_NAMES[index]);
        }
    }
}
