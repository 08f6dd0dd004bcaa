//! The outbox role: webhook notifications, from the change that makes them to their last attempt.

use crate::domain::ids::MerchantId;
use crate::domain::records::Notification;
use crate::domain::time::Timestamp;
use crate::store::{Page, StoreError, Ticket};

/// Notifications: made by commits, read and updated by the webhook delivery pool and the dashboard.
pub trait Outbox: Send + Sync {
    /// Notifications as they become durable, for the webhook dispatcher; the first caller takes it.
    fn outbox_feed(&self) -> Option<tokio::sync::mpsc::Receiver<Notification>>;
    /// Persists a notification after an attempt or a resend (`before` is what the caller read), moving its
    /// entry in the due index.
    fn save_notification(&self, before: &Notification, after: &Notification) -> Result<Ticket, StoreError>;
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
    /// Notifications whose next attempt is due at or before `now`, oldest first, passing over the ids
    /// `skip` says yes to (those already being delivered) without counting them against `limit`.
    fn due_notifications_skipping(
        &self,
        now: Timestamp,
        limit: usize,
        skip: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Vec<Notification>, StoreError>;
    /// Notifications whose next attempt is due at or before `now`, oldest first.
    fn due_notifications(&self, now: Timestamp, limit: usize) -> Result<Vec<Notification>, StoreError> {
        self.due_notifications_skipping(now, limit, &mut |_| false)
    }
}
