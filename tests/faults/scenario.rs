//! The phases both faults go through, and the record of everything the service acknowledged.
//!
//! The record is the test's reference model of what must survive: a payment enters it when the API answered
//! its initiation with a 2xx (idempotent replays included, since a replay claims the first answer was
//! durable), or when any read showed it. After a restart on the same directory each of them must still be
//! there, and the balance must be exactly what the payments that succeeded add up to.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::rig::{Api, Findings, DEADLINE};
use crate::support::sleep_ms;

/// Payments offered once the fault is in place before the test gives up waiting for a refusal. A store may
/// have a little room left (a page, a preallocated file), but never this much.
const FAULT_ATTEMPTS: usize = 40;
/// How soon after the fault is gone the running server must be healthy again, without any write to help it.
pub const RECOVERY: Duration = Duration::from_secs(10);
/// How long [`hold`] keeps the fault.
const HOLD: Duration = Duration::from_secs(8);

/// What the service claimed about one payment: that it exists with this amount (and, once known, this
/// transaction id), and the final status a read showed, if any. A final status never changes (docs/api.md § Payments).
struct Claim {
    amount: i64,
    transaction_id: Option<String>,
    final_status: Option<String>,
    how: String,
}

/// Payments that must survive, by reference, with what was claimed about each.
#[derive(Default)]
pub struct Acknowledged {
    payments: BTreeMap<String, Claim>,
}

impl Acknowledged {
    /// Records a claim from a payment or a payment transaction as the API showed it. The first transaction id
    /// and the first final status are kept: a later answer that differs is what the restart must catch.
    pub fn record(&mut self, shown: &Value, how: &str) {
        let (Some(reference), Some(amount)) = (shown["reference"].as_str(), shown["montant"].as_i64()) else {
            return;
        };
        let claim = self.payments.entry(reference.to_owned()).or_insert_with(|| Claim {
            amount,
            transaction_id: None,
            final_status: None,
            how: how.to_owned(),
        });
        if claim.transaction_id.is_none() {
            claim.transaction_id = shown["transaction_id"].as_str().map(str::to_owned);
        }
        let status = shown["statut"].as_str().filter(|s| matches!(*s, "succes" | "echec" | "rembourse"));
        if claim.final_status.is_none() {
            claim.final_status = status.map(str::to_owned);
        }
    }

    /// Initiates a payment that must be accepted (the storage is fine), and records it.
    pub async fn pay(&mut self, api: &Api, findings: &mut Findings, reference: &str, amount: i64, when: &str) {
        let answer = api.pay(reference, amount).await;
        if findings.check(answer.status == 201, || format!("{when}: payment {reference} answered {answer}")) {
            self.record(&answer.body, &format!("201 {when}"));
        }
    }
}

/// Waits until the payment is confirmed (`succes`), then a little longer, so that the writes it causes in the
/// background (provider notices, the first delivery attempt of each notification, which fails: the merchant
/// has no webhook URL) are done. Then the next write to meet a fault is the test's own, and a write refused
/// because of the fault is the first one that failed: the case where a store may have applied it in memory.
async fn settle(api: &Api, reference: &str, within: Duration) -> Option<Value> {
    let begun = Instant::now();
    loop {
        let answer = api.get(&format!("/v1/paiement/{reference}")).await;
        if answer.body["statut"] == "succes" {
            sleep_ms(300).await;
            return Some(answer.body);
        }
        if begun.elapsed() > within {
            return None;
        }
        sleep_ms(25).await;
    }
}

/// Payments accepted while the storage is fine, each confirmed before the next.
pub async fn before_fault(api: &Api, acknowledged: &mut Acknowledged, findings: &mut Findings) -> Vec<String> {
    let references: Vec<String> = (1..=4).map(|i| format!("avant-{i}")).collect();
    for (i, reference) in references.iter().enumerate() {
        acknowledged.pay(api, findings, reference, 10_000 + i as i64, "before the fault").await;
        let confirmed = settle(api, reference, DEADLINE).await;
        assert!(confirmed.is_some(), "{reference} was not confirmed before the fault");
    }
    references
}

/// Offers payments until one is refused, each accepted one recorded and let settle. Returns the refused one.
pub async fn refused_write(
    api: &Api,
    acknowledged: &mut Acknowledged,
    findings: &mut Findings,
    fault: &str,
) -> Option<(String, i64)> {
    for i in 1..=FAULT_ATTEMPTS {
        let reference = format!("pendant-{i}");
        let amount = 20_000 + i as i64;
        let answer = api.pay(&reference, amount).await;
        if answer.ok() {
            acknowledged.record(&answer.body, &format!("{} with the {fault}", answer.status));
            // Its confirmation may meet the fault instead; then the expiry sweep settles it after the restart.
            if let Some(confirmed) = settle(api, &reference, Duration::from_secs(5)).await {
                acknowledged.record(&confirmed, &format!("read with the {fault}"));
            }
        } else if answer.status == 503 {
            findings.check(answer.unavailable(), || format!("{fault}: a refused payment answered {answer}"));
            eprintln!("faults: {fault}: payments accepted before the first refusal: {}", i - 1);
            return Some((reference, amount));
        } else {
            findings.fail(format!("{fault}: payment {reference} answered {answer}; expected 503 unavailable"));
        }
    }
    findings.fail(format!("{fault}: {FAULT_ATTEMPTS} payments were offered and none was refused with 503"));
    None
}

