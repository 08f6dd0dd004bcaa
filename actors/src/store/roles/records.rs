//! The read role: records, references, idempotency records, paged lists and the journal.

use crate::core::JournalEvent;
use crate::domain::ids::MerchantId;
use crate::domain::links::Link;
use crate::domain::provider::{ProviderRoute, ProviderTrail};
use crate::domain::records::{Payment, Payout, Transaction, TransactionType};
use crate::domain::text::IdempotencyKey;
use crate::domain::time::Timestamp;
use crate::store::{AwaitingProvider, IdempotencyRecord, Located, Page, StoreError};

/// Reads of durable records. A read that spans several kinds of data may find one change partly visible for
/// a moment, but never an index entry that leads to nothing.
pub trait Records: Send + Sync {
    fn payment(&self, merchant: &MerchantId, reference: &str) -> Result<Option<Payment>, StoreError>;
    fn payout(&self, merchant: &MerchantId, id: &str) -> Result<Option<Payout>, StoreError>;
    /// A payment reference, refund reference or payout id of this merchant.
    fn locate(&self, merchant: &MerchantId, reference: &str) -> Result<Option<Located>, StoreError>;
    /// The merchant and reference behind a transaction id, for provider notices that carry only our id.
    fn owner_of_transaction(&self, transaction_id: &str) -> Result<Option<(MerchantId, Located)>, StoreError>;
    fn idempotency(&self, merchant: &MerchantId, key: &IdempotencyKey)
        -> Result<Option<IdempotencyRecord>, StoreError>;
    /// This merchant's idempotency keys whose records were made before `before`, oldest first, at most `limit`,
    /// each with when its record was made (from the index by time: a key used again since has a newer record,
    /// which the caller reads).
    fn idempotency_made_before(
        &self,
        merchant: &MerchantId,
        before: Timestamp,
        limit: usize,
    ) -> Result<Vec<(IdempotencyKey, Timestamp)>, StoreError>;
    /// The first merchant after `after` (in id order) with idempotency records, to walk every merchant's.
    fn next_merchant_with_idempotency(&self, after: Option<&MerchantId>) -> Result<Option<MerchantId>, StoreError>;
    /// This merchant's transactions, newest first, from after `cursor` (a transaction id), at most `limit`
    /// of those `keep` says yes to.
    fn transactions(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Transaction) -> bool,
    ) -> Result<Page<Transaction>, StoreError>;
    /// This merchant's payouts, newest first, from after `cursor` (a payout id).
    fn payouts(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Payout) -> bool,
    ) -> Result<Page<Payout>, StoreError>;
    /// What of `kind` still waits for a provider and was created before `created_before`, oldest first,
    /// starting after `after` (an item an earlier call returned) when given, so a caller can walk the whole
    /// list a page at a time.
    fn awaiting_provider(
        &self,
        kind: TransactionType,
        created_before: Timestamp,
        after: Option<&AwaitingProvider>,
        limit: usize,
    ) -> Result<Vec<AwaitingProvider>, StoreError>;
    /// What is kept about a transaction's provider side: its route and the provider's reference.
    fn provider_trail(&self, transaction_id: &str) -> Result<ProviderTrail, StoreError>;
    /// The route fixed at the transaction's creation, alone: one read fewer than [`Records::provider_trail`]
    /// on the paths that need only where to send the transaction's queries.
    fn route(&self, transaction_id: &str) -> Result<Option<ProviderRoute>, StoreError>;
    /// This merchant's link whose id or reference is `key`.
    fn link(&self, merchant: &MerchantId, key: &str) -> Result<Option<Link>, StoreError>;
    /// The merchant a link id belongs to, for the payment page, which knows only the id.
    fn link_owner(&self, link_id: &str) -> Result<Option<MerchantId>, StoreError>;
    /// This merchant's links, newest first, from after `cursor` (a link id), at most `limit` of those `keep`
    /// says yes to.
    fn links(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Link) -> bool,
    ) -> Result<Page<Link>, StoreError>;
    /// The payments made through a link, newest first, from after `cursor` (a payment's transaction id).
    fn link_payments(
        &self,
        merchant: &MerchantId,
        link_id: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<Payment>, StoreError>;
    /// This merchant's journal from position `from_seq`, in order, at most `limit` events.
    fn journal(&self, merchant: &MerchantId, from_seq: u64, limit: usize) -> Result<Vec<JournalEvent>, StoreError>;
}
