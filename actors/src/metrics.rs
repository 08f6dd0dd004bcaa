//! The engine's counters for the operator's metrics (docs/operations.md § Monitoring): commit latency,
//! payments by status reached, webhook attempts by result, the webhook queue, live merchant actors, ledger
//! audits.
//!
//! They are process-wide atomics, written on the paths they measure and read by the server's `GET /metrics`,
//! which renders them; the engine itself never reads them. Counters only grow, as Prometheus expects.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use dashmap::DashMap;

use crate::store::AuditScope;

/// Upper bounds, in seconds, of the latency histograms' buckets (the last bucket, `+Inf`, is implicit).
pub const LATENCY_BUCKETS_S: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// A latency histogram with fixed buckets, updated without locks.
#[derive(Default)]
pub struct Histogram {
    /// Observations at or below each bound of [`LATENCY_BUCKETS_S`] (not cumulative; the renderer sums).
    buckets: [AtomicU64; LATENCY_BUCKETS_S.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

/// A histogram's state at one moment: cumulative bucket counts, count and sum in seconds.
pub struct HistogramSnapshot {
    pub cumulative: Vec<(f64, u64)>,
    pub count: u64,
    pub sum_s: f64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS_S.iter().position(|bound| seconds <= *bound) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(elapsed.as_micros().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut running = 0;
        let cumulative = LATENCY_BUCKETS_S
            .iter()
            .zip(&self.buckets)
            .map(|(bound, n)| {
                running += n.load(Ordering::Relaxed);
                (*bound, running)
            })
            .collect();
        HistogramSnapshot {
            cumulative,
            count: self.count.load(Ordering::Relaxed),
            sum_s: self.sum_us.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

/// How one webhook attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeliveryResult {
    /// The receiver answered 200.
    Delivered,
    /// Any other answer, or none; another attempt follows if the schedule has one.
    Failed,
    /// The last scheduled attempt failed: the notification waits for a resend by hand.
    GivenUp,
}

impl DeliveryResult {
    pub const ALL: [DeliveryResult; 3] = [DeliveryResult::Delivered, DeliveryResult::Failed, DeliveryResult::GivenUp];

    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryResult::Delivered => "delivered",
            DeliveryResult::Failed => "failed",
            DeliveryResult::GivenUp => "given_up",
        }
    }
}

/// What became of a group commit whose answer was lost (the PostgreSQL store asks the database before it
/// answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostCommit {
    /// It had committed: its changes were acknowledged.
    Acknowledged,
    /// It had not committed (or the node ended it and answers as failed all the same): its changes failed.
    Failed,
    /// The database could not say in time: its changes failed, and may have been committed.
    Unknown,
}

impl LostCommit {
    pub const ALL: [LostCommit; 3] = [LostCommit::Acknowledged, LostCommit::Failed, LostCommit::Unknown];

    pub fn as_str(self) -> &'static str {
        match self {
            LostCommit::Acknowledged => "acknowledged",
            LostCommit::Failed => "failed",
            LostCommit::Unknown => "unknown",
        }
    }
}

/// How an audit ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditResult {
    /// Every balance agrees with the ledger.
    Passed,
    /// A balance, a snapshot or a checkpoint disagrees with the ledger, or the journal is broken.
    Failed,
    /// It could not run to the end (reading the store failed).
    Error,
}

impl AuditResult {
    pub const ALL: [AuditResult; 3] = [AuditResult::Passed, AuditResult::Failed, AuditResult::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            AuditResult::Passed => "passed",
            AuditResult::Failed => "failed",
            AuditResult::Error => "error",
        }
    }
}

