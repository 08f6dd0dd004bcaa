//! The engine through its public surface: actors, store, recovery and the outbox, on a fresh temp dir each.

mod support;

use support::{new_link, new_payment, new_payout, xof, RawTrees};

use caisse_engine::core::{Command, PaymentNotice, PayoutOutcome, RefundOutcome};
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::money::Amount;
use caisse_engine::domain::records::{DeliveryState, TransactionType, WebhookBody};
use caisse_engine::domain::status::{EventKind, PaymentStatus, PayoutStatus, RefundStatus};
use caisse_engine::domain::text::{IdempotencyKey, Reference};
use caisse_engine::domain::time::Timestamp;
use caisse_engine::{Engine, EngineConfig, EngineError, Executed, Idempotency, Part, Record, Rejection};

fn done(result: Result<Executed, EngineError>) -> Record {
    match result {
        Ok(Executed::Done(record)) => record,
        other => panic!("expected a change, got {other:?}"),
    }
}

fn payment_of(record: Record) -> caisse_engine::domain::records::Payment {
    match record {
        Record::Payment(p) => p,
        other => panic!("expected a payment, got {other:?}"),
    }
}

async fn pay(engine: &Engine, m: &MerchantId, amount: i64) -> caisse_engine::domain::records::Payment {
    let p = payment_of(done(engine.execute(m, Command::InitiatePayment(new_payment(amount, None)), None).await));
    let cmd = Command::PaymentNotice { reference: p.reference.clone(), notice: PaymentNotice::Confirmed };
    payment_of(done(engine.execute(m, cmd, None).await))
}

/// Refunds one at a time: a part, a refused one, then the rest; the payment ends `rembourse` with every
/// refund listed, and the fees stay with the service (two payments' funds pay for one full refund).
#[actix::test]
async fn several_refunds_take_a_payment_to_rembourse() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    let m = MerchantId::new();
    let reference = pay(&engine, &m, 10_000).await.reference;
    pay(&engine, &m, 10_000).await;
    let steps = [
        (Some(4_000), RefundOutcome::Completed, PaymentStatus::PartlyRefunded),
        (Some(1_000), RefundOutcome::Refused, PaymentStatus::PartlyRefunded),
        (None, RefundOutcome::Completed, PaymentStatus::Refunded),
    ];
    for (amount, outcome, status) in steps {
        let amount = amount.map(|a| Amount::positive(a).unwrap());
        let cmd = Command::RequestRefund { reference: reference.clone(), amount, reason: None };
        let p = payment_of(done(engine.execute(&m, cmd, None).await));
        let refund = p.refund.as_ref().unwrap().reference.clone();
        // One at a time: another refund while this one is under way is refused.
        let again = Command::RequestRefund { reference: reference.clone(), amount: None, reason: None };
        let refused = engine.execute(&m, again, None).await;
        assert!(matches!(refused, Err(EngineError::Rejected(Rejection::InvalidState(_)))), "{refused:?}");
        let cmd = Command::RefundNotice { reference: reference.clone(), refund, outcome };
        assert_eq!(payment_of(done(engine.execute(&m, cmd, None).await)).status, status);
    }
    let p = engine.payment(&m, reference.as_str()).await.unwrap().unwrap();
    let refunds: Vec<_> = p.refunds.iter().map(|r| (r.amount.minor(), r.status)).collect();
    assert_eq!(
        refunds,
        [(4_000, RefundStatus::Succeeded), (1_000, RefundStatus::Failed), (6_000, RefundStatus::Succeeded)]
    );
    assert_eq!(p.refunded_amount.minor(), 10_000);
    let b = engine.balances(&m).await.unwrap().get(xof());
    assert_eq!((b.available, b.pending), (2 * 9_850 - 10_000, 0));
    // Nothing is left to refund.
    let cmd = Command::RequestRefund { reference: reference.clone(), amount: None, reason: None };
    assert!(matches!(engine.execute(&m, cmd, None).await, Err(EngineError::Rejected(Rejection::InvalidState(_)))));
}

