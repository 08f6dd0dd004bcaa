//! The sled backend: opening the store, turning a [`Change`] into sled operations for the group-commit
//! writer, and every read the [`Store`] trait offers. Where things live is [`super::layout`]'s business.
//!
//! This file holds the [`SledStore`] handle and its [`Store`] implementation, with the point lookups done in
//! place; `open` opens the database and starts the writer, `write` builds the operations of each write,
//! `index` reads the paged lists through the indexes, `outbox` reads notifications, and `recovery` replays the
//! journal for a merchant's recovery and for the startup audit.

mod index;
mod open;
mod outbox;
mod recovery;
mod stamp;
mod write;

use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::de::DeserializeOwned;

// The layout's trees, keys and encodings are this file's vocabulary.
use super::layout::*;
use super::overlay::{Merged, Overlay};
use super::writer::Writer;
use super::{
    Accounts, Audit, AuditReport, AwaitingProvider, Change, Commits, FailureLatch, IdempotencyRecord, Located, Outbox,
    Page, Records, Recovered, StoreError, Ticket,
};
use crate::core::{JournalEvent, Record};
use crate::domain::ids::{MerchantId, MERCHANT_ID_LEN};
use crate::domain::records::{Merchant, Notification, Payment, Payout, Transaction, TransactionType};
use crate::domain::text::IdempotencyKey;
use crate::domain::time::Timestamp;

pub use open::DEFAULT_CACHE_BYTES;
pub use stamp::STAMP_FILE;

/// Scanning a filtered list stops after this many index entries, so one request's work is bounded.
const MAX_SCAN: usize = 5_000;

pub struct SledStore {
    trees: Vec<sled::Tree>,
    /// What is acknowledged but not yet in sled; every read looks here first (see [`super::overlay`]).
    overlay: Arc<Overlay>,
    writer: Writer,
    healthy: Arc<AtomicBool>,
    feed: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<Notification>>>,
}

fn io(context: &str) -> impl Fn(sled::Error) -> StoreError + '_ {
    move |e| StoreError::Io(format!("{context}: {e}"))
}

/// A range scan's items: the overlay merged with sled.
type Scan = Box<dyn Iterator<Item = Result<(sled::IVec, sled::IVec), StoreError>> + Send>;

impl SledStore {
    fn get<T: DeserializeOwned>(&self, tree: usize, key: &[u8]) -> Result<Option<T>, StoreError> {
        match self.raw(tree, key)? {
            Some(bytes) => decode(TREE_NAMES[tree], &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// The value of `key`: the overlay's if it has the key, else sled's.
    fn raw(&self, tree: usize, key: &[u8]) -> Result<Option<sled::IVec>, StoreError> {
        match self.overlay.get(tree, key)? {
            Some(entry) => Ok(entry.map(sled::IVec::from)),
            None => self.trees[tree].get(key).map_err(io(TREE_NAMES[tree])),
        }
    }

    /// The keys of `tree` between `start` and `end`, the overlay merged with sled, in key order or, with
    /// `reverse`, from the end. The overlay's part is read first, so a layer the applier releases meanwhile is
    /// still seen (sled holds it by then, and says the same).
    fn scan(&self, tree: usize, start: Bound<&[u8]>, end: Bound<&[u8]>, reverse: bool) -> Result<Scan, StoreError> {
        let overlay = self.overlay.range(tree, start, end)?;
        let range = self.trees[tree].range::<&[u8], _>((start, end));
        let name = TREE_NAMES[tree];
        Ok(if reverse {
            Box::new(Merged::new(range.rev(), overlay, true).map(move |item| item.map_err(io(name))))
        } else {
            Box::new(Merged::new(range, overlay, false).map(move |item| item.map_err(io(name))))
        })
    }
}

impl Commits for SledStore {
    fn commit(&self, change: Change, guard: &FailureLatch) -> Result<Ticket, StoreError> {
        let (ops, notify) = Self::change_ops(&change)?;
        self.writer.submit(ops, Some(guard), notify)
    }

    fn recover_merchant(&self, id: &MerchantId) -> Result<Recovered, StoreError> {
        self.recover_from_snapshot(id)
    }
}

impl Records for SledStore {
    fn payment(&self, merchant: &MerchantId, reference: &str) -> Result<Option<Payment>, StoreError> {
        self.get(PAYMENTS, &mkey(merchant, reference.as_bytes()))
    }

    fn payout(&self, merchant: &MerchantId, id: &str) -> Result<Option<Payout>, StoreError> {
        self.get(PAYOUTS, &mkey(merchant, id.as_bytes()))
    }

    fn locate(&self, merchant: &MerchantId, reference: &str) -> Result<Option<Located>, StoreError> {
        // References share one namespace per merchant: a refund's or a payout's is an entry in `refs`, a
        // payment's is the key of its record (stores written before payments stopped getting a `refs` entry
        // have both, and both say the same).
        let Some(ptr) = self.raw(REFS, &mkey(merchant, reference.as_bytes()))? else {
            let payment = self.payment(merchant, reference)?;
            return Ok(payment.map(|p| Located {
                kind: TransactionType::Payment,
                reference: reference.to_owned(),
                record: Record::Payment(p),
            }));
        };
        let (kind, owner, reference) = parse_pointer(&ptr)?;
        let record = self
            .record(merchant, kind, owner)?
            .ok_or_else(|| StoreError::Corrupt(format!("merchant {merchant}: {reference} points to nothing")))?;
        Ok(Some(Located { kind, reference: reference.to_owned(), record }))
    }

    fn owner_of_transaction(&self, transaction_id: &str) -> Result<Option<(MerchantId, Located)>, StoreError> {
        let Some(value) = self.raw(TX_OWNER, transaction_id.as_bytes())? else {
            return Ok(None);
        };
        let corrupt = || StoreError::Corrupt(format!("bad owner of {transaction_id}"));
        let (id, ptr) = value.split_at_checked(MERCHANT_ID_LEN).ok_or_else(corrupt)?;
        let merchant = MerchantId::parse(std::str::from_utf8(id).map_err(|_| corrupt())?).map_err(|_| corrupt())?;
        let (kind, owner, reference) = parse_pointer(ptr)?;
        let record = self.record(&merchant, kind, owner)?.ok_or_else(corrupt)?;
        Ok(Some((merchant, Located { kind, reference: reference.to_owned(), record })))
    }

    fn idempotency(
        &self,
        merchant: &MerchantId,
        key: &IdempotencyKey,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.get(IDEMPOTENCY, &mkey(merchant, key.as_str().as_bytes()))
    }

    fn transactions(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Transaction) -> bool,
    ) -> Result<Page<Transaction>, StoreError> {
        self.transactions_page(merchant, cursor, limit, keep)
    }

    fn payouts(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Payout) -> bool,
    ) -> Result<Page<Payout>, StoreError> {
        self.payouts_page(merchant, cursor, limit, keep)
    }

    fn awaiting_provider(
        &self,
        kind: TransactionType,
        created_before: Timestamp,
        after: Option<&AwaitingProvider>,
        limit: usize,
    ) -> Result<Vec<AwaitingProvider>, StoreError> {
        self.scan_pending(kind, created_before, after, limit)
    }

    fn journal(&self, merchant: &MerchantId, from_seq: u64, limit: usize) -> Result<Vec<JournalEvent>, StoreError> {
        self.journal_after::<JournalEvent>(merchant, from_seq.saturating_sub(1)).take(limit).collect()
    }
}

impl Outbox for SledStore {
    fn outbox_feed(&self) -> Option<tokio::sync::mpsc::Receiver<Notification>> {
        self.feed.lock().ok().and_then(|mut feed| feed.take())
    }

