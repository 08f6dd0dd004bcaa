//! Merchant accounts: the record under its id, and the two lookup trees (secret-key hash, e-mail) that
//! find it.

use std::ops::Bound;

use super::KvStore;
use crate::domain::ids::MerchantId;
use crate::domain::records::Merchant;
use crate::domain::time::Timestamp;
use crate::store::kv::Kv;
use crate::store::op::Op;
use crate::store::sealing;
use crate::store::{AccountLock, Accounts, StoreError, Ticket};

// The layout's trees, keys and encodings are this file's vocabulary.
use crate::store::layout::*;

impl<K: Kv> KvStore<K> {
    /// A merchant record with its secret key opened.
    fn read_merchant(&self, id: &[u8]) -> Result<Option<Merchant>, StoreError> {
        self.get::<Merchant>(MERCHANTS, id)?.map(|m| self.opened(m)).transpose()
    }

    /// The record as stored: its key sealed when a master key is set (its lookup entry is the key's hash).
    fn sealed(&self, merchant: &Merchant) -> Result<Merchant, StoreError> {
        let mut stored = merchant.clone();
        if let Some(key) = &self.master_key {
            stored.secret_key = key.seal(&merchant.id, &merchant.secret_key)?;
        }
        Ok(stored)
    }

    fn opened(&self, mut merchant: Merchant) -> Result<Merchant, StoreError> {
        merchant.secret_key = sealing::open(self.master_key.as_ref(), &merchant.id, &merchant.secret_key)?;
        Ok(merchant)
    }
}

impl<K: Kv> Accounts for KvStore<K> {
    fn put_merchant(&self, merchant: Merchant, previous_key: Option<String>) -> Result<Ticket, StoreError> {
        let email = merchant.email.to_lowercase();
        if let Some(owner) = self.raw(MERCHANT_EMAILS, email.as_bytes())? {
            if owner.as_ref() != merchant.id.as_bytes() {
                return Err(StoreError::EmailTaken(email));
            }
        }
        let stored = self.sealed(&merchant)?;
        let mut ops = vec![
            Op::Insert(MERCHANTS, merchant.id.as_bytes().to_vec(), encode(&stored)?),
            Op::Insert(MERCHANT_KEYS, key_hash(&merchant.secret_key), merchant.id.as_bytes().to_vec()),
            Op::Insert(MERCHANT_EMAILS, email.into_bytes(), merchant.id.as_bytes().to_vec()),
        ];
        if let Some(old) = previous_key.filter(|old| *old != merchant.secret_key) {
            ops.push(Op::Remove(MERCHANT_KEYS, key_hash(&old)));
        }
        self.submit(ops, None, Vec::new())
    }

    fn put_merchant_keeping(
        &self,
        merchant: Merchant,
        previous_key: String,
        until: Timestamp,
    ) -> Result<Ticket, StoreError> {
        let stored = self.sealed(&merchant)?;
        // The e-mail is the merchant's own (a roll changes nothing else), so no conflict check is needed.
        let ops = vec![
            Op::Insert(MERCHANTS, merchant.id.as_bytes().to_vec(), encode(&stored)?),
            Op::Insert(MERCHANT_KEYS, key_hash(&merchant.secret_key), merchant.id.as_bytes().to_vec()),
            Op::Insert(RETIRED_KEYS, key_hash(&previous_key), encode(&until)?),
        ];
        self.submit(ops, None, Vec::new())
    }

    fn retired_key_until(&self, secret_key: &str) -> Result<Option<Timestamp>, StoreError> {
        self.get(RETIRED_KEYS, &key_hash(secret_key))
    }

    fn lock_account(&self, id: &MerchantId) -> Result<AccountLock, StoreError> {
        self.kv.lock_account(id)
    }

    fn merchant(&self, id: &MerchantId) -> Result<Option<Merchant>, StoreError> {
        self.read_merchant(id.as_bytes())
    }

    fn merchants_generation(&self) -> u64 {
        // Each count only grows, so their sum moves whenever any of them does.
        [MERCHANTS, MERCHANT_KEYS, RETIRED_KEYS, MERCHANT_SUSPENSIONS]
            .into_iter()
            .fold(0u64, |sum, tree| sum.wrapping_add(self.kv.generation(tree)))
    }

    fn merchant_by_key(&self, secret_key: &str) -> Result<Option<Merchant>, StoreError> {
        // Looked up by hash, so the lookup's timing says nothing about the key; the caller then compares the
        // whole key in constant time.
        let Some(id) = self.raw(MERCHANT_KEYS, &key_hash(secret_key))? else {
            return Ok(None);
        };
        self.read_merchant(&id)
    }

    fn merchant_by_email(&self, email: &str) -> Result<Option<Merchant>, StoreError> {
        let key = email.to_lowercase();
        let Some(id) = self.raw(MERCHANT_EMAILS, key.as_bytes())? else {
            return Ok(None);
        };
        self.read_merchant(&id)
    }

    fn merchant_count(&self) -> Result<u64, StoreError> {
        self.kv.count(MERCHANTS)
    }

    fn merchants(&self, before: Option<&MerchantId>, limit: usize) -> Result<Vec<Merchant>, StoreError> {
        let end = match before {
            Some(id) => Bound::Excluded(id.as_bytes()),
            None => Bound::Unbounded,
        };
        let mut merchants = Vec::with_capacity(limit.min(100));
        for item in self.scan(MERCHANTS, Bound::Unbounded, end, true)?.take(limit) {
            let (_, value) = item?;
            merchants.push(self.opened(decode(TREE_NAMES[MERCHANTS], &value)?)?);
        }
        Ok(merchants)
    }

    fn set_suspended(&self, id: &MerchantId, at: Option<Timestamp>) -> Result<Ticket, StoreError> {
        let key = id.as_bytes().to_vec();
        let op = match at {
            Some(at) => Op::Insert(MERCHANT_SUSPENSIONS, key, encode(&at)?),
            None => Op::Remove(MERCHANT_SUSPENSIONS, key),
        };
        self.submit(vec![op], None, Vec::new())
    }

    fn suspended_since(&self, id: &MerchantId) -> Result<Option<Timestamp>, StoreError> {
        self.get(MERCHANT_SUSPENSIONS, id.as_bytes())
    }
}
