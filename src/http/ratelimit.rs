//! Per-key rate limit: a token bucket per merchant, refilled at `rate_limit_per_s` with a burst of twice that.
//! Beyond it the API answers 429 `rate_limited` with `Retry-After` (docs/api.md § Errors).

use std::time::Instant;

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

#[cfg(test)]
mod tests {
    use super::*;

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
