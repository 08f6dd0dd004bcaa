//! The write role: how a merchant actor makes its decisions durable, and how it is rebuilt.

use crate::domain::ids::MerchantId;
use crate::domain::text::IdempotencyKey;
use crate::store::{
    Change, ExpiredIdempotency, FailureLatch, Fence, IdempotencyRecord, Placement, Recovered, StoreError, Ticket,
};

/// Writes of the merchant actors, and their recovery.
pub trait Commits: Send + Sync {
    /// Queues a change for the next group commit. Fails at once, changing nothing, when the queue is full or
    /// `guard` was set by an earlier failure. The ticket completes once the change is durable (Ok) or known
    /// not to be (Err); a backend that completes it earlier breaks the promise behind every 2xx answer.
    fn commit(&self, change: Change, guard: &FailureLatch) -> Result<Ticket, StoreError>;

    /// Writes a request's stored answer again, and nothing else: a later step of the request found its record
    /// already where the step would have taken it (a provider's notice got there first), so the request answers
    /// the record as it is, and a replay must answer the same. Queued behind the merchant's earlier writes, with
    /// the actor's guard and fence, as a change is.
    fn rewrite_answer(
        &self,
        merchant: &MerchantId,
        key: &IdempotencyKey,
        answer: &IdempotencyRecord,
        guard: &FailureLatch,
        fence: Option<Fence>,
    ) -> Result<Ticket, StoreError>;

    /// Deletes expired idempotency entries (and the records `ExpiredIdempotency::record` names) of this
    /// merchant in one durable write. Only the merchant's actor calls it: it knows no request with those keys
    /// is in progress, and its later writes queue behind this one. A failure here is not the actor's (what
    /// it deletes is past use), so it carries no failure latch.
    /// `fence` is the actor's ([`Change::fence`]): a node that lost the merchant must not delete a record the
    /// new holder made under a key used again.
    fn forget_idempotency(
        &self,
        merchant: &MerchantId,
        expired: &[ExpiredIdempotency],
        fence: Option<Fence>,
    ) -> Result<Ticket, StoreError>;

    /// Makes everything written durable in the backend's own files and stops writing (later writes are
    /// refused with [`StoreError::Closed`]), so that the next open has nothing to replay: a clean stop while
    /// other handles (the webhook actors, the sweeps) still hold the store. Blocks until done.
    fn close(&self) -> Result<(), StoreError>;

    /// A merchant's balances and journal position: its latest snapshot plus the journal after it, and the
    /// ownership the actor writes under in a store several nodes share ([`StoreError::NotOwner`] when this node
    /// may not write for the merchant).
    fn recover_merchant(&self, id: &MerchantId) -> Result<Recovered, StoreError>;

    /// Where the merchant's writes are made: here, on another node of a cluster, or nowhere for a moment.
    fn placement(&self, _merchant: &MerchantId) -> Placement {
        Placement::Here
    }

    /// The shard token this process holds the merchant with now (`None` with one process, or when another node
    /// holds it): an actor whose state was read under another token must not answer from it.
    fn fence_of(&self, _merchant: &MerchantId) -> Option<Fence> {
        None
    }

    /// A number that changes each time this node takes merchants over from another (a node of a cluster that
    /// died or gave them back), so that their pending work is picked up here. Never changes with one process.
    fn takeovers(&self) -> u64 {
        0
    }
}
