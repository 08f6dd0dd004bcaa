//! The embedded store's layout, which PostgreSQL's tables mirror: which tree holds what, how keys are built,
//! and how values are encoded.
//!
//! Keys that belong to a merchant start with its 30-byte id, so one merchant's data is one contiguous range
//! per tree. The journal is keyed by `merchant ++ seq` (big endian) so a merchant's events read back in order,
//! and it is stored as runs of a merchant's consecutive events under the key of the last ([`journal_runs`]);
//! the transaction index is keyed by `merchant ++ ULID of the transaction id`, which sorts by creation time,
//! so listing newest first is a reverse range scan.
//!
//! Values are the records' serde form in postcard's binary format behind one format byte, [`BINARY_V1`]: field
//! names, quoted timestamps and escaped webhook bodies were two thirds of JSON's bytes, and every byte stored
//! is written several times (the engine's journal, then its tables, then each compaction). The format is
//! positional: a field added to, removed from or moved in a stored record changes the store's format, and
//! `stored_bytes_are_pinned` fails until [`FORMAT_VERSION`] is raised with it. A data directory carries its
//! version in a stamp (`stamp`) and one of another version is refused at open.
//!
//! A notification is one record, body included, in `notifications` under `merchant ++ id`: a merchant's
//! list is a range scan of whole records, and a notification costs one key, not a record plus an index
//! entry. The due index
//! `outbox_due` is keyed `due time ++ id` and its value is the merchant's id, which finds the record.
//!
//! What is kept about a transaction's provider side (`domain::provider`) is keyed by transaction id alone, as
//! provider callbacks name it: `routes` holds the route fixed at creation, `provider_references` the
//! provider's reference once an answer carried one. Both are written by the change they come with.
//! `merchant_suspensions` holds, under a merchant's id, when an operator suspended it; no entry: active.
//! `retired_keys` holds, under the SHA-256 of a rolled secret key, until when it still authenticates.
//!
//! Payment links live in `links` under `merchant ++ id` (a link id is a ULID, so a merchant's links list newest
//! first as a reverse range scan, like its transactions). The payment page knows only the id, so
//! `link_owners` maps an id to its merchant; `link_refs` maps `merchant ++ reference` to the id of the link
//! that took that reference; `link_payments` lists the payments made through a link under
//! `merchant ++ link id ++ ULID of the payment's transaction id`, value the payment reference, oldest first.
//!
//! `idempotency_times` indexes the idempotency records by when they were made, under
//! `merchant ++ created_at (u64 ms) ++ key` with an empty value, so that records past their 24 hours are found
//! without reading the others (written with the record, removed with it).
//!
//! `audited` holds, under a merchant's id, an audit checkpoint: a [`Snapshot`](super::Snapshot) of the balances
//! the ledger gave at the last event an audit replayed and found sound. The audit at start replays each
//! merchant's journal from there, not from its first event (see `kv_store::recovery`).

use std::ops::Range;

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::op::Op;
use super::op::{Entry, TreeMap};
use super::StoreError;
use crate::core::Record;
use crate::domain::ids::{MerchantId, MERCHANT_ID_LEN};
use crate::domain::records::TransactionType;
use crate::domain::status::{PaymentStatus, PayoutStatus, RefundStatus};
use crate::domain::time::Timestamp;

// Tree numbers; `TREE_NAMES` gives their on-disk names.
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
pub(super) const OUTBOX_DUE: usize = 11;
pub(super) const PENDING: usize = 12;
pub(super) const NOTIFICATIONS: usize = 13;
pub(super) const ROUTES: usize = 14;
pub(super) const PROVIDER_REFERENCES: usize = 15;
pub(super) const MERCHANT_SUSPENSIONS: usize = 16;
pub(super) const RETIRED_KEYS: usize = 17;
pub(super) const LINKS: usize = 18;
pub(super) const LINK_OWNERS: usize = 19;
pub(super) const LINK_REFS: usize = 20;
pub(super) const LINK_PAYMENTS: usize = 21;
pub(super) const AUDITED: usize = 22;
pub(super) const IDEMPOTENCY_TIMES: usize = 23;
pub(super) const TREE_NAMES: [&str; 24] = [
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
    "outbox_due",
    "pending",
    "notifications",
    "routes",
    "provider_references",
    "merchant_suspensions",
    "retired_keys",
    "links",
    "link_owners",
    "link_refs",
    "link_payments",
    "audited",
    "idempotency_times",
];

/// Trees whose keys, once set, belong to their value: a write that would give such a key another value is
/// refused ([`StoreError::EmailTaken`]) instead of applied. An e-mail names one merchant; one process checks
/// before it writes, and a store several processes share checks again inside the write.
pub(super) const CLAIMED: [usize; 1] = [MERCHANT_EMAILS];

