//! Secrets at rest: a merchant's secret key is sealed under the operator's master key before it is written
//! (the record, and so the engine's journal, holds `sealed1:` and the ciphertext), and opened when read. The
//! key's lookup entry is its SHA-256, as before, so finding a merchant by key needs no decryption.
//!
//! XChaCha20-Poly1305 with a random 24-byte nonce per sealing; the merchant's id is the associated data, so a
//! sealed key copied into another merchant's record does not open. A key stored in clear (a store written
//! without a master key) is read as it is and sealed at its next write once a master key is set.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;

use crate::domain::ids::MerchantId;
use crate::store::StoreError;

/// The prefix of a sealed value, naming the scheme so that another can follow.
const PREFIX: &str = "sealed1:";
const NONCE_LEN: usize = 24;

/// The operator's master key: 32 bytes. Never printed.
#[derive(Clone)]
pub struct MasterKey([u8; 32]);

impl MasterKey {
    pub fn from_bytes(bytes: [u8; 32]) -> MasterKey {
        MasterKey(bytes)
    }

    /// Seals `secret` for `merchant`.
    pub fn seal(&self, merchant: &MerchantId, secret: &str) -> Result<String, StoreError> {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let cipher = XChaCha20Poly1305::new((&self.0).into());
        let payload = Payload { msg: secret.as_bytes(), aad: merchant.as_bytes() };
        let sealed = cipher
            .encrypt(XNonce::from_slice(&nonce), payload)
            .map_err(|_| StoreError::Corrupt("sealing a secret failed".into()))?;
        let mut bytes = nonce.to_vec();
        bytes.extend_from_slice(&sealed);
        Ok(format!("{PREFIX}{}", hex::encode(bytes)))
    }
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey([redacted])")
    }
}

/// True when `stored` is a sealed value (else it is a secret stored in clear).
pub fn is_sealed(stored: &str) -> bool {
    stored.starts_with(PREFIX)
}

/// Opens what [`MasterKey::seal`] made; a value in clear is returned as it is.
pub fn open(key: Option<&MasterKey>, merchant: &MerchantId, stored: &str) -> Result<String, StoreError> {
    let Some(hex_text) = stored.strip_prefix(PREFIX) else { return Ok(stored.to_owned()) };
    let Some(key) = key else {
        return Err(StoreError::Format(
            "this store's secret keys are sealed under a master key: set master_key_file or CAISSE_MASTER_KEY".into(),
        ));
    };
    let bytes = hex::decode(hex_text).map_err(|_| StoreError::Corrupt("a sealed secret is not hex".into()))?;
    if bytes.len() <= NONCE_LEN {
        return Err(StoreError::Corrupt("a sealed secret is too short".into()));
    }
    let (nonce, sealed) = bytes.split_at(NONCE_LEN);
    let cipher = XChaCha20Poly1305::new((&key.0).into());
    let opened =
        cipher.decrypt(XNonce::from_slice(nonce), Payload { msg: sealed, aad: merchant.as_bytes() }).map_err(|_| {
            StoreError::Format(
                "a secret key does not open with this master key: is it the master key this store was written with?"
                    .into(),
            )
        })?;
    String::from_utf8(opened).map_err(|_| StoreError::Corrupt("a sealed secret is not text".into()))
}

/// Merchants whose keys [`check_opens`] reads at most: the newest ones, which are sealed once a master key is
/// set (a key in clear opens with any); a wrong key shows on the first sealed one.
const CHECKED_AT_MOST: usize = 10_000;

