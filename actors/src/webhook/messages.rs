//! The messages between the dispatcher, the delivery actors and the pool's handle. They sit below all three so
//! that each actor names the messages it takes, not the actor that sends them.

use actix::prelude::*;

use super::config::DeliveryError;
use crate::domain::ids::MerchantId;
use crate::domain::records::Notification;
use crate::store::Fence;

#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Fresh(pub(super) Notification);

/// The store's feed was full: its writer, which never waits for the dispatcher, may have left notifications
/// out of it. They are in the due index, maybe behind where scans start.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct FeedOverflowed;

/// A notification for a delivery actor to attempt, and where its copy comes from.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Deliver {
    pub(super) n: Notification,
    pub(super) from: Provenance,
}

/// Where a copy handed to a delivery actor comes from, which says whether it may be attempted as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Provenance {
    /// A scan or a resend: the stored version is read first.
    Stored,
    /// The store's feed, as its change became durable, with the fence this node held the merchant under when
    /// the copy came (`None` with one process). Nothing touched the notification before its first attempt
    /// as long as the node still holds the merchant under that fence, and the copy is attempted as it is.
    Feed(Option<Fence>),
}

/// The attempt on `id` is persisted (or given up); the dispatcher may schedule it again. `waits` says where
/// the notification now waits in the due index, since that may be behind where scans start.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Settled {
    pub(super) id: String,
    pub(super) waits: Waits,
}

/// Where a settled notification waits in the due index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waits {
    /// Nowhere this node's scans need to look: delivered, given up, due later than now, or another node's.
    No,
    /// Nothing was saved for it (an attempt not made, or whose outcome's save failed): it waits under the time
    /// it was handed over with.
    AsBefore,
    /// Its failed attempt was saved with its next attempt at this time (ms since the epoch), which may already
    /// be past: the retry's wait counts from when the attempt began, and an attempt can take 10 s.
    At(u64),
}
/// A notification sent again, starting a new attempt chain (the dashboard's resend).
#[derive(Message)]
#[rtype(result = "Result<Notification, DeliveryError>")]
pub struct Resend {
    pub(super) merchant: MerchantId,
    pub(super) id: String,
}

impl Resend {
    pub(crate) fn new(merchant: &MerchantId, id: &str) -> Resend {
        Resend { merchant: merchant.clone(), id: id.to_owned() }
    }
}

#[derive(Message)]
#[rtype(result = "usize")]
pub(super) struct InFlightCount;

/// The dispatcher's next step of a pass deleting delivered notifications past their retention.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct ForgetStep;