/// Trees whose keys are written once, with their final value, and never removed: the owner of a transaction
/// and its route. A reader may keep what it read of them.
pub(super) const WRITTEN_ONCE: [usize; 2] = [TX_OWNER, ROUTES];

/// The order a batch reaches the trees in: records first, then what points at them, so that an index read
/// while a batch is being applied never leads to nothing. It lists every tree a batch may touch.
pub(super) const APPLY_ORDER: [usize; 24] = [
    MERCHANTS,
    MERCHANT_SUSPENSIONS,
    RETIRED_KEYS,
    MERCHANT_KEYS,
    MERCHANT_EMAILS,
    JOURNAL,
    SNAPSHOTS,
    AUDITED,
    PAYMENTS,
    PAYOUTS,
    LINKS,
    LINK_OWNERS,
    LINK_REFS,
    LINK_PAYMENTS,
    ROUTES,
    PROVIDER_REFERENCES,
    IDEMPOTENCY,
    IDEMPOTENCY_TIMES,
    REFS,
    TX_OWNER,
    TX_INDEX,
    PENDING,
    NOTIFICATIONS,
    OUTBOX_DUE,
];

/// The version of everything this file lays out: trees, keys and value encodings. A data directory stamped
/// with another version is refused at open (`stamp`); raise it with any change to what is stored.
pub(crate) const FORMAT_VERSION: u32 = 6;

/// Earlier versions whose directories this build opens and restamps: each later version only added trees or
/// appended fields that `legacy` reads, so their data reads the same (format 3 added `routes`,
/// `provider_references`, `merchant_suspensions` and `retired_keys`; format 4 appended a payment's refunds and
/// refunded total, and a payout's merchant reference; format 5 added the four trees of payment links; format 6
/// added `audited` and `idempotency_times`).
pub(crate) const UPGRADED_IN_PLACE: [u32; 4] = [2, 3, 4, 5];

/// The first byte of a stored value: postcard's encoding of a record follows.
pub(super) const BINARY_V1: u8 = 1;

pub(super) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    postcard::to_extend(value, vec![BINARY_V1]).map_err(|e| StoreError::Corrupt(format!("encode: {e}")))
}

/// Decodes a whole stored value; bytes left over mean it was not a `T`.
pub(super) fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, StoreError> {
    let (value, rest) = decode_prefix(what, bytes)?;
    if !rest.is_empty() {
        return Err(StoreError::Corrupt(format!("{what}: {} bytes left over", rest.len())));
    }
    Ok(value)
}

/// Decodes a `T` whose fields are the first fields of the stored value, and returns what follows them. The
/// journal's replay reads only an event's ledger this way.
pub(super) fn decode_prefix<'a, T: DeserializeOwned>(what: &str, bytes: &'a [u8]) -> Result<(T, &'a [u8]), StoreError> {
    let corrupt = |e: &dyn std::fmt::Display| StoreError::Corrupt(format!("{what}: {e}"));
    match bytes.split_first() {
        Some((&BINARY_V1, body)) => postcard::take_from_bytes(body).map_err(|e| corrupt(&e)),
        Some((other, _)) => Err(corrupt(&format_args!("unknown value format {other:#04x}"))),
        None => Err(corrupt(&"empty value")),
    }
}

pub(super) fn mkey(merchant: &MerchantId, rest: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(MERCHANT_ID_LEN + rest.len());
    key.extend_from_slice(merchant.as_bytes());
    key.extend_from_slice(rest);
    key
}

/// An idempotency record's entry in `idempotency_times`.
pub(super) fn idempotency_time_key(merchant: &MerchantId, created_at: Timestamp, key: &str) -> Vec<u8> {
    let mut rest = Vec::with_capacity(8 + key.len());
    rest.extend_from_slice(&created_at.unix_ms().to_be_bytes());
    rest.extend_from_slice(key.as_bytes());
    mkey(merchant, &rest)
}

/// The merchant a key of a merchant's tree begins with.
pub(super) fn merchant_of(key: &[u8]) -> Result<MerchantId, StoreError> {
    let id = key.get(..MERCHANT_ID_LEN).ok_or_else(|| StoreError::Corrupt("a key too short for a merchant".into()))?;
    let text = std::str::from_utf8(id)
        .map_err(|_| StoreError::Corrupt("a key that does not begin with a merchant id".into()))?;
    MerchantId::parse(text).map_err(|e| StoreError::Corrupt(format!("a key's merchant id: {e}")))
}

