//! Which merchant actors are running, and on which Arbiter.
//!
//! At most one live actor per merchant: that is what makes the actor the only writer of a merchant's
//! balances. An actor leaves the registry only when it has no write in flight (idle, or drained after a
//! failure) and marks itself retired in the same step, so the fresh actor that the next message starts
//! reads everything its predecessor wrote and the predecessor never writes again.

use std::sync::Arc;

use actix::{Actor, Addr};
use dashmap::DashMap;

use crate::domain::ids::MerchantId;
use crate::store::Fence;

/// The running actors of type `A` (the merchant actor), each with the generation it was started as and, in a
/// cluster, the shard token its state was read under (an actor whose token is no longer this node's is
/// replaced). Generic so that the registry stands below the actor that registers itself in it.
pub struct Registry<A: Actor> {
    pub(crate) actors: Arc<DashMap<MerchantId, Running<A>>>,
}

/// A running actor: its generation, the shard token its state was read under, its address.
pub(crate) type Running<A> = (u64, Option<Fence>, Addr<A>);

impl<A: Actor> Clone for Registry<A> {
    fn clone(&self) -> Self {
        Registry { actors: self.actors.clone() }
    }
}

impl<A: Actor> Default for Registry<A> {
    fn default() -> Self {
        Registry { actors: Arc::new(DashMap::new()) }
    }
}

impl<A: Actor> Registry<A> {
    /// Removes the entry of `id` if it still belongs to actor `generation`.
    pub(crate) fn forget(&self, id: &MerchantId, generation: u64) {
        self.actors.remove_if(id, |_, (g, _, _)| *g == generation);
    }

    pub fn running(&self) -> usize {
        self.actors.len()
    }
}
