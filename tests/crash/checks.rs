//! What must hold after every restart, read through the HTTP API: what was acknowledged is there, nothing is
//! doubled, no status went back, the balances are the sum of the movements; and, at the end, which
//! notifications the final state implies.
//!
//! The balance check needs a list of transactions and balances that belong together, while the sandbox keeps
//! moving money after a restart. Every change of a balance sets its `updated_at`, so the test reads the
//! balances, then every page of transactions and payouts, then the balances again, and uses the list only when
//! both balance readings are identical: no money moved while the list was read. Changes that move no money
//! (an initiation, `initie` to `en_cours`) do not matter to the sum.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::load::{Merchant, Run};
use crate::server::Target;
use crate::support::sleep_ms;

/// How long the checks wait for a quiet moment, or for everything to settle.
const DEADLINE: Duration = Duration::from_secs(60);

/// One entry of `GET /v1/transactions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tx {
    pub kind: String,
    pub reference: String,
    pub status: String,
    pub amount: i64,
    pub net_amount: i64,
    pub payment_reference: Option<String>,
}

/// A merchant's transactions and balances, read while no money moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub transactions: Vec<Tx>,
    /// Payout id to the test's tag in its `metadata.op`, from `GET /v1/retraits`.
    pub payout_tags: Vec<(String, String)>,
    /// The XOF row of `GET /v1/soldes` (`Null` before the first payment).
    pub balance: Value,
}

impl Snapshot {
    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Tx> + 'a {
        self.transactions.iter().filter(move |t| t.kind == kind)
    }

    /// True when nothing waits for a provider any more.
    pub fn settled(&self) -> bool {
        self.transactions.iter().all(|t| !matches!(t.status.as_str(), "initie" | "en_cours" | "en_attente"))
    }
}

async fn list_all(target: &Target, key: &str, path: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page_path = match &cursor {
            Some(c) => format!("{path}?limit=100&starting_after={c}"),
            None => format!("{path}?limit=100"),
        };
        let answer = target.get(key, &page_path).await;
        assert_eq!(answer.status, 200, "GET {page_path}: {}", answer.json);
        all.extend(answer.json["data"].as_array().cloned().unwrap_or_default());
        match answer.json["next_cursor"].as_str() {
            Some(next) if answer.json["has_more"] == true => cursor = Some(next.to_owned()),
            _ => return all,
        }
    }
}

async fn xof_balance(target: &Target, key: &str) -> Value {
    let answer = target.get(key, "/v1/soldes").await;
    assert_eq!(answer.status, 200, "GET /v1/soldes: {}", answer.json);
    let rows = answer.json["data"].as_array().cloned().unwrap_or_default();
    rows.into_iter().find(|r| r["devise"] == "XOF").unwrap_or(Value::Null)
}

pub async fn snapshot(target: &Target, merchant: &Merchant) -> Snapshot {
    let started = Instant::now();
    loop {
        let before = xof_balance(target, &merchant.key).await;
        let transactions = list_all(target, &merchant.key, "/v1/transactions").await;
        let payouts = list_all(target, &merchant.key, "/v1/retraits").await;
        let after = xof_balance(target, &merchant.key).await;
        if before == after {
            let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
            let transactions = transactions
                .iter()
                .map(|t| Tx {
                    kind: text(&t["type"]),
                    reference: text(&t["reference"]),
                    status: text(&t["statut"]),
                    amount: t["montant"].as_i64().unwrap_or(-1),
                    net_amount: t["montant_net"].as_i64().unwrap_or(-1),
                    payment_reference: t["paiement_reference"].as_str().map(str::to_owned),
                })
                .collect();
            let payout_tags = payouts.iter().map(|p| (text(&p["id"]), text(&p["metadata"]["op"]))).collect();
            return Snapshot { transactions, payout_tags, balance: after };
        }
        assert!(started.elapsed() < DEADLINE, "{}: money kept moving for {DEADLINE:?}", merchant.name);
        sleep_ms(50).await;
    }
}