/// The least key after every key that begins with `merchant`'s id: its id with the last byte raised by one
/// (ids are ASCII, so the byte has room), the start of a seek to the next merchant of a tree.
pub(super) fn past_merchant(merchant: &MerchantId) -> Vec<u8> {
    let mut key = merchant.as_bytes().to_vec();
    if let Some(last) = key.last_mut() {
        *last = last.saturating_add(1);
    }
    key
}

pub(super) fn journal_key(merchant: &MerchantId, seq: u64) -> Vec<u8> {
    mkey(merchant, &seq.to_be_bytes())
}

/// The sequence number a journal key ends with.
fn journal_seq(key: &[u8]) -> Option<u64> {
    let seq = key.get(MERCHANT_ID_LEN..).filter(|rest| rest.len() == 8)?;
    Some(u64::from_be_bytes(seq.try_into().ok()?))
}

/// The first byte of every journal value: a run of consecutive events of one merchant, stored under the key
/// of the last.
pub(super) const JOURNAL_RUN_V1: u8 = 2;

/// The most events one run holds. Long enough that the engine's per-key cost all but vanishes for a busy merchant,
/// short enough that reading one event back decodes little around it.
pub(super) const MAX_RUN: usize = 256;

/// The stored value of a run of `events`, each an event's encoded bytes: [`JOURNAL_RUN_V1`], then each event
/// behind its length as a u32, little endian. A change writes its event as a run of one; the engine's writer
/// joins a batch's runs ([`journal_runs`]).
pub(super) fn journal_run<'a>(events: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<u8>, StoreError> {
    let mut value = vec![JOURNAL_RUN_V1];
    for event in events {
        let len = u32::try_from(event.len()).map_err(|_| StoreError::Corrupt("a journal event over 4 GiB".into()))?;
        value.extend_from_slice(&len.to_le_bytes());
        value.extend_from_slice(event);
    }
    Ok(value)
}

/// The event of a run of one, as the writer stores each event; `None` for anything else.
fn lone_event(value: &[u8]) -> Option<&[u8]> {
    let (&JOURNAL_RUN_V1, rest) = value.split_first()? else { return None };
    let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    rest.get(4..).filter(|event| event.len() == len)
}

/// The journal's events of a batch, each a run of one as the change wrote it, become longer runs of each
/// merchant's consecutive events, at most [`MAX_RUN`] each, stored under the key of the last. The engines'
/// work is per key: a merchant with many events per batch costs one key per run rather than one per event.
///
/// Readers take a key as covering the events up to its sequence number, and skip events they have already
/// read ([`journal_spans`]). That is what makes runs safe whatever grouping another writer chose: the upgrade
/// from sled replays that engine's old log over the runs sled already held, grouped otherwise; a run it
/// overwrites is replaced by one ending at the same event, the events before it are in runs of their own, and
/// an event held twice is read once.
pub(super) fn journal_runs(keys: &TreeMap) -> Result<Vec<(Vec<u8>, Entry)>, StoreError> {
    let mut stored = Vec::with_capacity(keys.len().min(64));
    let mut run: Vec<(&[u8], &[u8])> = Vec::new();
    for (key, entry) in keys {
        let event = match (entry, journal_seq(key)) {
            (Some(value), Some(seq)) => lone_event(value).map(|event| (seq, event)),
            _ => None,
        };
        let follows = |(last, _): &(&[u8], &[u8])| {
            last.get(..MERCHANT_ID_LEN) == key.get(..MERCHANT_ID_LEN)
                && journal_seq(last).and_then(|s| s.checked_add(1)) == event.map(|(seq, _)| seq)
        };
        if run.len() == MAX_RUN || !run.last().is_some_and(follows) {
            close_run(&mut run, &mut stored)?;
        }
        match event {
            Some((_, event)) => run.push((key, event)),
            // Removals, and anything that is not one event, pass through as they are.
            None => stored.push((key.clone(), entry.clone())),
        }
    }
    close_run(&mut run, &mut stored)?;
    Ok(stored)
}

fn close_run(run: &mut Vec<(&[u8], &[u8])>, stored: &mut Vec<(Vec<u8>, Entry)>) -> Result<(), StoreError> {
    if let Some((last, _)) = run.last() {
        stored.push((last.to_vec(), Some(journal_run(run.iter().map(|(_, event)| *event))?)));
    }
    run.clear();
    Ok(())
}

