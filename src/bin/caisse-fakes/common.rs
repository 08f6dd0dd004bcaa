//! What both fakes share: the fake clock, the request log, the bounded transaction store and the
//! small validators (UUIDv4, digits).
//!
//! Every transaction of either fake is one [`Txn`]: the provider modules decide its plan at creation (from the
//! magic numbers), the ticker in `server.rs` moves it along the fake clock, and each provider renders it in its
//! own wire format. Keeping one shape lets the control API list, settle and inspect both fakes the same way.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use serde_json::{json, Value};

/// At most this many requests are kept for `GET /__fake/requests`; older ones are dropped first.
pub const REQUESTS_MAX: usize = 10_000;
/// At most this many transactions are kept; creating one more forgets the oldest.
pub const TRANSACTIONS_MAX: usize = 10_000;
/// A clock advance larger than this (ten years) is refused: it would only overflow timestamps.
pub const ADVANCE_S_MAX: u64 = 10 * 365 * 24 * 3600;

/// The fake's clock: real monotonic time plus what `POST /__fake/clock/advance` added. Token expiry, settlement
/// and the "not found right after creation" window all read it, so a test can jump over an hour in one call.
pub struct Clock {
    started: Instant,
    started_wall: SystemTime,
    offset_ms: AtomicU64,
}

impl Clock {
    pub fn new() -> Clock {
        Clock { started: Instant::now(), started_wall: SystemTime::now(), offset_ms: AtomicU64::new(0) }
    }

    /// Milliseconds since the fake started, advances included.
    pub fn now_ms(&self) -> u64 {
        let real = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        real.saturating_add(self.offset_ms.load(Ordering::Relaxed))
    }

    pub fn advance_s(&self, seconds: u64) {
        self.offset_ms.fetch_add(seconds.saturating_mul(1000), Ordering::Relaxed);
    }

    pub fn offset_s(&self) -> u64 {
        self.offset_ms.load(Ordering::Relaxed) / 1000
    }

    /// The fake's wall-clock time as RFC 3339 in UTC (`2025-01-31T10:00:00Z`), for `created` fields.
    pub fn rfc3339(&self) -> String {
        let wall = self.started_wall + Duration::from_millis(self.now_ms());
        humantime::format_rfc3339_seconds(wall).to_string()
    }
}

/// One request as received, for `GET /__fake/requests`.
#[derive(Clone, Debug, Serialize)]
pub struct RecordedRequest {
    pub method: String,
    /// The path with its query string, if any.
    pub path: String,
    /// Lower-case names; a repeated header's values joined with ", ".
    pub headers: serde_json::Map<String, Value>,
    /// The body as text (invalid UTF-8 replaced).
    pub body: String,
}

/// Where a transaction stands, in provider-neutral terms; each provider names these on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Just accepted (pawaPay ACCEPTED, MTN PENDING).
    Created,
    /// pawaPay PROCESSING, MTN PENDING.
    Processing,
    /// Parked until the control API settles it: pawaPay IN_RECONCILIATION or ENQUEUED.
    Held,
    Succeeded,
    Failed,
}

impl Stage {
    pub fn is_final(self) -> bool {
        matches!(self, Stage::Succeeded | Stage::Failed)
    }
}

/// What will happen to a transaction when it settles, decided at creation from the magic numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    Succeed,
    /// Fails with this reason code (`None`: MTN's bare FAILED without a reason).
    Fail(Option<String>),
    /// Never settles on its own, and sends no callback until the control API settles it.
    Stuck,
}

/// One transaction of either fake.
#[derive(Clone, Debug)]
pub struct Txn {
    /// deposit, payout, refund (pawaPay); requesttopay, transfer, refund (MTN).
    pub kind: &'static str,
    pub id: String,
    pub stage: Stage,
    pub plan: Plan,
    /// The amount as it is rendered back (an integer string for XOF/XAF).
    pub amount: String,
    pub currency: String,
    /// The payer's or recipient's MSISDN (or the MTN party id).
    pub phone: String,
    /// The pawaPay provider code, or the MTN target environment.
    pub route: String,
    pub reason: Option<String>,
    /// Fake-clock milliseconds at creation, and the RFC 3339 form rendered as `created`.
    pub created_ms: u64,
    pub created_at: String,
    /// When the ticker settles it (fake-clock ms); `None` while stuck or held.
    pub settle_at_ms: Option<u64>,
    pub callback_url: Option<String>,
    /// The creation request's body, echoed in status answers.
    pub request: Value,
    /// Set on success: pawaPay `providerTransactionId`, MTN `financialTransactionId`.
    pub provider_txn_id: Option<String>,
    /// For a refund, the deposit or request-to-pay it refunds.
    pub parent: Option<String>,
}

