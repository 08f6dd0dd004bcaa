//! The retry schedule and the delivery state machine of one notification, as pure functions.
//!
//! A notification starts `pending`, due at once. Each attempt either gets a 200 (`delivered`, final for that
//! chain) or fails; after the k-th failed attempt of a chain it waits `waits[k-1]` with +/-20 % jitter, and
//! after the last wait's attempt fails it is `failed`. Sending again on demand starts a new chain. These
//! functions decide; the delivery workers only perform the HTTP call and persist what is decided here.

use rand::Rng;

use crate::domain::records::{Attempt, DeliveryState, Notification};
use crate::domain::time::Timestamp;

/// Attempts kept in a notification's log; older ones are dropped (the counts stay exact).
pub const MAX_LOGGED_ATTEMPTS: usize = 30;
/// Longest error text kept per attempt.
pub const MAX_ERROR_LEN: usize = 200;

/// The default schedule (docs/api.md § Webhook delivery): 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h.
pub const DEFAULT_WAITS_MS: [u64; 9] =
    [5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 50_400_000, 72_000_000, 86_400_000];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySchedule {
    /// Waits after the 1st, 2nd, ... failed attempt; `waits.len() + 1` attempts in all.
    pub waits_ms: Vec<u64>,
    /// Jitter as a fraction in per mille (200 = +/-20 %).
    pub jitter_permille: u64,
}

impl Default for RetrySchedule {
    fn default() -> Self {
        RetrySchedule { waits_ms: DEFAULT_WAITS_MS.to_vec(), jitter_permille: 200 }
    }
}

impl RetrySchedule {
    pub fn attempts(&self) -> usize {
        self.waits_ms.len() + 1
    }

    /// The wait after the `failed_in_chain`-th failure (1-based), jittered by `unit` in [-1, 1]; `None` when
    /// that failure was the last attempt.
    pub fn wait_after(&self, failed_in_chain: u32, unit: f64) -> Option<u64> {
        let index = usize::try_from(failed_in_chain).ok()?.checked_sub(1)?;
        let base = *self.waits_ms.get(index)?;
        let spread = base as f64 * (self.jitter_permille as f64 / 1000.0) * unit.clamp(-1.0, 1.0);
        Some((base as f64 + spread).max(0.0) as u64)
    }
}

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptOutcome {
    pub at: Timestamp,
    /// The `X-Service-Timestamp` this attempt was signed with (none when it never got to sending).
    pub signed_at_s: Option<u64>,
    pub http_status: Option<u16>,
    pub error: Option<String>,
    pub latency_ms: u64,
}

impl AttemptOutcome {
    /// Only HTTP 200 acknowledges (docs/api.md § Webhook delivery): 204, redirects and every error are failures.
    pub fn acknowledged(&self) -> bool {
        self.http_status == Some(200)
    }
}

/// The notification after an attempt. `unit` is the jitter draw in [-1, 1] (random in production, fixed in
/// tests). A notification that is not `pending` is returned unchanged: an attempt result that arrives for a
/// chain already settled never reopens it.
pub fn after_attempt(n: &Notification, outcome: &AttemptOutcome, schedule: &RetrySchedule, unit: f64) -> Notification {
    let mut next = n.clone();
    if n.state != DeliveryState::Pending {
        return next;
    }
    next.total_attempts = n.total_attempts.saturating_add(1);
    next.chain_attempts = n.chain_attempts.saturating_add(1);
    next.attempts.push(Attempt {
        at: outcome.at,
        signed_at_s: outcome.signed_at_s,
        http_status: outcome.http_status,
        error: outcome.error.as_ref().map(|e| e.chars().take(MAX_ERROR_LEN).collect()),
        latency_ms: outcome.latency_ms,
    });
    if next.attempts.len() > MAX_LOGGED_ATTEMPTS {
        let excess = next.attempts.len() - MAX_LOGGED_ATTEMPTS;
        next.attempts.drain(..excess);
    }
    if outcome.acknowledged() {
        next.state = DeliveryState::Delivered;
        next.next_attempt_at = None;
    } else {
        match schedule.wait_after(next.chain_attempts, unit) {
            Some(wait_ms) => next.next_attempt_at = Some(outcome.at.plus_ms(wait_ms)),
            None => {
                next.state = DeliveryState::Failed;
                next.next_attempt_at = None;
            }
        }
    }
    next
}

