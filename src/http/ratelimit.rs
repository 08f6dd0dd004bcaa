//! Per-key rate limit: a token bucket per merchant, refilled at `rate_limit_per_s` with a burst of twice that.
//! Beyond it the API answers 429 `rate_limited` with `Retry-After` (docs/api.md § Errors).
//!
//! [`FailedAuth`] limits the other side: requests that fail authentication, per client address, so that
//! guessing keys or scanning costs the server a bounded amount of work per address.
//!
//! [`PerMinute`] counts an action per client address over the last minute, whatever minute: the payment page's
//! form posts.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use caisse_engine::domain::ids::MerchantId;
use dashmap::DashMap;

use super::error::ApiError;

pub struct RateLimiter {
    per_s: f64,
    burst: f64,
    buckets: DashMap<MerchantId, (f64, Instant)>,
}

impl RateLimiter {
    /// `per_s == 0` turns the limit off.
    pub fn new(per_s: u32) -> RateLimiter {
        RateLimiter { per_s: f64::from(per_s), burst: f64::from(per_s) * 2.0, buckets: DashMap::new() }
    }

    pub fn check(&self, merchant: &MerchantId) -> Result<(), ApiError> {
        if self.per_s <= 0.0 {
            return Ok(());
        }
        let now = Instant::now();
        let mut bucket = self.buckets.entry(merchant.clone()).or_insert((self.burst, now));
        let (tokens, last) = *bucket;
        let refilled = (tokens + now.duration_since(last).as_secs_f64() * self.per_s).min(self.burst);
        if refilled >= 1.0 {
            *bucket = (refilled - 1.0, now);
            Ok(())
        } else {
            *bucket = (refilled, now);
            let wait_s = ((1.0 - refilled) / self.per_s).ceil().max(1.0) as u64;
            let mut err = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "too many requests for this key; slow down",
            );
            err.retry_after_s = Some(wait_s);
            Err(err)
        }
    }
}

/// Requests answered 401 per client address: `allowed` in [`FailedAuth::WINDOW`] (`failed_auth_per_minute`);
/// beyond, every API request from that address is answered 429 until the window ends, before any work.
pub struct FailedAuth {
    counts: DashMap<IpAddr, (u32, Instant)>,
    /// 0 turns the limit off.
    allowed: u32,
}

impl FailedAuth {
    pub const WINDOW: Duration = Duration::from_secs(60);
    /// Addresses tracked; when full, expired entries go and new addresses are not counted until room returns
    /// (counts of addresses already held are never dropped early).
    const MAX_ADDRESSES: usize = 100_000;

    pub fn new(allowed: u32) -> FailedAuth {
        FailedAuth { counts: DashMap::new(), allowed }
    }

    /// `Err` with the seconds to wait when `address` used up its failures.
    pub fn check(&self, address: IpAddr, now: Instant) -> Result<(), u64> {
        match self.counts.get(&address) {
            Some(entry)
                if self.allowed > 0
                    && entry.0 >= self.allowed
                    && now.saturating_duration_since(entry.1) < Self::WINDOW =>
            {
                Err((Self::WINDOW - now.saturating_duration_since(entry.1)).as_secs().max(1))
            }
            _ => Ok(()),
        }
    }

    /// Counts one request of `address` that failed authentication.
    pub fn failed(&self, address: IpAddr, now: Instant) {
        if !self.counts.contains_key(&address) && self.counts.len() >= Self::MAX_ADDRESSES {
            self.counts.retain(|_, (_, since)| now.saturating_duration_since(*since) < Self::WINDOW);
            if self.counts.len() >= Self::MAX_ADDRESSES {
                return;
            }
        }
        let mut entry = self.counts.entry(address).or_insert((0, now));
        if now.saturating_duration_since(entry.1) >= Self::WINDOW {
            *entry = (0, now);
        }
        entry.0 = entry.0.saturating_add(1);
    }
}

/// At most `allowed` actions per client address in any sixty seconds: each address keeps the times of its last
/// `allowed` actions, and one more is refused until the oldest of them is a minute old. A window that restarts
/// a minute after an address's first action would let twice as many through across its end.
pub struct PerMinute {
    times: DashMap<IpAddr, VecDeque<Instant>>,
    /// 0 turns the limit off.
    allowed: u32,
}

impl PerMinute {
    pub const WINDOW: Duration = Duration::from_secs(60);
    /// Addresses tracked; when full, addresses with nothing in the last minute go, and new addresses are not
    /// counted until room returns (as with [`FailedAuth`]).
    const MAX_ADDRESSES: usize = 100_000;