impl Txn {
    /// The control API's view (`GET /__fake/transactions`).
    pub fn summary(&self, status: &str, pawapay: bool) -> Value {
        json!({
            "kind": self.kind,
            "id": self.id,
            "status": status,
            "amount": self.amount,
            "currency": self.currency,
            "phone": self.phone,
            "provider": if pawapay { Value::from(self.route.clone()) } else { Value::Null },
            "target": if pawapay { Value::Null } else { Value::from(self.route.clone()) },
            "reason": self.reason,
            "created": self.created_at,
            "parent": self.parent,
            "provider_reference": self.provider_txn_id,
        })
    }
}

/// The transactions, by id, in creation order; bounded by [`TRANSACTIONS_MAX`].
#[derive(Default)]
pub struct Store {
    by_id: HashMap<String, Txn>,
    order: VecDeque<String>,
}

impl Store {
    pub fn get(&self, id: &str) -> Option<&Txn> {
        self.by_id.get(id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Txn> {
        self.by_id.get_mut(id)
    }

    pub fn contains(&self, id: &str) -> bool {
        self.by_id.contains_key(id)
    }

    /// Adds a transaction; the oldest one is forgotten when the store is full.
    pub fn insert(&mut self, txn: Txn) {
        if self.order.len() >= TRANSACTIONS_MAX {
            if let Some(oldest) = self.order.pop_front() {
                self.by_id.remove(&oldest);
            }
        }
        self.order.push_back(txn.id.clone());
        self.by_id.insert(txn.id.clone(), txn);
    }

    /// In creation order.
    pub fn iter(&self) -> impl Iterator<Item = &Txn> {
        self.order.iter().filter_map(|id| self.by_id.get(id))
    }

    /// Ids of the transactions not yet final, for the ticker.
    pub fn open_ids(&self) -> Vec<String> {
        self.iter().filter(|t| !t.stage.is_final()).map(|t| t.id.clone()).collect()
    }
}

/// A UUID in the canonical 8-4-4-4-12 form with version 4 and the RFC 4122 variant, in either case.
pub fn is_uuid_v4(id: &str) -> bool {
    let bytes = id.as_bytes();
    if bytes.len() != 36 {
        return false;
    }
    let hyphens_ok =
        bytes.iter().enumerate().all(
            |(i, &b)| {
                if matches!(i, 8 | 13 | 18 | 23) {
                    b == b'-'
                } else {
                    b.is_ascii_hexdigit()
                }
            },
        );
    hyphens_ok && bytes[14] == b'4' && matches!(bytes[19], b'8' | b'9' | b'a' | b'b' | b'A' | b'B')
}

/// Non-empty and ASCII digits only (an MSISDN without '+', spaces or dashes).
pub fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

pub fn is_http_url(url: &str) -> bool {
    (url.starts_with("http://") || url.starts_with("https://")) && url.parse::<awc::http::Uri>().is_ok()
}

/// A fresh random identifier in the shape providers use for their own transaction ids (digits).
pub fn provider_reference() -> String {
    use rand::Rng;
    let n: u64 = rand::thread_rng().gen_range(1_000_000_000..10_000_000_000);
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_v4_validation() {
        assert!(is_uuid_v4("f4401bd2-1568-4140-bf2d-eb77d2b2b639"));
        assert!(is_uuid_v4("F4401BD2-1568-4140-BF2D-EB77D2B2B639"), "either case");
        for bad in [
            "",
            "f4401bd2-1568-4140-bf2d-eb77d2b2b63",    // short
            "f4401bd2-1568-1140-bf2d-eb77d2b2b639",   // version 1
            "f4401bd2-1568-4140-7f2d-eb77d2b2b639",   // wrong variant
            "f4401bd215684140bf2deb77d2b2b639",       // no hyphens
            "f4401bd2-1568-4140-bf2d-eb77d2b2b63g",   // not hex
            "{f4401bd2-1568-4140-bf2d-eb77d2b2b639}", // braces
            "f4401bd2-1568-4140-bf2d-eb77d2b2b639-",  // trailing
        ] {
            assert!(!is_uuid_v4(bad), "{bad}");
        }
    }

    #[test]
    fn store_is_bounded_and_ordered() {
        let mut store = Store::default();
        let txn = |id: String| Txn {
            kind: "deposit",
            id,
            stage: Stage::Created,
            plan: Plan::Succeed,
            amount: "1".into(),
            currency: "XOF".into(),
            phone: "229".into(),
            route: "MTN_MOMO_BEN".into(),
            reason: None,
            created_ms: 0,
            created_at: String::new(),
            settle_at_ms: None,
            callback_url: None,
            request: Value::Null,
            provider_txn_id: None,
            parent: None,
        };
        for i in 0..TRANSACTIONS_MAX + 5 {
            store.insert(txn(i.to_string()));
        }
        assert_eq!(store.iter().count(), TRANSACTIONS_MAX);
        assert!(!store.contains("0") && store.contains("5"));
        assert_eq!(store.iter().next().map(|t| t.id.as_str()), Some("5"));
    }
}
