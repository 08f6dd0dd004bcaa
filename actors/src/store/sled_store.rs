//! The sled backend: opening the store, turning a [`Change`] into sled operations for the group-commit
//! writer, and every read the [`Store`] trait offers. Where things live is [`super::layout`]'s business.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::de::DeserializeOwned;

// The layout's trees, keys and encodings are this file's vocabulary.
use super::layout::*;
use super::writer::{Op, Writer};
use super::{
    AuditReport, Change, IdempotencyRecord, Located, Page, Pending, Recovered, Snapshot, Store, StoreError, Ticket,
    WriteGuard,
};
use crate::core::{JournalEvent, Record};
use crate::domain::ids::{MerchantId, MERCHANT_ID_LEN};
use crate::domain::ledger::{check_balanced, Balances};
use crate::domain::records::{DeliveryState, Merchant, Notification, Payment, Payout, Transaction, TransactionType};
use crate::domain::text::IdempotencyKey;
use crate::domain::time::Timestamp;

/// Notifications waiting for the dispatcher beyond this are found by its scan of the due index instead.
const FEED_CAPACITY: usize = 64 * 1024;

/// Scanning a filtered list stops after this many index entries, so one request's work is bounded.
const MAX_SCAN: usize = 5_000;

pub struct SledStore {
    trees: Vec<sled::Tree>,
    writer: Writer,
    healthy: Arc<AtomicBool>,
    feed: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<Notification>>>,
}

fn io(context: &str) -> impl Fn(sled::Error) -> StoreError + '_ {
    move |e| StoreError::Io(format!("{context}: {e}"))
}

/// sled's page cache unless the operator sets `store_cache_mib`. sled's own default (1 GiB) would let a
/// long-running server grow far past the memory budget of a small machine, and sled's real use is several
/// times this figure (it counts on-disk bytes, its in-memory nodes are larger); the hot data (recent
/// payments, due notifications) fits in much less, and a miss is a read from the OS page cache.
pub const DEFAULT_CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// How long an open waits for a lock that is being released. sled 0.34 closes its files from its own IO
/// threads, which can finish a few milliseconds after the last `Db` handle is dropped; a process that closes
/// and reopens the same directory (a test, a supervised restart) would otherwise see its own old lock.
const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

