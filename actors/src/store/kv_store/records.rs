//! Reading records: point lookups by reference and by transaction id, idempotency records, the paged
//! lists read through indexes (transactions and payouts walk a merchant's transaction index newest first, what
//! still waits for a provider is a range of the `pending` tree), and a merchant's journal.

use std::ops::Bound;

use super::{KvStore, MAX_SCAN};
use crate::core::{JournalEvent, Record};
use crate::domain::ids::{MerchantId, MERCHANT_ID_LEN};
use crate::domain::links::Link;
use crate::domain::provider::{ProviderRoute, ProviderTrail};
use crate::domain::records::{Payment, Payout, Transaction, TransactionType};
use crate::domain::text::IdempotencyKey;
use crate::domain::time::Timestamp;
use crate::store::kv::Kv;
use crate::store::{AwaitingProvider, IdempotencyRecord, Located, Page, Records, StoreError};

// The layout's trees, keys and encodings are this file's vocabulary.
use crate::store::layout::*;
use crate::store::legacy::{decode_payment, decode_payout};

impl<K: Kv> KvStore<K> {
    pub(super) fn record(
        &self,
        merchant: &MerchantId,
        kind: TransactionType,
        owner: &str,
    ) -> Result<Option<Record>, StoreError> {
        Ok(match kind {
            TransactionType::Payout => self.payout(merchant, owner)?.map(Record::Payout),
            _ => self.payment(merchant, owner)?.map(Record::Payment),
        })
    }

    /// Walks a merchant's transaction index newest first, from before `cursor` (a `tx_` id), handing each
    /// entry's record to `take`, until `limit` items were taken or [`MAX_SCAN`] entries were looked at.
    /// Entries of another kind than `only` are passed over without reading their record. `has_more` says the
    /// index goes on; the cursor is the last entry looked at.
    fn scan_index<T>(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        only: Option<TransactionType>,
        take: &mut dyn FnMut(TransactionType, &str, Record) -> Option<T>,
    ) -> Result<Page<T>, StoreError> {
        let start = mkey(merchant, b"");
        let end = match cursor {
            Some(c) => mkey(merchant, c.strip_prefix("tx_").unwrap_or(c).as_bytes()),
            None => mkey(merchant, &[0xff]),
        };
        let mut data = Vec::with_capacity(limit.min(100));
        let mut has_more = false;
        let mut last_scanned = None;
        let range = self.scan(TX_INDEX, Bound::Included(&start), Bound::Excluded(&end), true)?;
        for (scanned, item) in range.enumerate() {
            let (key, ptr) = item?;
            if data.len() == limit || scanned == MAX_SCAN {
                has_more = true;
                break;
            }
            let (kind, owner, reference) = parse_pointer(&ptr)?;
            last_scanned = Some(format!("tx_{}", String::from_utf8_lossy(&key[MERCHANT_ID_LEN..])));
            if only.is_some_and(|wanted| wanted != kind) {
                continue;
            }
            if let Some(item) = self.record(merchant, kind, owner)?.and_then(|record| take(kind, reference, record)) {
                data.push(item);
            }
        }
        let next_cursor = if has_more { last_scanned } else { None };
        Ok(Page { data, has_more, next_cursor })
    }
}

impl<K: Kv> Records for KvStore<K> {
    fn payment(&self, merchant: &MerchantId, reference: &str) -> Result<Option<Payment>, StoreError> {
        match self.raw(PAYMENTS, &mkey(merchant, reference.as_bytes()))? {
            Some(bytes) => decode_payment(TREE_NAMES[PAYMENTS], &bytes).map(Some),
            None => Ok(None),
        }
    }

    fn payout(&self, merchant: &MerchantId, id: &str) -> Result<Option<Payout>, StoreError> {
        match self.raw(PAYOUTS, &mkey(merchant, id.as_bytes()))? {
            Some(bytes) => decode_payout(TREE_NAMES[PAYOUTS], &bytes).map(Some),
            None => Ok(None),
        }
    }

    fn locate(&self, merchant: &MerchantId, reference: &str) -> Result<Option<Located>, StoreError> {
        // References share one namespace per merchant: a refund's or a payout's is an entry in `refs`, a
        // payment's is the key of its record.
        let Some(ptr) = self.raw(REFS, &mkey(merchant, reference.as_bytes()))? else {
            let payment = self.payment(merchant, reference)?;
            return Ok(payment.map(|p| Located {
                kind: TransactionType::Payment,
                reference: reference.to_owned(),
                record: Record::Payment(p),
            }));
        };
        let (kind, owner, reference) = parse_pointer(&ptr)?;
        let record = self
            .record(merchant, kind, owner)?
            .ok_or_else(|| StoreError::Corrupt(format!("merchant {merchant}: {reference} points to nothing")))?;
        Ok(Some(Located { kind, reference: reference.to_owned(), record }))
    }

