//! Webhook signatures (docs/api.md § Webhook signature): `X-Service-Signature: sha256=<hex HMAC-SHA256(secret key,
//! timestamp + "." + raw body)>` with `X-Service-Timestamp` the Unix time in seconds; and beside them the Standard
//! Webhooks headers (docs/api.md § Webhook signature), so that receivers can use that specification's libraries:
//! `webhook-id` (the notification's `evt_` id, the same on every attempt), `webhook-timestamp` and
//! `webhook-signature: v1,<base64 HMAC-SHA256(secret key, id + "." + timestamp + "." + raw body)>`.
//!
//! [`verify`] is the function merchants can copy or call: it checks the signature over the raw bytes (never
//! a re-serialised body, whose bytes would differ) in constant time, then the timestamp's freshness.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

pub const SIGNATURE_HEADER: &str = "X-Service-Signature";
pub const TIMESTAMP_HEADER: &str = "X-Service-Timestamp";
/// Standard Webhooks: the notification's id, which receivers deduplicate on.
pub const STANDARD_ID_HEADER: &str = "webhook-id";
pub const STANDARD_TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const STANDARD_SIGNATURE_HEADER: &str = "webhook-signature";
/// Recommended anti-replay window for receivers (docs/api.md § Webhook signature), in either direction.
pub const TOLERANCE_S: u64 = 300;

/// The `X-Service-Signature` value for `body` sent at `timestamp_s`.
pub fn sign(secret_key: &str, timestamp_s: u64, body: &[u8]) -> String {
    // HMAC takes keys of any length; `new_from_slice` cannot fail for it, and the empty fallback can never
    // verify, so a broken key fails closed.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret_key.as_bytes()) else { return String::new() };
    mac.update(timestamp_s.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The `webhook-signature` value for the notification `id`'s `body` sent at `timestamp_s`. The key is the secret
/// key's UTF-8 bytes, which the Standard Webhooks libraries take written as `whsec_` + base64 of those bytes.
pub fn sign_standard(secret_key: &str, id: &str, timestamp_s: u64, body: &[u8]) -> String {
    sign_standard_with(secret_key.as_bytes(), id, timestamp_s, body)
}

fn sign_standard_with(key: &[u8], id: &str, timestamp_s: u64, body: &[u8]) -> String {
    use base64::Engine as _;
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else { return String::new() };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp_s.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()))
}

/// The secret key as the Standard Webhooks libraries take it: `whsec_` + base64 of its UTF-8 bytes.
pub fn standard_secret(secret_key: &str) -> String {
    use base64::Engine as _;
    format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode(secret_key.as_bytes()))
}

/// Verifies a delivery by its Standard Webhooks headers: `signatures` is the `webhook-signature` value, which
/// may hold several space-separated `v1,<base64>` entries (during a key roll); one matching is enough.
pub fn verify_standard(
    secret_key: &str,
    id: &str,
    signatures: &str,
    timestamp: &str,
    raw_body: &[u8],
    now_s: u64,
) -> Result<(), VerifyError> {
    let timestamp_s: u64 = timestamp.trim().parse().map_err(|_| VerifyError::MalformedTimestamp)?;
    let expected = sign_standard(secret_key, id, timestamp_s, raw_body);
    let matched = signatures.split_whitespace().fold(false, |found, given| {
        found | (!expected.is_empty() && bool::from(expected.as_bytes().ct_eq(given.as_bytes())))
    });
    if !matched {
        return Err(VerifyError::BadSignature);
    }
    if now_s.abs_diff(timestamp_s) > TOLERANCE_S {
        return Err(VerifyError::StaleTimestamp);
    }
    Ok(())
}

/// Why a delivery does not verify; the receiver answers 401 for a bad signature and 400 for a stale or
/// malformed timestamp (docs/api.md § Webhook signature).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the signature does not match")]
    BadSignature,
    #[error("the timestamp is more than 300 seconds away from now")]
    StaleTimestamp,
    #[error("the timestamp header is not a Unix time in seconds")]
    MalformedTimestamp,
}