fn open_when_unlocked(dir: &Path, cache_bytes: u64) -> Result<sled::Db, StoreError> {
    let started = std::time::Instant::now();
    loop {
        // No background flush: the write-ahead log makes changes durable, checkpoints flush sled when the disk
        // is known good, and a flush failing on its own would leave sled refusing everything until reopened.
        match sled::Config::new().path(dir).flush_every_ms(None).cache_capacity(cache_bytes).open() {
            Ok(db) => return Ok(db),
            Err(e) => {
                let text = e.to_string();
                if !text.contains("lock") {
                    return Err(StoreError::Io(format!("open {}: {text}", dir.display())));
                }
                if started.elapsed() >= LOCK_GRACE {
                    return Err(StoreError::Locked(format!("{}: {text}", dir.display())));
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

impl SledStore {
    /// Opens (or creates) the store under `dir` with the default cache and starts its writer. Does not
    /// audit: call [`Store::audit`].
    pub fn open(dir: &Path) -> Result<SledStore, StoreError> {
        SledStore::open_with_cache(dir, DEFAULT_CACHE_BYTES)
    }

    /// [`SledStore::open`] with sled's page cache set to `cache_bytes`.
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<SledStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Io(format!("create {}: {e}", dir.display())))?;
        let db = open_when_unlocked(dir, cache_bytes)?;
        let trees = TREE_NAMES
            .iter()
            .map(|name| db.open_tree(name))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io("open trees"))?;
        // The files sled just created must be reachable after a power cut: sync their directory once.
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| StoreError::Io(format!("sync {}: {e}", dir.display())))?;
        let healthy = Arc::new(AtomicBool::new(true));
        let (feed_tx, feed_rx) = tokio::sync::mpsc::channel(FEED_CAPACITY);
        let next_log = super::writer::recover(&db, &trees, &APPLY_ORDER, dir)?;
        let writer =
            Writer::spawn(db.clone(), trees.clone(), APPLY_ORDER.to_vec(), dir, next_log, healthy.clone(), feed_tx)?;
        Ok(SledStore { trees, writer, healthy, feed: std::sync::Mutex::new(Some(feed_rx)) })
    }

    /// A notification with its body, which lives in its own tree so that saving an attempt does not
    /// rewrite it. Records from before that split still carry their body inline.
    fn load_notification(&self, id: &[u8]) -> Result<Option<Notification>, StoreError> {
        match self.get::<Notification>(OUTBOX, id)? {
            Some(n) => self.with_body(n).map(Some),
            None => Ok(None),
        }
    }

    fn with_body(&self, mut n: Notification) -> Result<Notification, StoreError> {
        if n.body.is_empty() {
            let bytes = self.trees[OUTBOX_BODY]
                .get(n.id.as_bytes())
                .map_err(io("outbox_body"))?
                .ok_or_else(|| StoreError::Corrupt(format!("notification {} has no body", n.id)))?;
            n.body = String::from_utf8(bytes.to_vec())
                .map_err(|_| StoreError::Corrupt(format!("notification {} body is not UTF-8", n.id)))?;
        }
        Ok(n)
    }

    fn get<T: DeserializeOwned>(&self, tree: usize, key: &[u8]) -> Result<Option<T>, StoreError> {
        match self.trees[tree].get(key).map_err(io(TREE_NAMES[tree]))? {
            Some(bytes) => decode(TREE_NAMES[tree], &bytes).map(Some),
            None => Ok(None),
        }
    }

    fn record(&self, merchant: &MerchantId, kind: TransactionType, owner: &str) -> Result<Option<Record>, StoreError> {
        Ok(match kind {
            TransactionType::Retrait => self.payout(merchant, owner)?.map(Record::Payout),
            _ => self.payment(merchant, owner)?.map(Record::Payment),
        })
    }

    fn change_ops(change: &Change) -> Result<(Vec<Op>, Vec<Notification>), StoreError> {
        let m = &change.merchant;
        let mut ops = Vec::with_capacity(8 + 3 * change.outbox.len());
        let mut created = Vec::with_capacity(change.outbox.len());
        ops.push(Op::Insert(JOURNAL, journal_key(m, change.journal.seq), encode(&change.journal)?));
        match &change.record {
            Record::Payment(p) => ops.push(Op::Insert(PAYMENTS, mkey(m, p.reference.as_str().as_bytes()), encode(p)?)),
            Record::Payout(o) => ops.push(Op::Insert(PAYOUTS, mkey(m, o.id.as_bytes()), encode(o)?)),
        }
        if let Some(created) = &change.created {
            let ulid = created.transaction_id.strip_prefix("tx_").unwrap_or(&created.transaction_id);
            let ptr = pointer(created.kind, &created.owner, &created.reference);
            ops.push(Op::Insert(TX_INDEX, mkey(m, ulid.as_bytes()), ptr.clone()));
            ops.push(Op::Insert(REFS, mkey(m, created.reference.as_bytes()), ptr.clone()));
            let mut owner = m.as_bytes().to_vec();
            owner.extend_from_slice(&ptr);
            ops.push(Op::Insert(TX_OWNER, created.transaction_id.as_bytes().to_vec(), owner));
        }
        for item in &change.outbox {
            let notification = Notification {
                id: item.id.clone(),
                merchant: m.clone(),
                event: item.event,
                reference: item.reference.clone(),
                body: item.body.clone(),
                created_at: change.journal.at,
                state: DeliveryState::Pending,
                next_attempt_at: Some(change.journal.at),
                attempts: Vec::new(),
                chain_attempts: 0,
                total_attempts: 0,
            };
            ops.push(Op::Insert(OUTBOX, item.id.as_bytes().to_vec(), encode_state(&notification)?));
            ops.push(Op::Insert(OUTBOX_BODY, item.id.as_bytes().to_vec(), item.body.as_bytes().to_vec()));
            ops.push(Op::Insert(OUTBOX_DUE, due_key(change.journal.at, &item.id), Vec::new()));
            ops.push(Op::Insert(OUTBOX_BY_MERCHANT, mkey(m, item.id.as_bytes()), Vec::new()));
            created.push(notification);
        }
        pending_ops(m, &change.record, &mut ops);
        if let Some((key, record)) = &change.idempotency {
            ops.push(Op::Insert(IDEMPOTENCY, mkey(m, key.as_str().as_bytes()), encode(record)?));
        }
        if let Some(snapshot) = &change.snapshot {
            ops.push(Op::Insert(SNAPSHOTS, m.as_bytes().to_vec(), encode(snapshot)?));
        }
        Ok((ops, created))
    }

    /// Replays `events` (one merchant's, in order, starting after `start`) onto `start`, checking each.
    fn replay(
        merchant: &MerchantId,
        start: Recovered,
        events: impl Iterator<Item = Result<JournalEvent, StoreError>>,
    ) -> Result<Recovered, StoreError> {
        let mut state = start;
        for event in events {
            let event = event?;
            if event.seq != state.seq + 1 {
                return Err(StoreError::Corrupt(format!(
                    "merchant {merchant}: journal jumps from {} to {}",
                    state.seq, event.seq
                )));
            }
            check_balanced(&event.entries).map_err(|e| {
                StoreError::Corrupt(format!("merchant {merchant} {} event {}: {e}", event.devise, event.seq))
            })?;
            state.balances.touch(event.devise, event.at.unix_ms());
            state.balances.apply(&event.entries, event.at.unix_ms()).map_err(|e| {
                StoreError::Corrupt(format!("merchant {merchant} {} at event {}: {e}", event.devise, event.seq))
            })?;
            state.seq = event.seq;
        }
        Ok(state)
    }

    /// Walks a merchant's transaction index newest first, from before `cursor` (a `tx_` id), handing each
    /// entry's record to `take`, until `limit` items were taken or [`MAX_SCAN`] entries were looked at.
    /// Entries of another kind than `only` are passed over without reading their record. `has_more` says the
    /// index goes on; the cursor is the last entry looked at.
    fn scan_index<T>(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        only: Option<TransactionType>,
        take: &mut dyn FnMut(TransactionType, Record) -> Option<T>,
    ) -> Result<Page<T>, StoreError> {
        let start = mkey(merchant, b"");
        let end = match cursor {
            Some(c) => mkey(merchant, c.strip_prefix("tx_").unwrap_or(c).as_bytes()),
            None => mkey(merchant, &[0xff]),
        };
        let mut data = Vec::with_capacity(limit.min(100));
        let mut has_more = false;
        let mut last_scanned = None;
        for (scanned, item) in self.trees[TX_INDEX].range(start..end).rev().enumerate() {
            let (key, ptr) = item.map_err(io("tx_index"))?;
            if data.len() == limit || scanned == MAX_SCAN {
                has_more = true;
                break;
            }
            let (kind, owner, _) = parse_pointer(&ptr)?;
            last_scanned = Some(format!("tx_{}", String::from_utf8_lossy(&key[MERCHANT_ID_LEN..])));
            if only.is_some_and(|wanted| wanted != kind) {
                continue;
            }
            if let Some(item) = self.record(merchant, kind, owner)?.and_then(|record| take(kind, record)) {
                data.push(item);
            }
        }
        let next_cursor = if has_more { last_scanned } else { None };
        Ok(Page { data, has_more, next_cursor })
    }

    fn journal_after(
        &self,
        merchant: &MerchantId,
        after_seq: u64,
    ) -> impl Iterator<Item = Result<JournalEvent, StoreError>> + '_ {
        let start = journal_key(merchant, after_seq.saturating_add(1));
        let end = journal_key(merchant, u64::MAX);
        self.trees[JOURNAL]
            .range(start..=end)
            .map(|item| item.map_err(io("journal")).and_then(|(_, v)| decode::<JournalEvent>("journal", &v)))
    }
}