#[actix::test]
async fn a_full_life_moves_money_and_writes_notifications() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    let m = MerchantId::new();

    let p =
        payment_of(done(engine.execute(&m, Command::InitiatePayment(new_payment(10_000, Some("cmd-1"))), None).await));
    assert_eq!(p.status, PaymentStatus::Initiated);
    assert_eq!((p.fee.minor(), p.net_amount.minor()), (150, 9_850));
    let reference = p.reference.clone();

    for notice in [PaymentNotice::Processing, PaymentNotice::Confirmed, PaymentNotice::Confirmed] {
        engine.execute(&m, Command::PaymentNotice { reference: reference.clone(), notice }, None).await.unwrap();
    }
    let b = engine.balances(&m).await.unwrap().get(xof());
    assert_eq!((b.available, b.pending), (9_850, 0), "credited once despite the duplicate notice");

    let cmd = Command::RequestRefund {
        reference: reference.clone(),
        amount: Some(Amount::positive(4_000).unwrap()),
        reason: None,
    };
    let p = payment_of(done(engine.execute(&m, cmd, None).await));
    assert_eq!(p.refund.as_ref().unwrap().status, RefundStatus::Processing);
    let b = engine.balances(&m).await.unwrap().get(xof());
    assert_eq!((b.available, b.pending), (5_850, 4_000));

    let refund = p.refunds[0].reference.clone();
    let cmd = Command::RefundNotice { reference: reference.clone(), refund, outcome: RefundOutcome::Completed };
    let p = payment_of(done(engine.execute(&m, cmd, None).await));
    assert_eq!(p.status, PaymentStatus::PartlyRefunded);
    assert_eq!(p.refunded_amount.minor(), 4_000);

    let o = match done(engine.execute(&m, Command::CreatePayout(new_payout(5_000)), None).await) {
        Record::Payout(o) => o,
        other => panic!("{other:?}"),
    };
    assert_eq!(o.status, PayoutStatus::Pending);
    let too_much = engine.execute(&m, Command::CreatePayout(new_payout(900)), None).await;
    assert!(matches!(too_much, Err(EngineError::Rejected(Rejection::InsufficientBalance { .. }))), "{too_much:?}");
    let cmd = Command::PayoutNotice { id: o.id.clone(), outcome: PayoutOutcome::Sent };
    engine.execute(&m, cmd, None).await.unwrap();
    let b = engine.balances(&m).await.unwrap().get(xof());
    assert_eq!((b.available, b.pending), (850, 0));

    // A payment, its refund and a payout are each found by their reference, and none of them can be reused
    // as a new payment's.
    let refund = p.refund.as_ref().unwrap().reference.clone();
    for (found_by, kind) in [
        (reference.as_str(), TransactionType::Payment),
        (refund.as_str(), TransactionType::Refund),
        (o.id.as_str(), TransactionType::Payout),
    ] {
        let located = engine.locate(&m, found_by).unwrap().unwrap();
        assert_eq!((located.kind, located.reference.as_str()), (kind, found_by));
        let again = engine.execute(&m, Command::InitiatePayment(new_payment(1_000, Some(found_by))), None).await;
        assert!(matches!(again, Err(EngineError::Rejected(Rejection::DuplicateReference))), "{found_by}: {again:?}");
    }
    assert!(engine.locate(&m, "cmd-unknown").unwrap().is_none());

    // One notification per status change, each with the documented body.
    let due = engine.due_notifications(Timestamp::now(), 100).unwrap();
    let events: Vec<EventKind> = due.iter().map(|n| n.event).collect();
    assert_eq!(
        events,
        [
            EventKind::PaymentInitiated,
            EventKind::PaymentProcessing,
            EventKind::PaymentSucceeded,
            EventKind::PaymentRefunded,
            EventKind::PayoutProcessed
        ]
    );
    for n in &due {
        assert_eq!(n.state, DeliveryState::Pending);
        let body: WebhookBody = serde_json::from_str(&n.body).unwrap();
        assert_eq!(body.event, n.event);
    }
}

#[actix::test]
async fn refusals_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    let m = MerchantId::new();
    let p = payment_of(done(engine.execute(&m, Command::InitiatePayment(new_payment(1_000, Some("dup"))), None).await));
    let again = engine.execute(&m, Command::InitiatePayment(new_payment(1_000, Some("dup"))), None).await;
    assert_eq!(again, Err(EngineError::Rejected(Rejection::DuplicateReference)));
    let refund = Command::RequestRefund { reference: p.reference.clone(), amount: None, reason: None };
    assert!(matches!(engine.execute(&m, refund, None).await, Err(EngineError::Rejected(Rejection::InvalidState(_)))));
    let unknown =
        Command::PaymentNotice { reference: Reference::parse("nope").unwrap(), notice: PaymentNotice::Confirmed };
    assert_eq!(engine.execute(&m, unknown, None).await, Err(EngineError::Rejected(Rejection::NotFound)));
    // Another merchant does not see this one's payment.
    let other = MerchantId::new();
    assert_eq!(engine.payment(&other, "dup").await.unwrap(), None);
    assert!(engine.payment(&m, "dup").await.unwrap().is_some());
}

#[actix::test]
async fn idempotency_replays_and_refuses_reuse() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    let m = MerchantId::new();
    let idem = |fingerprint: &str| Some(key_1(fingerprint));
    let first = done(engine.execute(&m, Command::InitiatePayment(new_payment(1_000, None)), idem("a")).await);
    let replay = engine.execute(&m, Command::InitiatePayment(new_payment(1_000, None)), idem("a")).await.unwrap();
    match replay {
        Executed::Replayed { status, body } => {
            assert_eq!(status, 201);
            assert_eq!(body, serde_json::to_string(&payment_of(first)).unwrap());
        }
        other => panic!("{other:?}"),
    }
    let reused = engine.execute(&m, Command::InitiatePayment(new_payment(2_000, None)), idem("b")).await;
    assert_eq!(reused, Err(EngineError::IdempotencyKeyReused));
    // A record stored with the fingerprint an earlier version computed still replays its request.
    let mut upgraded = idem("b");
    if let Some(i) = upgraded.as_mut() {
        i.earlier_fingerprint = Some("a".into());
    }
    let replay = engine.execute(&m, Command::InitiatePayment(new_payment(1_000, None)), upgraded).await;
    assert!(matches!(replay, Ok(Executed::Replayed { status: 201, .. })), "{replay:?}");
}

