//! What the engine's test binaries share: the payments and payouts they make, and opening an engine on a store
//! the test holds too, so a test can look behind the engine's front door (forge a change, read the outbox) the
//! way no service code can. Each binary uses part of it, hence the `dead_code` allowances.

use std::sync::Arc;

use caisse_engine::domain::links::LinkUsage;
use caisse_engine::domain::money::{Amount, Currency, FeeRule};
use caisse_engine::domain::phone::Phone;
use caisse_engine::domain::records::ProviderCode;
use caisse_engine::domain::text::{Description, Metadata, Reference};
use caisse_engine::store::{open_embedded, Store};
use caisse_engine::{Engine, EngineConfig, NewLink, NewPayment, NewPayout};

/// The engine and its store, or why they did not open (the startup audit included). Drop both before
/// reopening the same directory: the store holds the directory's lock.
pub fn try_engine_and_store(config: EngineConfig) -> Result<(Engine, Arc<dyn Store>), String> {
    let store = open_embedded(&config.data_dir, config.store_cache_bytes, config.master_key.clone())
        .map_err(|e| e.to_string())?;
    let engine = Engine::with_store(store.clone(), config).map_err(|e| e.to_string())?;
    Ok((engine, store))
}

/// [`try_engine_and_store`], failing the test if they do not open.
#[allow(dead_code)]
pub fn engine_and_store(config: EngineConfig) -> (Engine, Arc<dyn Store>) {
    try_engine_and_store(config).unwrap_or_else(|e| panic!("open the engine: {e}"))
}

#[allow(dead_code)]
pub fn xof() -> Currency {
    Currency::parse("XOF").expect("XOF is a currency")
}

/// A payment of `amount` XOF through `mtn_momo` (fee 1.5 %), with the merchant's `reference` if given.
#[allow(dead_code)]
pub fn new_payment(amount: i64, reference: Option<&str>) -> NewPayment {
    NewPayment {
        reference: reference.map(|r| Reference::parse(r).expect("a valid reference")),
        amount: Amount::positive(amount).expect("a positive amount"),
        currency: xof(),
        provider: ProviderCode::parse("mtn_momo").expect("a provider code"),
        fee: FeeRule::new(150, Amount::ZERO).expect("a fee rule"),
        customer_phone: Phone::parse("+22997000055").expect("a phone number"),
        customer_email: None,
        customer_name: None,
        description: None,
        metadata: Metadata::empty(),
        link: None,
    }
}

/// A `unique` payment link of `amount` XOF through `mtn_momo`, with the merchant's `reference` if given.
#[allow(dead_code)]
pub fn new_link(amount: i64, reference: Option<&str>) -> NewLink {
    NewLink {
        reference: reference.map(|r| Reference::parse(r).expect("a valid reference")),
        amount: Amount::positive(amount).expect("a positive amount"),
        currency: xof(),
        description: Description::parse("Frais de scolarité").expect("a description"),
        providers: vec![ProviderCode::parse("mtn_momo").expect("a provider code")],
        usage: LinkUsage::Once,
        expires_at: None,
        return_url: None,
        metadata: Metadata::empty(),
        page_base: "https://pay.example.com/payer/".into(),
    }
}

/// A payout of `amount` XOF through `wave` (fee 1 %).
#[allow(dead_code)]
pub fn new_payout(amount: i64) -> NewPayout {
    NewPayout {
        reference: None,
        amount: Amount::positive(amount).expect("a positive amount"),
        currency: xof(),
        provider: ProviderCode::parse("wave").expect("a provider code"),
        fee: FeeRule::new(100, Amount::ZERO).expect("a fee rule"),
        beneficiary_phone: Phone::parse("+22997000099").expect("a phone number"),
        beneficiary_name: None,
        description: None,
        metadata: Metadata::empty(),
    }
}

/// The trees of a stopped embedded store, read and written behind its back: how a test tampers with stored
/// data or lays out what an older run would have left. fjall's keyspace, and the sled database that holds the
/// balance snapshots beside it.
#[allow(dead_code)]
pub struct RawTrees {
    keyspace: fjall::Keyspace,
    snapshots: sled::Db,
}

#[allow(dead_code)]
impl RawTrees {
    pub fn open(dir: &std::path::Path) -> RawTrees {
        RawTrees {
            keyspace: fjall::Config::new(dir.join("keyspace")).open().expect("open the keyspace"),
            snapshots: sled::open(dir.join("snapshots")).expect("open sled"),
        }
    }

    fn partition(&self, tree: &str) -> fjall::PartitionHandle {
        self.keyspace.open_partition(tree, fjall::PartitionCreateOptions::default()).expect("open a partition")
    }

    pub fn get(&self, tree: &str, key: &[u8]) -> Option<Vec<u8>> {
        match tree {
            "snapshots" => self.snapshots.open_tree(tree).unwrap().get(key).unwrap().map(|v| v.to_vec()),
            _ => self.partition(tree).get(key).unwrap().map(|v| v.to_vec()),
        }
    }

    pub fn insert(&self, tree: &str, key: &[u8], value: &[u8]) {
        match tree {
            "snapshots" => drop(self.snapshots.open_tree(tree).unwrap().insert(key, value).unwrap()),
            _ => self.partition(tree).insert(key, value).unwrap(),
        }
    }

    /// Makes what was written durable, and closes the engine.
    pub fn close(self) {
        self.keyspace.persist(fjall::PersistMode::SyncAll).unwrap();
        self.snapshots.flush().unwrap();
    }
}
