//! The merchant accounts every API request looks up (by secret key, then whether the merchant is suspended),
//! kept in memory while the store's accounts have not changed.
//!
//! The store counts changes to the accounts ([`crate::store::Accounts::merchants_generation`]): a write of a
//! merchant, a key, a retired key or a suspension moves it at once on the node that writes, and within one
//! lease round on the other nodes of a cluster. An entry read at another count is read again, so a key roll or
//! a suspension takes effect as soon as the count says so. Only found merchants are kept: requests with
//! unknown keys, which anyone can send, cannot fill the cache. The cache is bounded; when full it starts over.

use dashmap::DashMap;
use sha2::{Digest, Sha256};

use crate::domain::ids::MerchantId;
use crate::domain::records::Merchant;
use crate::domain::time::Timestamp;

/// Entries kept per map at most.
const MAX_ENTRIES: usize = 20_000;

#[derive(Default)]
pub(crate) struct AccountCache {
    /// By the SHA-256 of the secret key, so that no key is a map key in clear.
    by_key: DashMap<[u8; 32], (u64, Merchant)>,
    suspended: DashMap<MerchantId, (u64, Option<Timestamp>)>,
}

fn digest(secret_key: &str) -> [u8; 32] {
    Sha256::digest(secret_key.as_bytes()).into()
}

impl AccountCache {
    /// The merchant holding `secret_key` when it was read at `generation`.
    pub(crate) fn merchant_by_key(&self, secret_key: &str, generation: u64) -> Option<Merchant> {
        let entry = self.by_key.get(&digest(secret_key))?;
        (entry.0 == generation).then(|| entry.1.clone())
    }

    pub(crate) fn keep_merchant(&self, secret_key: &str, generation: u64, merchant: &Merchant) {
        if self.by_key.len() >= MAX_ENTRIES {
            self.by_key.clear();
        }
        self.by_key.insert(digest(secret_key), (generation, merchant.clone()));
    }

    /// Whether `id` was suspended, when it was read at `generation`.
    pub(crate) fn suspended_since(&self, id: &MerchantId, generation: u64) -> Option<Option<Timestamp>> {
        let entry = self.suspended.get(id)?;
        (entry.0 == generation).then_some(entry.1)
    }

    pub(crate) fn keep_suspension(&self, id: &MerchantId, generation: u64, since: Option<Timestamp>) {
        if self.suspended.len() >= MAX_ENTRIES {
            self.suspended.clear();
        }
        self.suspended.insert(id.clone(), (generation, since));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merchant() -> Merchant {
        Merchant {
            id: MerchantId::new(),
            name: "Boutique".into(),
            email: "b@example.com".into(),
            password_hash: String::new(),
            secret_key: "sk_test_abc".into(),
            webhook_url: None,
            created_at: Timestamp::from_unix_ms(1_700_000_000_000),
        }
    }

    #[test]
    fn an_entry_serves_only_the_generation_it_was_read_at() {
        let cache = AccountCache::default();
        let m = merchant();
        assert!(cache.merchant_by_key("sk_test_abc", 1).is_none());
        cache.keep_merchant("sk_test_abc", 1, &m);
        assert_eq!(cache.merchant_by_key("sk_test_abc", 1).map(|m| m.id), Some(m.id.clone()));
        assert!(cache.merchant_by_key("sk_test_abc", 2).is_none(), "the accounts changed since");
        assert!(cache.merchant_by_key("sk_test_other", 1).is_none());
        cache.keep_suspension(&m.id, 1, None);
        assert_eq!(cache.suspended_since(&m.id, 1), Some(None));
        assert_eq!(cache.suspended_since(&m.id, 2), None);
    }

    #[test]
    fn a_full_cache_starts_over() {
        let cache = AccountCache::default();
        let m = merchant();
        for i in 0..MAX_ENTRIES {
            cache.keep_merchant(&format!("sk_{i}"), 1, &m);
        }
        assert_eq!(cache.by_key.len(), MAX_ENTRIES);
        cache.keep_merchant("sk_last", 1, &m);
        assert_eq!(cache.by_key.len(), 1);
    }
}
