//! The messages between the dispatcher, the delivery actors and the pool's handle. They sit below all three so
//! that each actor names the messages it takes, not the actor that sends them.

use actix::prelude::*;

use super::config::DeliveryError;
use crate::domain::ids::MerchantId;
use crate::domain::records::Notification;

#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Fresh(pub(super) Notification);

#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct Deliver(pub(super) Notification);

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