impl Store for SledStore {
    fn commit(&self, change: Change, guard: &WriteGuard) -> Result<Ticket, StoreError> {
        let (ops, notify) = Self::change_ops(&change)?;
        self.writer.submit(ops, Some(guard), notify)
    }

    fn put_merchant(&self, merchant: Merchant, previous_key: Option<String>) -> Result<Ticket, StoreError> {
        let email = merchant.email.to_lowercase();
        if let Some(owner) = self.trees[MERCHANT_EMAILS].get(email.as_bytes()).map_err(io("merchant_emails"))? {
            if owner.as_ref() != merchant.id.as_bytes() {
                return Err(StoreError::Conflict(format!("a merchant with e-mail {email} already exists")));
            }
        }
        let mut ops = vec![
            Op::Insert(MERCHANTS, merchant.id.as_bytes().to_vec(), encode(&merchant)?),
            Op::Insert(MERCHANT_KEYS, key_hash(&merchant.secret_key), merchant.id.as_bytes().to_vec()),
            Op::Insert(MERCHANT_EMAILS, email.into_bytes(), merchant.id.as_bytes().to_vec()),
        ];
        if let Some(old) = previous_key.filter(|old| *old != merchant.secret_key) {
            ops.push(Op::Remove(MERCHANT_KEYS, key_hash(&old)));
        }
        self.writer.submit(ops, None, Vec::new())
    }