    pub fn new(allowed: u32) -> PerMinute {
        PerMinute { times: DashMap::new(), allowed }
    }

    /// Counts one action of `address` at `now`, or refuses it with the seconds until one more is allowed.
    /// The check and the count are one step, so requests at the same moment cannot all pass the same check.
    pub fn hit(&self, address: IpAddr, now: Instant) -> Result<(), u64> {
        let allowed = self.allowed as usize;
        if allowed == 0 {
            return Ok(());
        }
        if !self.times.contains_key(&address) && self.times.len() >= Self::MAX_ADDRESSES {
            self.times
                .retain(|_, times| times.back().is_some_and(|t| now.saturating_duration_since(*t) < Self::WINDOW));
            if self.times.len() >= Self::MAX_ADDRESSES {
                return Ok(());
            }
        }
        let mut times = self.times.entry(address).or_default();
        while times.front().is_some_and(|t| now.saturating_duration_since(*t) >= Self::WINDOW) {
            times.pop_front();
        }
        match times.front() {
            Some(oldest) if times.len() >= allowed => {
                // Rounded up: a client that waits this long is let through.
                let wait_ms = (Self::WINDOW - now.saturating_duration_since(*oldest)).as_millis();
                Err(u64::try_from(wait_ms.div_ceil(1000)).unwrap_or(u64::MAX).max(1))
            }
            _ => {
                times.push_back(now);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_minute_counts_any_sixty_seconds_not_a_window_from_the_first() {
        let limiter = PerMinute::new(10);
        let (a, b): (IpAddr, IpAddr) = ("198.51.100.1".parse().unwrap(), "198.51.100.2".parse().unwrap());
        let t0 = Instant::now();
        assert!(limiter.hit(a, t0).is_ok());
        // Nine more at 59 s: ten in the minute.
        let late = t0 + Duration::from_secs(59);
        for _ in 0..9 {
            assert!(limiter.hit(a, late).is_ok());
        }
        assert_eq!(limiter.hit(a, late), Err(1), "the eleventh in a minute");
        // At 60.5 s the first is a minute old: one more, not ten.
        let after = t0 + Duration::from_millis(60_500);
        assert!(limiter.hit(a, after).is_ok());
        assert_eq!(limiter.hit(a, after), Err(59), "the nine of 59 s are in the minute for 58.5 s more");
        assert!(limiter.hit(b, after).is_ok(), "another address is apart");
        assert!(limiter.hit(a, late + PerMinute::WINDOW).is_ok(), "once they are a minute old");
        let off = PerMinute::new(0);
        for _ in 0..100 {
            assert!(off.hit(a, t0).is_ok(), "0 turns it off");
        }
    }

    #[test]
    fn failed_authentications_block_their_address_for_the_window() {
        let limiter = FailedAuth::new(50);
        let (a, b): (IpAddr, IpAddr) = ("198.51.100.1".parse().unwrap(), "198.51.100.2".parse().unwrap());
        let t0 = Instant::now();
        for _ in 0..50 {
            assert!(limiter.check(a, t0).is_ok());
            limiter.failed(a, t0);
        }
        assert_eq!(limiter.check(a, t0 + Duration::from_secs(10)), Err(50));
        assert!(limiter.check(b, t0).is_ok(), "another address is apart");
        assert!(limiter.check(a, t0 + FailedAuth::WINDOW).is_ok(), "the window ends");
        let off = FailedAuth::new(0);
        for _ in 0..100 {
            off.failed(a, t0);
        }
        assert!(off.check(a, t0).is_ok(), "0 turns it off");
    }

    #[test]
    fn allows_the_burst_then_refuses_with_retry_after() {
        let limiter = RateLimiter::new(2);
        let m = MerchantId::new();
        for _ in 0..4 {
            limiter.check(&m).unwrap();
        }
        let err = limiter.check(&m).unwrap_err();
        assert_eq!(err.code, "rate_limited");
        assert_eq!(err.retry_after_s, Some(1));
        // Another key has its own bucket.
        limiter.check(&MerchantId::new()).unwrap();
    }

    #[test]
    fn zero_means_no_limit() {
        let limiter = RateLimiter::new(0);
        let m = MerchantId::new();
        for _ in 0..1000 {
            limiter.check(&m).unwrap();
        }
    }
}