/// The API's part of a request made with the key `key-1` and this fingerprint, answered 201.
fn key_1(fingerprint: &str) -> Idempotency {
    Idempotency {
        key: IdempotencyKey::parse("key-1").unwrap(),
        fingerprint: fingerprint.into(),
        earlier_fingerprint: None,
        success_status: 201,
        part: Part::Only,
    }
}

/// A request that goes on after its first change (it asks its provider) holds its key: another request with it
/// is 409 in use until the release, then a replay of what the request answered.
#[actix::test]
async fn a_held_key_is_in_use_until_its_request_releases_it() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    let m = MerchantId::new();
    let idem = key_1("a");
    let initiate = || Command::InitiatePayment(new_payment(1_000, None));
    let first = done(engine.execute(&m, initiate(), Some(idem.clone().holding())).await);
    let retry = engine.execute(&m, initiate(), Some(idem.clone())).await;
    assert_eq!(retry, Err(EngineError::IdempotencyKeyInUse), "the request still goes on");
    let notice = PaymentNotice::Declined { failure_code: "payer_not_found".into() };
    let declined = Command::PaymentNotice { reference: payment_of(first).reference, notice };
    let answered = payment_of(done(engine.execute(&m, declined, Some(idem.following())).await));
    assert_eq!(engine.execute(&m, initiate(), Some(idem.clone())).await, Err(EngineError::IdempotencyKeyInUse));
    engine.release_key(&m, idem.key.clone()).await.unwrap();
    match engine.execute(&m, initiate(), Some(idem)).await.unwrap() {
        Executed::Replayed { status, body } => {
            assert_eq!(status, 201);
            assert_eq!(body, serde_json::to_string(&answered).unwrap(), "what the request answered");
        }
        other => panic!("{other:?}"),
    }
}

/// A change the request makes after its first (the provider refused at once) rewrites the stored answer: the
/// replay is the payment declined, as the request answered, and keeps the first answer's status and age.
#[actix::test]
async fn a_change_that_follows_the_first_is_what_the_key_replays() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    let m = MerchantId::new();
    let idem = key_1("a");
    let first = done(engine.execute(&m, Command::InitiatePayment(new_payment(1_000, None)), Some(idem.clone())).await);
    let reference = payment_of(first).reference;
    let declined = Command::PaymentNotice {
        reference: reference.clone(),
        notice: PaymentNotice::Declined { failure_code: "invalid_currency".into() },
    };
    let after = payment_of(done(engine.execute(&m, declined, Some(idem.following())).await));
    let replay = engine.execute(&m, Command::InitiatePayment(new_payment(1_000, None)), Some(idem.clone())).await;
    match replay.unwrap() {
        Executed::Replayed { status, body } => {
            assert_eq!(status, 201);
            assert_eq!(body, serde_json::to_string(&after).unwrap());
        }
        other => panic!("{other:?}"),
    }
    // Another request under the key is still refused: the following change kept the first one's fingerprint.
    let other = Idempotency { fingerprint: "b".into(), ..idem };
    let reused = engine.execute(&m, Command::InitiatePayment(new_payment(2_000, None)), Some(other)).await;
    assert_eq!(reused, Err(EngineError::IdempotencyKeyReused));
}

/// A provider's notice may move the record before the request's own later step applies the same answer: the
/// step changes nothing, and the request answers the record as it is. The replay must answer the same, not the
/// first answer the notice made stale.
#[actix::test]
async fn a_following_step_that_changes_nothing_still_sets_what_the_key_replays() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    let m = MerchantId::new();
    let idem = key_1("a");
    let initiate = || Command::InitiatePayment(new_payment(1_000, None));
    let first = payment_of(done(engine.execute(&m, initiate(), Some(idem.clone())).await));
    let declined = || Command::PaymentNotice {
        reference: first.reference.clone(),
        notice: PaymentNotice::Declined { failure_code: "payer_not_found".into() },
    };
    // The provider's callback, with no key, gets there first.
    let noticed = payment_of(done(engine.execute(&m, declined(), None).await));
    assert_ne!(noticed, first);
    let answered = payment_of(done(engine.execute(&m, declined(), Some(idem.following())).await));
    assert_eq!(answered, noticed, "nothing more to change");
    match engine.execute(&m, initiate(), Some(idem.clone())).await.unwrap() {
        Executed::Replayed { status, body } => {
            assert_eq!(status, 201);
            assert_eq!(body, serde_json::to_string(&answered).unwrap(), "what the request answered");
        }
        other => panic!("{other:?}"),
    }
    // Written once: the same step again finds the answer already right.
    let again = payment_of(done(engine.execute(&m, declined(), Some(idem.following())).await));
    assert_eq!(again, answered);
    assert_eq!(engine.journal(&m, 1, 100).unwrap().len(), 2, "no journal event for an answer written again");
}