/// Whether a payment, refund or payout may go from `from` to `to` in zero or more transitions (docs/api.md
/// § Payments, Refunds, Payouts).
fn reachable(from: &str, to: &str) -> bool {
    from == to
        || match from {
            "initie" => {
                matches!(to, "en_cours" | "succes" | "echec" | "expire" | "rembourse_partiellement" | "rembourse")
            }
            "en_cours" => matches!(to, "succes" | "echec" | "expire" | "rembourse_partiellement" | "rembourse"),
            "expire" => matches!(to, "succes" | "rembourse_partiellement" | "rembourse"),
            "succes" => matches!(to, "rembourse_partiellement" | "rembourse"),
            "rembourse_partiellement" => to == "rembourse",
            "en_attente" => matches!(to, "traite" | "rejete"),
            _ => false,
        }
}

/// Notes the status every verified webhook carried since the last call: each was durable when sent.
pub fn observe_webhooks(merchant: &Merchant, read: &mut usize) {
    let fresh = merchant.receiver.deliveries_from(*read);
    *read += fresh.len();
    let mut book = merchant.book.borrow_mut();
    for delivery in fresh {
        book.observe(&delivery.reference, &delivery.status);
    }
}

/// Payments (with the refund reference answered since the check cycle, if any) and payouts (tag, id) to read
/// one by one.
type Recent = (Vec<(String, Option<String>)>, Vec<(String, String)>);

/// Compares one merchant's snapshot with its book: what was acknowledged is there, nothing is doubled or
/// comes from a refused request, no status went back, and the balances are the sum of the movements. Then
/// reads every operation answered since `since_cycle` one by one. Returns what is wrong.
pub async fn check_merchant(target: &Target, merchant: &Merchant, snap: &Snapshot, since_cycle: u32) -> Vec<String> {
    let (mut wrong, (payments, payouts)) = compare(merchant, snap, since_cycle);
    let name = &merchant.name;
    for (reference, refund) in payments {
        let answer = target.get(&merchant.key, &format!("/v1/paiement/{reference}")).await;
        if answer.status != 200 {
            wrong.push(format!("{name}: GET /v1/paiement/{reference}: {} {}", answer.status, answer.json));
            continue;
        }
        merchant.book.borrow_mut().observe_payment(&answer.json);
        if let Some(refund) = refund {
            if answer.json["remboursement"]["reference"] != refund.as_str() {
                wrong.push(format!("{name}: payment {reference} does not show its refund {refund}: {}", answer.json));
            }
            let answer = target.get(&merchant.key, &format!("/v1/transactions/{refund}")).await;
            if answer.status != 200 || answer.json["paiement_reference"] != reference.as_str() {
                wrong.push(format!("{name}: GET /v1/transactions/{refund}: {} {}", answer.status, answer.json));
            }
        }
    }
    for (tag, id) in payouts {
        let answer = target.get(&merchant.key, &format!("/v1/retraits/{id}")).await;
        if answer.status != 200 || answer.json["metadata"]["op"] != tag.as_str() {
            wrong.push(format!("{name}: GET /v1/retraits/{id} ({tag}): {} {}", answer.status, answer.json));
            continue;
        }
        merchant.book.borrow_mut().observe(&id, answer.json["statut"].as_str().unwrap_or(""));
    }
    wrong
}