    fn owner_of_transaction(&self, transaction_id: &str) -> Result<Option<(MerchantId, Located)>, StoreError> {
        let Some(value) = self.raw(TX_OWNER, transaction_id.as_bytes())? else {
            return Ok(None);
        };
        let corrupt = || StoreError::Corrupt(format!("bad owner of {transaction_id}"));
        let (id, ptr) = value.split_at_checked(MERCHANT_ID_LEN).ok_or_else(corrupt)?;
        let merchant = MerchantId::parse(std::str::from_utf8(id).map_err(|_| corrupt())?).map_err(|_| corrupt())?;
        let (kind, owner, reference) = parse_pointer(ptr)?;
        let record = self.record(&merchant, kind, owner)?.ok_or_else(corrupt)?;
        Ok(Some((merchant, Located { kind, reference: reference.to_owned(), record })))
    }

    fn idempotency(
        &self,
        merchant: &MerchantId,
        key: &IdempotencyKey,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        self.get(IDEMPOTENCY, &mkey(merchant, key.as_str().as_bytes()))
    }

    fn idempotency_made_before(
        &self,
        merchant: &MerchantId,
        before: Timestamp,
        limit: usize,
    ) -> Result<Vec<(IdempotencyKey, Timestamp)>, StoreError> {
        let start = mkey(merchant, b"");
        let end = mkey(merchant, &before.unix_ms().to_be_bytes());
        let mut found = Vec::new();
        for item in self.scan(IDEMPOTENCY_TIMES, Bound::Included(&start), Bound::Excluded(&end), false)?.take(limit) {
            let (key, _) = item?;
            let corrupt = || StoreError::Corrupt("idempotency_times key".into());
            let rest = key.get(MERCHANT_ID_LEN..).ok_or_else(corrupt)?;
            let (at, text) = rest.split_at_checked(8).ok_or_else(corrupt)?;
            let at = u64::from_be_bytes(at.try_into().map_err(|_| corrupt())?);
            let text = std::str::from_utf8(text).map_err(|_| corrupt())?;
            let key =
                IdempotencyKey::parse(text).map_err(|e| StoreError::Corrupt(format!("idempotency_times: {e}")))?;
            found.push((key, Timestamp::from_unix_ms(at)));
        }
        Ok(found)
    }

    fn next_merchant_with_idempotency(&self, after: Option<&MerchantId>) -> Result<Option<MerchantId>, StoreError> {
        self.next_merchant(IDEMPOTENCY_TIMES, after)
    }

