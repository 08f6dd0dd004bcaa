//! The accounts role: merchant accounts and their lookups.

use crate::domain::ids::MerchantId;
use crate::domain::records::Merchant;
use crate::domain::time::Timestamp;
use crate::store::{AccountLock, StoreError, Ticket};

/// Merchant accounts, written rarely (creation, key rotation) and read on every request.
pub trait Accounts: Send + Sync {
    /// Creates or updates a merchant account, durably once the ticket completes. `previous_key` is the secret
    /// key being replaced, whose lookup entry goes in the same write.
    fn put_merchant(&self, merchant: Merchant, previous_key: Option<String>) -> Result<Ticket, StoreError>;
    /// Writes a merchant whose key was rolled, keeping `previous_key` valid until `until` (its lookup entry
    /// stays, and a retirement entry says until when), in one durable write.
    fn put_merchant_keeping(
        &self,
        merchant: Merchant,
        previous_key: String,
        until: Timestamp,
    ) -> Result<Ticket, StoreError>;
    /// Until when a rolled key still authenticates; `None` for a key that was never rolled with a grace.
    fn retired_key_until(&self, secret_key: &str) -> Result<Option<Timestamp>, StoreError>;
    /// Waits until no other process is changing this merchant's account, and keeps them off until the lock
    /// is dropped: an account change reads the account, changes it and writes it back under this lock, so
    /// two changes made at the same moment on two nodes (a key roll and a webhook URL change) both survive.
    /// Blocks the calling thread, at most a bounded time.
    fn lock_account(&self, id: &MerchantId) -> Result<AccountLock, StoreError>;
    fn merchant(&self, id: &MerchantId) -> Result<Option<Merchant>, StoreError>;
    /// A number that changes after any merchant record, key, retired key or suspension changes, once the
    /// change is visible to reads: a cache of accounts read after seeing a number is current as long as the
    /// number stays the same.
    fn merchants_generation(&self) -> u64;
    /// The merchant holding this secret key. The caller still compares the whole key in constant time.
    fn merchant_by_key(&self, secret_key: &str) -> Result<Option<Merchant>, StoreError>;
    /// The merchant with this e-mail, compared without case.
    fn merchant_by_email(&self, email: &str) -> Result<Option<Merchant>, StoreError>;
    fn merchant_count(&self) -> Result<u64, StoreError>;
    /// Merchants newest first (ids sort by creation), from before `before` when given, at most `limit`.
    fn merchants(&self, before: Option<&MerchantId>, limit: usize) -> Result<Vec<Merchant>, StoreError>;
    /// Suspends a merchant from `at` (`Some`) or lifts its suspension (`None`), durably once the ticket completes.
    fn set_suspended(&self, id: &MerchantId, at: Option<Timestamp>) -> Result<Ticket, StoreError>;
    /// When the merchant was suspended; `None` while it is active.
    fn suspended_since(&self, id: &MerchantId) -> Result<Option<Timestamp>, StoreError>;
}