/// The part of [`check_merchant`] that needs no request: the findings, and what to read one by one.
fn compare(merchant: &Merchant, snap: &Snapshot, since_cycle: u32) -> (Vec<String>, Recent) {
    let mut wrong = Vec::new();
    let name = &merchant.name;

    // Nothing doubled: one entry per reference, one refund per payment, one payout per tag.
    let mut by_reference: HashMap<&str, &Tx> = HashMap::new();
    for tx in &snap.transactions {
        if by_reference.insert(&tx.reference, tx).is_some() {
            wrong.push(format!("{name}: {} {} is listed twice", tx.kind, tx.reference));
        }
    }
    let mut refund_of: HashMap<&str, &Tx> = HashMap::new();
    for tx in snap.of_kind("remboursement") {
        let payment = tx.payment_reference.as_deref().unwrap_or("");
        if refund_of.insert(payment, tx).is_some() {
            wrong.push(format!("{name}: payment {payment} has two refunds"));
        }
    }
    let mut tag_of: HashMap<&str, &str> = HashMap::new();
    let mut ids_of_tag: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (id, tag) in &snap.payout_tags {
        tag_of.insert(id, tag);
        ids_of_tag.entry(tag).or_default().push(id);
    }
    for (tag, ids) in &ids_of_tag {
        if ids.len() > 1 {
            wrong.push(format!("{name}: payout request {tag} made {} payouts: {ids:?}", ids.len()));
        }
    }

    // Balances: the sum of the movements, never negative.
    let (mut available, mut pending) = (0i64, 0i64);
    for tx in &snap.transactions {
        match (tx.kind.as_str(), tx.status.as_str()) {
            ("paiement", "succes" | "rembourse_partiellement" | "rembourse") => available += tx.net_amount,
            ("remboursement" | "retrait", "en_cours" | "en_attente") => {
                available -= tx.amount;
                pending += tx.amount;
            }
            ("remboursement", "succes") | ("retrait", "traite") => available -= tx.amount,
            _ => {}
        }
    }
    let shown = |field: &str| snap.balance[field].as_i64().unwrap_or(0);
    let (shown_available, shown_pending, shown_total) = (shown("disponible"), shown("en_attente"), shown("total"));
    if (shown_available, shown_pending) != (available, pending) {
        wrong.push(format!(
            "{name}: balances disponible {shown_available}, en_attente {shown_pending}; the transactions add up \
             to disponible {available}, en_attente {pending}"
        ));
    }
    if shown_available < 0 || shown_pending < 0 || shown_total != shown_available + shown_pending {
        wrong.push(format!("{name}: impossible balances {}", snap.balance));
    }

    let mut book = merchant.book.borrow_mut();
    // Everything listed comes from a request of this test that was not refused, with its amount.
    for tx in snap.of_kind("paiement") {
        match book.payments.get(&tx.reference) {
            None => wrong.push(format!("{name}: payment {} was never requested", tx.reference)),
            Some(op) if op.refused() => {
                wrong.push(format!("{name}: payment {} exists though it was refused ({:?})", tx.reference, op.outcome))
            }
            Some(op) if op.amount != tx.amount => {
                wrong.push(format!("{name}: payment {} is of {}, requested {}", tx.reference, tx.amount, op.amount))
            }
            Some(_) => {}
        }
    }
    for tx in snap.of_kind("remboursement") {
        let payment = tx.payment_reference.as_deref().unwrap_or("");
        match book.refunds.get(payment) {
            None => wrong.push(format!("{name}: refund {} of {payment} was never requested", tx.reference)),
            Some(op) if op.refused() => wrong.push(format!(
                "{name}: refund {} of {payment} exists though it was refused ({:?})",
                tx.reference, op.outcome
            )),
            Some(op) if op.amount != tx.amount || op.id.as_ref().is_some_and(|id| *id != tx.reference) => {
                wrong.push(format!(
                    "{name}: refund {} of {payment} for {} is not the one answered: {op:?}",
                    tx.reference, tx.amount
                ))
            }
            Some(_) => {}
        }
    }
    for tx in snap.of_kind("retrait") {
        let tag = tag_of.get(tx.reference.as_str()).copied().unwrap_or("");
        match book.payouts.get(tag) {
            None => wrong.push(format!("{name}: payout {} ({tag:?}) was never requested", tx.reference)),
            Some(op) if op.refused() => wrong.push(format!(
                "{name}: payout {} ({tag}) exists though it was refused ({:?})",
                tx.reference, op.outcome
            )),
            Some(op) if op.amount != tx.amount || op.id.as_ref().is_some_and(|id| *id != tx.reference) => wrong.push(
                format!("{name}: payout {} ({tag}) for {} is not the one answered: {op:?}", tx.reference, tx.amount),
            ),
            Some(_) => {}
        }
    }

    // Everything acknowledged is there.
    for (reference, op) in &book.payments {
        if op.must_exist() && !by_reference.contains_key(reference.as_str()) {
            wrong.push(format!("{name}: acknowledged payment {reference} is gone ({op:?})"));
        }
    }
    for (payment, op) in &book.refunds {
        if op.must_exist() && !refund_of.contains_key(payment.as_str()) {
            wrong.push(format!("{name}: acknowledged refund of {payment} is gone ({op:?})"));
        }
    }
    for (tag, op) in &book.payouts {
        if op.must_exist() && !ids_of_tag.contains_key(tag.as_str()) {
            wrong.push(format!("{name}: acknowledged payout {tag} is gone ({op:?})"));
        }
    }

    // No status went back: the current one is reachable from every one seen before; nothing seen is gone.
    for (reference, statuses) in &book.seen {
        match by_reference.get(reference.as_str()) {
            None => wrong.push(format!("{name}: {reference} was seen as {statuses:?} and is gone")),
            Some(tx) => {
                for seen in statuses.iter().filter(|s| !reachable(s, &tx.status)) {
                    wrong.push(format!("{name}: {reference} was seen {seen}, is now {}", tx.status));
                }
            }
        }
    }
    for tx in &snap.transactions {
        book.observe(&tx.reference, &tx.status);
    }

    // Each operation answered since the last check, read on its own.
    let recent = |op: &crate::load::Op| op.must_exist() && op.answered_in >= since_cycle;
    let payments: Vec<(String, Option<String>)> = book
        .payments
        .iter()
        .filter(|(reference, op)| recent(op) || book.refunds.get(*reference).is_some_and(recent))
        .map(|(reference, _)| {
            (reference.clone(), book.refunds.get(reference).filter(|r| recent(r)).and_then(|r| r.id.clone()))
        })
        .collect();
    let payouts: Vec<(String, String)> = book
        .payouts
        .iter()
        .filter(|(_, op)| recent(op))
        .filter_map(|(tag, op)| op.id.clone().map(|id| (tag.clone(), id)))
        .collect();
    (wrong, (payments, payouts))
}

