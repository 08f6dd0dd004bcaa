//! The audit role: whether the stored balances agree with the ledger, and whether writes succeed.

use crate::store::{AuditReport, StoreError};

/// Checks of the whole store.
pub trait Audit: Send + Sync {
    /// Recomputes every balance from the ledger and checks every invariant; an error names what disagrees.
    fn audit(&self) -> Result<AuditReport, StoreError>;
    /// True when a durable write currently succeeds.
    fn healthy(&self) -> bool;
}
