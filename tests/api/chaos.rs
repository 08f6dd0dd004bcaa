//! The chaos sandbox (docs/sandbox.md): whatever the simulator does to its notices (duplicate, late, out of
//! order, contradicting the provider), every payment ends in the status its phone ending promises, is credited
//! exactly once, and sends each webhook event once.
//!
//! Each test runs the same set of stories ([`run_stories`]): payments with every magic ending, a refund, a
//! rejected and a processed payout. It waits for the final statuses, then until the simulator has no story
//! left in flight (so every notice, late ones included, has been answered), and only then checks balances,
//! transactions, the notifications stored for the merchant and the ledger audit. The number of notices the
//! server answered shows that the chaos really happened; it is exact because every notice is answered 200.
//! No fixed sleeps: every wait polls with a deadline.

use std::collections::BTreeMap;

use caisse::providers::chaos::{Chaos, Mode, METADATA_KEY};
use caisse_engine::domain::time::Timestamp;
use serde_json::{json, Value};

use crate::support::{data, eventually, payment_body, payout_body, spawn_app_with, text, TestApp, DEADLINE};

/// Notices of one run of [`run_stories`] without chaos: 01, 04 and other endings send "processing" and a final
/// notice (2 each), 02 only "processing" (1), 03 "processing" and its final notice three times (4), the refund
/// and the two payouts one each.
const HONEST_NOTICES: u64 = 2 + 1 + 4 + 2 + 2 + 1 + 1 + 1;
/// Final answers `flap` contradicts: the 01, 03, 04 and 99 payments, the refund, both payouts (02 has none).
const FLAPPED: u64 = 7;
/// Stories `reorder` adds a stale "processing" notice to: the refund and both payouts.
const STALE_PROCESSING: u64 = 3;

/// Everything one run created, by its magic ending.
struct Stories {
    payments: BTreeMap<&'static str, String>,
    refund_of: String,
    payout_rejected: String,
    payout_processed: String,
}

fn with_chaos_metadata(mut body: Value, chaos: Option<&str>) -> Value {
    if let Some(modes) = chaos {
        body["metadata"] = json!({ METADATA_KEY: modes });
    }
    body
}

/// Waits until the simulator has finished every story: no notice is in flight or still to come.
async fn wait_simulator_idle(app: &TestApp) {
    let simulator = app.state.providers.simulator.clone().expect("the sandbox runs the simulator");
    eventually("the simulator told every story", DEADLINE, || {
        std::future::ready(match simulator.stories_in_flight() {
            0 => Ok(()),
            n => Err(format!("simulator still telling {n} stories")),
        })
    })
    .await
}

fn notices_delivered(app: &TestApp) -> u64 {
    app.state.providers.simulator.as_ref().map_or(0, |s| s.notices_delivered())
}

/// Notice attempts not answered 2xx: a duplicate, stale or contradicting notice must be acknowledged (200,
/// nothing changes), never refused into a retry loop.
fn notices_refused(app: &TestApp) -> u64 {
    app.state.providers.simulator.as_ref().map_or(0, |s| s.notices_refused())
}

/// The merchant's stored notifications, counted by (reference, event).
fn events(app: &TestApp) -> BTreeMap<(String, String), usize> {
    let store = &app.state.engine;
    let merchant = store.merchant_by_key(&app.key).expect("store").expect("demo merchant");
    let page = store.notifications(&merchant.id, None, 100, &mut |_| true).expect("notifications");
    assert!(!page.has_more, "fewer than 100 notifications in one run");
    let mut counts = BTreeMap::new();
    for n in page.data {
        *counts.entry((n.reference.clone(), n.event.as_str().to_owned())).or_insert(0) += 1;
    }
    counts
}

fn count(events: &BTreeMap<(String, String), usize>, reference: &str, event: &str) -> usize {
    events.get(&(reference.to_owned(), event.to_owned())).copied().unwrap_or(0)
}

/// Runs every story under the app's chaos (or the one `metadata` chooses) and checks every outcome.
async fn run_stories(app: &TestApp, metadata: Option<&str>) -> Stories {
    let stories = tell_every_story(app, metadata).await;
    every_story_ends_as_its_ending_promises(app, &stories).await;
    every_movement_is_counted_once(app).await;
    one_webhook_per_status_change(app, &stories);
    stories
}

