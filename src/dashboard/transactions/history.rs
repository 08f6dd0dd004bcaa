//! A record's history: a binary search over the journal's positions for the record's creation time, then a
//! bounded scan of the events after it (the module documentation of [`super`] says why).

use caisse_engine::core::JournalEvent;
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::time::Timestamp;
use caisse_engine::{Engine, EngineError};

/// Journal events read after a record's creation to find its history.
pub const HISTORY_SCAN: usize = 5_000;
/// Events shown in one record's history.
const HISTORY_MAX: usize = 100;
/// Journal times may trail a record's `created_at` by a little (the record is stamped first).
const CLOCK_SLACK_MS: u64 = 1_000;
const HISTORY_CHUNK: usize = 500;

/// The journal events of `reference`, from its creation on, bounded (see the module documentation); the
/// flag says the scan stopped at its bound before the journal's end.
pub fn history(
    store: &Engine,
    merchant: &MerchantId,
    reference: &str,
    created_at: Timestamp,
) -> Result<(Vec<JournalEvent>, bool), EngineError> {
    let since = Timestamp::from_unix_ms(created_at.unix_ms().saturating_sub(CLOCK_SLACK_MS));
    // At or after `since`, or past the journal's end: true from some position on.
    let later = |seq: u64| -> Result<bool, EngineError> {
        Ok(store.journal(merchant, seq, 1)?.first().is_none_or(|e| e.seq != seq || e.at >= since))
    };
    let mut high = 1u64;
    while !later(high)? {
        high = high.saturating_mul(2);
    }
    let mut low = high / 2 + 1;
    while low < high {
        let mid = low + (high - low) / 2;
        if later(mid)? {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    let mut found = Vec::new();
    let mut scanned = 0;
    let mut next = high.max(1);
    while scanned < HISTORY_SCAN && found.len() < HISTORY_MAX {
        let chunk = store.journal(merchant, next, HISTORY_CHUNK.min(HISTORY_SCAN - scanned))?;
        let Some(last) = chunk.last().map(|e| e.seq) else { return Ok((found, false)) };
        scanned += chunk.len();
        found.extend(chunk.into_iter().filter(|e| e.reference == reference));
        next = last + 1;
    }
    found.truncate(HISTORY_MAX);
    let more = !store.journal(merchant, next, 1)?.is_empty();
    Ok((found, more))
}