#[test]
fn recovery_after_restart_keeps_every_change_and_passes_the_audit() {
    let dir = tempfile::tempdir().unwrap();
    let m = MerchantId::new();
    let mut config = EngineConfig::new(dir.path());
    config.actors.snapshot_every = 3;
    actix::System::new().block_on({
        let (config, m) = (config.clone(), m.clone());
        async move {
            let engine = Engine::open(config).unwrap();
            for _ in 0..10 {
                pay(&engine, &m, 1_000).await;
            }
        }
    });
    actix::System::new().block_on(async move {
        let engine = Engine::open(config).unwrap();
        assert_eq!(engine.audit_report().events, 20);
        let b = engine.balances(&m).await.unwrap().get(xof());
        assert_eq!(b.available, 10 * 985);
        // The actor resumed at the right journal position: new changes append after the old ones.
        pay(&engine, &m, 1_000).await;
        let journal = engine.journal(&m, 1, 100).unwrap();
        assert_eq!(journal.len(), 22);
        assert!(journal.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    });
}

/// A link names a currency but opens no balance in it, before a restart as after: the balances a reloaded
/// actor shows are the ones it showed.
#[test]
fn a_link_opens_no_balance_before_or_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let m = MerchantId::new();
    let config = EngineConfig::new(dir.path());
    let currencies =
        |b: caisse_engine::domain::ledger::Balances| b.0.keys().map(|c| c.code().to_owned()).collect::<Vec<_>>();
    let before = actix::System::new().block_on({
        let (config, m) = (config.clone(), m.clone());
        async move {
            let engine = Engine::open(config).unwrap();
            pay(&engine, &m, 1_000).await;
            let mut link = new_link(5_000, None);
            link.currency = caisse_engine::domain::money::Currency::EUR;
            let Executed::Done(Record::Link(made)) =
                done_or_panic(engine.execute(&m, Command::CreateLink(link), None).await)
            else {
                panic!("a link")
            };
            let deactivate = Command::DeactivateLink { id: made.id.clone() };
            done_or_panic(engine.execute(&m, deactivate, None).await);
            currencies(engine.balances(&m).await.unwrap())
        }
    });
    assert_eq!(before, ["XOF"]);
    let after = actix::System::new().block_on(async move {
        let engine = Engine::open(config).unwrap();
        currencies(engine.balances(&m).await.unwrap())
    });
    assert_eq!(after, before);
}

fn done_or_panic(executed: Result<Executed, EngineError>) -> Executed {
    executed.unwrap_or_else(|e| panic!("{e}"))
}

#[actix::test]
async fn many_merchants_in_parallel() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    let merchants: Vec<MerchantId> = (0..50).map(|_| MerchantId::new()).collect();
    let mut tasks = Vec::new();
    for m in &merchants {
        for _ in 0..4 {
            let (engine, m) = (engine.clone(), m.clone());
            tasks.push(actix::spawn(async move { pay(&engine, &m, 2_000).await }));
        }
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().status, PaymentStatus::Succeeded);
    }
    for m in &merchants {
        assert_eq!(engine.balances(m).await.unwrap().get(xof()).available, 4 * 1_970);
    }
}