/// Payments with every magic ending, a refund of the succeeded one, a rejected and a processed payout.
async fn tell_every_story(app: &TestApp, metadata: Option<&str>) -> Stories {
    // Distinct amounts, so a double credit of any one payment shows in the balance.
    let cases: [(&str, i64); 5] = [("01", 5_000), ("02", 7_000), ("03", 10_000), ("04", 20_000), ("99", 40_000)];
    let mut payments = BTreeMap::new();
    for (ending, amount) in cases {
        let p = app.initiate(&with_chaos_metadata(payment_body(amount, ending), metadata)).await;
        payments.insert(ending, text(&p["reference"]).to_owned());
    }
    let paid = payments["99"].clone();
    app.wait_payment(&paid, "succes").await;

    let resp = app.send(app.post(&format!("/v1/paiement/{paid}/rembourser")).json(&json!({"montant": 1_000}))).await;
    resp.expect(200);
    let mut payouts = Vec::new();
    for ending in ["01", "99"] {
        let resp =
            app.send(app.post("/v1/retraits").json(&with_chaos_metadata(payout_body(2_000, ending), metadata))).await;
        resp.expect(201);
        payouts.push(text(&resp.json["id"]).to_owned());
    }
    Stories { payments, refund_of: paid, payout_rejected: payouts[0].clone(), payout_processed: payouts[1].clone() }
}

/// Each story reaches the final status its ending promises; once the simulator has told everything (late
/// notices included, each acknowledged at its first attempt), nothing moved.
async fn every_story_ends_as_its_ending_promises(app: &TestApp, stories: &Stories) {
    let declined = app.wait_payment(&stories.payments["01"], "echec").await;
    assert_eq!(declined["failure_code"], "insufficient_funds", "a contradicting success never wins");
    let expired = app.wait_payment(&stories.payments["02"], "expire").await;
    assert_eq!(expired["failure_code"], "expired");
    app.wait_payment(&stories.payments["03"], "succes").await;
    app.wait_payment(&stories.payments["04"], "succes").await;
    app.wait_refund(&stories.refund_of, "succes").await;
    app.wait_payment(&stories.refund_of, "rembourse_partiellement").await;
    let rejected = app.wait_payout(&stories.payout_rejected, "rejete").await;
    assert_eq!(rejected["motif_rejet"], "beneficiary_rejected");
    app.wait_payout(&stories.payout_processed, "traite").await;
    wait_simulator_idle(app).await;
    assert_eq!(notices_refused(app), 0, "every notice was acknowledged at its first attempt");

    // Nothing moved while the last notices landed.
    for (ending, status) in
        [("01", "echec"), ("02", "expire"), ("03", "succes"), ("04", "succes"), ("99", "rembourse_partiellement")]
    {
        let p = app.get_ok(&format!("/v1/paiement/{}", stories.payments[ending])).await;
        assert_eq!(p["statut"], status, "payment {ending}: {p}");
        assert_eq!(p["paid_at"].is_string(), ["03", "04", "99"].contains(&ending), "payment {ending}: {p}");
    }
}

/// The balance, the ledger audit and the transaction list count each movement once.
async fn every_movement_is_counted_once(app: &TestApp) {
    // Credited once each: 9 850 + 19 700 + 39 400, minus the 1 000 refund and the processed 2 000 payout.
    assert_eq!(app.balance("XOF").await, (65_950, 0, 65_950));
    app.audit();

    let all = data(&app.get_ok("/v1/transactions?limit=100").await);
    let mut kinds: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in &all {
        kinds.entry(text(&t["type"]).to_owned()).or_default().push(text(&t["statut"]).to_owned());
    }
    for statuses in kinds.values_mut() {
        statuses.sort();
    }
    assert_eq!(kinds["paiement"], ["echec", "expire", "rembourse_partiellement", "succes", "succes"], "{kinds:?}");
    assert_eq!(kinds["remboursement"], ["succes"], "{kinds:?}");
    assert_eq!(kinds["retrait"], ["rejete", "traite"], "{kinds:?}");
}

