//! What the engine's test binaries share: opening an engine on a store the test holds too, so a test can look
//! behind the engine's front door (forge a change, read the outbox) the way no service code can.

use std::sync::Arc;

use caisse_engine::store::{SledStore, Store};
use caisse_engine::{Engine, EngineConfig};

/// The engine and its store, or why they did not open (the startup audit included). Drop both before
/// reopening the same directory: the store holds sled's lock.
pub fn try_engine_and_store(config: EngineConfig) -> Result<(Engine, Arc<dyn Store>), String> {
    let store = SledStore::open_with_cache(&config.data_dir, config.store_cache_bytes).map_err(|e| e.to_string())?;
    let store: Arc<dyn Store> = Arc::new(store);
    let engine = Engine::with_store(store.clone(), config).map_err(|e| e.to_string())?;
    Ok((engine, store))
}

/// [`try_engine_and_store`], failing the test if they do not open.
#[allow(dead_code)] // Each test binary includes this module and uses what it needs of it.
pub fn engine_and_store(config: EngineConfig) -> (Engine, Arc<dyn Store>) {
    try_engine_and_store(config).unwrap_or_else(|e| panic!("open the engine: {e}"))
}
