//! Rebuilding balances from the journal: recovering one merchant from its snapshot, and the audits that replay
//! each merchant's ledger (the whole of it, or since its audit checkpoint) and check the stored balances against
//! it.

use std::collections::BTreeSet;
use std::ops::{Bound, Range};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::KvStore;
use crate::domain::ids::MerchantId;
use crate::domain::ledger::{check_balanced, Balances, Entry};
use crate::domain::money::Currency;
use crate::domain::status::Trigger;
use crate::domain::time::Timestamp;
use crate::store::kv::Kv;
use crate::store::op::Op;
use crate::store::{AuditReport, AuditScope, Recovered, Snapshot, StoreError};

// The layout's trees, keys and encodings are this file's vocabulary.
use crate::store::layout::*;

/// What replaying a journal event reads of it: its place, its time, the money it moved and what made it.
/// Decoding only this skips the reference and status unread. The fields are the first five of
/// [`JournalEvent`](crate::core::JournalEvent), in its order, so both read the same bytes ([`decode_prefix`]):
/// the event's field order is part of the storage format, and `a_ledger_line_reads_what_a_journal_event_wrote`
/// fails if the two drift. The audit checks what moves money (sequence, balance, signs); the engine's checksums
/// guard the rest.
#[derive(Deserialize)]
pub(super) struct LedgerLine {
    seq: u64,
    at: Timestamp,
    #[serde(rename = "devise")]
    currency: Currency,
    entries: Vec<Entry>,
    /// What made the event: a link's own events name a currency without moving or opening any balance.
    trigger: Trigger,
}

