//! Rebuilding balances from the journal: recovering one merchant from its snapshot, and the startup audit that
//! replays every merchant's whole ledger and checks each snapshot against it.

use std::ops::{Bound, Range};
use std::time::Instant;

use serde::Deserialize;

use super::SledStore;
use crate::domain::ids::{MerchantId, MERCHANT_ID_LEN};
use crate::domain::ledger::{check_balanced, Balances, Entry};
use crate::domain::money::Currency;
use crate::domain::time::Timestamp;
use crate::store::{AuditReport, Recovered, Snapshot, StoreError};

// The layout's trees, keys and encodings are this file's vocabulary.
use crate::store::layout::*;

/// What replaying a journal event reads of it: its place, its time and the money it moved. Decoding only this
/// skips the trigger, reference and status unread. The fields are the first four of
/// [`JournalEvent`](crate::core::JournalEvent), in its order, so both read the same bytes ([`decode_prefix`]):
/// the event's field order is part of the storage format, and `a_ledger_line_reads_what_a_journal_event_wrote`
/// fails if the two drift. The audit checks what moves money (sequence, balance, signs); sled's checksums guard
/// the rest.
#[derive(Deserialize)]
pub(super) struct LedgerLine {
    seq: u64,
    at: Timestamp,
    #[serde(rename = "devise")]
    currency: Currency,
    entries: Vec<Entry>,
}

impl SledStore {
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
            state.balances.touch(event.currency, event.at.unix_ms());
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
        let start = Recovered { seq: snapshot.seq, balances: snapshot.balances };
        Self::replay(id, start, self.journal_after(id, snapshot.seq))
    }

    /// [`Audit::audit`](crate::store::Audit::audit): the whole journal replayed merchant by merchant, each
    /// snapshot compared on the way.
    ///
    /// The journal is split in two at a merchant id and each half audited on its own thread: decoding and
    /// replaying every event is most of a start (docs/perf/history.md), nothing else runs yet, and merchants
    /// are independent. Any 30-byte id splits the journal between two merchants, since a merchant's keys are
    /// its id followed by a sequence number.
    pub(super) fn audit_journal(&self) -> Result<AuditReport, StoreError> {
        let started = Instant::now();
        let mut report = match self.audit_split()? {
            None => self.audit_range(Bound::Unbounded, Bound::Unbounded)?,
            Some(split) => {
                let (low, high) = std::thread::scope(|scope| {
                    let high = scope.spawn(|| self.audit_range(Bound::Included(&split), Bound::Unbounded));
                    let low = self.audit_range(Bound::Unbounded, Bound::Excluded(&split));
                    (low, high.join())
                });
                let high = high.unwrap_or_else(|_| Err(StoreError::Io("an audit thread panicked".into())));
                // The lower half's error first, so the merchant named does not depend on timing.
                let (low, high) = (low?, high?);
                AuditReport {
                    merchants: low.merchants + high.merchants,
                    events: low.events + high.events,
                    elapsed_ms: 0,
                }
            }
        };
        report.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(report)
    }

    /// The median merchant id, where the audit splits the journal; `None` with fewer than two merchants.
    fn audit_split(&self) -> Result<Option<Vec<u8>>, StoreError> {
        let mut ids = Vec::new();
        for item in self.scan(MERCHANTS, Bound::Unbounded, Bound::Unbounded, false)? {
            let (key, _) = item?;
            if key.len() == MERCHANT_ID_LEN {
                ids.push(key.to_vec());
            }
        }
        Ok(if ids.len() < 2 { None } else { ids.get(ids.len() / 2).cloned() })
    }

    /// Audits the merchants whose journal keys fall in the range; `elapsed_ms` is left to the caller.
    fn audit_range(&self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<AuditReport, StoreError> {
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
        for item in self.scan(JOURNAL, start, end, false)? {
            let (key, value) = item?;
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
            for (_, span) in unread(&key, &value, state.seq.saturating_add(1))? {
                let (event, _): (LedgerLine, _) = decode_prefix("journal", value.get(span).unwrap_or_default())?;
                *state = Self::replay(m, std::mem::take(state), std::iter::once(Ok(event)))?;
                report.events += 1;
                if let Some(s) = snap.as_ref().filter(|s| s.seq == state.seq) {
                    compare_snapshot(m, &s.balances, &state.balances)?;
                }
            }
        }
        if let Some((m, state, snap)) = current.take() {
            finish(&m, &state, &snap)?;
        }
        Ok(report)
    }
}

/// The events under one journal key numbered `next` or more, with their numbers and where they lie in the
/// value: those before were read from an earlier key (see [`journal_runs`]). Each event's own number is
/// checked as it is replayed.
fn unread(key: &[u8], value: &[u8], next: u64) -> Result<impl Iterator<Item = (u64, Range<usize>)>, StoreError> {
    let (first, spans) = journal_spans(key, value)?;
    Ok((first..).zip(spans).filter(move |(seq, _)| *seq >= next))
}