    fn transactions(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Transaction) -> bool,
    ) -> Result<Page<Transaction>, StoreError> {
        self.scan_index(merchant, cursor, limit, None, &mut |kind, reference, record| {
            let tx = match record {
                Record::Payout(o) => Transaction::of_payout(&o),
                Record::Payment(p) if kind == TransactionType::Refund => {
                    Transaction::of_refund(&p, p.refund_named(reference)?)
                }
                Record::Payment(p) => Transaction::of_payment(&p),
                Record::Link(_) => return None,
            };
            keep(&tx).then_some(tx)
        })
    }

    fn payouts(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Payout) -> bool,
    ) -> Result<Page<Payout>, StoreError> {
        // A payout `ret_X` is the transaction `tx_X`, so the payout list is the transaction index, filtered
        // while scanning so that a page holds `limit` matching payouts.
        let cursor = cursor.map(|c| c.replacen("ret_", "tx_", 1));
        let page =
            self.scan_index(merchant, cursor.as_deref(), limit, Some(TransactionType::Payout), &mut |_, _, record| {
                match record {
                    Record::Payout(o) if keep(&o) => Some(o),
                    _ => None,
                }
            })?;
        Ok(Page { next_cursor: page.next_cursor.map(|c| c.replacen("tx_", "ret_", 1)), ..page })
    }

    fn awaiting_provider(
        &self,
        kind: TransactionType,
        created_before: Timestamp,
        after: Option<&AwaitingProvider>,
        limit: usize,
    ) -> Result<Vec<AwaitingProvider>, StoreError> {
        // Just past `after`'s own key: the smallest key greater than it.
        let start = match after {
            Some(p) => {
                let mut key = pending_key(kind, p.created_at, &p.merchant, &p.owner);
                key.push(0);
                key
            }
            None => vec![kind.tag()],
        };
        let mut end = vec![kind.tag()];
        end.extend_from_slice(&created_before.unix_ms().to_be_bytes());
        let mut found = Vec::new();
        if start >= end {
            // `after` was created at or after the cutoff: nothing older is left past it.
            return Ok(found);
        }
        for item in self.scan(PENDING, Bound::Included(&start), Bound::Excluded(&end), false)?.take(limit) {
            let (key, _) = item?;
            let corrupt = || StoreError::Corrupt("bad pending key".into());
            let created = key.get(1..9).and_then(|b| <[u8; 8]>::try_from(b).ok()).ok_or_else(corrupt)?;
            let id = key.get(9..9 + MERCHANT_ID_LEN).ok_or_else(corrupt)?;
            let owner = key.get(9 + MERCHANT_ID_LEN..).ok_or_else(corrupt)?;
            let merchant = MerchantId::parse(std::str::from_utf8(id).map_err(|_| corrupt())?).map_err(|_| corrupt())?;
            found.push(AwaitingProvider {
                merchant,
                kind,
                owner: String::from_utf8(owner.to_vec()).map_err(|_| corrupt())?,
                created_at: Timestamp::from_unix_ms(u64::from_be_bytes(created)),
            });
        }
        Ok(found)
    }

    fn route(&self, transaction_id: &str) -> Result<Option<ProviderRoute>, StoreError> {
        self.get(ROUTES, transaction_id.as_bytes())
    }

    fn provider_trail(&self, transaction_id: &str) -> Result<ProviderTrail, StoreError> {
        Ok(ProviderTrail {
            route: self.get(ROUTES, transaction_id.as_bytes())?,
            reference: self.get(PROVIDER_REFERENCES, transaction_id.as_bytes())?,
        })
    }

    fn link(&self, merchant: &MerchantId, key: &str) -> Result<Option<Link>, StoreError> {
        if let Some(link) = self.get::<Link>(LINKS, &mkey(merchant, key.as_bytes()))? {
            return Ok(Some(link));
        }
        match self.raw(LINK_REFS, &mkey(merchant, key.as_bytes()))? {
            Some(id) => self.get(LINKS, &mkey(merchant, &id)),
            None => Ok(None),
        }
    }

    fn link_owner(&self, link_id: &str) -> Result<Option<MerchantId>, StoreError> {
        match self.raw(LINK_OWNERS, link_id.as_bytes())? {
            Some(bytes) => MerchantId::from_bytes(&bytes)
                .map(Some)
                .map_err(|_| StoreError::Corrupt(format!("bad owner of link {link_id}"))),
            None => Ok(None),
        }
    }

    fn links(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Link) -> bool,
    ) -> Result<Page<Link>, StoreError> {
        let start = mkey(merchant, b"");
        let end = match cursor {
            Some(c) => mkey(merchant, c.as_bytes()),
            None => mkey(merchant, &[0xff]),
        };
        let mut data = Vec::with_capacity(limit.min(100));
        let mut has_more = false;
        let mut last_scanned = None;
        for (scanned, item) in self.scan(LINKS, Bound::Included(&start), Bound::Excluded(&end), true)?.enumerate() {
            let (key, value) = item?;
            if data.len() == limit || scanned == MAX_SCAN {
                has_more = true;
                break;
            }
            last_scanned = Some(String::from_utf8_lossy(&key[MERCHANT_ID_LEN..]).into_owned());
            let link: Link = decode(TREE_NAMES[LINKS], &value)?;
            if keep(&link) {
                data.push(link);
            }
        }
        let next_cursor = if has_more { last_scanned } else { None };
        Ok(Page { data, has_more, next_cursor })
    }

    fn link_payments(
        &self,
        merchant: &MerchantId,
        link_id: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<Payment>, StoreError> {
        let start = mkey(merchant, link_id.as_bytes());
        let end = match cursor {
            Some(c) => link_payment_key(merchant, link_id, c),
            None => link_payment_key(merchant, link_id, "\u{7f}"),
        };
        let mut data = Vec::with_capacity(limit.min(100));
        let mut has_more = false;
        let mut last = None;
        for item in self.scan(LINK_PAYMENTS, Bound::Included(&start), Bound::Excluded(&end), true)? {
            let (key, reference) = item?;
            if data.len() == limit {
                has_more = true;
                break;
            }
            let reference = std::str::from_utf8(&reference)
                .map_err(|_| StoreError::Corrupt(format!("link {link_id}: a payment reference that is not text")))?;
            let Some(payment) = self.payment(merchant, reference)? else { continue };
            last = Some(format!("tx_{}", String::from_utf8_lossy(&key[start.len()..])));
            data.push(payment);
        }
        let next_cursor = if has_more { last } else { None };
        Ok(Page { data, has_more, next_cursor })
    }

    fn journal(&self, merchant: &MerchantId, from_seq: u64, limit: usize) -> Result<Vec<JournalEvent>, StoreError> {
        self.journal_after::<JournalEvent>(merchant, from_seq.saturating_sub(1)).take(limit).collect()
    }
}