#[actix::test]
async fn the_due_scan_drops_entries_left_by_a_stale_save() {
    use caisse_engine::domain::records::DeliveryState;
    let dir = tempfile::tempdir().unwrap();
    let (engine, store) = support::engine_and_store(EngineConfig::new(dir.path()));
    let m = MerchantId::new();
    pay(&engine, &m, 1_000).await;
    let now = Timestamp::now();
    let n = store.due_notifications(now, 10).unwrap().remove(0);
    // A save made from a stale read names another due time, so the real entry stays behind as an orphan.
    let mut stale_before = n.clone();
    stale_before.next_attempt_at = Some(Timestamp::from_unix_ms(1));
    let mut after = n.clone();
    after.state = DeliveryState::Delivered;
    after.next_attempt_at = None;
    store.save_notification(&stale_before, &after, None).unwrap().await.unwrap().unwrap();
    let due = store.due_notifications(now, 10).unwrap();
    assert!(due.iter().all(|d| d.id != n.id), "a delivered notification was offered again");
    // The scan also removed the orphan: later scans no longer even look at it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let mut seen = false;
        store
            .due_notifications_skipping(Timestamp::from_unix_ms(0), now, 10, &mut |id| {
                seen |= id == n.id;
                false
            })
            .unwrap();
        if !seen {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the orphan due entry was never removed");
        actix_rt::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[actix::test]
async fn the_pending_list_is_walked_a_page_at_a_time_oldest_first_and_forgets_what_settled() {
    use caisse_engine::domain::records::TransactionType;
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    let (a, b) = (MerchantId::new(), MerchantId::new());
    let mut made = Vec::new();
    for (i, m) in [&a, &b, &a, &b, &a].into_iter().enumerate() {
        let cmd = Command::InitiatePayment(new_payment(1_000 + i as i64, None));
        made.push(payment_of(done(engine.execute(m, cmd, None).await)).reference.into_string());
        // Distinct creation milliseconds, so "oldest first" has one answer.
        actix_rt::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let later = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + 1_000);
    let mut walked = Vec::new();
    let mut cursor = None;
    // Bounded, so a cursor that does not move fails the test instead of hanging it.
    for _ in 0..made.len() + 1 {
        let page = engine.awaiting_provider(TransactionType::Payment, later, cursor.as_ref(), 2).unwrap();
        assert!(page.len() <= 2);
        walked.extend(page.iter().map(|p| p.owner.clone()));
        match page.last() {
            Some(last) => cursor = Some(last.clone()),
            None => break,
        }
    }
    assert!(cursor.is_some() && walked.len() <= made.len(), "the walk ended: {walked:?}");
    assert_eq!(walked, made, "every waiting payment once, oldest first, across merchants");
    let none_yet = Timestamp::from_unix_ms(0);
    assert!(engine.awaiting_provider(TransactionType::Payment, none_yet, None, 10).unwrap().is_empty());
    assert!(engine.awaiting_provider(TransactionType::Payout, later, None, 10).unwrap().is_empty());

    // A payment that succeeded no longer waits.
    let reference = Reference::parse(&made[2]).unwrap();
    let cmd = Command::PaymentNotice { reference, notice: PaymentNotice::Confirmed };
    done(engine.execute(&a, cmd, None).await);
    let left: Vec<String> = engine
        .awaiting_provider(TransactionType::Payment, later, None, 10)
        .unwrap()
        .into_iter()
        .map(|p| p.owner)
        .collect();
    assert_eq!(left, [&made[0], &made[1], &made[3], &made[4]].map(|r| r.clone()));
}

/// The audit splits the journal at the median merchant and audits each half on its own thread: every
/// merchant is still counted once, and a snapshot that disagrees with the ledger in the upper half still
/// refuses the start, naming its merchant.
#[test]
fn the_audit_covers_both_halves_and_names_a_merchant_whose_snapshot_disagrees() {
    use caisse_engine::domain::records::Merchant;
    use caisse_engine::store::Snapshot;

    let dir = tempfile::tempdir().unwrap();
    let mut config = EngineConfig::new(dir.path());
    config.actors.snapshot_every = 2;
    let merchants: Vec<MerchantId> = (0..5).map(|_| MerchantId::new()).collect();
    actix::System::new().block_on({
        let (config, merchants) = (config.clone(), merchants.clone());
        async move {
            let engine = Engine::open(config).unwrap();
            for (i, m) in merchants.iter().enumerate() {
                let merchant = Merchant {
                    id: m.clone(),
                    name: format!("Audit {i}"),
                    email: format!("audit{i}@example.com"),
                    password_hash: String::new(),
                    secret_key: format!("sk_test_audit{i}"),
                    webhook_url: None,
                    created_at: Timestamp::now(),
                };
                engine.put_merchant(merchant, None).await.unwrap();
                for _ in 0..=i {
                    pay(&engine, m, 1_000).await;
                }
            }
        }
    });
    actix::System::new().block_on({
        let config = config.clone();
        async move {
            let engine = Engine::open(config).unwrap();
            assert_eq!(engine.audit_report().merchants, 5);
            assert_eq!(engine.audit_report().events, 2 * (1 + 2 + 3 + 4 + 5));
        }
    });

    // The merchant with the largest id is in the upper half, audited on the second thread.
    let target = merchants.iter().max_by(|a, b| a.as_bytes().cmp(b.as_bytes())).unwrap().clone();
    {
        let trees = RawTrees::open(dir.path());
        let stored = trees.get("snapshots", target.as_bytes()).expect("a snapshot every two events");
        // A stored value is a format byte (1: postcard) and the record; the tampered one goes back the same way.
        assert_eq!(stored[0], 1, "binary format");
        let mut snapshot: Snapshot = postcard::from_bytes(&stored[1..]).unwrap();
        snapshot.balances.0.get_mut(&xof()).unwrap().available += 1;
        let tampered = postcard::to_extend(&snapshot, vec![1]).unwrap();
        trees.insert("snapshots", target.as_bytes(), &tampered);
        trees.close();
    }
    let refused = actix::System::new().block_on(async move { Engine::open(config).err() });
    let text = refused.expect("a snapshot that disagrees with the ledger refuses the start").to_string();
    assert!(text.contains(&target.to_string()) && text.contains("snapshot says"), "{text}");
}

/// A checkpoint changed while the server was stopped: recovery does not read it, so the start (which replays
/// nothing older than the checkpoint) lets the merchant start with its true balances; the full audit compares
/// every checkpoint with the ledger and finds it, on demand and in the background, whose failure the metrics
/// show.
#[test]
fn the_full_audit_finds_a_changed_checkpoint_on_demand_and_in_the_background() {
    use caisse_engine::metrics::{AuditResult, METRICS};
    use caisse_engine::store::AuditScope;
    use caisse_engine::AuditSchedule;

    let dir = tempfile::tempdir().unwrap();
    let mut config = EngineConfig::new(dir.path());
    config.actors.snapshot_every = 2;
    let m = MerchantId::new();
    let available = actix::System::new().block_on({
        let (config, m) = (config.clone(), m.clone());
        async move {
            let engine = Engine::open(config).unwrap();
            for _ in 0..3 {
                pay(&engine, &m, 1_000).await;
            }
            engine.balances(&m).await.unwrap().get(xof()).available
        }
    });
    // This start replays the six events and writes the checkpoint at the last.
    let report = actix::System::new()
        .block_on({
            let config = config.clone();
            async move { Engine::open(config).map(|e| e.audit_report().clone()) }
        })
        .unwrap();
    assert_eq!((report.events, report.from_checkpoint), (6, 0));
    {
        // The checkpoint's layout: a format byte, then seq, balances and the verified snapshot (postcard).
        let trees = RawTrees::open(dir.path());
        let stored = trees.get("audited", m.as_bytes()).expect("a checkpoint after the audit at start");
        let (seq, rest): (u64, &[u8]) = postcard::take_from_bytes(&stored[1..]).unwrap();
        let (mut balances, rest): (caisse_engine::domain::ledger::Balances, &[u8]) =
            postcard::take_from_bytes(rest).unwrap();
        assert_eq!(seq, 6);
        balances.0.get_mut(&xof()).unwrap().available += 500;
        let mut tampered = postcard::to_extend(&(seq, balances), vec![1]).unwrap();
        tampered.extend_from_slice(rest);
        trees.insert("audited", m.as_bytes(), &tampered);
        trees.close();
    }
    let failed_before = METRICS.audits.runs(AuditScope::Full, AuditResult::Failed);
    actix::System::new().block_on(async move {
        let engine = Engine::open(config).expect("nothing after the checkpoint disagrees");
        assert_eq!(engine.audit_report().events, 0);
        assert_eq!(engine.balances(&m).await.unwrap().get(xof()).available, available);
        let text = engine.audit().expect_err("the full audit compares the checkpoint").to_string();
        assert!(text.contains(&format!("audit checkpoint says disponible {}", available + 500)), "{text}");

        engine.start_audits(AuditSchedule {
            since_checkpoints_every: Some(std::time::Duration::from_millis(20)),
            full_every: Some(std::time::Duration::from_millis(50)),
        });
        let started = std::time::Instant::now();
        while METRICS.audits.runs(AuditScope::Full, AuditResult::Failed) < failed_before + 2 {
            assert!(started.elapsed() < std::time::Duration::from_secs(20), "the background audit did not run");
            actix::clock::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(METRICS.audits.failing(AuditScope::Full));
    });
}

/// Delivered notifications made before the retention go, body and attempts; those not delivered (failed,
/// waiting for a resend by hand) and the recent ones stay, whoever their merchant.
#[test]
fn delivered_notifications_past_their_retention_are_deleted_and_the_others_kept() {
    use caisse_engine::domain::ids::{new_id_at, IdKind};
    use caisse_engine::domain::records::{DeliveryState, Notification};
    use caisse_engine::store::{FjallStore, Outbox};
    use caisse_engine::webhook::delivery::DeliveryConfig;
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let day_ms = 24 * 60 * 60 * 1000;
    let now = Timestamp::now().unix_ms();
    let (m, other) = (MerchantId::new(), MerchantId::new());
    let made = |merchant: &MerchantId, age_ms: u64, state: DeliveryState| Notification {
        id: new_id_at(IdKind::Event, now - age_ms),
        merchant: merchant.clone(),
        event: EventKind::PaymentSucceeded,
        reference: "pay_1".into(),
        body: "{}".into(),
        created_at: Timestamp::from_unix_ms(now - age_ms),
        state,
        next_attempt_at: None,
        attempts: Vec::new(),
        chain_attempts: 1,
        total_attempts: 1,
    };
    let old: Vec<Notification> = (0..1_200)
        .map(|i| made(if i % 2 == 0 { &m } else { &other }, 40 * day_ms + i, DeliveryState::Delivered))
        .collect();
    let failed = made(&m, 45 * day_ms, DeliveryState::Failed);
    let recent = made(&m, 2 * day_ms, DeliveryState::Delivered);
    // Made long ago, resent by hand and delivered yesterday: kept for the retention after that delivery.
    let mut resent = made(&other, 50 * day_ms, DeliveryState::Delivered);
    resent.attempts.push(caisse_engine::domain::records::Attempt {
        at: Timestamp::from_unix_ms(now - day_ms),
        signed_at_s: None,
        http_status: Some(200),
        error: None,
        latency_ms: 3,
    });
    {
        let store = FjallStore::open(dir.path()).unwrap();
        for n in old.iter().chain([&failed, &recent, &resent]) {
            store.save_notification(n, n, None).unwrap().blocking_recv().unwrap().unwrap();
        }
    }
    actix::System::new().block_on(async move {
        let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
        let config = DeliveryConfig {
            retention: Some(Duration::from_secs(30 * 24 * 60 * 60)),
            retention_every: Duration::from_millis(50),
            ..DeliveryConfig::default()
        };
        let _pool = engine.start_webhooks(config).unwrap();
        let started = std::time::Instant::now();
        while old.iter().any(|n| engine.notification(&n.merchant, &n.id).unwrap().is_some()) {
            assert!(started.elapsed() < Duration::from_secs(20), "old delivered notifications are still there");
            actix::clock::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(engine.notification(&m, &failed.id).unwrap(), Some(failed.clone()), "not delivered: kept");
        assert_eq!(engine.notification(&m, &recent.id).unwrap(), Some(recent.clone()), "recent: kept");
        assert_eq!(engine.notification(&other, &resent.id).unwrap(), Some(resent.clone()), "delivered lately: kept");
    });
}

/// Idempotency records answer for 24 hours; past them, a pass through every merchant's actor deletes them and
/// their entries in the index by time. A record still answering stays, and so does the newer record of a key
/// used again (only its old entry goes).
#[test]
fn idempotency_records_past_their_day_are_deleted_through_the_actor() {
    use caisse_engine::domain::text::IdempotencyKey;
    use caisse_engine::store::{open_embedded, IdempotencyRecord};

    let dir = tempfile::tempdir().unwrap();
    let day_ms = 24 * 60 * 60 * 1000;
    let m = MerchantId::new();
    let key = |k: &str| IdempotencyKey::parse(k).unwrap();
    actix::System::new().block_on({
        let (dir, m) = (dir.path().to_owned(), m.clone());
        async move {
            let engine = Engine::open(EngineConfig::new(dir)).unwrap();
            for i in 0..3 {
                let idempotency = Idempotency {
                    key: key(&format!("live-{i}")),
                    fingerprint: format!("f{i}"),
                    earlier_fingerprint: None,
                    success_status: 201,
                    part: Part::Only,
                };
                let command = Command::InitiatePayment(new_payment(1_000, None));
                engine.execute(&m, command, Some(idempotency)).await.unwrap();
            }
        }
    });
    let now = Timestamp::now().unix_ms();
    {
        // Records made two days ago, as the store lays them out: the record under `merchant ++ key`, and an
        // empty entry under `merchant ++ made_at ++ key` in `idempotency_times`.
        let trees = RawTrees::open(dir.path());
        let put = |k: &str, made_ms: u64, entry_ms: u64| {
            let record = IdempotencyRecord {
                fingerprint: "old".into(),
                status: 201,
                body: "{}".into(),
                created_at: Timestamp::from_unix_ms(made_ms),
            };
            let mut record_key = m.as_bytes().to_vec();
            record_key.extend_from_slice(k.as_bytes());
            trees.insert("idempotency", &record_key, &postcard::to_extend(&record, vec![1]).unwrap());
            let mut entry = m.as_bytes().to_vec();
            entry.extend_from_slice(&entry_ms.to_be_bytes());
            entry.extend_from_slice(k.as_bytes());
            trees.insert("idempotency_times", &entry, &[]);
        };
        for i in 0..3 {
            put(&format!("old-{i}"), now - 2 * day_ms + i, now - 2 * day_ms + i);
        }
        // Used three days ago, then again an hour ago: the old entry is stale, the record answers still.
        put("reused", now - 3 * day_ms, now - 3 * day_ms);
        put("reused", now - 60 * 60 * 1000, now - 60 * 60 * 1000);
        trees.close();
    }
    let forgotten = actix::System::new().block_on({
        let dir = dir.path().to_owned();
        async move {
            let engine = Engine::open(EngineConfig::new(dir)).unwrap();
            let before = Timestamp::from_unix_ms(now - day_ms);
            let forgotten = engine.forget_idempotency_before(before, 100).await.unwrap();
            // A second pass finds nothing more.
            assert_eq!(engine.forget_idempotency_before(before, 100).await.unwrap(), 0);
            // Asked for records made up to now, it still keeps those that answer.
            assert_eq!(engine.forget_idempotency_before(Timestamp::now(), 100).await.unwrap(), 0);
            forgotten
        }
    });
    assert_eq!(forgotten, 4, "three old records and the reused key's old entry");
    let store = open_embedded(dir.path(), 1 << 20, None).unwrap();
    for i in 0..3 {
        assert_eq!(store.idempotency(&m, &key(&format!("old-{i}"))).unwrap(), None);
        assert!(store.idempotency(&m, &key(&format!("live-{i}"))).unwrap().is_some(), "a live record stays");
    }
    assert!(store.idempotency(&m, &key("reused")).unwrap().is_some(), "the newer record of a reused key stays");
    let left = store.idempotency_made_before(&m, Timestamp::now().plus_ms(1), 100).unwrap();
    assert_eq!(left.len(), 4, "the live records' entries and the reused key's newer one: {left:?}");
}

/// Callers on many threads asking for the same merchants at once start one actor per merchant: each merchant
/// has a start gate of its own, held while the actor is recovered.
#[actix::test]
async fn callers_on_many_threads_start_one_actor_per_merchant() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    let merchants: Vec<MerchantId> = (0..20).map(|_| MerchantId::new()).collect();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (engine, merchants) = (engine.clone(), merchants.clone());
            std::thread::spawn(move || {
                actix::System::new().block_on(async move {
                    for m in &merchants {
                        engine.balances(m).await.expect("balances");
                    }
                })
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a caller thread");
    }
    assert_eq!(engine.running_actors(), merchants.len());
    assert_eq!(engine.actors_started(), merchants.len() as u64, "no merchant's actor was started twice");
}

/// A plain HTTP receiver on loopback for webhook deliveries: it answers 200 to every request, the first one
/// after `first_delay`, and counts the requests it read.
fn receiver(first_delay: std::time::Duration) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::atomic::Ordering;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    std::thread::spawn(move || {
        // Bounded: the tests using it make a few deliveries each.
        for stream in listener.incoming().take(16) {
            let Ok(stream) = stream else { return };
            let counted = counted.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                let mut length = 0;
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                    line.clear();
                }
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_err() {
                    return;
                }
                if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                    std::thread::sleep(first_delay);
                }
                let _ =
                    reader.get_mut().write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            });
        }
    });
    (url, hits)
}

