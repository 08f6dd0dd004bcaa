//! One short handler per message: each notes the activity, then either runs the write path and answers once
//! the change is durable, or reads (in-flight state first) and answers behind the read barrier.

use std::time::Instant;

use actix::prelude::*;

use super::execute::Reply;
use super::{
    Execute, Executed, ForgetIdempotency, GetBalances, GetLink, GetPayment, GetPayout, MerchantActor, ReleaseKey,
};
use crate::core::{Command, Record};
use crate::domain::ledger::Balances;
use crate::domain::links::Link;
use crate::domain::records::{Payment, Payout};
use crate::domain::time::Timestamp;
use crate::error::EngineError;
use crate::metrics::METRICS;
use crate::store::{ExpiredIdempotency, StoreError};

impl Handler<Execute> for MerchantActor {
    type Result = ResponseActFuture<Self, Result<Executed, EngineError>>;

    fn handle(&mut self, msg: Execute, _ctx: &mut Self::Context) -> Self::Result {
        self.last_message = Instant::now();
        let queued = self.last_message;
        // A payment's status counts when a command that moves it is durable; a refund request does not.
        let moves_payment = matches!(
            msg.command,
            Command::InitiatePayment(_) | Command::PaymentNotice { .. } | Command::RefundNotice { .. }
        );
        match self.execute(msg) {
            Err(err) => Box::pin(fut::ready(Err(err))),
            // A duplicate notice or an idempotent replay changes nothing, but the state it reports may come
            // from writes still in flight: answer only once they are durable, like a read.
            Ok(Reply::Now(answer)) => {
                let barrier = self.barrier();
                Box::pin(fut::wrap_future(async move {
                    barrier.await?;
                    Ok(answer)
                }))
            }
            Ok(Reply::Wait { ticket, seq, keys, idempotency_key, held, record, changed }) => {
                Box::pin(ticket.into_actor(self).map(move |result, act, ctx| {
                    let result = match result {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(err)) => Err(err),
                        Err(_) => Err(StoreError::Closed),
                    };
                    act.finish_commit(seq, &keys, idempotency_key.as_ref(), held, result.is_ok(), ctx);
                    match result {
                        Ok(()) => {
                            METRICS.commit_latency.observe(queued.elapsed());
                            if let (true, Record::Payment(p)) = (moves_payment && changed, &record) {
                                METRICS.payment_reached(p.provider.as_str(), p.status.as_str());
                            }
                            Ok(Executed::Done(record))
                        }
                        Err(err) => {
                            tracing::error!(merchant = %act.id, seq, error = %err, "change not durable");
                            Err(EngineError::from(err))
                        }
                    }
                }))
            }
        }
    }
}

impl Handler<GetPayment> for MerchantActor {
    type Result = ResponseFuture<Result<Option<Payment>, EngineError>>;

    fn handle(&mut self, msg: GetPayment, _ctx: &mut Self::Context) -> Self::Result {
        self.last_message = Instant::now();
        let found = match self.held(&msg.0) {
            Some(Record::Payment(p)) if p.reference.as_str() == msg.0 => Ok(Some(p.clone())),
            _ => self.store.payment(&self.id, &msg.0).map_err(EngineError::from),
        };
        self.read(found)
    }
}

impl Handler<GetPayout> for MerchantActor {
    type Result = ResponseFuture<Result<Option<Payout>, EngineError>>;

    fn handle(&mut self, msg: GetPayout, _ctx: &mut Self::Context) -> Self::Result {
        self.last_message = Instant::now();
        let found = match self.held(&msg.0) {
            // A payout is also held under its merchant's reference; only its id names it here.
            Some(Record::Payout(o)) if o.id == msg.0 => Ok(Some(o.clone())),
            _ => self.store.payout(&self.id, &msg.0).map_err(EngineError::from),
        };
        self.read(found)
    }
}

impl Handler<GetLink> for MerchantActor {
    type Result = ResponseFuture<Result<Option<Link>, EngineError>>;

    fn handle(&mut self, msg: GetLink, _ctx: &mut Self::Context) -> Self::Result {
        self.last_message = Instant::now();
        let found = self.link_named(&msg.0);
        self.read(found)
    }
}

impl Handler<GetBalances> for MerchantActor {
    type Result = ResponseFuture<Result<Balances, EngineError>>;

    fn handle(&mut self, _msg: GetBalances, _ctx: &mut Self::Context) -> Self::Result {
        self.last_message = Instant::now();
        let balances = self.balances.clone();
        self.read(Ok(balances))
    }
}

impl Handler<ReleaseKey> for MerchantActor {
    type Result = Result<(), EngineError>;

    fn handle(&mut self, msg: ReleaseKey, _ctx: &mut Self::Context) -> Self::Result {
        self.release_key(&msg.0);
        Ok(())
    }
}

impl Handler<ForgetIdempotency> for MerchantActor {
    type Result = ResponseActFuture<Self, Result<usize, EngineError>>;

    /// Not an activity: `last_message` stays, so a merchant started only for this stops when idle as before.
    fn handle(&mut self, msg: ForgetIdempotency, _ctx: &mut Self::Context) -> Self::Result {
        if self.retired {
            return Box::pin(fut::ready(Err(EngineError::Retired)));
        }
        let found = (|| -> Result<Vec<ExpiredIdempotency>, EngineError> {
            let now = Timestamp::now();
            let mut expired = Vec::new();
            for (key, made_at) in self.store.idempotency_made_before(&self.id, msg.before, msg.limit)? {
                // A request with this key is being made durable: its record is not read yet, so nothing of
                // the key is touched until it is.
                if self.key_in_use(&key) {
                    continue;
                }
                let record = self.store.idempotency(&self.id, &key)?;
                // The key used again since has a newer record; only the old entry goes.
                let current = record.as_ref().is_some_and(|r| r.created_at == made_at);
                if current && record.as_ref().is_some_and(|r| r.is_live(now)) {
                    continue;
                }
                expired.push(ExpiredIdempotency { key, made_at, record: current });
            }
            Ok(expired)
        })();
        let expired = match found {
            Ok(expired) if expired.is_empty() => return Box::pin(fut::ready(Ok(0))),
            Ok(expired) => expired,
            Err(e) => return Box::pin(fut::ready(Err(e))),
        };
        let count = expired.len();
        match self.store.forget_idempotency(&self.id, &expired, self.fence) {
            Err(e) => Box::pin(fut::ready(Err(EngineError::from(e)))),
            Ok(ticket) => Box::pin(fut::wrap_future(async move {
                match ticket.await {
                    Ok(Ok(())) => Ok(count),
                    Ok(Err(e)) => Err(EngineError::from(e)),
                    Err(_) => Err(EngineError::from(StoreError::Closed)),
                }
            })),
        }
    }
}
