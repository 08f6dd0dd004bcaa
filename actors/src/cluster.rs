//! Forwarding between the nodes of a cluster: a merchant's commands and actor reads go to the node that holds
//! the merchant's shard, so any node answers any request while one node at a time writes for a merchant.
//!
//! The engine sends a [`Forwarded`] message to the holder's advertised URL at [`FORWARD_PATH`], in postcard
//! (the store's own encoding, so records cross exactly as they are stored), signed with a key derived from the
//! cluster's secret, which every node reads from the shared database ([`Forwarding`]). The holder runs the message on its own actor and
//! answers the result, errors included, so the answer is the one the holder would have given to the client
//! itself. A holder never forwards again: if the shard moved meanwhile it answers "unavailable" and the client
//! retries (with the same idempotency key, which is what makes the retry safe).

use std::sync::Arc;
use std::time::Duration;

use awc::error::{ConnectError, SendRequestError};
use serde::{Deserialize, Serialize};

use crate::core::Command;
use crate::domain::ids::MerchantId;
use crate::domain::ledger::Balances;
use crate::domain::links::Link;
use crate::domain::records::{Notification, Payment, Payout};
use crate::domain::text::IdempotencyKey;
use crate::error::EngineError;
use crate::merchant::{Executed, Idempotency, ProviderNote};
use crate::store::StoreError;

/// Where a node receives forwarded messages, on its API listener.
pub const FORWARD_PATH: &str = "/_cluster/v1/forward";

/// Sent with every forwarded message: the encoding is positional, so a node refuses a message laid out by
/// another protocol than its own. Builds that lay the messages out alike share the protocol, so a rolling
/// upgrade between them forwards as usual; a test pins the layout (`forwarded_bytes_are_pinned`), and a
/// change of it raises [`PROTOCOL`]. During an upgrade that raises it, the merchants held by nodes on the
/// other protocol answer `503` until every node runs the new build. A message or answer added at the end of
/// its enum changes no earlier bytes and keeps the protocol: a node of an earlier build answers the new
/// message with an error, and only that message fails until the node is upgraded. Version 5 signs each message
/// instead of sending the secret ([`Forwarding`]): nodes of version 4 and 5 do not admit each other's.
pub const VERSION_HEADER: &str = "caisse-forward-version";
pub const PROTOCOL: &str = "caisse-forward/5";

/// The content type of forwarded messages and their answers.
pub const CONTENT_TYPE: &str = "application/x.caisse-forward+postcard";

/// The largest forwarded message: a command carries at most an API body's worth of text. The holder reads at
/// most this much before it checks the signature.
pub const MAX_BODY: usize = 256 * 1024;

/// The largest answer: one record. The largest, a payment with 50 metadata values and 50 refund reasons of 500
/// characters, each written as six bytes in the JSON of a stored answer (`\u0001`), is about 300 KiB.
pub const MAX_ANSWER: usize = 1024 * 1024;

/// How long a forwarded message may take, the holder's durable write included.
const TIMEOUT: Duration = Duration::from_secs(15);

/// What crosses to the holder of a merchant's shard: one message for the merchant's actor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Forwarded {
    pub merchant: MerchantId,
    pub ask: Ask,
}

/// The messages of the merchant actor that cross between nodes.
// Made once per forwarded request and moved, never stored in bulk: a box would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Ask {
    Execute {
        command: Command,
        idempotency: Option<Idempotency>,
        note: ProviderNote,
    },
    Payment(String),
    Payout(String),
    Link(String),
    Balances,
    /// The end of a request that held its idempotency key ([`crate::Part::FirstHeld`]).
    Release(IdempotencyKey),
    /// A notification of the merchant sent again (the dashboard's resend), by the node that delivers them: only
    /// it knows whether the notification is being attempted. Added last, so every earlier message keeps its
    /// bytes and the protocol its name: a node of a build without it answers that it cannot read it (an
    /// error), and the resend is refused with 503 until that node is upgraded; everything else forwards.
    Resend(String),
}

/// The holder's answer to an [`Ask`], by kind.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Answer {
    Executed(Executed),
    Payment(Option<Payment>),
    Payout(Option<Payout>),
    Link(Option<Link>),
    Balances(Balances),
    Released,
    Resent(Result<Notification, ResendRefused>),
}

/// Why the node that delivers a merchant's notifications did not send one again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResendRefused {
    /// It is being attempted right now.
    InFlight,
    /// The merchant has no notification of that id.
    NotFound,
}

/// How far a forwarded message's time may be from the receiver's clock, either way.
const SIGNED_WITHIN_MS: u64 = 60_000;

/// Signatures a node remembers to refuse a message sent twice; beyond it, those past [`SIGNED_WITHIN_MS`] go,
/// and should that not make room the message is refused (503 to its client, who retries).
const MAX_REMEMBERED: usize = 200_000;