/// While the fault lasts: writes refused, ping reports it, reads of what existed before still work. Whatever
/// is acknowledged or shown meanwhile is recorded, for the restart to check.
pub async fn while_faulty(
    api: &Api,
    acknowledged: &mut Acknowledged,
    findings: &mut Findings,
    fault: &str,
    before: &[String],
    refused: Option<&(String, i64)>,
) {
    if let Some((reference, amount)) = refused {
        // The same request again (same Idempotency-Key, same body) while the fault lasts: a 2xx, a replay
        // included, claims the payment is durable; the restart checks that claim.
        for attempt in 1..=2 {
            sleep_ms(200).await;
            let again = api.pay(reference, *amount).await;
            eprintln!("faults: {fault}: retry {attempt} of the refused payment {reference}: {}", again.status);
            if again.ok() {
                acknowledged.record(&again.body, &format!("{} to a retry of its 503, with the {fault}", again.status));
            }
            findings.check(again.ok() || again.unavailable(), || {
                format!("{fault}: retry {attempt} of the refused payment {reference} answered {again}")
            });
        }
        let shown = api.get(&format!("/v1/paiement/{reference}")).await;
        eprintln!("faults: {fault}: GET of the refused payment {reference}: {}", shown.status);
        if shown.ok() {
            acknowledged.record(&shown.body, &format!("shown by GET after its 503, with the {fault}"));
        }
        findings.check(matches!(shown.status, 200 | 404 | 503), || {
            format!("{fault}: GET of the refused payment {reference} answered {shown}")
        });
    }
    ping_during_fault(api, acknowledged, findings, fault, "pendant-ping", 20_999).await;

    for reference in before {
        let read = api.get(&format!("/v1/paiement/{reference}")).await;
        findings.check(read.status == 200 && read.body["statut"] == "succes", || {
            format!("{fault}: reading {reference}, stored before the fault, answered {read}")
        });
    }
    let soldes = api.get("/v1/soldes").await;
    findings.check(soldes.status == 200, || format!("{fault}: GET /v1/soldes answered {soldes}"));
    let listed = api.get("/v1/transactions?type=paiement&limit=100").await;
    if findings.check(listed.status == 200, || format!("{fault}: GET /v1/transactions answered {listed}")) {
        for tx in listed.body["data"].as_array().into_iter().flatten() {
            acknowledged.record(tx, &format!("listed by GET /v1/transactions with the {fault}"));
        }
    }
}

/// One look at ping while the fault lasts. It must answer 503 `unavailable`, or else tell the truth: a 200 is
/// right only if a payment offered at once is accepted (the store may have found room again, a checkpoint
/// deleting log files for instance). Returns what ping, and that payment, answered.
async fn ping_during_fault(
    api: &Api,
    acknowledged: &mut Acknowledged,
    findings: &mut Findings,
    fault: &str,
    reference: &str,
    amount: i64,
) -> Vec<u16> {
    let ping = api.ping().await;
    if ping.status != 200 {
        findings.check(ping.unavailable(), || format!("{fault}: GET /v1/ping answered {ping}"));
        return vec![ping.status];
    }
    let answer = api.pay(reference, amount).await;
    if answer.ok() {
        acknowledged.record(&answer.body, &format!("{} after ping said 200 with the {fault}", answer.status));
    }
    findings.check(answer.ok(), || {
        format!("{fault}: GET /v1/ping answered 200, yet the payment {reference} offered at once answered {answer}")
    });
    vec![ping.status, answer.status]
}

/// Keeps the fault for a while: long enough for the store's background work (fjall writing memtables out and
/// compacting, sled writing the balance snapshots out, every second at most) to meet it too. Meanwhile ping must keep telling the truth
/// ([`ping_during_fault`]) and reads of what existed before must keep working.
pub async fn hold(api: &Api, acknowledged: &mut Acknowledged, findings: &mut Findings, fault: &str, before: &[String]) {
    let begun = Instant::now();
    let mut seen = Vec::new();
    for i in 1.. {
        sleep_ms(500).await;
        let reference = format!("tenue-{i}");
        seen.extend(ping_during_fault(api, acknowledged, findings, fault, &reference, 25_000 + i).await);
        let read = api.get(&format!("/v1/paiement/{}", before[i as usize % before.len()])).await;
        findings.check(read.status == 200, || format!("{fault}, {:?} in: a read answered {read}", begun.elapsed()));
        if begun.elapsed() >= HOLD {
            break;
        }
    }
    eprintln!("faults: {fault} held {HOLD:?}: ping (and the payment after each 200) answered {seen:?}");
}