/// Starts a new chain for a notification sent again on demand (from the dashboard). Delivered ones may be
/// sent again too: a merchant who lost the event on their side asks for it.
pub fn resend(n: &Notification, now: Timestamp) -> Notification {
    let mut next = n.clone();
    next.state = DeliveryState::Pending;
    next.chain_attempts = 0;
    next.next_attempt_at = Some(now);
    next
}

/// A jitter draw in [-1, 1].
pub fn jitter_unit() -> f64 {
    rand::thread_rng().gen_range(-1.0..=1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::MerchantId;
    use crate::domain::status::EventKind;

    fn pending() -> Notification {
        Notification {
            id: "evt_1".into(),
            merchant: MerchantId::new(),
            event: EventKind::PaymentSucceeded,
            reference: "pay_1".into(),
            body: "{}".into(),
            created_at: Timestamp::from_unix_ms(0),
            state: DeliveryState::Pending,
            next_attempt_at: Some(Timestamp::from_unix_ms(0)),
            attempts: Vec::new(),
            chain_attempts: 0,
            total_attempts: 0,
        }
    }

    fn failed_at(ms: u64, status: u16) -> AttemptOutcome {
        AttemptOutcome {
            at: Timestamp::from_unix_ms(ms),
            signed_at_s: Some(ms / 1000),
            http_status: Some(status),
            error: None,
            latency_ms: 3,
        }
    }

    #[test]
    fn default_schedule_is_ten_attempts_over_about_three_days() {
        let s = RetrySchedule::default();
        assert_eq!(s.attempts(), 10);
        let total_h = s.waits_ms.iter().sum::<u64>() as f64 / 3_600_000.0;
        assert!((75.0..76.0).contains(&total_h), "{total_h}");
    }

    #[test]
    fn failures_follow_the_schedule_then_fail() {
        let s = RetrySchedule { waits_ms: vec![1_000, 2_000], jitter_permille: 200 };
        let n1 = after_attempt(&pending(), &failed_at(0, 500), &s, 0.0);
        assert_eq!((n1.state, n1.next_attempt_at), (DeliveryState::Pending, Some(Timestamp::from_unix_ms(1_000))));
        let n2 = after_attempt(&n1, &failed_at(1_000, 204), &s, 1.0);
        assert_eq!(n2.next_attempt_at, Some(Timestamp::from_unix_ms(1_000 + 2_400)));
        let n3 = after_attempt(&n2, &failed_at(3_400, 302), &s, 0.0);
        assert_eq!((n3.state, n3.next_attempt_at), (DeliveryState::Failed, None));
        assert_eq!((n3.total_attempts, n3.attempts.len()), (3, 3));
    }

    #[test]
    fn only_200_acknowledges_and_settles_for_good() {
        let s = RetrySchedule::default();
        for status in [201, 202, 204, 301, 302, 400, 500] {
            assert_eq!(after_attempt(&pending(), &failed_at(0, status), &s, 0.0).state, DeliveryState::Pending);
        }
        let done = after_attempt(&pending(), &failed_at(0, 200), &s, 0.0);
        assert_eq!((done.state, done.next_attempt_at), (DeliveryState::Delivered, None));
        // A late result for the same chain changes nothing.
        assert_eq!(after_attempt(&done, &failed_at(5, 500), &s, 0.0), done);
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        let s = RetrySchedule::default();
        for _ in 0..1000 {
            let w = s.wait_after(1, jitter_unit()).unwrap();
            assert!((4_000..=6_000).contains(&w), "{w}");
        }
    }

    #[test]
    fn resend_starts_a_new_chain_and_the_log_stays_bounded() {
        let s = RetrySchedule { waits_ms: vec![], jitter_permille: 0 };
        let mut n = pending();
        for i in 0..100 {
            n = after_attempt(&n, &failed_at(i, 500), &s, 0.0);
            assert_eq!(n.state, DeliveryState::Failed);
            n = resend(&n, Timestamp::from_unix_ms(i));
            assert_eq!((n.state, n.chain_attempts), (DeliveryState::Pending, 0));
        }
        assert_eq!(n.total_attempts, 100);
        assert_eq!(n.attempts.len(), MAX_LOGGED_ATTEMPTS);
    }
}