/// Verifies a received webhook: `signature` and `timestamp` are the two header values, `raw_body` the body
/// exactly as received, `now_s` the receiver's clock.
pub fn verify(
    secret_key: &str,
    signature: &str,
    timestamp: &str,
    raw_body: &[u8],
    now_s: u64,
) -> Result<(), VerifyError> {
    let timestamp_s: u64 = timestamp.trim().parse().map_err(|_| VerifyError::MalformedTimestamp)?;
    let expected = sign(secret_key, timestamp_s, raw_body);
    if expected.is_empty() || !bool::from(expected.as_bytes().ct_eq(signature.trim().as_bytes())) {
        return Err(VerifyError::BadSignature);
    }
    if now_s.abs_diff(timestamp_s) > TOLERANCE_S {
        return Err(VerifyError::StaleTimestamp);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk_test_abcdefghijklmnopqrstuvwxyz012345";

    #[test]
    fn signs_as_the_spec_says() {
        // Independent computation: HMAC-SHA256(key, "1700000000.{}") in hex, computed once with Python's hmac.
        let sig = sign("key", 1_700_000_000, b"{}");
        assert_eq!(sig, "sha256=9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae");
        assert_ne!(sig, sign("key", 1_700_000_001, b"{}"));
        assert_ne!(sig, sign("other", 1_700_000_000, b"{}"));
    }

    /// The example of the Standard Webhooks specification (standard-webhooks/standard-webhooks, `spec/`):
    /// secret `whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`, id `msg_p5jXN8AQM9LWM0D4loKWxJek`, timestamp 1614265330,
    /// body `{"test": 2432232314}`.
    #[test]
    fn signs_as_the_standard_webhooks_example() {
        use base64::Engine as _;
        let key = base64::engine::general_purpose::STANDARD.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let sig = sign_standard_with(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, br#"{"test": 2432232314}"#);
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn the_standard_signature_covers_id_timestamp_and_body() {
        // Independent computation: base64(HMAC-SHA256(b"key", b"evt_1.1700000000.{}")), computed with Python.
        let sig = sign_standard("key", "evt_1", 1_700_000_000, b"{}");
        assert_eq!(sig, "v1,qlxS+Rx59BdwbM0DVnBBVM2EZr7V1DuM8yaNlT+iZiY=");
        assert_ne!(sig, sign_standard("key", "evt_2", 1_700_000_000, b"{}"));
        assert_eq!(standard_secret("key"), "whsec_a2V5");
        assert_eq!(verify_standard("key", "evt_1", &sig, "1700000000", b"{}", 1_700_000_100), Ok(()));
        let rolled = format!("v1,b3RoZXI= {sig}");
        assert_eq!(verify_standard("key", "evt_1", &rolled, "1700000000", b"{}", 1_700_000_000), Ok(()));
        assert_eq!(
            verify_standard("key", "evt_2", &sig, "1700000000", b"{}", 1_700_000_000),
            Err(VerifyError::BadSignature)
        );
        assert_eq!(
            verify_standard("key", "evt_1", &sig, "1700000000", b"{}", 1_700_000_301),
            Err(VerifyError::StaleTimestamp)
        );
    }

    #[test]
    fn verify_accepts_a_fresh_genuine_delivery() {
        let body = br#"{"event":"payment.succeeded"}"#;
        let sig = sign(KEY, 1_000_000, body);
        assert_eq!(verify(KEY, &sig, "1000000", body, 1_000_000), Ok(()));
        assert_eq!(verify(KEY, &sig, "1000000", body, 1_000_300), Ok(()));
        assert_eq!(verify(KEY, &sig, "1000000", body, 999_700), Ok(()));
    }

    #[test]
    fn verify_refuses_tampering_staleness_and_garbage() {
        let body = br#"{"montant":5000}"#;
        let sig = sign(KEY, 1_000_000, body);
        assert_eq!(verify(KEY, &sig, "1000000", br#"{"montant":9000}"#, 1_000_000), Err(VerifyError::BadSignature));
        assert_eq!(verify("sk_test_other", &sig, "1000000", body, 1_000_000), Err(VerifyError::BadSignature));
        assert_eq!(verify(KEY, &sig, "1000001", body, 1_000_000), Err(VerifyError::BadSignature));
        assert_eq!(verify(KEY, &sig, "1000000", body, 1_000_301), Err(VerifyError::StaleTimestamp));
        assert_eq!(verify(KEY, &sig, "soon", body, 1_000_000), Err(VerifyError::MalformedTimestamp));
        assert_eq!(verify(KEY, "sha256=00", "1000000", body, 1_000_000), Err(VerifyError::BadSignature));
        // A re-serialised body (spaces added) is different bytes: it must not verify.
        assert_eq!(verify(KEY, &sig, "1000000", br#"{ "montant": 5000 }"#, 1_000_000), Err(VerifyError::BadSignature));
    }
}