/// Refuses a master key (or its absence) that does not open the merchants' sealed keys. Without this check a
/// re-run `caisse keygen` or a mistyped key file gave a server that started, answered its health check, and
/// then failed every request that read a merchant, the reason only in its log.
pub fn check_opens(accounts: &dyn crate::store::Accounts) -> Result<(), StoreError> {
    const PAGE: usize = 500;
    let mut before = None;
    let mut read = 0;
    while read < CHECKED_AT_MOST {
        let page = accounts.merchants(before.as_ref(), PAGE)?;
        read += page.len();
        match page.last() {
            Some(last) if page.len() == PAGE => before = Some(last.id.clone()),
            _ => break,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_keys_open_only_with_their_key_and_merchant() {
        let key = MasterKey::from_bytes([7; 32]);
        let (a, b) = (MerchantId::new(), MerchantId::new());
        let sealed = key.seal(&a, "sk_live_secret").unwrap();
        assert!(is_sealed(&sealed) && !sealed.contains("sk_live_secret"));
        assert_ne!(sealed, key.seal(&a, "sk_live_secret").unwrap(), "a fresh nonce each time");
        assert_eq!(open(Some(&key), &a, &sealed).unwrap(), "sk_live_secret");
        assert!(matches!(open(Some(&key), &b, &sealed), Err(StoreError::Format(_))), "bound to its merchant");
        let other = MasterKey::from_bytes([8; 32]);
        assert!(matches!(open(Some(&other), &a, &sealed), Err(StoreError::Format(_))));
        assert!(matches!(open(None, &a, &sealed), Err(StoreError::Format(m)) if m.contains("master key")));
        assert_eq!(open(None, &a, "sk_test_clear").unwrap(), "sk_test_clear", "a key in clear reads as it is");
        assert_eq!(format!("{key:?}"), "MasterKey([redacted])");
    }

    /// Through the store: found by key and read back opened, sealed on disk, refused without the master key.
    #[test]
    fn a_store_with_a_master_key_keeps_keys_sealed() {
        use crate::domain::records::Merchant;
        use crate::domain::time::Timestamp;
        use crate::store::{Accounts, FjallStore};

        let dir = tempfile::tempdir().unwrap();
        let key = MasterKey::from_bytes([9; 32]);
        let merchant = Merchant {
            id: MerchantId::new(),
            name: "Boutique".into(),
            email: "b@example.com".into(),
            password_hash: String::new(),
            secret_key: "sk_live_SEALEDSEALEDSEALEDSEALEDSEALED12".into(),
            webhook_url: None,
            created_at: Timestamp::now(),
        };
        {
            let store = FjallStore::open(dir.path()).unwrap().with_master_key(Some(key.clone()));
            store.put_merchant(merchant.clone(), None).unwrap().blocking_recv().unwrap().unwrap();
            assert_eq!(store.merchant_by_key(&merchant.secret_key).unwrap(), Some(merchant.clone()));
        }
        let store = FjallStore::open(dir.path()).unwrap().with_master_key(Some(key));
        assert_eq!(store.merchant(&merchant.id).unwrap(), Some(merchant.clone()));
        assert_eq!(store.merchants(None, 10).unwrap(), vec![merchant.clone()]);
        drop(store);
        let mut everything = Vec::new();
        for entry in walk(dir.path()) {
            everything.extend(std::fs::read(entry).unwrap());
        }
        assert!(!everything.windows(12).any(|w| w == b"SEALEDSEALED"), "the key is nowhere in clear");
        let keyless = FjallStore::open(dir.path()).unwrap();
        assert!(matches!(keyless.merchant(&merchant.id), Err(StoreError::Format(_))));
        assert!(matches!(check_opens(&keyless), Err(StoreError::Format(m)) if m.contains("master key")));
        drop(keyless);
        let wrong = FjallStore::open(dir.path()).unwrap().with_master_key(Some(MasterKey::from_bytes([1; 32])));
        assert!(matches!(check_opens(&wrong), Err(StoreError::Format(m)) if m.contains("master key")));
        drop(wrong);
        let right = FjallStore::open(dir.path()).unwrap().with_master_key(Some(MasterKey::from_bytes([9; 32])));
        check_opens(&right).unwrap();
    }

    fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files.extend(walk(&path));
            } else {
                files.push(path);
            }
        }
        files
    }
}