/// Where the events one journal key holds lie in its value: the sequence number of the first, and each
/// event's stored value as a byte range, in order. A run ends at its key's number ([`journal_runs`]). Ranges,
/// not decoded events, so a reader decodes only the events it wants.
pub(super) fn journal_spans(key: &[u8], value: &[u8]) -> Result<(u64, Vec<Range<usize>>), StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("journal: {what}"));
    let last = journal_seq(key).ok_or_else(|| corrupt("a key of the wrong length"))?;
    if value.first() != Some(&JOURNAL_RUN_V1) {
        return Err(corrupt("a value that is not a run of events"));
    }
    let mut spans = Vec::new();
    let mut at = 1;
    while at < value.len() {
        let len = value
            .get(at..at + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .ok_or_else(|| corrupt("a run cut short"))?;
        let start = at + 4;
        let end = start
            .checked_add(u32::from_le_bytes(len) as usize)
            .filter(|end| *end <= value.len())
            .ok_or_else(|| corrupt("a run cut short"))?;
        spans.push(start..end);
        at = end;
    }
    let count = spans.len() as u64;
    if count == 0 || count > last {
        return Err(corrupt(&format!("a run of {count} events ending at event {last}")));
    }
    Ok((last - count + 1, spans))
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
/// `created` is the kind of transaction the change made, whose entry is new (`Op::Create`).
pub(super) fn pending_ops(m: &MerchantId, record: &Record, created: Option<TransactionType>, ops: &mut Vec<Op>) {
    let mut set = |kind: TransactionType, key: Vec<u8>, waiting: bool| {
        ops.push(match waiting {
            true if created == Some(kind) => Op::Create(PENDING, key, Vec::new()),
            true => Op::Insert(PENDING, key, Vec::new()),
            false => Op::Remove(PENDING, key),
        })
    };
    match record {
        Record::Payment(p) => {
            let owner = p.reference.as_str();
            let waiting = matches!(p.status, PaymentStatus::Initiated | PaymentStatus::Processing);
            let kind = TransactionType::Payment;
            set(kind, pending_key(kind, p.created_at, m, owner), waiting);
            if let Some(r) = &p.refund {
                let waiting = r.status == RefundStatus::Processing;
                let kind = TransactionType::Refund;
                set(kind, pending_key(kind, r.created_at, m, owner), waiting);
            }
        }
        Record::Payout(o) => {
            let waiting = o.status == PayoutStatus::Pending;
            let kind = TransactionType::Payout;
            set(kind, pending_key(kind, o.created_at, m, &o.id), waiting);
        }
        // A link waits for no provider; its payments do, each as a payment.
        Record::Link(_) => {}
    }
}

/// `merchant ++ link id ++ ULID`: a payment made through a link, in the link's list of payments.
pub(super) fn link_payment_key(merchant: &MerchantId, link: &str, transaction_id: &str) -> Vec<u8> {
    let ulid = transaction_id.strip_prefix("tx_").unwrap_or(transaction_id);
    let mut key = mkey(merchant, link.as_bytes());
    key.extend_from_slice(ulid.as_bytes());
    key
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
pub(crate) mod tests {
    use std::collections::BTreeMap;
    use std::fmt::Debug;

    use super::*;
    use crate::core::JournalEvent;
    use crate::domain::ledger::{Account, Balance, Balances, Entry};
    use crate::domain::money::{Amount, Currency};
    use crate::domain::phone::Phone;
    use crate::domain::records::{
        Attempt, DeliveryState, Merchant, Notification, Payment, Payout, ProviderCode, Refund,
    };
    use crate::domain::status::{EventKind, Trigger};
    use crate::domain::text::{Email, Metadata, Name, Reason, Reference};
    use crate::store::{IdempotencyRecord, Snapshot};

    const MERCHANT: &str = "mch_01JD0000000000000000000000";

    /// Journal event `seq` of a merchant, crediting `amount` XOF to its available balance, as stored (not yet
    /// in a run).
    pub(crate) fn credit_event(seq: u64, amount: i64) -> Vec<u8> {
        encode(&JournalEvent {
            seq,
            at: Timestamp::from_unix_ms(1_795_310_624_123 + seq),
            trigger: Trigger::ProviderConfirmed,
            reference: format!("pay_{seq}"),
            status: "succes".into(),
            currency: Currency::XOF,
            entries: vec![
                Entry { account: Account::CustomerFunds, currency: Currency::XOF, amount_minor: -amount },
                Entry { account: Account::Available, currency: Currency::XOF, amount_minor: amount },
            ],
        })
        .unwrap()
    }

    /// A merchant's balances of `available` XOF as of event `seq`, as a snapshot or an audit checkpoint holds
    /// them.
    pub(crate) fn holding(seq: u64, available: i64) -> Snapshot {
        let mut balances = Balances::default();
        let entries = [
            Entry { account: Account::CustomerFunds, currency: Currency::XOF, amount_minor: -available },
            Entry { account: Account::Available, currency: Currency::XOF, amount_minor: available },
        ];
        balances.apply(&entries, 1_795_310_624_123).unwrap();
        Snapshot { seq, balances }
    }

    fn at(offset_ms: u64) -> Timestamp {
        Timestamp::from_unix_ms(1_795_310_624_123 + offset_ms)
    }

    fn merchant_id() -> MerchantId {
        MerchantId::parse(MERCHANT).unwrap()
    }

    /// A payment as format 3 stored it: refunded in full, its one refund in `remboursement`.
    fn payment_before_refunds() -> Payment {
        let metadata = BTreeMap::from([("commande".to_string(), "A-17 \"été\"".to_string())]);
        Payment {
            reference: Reference::parse("cmd-42").unwrap(),
            transaction_id: "tx_01JD0000000000000000000001".into(),
            status: PaymentStatus::Refunded,
            amount: Amount::new(5000).unwrap(),
            currency: Currency::parse("XOF").unwrap(),
            fee: Amount::new(75).unwrap(),
            net_amount: Amount::new(4925).unwrap(),
            provider: ProviderCode::parse("mtn_momo").unwrap(),
            customer_phone: Phone::parse("+22997000001").unwrap(),
            customer_email: Some(Email::parse("awa@example.com").unwrap()),
            customer_name: Some(Name::parse("Awa Koné").unwrap()),
            description: None,
            metadata: Metadata::new(metadata).unwrap(),
            created_at: at(0),
            updated_at: at(2_000),
            paid_at: Some(at(1_000)),
            failure_code: None,
            refund: Some(Refund {
                reference: "rmb_01JD0000000000000000000002".into(),
                amount: Amount::new(5000).unwrap(),
                reason: Some(Reason::parse("retour").unwrap()),
                status: RefundStatus::Succeeded,
                created_at: at(1_500),
                completed_at: Some(at(2_000)),
            }),
            country: Some("BJ".into()),
            payment_url: None,
            refunded_amount: Amount::ZERO,
            refunds: Vec::new(),
        }
    }

    /// The same payment in today's layout: a partial refund refused, then the rest refunded; also a sample for
    /// other modules' format tests.
    pub(crate) fn payment() -> Payment {
        let mut payment = payment_before_refunds();
        let refused = Refund {
            reference: "rmb_01JD0000000000000000000001".into(),
            amount: Amount::new(2000).unwrap(),
            reason: None,
            status: RefundStatus::Failed,
            created_at: at(1_200),
            completed_at: Some(at(1_300)),
        };
        let latest = payment.refund.take().unwrap();
        payment.refunded_amount = latest.amount;
        payment.push_refund(refused);
        payment.push_refund(latest);
        payment
    }

    pub(crate) fn payout() -> Payout {
        Payout {
            id: "ret_01JD0000000000000000000003".into(),
            transaction_id: "tx_01JD0000000000000000000003".into(),
            status: PayoutStatus::Rejected,
            amount: Amount::new(1000).unwrap(),
            currency: Currency::parse("XOF").unwrap(),
            fee: Amount::new(0).unwrap(),
            net_amount: Amount::new(1000).unwrap(),
            provider: ProviderCode::parse("wave").unwrap(),
            beneficiary_phone: Phone::parse("+221770000001").unwrap(),
            beneficiary_name: None,
            description: None,
            metadata: Metadata::empty(),
            created_at: at(0),
            updated_at: at(10),
            processed_at: None,
            rejection_reason: Some("compte fermé".into()),
            reference: Some(Reference::parse("virement-7").unwrap()),
        }
    }

    fn journal_event() -> JournalEvent {
        let xof = Currency::parse("XOF").unwrap();
        JournalEvent {
            seq: 7,
            at: at(1_000),
            currency: xof,
            entries: vec![
                Entry { account: Account::CustomerFunds, currency: xof, amount_minor: -5000 },
                Entry { account: Account::Fees, currency: xof, amount_minor: 75 },
                Entry { account: Account::Available, currency: xof, amount_minor: 4925 },
            ],
            trigger: Trigger::ProviderConfirmed,
            reference: "cmd-42".into(),
            status: "succes".into(),
        }
    }

    pub(crate) fn notification() -> Notification {
        Notification {
            id: "evt_01JD0000000000000000000004".into(),
            merchant: merchant_id(),
            event: EventKind::PaymentSucceeded,
            reference: "cmd-42".into(),
            body: r#"{"event":"payment.succeeded","data":{"reference":"cmd-42","metadata":{"note":"\"é\""}}}"#.into(),
            created_at: at(1_000),
            state: DeliveryState::Failed,
            next_attempt_at: None,
            attempts: vec![Attempt {
                at: at(1_100),
                signed_at_s: Some(1_795_310_625),
                http_status: Some(500),
                error: Some("HTTP 500".into()),
                latency_ms: 12,
            }],
            chain_attempts: 1,
            total_attempts: 1,
        }
    }

    fn snapshot() -> Snapshot {
        let balance = Balance { available: 4925, pending: 0, updated_at_ms: 1_795_310_625_123 };
        Snapshot { seq: 7, balances: Balances(BTreeMap::from([(Currency::parse("XOF").unwrap(), balance)])) }
    }

    fn idempotency() -> IdempotencyRecord {
        IdempotencyRecord {
            fingerprint: "ab".repeat(32),
            status: 201,
            body: r#"{"reference":"cmd-42"}"#.into(),
            created_at: at(0),
        }
    }

    fn merchant() -> Merchant {
        Merchant {
            id: merchant_id(),
            name: "Boutique Awa".into(),
            email: "awa@example.com".into(),
            password_hash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA".into(),
            secret_key: "sk_test_0123456789".into(),
            webhook_url: Some("https://awa.example.com/hook".into()),
            created_at: at(0),
        }
    }

    /// Reads back what it wrote; answers the sizes of the binary and of the JSON form.
    fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: &T) -> (usize, usize) {
        let binary = encode(value).unwrap();
        assert_eq!(binary[0], BINARY_V1);
        assert_eq!(&decode::<T>("test", &binary).unwrap(), value);
        (binary.len(), serde_json::to_vec(value).unwrap().len())
    }

    #[test]
    fn every_stored_record_reads_back() {
        round_trip(&payment());
        round_trip(&payout());
        round_trip(&journal_event());
        round_trip(&notification());
        round_trip(&snapshot());
        round_trip(&idempotency());
        round_trip(&merchant());
        round_trip(&Record::Payment(payment()));
    }

    #[test]
    fn the_records_a_payment_writes_take_far_fewer_bytes_than_json() {
        for (what, (binary, json)) in [
            ("payment", round_trip(&payment())),
            ("journal event", round_trip(&journal_event())),
            ("notification", round_trip(&notification())),
        ] {
            assert!(binary * 3 < json * 2, "{what}: {binary} bytes against JSON's {json}");
        }
    }

    /// The binary format is positional: this fails when a stored record's fields change shape or order, which
    /// changes the store's format: raise `FORMAT_VERSION` with it (see the module's documentation).
    #[test]
    fn stored_bytes_are_pinned() {
        let hex = |bytes: Vec<u8>| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let stored = [encode(&journal_event()), encode(&payment()), encode(&notification())].map(|b| hex(b.unwrap()));
        assert_eq!(
            stored,
            [
                "0107e3c2e886a03403584f46030203584f468f4e0303584f4696010003584f46fa4c0206636d642d343206737563636573",
                "0106636d642d34321d74785f30314a443030303030303030303030303030303030303030303105904e03584f469601fa4c08\
                 6d746e5f6d6f6d6f0c2b3232393937303030303031010f617761406578616d706c652e636f6d0109417761204b6f6ec3a900\
                 0108636f6d6d616e64650c412d31372022c3a974c3a922fbbae886a034cbcae886a03401e3c2e886a03400011e726d625f30\
                 314a4430303030303030303030303030303030303030303032904e01067265746f757201d7c6e886a03401cbcae886a03401\
                 02424a00904e021e726d625f30314a4430303030303030303030303030303030303030303031a01f0002abc4e886a034018f\
                 c5e886a0341e726d625f30314a4430303030303030303030303030303030303030303032904e01067265746f757201d7c6e8\
                 86a03401cbcae886a034",
                "011e6576745f30314a44303030303030303030303030303030303030303030341e6d63685f30314a44303030303030303030\
                 303030303030303030303030300206636d642d3432587b226576656e74223a227061796d656e742e73756363656564656422\
                 2c2264617461223a7b227265666572656e6365223a22636d642d3432222c226d65746164617461223a7b226e6f7465223a22\
                 5c22c3a95c22227d7d7de3c2e886a034020001c7c3e886a03401a18889d80601f403010848545450203530300c0101",
            ]
        );
    }

    /// Format 3's bytes of `payment_before_refunds`, as `stored_bytes_are_pinned` held them then.
    const PAYMENT_FORMAT_3: &str =
        "0106636d642d34321d74785f30314a443030303030303030303030303030303030303030303105904e03584f469601fa4c08\
        6d746e5f6d6f6d6f0c2b3232393937303030303031010f617761406578616d706c652e636f6d0109417761204b6f6ec3a900\
        0108636f6d6d616e64650c412d31372022c3a974c3a922fbbae886a034cbcae886a03401e3c2e886a03400011e726d625f30\
        314a4430303030303030303030303030303030303030303032904e01067265746f757201d7c6e886a03401cbcae886a034\
        0102424a00";

    fn unhex(text: &str) -> Vec<u8> {
        let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits.chunks(2).map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap()).collect()
    }

    #[test]
    fn a_payment_stored_before_several_refunds_reads_with_its_refund_listed() {
        let read = crate::store::legacy::decode_payment("payments", &unhex(PAYMENT_FORMAT_3)).unwrap();
        let mut expected = payment_before_refunds();
        expected.refunds = expected.refund.iter().cloned().collect();
        expected.refunded_amount = Amount::new(5000).unwrap();
        assert_eq!(read, expected);
        assert_eq!(read.status, PaymentStatus::Refunded);

        // A refund of part of the payment was marked `rembourse` then; it reads as what it was.
        let mut partial = payment_before_refunds();
        partial.refund.as_mut().unwrap().amount = Amount::new(2000).unwrap();
        let today = encode(&partial).unwrap();
        // The two appended fields at their smallest (a zero amount, an empty list) are one byte each.
        let old = &today[..today.len() - 2];
        assert!(decode::<Payment>("payments", old).is_err(), "an old value is not today's");
        let read = crate::store::legacy::decode_payment("payments", old).unwrap();
        assert_eq!(read.status, PaymentStatus::PartlyRefunded);
        assert_eq!(read.refunded_amount, Amount::new(2000).unwrap());
        assert_eq!(read.refundable(), Amount::new(3000).unwrap());
        assert_eq!(read.refunds.len(), 1);

        // Today's value is read as today's, and a value of neither layout is refused as today's.
        assert_eq!(crate::store::legacy::decode_payment("payments", &encode(&payment()).unwrap()).unwrap(), payment());
        let mut longer = encode(&payment()).unwrap();
        longer.push(0);
        assert!(matches!(
            crate::store::legacy::decode_payment("payments", &longer),
            Err(StoreError::Corrupt(m)) if m.contains("left over")
        ));
    }

    #[test]
    fn a_payout_stored_before_references_reads_without_one() {
        let without = Payout { reference: None, ..payout() };
        let today = encode(&without).unwrap();
        // `None` is one byte: what format 3 stored is today's bytes without it.
        let old = &today[..today.len() - 1];
        assert!(decode::<Payout>("payouts", old).is_err(), "an old value is not today's");
        assert_eq!(crate::store::legacy::decode_payout("payouts", old).unwrap(), without);
        assert_eq!(crate::store::legacy::decode_payout("payouts", &encode(&payout()).unwrap()).unwrap(), payout());
    }

    #[test]
    fn unknown_formats_and_left_over_bytes_are_refused_naming_the_tree() {
        let mut longer = encode(&journal_event()).unwrap();
        longer.push(0);
        let mut newer = encode(&journal_event()).unwrap();
        newer[0] = BINARY_V1 + 1;
        for (bytes, says) in [
            (Vec::new(), "empty value"),
            (newer, "unknown value format 0x02"),
            (longer, "1 bytes left over"),
            (br#"{"seq":1}"#.to_vec(), "unknown value format 0x7b"),
            (vec![BINARY_V1, 7], "journal"),
        ] {
            match decode::<JournalEvent>("journal", &bytes) {
                Err(StoreError::Corrupt(message)) => {
                    assert!(message.starts_with("journal: ") && message.contains(says), "{message}")
                }
                other => panic!("{bytes:?} gave {other:?}"),
            }
        }
    }

    fn event(seq: u64) -> Vec<u8> {
        encode(&JournalEvent { seq, ..journal_event() }).unwrap()
    }

    /// An event as the writer stores it: a run of one.
    fn written(seq: u64) -> Vec<u8> {
        journal_run([event(seq).as_slice()]).unwrap()
    }

    #[test]
    fn a_batchs_journal_is_stored_as_runs_of_each_merchants_consecutive_events() {
        let (a, b) = (merchant_id(), MerchantId::parse("mch_01JD0000000000000000000009").unwrap());
        let mut keys = TreeMap::new();
        let mut put = |m: &MerchantId, seqs: std::ops::RangeInclusive<u64>| {
            for seq in seqs {
                keys.insert(journal_key(m, seq), Some(written(seq)));
            }
        };
        put(&a, 1..=3);
        put(&a, 5..=5); // after a gap
        put(&b, 1..=1); // another merchant
        put(&b, 10..=10 + MAX_RUN as u64); // one event more than a run holds
        keys.insert(journal_key(&b, 1_000), None);
        keys.insert(b"odd".to_vec(), Some(written(1)));
        let stored = journal_runs(&keys).unwrap();
        let mut found = Vec::new();
        for (key, entry) in &stored {
            let Some(value) = entry else {
                found.push((key.clone(), 0, 0));
                continue;
            };
            let Ok((first, spans)) = journal_spans(key, value) else {
                found.push((key.clone(), 0, 1));
                continue;
            };
            for (seq, span) in (first..).zip(&spans) {
                assert_eq!(decode::<JournalEvent>("journal", &value[span.clone()]).unwrap().seq, seq);
            }
            found.push((key.clone(), first, spans.len()));
        }
        let last_of_b = 10 + MAX_RUN as u64;
        assert_eq!(
            found,
            [
                (journal_key(&a, 3), 1, 3),
                (journal_key(&a, 5), 5, 1),
                (journal_key(&b, 1), 1, 1),
                (journal_key(&b, last_of_b - 1), 10, MAX_RUN),
                (journal_key(&b, last_of_b), last_of_b, 1),
                (journal_key(&b, 1_000), 0, 0),
                (b"odd".to_vec(), 0, 1),
            ]
        );
        // A lone event stays the run of one the writer made.
        assert_eq!(stored[1].1.as_deref(), Some(&written(5)[..]));
    }

    /// Like the records' bytes, a run's framing is read back by later versions.
    #[test]
    fn a_runs_bytes_are_pinned() {
        let mut keys = TreeMap::new();
        for seq in [7, 8] {
            keys.insert(journal_key(&merchant_id(), seq), Some(written(seq)));
        }
        let stored = journal_runs(&keys).unwrap();
        let [(key, Some(value))] = stored.as_slice() else { panic!("{stored:?}") };
        assert_eq!(key, &journal_key(&merchant_id(), 8));
        let hex = value.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(
            hex,
            "02310000000107e3c2e886a03403584f46030203584f468f4e0303584f4696010003584f46fa4c0206636d642d3432067375\
             63636573310000000108e3c2e886a03403584f46030203584f468f4e0303584f4696010003584f46fa4c0206636d642d3432\
             06737563636573"
        );
    }

    #[test]
    fn a_damaged_run_is_refused() {
        let key = journal_key(&merchant_id(), 2);
        for (value, says) in [
            (vec![JOURNAL_RUN_V1], "a run of 0 events"),
            (vec![JOURNAL_RUN_V1, 5, 0, 0, 0, 1, 2], "cut short"),
            (vec![JOURNAL_RUN_V1, 1, 0], "cut short"),
            ([&[JOURNAL_RUN_V1][..], &[1, 0, 0, 0, 9].repeat(3)].concat(), "a run of 3 events ending at event 2"),
        ] {
            match journal_spans(&key, &value) {
                Err(StoreError::Corrupt(message)) => assert!(message.contains(says), "{message}"),
                other => panic!("{value:?} gave {other:?}"),
            }
        }
        assert!(matches!(journal_spans(b"short", &written(1)), Err(StoreError::Corrupt(_))));
        // A bare event, not framed as a run, is not a journal value.
        assert!(matches!(journal_spans(&key, &event(2)), Err(StoreError::Corrupt(m)) if m.contains("not a run")));
    }

    /// A tree's number is its place in `TREE_NAMES`, and the write-ahead log stores that number: reordering the
    /// trees changes the format (raise `FORMAT_VERSION` with it), which this fails to remind.
    #[test]
    fn tree_numbers_are_pinned() {
        assert_eq!(
            TREE_NAMES,
            [
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
                "outbox_due",
                "pending",
                "notifications",
                "routes",
                "provider_references",
                "merchant_suspensions",
                "retired_keys",
                "links",
                "link_owners",
                "link_refs",
                "link_payments",
                "audited",
                "idempotency_times",
            ]
        );
        assert_eq!(FORMAT_VERSION, 6);
    }

    #[test]
    fn the_apply_order_names_every_tree_once() {
        let mut order: Vec<usize> = APPLY_ORDER.to_vec();
        order.sort_unstable();
        assert_eq!(order, (0..TREE_NAMES.len()).collect::<Vec<_>>());
    }

    #[test]
    fn records_are_applied_before_the_indexes_that_point_at_them() {
        let at = |tree| APPLY_ORDER.iter().position(|&t| t == tree).unwrap();
        for (record, index) in [
            (NOTIFICATIONS, OUTBOX_DUE),
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