/// Two merchants with webhook URLs `urls`, which a pool of `workers` delivery actors hands to the same actor
/// (the dispatcher places a merchant by its id's hash, with the standard library's default hasher), and that
/// pool, each actor with one slot and each host one attempt at a time: the second merchant's deliveries wait in
/// that actor for its one slot.
async fn merchants_sharing_one_slot(
    engine: &Engine,
    workers: usize,
    urls: [String; 2],
) -> ([MerchantId; 2], caisse_engine::webhook::delivery::WebhookPool) {
    use caisse_engine::domain::records::Merchant;
    use caisse_engine::webhook::delivery::DeliveryConfig;
    let worker_of = |m: &MerchantId| {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        m.hash(&mut hasher);
        hasher.finish() % workers as u64
    };
    let first = MerchantId::new();
    let second = std::iter::repeat_with(MerchantId::new).find(|m| worker_of(m) == worker_of(&first)).unwrap();
    for (i, (m, url)) in [&first, &second].into_iter().zip(urls).enumerate() {
        let merchant = Merchant {
            id: m.clone(),
            name: format!("Hooks {i}"),
            email: format!("hooks{i}@example.com"),
            password_hash: String::new(),
            secret_key: format!("sk_test_hooks{i}"),
            webhook_url: Some(url),
            created_at: Timestamp::now(),
        };
        engine.put_merchant(merchant, None).await.unwrap();
    }
    let config = DeliveryConfig { workers, max_in_flight_per_worker: 1, max_per_host: 1, ..DeliveryConfig::default() };
    ([first, second], engine.start_webhooks(config).unwrap())
}

