//! The audit role: whether the stored balances agree with the ledger, whether writes succeed, and a
//! consistent copy of the whole store.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use crate::store::{AuditReport, AuditScope, BackupReport, StoreError};

/// Checks of the whole store.
pub trait Audit: Send + Sync {
    /// Recomputes every balance from the whole ledger and checks every invariant, the audit checkpoints
    /// included; an error names what disagrees. Once everything agrees, each merchant's checkpoint moves to the
    /// last event replayed. Its time grows with the ledger: run it on demand or in the background.
    fn audit(&self) -> Result<AuditReport, StoreError> {
        self.audit_until(AuditScope::Full, &AtomicBool::new(false))
    }
    /// The same checks from each merchant's audit checkpoint (the balances a passed audit found at an event)
    /// instead of from its first event, then the checkpoints move forward: the audit at start, whose time
    /// grows with what was written since the last audit, not with the ledger. A ledger event changed before
    /// its checkpoint goes unseen here; [`Audit::audit`] finds it.
    fn audit_since_checkpoints(&self) -> Result<AuditReport, StoreError> {
        self.audit_until(AuditScope::SinceCheckpoints, &AtomicBool::new(false))
    }
    /// The audit of `scope`, given up with [`StoreError::Closed`] once `stop` is set (checked between
    /// merchants), so that a server stopping does not wait for a long audit. A checkpoint that cannot be
    /// written does not fail the audit: the report says so in `checkpoint_error`.
    fn audit_until(&self, scope: AuditScope, stop: &AtomicBool) -> Result<AuditReport, StoreError>;
    /// True when a durable write currently succeeds.
    fn healthy(&self) -> bool;
    /// Writes a consistent copy of the store, as of one moment, into `to` (absent or empty), durably; a store
    /// opened there is this one as of that moment. Blocks: call it off any async runtime.
    fn backup(&self, to: &Path) -> Result<BackupReport, StoreError>;
}
