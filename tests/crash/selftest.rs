//! The checks can fail: each kind of damage a crash could do to what the API shows, made by hand, is reported
//! by [`check_merchant`].

use std::net::TcpListener;

use crate::checks::{check_merchant, Snapshot, Tx};
use crate::load::{Book, Merchant, Op, Outcome};
use crate::receiver::Receiver;
use crate::server::Target;

fn op(amount: i64, outcome: Outcome, id: Option<&str>) -> Op {
    Op { amount, keyed: true, outcome, answered_in: 0, id: id.map(str::to_owned) }
}

fn tx(kind: &str, reference: &str, status: &str, amount: i64, net_amount: i64, of: Option<&str>) -> Tx {
    Tx {
        kind: kind.to_owned(),
        reference: reference.to_owned(),
        status: status.to_owned(),
        amount,
        net_amount,
        payment_reference: of.map(str::to_owned),
    }
}

/// Two payments credited, a refund in progress on the first, one payout sent.
fn book() -> Book {
    let mut book = Book::default();
    book.payments.insert("p1".into(), op(10_000, Outcome::Acked, None));
    book.payments.insert("p2".into(), op(5_000, Outcome::Acked, None));
    book.refunds.insert("p1".into(), op(2_000, Outcome::Acked, Some("rmb_1")));
    book.payouts.insert("o1".into(), op(1_000, Outcome::Acked, Some("ret_1")));
    book.payouts.insert("o2".into(), op(1_000, Outcome::Refused("409 insufficient_balance".into()), None));
    book.observe("p1", "succes");
    book.observe("ret_1", "en_attente");
    book
}

fn snapshot() -> Snapshot {
    Snapshot {
        transactions: vec![
            tx("paiement", "p1", "succes", 10_000, 9_850, None),
            tx("paiement", "p2", "succes", 5_000, 4_925, None),
            tx("remboursement", "rmb_1", "en_cours", 2_000, 2_000, Some("p1")),
            tx("retrait", "ret_1", "traite", 1_000, 990, None),
        ],
        payout_tags: vec![("ret_1".into(), "o1".into())],
        balance: serde_json::json!({"devise": "XOF", "disponible": 11_775, "en_attente": 2_000, "total": 13_775}),
    }
}

#[actix_web::test]
async fn the_checks_catch_lost_doubled_refused_regressed_and_miscounted_changes() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("receiver binds");
    let receiver = Receiver::start(listener, "sk_test_unused".into());
    let merchant = Merchant::new("m".into(), "mch_unused".into(), "sk_test_unused".into(), receiver);
    // No server: nothing was answered since cycle u32::MAX, so the checks read nothing one by one.
    let target = Target::new(crate::support::free_port());
    let check = |snap: Snapshot| {
        *merchant.book.borrow_mut() = book();
        let (target, merchant) = (&target, &merchant);
        async move { check_merchant(target, merchant, &snap, u32::MAX).await }
    };
    assert_eq!(check(snapshot()).await, Vec::<String>::new(), "the intact state passes");

    let set_balance = |snap: &mut Snapshot, available: i64| {
        snap.balance["disponible"] = available.into();
        snap.balance["total"] = (available + 2_000).into();
    };
    let mut damages: Vec<(Snapshot, &str)> = Vec::new();
    let mut lost = snapshot();
    lost.transactions.remove(1);
    set_balance(&mut lost, 11_775 - 4_925);
    damages.push((lost, "acknowledged payment p2 is gone"));
    let mut credited_twice = snapshot();
    set_balance(&mut credited_twice, 11_775 + 4_925);
    damages.push((credited_twice, "the transactions add up to disponible 11775"));
    let mut listed_twice = snapshot();
    listed_twice.transactions.push(tx("paiement", "p2", "succes", 5_000, 4_925, None));
    set_balance(&mut listed_twice, 11_775 + 4_925);
    damages.push((listed_twice, "paiement p2 is listed twice"));
    let mut regressed = snapshot();
    regressed.transactions[0].status = "en_cours".into();
    damages.push((regressed, "p1 was seen succes, is now en_cours"));
    let mut refused_landed = snapshot();
    refused_landed.transactions.push(tx("retrait", "ret_2", "traite", 1_000, 990, None));
    refused_landed.payout_tags.push(("ret_2".into(), "o2".into()));
    set_balance(&mut refused_landed, 11_775 - 1_000);
    damages.push((refused_landed, "exists though it was refused"));
    let mut negative = snapshot();
    negative.balance["disponible"] = (-1).into();
    damages.push((negative, "impossible balances"));
    let mut seen_gone = snapshot();
    seen_gone.transactions.retain(|t| t.reference != "ret_1");
    seen_gone.payout_tags.clear();
    set_balance(&mut seen_gone, 11_775 + 1_000);
    damages.push((seen_gone, "ret_1 was seen as"));

    for (damaged, expected) in damages {
        let found = check(damaged).await;
        assert!(found.iter().any(|f| f.contains(expected)), "expected `{expected}`, found {found:#?}");
    }
}