/// A delivery that waits only for room in its delivery actor (the actor's bound is full with another host's
/// attempt) starts as soon as that attempt finishes, though nothing of its own host was in flight to start it.
#[actix::test]
async fn a_delivery_waiting_for_room_starts_when_another_hosts_attempt_finishes() {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    let (slow_url, slow_hits) = receiver(Duration::from_millis(1_500));
    let (quick_url, quick_hits) = receiver(Duration::ZERO);
    // A dispatcher's budget of two, both merchants on one actor.
    let ([slow, quick], _pool) = merchants_sharing_one_slot(&engine, 2, [slow_url, quick_url]).await;
    done(engine.execute(&slow, Command::InitiatePayment(new_payment(1_000, None)), None).await);
    let started = std::time::Instant::now();
    while slow_hits.load(Ordering::SeqCst) == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "the first delivery never started");
        actix::clock::sleep(Duration::from_millis(20)).await;
    }
    // The worker's one slot is taken by the slow receiver's attempt: this one waits for it.
    done(engine.execute(&quick, Command::InitiatePayment(new_payment(1_000, None)), None).await);
    let delivered = |m: &MerchantId| {
        let page = engine.notifications(m, None, 10, &mut |_| true).unwrap();
        !page.data.is_empty() && page.data.iter().all(|n| n.state == DeliveryState::Delivered)
    };
    let started = std::time::Instant::now();
    while !(delivered(&slow) && delivered(&quick)) {
        assert!(started.elapsed() < Duration::from_secs(10), "the waiting delivery never started");
        actix::clock::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!((slow_hits.load(Ordering::SeqCst), quick_hits.load(Ordering::SeqCst)), (1, 1));
}

