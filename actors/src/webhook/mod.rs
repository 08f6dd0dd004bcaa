//! Webhooks: how Caisse tells merchants what happened.
//!
//! - [`signature`]: signing (docs/api.md § Webhook signature) and the verification function merchants can use.
//! - [`schedule`]: the retry schedule and the delivery state machine, pure.
//! - [`url`]: which webhook URLs are allowed (docs/api.md § Webhook delivery), checked when set and again at delivery.
//! - [`config`]: the delivery pool's settings and errors; `messages`: what its actors tell each other.
//! - [`delivery`]: the delivery pool's handle; `dispatcher` decides what is attempted when, `worker` holds
//!   the supervised delivery actors (awc over rustls) that make the attempts.
//!
//! A notification is written in the same durable transaction as the change that causes it. The store hands
//! it to the dispatcher once durable; the dispatcher also scans the due index, so nothing waits on memory:
//! after a crash, everything still due is found again and delivered.

pub mod config;
pub mod delivery;
mod dispatcher;
mod messages;
pub mod schedule;
pub mod signature;
pub mod url;
mod worker;

pub(crate) use messages::Resend;
pub use signature::{
    sign, sign_standard, standard_secret, verify, verify_standard, VerifyError, SIGNATURE_HEADER, STANDARD_ID_HEADER,
    STANDARD_SIGNATURE_HEADER, STANDARD_TIMESTAMP_HEADER, TIMESTAMP_HEADER,
};