impl<K: Kv> KvStore<K> {
    /// Replays `events` (one merchant's, in order, starting after `start`) onto `start`, checking each.
    pub(super) fn replay(
        merchant: &MerchantId,
        start: Recovered,
        events: impl Iterator<Item = Result<LedgerLine, StoreError>>,
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
                StoreError::Corrupt(format!("merchant {merchant} {} event {}: {e}", event.currency, event.seq))
            })?;
            // As the actor did: a balance row opens with a transaction in its currency, never with a link.
            let link = matches!(event.trigger, Trigger::LinkCreated | Trigger::LinkPaid | Trigger::LinkDeactivated);
            if !link {
                state.balances.touch(event.currency, event.at.unix_ms());
            }
            state.balances.apply(&event.entries, event.at.unix_ms()).map_err(|e| {
                StoreError::Corrupt(format!("merchant {merchant} {} at event {}: {e}", event.currency, event.seq))
            })?;
            state.seq = event.seq;
        }
        Ok(state)
    }

    /// The merchant's journal events after `after_seq`, in order, decoded as `T`: a whole
    /// [`JournalEvent`](crate::core::JournalEvent), or the [`LedgerLine`] a replay needs.
    pub(super) fn journal_after<T: serde::de::DeserializeOwned + 'static>(
        &self,
        merchant: &MerchantId,
        after_seq: u64,
    ) -> Box<dyn Iterator<Item = Result<T, StoreError>>> {
        // A key covers the events up to its number, so the run holding `after_seq + 1` is in the range.
        let mut next = after_seq.saturating_add(1);
        let start = journal_key(merchant, next);
        let end = journal_key(merchant, u64::MAX);
        match self.scan(JOURNAL, Bound::Included(&start), Bound::Included(&end), false) {
            Ok(items) => Box::new(items.flat_map(move |item| -> Box<dyn Iterator<Item = Result<T, StoreError>>> {
                let wanted = item.and_then(|(key, value)| {
                    let wanted: Vec<_> = unread(&key, &value, next)?.collect();
                    if let Some((last, _)) = wanted.last() {
                        next = last.saturating_add(1);
                    }
                    Ok((value, wanted))
                });
                match wanted {
                    // Decoded as they are taken: a caller that wants one event decodes one, not its whole run.
                    Ok((value, wanted)) => Box::new(wanted.into_iter().map(move |(_, span)| {
                        Ok(decode_prefix::<T>("journal", value.get(span).unwrap_or_default())?.0)
                    })),
                    Err(e) => Box::new(std::iter::once(Err(e))),
                }
            })),
            Err(e) => Box::new(std::iter::once(Err(e))),
        }
    }

    /// [`Commits::recover_merchant`](crate::store::Commits::recover_merchant): the latest snapshot, then the journal
    /// after it.
    pub(super) fn recover_from_snapshot(&self, id: &MerchantId) -> Result<Recovered, StoreError> {
        let snapshot: Snapshot = self.get(SNAPSHOTS, id.as_bytes())?.unwrap_or_default();
        let start = Recovered { seq: snapshot.seq, balances: snapshot.balances, fence: None };
        Self::replay(id, start, self.journal_after(id, snapshot.seq))
    }

    /// [`Audit::audit_until`](crate::store::Audit::audit_until): every merchant's journal replayed, from its
    /// first event or from its audit checkpoint, then the checkpoints moved to the last event replayed once
    /// every merchant passed.
    ///
    /// The merchants are split in two halves, each audited on its own thread: decoding and replaying events is
    /// most of an audit (docs/perf/history.md) and merchants are independent.
    pub(super) fn audit_journal(&self, scope: AuditScope, stop: &AtomicBool) -> Result<AuditReport, StoreError> {
        let started = Instant::now();
        // Read before the journal's merchants: a snapshot or a checkpoint is only ever written for a merchant
        // whose journal is already visible, so one found here without a journal next lost it.
        let with_state = self.merchants_with_state()?;
        let merchants = self.journal_merchants()?;
        let known: BTreeSet<&[u8]> = merchants.iter().map(|m| m.as_bytes()).collect();
        if let Some((key, what)) = with_state.iter().find(|(key, _)| !known.contains(key.as_slice())) {
            return Err(StoreError::Corrupt(format!(
                "merchant {} has {what} but no journal",
                String::from_utf8_lossy(key)
            )));
        }
        let (low, high) = merchants.split_at(merchants.len() / 2);
        let (low, high) = std::thread::scope(|threads| {
            let high = threads.spawn(|| self.audit_merchants(high, scope, stop));
            let low = self.audit_merchants(low, scope, stop);
            (low, high.join())
        });
        let high = high.unwrap_or_else(|_| Err(StoreError::Io("an audit thread panicked".into())));
        // The lower half's error first, so the merchant named does not depend on timing.
        let (mut low, high) = (low?, high?);
        low.0.merchants += high.0.merchants;
        low.0.events += high.0.events;
        low.0.from_checkpoint += high.0.from_checkpoint;
        low.1.extend(high.1);
        let (mut report, checkpoints) = low;
        // The ledger passed; a checkpoint not written only means the next audit starts further back.
        if let Err(e) = self.write_checkpoints(checkpoints) {
            report.checkpoint_error = Some(e.to_string());
        }
        report.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(report)
    }

    /// Every merchant with a journal, in id order.
    fn journal_merchants(&self) -> Result<Vec<MerchantId>, StoreError> {
        self.kv.merchants(JOURNAL)
    }

    /// The merchants that have a snapshot or an audit checkpoint, each with what it has.
    fn merchants_with_state(&self) -> Result<Vec<(Vec<u8>, &'static str)>, StoreError> {
        let mut found = Vec::new();
        for (tree, what) in [(SNAPSHOTS, "a snapshot"), (AUDITED, "an audit checkpoint")] {
            for item in self.scan(tree, Bound::Unbounded, Bound::Unbounded, false)? {
                let (key, _) = item?;
                found.push((key.to_vec(), what));
            }
        }
        Ok(found)
    }

    /// Audits these merchants one after the other; `elapsed_ms` is left to the caller. Answers the report and
    /// the checkpoints to write.
    fn audit_merchants(
        &self,
        merchants: &[MerchantId],
        scope: AuditScope,
        stop: &AtomicBool,
    ) -> Result<(AuditReport, Vec<(MerchantId, AuditCheckpoint)>), StoreError> {
        let mut report = AuditReport::default();
        let mut checkpoints = Vec::new();
        for merchant in merchants {
            if stop.load(Ordering::Acquire) {
                return Err(StoreError::Closed);
            }
            let audited = self.audit_merchant(merchant, scope)?;
            report.merchants += 1;
            report.events += audited.events;
            report.from_checkpoint += u64::from(audited.from_checkpoint);
            if let Some(checkpoint) = audited.checkpoint {
                checkpoints.push((merchant.clone(), checkpoint));
            }
        }
        Ok((report, checkpoints))
    }

    /// One merchant's audit: its ledger replayed (each event in sequence and balanced, no balance below zero),
    /// the snapshot and the audit checkpoint compared at their events, and the balances recovery starts the
    /// merchant with compared with the ledger's at the end.
    fn audit_merchant(&self, merchant: &MerchantId, scope: AuditScope) -> Result<MerchantAudit, StoreError> {
        // Read before the journal: a snapshot is written with its event, so the journal read next reaches it.
        let snapshot: Option<Snapshot> = self.get(SNAPSHOTS, merchant.as_bytes())?;
        let checkpoint: Option<AuditCheckpoint> = self.get(AUDITED, merchant.as_bytes())?;
        let start = match (scope, &checkpoint) {
            (AuditScope::SinceCheckpoints, Some(c)) => {
                Recovered { seq: c.seq, balances: c.balances.clone(), fence: None }
            }
            _ => Recovered::default(),
        };
        let start_seq = start.seq;
        // From a checkpoint, the journal must still reach it: read from its event, which is checked to be
        // there and not replayed again.
        let mut lines = self.journal_after::<LedgerLine>(merchant, start_seq.saturating_sub(1));
        if start_seq > 0 {
            match lines.next() {
                Some(Ok(line)) if line.seq == start_seq => {}
                Some(Err(e)) => return Err(e),
                _ => {
                    return Err(StoreError::Corrupt(format!(
                        "merchant {merchant}: the journal does not reach its audit checkpoint at event {start_seq}"
                    )))
                }
            }
        }
        let mut state = start;
        let mut events = 0;
        let held = [
            ("snapshot", snapshot.as_ref().map(|s| (s.seq, &s.balances))),
            ("audit checkpoint", checkpoint.as_ref().map(|c| (c.seq, &c.balances))),
        ];
        for line in lines {
            state = Self::replay(merchant, std::mem::take(&mut state), std::iter::once(line))?;
            events += 1;
            for (what, held) in held {
                if let Some((_, balances)) = held.filter(|(seq, _)| *seq == state.seq) {
                    compare_balances(merchant, what, state.seq, balances, &state.balances)?;
                }
            }
        }
        for (what, held) in held {
            if let Some((seq, _)) = held.filter(|(seq, _)| *seq > state.seq) {
                return Err(StoreError::Corrupt(format!(
                    "merchant {merchant}: {what} at event {seq} but the journal ends at {}",
                    state.seq
                )));
            }
        }
        // Recovery starts from the snapshot. One taken at or before this replay's start was not met on the way:
        // unless it is the very snapshot the checkpoint's audit verified, what recovery would make of it is
        // compared with the ledger here (at most a snapshot interval of events, or the whole journal of a
        // merchant too small to have a snapshot).
        let unmet = match &snapshot {
            Some(s) => s.seq <= start_seq,
            None => start_seq > 0,
        };
        let verified = checkpoint.as_ref().is_some_and(|c| c.snapshot == snapshot);
        if unmet && !verified {
            let from = snapshot
                .clone()
                .map(|s| Recovered { seq: s.seq, balances: s.balances, fence: None })
                .unwrap_or_default();
            let end = state.seq;
            let lines = self
                .journal_after::<LedgerLine>(merchant, from.seq)
                .take_while(|line| !matches!(line, Ok(line) if line.seq > end));
            let recovered = Self::replay(merchant, from, lines)?;
            compare_balances(merchant, "recovery from the snapshot", end, &recovered.balances, &state.balances)?;
        }
        let moved = checkpoint.as_ref().is_none_or(|c| c.seq < state.seq || c.snapshot != snapshot);
        Ok(MerchantAudit {
            events,
            from_checkpoint: start_seq > 0,
            checkpoint: moved.then_some(AuditCheckpoint { seq: state.seq, balances: state.balances, snapshot }),
        })
    }

    /// Writes the checkpoints an audit that passed found, through the writer like every other change, a
    /// bounded number per write. A checkpoint lost in a crash only means the next audit starts further back.
    fn write_checkpoints(&self, checkpoints: Vec<(MerchantId, AuditCheckpoint)>) -> Result<(), StoreError> {
        const PER_WRITE: usize = 1_000;
        let mut checkpoints = checkpoints.into_iter().peekable();
        while checkpoints.peek().is_some() {
            let ops = checkpoints
                .by_ref()
                .take(PER_WRITE)
                .map(|(merchant, checkpoint)| {
                    Ok(Op::Insert(AUDITED, merchant.as_bytes().to_vec(), encode(&checkpoint)?))
                })
                .collect::<Result<Vec<_>, StoreError>>()?;
            self.submit_and_wait(ops)?;
        }
        Ok(())
    }

    /// Submits operations to the writer and waits for their durability, off any async runtime or on one
    /// (the audit at start runs inside the server's), waiting out a full queue, within a bound longer than a
    /// backup may hold the writer.
    fn submit_and_wait(&self, ops: Vec<Op>) -> Result<(), StoreError> {
        let deadline = Instant::now() + std::time::Duration::from_secs(15 * 60);
        let ticket = loop {
            match self.submit(ops.clone(), None, Vec::new()) {
                Ok(ticket) => break ticket,
                Err(StoreError::Overloaded) if Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                Err(e) => return Err(e),
            }
        };
        crate::store::wait_polling(ticket, Some(deadline))
    }
}