/// Waits until nothing waits for a provider and two readings 1.5 s apart are identical, then returns them.
pub async fn settle(run: &Run) -> Vec<Snapshot> {
    let started = Instant::now();
    let mut previous: Option<Vec<Snapshot>> = None;
    loop {
        let mut snaps = Vec::new();
        for merchant in &run.merchants {
            snaps.push(snapshot(&run.target, merchant).await);
        }
        if snaps.iter().all(Snapshot::settled) && previous.as_ref() == Some(&snaps) {
            return snaps;
        }
        let pending: Vec<String> = snaps
            .iter()
            .flat_map(|s| &s.transactions)
            .filter(|t| matches!(t.status.as_str(), "initie" | "en_cours" | "en_attente"))
            .map(|t| format!("{t:?}"))
            .collect();
        assert!(
            started.elapsed() < DEADLINE,
            "not settled after {DEADLINE:?}: {} transactions still pending:\n{}",
            pending.len(),
            pending.join("\n")
        );
        previous = Some(snaps);
        sleep_ms(1_500).await;
    }
}

/// The notifications the final state implies, as (event, reference): every payment was initiated; each
/// status it was seen in since has its event; each payout's outcome has its event.
pub fn expected_notifications(merchant: &Merchant, snap: &Snapshot) -> BTreeSet<(String, String)> {
    let book = merchant.book.borrow();
    let mut expected = BTreeSet::new();
    let mut add = |event: &str, reference: &str| expected.insert((event.to_owned(), reference.to_owned()));
    for tx in &snap.transactions {
        let seen = book.seen.get(&tx.reference).cloned().unwrap_or_default();
        let was = |s: &str| tx.status == s || seen.contains(s);
        match tx.kind.as_str() {
            "paiement" => {
                add("payment.initiated", &tx.reference);
                if was("en_cours") {
                    add("payment.processing", &tx.reference);
                }
                if was("succes") || was("rembourse_partiellement") || was("rembourse") {
                    add("payment.succeeded", &tx.reference);
                }
                if was("echec") || was("expire") {
                    add("payment.failed", &tx.reference);
                }
                if was("rembourse_partiellement") || was("rembourse") {
                    add("payment.refunded", &tx.reference);
                }
            }
            "retrait" if tx.status == "traite" => {
                add("payout.processed", &tx.reference);
            }
            "retrait" if tx.status == "rejete" => {
                add("payout.rejected", &tx.reference);
            }
            _ => {}
        }
    }
    expected
}