/// The room an attempt frees goes first to a host that waits for room, not back to the host that finished:
/// a host with a queue of its own (two notifications, one at a time) does not keep the room for itself while
/// another host's delivery waits.
#[actix::test]
async fn the_room_an_attempt_frees_goes_to_the_host_waiting_longest() {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path())).unwrap();
    let (busy_url, busy_hits) = receiver(Duration::from_millis(1_500));
    let (other_url, _) = receiver(Duration::ZERO);
    // A dispatcher's budget of three: both of the busy host's notifications and the other's reach the one actor.
    let ([busy, other], _pool) = merchants_sharing_one_slot(&engine, 3, [busy_url, other_url]).await;
    let first = payment_of(done(engine.execute(&busy, Command::InitiatePayment(new_payment(1_000, None)), None).await));
    let started = std::time::Instant::now();
    while busy_hits.load(Ordering::SeqCst) == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "the first delivery never started");
        actix::clock::sleep(Duration::from_millis(20)).await;
    }
    // The busy host's second notification waits behind its first (its own bound); the other host's waits for
    // the actor's one slot.
    let confirm = Command::PaymentNotice { reference: first.reference.clone(), notice: PaymentNotice::Confirmed };
    done(engine.execute(&busy, confirm, None).await);
    actix::clock::sleep(Duration::from_millis(100)).await;
    done(engine.execute(&other, Command::InitiatePayment(new_payment(1_000, None)), None).await);
    let attempted = |m: &MerchantId| {
        let page = engine.notifications(m, None, 10, &mut |_| true).unwrap();
        page.data.iter().map(|n| n.attempts.first().map(|a| a.at.unix_ms())).collect::<Option<Vec<u64>>>()
    };
    let started = std::time::Instant::now();
    let (busy_times, other_times) = loop {
        if let (Some(b), Some(o)) = (attempted(&busy), attempted(&other)) {
            if b.len() == 2 && o.len() == 1 {
                break (b, o);
            }
        }
        assert!(started.elapsed() < Duration::from_secs(15), "the deliveries did not all start");
        actix::clock::sleep(Duration::from_millis(20)).await;
    };
    let busy_second = busy_times.iter().max().copied().unwrap();
    assert!(
        other_times[0] <= busy_second,
        "the other host waited longest, and went first: {other_times:?} {busy_times:?}"
    );
}