/// What one merchant's audit found.
struct MerchantAudit {
    events: u64,
    from_checkpoint: bool,
    /// The checkpoint to write, when it differs from the stored one.
    checkpoint: Option<AuditCheckpoint>,
}

/// What `audited` holds for a merchant: the balances the ledger gave at event `seq` in an audit that passed,
/// and the snapshot that audit verified (recovery from it gives the same balances at `seq`), so that a later
/// audit replays neither the ledger before `seq` nor, while the snapshot is unchanged, the events after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct AuditCheckpoint {
    seq: u64,
    balances: Balances,
    snapshot: Option<Snapshot>,
}

/// The events under one journal key numbered `next` or more, with their numbers and where they lie in the
/// value: those before were read from an earlier key (see [`journal_runs`]). Each event's own number is
/// checked as it is replayed.
fn unread(key: &[u8], value: &[u8], next: u64) -> Result<impl Iterator<Item = (u64, Range<usize>)>, StoreError> {
    let (first, spans) = journal_spans(key, value)?;
    Ok((first..).zip(spans).filter(move |(seq, _)| *seq >= next))
}

/// Stored balances (`what`: a snapshot, a checkpoint) must equal the ledger's at event `seq`; name the first
/// currency that differs.
fn compare_balances(
    merchant: &MerchantId,
    what: &str,
    seq: u64,
    stored: &Balances,
    ledger: &Balances,
) -> Result<(), StoreError> {
    let currencies = stored.0.keys().chain(ledger.0.keys());
    for currency in currencies {
        let (s, l) = (stored.get(*currency), ledger.get(*currency));
        if (s.available, s.pending) != (l.available, l.pending) {
            return Err(StoreError::Corrupt(format!(
                "merchant {merchant} {currency}: {what} says disponible {} en_attente {} at event {seq}, the ledger \
                 says disponible {} en_attente {}",
                s.available, s.pending, l.available, l.pending
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::JournalEvent;
    use crate::domain::ledger::Account;
    use crate::domain::status::Trigger;
    use crate::store::kv::Kv;
    use crate::store::layout::tests::{credit_event, holding};
    use crate::store::op::{Entry as Stored, TreeMap};
    use crate::store::{wait_polling, Audit, Commits, FjallStore, Records};

    /// Event `seq` of a merchant whose every event credits 100 XOF, as the writer stores it (a run of one).
    fn credit(seq: u64) -> Vec<u8> {
        journal_run([credit_event(seq, 100).as_slice()]).unwrap()
    }

    /// What a batch holding events `seqs` of merchant `m` puts into the journal.
    fn runs(m: &MerchantId, seqs: std::ops::RangeInclusive<u64>) -> Vec<(Vec<u8>, Stored)> {
        let keys: TreeMap = seqs.map(|seq| (journal_key(m, seq), Some(credit(seq)))).collect();
        journal_runs(&keys).unwrap()
    }

    /// Writes journal keys in one batch: a run of several events passes through the writer as it is (the
    /// writer joins only lone events).
    fn put(store: &FjallStore, stored: Vec<(Vec<u8>, Stored)>) {
        let ops = stored.into_iter().map(|(key, value)| Op::Insert(JOURNAL, key, value.unwrap())).collect();
        wait_polling(store.kv.submit(ops, None, Vec::new(), None).unwrap(), None).unwrap();
    }

    /// One operation, committed alone: a journal event in it stays a run of one.
    fn write(store: &FjallStore, op: Op) {
        wait_polling(store.kv.submit(vec![op], None, Vec::new(), None).unwrap(), None).unwrap();
    }

    fn journal_keys(store: &FjallStore) -> u64 {
        store.kv.count(JOURNAL).unwrap()
    }

    fn seqs(store: &FjallStore, m: &MerchantId, from: u64) -> Vec<u64> {
        seqs_taking(store, m, from, usize::MAX)
    }

    /// The upgrade from sled replays that engine's old log, grouped into runs of its own, over the runs sled
    /// kept: the one it overwrites is replaced by one ending at the same event, and others overlap. Every event
    /// reads once.
    #[test]
    fn overlapping_runs_read_each_event_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStore::open(dir.path()).unwrap();
        let m = MerchantId::new();
        // The crashed run: 1..=5 and 6..=9. The replay: 1..=9 (over the second), then 10..=12.
        put(&store, runs(&m, 1..=5));
        put(&store, runs(&m, 6..=9));
        put(&store, runs(&m, 1..=9));
        put(&store, runs(&m, 10..=12));
        put(&store, runs(&m, 13..=15));
        // Keys 5, 9 (the replay's run), 12 and 15.
        assert_eq!(journal_keys(&store), 4);
        assert_eq!(seqs(&store, &m, 1), (1..=15).collect::<Vec<_>>());
        assert_eq!(seqs(&store, &m, 7), (7..=15).collect::<Vec<_>>());
        assert_eq!(seqs(&store, &m, 14), [14, 15]);
        assert!(seqs(&store, &m, 16).is_empty());
        let recovered = store.recover_merchant(&m).unwrap();
        assert_eq!((recovered.seq, recovered.balances.get(Currency::XOF).available), (15, 1_500));
        let report = store.audit().unwrap();
        assert_eq!((report.merchants, report.events), (1, 15));
    }

    /// The dashboard's history probes the journal an event at a time: taking one event of a run decodes that
    /// one, so a damaged event further in the run is only met by a reader that gets to it.
    #[test]
    fn a_run_is_decoded_an_event_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStore::open(dir.path()).unwrap();
        let m = MerchantId::new();
        let damaged = journal_run([[BINARY_V1, 0xff].as_slice()]).unwrap();
        let keys: TreeMap =
            [(1, credit(1)), (2, damaged)].into_iter().map(|(s, v)| (journal_key(&m, s), Some(v))).collect();
        put(&store, journal_runs(&keys).unwrap());
        assert_eq!(journal_keys(&store), 1);
        assert_eq!(seqs_taking(&store, &m, 1, 1), [1]);
        assert!(matches!(store.journal(&m, 1, 2), Err(StoreError::Corrupt(_))));
        assert!(matches!(store.journal(&m, 2, 1), Err(StoreError::Corrupt(_))));
    }

    fn seqs_taking(store: &FjallStore, m: &MerchantId, from: u64, limit: usize) -> Vec<u64> {
        store.journal(m, from, limit).unwrap().iter().map(|e| e.seq).collect()
    }

    #[test]
    fn a_missing_event_between_runs_stops_recovery_and_the_audit() {
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStore::open(dir.path()).unwrap();
        let m = MerchantId::new();
        put(&store, runs(&m, 1..=3));
        put(&store, runs(&m, 5..=6));
        let says = |result: Result<_, StoreError>| match result {
            Err(StoreError::Corrupt(message)) => message,
            Ok(_) => panic!("a gap went unnoticed"),
            Err(other) => panic!("{other:?}"),
        };
        assert!(says(store.recover_merchant(&m).map(drop)).ends_with("journal jumps from 3 to 5"));
        assert!(says(store.audit().map(drop)).ends_with("journal jumps from 3 to 5"));
    }

    /// Through the writer: a busy merchant's events in one group commit are stored as runs, and reopening
    /// reads them back.
    #[test]
    fn a_busy_merchants_journal_is_stored_as_runs_and_reads_back_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let m = MerchantId::new();
        let events = MAX_RUN as u64 + 44;
        {
            let store = FjallStore::open(dir.path()).unwrap();
            let ops = (1..=events).map(|seq| Op::Insert(JOURNAL, journal_key(&m, seq), credit(seq))).collect();
            wait_polling(store.kv.submit(ops, None, Vec::new(), None).unwrap(), None).unwrap();
        }
        let store = FjallStore::open(dir.path()).unwrap();
        assert_eq!(journal_keys(&store), 2, "a run of {MAX_RUN} events and one of 44");
        assert_eq!(seqs(&store, &m, 1), (1..=events).collect::<Vec<_>>());
        assert_eq!(store.recover_merchant(&m).unwrap().seq, events);
        assert_eq!(store.audit().unwrap().events, events);
    }

    #[test]
    fn a_ledger_line_reads_what_a_journal_event_wrote() {
        let event = JournalEvent {
            seq: 7,
            at: Timestamp::from_unix_ms(1_795_310_624_123),
            trigger: Trigger::ProviderConfirmed,
            reference: "pay_1".into(),
            status: "succes".into(),
            currency: Currency::XOF,
            entries: vec![
                Entry { account: Account::CustomerFunds, currency: Currency::XOF, amount_minor: -100 },
                Entry { account: Account::Available, currency: Currency::XOF, amount_minor: 100 },
            ],
        };
        let bytes = encode(&event).unwrap();
        let (line, rest): (LedgerLine, _) = decode_prefix("journal", &bytes).unwrap();
        assert!(!rest.is_empty(), "the reference and status follow the trigger");
        assert_eq!(
            (line.seq, line.at, line.currency, line.entries, line.trigger),
            (event.seq, event.at, event.currency, event.entries, event.trigger)
        );
    }

    /// Events `seqs` of merchant `m`, each stored alone (a run of one).
    fn credits(store: &FjallStore, m: &MerchantId, seqs: std::ops::RangeInclusive<u64>) {
        for seq in seqs {
            write(store, Op::Insert(JOURNAL, journal_key(m, seq), credit(seq)));
        }
    }

    fn put_snapshot(store: &FjallStore, m: &MerchantId, tree: usize, snapshot: &Snapshot) {
        write(store, Op::Insert(tree, m.as_bytes().to_vec(), encode(snapshot).unwrap()));
    }

    /// Replaces event `seq` (stored alone, as a run of one) by one crediting `amount`.
    fn tamper(store: &FjallStore, m: &MerchantId, seq: u64, amount: i64) {
        let value = journal_run([credit_event(seq, amount).as_slice()]).unwrap();
        write(store, Op::Insert(JOURNAL, journal_key(m, seq), value));
    }

    fn put_checkpoint(store: &FjallStore, m: &MerchantId, seq: u64, available: i64) {
        let Snapshot { seq, balances } = holding(seq, available);
        let checkpoint = AuditCheckpoint { seq, balances, snapshot: None };
        write(store, Op::Insert(AUDITED, m.as_bytes().to_vec(), encode(&checkpoint).unwrap()));
    }

    fn checkpoint(store: &FjallStore, m: &MerchantId) -> Option<(u64, i64)> {
        let held: Option<AuditCheckpoint> = store.get(AUDITED, m.as_bytes()).unwrap();
        held.map(|c| (c.seq, c.balances.get(Currency::XOF).available))
    }

    fn corrupt(result: Result<AuditReport, StoreError>) -> String {
        match result {
            Err(StoreError::Corrupt(message)) => message,
            other => panic!("the audit passed over a disagreement: {other:?}"),
        }
    }

    #[test]
    fn the_audit_at_start_replays_only_what_follows_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStore::open(dir.path()).unwrap();
        let (m, other) = (MerchantId::new(), MerchantId::new());
        put(&store, runs(&m, 1..=10));
        put(&store, runs(&other, 1..=3));
        let first = store.audit_since_checkpoints().unwrap();
        assert_eq!((first.merchants, first.events, first.from_checkpoint), (2, 13, 0));
        assert_eq!(checkpoint(&store, &m), Some((10, 1_000)));
        assert_eq!(checkpoint(&store, &other), Some((3, 300)));

        put(&store, runs(&m, 11..=15));
        let second = store.audit_since_checkpoints().unwrap();
        assert_eq!((second.merchants, second.events, second.from_checkpoint), (2, 5, 2));
        assert_eq!(checkpoint(&store, &m), Some((15, 1_500)));
        let nothing_new = store.audit_since_checkpoints().unwrap();
        assert_eq!(nothing_new.events, 0);
        // The full audit replays everything, checkpoints included, and they survive a reopening.
        assert_eq!(store.audit().unwrap().events, 18);
        drop(store);
        let store = FjallStore::open(dir.path()).unwrap();
        assert_eq!(checkpoint(&store, &m), Some((15, 1_500)));
        assert_eq!(store.audit_since_checkpoints().unwrap().events, 0);
    }

    /// After the checkpoint, a changed event or a changed snapshot stops the start as a full audit would.
    #[test]
    fn tampering_after_the_checkpoint_stops_the_audit_at_start() {
        for target in ["ledger", "snapshot"] {
            let dir = tempfile::tempdir().unwrap();
            let store = FjallStore::open(dir.path()).unwrap();
            let m = MerchantId::new();
            credits(&store, &m, 1..=20);
            put_snapshot(&store, &m, SNAPSHOTS, &holding(10, 1_000));
            store.audit_since_checkpoints().unwrap();
            assert_eq!(checkpoint(&store, &m), Some((20, 2_000)));
            credits(&store, &m, 21..=30);
            put_snapshot(&store, &m, SNAPSHOTS, &holding(30, 3_000));
            match target {
                "ledger" => tamper(&store, &m, 25, 150),
                _ => put_snapshot(&store, &m, SNAPSHOTS, &holding(30, 3_050)),
            }
            let message = corrupt(store.audit_since_checkpoints());
            assert!(message.contains("snapshot says disponible"), "{target}: {message}");
            assert!(message.contains("at event 30"), "{target}: {message}");
            assert_eq!(checkpoint(&store, &m), Some((20, 2_000)), "a failed audit moves no checkpoint");
        }
    }

    /// Before the checkpoint, a changed event is past what the start replays and the full audit finds it; a
    /// snapshot changed since the checkpoint is checked at start however old it is.
    #[test]
    fn tampering_before_the_checkpoint_is_found_by_the_full_audit() {
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStore::open(dir.path()).unwrap();
        let m = MerchantId::new();
        credits(&store, &m, 1..=10);
        put_snapshot(&store, &m, SNAPSHOTS, &holding(4, 400));
        store.audit().unwrap();
        assert_eq!(checkpoint(&store, &m), Some((10, 1_000)));

        // Event 7, between the snapshot and the checkpoint.
        tamper(&store, &m, 7, 130);
        assert_eq!(store.audit_since_checkpoints().unwrap().events, 0);
        let message = corrupt(store.audit());
        assert!(message.contains("audit checkpoint says disponible 1000 en_attente 0 at event 10"), "{message}");
        assert!(message.contains("the ledger says disponible 1030"), "{message}");
        // Event 2, before both.
        tamper(&store, &m, 7, 100);
        tamper(&store, &m, 2, 130);
        assert_eq!(store.audit_since_checkpoints().unwrap().events, 0);
        let message = corrupt(store.audit());
        assert!(message.contains("snapshot says disponible 400 en_attente 0 at event 4"), "{message}");
        // The snapshot changed to agree with the changed ledger: recovery would start the merchant above its
        // checkpoint, and the start refuses.
        put_snapshot(&store, &m, SNAPSHOTS, &holding(4, 430));
        let message = corrupt(store.audit_since_checkpoints());
        assert!(message.contains("recovery from the snapshot says disponible 1030"), "{message}");
        assert_eq!(checkpoint(&store, &m), Some((10, 1_000)), "a failed audit moves no checkpoint");
    }

    #[test]
    fn a_checkpoint_past_the_journal_or_without_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStore::open(dir.path()).unwrap();
        let (m, gone) = (MerchantId::new(), MerchantId::new());
        put(&store, runs(&m, 1..=3));
        put_checkpoint(&store, &m, 5, 500);
        let message = corrupt(store.audit());
        assert!(message.ends_with("audit checkpoint at event 5 but the journal ends at 3"), "{message}");
        let message = corrupt(store.audit_since_checkpoints());
        assert!(message.ends_with("the journal does not reach its audit checkpoint at event 5"), "{message}");
        put_checkpoint(&store, &m, 3, 300);
        store.audit().unwrap();
        put_checkpoint(&store, &gone, 3, 300);
        for audit in [FjallStore::audit, FjallStore::audit_since_checkpoints] {
            let message = corrupt(audit(&store));
            assert!(message.ends_with("has an audit checkpoint but no journal"), "{message}");
        }
    }

    /// Events lost from the end of a journal that a checkpoint covered: the snapshot is older and unchanged, so
    /// only the checkpoint knows the journal went further; the start refuses.
    #[test]
    fn a_journal_cut_short_below_its_checkpoint_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStore::open(dir.path()).unwrap();
        let m = MerchantId::new();
        credits(&store, &m, 1..=10);
        put_snapshot(&store, &m, SNAPSHOTS, &holding(4, 400));
        store.audit_since_checkpoints().unwrap();
        for seq in 7..=10 {
            write(&store, Op::Remove(JOURNAL, journal_key(&m, seq)));
        }
        let message = corrupt(store.audit_since_checkpoints());
        assert!(message.ends_with("the journal does not reach its audit checkpoint at event 10"), "{message}");
    }

    /// An audit asked to stop gives up between merchants, changing no checkpoint.
    #[test]
    fn an_audit_told_to_stop_gives_up_and_moves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStore::open(dir.path()).unwrap();
        let m = MerchantId::new();
        put(&store, runs(&m, 1..=3));
        let stop = AtomicBool::new(true);
        assert_eq!(store.audit_until(AuditScope::Full, &stop), Err(StoreError::Closed));
        assert_eq!(checkpoint(&store, &m), None);
    }
}
