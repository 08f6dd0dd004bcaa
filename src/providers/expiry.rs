//! Background work that keeps pending transactions moving: the TTL sweep, and the resubmission of pending
//! work after a restart.
//!
//! The sweep reads the store's `pending` index (oldest first), so each pass touches only payments whose TTL
//! has passed. Each gets one last status query (contract 6): a final answer is applied, anything else
//! expires the payment. A late success after that still credits the merchant (`expire -> succes`).

use std::time::Duration;

use actix_web::web;
use caisse_engine::core::Record;
use caisse_engine::domain::records::TransactionType;
use caisse_engine::domain::time::Timestamp;

use super::{ProviderStatus, Subject};
use crate::http::AppState;
use crate::settlement::settle;

/// Payments one sweep pass handles at most; the next pass continues.
const SWEEP_BATCH: usize = 500;

/// Time between two sweep passes: a tenth of the TTL, between 100 ms and 5 s. A payment therefore expires
/// at most one pass after its TTL, which the sandbox simulator's `04` story waits for.
pub fn sweep_every_ms(ttl_ms: u64) -> u64 {
    (ttl_ms / 10).clamp(100, 5_000)
}

/// Starts the sweep on the current actix thread; it runs for the life of the server.
pub fn start(state: web::Data<AppState>) {
    let every = Duration::from_millis(sweep_every_ms(state.settings.payment_ttl_ms));
    actix_web::rt::spawn(async move {
        resubmit_pending(&state).await;
        loop {
            actix_web::rt::time::sleep(every).await;
            sweep(&state).await;
        }
    });
}

async fn sweep(state: &AppState) {
    let cutoff = Timestamp::from_unix_ms(Timestamp::now().unix_ms().saturating_sub(state.settings.payment_ttl_ms));
    let due = match state.engine.store().pending(TransactionType::Paiement, cutoff, SWEEP_BATCH) {
        Ok(due) => due,
        Err(e) => return tracing::error!(error = %e, "expiry sweep could not read the pending index"),
    };
    for item in due {
        let located = match state.engine.store().locate(&item.merchant, &item.owner) {
            Ok(Some(located)) => located,
            Ok(None) => continue,
            Err(e) => {
                tracing::error!(error = %e, reference = %item.owner, "expiry sweep lookup failed");
                continue;
            }
        };
        let Record::Payment(payment) = &located.record else { continue };
        let adapter = state.providers.get(payment.fournisseur.as_str()).and_then(|p| p.adapter.clone());
        let status = match adapter {
            Some(a) => a.status(Subject::Payment, &payment.transaction_id).await.unwrap_or(ProviderStatus::Pending),
            None => ProviderStatus::Pending,
        };
        if let Err(e) = settle(&state.engine, &item.merchant, &located, &status, true).await {
            tracing::warn!(error = %e, reference = %item.owner, "expiry failed; the next pass retries");
        }
    }
}

/// After a restart, asks the providers again for everything still pending: their answers may have been
/// lost with the process (the sandbox simulator keeps its state in memory). Providers deduplicate by our
/// transaction id, so asking twice is harmless.
async fn resubmit_pending(state: &AppState) {
    let now = Timestamp::now();
    for kind in [TransactionType::Paiement, TransactionType::Remboursement, TransactionType::Retrait] {
        let items = match state.engine.store().pending(kind, now, 100_000) {
            Ok(items) => items,
            Err(e) => return tracing::error!(error = %e, "could not read pending work"),
        };
        for item in items {
            let Ok(Some(located)) = state.engine.store().locate(&item.merchant, &item.owner) else { continue };
            let (code, result) = match &located.record {
                Record::Payment(p) => {
                    let Some(adapter) = state.providers.get(p.fournisseur.as_str()).and_then(|x| x.adapter.clone())
                    else {
                        continue;
                    };
                    let result = match (kind, &p.remboursement) {
                        (TransactionType::Remboursement, Some(r)) => adapter.refund(p, r).await,
                        _ => adapter.request_to_pay(p).await,
                    };
                    (p.fournisseur.clone(), result)
                }
                Record::Payout(o) => {
                    let Some(adapter) = state.providers.get(o.fournisseur.as_str()).and_then(|x| x.adapter.clone())
                    else {
                        continue;
                    };
                    (o.fournisseur.clone(), adapter.payout(o).await)
                }
            };
            if let Err(e) = result {
                tracing::warn!(provider = %code, owner = %item.owner, error = %e, "resubmission failed");
            }
        }
    }
}
