//! The outbox role: webhook notifications, from the change that makes them to their last attempt.

use crate::domain::ids::MerchantId;
use crate::domain::records::Notification;
use crate::domain::time::Timestamp;
use crate::store::{Fence, Page, StoreError, Ticket};

/// Notifications: made by commits, read and updated by the webhook delivery pool and the dashboard.
pub trait Outbox: Send + Sync {
    /// Notifications as they become durable, for the webhook dispatcher; the first caller takes it.
    fn outbox_feed(&self) -> Option<tokio::sync::mpsc::Receiver<Notification>>;
    /// Persists a notification after an attempt or a resend (`before` is what the caller read), moving its
    /// entry in the due index. With a `fence` ([`Outbox::delivery_fence`] when `before` was read), a store
    /// several nodes share refuses the save ([`StoreError::NotOwner`]) once the merchant's shard has been
    /// taken under another.
    fn save_notification(
        &self,
        before: &Notification,
        after: &Notification,
        fence: Option<Fence>,
    ) -> Result<Ticket, StoreError>;
    /// This merchant's notifications, newest first, from after `cursor` (a notification id).
    fn notifications(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Notification) -> bool,
    ) -> Result<Page<Notification>, StoreError>;
    /// A notification of this merchant (`None` for another merchant's id).
    fn notification(&self, merchant: &MerchantId, id: &str) -> Result<Option<Notification>, StoreError>;
    /// Notifications whose next attempt is due from `from` to `now`, oldest first, passing over the ids `skip`
    /// says yes to (those already being delivered) without counting them against `limit`; with the due time of
    /// the first entry this node still has in that range (see [`DueScan`]).
    fn due_notifications_skipping(
        &self,
        from: Timestamp,
        now: Timestamp,
        limit: usize,
        skip: &mut dyn FnMut(&str) -> bool,
    ) -> Result<DueScan, StoreError>;
    /// This merchant's notifications made before `before` (a notification's id carries when it was made), oldest
    /// first, from after `after` (a notification id) when given, at most `limit`.
    fn notifications_made_before(
        &self,
        merchant: &MerchantId,
        before: Timestamp,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Notification>, StoreError>;
    /// The first merchant after `after` (in id order) that has notifications, to walk every merchant's.
    fn next_merchant_with_notifications(&self, after: Option<&MerchantId>) -> Result<Option<MerchantId>, StoreError>;
    /// Deletes these notifications (as read), with any due entry they have, durably once the ticket completes.
    /// The caller decides they may go: the webhook dispatcher, which also makes resends, forgets only delivered
    /// notifications it is not delivering.
    fn forget_notifications(&self, notifications: &[Notification]) -> Result<Ticket, StoreError>;
    /// True when this process delivers the merchant's notifications: always with one process; in a cluster,
    /// the node that holds the merchant (the due scans already pass over the others').
    fn delivers_for(&self, _merchant: &MerchantId) -> bool {
        true
    }
    /// The fence under which this node holds the merchant's shard, in a store several nodes share (`None`
    /// with one process, or when the node does not hold it). A copy of a notification taken under one fence
    /// may be stale under another: the shard may have been with another node in between.
    fn delivery_fence(&self, _merchant: &MerchantId) -> Option<Fence> {
        None
    }
    /// Notifications whose next attempt is due at or before `now`, oldest first.
    fn due_notifications(&self, now: Timestamp, limit: usize) -> Result<Vec<Notification>, StoreError> {
        Ok(self.due_notifications_skipping(Timestamp::from_unix_ms(0), now, limit, &mut |_| false)?.due)
    }
}

/// What a scan of the due index found.
#[derive(Debug, Default)]
pub struct DueScan {
    /// The notifications to attempt.
    pub due: Vec<Notification>,
    /// The due time of the first entry of this node's merchants the scan met and did not skip, whether it is
    /// in `due` or lay beyond the limit: before it the range held only entries already deleted (which an LSM
    /// tree still walks until its compactions drop them), skipped ones and other nodes'. `None`: none at all.
    pub first_kept: Option<Timestamp>,
    /// Where the scan stopped after passing over its bound of other nodes' entries: the next one continues
    /// there, or a node with many of them due before its own would never reach its own.
    pub cut_at: Option<Timestamp>,
}