    fn save_notification(&self, before: &Notification, after: &Notification) -> Result<Ticket, StoreError> {
        let mut ops = vec![Op::Insert(OUTBOX, after.id.as_bytes().to_vec(), encode_state(after)?)];
        if let Some(at) = before.next_attempt_at {
            ops.push(Op::Remove(OUTBOX_DUE, due_key(at, &before.id)));
        }
        if let Some(at) = after.next_attempt_at {
            ops.push(Op::Insert(OUTBOX_DUE, due_key(at, &after.id), Vec::new()));
        }
        self.writer.submit(ops, None, Vec::new())
    }

    fn notifications(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Notification) -> bool,
    ) -> Result<Page<Notification>, StoreError> {
        let start = mkey(merchant, b"");
        let end = match cursor {
            Some(c) => mkey(merchant, c.as_bytes()),
            None => mkey(merchant, &[0xff]),
        };
        let mut data = Vec::new();
        let mut has_more = false;
        let mut last = None;
        for (scanned, item) in self.trees[OUTBOX_BY_MERCHANT].range(start..end).rev().enumerate() {
            let (key, _) = item.map_err(io("outbox_by_merchant"))?;
            if data.len() == limit || scanned == MAX_SCAN {
                has_more = true;
                break;
            }
            let id = &key[MERCHANT_ID_LEN..];
            last = Some(String::from_utf8_lossy(id).into_owned());
            if let Some(n) = self.load_notification(id)? {
                if keep(&n) {
                    data.push(n);
                }
            }
        }
        Ok(Page { data, has_more, next_cursor: if has_more { last } else { None } })
    }

    fn outbox_feed(&self) -> Option<tokio::sync::mpsc::Receiver<Notification>> {
        self.feed.lock().ok().and_then(|mut feed| feed.take())
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
        let Some(id) = self.trees[MERCHANT_KEYS].get(key_hash(secret_key)).map_err(io("merchant_keys"))? else {
            return Ok(None);
        };
        self.get(MERCHANTS, &id)
    }

    fn merchant_by_email(&self, email: &str) -> Result<Option<Merchant>, StoreError> {
        let key = email.to_lowercase();
        let Some(id) = self.trees[MERCHANT_EMAILS].get(key.as_bytes()).map_err(io("merchant_emails"))? else {
            return Ok(None);
        };
        self.get(MERCHANTS, &id)
    }

    fn merchant_count(&self) -> Result<u64, StoreError> {
        Ok(self.trees[MERCHANTS].len() as u64)
    }

    fn recover_merchant(&self, id: &MerchantId) -> Result<Recovered, StoreError> {
        let snapshot: Snapshot = self.get(SNAPSHOTS, id.as_bytes())?.unwrap_or_default();
        let start = Recovered { seq: snapshot.seq, balances: snapshot.balances };
        Self::replay(id, start, self.journal_after(id, snapshot.seq))
    }

    fn payment(&self, merchant: &MerchantId, reference: &str) -> Result<Option<Payment>, StoreError> {
        self.get(PAYMENTS, &mkey(merchant, reference.as_bytes()))
    }

    fn payout(&self, merchant: &MerchantId, id: &str) -> Result<Option<Payout>, StoreError> {
        self.get(PAYOUTS, &mkey(merchant, id.as_bytes()))
    }

    fn locate(&self, merchant: &MerchantId, reference: &str) -> Result<Option<Located>, StoreError> {
        let Some(ptr) = self.trees[REFS].get(mkey(merchant, reference.as_bytes())).map_err(io("refs"))? else {
            return Ok(None);
        };
        let (kind, owner, reference) = parse_pointer(&ptr)?;
        let record = self
            .record(merchant, kind, owner)?
            .ok_or_else(|| StoreError::Corrupt(format!("merchant {merchant}: {reference} points to nothing")))?;
        Ok(Some(Located { kind, reference: reference.to_owned(), record }))
    }

    fn owner_of_transaction(&self, transaction_id: &str) -> Result<Option<(MerchantId, Located)>, StoreError> {
        let Some(value) = self.trees[TX_OWNER].get(transaction_id.as_bytes()).map_err(io("tx_owner"))? else {
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
        self.scan_index(merchant, cursor, limit, None, &mut |kind, record| {
            let tx = match record {
                Record::Payout(o) => Transaction::of_payout(&o),
                Record::Payment(p) if kind == TransactionType::Remboursement => {
                    Transaction::of_refund(&p, p.remboursement.as_ref()?)
                }
                Record::Payment(p) => Transaction::of_payment(&p),
            };
            keep(&tx).then_some(tx)
        })
    }

    fn payouts(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Payout) -> bool,
    ) -> Result<Page<Payout>, StoreError> {
        // A payout `ret_X` is the transaction `tx_X`, so the payout list is the transaction index, filtered
        // while scanning so that a page holds `limit` matching payouts.
        let cursor = cursor.map(|c| c.replacen("ret_", "tx_", 1));
        let page =
            self.scan_index(merchant, cursor.as_deref(), limit, Some(TransactionType::Retrait), &mut |_, record| {
                match record {
                    Record::Payout(o) if keep(&o) => Some(o),
                    _ => None,
                }
            })?;
        Ok(Page { next_cursor: page.next_cursor.map(|c| c.replacen("tx_", "ret_", 1)), ..page })
    }

    fn pending(
        &self,
        kind: TransactionType,
        created_before: Timestamp,
        limit: usize,
    ) -> Result<Vec<Pending>, StoreError> {
        let start = vec![kind.tag()];
        let mut end = vec![kind.tag()];
        end.extend_from_slice(&created_before.unix_ms().to_be_bytes());
        let mut found = Vec::new();
        for item in self.trees[PENDING].range(start..end).take(limit) {
            let (key, _) = item.map_err(io("pending"))?;
            let corrupt = || StoreError::Corrupt("bad pending key".into());
            let created = key.get(1..9).and_then(|b| <[u8; 8]>::try_from(b).ok()).ok_or_else(corrupt)?;
            let id = key.get(9..9 + MERCHANT_ID_LEN).ok_or_else(corrupt)?;
            let owner = key.get(9 + MERCHANT_ID_LEN..).ok_or_else(corrupt)?;
            let merchant = MerchantId::parse(std::str::from_utf8(id).map_err(|_| corrupt())?).map_err(|_| corrupt())?;
            found.push(Pending {
                merchant,
                kind,
                owner: String::from_utf8(owner.to_vec()).map_err(|_| corrupt())?,
                created_at: Timestamp::from_unix_ms(u64::from_be_bytes(created)),
            });
        }
        Ok(found)
    }

    fn journal(&self, merchant: &MerchantId, from_seq: u64, limit: usize) -> Result<Vec<JournalEvent>, StoreError> {
        self.journal_after(merchant, from_seq.saturating_sub(1)).take(limit).collect()
    }

    fn notification(&self, id: &str) -> Result<Option<Notification>, StoreError> {
        self.load_notification(id.as_bytes())
    }

    fn notification_state(&self, id: &str) -> Result<Option<Notification>, StoreError> {
        self.get(OUTBOX, id.as_bytes())
    }

    fn due_notifications_skipping(
        &self,
        now: Timestamp,
        limit: usize,
        skip: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Vec<Notification>, StoreError> {
        let end = (now.unix_ms().saturating_add(1)).to_be_bytes();
        let mut due = Vec::new();
        let mut stale = Vec::new();
        for item in self.trees[OUTBOX_DUE].range(..end.as_slice()) {
            if due.len() >= limit {
                break;
            }
            let (key, _) = item.map_err(io("outbox_due"))?;
            let id = key.get(8..).ok_or_else(|| StoreError::Corrupt("bad outbox_due key".into()))?;
            if skip(std::str::from_utf8(id).unwrap_or_default()) {
                continue;
            }
            let key_ms = key.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_be_bytes);
            match self.get::<Notification>(OUTBOX, id)? {
                // An entry is current only if the notification still waits for exactly that time; any other
                // is left over from a save made on a stale read, and is removed so scans stop reading it.
                Some(n) if n.state == DeliveryState::Pending && n.next_attempt_at.map(|t| t.unix_ms()) == key_ms => {
                    // One unreadable notification must not stop every delivery: it is reported and passed over.
                    match self.with_body(n) {
                        Ok(n) => due.push(n),
                        Err(e) => tracing::error!(error = %e, "a due notification cannot be read; passed over"),
                    }
                }
                _ => stale.push(Op::Remove(OUTBOX_DUE, key.to_vec())),
            }
        }
        if !stale.is_empty() {
            // Best effort: if it fails, the next scan finds the same entries again.
            let _ = self.writer.submit(stale, None, Vec::new());
        }
        Ok(due)
    }

    fn audit(&self) -> Result<AuditReport, StoreError> {
        let started = Instant::now();
        let mut report = AuditReport::default();
        let mut current: Option<(MerchantId, Recovered, Option<Snapshot>)> = None;
        let finish = |m: &MerchantId, state: &Recovered, snap: &Option<Snapshot>| -> Result<(), StoreError> {
            if let Some(s) = snap {
                if s.seq > state.seq {
                    return Err(StoreError::Corrupt(format!(
                        "merchant {m}: snapshot at event {} but the journal ends at {}",
                        s.seq, state.seq
                    )));
                }
            }
            Ok(())
        };
        for item in self.trees[JOURNAL].iter() {
            let (key, value) = item.map_err(io("journal"))?;
            let id_bytes = key.get(..MERCHANT_ID_LEN).ok_or_else(|| StoreError::Corrupt("short journal key".into()))?;
            let same = current.as_ref().is_some_and(|(m, _, _)| m.as_bytes() == id_bytes);
            if !same {
                if let Some((m, state, snap)) = current.take() {
                    finish(&m, &state, &snap)?;
                }
                let text = std::str::from_utf8(id_bytes).map_err(|_| StoreError::Corrupt("journal key".into()))?;
                let m = MerchantId::parse(text).map_err(|e| StoreError::Corrupt(format!("journal key: {e}")))?;
                let snap: Option<Snapshot> = self.get(SNAPSHOTS, m.as_bytes())?;
                report.merchants += 1;
                current = Some((m, Recovered::default(), snap));
            }
            let Some((m, state, snap)) = current.as_mut() else { continue };
            let event: JournalEvent = decode("journal", &value)?;
            *state = Self::replay(m, std::mem::take(state), std::iter::once(Ok(event)))?;
            report.events += 1;
            if let Some(s) = snap.as_ref().filter(|s| s.seq == state.seq) {
                compare_snapshot(m, &s.balances, &state.balances)?;
            }
        }
        if let Some((m, state, snap)) = current.take() {
            finish(&m, &state, &snap)?;
        }
        report.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(report)
    }

    fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }
}

/// A snapshot must equal the balances the ledger gives at the same event; name the first currency that differs.
fn compare_snapshot(merchant: &MerchantId, snapshot: &Balances, ledger: &Balances) -> Result<(), StoreError> {
    let currencies = snapshot.0.keys().chain(ledger.0.keys());
    for devise in currencies {
        let (s, l) = (snapshot.get(*devise), ledger.get(*devise));
        if (s.disponible, s.en_attente) != (l.disponible, l.en_attente) {
            return Err(StoreError::Corrupt(format!(
                "merchant {merchant} {devise}: snapshot says disponible {} en_attente {}, the ledger says \
                 disponible {} en_attente {}",
                s.disponible, s.en_attente, l.disponible, l.en_attente
            )));
        }
    }
    Ok(())
}