/// One webhook per status change, whatever the notices did. `payment.processing` may be skipped (a final
/// answer that arrives first), never repeated.
fn one_webhook_per_status_change(app: &TestApp, stories: &Stories) {
    let ev = events(app);
    let expected: [(&str, [usize; 4]); 5] = [
        // ending: initiated, succeeded, failed, refunded
        ("01", [1, 0, 1, 0]),
        ("02", [1, 0, 1, 0]),
        ("03", [1, 1, 0, 0]),
        ("04", [1, 1, 1, 0]), // expire (payment.failed), then the late success
        ("99", [1, 1, 0, 1]),
    ];
    for (ending, counts) in expected {
        let r = &stories.payments[ending];
        let seen =
            ["payment.initiated", "payment.succeeded", "payment.failed", "payment.refunded"].map(|e| count(&ev, r, e));
        assert_eq!(seen, counts, "payment {ending} events: {ev:?}");
        assert!(count(&ev, r, "payment.processing") <= 1, "payment {ending} events: {ev:?}");
    }
    assert_eq!(count(&ev, &stories.payout_rejected, "payout.rejected"), 1, "{ev:?}");
    assert_eq!(count(&ev, &stories.payout_rejected, "payout.processed"), 0, "{ev:?}");
    assert_eq!(count(&ev, &stories.payout_processed, "payout.processed"), 1, "{ev:?}");
    assert_eq!(count(&ev, &stories.payout_processed, "payout.rejected"), 0, "{ev:?}");
}

async fn spawn_with_chaos(chaos: Chaos) -> TestApp {
    spawn_app_with(move |s| s.sandbox_chaos = chaos).await
}

#[actix_web::test]
async fn duplicate_notices_change_nothing_after_the_first() {
    let app = spawn_with_chaos(Chaos::only(Mode::Duplicate)).await;
    run_stories(&app, None).await;
    assert_eq!(notices_delivered(&app), 3 * HONEST_NOTICES, "every notice three times");
}

#[actix_web::test]
async fn late_notices_only_delay_the_outcome() {
    let app = spawn_with_chaos(Chaos::only(Mode::Late)).await;
    let stories = run_stories(&app, None).await;
    assert_eq!(notices_delivered(&app), HONEST_NOTICES);
    // The provider said "succeeded" after 100 ms, but the first notice left 1 s later (late_ms(100)); the
    // TTL (1.5 s) had not passed, so nothing else could have told Caisse earlier.
    let p = app.get_ok(&format!("/v1/paiement/{}", stories.payments["03"])).await;
    let at = |field: &str| Timestamp::parse_rfc3339(text(&p[field])).expect("timestamp").unix_ms();
    assert!(at("paid_at") - at("created_at") >= 1_000, "credited only once a notice came: {p}");
}

#[actix_web::test]
async fn reordered_notices_skip_en_cours_but_end_right() {
    let app = spawn_with_chaos(Chaos::only(Mode::Reorder)).await;
    let stories = run_stories(&app, None).await;
    assert_eq!(notices_delivered(&app), HONEST_NOTICES + STALE_PROCESSING);
    // The final answer came first: these payments went straight from `initie` to their final status, and the
    // "processing" notice behind it changed nothing.
    let ev = events(&app);
    for ending in ["01", "03", "99"] {
        assert_eq!(count(&ev, &stories.payments[ending], "payment.processing"), 0, "payment {ending}: {ev:?}");
    }
}

#[actix_web::test]
async fn contradicting_notices_are_overruled_by_the_status_query() {
    let app = spawn_with_chaos(Chaos::only(Mode::Flap)).await;
    run_stories(&app, None).await;
    // Each final answer was preceded by its opposite (a "failed" before a success, a "succeeded" before the
    // decline and the rejection); run_stories has shown none of them was applied.
    assert_eq!(notices_delivered(&app), HONEST_NOTICES + FLAPPED);
}

#[actix_web::test]
async fn every_mode_at_once_chosen_by_metadata() {
    // The server is well behaved; each payment and payout asks for all the chaos through its metadata, and the
    // refund follows its payment.
    let app = spawn_with_chaos(Chaos::OFF).await;
    run_stories(&app, Some("all")).await;
    assert_eq!(notices_delivered(&app), 3 * (HONEST_NOTICES + FLAPPED + STALE_PROCESSING));
}

