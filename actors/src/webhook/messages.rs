//! The messages between the dispatcher, the delivery actors and the pool's handle. They sit below all three so
//! that each actor names the messages it takes, not the actor that sends them.

use actix::prelude::*;

use super::config::DeliveryError;
use crate::domain::ids::MerchantId;
use crate::domain::records::Notification;

#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Fresh(pub(super) Notification);

/// A notification for a delivery actor to attempt. `as_committed`: the copy is the one the store's feed
/// gave when its change became durable, and nothing has touched the notification since, so the actor may
/// attempt it without reading it back; otherwise it reads the stored version first.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Deliver {
    pub(super) n: Notification,
    pub(super) as_committed: bool,
}

/// The attempt on `0` is persisted (or given up); the dispatcher may schedule it again.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Settled(pub(super) String);

#[derive(Message)]
#[rtype(result = "Result<Notification, DeliveryError>")]
pub(super) struct Resend {
    pub(super) merchant: MerchantId,
    pub(super) id: String,
}

#[derive(Message)]
#[rtype(result = "usize")]
pub(super) struct InFlightCount;

/// The dispatcher's next step of a pass deleting delivered notifications past their retention.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct ForgetStep;
