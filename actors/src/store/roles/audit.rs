//! The audit role: whether the stored balances agree with the ledger, whether writes succeed, and a
//! consistent copy of the whole store.

use std::path::Path;

use crate::store::{AuditReport, BackupReport, StoreError};

/// Checks of the whole store.
pub trait Audit: Send + Sync {
    /// Recomputes every balance from the ledger and checks every invariant; an error names what disagrees.
    fn audit(&self) -> Result<AuditReport, StoreError>;
    /// True when a durable write currently succeeds.
    fn healthy(&self) -> bool;
    /// Writes a consistent copy of the store, as of one moment, into `to` (absent or empty), durably; a store
    /// opened there is this one as of that moment. Blocks: call it off any async runtime.
    fn backup(&self, to: &Path) -> Result<BackupReport, StoreError>;
}