#[actix_web::test]
async fn metadata_overrides_the_server_setting_payment_by_payment() {
    let app = spawn_with_chaos(Chaos::only(Mode::Duplicate)).await;
    // (metadata, notices for one ordinary payment: "processing" and "succeeded")
    let cases = [(None, 6), (Some("off"), 2), (Some("flap"), 3), (Some("not-a-mode"), 6), (Some("duplicate,flap"), 9)];
    let mut expected_balance = 0;
    for (metadata, notices) in cases {
        let before = notices_delivered(&app);
        let p = app.initiate(&with_chaos_metadata(payment_body(1_000, "55"), metadata)).await;
        let reference = text(&p["reference"]).to_owned();
        app.wait_payment(&reference, "succes").await;
        wait_simulator_idle(&app).await;
        assert_eq!(notices_delivered(&app) - before, notices, "metadata {metadata:?}");
        expected_balance += 985;
        assert_eq!(app.balance("XOF").await.0, expected_balance, "credited once, metadata {metadata:?}");
        let ev = events(&app);
        assert_eq!(count(&ev, &reference, "payment.succeeded"), 1, "{ev:?}");
    }
    assert_eq!(data(&app.get_ok("/v1/transactions").await).len(), cases.len());
}

/// A payment the provider still showed in progress at its TTL expires, and is asked about again: its late
/// success credits the merchant though the provider's notice of it is lost (ending `04`).
#[actix_web::test]
async fn a_late_success_whose_notice_is_lost_is_learnt_by_asking_again() {
    let app = spawn_with_chaos(Chaos::only(Mode::Lost)).await;
    let late = text(&app.initiate(&payment_body(10_000, "04")).await["reference"]).to_owned();
    app.wait_payment(&late, "expire").await;
    app.wait_payment(&late, "succes").await;
    let ev = events(&app);
    assert_eq!(count(&ev, &late, "payment.failed"), 1, "{ev:?}");
    assert_eq!(count(&ev, &late, "payment.succeeded"), 1, "{ev:?}");
    assert_eq!(notices_delivered(&app) + notices_refused(&app), 0, "not one notice was sent");
    assert!(app.balance("XOF").await.0 > 0, "credited");
}

#[actix_web::test]
async fn lost_notices_are_settled_by_status_queries() {
    // No notice ever arrives: the TTL sweep's last status query settles the payments (to what the provider
    // says, not `expire`), and the reconciliation's queries settle the refund and both payouts.
    let app = spawn_with_chaos(Chaos::only(Mode::Lost)).await;
    let paid = text(&app.initiate(&payment_body(40_000, "99")).await["reference"]).to_owned();
    let declined = text(&app.initiate(&payment_body(5_000, "01")).await["reference"]).to_owned();
    app.wait_payment(&paid, "succes").await;
    let p = app.wait_payment(&declined, "echec").await;
    assert_eq!(p["failure_code"], "insufficient_funds");

    app.send(app.post(&format!("/v1/paiement/{paid}/rembourser")).json(&json!({"montant": 1_000}))).await.expect(200);
    let mut payouts = Vec::new();
    for ending in ["01", "99"] {
        let resp = app.send(app.post("/v1/retraits").json(&payout_body(2_000, ending))).await;
        resp.expect(201);
        payouts.push(text(&resp.json["id"]).to_owned());
    }
    app.wait_refund(&paid, "succes").await;
    app.wait_payment(&paid, "rembourse_partiellement").await;
    let rejected = app.wait_payout(&payouts[0], "rejete").await;
    assert_eq!(rejected["motif_rejet"], "beneficiary_rejected");
    app.wait_payout(&payouts[1], "traite").await;
    assert_eq!(notices_delivered(&app) + notices_refused(&app), 0, "not one notice was sent");

    // 39 400 credited once, minus the 1 000 refund and the processed 2 000 payout; the rejected one released.
    assert_eq!(app.balance("XOF").await, (36_400, 0, 36_400));
    app.audit();
    let ev = events(&app);
    assert_eq!(count(&ev, &paid, "payment.succeeded"), 1, "{ev:?}");
    assert_eq!(count(&ev, &paid, "payment.refunded"), 1, "{ev:?}");
    assert_eq!(count(&ev, &declined, "payment.failed"), 1, "{ev:?}");
    assert_eq!(count(&ev, &payouts[0], "payout.rejected"), 1, "{ev:?}");
    assert_eq!(count(&ev, &payouts[1], "payout.processed"), 1, "{ev:?}");
}
