//! Which merchant actors are running, and on which Arbiter.
//!
//! At most one live actor per merchant: that is what makes the actor the only writer of a merchant's
//! balances. An actor leaves the registry only when it has no write in flight (idle, or drained after a
//! failure) and marks itself retired in the same step, so the fresh actor that the next message starts
//! reads everything its predecessor wrote and the predecessor never writes again.

use std::sync::Arc;

use actix::Addr;
use dashmap::DashMap;

use crate::domain::ids::MerchantId;
use crate::merchant::MerchantActor;

#[derive(Clone, Default)]
pub struct Registry {
    pub(crate) actors: Arc<DashMap<MerchantId, (u64, Addr<MerchantActor>)>>,
}

impl Registry {
    /// Removes the entry of `id` if it still belongs to actor `generation`.
    pub(crate) fn forget(&self, id: &MerchantId, generation: u64) {
        self.actors.remove_if(id, |_, (g, _)| *g == generation);
    }

    pub fn running(&self) -> usize {
        self.actors.len()
    }
}