    fn save_notification(&self, before: &Notification, after: &Notification) -> Result<Ticket, StoreError> {
        self.submit_notification(before, after)
    }

    fn notifications(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Notification) -> bool,
    ) -> Result<Page<Notification>, StoreError> {
        self.notifications_page(merchant, cursor, limit, keep)
    }

    fn notification(&self, merchant: &MerchantId, id: &str) -> Result<Option<Notification>, StoreError> {
        self.load_notification(merchant, id.as_bytes())
    }

    fn due_notifications_skipping(
        &self,
        now: Timestamp,
        limit: usize,
        skip: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Vec<Notification>, StoreError> {
        self.scan_due(now, limit, skip)
    }
}

impl Accounts for SledStore {
    fn put_merchant(&self, merchant: Merchant, previous_key: Option<String>) -> Result<Ticket, StoreError> {
        self.submit_merchant(merchant, previous_key)
    }

    fn merchant(&self, id: &MerchantId) -> Result<Option<Merchant>, StoreError> {
        self.get(MERCHANTS, id.as_bytes())
    }

    fn merchants_generation(&self) -> u64 {
        self.writer.generation(MERCHANTS)
    }

    fn merchant_by_key(&self, secret_key: &str) -> Result<Option<Merchant>, StoreError> {
        // Looked up by hash, so the lookup's timing says nothing about the key; the caller then compares the
        // whole key in constant time.
        let Some(id) = self.raw(MERCHANT_KEYS, &key_hash(secret_key))? else {
            return Ok(None);
        };
        self.get(MERCHANTS, &id)
    }

    fn merchant_by_email(&self, email: &str) -> Result<Option<Merchant>, StoreError> {
        let key = email.to_lowercase();
        let Some(id) = self.raw(MERCHANT_EMAILS, key.as_bytes())? else {
            return Ok(None);
        };
        self.get(MERCHANTS, &id)
    }

    fn merchant_count(&self) -> Result<u64, StoreError> {
        // sled's count, corrected by what the overlay adds or removes. While the applier is inserting a new
        // merchant, the count may miss it for that moment (sled's length was read before the insert, the key
        // is found after it). The service counts merchants only at start, to decide on the demo merchant.
        let merchants = &self.trees[MERCHANTS];
        let mut count = merchants.len() as u64;
        for (key, entry) in self.overlay.range(MERCHANTS, Bound::Unbounded, Bound::Unbounded)? {
            match (entry.is_some(), merchants.contains_key(&key).map_err(io("merchants"))?) {
                (true, false) => count += 1,
                (false, true) => count = count.saturating_sub(1),
                _ => {}
            }
        }
        Ok(count)
    }
}

impl Audit for SledStore {
    fn audit(&self) -> Result<AuditReport, StoreError> {
        self.audit_journal()
    }

    fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }
}