/// The scheme of the `Authorization` header a forwarded message carries.
const SCHEME: &str = "Caisse-Forward ";

/// How this node reaches the others: the secret every node of the cluster shares.
///
/// The secret itself never travels: each message carries its time, a random nonce and an HMAC-SHA256 of
/// those and its body under a key derived from the secret. The receiver refuses a message signed more than a
/// minute from its own clock, or whose signature it has seen: one read off the network cannot be sent again,
/// and its signature signs nothing else.
#[derive(Clone)]
pub struct Forwarding {
    pub(crate) secret: Arc<str>,
    key: [u8; 32],
    seen: Arc<dashmap::DashMap<[u8; 32], u64>>,
}

impl Forwarding {
    pub fn new(secret: &str) -> Forwarding {
        let mut forwarding = Forwarding { secret: Arc::from(secret), key: [0; 32], seen: Arc::default() };
        forwarding.key = forwarding.derive_key("caisse-forward");
        forwarding
    }

    /// The HMAC of a message's time, nonce and body.
    fn mac(&self, at_ms: u64, nonce: &str, body: &[u8]) -> [u8; 32] {
        use hmac::{Hmac, Mac};
        let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(&self.key) else {
            // HMAC takes a key of any length; this branch cannot be taken.
            return [0; 32];
        };
        mac.update(at_ms.to_string().as_bytes());
        mac.update(b".");
        mac.update(nonce.as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().into()
    }

    /// The `Authorization` header of a message of `body` sent at `at_ms`.
    pub fn sign(&self, at_ms: u64, body: &[u8]) -> String {
        let nonce = hex::encode(rand::random::<[u8; 16]>());
        format!("{SCHEME}t={at_ms},n={nonce},sig={}", hex::encode(self.mac(at_ms, &nonce, body)))
    }

    /// Whether a header is one of ours, signed within a minute of `now_ms`: what the receiver checks before it
    /// reads the body.
    pub fn fresh(&self, authorization: Option<&str>, now_ms: u64) -> bool {
        parse_signed(authorization).is_some_and(|(at_ms, ..)| at_ms.abs_diff(now_ms) <= SIGNED_WITHIN_MS)
    }

    /// True when `authorization` signs `body` under the cluster's secret, within a minute of `now_ms`, and was not
    /// seen before. The signature is compared in constant time.
    pub fn admits(&self, authorization: Option<&str>, body: &[u8], now_ms: u64) -> bool {
        use subtle::ConstantTimeEq;
        let Some((at_ms, nonce, sig)) = parse_signed(authorization) else { return false };
        if at_ms.abs_diff(now_ms) > SIGNED_WITHIN_MS {
            return false;
        }
        let expected = self.mac(at_ms, nonce, body);
        if !bool::from(expected.as_slice().ct_eq(&sig)) {
            return false;
        }
        if self.seen.len() >= MAX_REMEMBERED {
            self.seen.retain(|_, at| at.abs_diff(now_ms) <= SIGNED_WITHIN_MS);
            if self.seen.len() >= MAX_REMEMBERED {
                tracing::warn!("too many forwarded messages remembered; one refused");
                return false;
            }
        }
        match self.seen.entry(expected) {
            dashmap::mapref::entry::Entry::Occupied(_) => {
                tracing::warn!("a forwarded message was sent again; refused");
                false
            }
            dashmap::mapref::entry::Entry::Vacant(slot) => {
                slot.insert(at_ms);
                true
            }
        }
    }

    /// A key for `purpose` that every node of the cluster derives alike (HMAC-SHA256 of the purpose under the
    /// cluster's secret): what one node signs, another checks (the payment page's forms).
    pub fn derive_key(&self, purpose: &str) -> [u8; 32] {
        use hmac::{Hmac, Mac};
        let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(self.secret.as_bytes()) else {
            // HMAC takes a key of any length; this branch cannot be taken.
            return [0; 32];
        };
        mac.update(purpose.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// Sends `forwarded` to the node at `url` and returns its answer.
    pub(crate) async fn send(&self, url: &str, forwarded: &Forwarded) -> Result<Answer, EngineError> {
        let unavailable = |what: String| EngineError::Unavailable(format!("the merchant's node at {url}: {what}"));
        // A change that may have reached the holder may be made there whatever becomes of its answer: the
        // caller must not hear that nothing changed. A read is only unanswered.
        let changes = matches!(forwarded.ask, Ask::Execute { .. });
        let unanswered = |what: String| match changes {
            true => EngineError::OutcomeUnknown(format!("the merchant's node at {url}: {what}")),
            false => unavailable(what),
        };
        let body = postcard::to_allocvec(forwarded).map_err(|e| EngineError::Internal(format!("encode: {e}")))?;
        let client = CLIENT.with(Clone::clone);
        let mut response = client
            .post(format!("{}{FORWARD_PATH}", url.trim_end_matches('/')))
            .insert_header(("authorization", self.sign(crate::domain::time::Timestamp::now().unix_ms(), &body)))
            .insert_header(("content-type", CONTENT_TYPE))
            .insert_header((VERSION_HEADER, PROTOCOL))
            .send_body(body)
            .await
            .map_err(|e| match e {
                // awc's name for a connection that closed after the whole request went out, before the answer
                // (a holder that died while it ran the change): the change may have been made.
                SendRequestError::Connect(ConnectError::Disconnected) => unanswered(e.to_string()),
                // No connection, so nothing was sent.
                SendRequestError::Url(_) | SendRequestError::Connect(_) => unavailable(e.to_string()),
                e => unanswered(e.to_string()),
            })?;
        // The holder answers every message it runs with 200, its errors inside: any other status refused it.
        if !response.status().is_success() {
            return Err(unavailable(format!("answered {}", response.status())));
        }
        // awc's time-out stops at the headers: the body gets its own.
        let bytes = tokio::time::timeout(TIMEOUT, response.body().limit(MAX_ANSWER))
            .await
            .map_err(|_| unanswered("its answer did not arrive in time".into()))?
            .map_err(|e| unanswered(e.to_string()))?;
        // An answer that does not read may be that of a change the holder made: the client hears so, and retries
        // with its idempotency key, rather than a bare internal error.
        let answer: Result<Answer, EngineError> =
            postcard::from_bytes(&bytes).map_err(|e| unanswered(format!("its answer does not read: {e}")))?;
        answer
    }
}

/// A forwarded message's `Authorization` header read: its time, nonce and signature.
fn parse_signed(authorization: Option<&str>) -> Option<(u64, &str, [u8; 32])> {
    let fields = authorization?.strip_prefix(SCHEME)?;
    let mut parts = fields.split(',');
    let at_ms = parts.next()?.strip_prefix("t=")?.parse().ok()?;
    let nonce = parts.next()?.strip_prefix("n=")?;
    let sig = hex::decode(parts.next()?.strip_prefix("sig=")?).ok()?.try_into().ok()?;
    match (parts.next(), nonce.len() == 32 && nonce.bytes().all(|b| b.is_ascii_hexdigit())) {
        (None, true) => Some((at_ms, nonce, sig)),
        _ => None,
    }
}

thread_local! {
    // awc is not Send: one client per thread, like the provider adapters'.
    static CLIENT: awc::Client = client();
}

fn client() -> awc::Client {
    crate::outbound::client(TIMEOUT, "forwarding")
}

/// A dashboard session as the nodes of a cluster share it: a session opened on one node is valid on all, and
/// one ended on any (a logout, a suspension) is ended on all. Keyed by the SHA-256 of the session's id, so the
/// database never holds a usable cookie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedSession {
    pub merchant: MerchantId,
    pub csrf: String,
    pub created_ms: u64,
    pub last_seen_ms: u64,
}

/// Where the nodes of a cluster keep their dashboard sessions, and the login attempts counted against each
/// address and account: attempts spread over the nodes meet the limits one node alone would set.
pub trait SharedSessions: Send + Sync {
    /// Stores a new session, first deleting those idle since before `idle_before` or made before
    /// `made_before`, and the merchant's least recently used ones beyond `per_merchant - 1`.
    fn put(
        &self,
        digest: [u8; 32],
        session: &SharedSession,
        per_merchant: usize,
        idle_before: u64,
        made_before: u64,
    ) -> Result<(), StoreError>;
    fn get(&self, digest: [u8; 32]) -> Result<Option<SharedSession>, StoreError>;
    /// Records activity at `at_ms`.
    fn touch(&self, digest: [u8; 32], at_ms: u64) -> Result<(), StoreError>;
    fn remove(&self, digest: [u8; 32]) -> Result<(), StoreError>;
    fn remove_merchant(&self, merchant: &MerchantId) -> Result<(), StoreError>;
    fn count(&self) -> Result<u64, StoreError>;
    /// Counts an attempt on `key` of the counter `kind`, in one step with the check that fewer than `max`
    /// were counted in its current window of `window_ms` (a window starts at its first attempt, on the
    /// database's clock). `None` when counted; otherwise the milliseconds left before the window ends.
    fn reserve_attempt(&self, kind: u8, key: [u8; 32], max: u32, window_ms: u64) -> Result<Option<u64>, StoreError>;
    /// The milliseconds `key` must still wait when it has used up its attempts; counts nothing.
    fn attempts_locked(&self, kind: u8, key: [u8; 32], max: u32, window_ms: u64) -> Result<Option<u64>, StoreError>;
    /// Gives one counted attempt back.
    fn forgive_attempt(&self, kind: u8, key: [u8; 32]) -> Result<(), StoreError>;
    /// Forgets every attempt counted on `key`.
    fn clear_attempts(&self, kind: u8, key: [u8; 32]) -> Result<(), StoreError>;
}

/// A message of the merchant actor that can be forwarded, and how its answer comes back.
pub(crate) trait Remote<T> {
    /// The message as it crosses; `None` for one only the holder itself sends (a sweep's).
    fn ask(&self) -> Option<Ask>;
    /// The answer as this message's result; `None` when the holder answered another kind.
    fn take(answer: Answer) -> Option<T>;
}

impl Remote<Executed> for crate::merchant::Execute {
    fn ask(&self) -> Option<Ask> {
        Some(Ask::Execute {
            command: self.command.clone(),
            idempotency: self.idempotency.clone(),
            note: self.note.clone(),
        })
    }
    fn take(answer: Answer) -> Option<Executed> {
        match answer {
            Answer::Executed(executed) => Some(executed),
            _ => None,
        }
    }
}

impl Remote<Option<Payment>> for crate::merchant::GetPayment {
    fn ask(&self) -> Option<Ask> {
        Some(Ask::Payment(self.0.clone()))
    }
    fn take(answer: Answer) -> Option<Option<Payment>> {
        match answer {
            Answer::Payment(payment) => Some(payment),
            _ => None,
        }
    }
}

impl Remote<Option<Payout>> for crate::merchant::GetPayout {
    fn ask(&self) -> Option<Ask> {
        Some(Ask::Payout(self.0.clone()))
    }
    fn take(answer: Answer) -> Option<Option<Payout>> {
        match answer {
            Answer::Payout(payout) => Some(payout),
            _ => None,
        }
    }
}

impl Remote<Option<Link>> for crate::merchant::GetLink {
    fn ask(&self) -> Option<Ask> {
        Some(Ask::Link(self.0.clone()))
    }
    fn take(answer: Answer) -> Option<Option<Link>> {
        match answer {
            Answer::Link(link) => Some(link),
            _ => None,
        }
    }
}

impl Remote<Balances> for crate::merchant::GetBalances {
    fn ask(&self) -> Option<Ask> {
        Some(Ask::Balances)
    }
    fn take(answer: Answer) -> Option<Balances> {
        match answer {
            Answer::Balances(balances) => Some(balances),
            _ => None,
        }
    }
}

impl Remote<()> for crate::merchant::ReleaseKey {
    fn ask(&self) -> Option<Ask> {
        Some(Ask::Release(self.0.clone()))
    }
    fn take(answer: Answer) -> Option<()> {
        match answer {
            Answer::Released => Some(()),
            _ => None,
        }
    }
}

/// The sweeps' deletions run on the holder only: each node sweeps the merchants it holds.
impl Remote<usize> for crate::merchant::ForgetIdempotency {
    fn ask(&self) -> Option<Ask> {
        None
    }
    fn take(_: Answer) -> Option<usize> {
        None
    }
}

#[cfg(test)]
mod format;

#[cfg(test)]
mod signing {
    use super::*;

    /// A message is admitted once, signed by a node of the same cluster, within the minute, for the body it
    /// came with; the secret never crosses.
    #[test]
    fn a_forwarded_message_is_admitted_once_for_its_body_and_time() {
        let (ours, theirs) = (Forwarding::new("a-cluster-secret"), Forwarding::new("another-cluster"));
        let now = 1_800_000_000_000;
        let header = ours.sign(now, b"body");
        assert!(!header.contains("a-cluster-secret"));
        assert!(ours.fresh(Some(&header), now + 59_000));
        assert!(!ours.admits(Some(&header), b"other body", now), "signs its own body only");
        assert!(!ours.admits(Some(&header), b"body", now + 61_000), "a minute late");
        assert!(!theirs.admits(Some(&header), b"body", now), "another cluster's key");
        assert!(ours.admits(Some(&header), b"body", now));
        assert!(!ours.admits(Some(&header), b"body", now), "sent again");
        assert!(ours.admits(Some(&ours.sign(now, b"body")), b"body", now), "the same body signed anew");
        let tampered = header.replace("sig=", "sig=00").chars().take(header.len()).collect::<String>();
        assert!(!ours.admits(Some(&tampered), b"body", now));
        for refused in ["Bearer a-cluster-secret", "", "Caisse-Forward t=1", "Caisse-Forward t=x,n=y,sig=z"] {
            assert!(!ours.fresh(Some(refused), now) && !ours.admits(Some(refused), b"body", now), "{refused}");
        }
        assert!(!ours.admits(None, b"body", now));
    }
}