/// A snapshot must equal the balances the ledger gives at the same event; name the first currency that differs.
fn compare_snapshot(merchant: &MerchantId, snapshot: &Balances, ledger: &Balances) -> Result<(), StoreError> {
    let currencies = snapshot.0.keys().chain(ledger.0.keys());
    for currency in currencies {
        let (s, l) = (snapshot.get(*currency), ledger.get(*currency));
        if (s.available, s.pending) != (l.available, l.pending) {
            return Err(StoreError::Corrupt(format!(
                "merchant {merchant} {currency}: snapshot says disponible {} en_attente {}, the ledger says \
                 disponible {} en_attente {}",
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
    use crate::store::op::Op;
    use crate::store::overlay::{Entry as Stored, TreeMap};
    use crate::store::{Audit, Commits, Records};

    /// Event `seq` of a merchant whose every event credits 100 XOF, as the writer stores it (a run of one).
    fn credit(seq: u64) -> Vec<u8> {
        journal_run([credit_event(seq).as_slice()]).unwrap()
    }

    fn credit_event(seq: u64) -> Vec<u8> {
        encode(&JournalEvent {
            seq,
            at: Timestamp::from_unix_ms(1_795_310_624_123 + seq),
            trigger: Trigger::ProviderConfirmed,
            reference: format!("pay_{seq}"),
            status: "succes".into(),
            currency: Currency::XOF,
            entries: vec![
                Entry { account: Account::CustomerFunds, currency: Currency::XOF, amount_minor: -100 },
                Entry { account: Account::Available, currency: Currency::XOF, amount_minor: 100 },
            ],
        })
        .unwrap()
    }

    /// What a layer holding events `seqs` of merchant `m` puts into sled's journal.
    fn runs(m: &MerchantId, seqs: std::ops::RangeInclusive<u64>) -> Vec<(Vec<u8>, Stored)> {
        let keys: TreeMap = seqs.map(|seq| (journal_key(m, seq), Some(credit(seq)))).collect();
        journal_runs(&keys).unwrap()
    }

    fn put(store: &SledStore, stored: Vec<(Vec<u8>, Stored)>) {
        for (key, value) in stored {
            store.trees[JOURNAL].insert(key, value.unwrap()).unwrap();
        }
    }

    fn seqs(store: &SledStore, m: &MerchantId, from: u64) -> Vec<u64> {
        seqs_taking(store, m, from, usize::MAX)
    }

    /// After a crash the log's replay groups events into runs of its own over the runs sled kept: the one it
    /// overwrites is replaced by one ending at the same event, and others overlap. Every event reads once.
    #[test]
    fn overlapping_runs_read_each_event_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        let m = MerchantId::new();
        // The crashed run: 1..=5 and 6..=9. The replay: 1..=9 (over the second), then 10..=12.
        put(&store, runs(&m, 1..=5));
        put(&store, runs(&m, 6..=9));
        put(&store, runs(&m, 1..=9));
        put(&store, runs(&m, 10..=12));
        // A run whose layer is still in the read path: its events are there too.
        put(&store, runs(&m, 13..=15));
        store.overlay.record((13..=15).map(|seq| (JOURNAL, journal_key(&m, seq), Some(credit(seq))))).unwrap();
        // Keys 5, 9 (the replay's run), 12 and 15.
        assert_eq!(store.trees[JOURNAL].len(), 4);
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
        let store = SledStore::open(dir.path()).unwrap();
        let m = MerchantId::new();
        let damaged = journal_run([[BINARY_V1, 0xff].as_slice()]).unwrap();
        let keys: TreeMap =
            [(1, credit(1)), (2, damaged)].into_iter().map(|(s, v)| (journal_key(&m, s), Some(v))).collect();
        put(&store, journal_runs(&keys).unwrap());
        assert_eq!(store.trees[JOURNAL].len(), 1);
        assert_eq!(seqs_taking(&store, &m, 1, 1), [1]);
        assert!(matches!(store.journal(&m, 1, 2), Err(StoreError::Corrupt(_))));
        assert!(matches!(store.journal(&m, 2, 1), Err(StoreError::Corrupt(_))));
    }

    fn seqs_taking(store: &SledStore, m: &MerchantId, from: u64, limit: usize) -> Vec<u64> {
        store.journal(m, from, limit).unwrap().iter().map(|e| e.seq).collect()
    }

    #[test]
    fn a_missing_event_between_runs_stops_recovery_and_the_audit() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
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

    /// Through the writer: a busy merchant's layer reaches sled as runs, and reopening reads them back.
    #[test]
    fn a_busy_merchants_journal_is_stored_as_runs_and_reads_back_after_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let m = MerchantId::new();
        let events = MAX_RUN as u64 + 44;
        {
            let store = SledStore::open(dir.path()).unwrap();
            for seq in 1..=events {
                let ops = vec![Op::Insert(JOURNAL, journal_key(&m, seq), credit(seq))];
                store.writer.submit(ops, None, Vec::new()).unwrap().blocking_recv().unwrap().unwrap();
            }
        }
        let store = SledStore::open(dir.path()).unwrap();
        assert_eq!(store.overlay.depth(), 1, "reopening applied the log");
        assert!(store.trees[JOURNAL].len() < 10, "{} keys for {events} events", store.trees[JOURNAL].len());
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
        assert!(!rest.is_empty(), "the trigger, reference and status follow the ledger");
        assert_eq!(
            (line.seq, line.at, line.currency, line.entries),
            (event.seq, event.at, event.currency, event.entries)
        );
    }
}