/// What the engine's audits found, for the operator: runs by kind and result, when each kind last passed,
/// and whether the last audit of a kind found a disagreement.
#[derive(Default)]
pub struct AuditMetrics {
    /// By kind, then by result.
    runs: [[AtomicU64; 3]; 2],
    /// Unix seconds of the last pass of each kind; 0 before the first.
    passed_at: [AtomicU64; 2],
    /// The events the last passing audit of each kind replayed.
    events: [AtomicU64; 2],
    /// 1 after an audit found a disagreement, until one of the same kind passes.
    failing: [AtomicU64; 2],
}

impl AuditMetrics {
    pub fn passed(&self, kind: AuditScope, events: u64, at_unix_s: u64) {
        self.runs[kind as usize][AuditResult::Passed as usize].fetch_add(1, Ordering::Relaxed);
        self.passed_at[kind as usize].store(at_unix_s, Ordering::Relaxed);
        self.events[kind as usize].store(events, Ordering::Relaxed);
        self.failing[kind as usize].store(0, Ordering::Relaxed);
    }

    pub fn failed(&self, kind: AuditScope) {
        self.runs[kind as usize][AuditResult::Failed as usize].fetch_add(1, Ordering::Relaxed);
        self.failing[kind as usize].store(1, Ordering::Relaxed);
    }

    pub fn could_not_run(&self, kind: AuditScope) {
        self.runs[kind as usize][AuditResult::Error as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Runs of this kind that ended with `result`.
    pub fn runs(&self, kind: AuditScope, result: AuditResult) -> u64 {
        self.runs[kind as usize][result as usize].load(Ordering::Relaxed)
    }

    pub fn passed_at(&self, kind: AuditScope) -> u64 {
        self.passed_at[kind as usize].load(Ordering::Relaxed)
    }

    pub fn events(&self, kind: AuditScope) -> u64 {
        self.events[kind as usize].load(Ordering::Relaxed)
    }

    /// True while the last audit of this kind that ran to the end found a disagreement.
    pub fn failing(&self, kind: AuditScope) -> bool {
        self.failing[kind as usize].load(Ordering::Relaxed) == 1
    }
}

#[derive(Default)]
pub struct EngineMetrics {
    /// From a change queued by a merchant actor to its durability.
    pub commit_latency: Histogram,
    /// Payments that reached a status, by (provider code, status as the API names it).
    pub payments: DashMap<(String, &'static str), AtomicU64>,
    deliveries: [AtomicU64; 3],
    /// Notifications the webhook dispatcher holds: being delivered, plus waiting for a free worker.
    pub webhook_queue: AtomicI64,
    pub audits: AuditMetrics,
    /// Delivered notifications deleted past their retention.
    pub notifications_forgotten: AtomicU64,
    lost_commits: [AtomicU64; 3],
}

impl EngineMetrics {
    pub fn payment_reached(&self, provider: &str, status: &'static str) {
        // Providers and statuses are few and configured, so the map stays small.
        if let Some(n) = self.payments.get(&(provider.to_owned(), status)) {
            n.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.payments.entry((provider.to_owned(), status)).or_default().fetch_add(1, Ordering::Relaxed);
    }

    pub fn delivery(&self, result: DeliveryResult) {
        self.deliveries[result as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn deliveries(&self, result: DeliveryResult) -> u64 {
        self.deliveries[result as usize].load(Ordering::Relaxed)
    }

    pub fn lost_commit(&self, outcome: LostCommit) {
        self.lost_commits[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn lost_commits(&self, outcome: LostCommit) -> u64 {
        self.lost_commits[outcome as usize].load(Ordering::Relaxed)
    }
}

/// The process's engine metrics.
pub static METRICS: LazyLock<EngineMetrics> = LazyLock::new(EngineMetrics::default);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.cumulative[0], (0.0005, 1));
        assert_eq!(s.cumulative.iter().find(|(b, _)| *b == 0.005).map(|(_, n)| *n), Some(2));
        assert_eq!(s.cumulative.last().map(|(_, n)| *n), Some(2), "60 s is only in +Inf");
        assert!((s.sum_s - 60.0033).abs() < 1e-6);
    }
}
