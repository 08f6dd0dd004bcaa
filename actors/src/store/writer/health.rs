//! The store's health: every log append sets the health flag, and while the store is unhealthy and idle a
//! probe tests the disk, so health comes back when the disk does.

use std::sync::atomic::Ordering;

use super::thread::WriterThread;
use crate::store::wal::AppendError;
use crate::store::StoreError;

/// What the probe of an unhealthy disk writes: more than most batches, so that health does not come back
/// while a real batch would still be refused.
const PROBE_BYTES: usize = 1024 * 1024;

impl WriterThread {
    /// Appends `self.buffer` to the log and keeps the health flag in step with the outcome.
    pub(super) fn append(&mut self) -> Result<(), StoreError> {
        match self.wal.append(&self.buffer) {
            Ok(()) => {
                self.healthy.store(true, Ordering::Release);
                Ok(())
            }
            Err(AppendError::Refused(err)) => {
                self.healthy.store(false, Ordering::Release);
                Err(err)
            }
            Err(AppendError::Broken(err)) => {
                self.healthy.store(false, Ordering::Release);
                self.broken = Some(err.clone());
                Err(err)
            }
        }
    }

    /// While unhealthy and idle, a probe tests the disk, so health returns without waiting for a write.
    pub(super) fn idle(&mut self) {
        if self.broken.is_some() || self.healthy.load(Ordering::Acquire) {
            return;
        }
        match self.wal.probe(PROBE_BYTES.max(self.buffer.len())) {
            Ok(()) => {
                self.healthy.store(true, Ordering::Release);
                tracing::info!("the store accepts writes again");
            }
            Err(AppendError::Refused(_)) => {}
            Err(AppendError::Broken(err)) => {
                tracing::error!(error = %err, "the store stopped writing until a restart replays the log");
                self.broken = Some(err);
            }
        }
    }
}