/// Polls ping, with no write from the test, until it answers 200; then writes must be accepted again, the
/// refused payment's retry included.
pub async fn recovered(
    api: &Api,
    acknowledged: &mut Acknowledged,
    findings: &mut Findings,
    fault: &str,
    refused: Option<&(String, i64)>,
) {
    let begun = Instant::now();
    let mut ping = api.ping().await;
    while ping.status != 200 && begun.elapsed() < RECOVERY {
        sleep_ms(200).await;
        ping = api.ping().await;
    }
    findings.check(ping.status == 200, || {
        format!("{fault} gone for {RECOVERY:?} (and no write tried meanwhile), GET /v1/ping still answers {ping}")
    });
    let mut offers = vec![("apres-1".to_owned(), 30_001)];
    offers.extend(refused.cloned());
    for (reference, amount) in offers {
        let begun = Instant::now();
        let mut answer = api.pay(&reference, amount).await;
        while !answer.ok() && begun.elapsed() < RECOVERY {
            sleep_ms(250).await;
            answer = api.pay(&reference, amount).await;
        }
        if answer.ok() {
            acknowledged.record(&answer.body, &format!("{} after the {fault} was gone", answer.status));
        }
        findings.check(answer.ok(), || {
            format!("{fault} gone for {RECOVERY:?}, the payment {reference} still answers {answer}")
        });
    }
}

/// After a restart on the same directory: every claim holds (same payment, same transaction id, no final
/// status undone), writes work, and the balance is what the successful payments add up to.
pub async fn verify_after_restart(api: &Api, acknowledged: &mut Acknowledged, findings: &mut Findings) {
    let ping = api.ping().await;
    findings.check(ping.status == 200, || format!("after the restart GET /v1/ping answered {ping}"));
    for (reference, claim) in &acknowledged.payments {
        let read = api.get(&format!("/v1/paiement/{reference}")).await;
        let how = &claim.how;
        if !findings.check(read.status == 200 && read.body["montant"].as_i64() == Some(claim.amount), || {
            format!("payment {reference}, acknowledged ({how}), is not there after the restart: {read}")
        }) {
            continue;
        }
        if let Some(id) = &claim.transaction_id {
            findings.check(read.body["transaction_id"] == id.as_str(), || {
                format!(
                    "payment {reference} was acknowledged ({how}) as {id}; after the restart it is another \
                     payment, {}: the acknowledged one was lost and the reference used again",
                    read.body["transaction_id"]
                )
            });
        }
        if let Some(status) = &claim.final_status {
            findings.check(read.body["statut"] == status.as_str(), || {
                format!(
                    "payment {reference} was shown {status} (final) and is {} after the restart",
                    read.body["statut"]
                )
            });
        }
    }
    acknowledged.pay(api, findings, "redemarrage-1", 40_001, "after the restart").await;

    // Every payment final (the sandbox confirms, or the expiry sweep settles those whose notices were refused
    // during the fault); then the balance must be their sum exactly.
    let begun = Instant::now();
    let payments = loop {
        let listed = api.get("/v1/transactions?type=paiement&limit=100").await;
        let data = listed.body["data"].as_array().cloned().unwrap_or_default();
        let settled = data.iter().all(|p| matches!(p["statut"].as_str(), Some("succes" | "echec" | "expire")));
        if listed.status == 200 && settled {
            break Some(data);
        }
        if begun.elapsed() > DEADLINE {
            findings.fail(format!("after the restart, payments still not final after {DEADLINE:?}: {listed}"));
            break None;
        }
        sleep_ms(200).await;
    };
    let Some(payments) = payments else { return };
    let expected: i64 =
        payments.iter().filter(|p| p["statut"] == "succes").filter_map(|p| p["montant_net"].as_i64()).sum();
    let soldes = api.get("/v1/soldes").await;
    let row = soldes.body["data"].as_array().into_iter().flatten().find(|r| r["devise"] == "XOF").cloned();
    let available = row.as_ref().and_then(|r| r["disponible"].as_i64());
    let pending = row.as_ref().and_then(|r| r["en_attente"].as_i64());
    findings.check(available == Some(expected) && pending == Some(0), || {
        format!("after the restart the XOF balance is {soldes}; the successful payments add up to {expected}")
    });
    let listed: Vec<&str> = payments.iter().filter_map(|p| p["reference"].as_str()).collect();
    for reference in acknowledged.payments.keys() {
        findings.check(listed.contains(&reference.as_str()), || {
            format!("payment {reference} is missing from GET /v1/transactions after the restart")
        });
    }
}
