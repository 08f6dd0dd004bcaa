//! The store conformance suite: what every storage backend must do, driven through the role traits only
//! (`Commits`, `Records`, `Outbox`, `Accounts`, `Audit`), never through a backend's own methods.
//!
//! Each check is a function of a [`Backend`]: how to make a fresh place for a store (a directory, a database)
//! and open the store there, again after a clean stop. The `conformance!` macro turns every check into a test
//! for one backend; a new backend adds one line at the bottom and passes the same checks. Changes are built the
//! way the merchant actor builds them, from the pure core's decisions, so what is stored is what the engine
//! really writes.
//!
//! Crash-and-reopen (kill -9 in the middle of group commits) needs a backend in a child process; the embedded
//! store's is `actors/tests/crash.rs`.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use caisse_engine::core::{decide, Decided, PaymentNotice, PayoutOutcome};
use caisse_engine::domain::ids::{new_id, MerchantId};
use caisse_engine::domain::ledger::Balances;
use caisse_engine::domain::provider::{AdapterName, ProviderReference, ProviderRoute, ProviderTrail, ReturnUrl};
use caisse_engine::domain::records::{DeliveryState, Merchant, Notification, TransactionType};
use caisse_engine::domain::status::{EventKind, PaymentStatus};
use caisse_engine::domain::text::{IdempotencyKey, Reference};
use caisse_engine::domain::time::Timestamp;
use caisse_engine::metrics::{LostCommit, METRICS};
use caisse_engine::store::{
    Change, FailureLatch, FjallStore, IdempotencyRecord, PgStore, Snapshot, Store, StoreError, Ticket,
};
use caisse_engine::{Command, Record};

#[path = "support/mod.rs"]
mod support;

#[path = "support/postgres.rs"]
mod postgres;

#[allow(dead_code)]
#[path = "../../tests/support/proxy.rs"]
mod proxy;

use caisse_engine::domain::links::link_of;
use support::{new_link, new_payment, new_payout};

/// A storage backend under test.
trait Backend {
    /// A fresh, empty place for a store: a directory, a database.
    fn place(&self) -> Box<dyn Place>;
}

/// Where one test keeps its store, removed when the test is done.
trait Place {
    /// Opens (creating if needed) the store kept here.
    fn open(&self) -> Arc<dyn Store>;
}

struct Fjall;

/// A directory for a fjall store.
struct FjallDir(tempfile::TempDir);

impl Backend for Fjall {
    fn place(&self) -> Box<dyn Place> {
        Box::new(FjallDir(tempfile::tempdir().expect("a temporary directory")))
    }
}

impl Place for FjallDir {
    fn open(&self) -> Arc<dyn Store> {
        Arc::new(FjallStore::open(self.0.path()).expect("open the fjall store"))
    }
}

struct Postgres;

impl Backend for Postgres {
    fn place(&self) -> Box<dyn Place> {
        Box::new(postgres::database())
    }
}

impl Place for postgres::TestDatabase {
    fn open(&self) -> Arc<dyn Store> {
        Arc::new(PgStore::open(&self.url).expect("open the PostgreSQL store"))
    }
}

fn wait(ticket: Ticket) {
    ticket.blocking_recv().expect("the store answered").expect("the change is durable");
}

/// One merchant as its actor would drive the store: its balances, journal position and records in memory,
/// each command decided by the pure core and committed as the actor commits it.
struct Shop {
    id: MerchantId,
    balances: Balances,
    seq: u64,
    records: HashMap<String, Record>,
    latch: FailureLatch,
}

impl Shop {
    fn new() -> Shop {
        Shop {
            id: MerchantId::new(),
            balances: Balances::default(),
            seq: 0,
            records: HashMap::new(),
            latch: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The change `command` makes, not yet committed; a snapshot every second event, as a short
    /// `snapshot_every` would.
    fn change(&self, command: &Command, idempotency: Option<&str>) -> (Change, Balances) {
        let key = match command {
            Command::InitiatePayment(_) | Command::CreatePayout(_) | Command::CreateLink(_) => None,
            Command::PaymentNotice { reference, .. }
            | Command::RequestRefund { reference, .. }
            | Command::RefundNotice { reference, .. } => Some(reference.as_str().to_owned()),
            Command::PayoutNotice { id, .. } | Command::DeactivateLink { id } => Some(id.clone()),
        };
        let current = key.and_then(|k| self.records.get(&k));
        let link_id = match (command, current) {
            (Command::PaymentNotice { .. }, Some(Record::Payment(p))) => link_of(&p.metadata),
            _ => command.link(),
        };
        let link = match link_id.and_then(|id| self.records.get(id)) {
            Some(Record::Link(link)) => Some(link),
            _ => None,
        };
        let seq = self.seq + 1;
        let decided =
            decide(&self.balances, seq, current, link, command, Timestamp::now(), &mut new_id).expect("accepted");
        let Decided::Changed(decision) = decided else { panic!("{command:?} changed nothing") };
        let idempotency = idempotency.map(|key| {
            let body = match &decision.record {
                Record::Payment(p) => serde_json::to_string(p),
                Record::Payout(o) => serde_json::to_string(o),
                Record::Link(l) => serde_json::to_string(l),
            };
            let record = IdempotencyRecord {
                fingerprint: format!("fingerprint of {key}"),
                status: 201,
                body: body.unwrap(),
                created_at: Timestamp::now(),
            };
            (IdempotencyKey::parse(key).unwrap(), record)
        });
        let change = Change {
            merchant: self.id.clone(),
            journal: decision.journal,
            record: decision.record,
            linked: decision.linked,
            created: decision.created,
            outbox: decision.outbox,
            idempotency,
            snapshot: seq.is_multiple_of(2).then(|| Snapshot { seq, balances: decision.balances.clone() }),
            route: None,
            provider_reference: None,
            fence: None,
        };
        (change, decision.balances)
    }

    /// Decides, commits, waits until durable and remembers the result, as the actor does.
    fn run(&mut self, store: &dyn Store, command: Command, idempotency: Option<&str>) -> Record {
        let (change, balances) = self.change(&command, idempotency);
        let record = change.record.clone();
        let linked = change.linked.clone();
        wait(store.commit(change, &self.latch).expect("queued"));
        self.seq += 1;
        self.balances = balances;
        self.records.insert(record.key().to_owned(), record.clone());
        if let Some(link) = linked {
            self.records.insert(link.id.clone(), Record::Link(link));
        }
        record
    }

    /// Decides and queues without waiting, as the actor does while earlier writes are in flight: the next
    /// command is decided on what this one will make.
    fn queue(&mut self, store: &dyn Store, command: Command) -> Ticket {
        let (change, balances) = self.change(&command, None);
        let record = change.record.clone();
        let ticket = store.commit(change, &self.latch).expect("queued");
        self.seq += 1;
        self.balances = balances;
        self.records.insert(record.key().to_owned(), record);
        ticket
    }

    fn pay(&mut self, store: &dyn Store, amount: i64, reference: &str) -> Record {
        self.run(store, Command::InitiatePayment(new_payment(amount, Some(reference))), None)
    }

    fn confirm(&mut self, store: &dyn Store, reference: &str) -> Record {
        let reference = Reference::parse(reference).unwrap();
        self.run(store, Command::PaymentNotice { reference, notice: PaymentNotice::Confirmed }, None)
    }
}

/// A link is found by its id and its reference, its owner by its id alone; its payments list under it; the
/// counters a payment's success moves are written with that success; links list newest first with a cursor.
fn links_read_back_with_their_payments(backend: &dyn Backend) {
    let place = backend.place();
    let store = place.open();
    let mut shop = Shop::new();
    let Record::Link(first) = shop.run(&*store, Command::CreateLink(new_link(5_000, Some("fees-1"))), None) else {
        unreachable!()
    };
    std::thread::sleep(std::time::Duration::from_millis(2));
    let Record::Link(second) = shop.run(&*store, Command::CreateLink(new_link(700, None)), None) else {
        unreachable!()
    };
    assert_eq!(store.link(&shop.id, &first.id).unwrap().as_ref(), Some(&first));
    assert_eq!(store.link(&shop.id, "fees-1").unwrap().as_ref(), Some(&first), "found by its reference");
    assert_eq!(store.link(&MerchantId::new(), &first.id).unwrap(), None, "another merchant sees nothing");
    assert_eq!(store.link_owner(&first.id).unwrap(), Some(shop.id.clone()));
    assert_eq!(store.link_owner("lnk_01JD0000000000000000000000").unwrap(), None);

    let mut payment = new_payment(5_000, Some("via-link"));
    payment.link = Some(first.id.clone());
    let Record::Payment(paid) = shop.run(&*store, Command::InitiatePayment(payment), None) else { unreachable!() };
    assert_eq!(paid.metadata.get("lien_id"), Some(first.id.as_str()));
    shop.pay(&*store, 5_000, "not-via-link");
    shop.confirm(&*store, "via-link");
    shop.confirm(&*store, "not-via-link");
    let counted = store.link(&shop.id, &first.id).unwrap().expect("the link");
    assert_eq!((counted.payments, counted.collected.minor()), (1, 5_000));
    assert_eq!(counted.status.as_str(), "paye", "a unique link closes at its first success");
    let listed = store.link_payments(&shop.id, &first.id, None, 10).unwrap();
    assert_eq!(listed.data.iter().map(|p| p.reference.as_str()).collect::<Vec<_>>(), ["via-link"]);
    assert!(store.link_payments(&shop.id, &second.id, None, 10).unwrap().data.is_empty());

    let page = store.links(&shop.id, None, 1, &mut |_| true).unwrap();
    assert_eq!(page.data.iter().map(|l| l.id.as_str()).collect::<Vec<_>>(), [second.id.as_str()]);
    let next = store.links(&shop.id, page.next_cursor.as_deref(), 1, &mut |_| true).unwrap();
    assert_eq!(next.data.iter().map(|l| l.id.as_str()).collect::<Vec<_>>(), [first.id.as_str()]);
    assert!(!next.has_more);
    assert_eq!(store.links(&shop.id, None, 10, &mut |l| l.payments > 0).unwrap().data.len(), 1);
}

fn account(id: &MerchantId, n: u32) -> Merchant {
    Merchant {
        id: id.clone(),
        name: format!("Boutique {n}"),
        email: format!("Boutique{n}@Example.com"),
        password_hash: String::new(),
        secret_key: format!("sk_test_conformance{n}"),
        webhook_url: Some(format!("https://shop{n}.example.com/hook")),
        created_at: Timestamp::now(),
    }
}

/// A committed change is visible through every view of it: the record, its reference, its transaction id,
/// the transaction list, the journal, the list of work awaiting a provider, and the merchant's recovery.
fn a_change_reads_back_through_every_view(backend: &dyn Backend) {
    let place = backend.place();
    let store = place.open();
    let mut shop = Shop::new();
    let Record::Payment(payment) = shop.pay(&*store, 5_000, "order-1") else { unreachable!() };

    assert_eq!(store.payment(&shop.id, "order-1").unwrap(), Some(payment.clone()));
    let located = store.locate(&shop.id, "order-1").unwrap().expect("found by its reference");
    assert_eq!((located.kind, located.record), (TransactionType::Payment, Record::Payment(payment.clone())));
    let (owner, by_tx) = store.owner_of_transaction(&payment.transaction_id).unwrap().expect("found by its tx id");
    assert_eq!((owner, by_tx.reference.as_str()), (shop.id.clone(), "order-1"));
    assert_eq!(store.payment(&MerchantId::new(), "order-1").unwrap(), None, "another merchant sees nothing");

    let listed = store.transactions(&shop.id, None, 10, &mut |_| true).unwrap();
    assert_eq!(listed.data.iter().map(|t| t.reference.as_str()).collect::<Vec<_>>(), ["order-1"]);
    let journal = store.journal(&shop.id, 1, 10).unwrap();
    assert_eq!(journal.iter().map(|e| (e.seq, e.reference.as_str())).collect::<Vec<_>>(), [(1, "order-1")]);

    let later = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + 1_000);
    let waiting = store.awaiting_provider(TransactionType::Payment, later, None, 10).unwrap();
    assert_eq!(waiting.iter().map(|w| w.owner.as_str()).collect::<Vec<_>>(), ["order-1"]);
    shop.confirm(&*store, "order-1");
    assert!(store.awaiting_provider(TransactionType::Payment, later, None, 10).unwrap().is_empty());

    let recovered = store.recover_merchant(&shop.id).unwrap();
    assert_eq!((recovered.seq, &recovered.balances), (2, &shop.balances));
    assert_eq!(store.payment(&shop.id, "order-1").unwrap().unwrap().status, PaymentStatus::Succeeded);
}

/// Lists are newest first, complete and without repeats when walked a page at a time with their cursors,
/// and a filter keeps only what it accepts.
fn lists_page_newest_first_with_cursors(backend: &dyn Backend) {
    let place = backend.place();
    let store = place.open();
    let mut shop = Shop::new();
    let mut made = Vec::new();
    for n in 0..7 {
        let reference = format!("order-{n}");
        shop.pay(&*store, 10_000 + n, &reference);
        made.push(reference);
        // Distinct creation milliseconds, so "newest first" has one answer.
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    shop.confirm(&*store, "order-0");
    for _ in 0..3 {
        shop.run(&*store, Command::CreatePayout(new_payout(1_000)), None);
        std::thread::sleep(std::time::Duration::from_millis(2));
    }

    let mut walked = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..20 {
        let page = store.transactions(&shop.id, cursor.as_deref(), 3, &mut |t| t.kind == TransactionType::Payment);
        let page = page.unwrap();
        assert!(page.data.len() <= 3);
        walked.extend(page.data.iter().map(|t| t.reference.clone()));
        match page.next_cursor {
            Some(next) if page.has_more => cursor = Some(next),
            _ => break,
        }
    }
    made.reverse();
    assert_eq!(walked, made, "every payment once, newest first");

    let payouts = store.payouts(&shop.id, None, 2, &mut |_| true).unwrap();
    assert_eq!(payouts.data.len(), 2);
    assert!(payouts.has_more && payouts.next_cursor.is_some());
    let rest = store.payouts(&shop.id, payouts.next_cursor.as_deref(), 2, &mut |_| true).unwrap();
    assert_eq!((rest.data.len(), rest.has_more), (1, false));
    let ids: BTreeSet<_> = payouts.data.iter().chain(&rest.data).map(|o| o.id.clone()).collect();
    assert_eq!(ids.len(), 3);
    assert!(payouts.data[0].created_at >= payouts.data[1].created_at);
}

/// An idempotency record is written with its change and answers for its merchant only.
fn idempotency_records_belong_to_their_merchant(backend: &dyn Backend) {
    let place = backend.place();
    let store = place.open();
    let mut shop = Shop::new();
    let record = shop.run(&*store, Command::InitiatePayment(new_payment(2_000, Some("idem-1"))), Some("key-1"));
    let key = IdempotencyKey::parse("key-1").unwrap();
    let stored = store.idempotency(&shop.id, &key).unwrap().expect("stored with the change");
    assert_eq!(stored.fingerprint, "fingerprint of key-1");
    let Record::Payment(payment) = record else { unreachable!() };
    assert_eq!(stored.body, serde_json::to_string(&payment).unwrap());
    assert!(stored.is_live(Timestamp::now()));
    assert_eq!(store.idempotency(&MerchantId::new(), &key).unwrap(), None);
    assert_eq!(store.idempotency(&shop.id, &IdempotencyKey::parse("key-2").unwrap()).unwrap(), None);
    // A request's answer written again replaces the body alone, and writes nothing else.
    let rewritten = IdempotencyRecord { body: "{\"statut\":\"echec\"}".into(), ..stored.clone() };
    wait(store.rewrite_answer(&shop.id, &key, &rewritten, &shop.latch, None).unwrap());
    assert_eq!(store.idempotency(&shop.id, &key).unwrap(), Some(rewritten));
    assert_eq!(store.recover_merchant(&shop.id).unwrap().seq, 1, "no journal event");
    // Like a change, it is refused once the actor's latch is set.
    shop.latch.store(true, std::sync::atomic::Ordering::Release);
    let refused = store.rewrite_answer(&shop.id, &key, &stored, &shop.latch, None).map(|t| t.blocking_recv());
    assert!(matches!(refused, Err(StoreError::Aborted) | Ok(Ok(Err(StoreError::Aborted)))), "{refused:?}");
    assert_ne!(store.idempotency(&shop.id, &key).unwrap(), Some(stored));
}

/// A change's notifications are fed to the dispatcher once durable, come due, are listed for their merchant,
/// and leave the due list once an attempt settles them; a due entry left by a stale save is never offered.
fn notifications_are_fed_come_due_and_settle(backend: &dyn Backend) {
    let place = backend.place();
    let store = place.open();
    let mut feed = store.outbox_feed().expect("the first caller takes the feed");
    assert!(store.outbox_feed().is_none(), "and only the first");
    let mut shop = Shop::new();
    shop.pay(&*store, 3_000, "hook-1");
    shop.confirm(&*store, "hook-1");

    let fed: Vec<_> = std::iter::from_fn(|| feed.try_recv().ok()).collect();
    assert_eq!(
        fed.iter().map(|n| n.event).collect::<Vec<_>>(),
        [EventKind::PaymentInitiated, EventKind::PaymentSucceeded]
    );
    let n = &fed[1];
    assert_eq!(
        (n.merchant.clone(), n.reference.as_str(), n.state),
        (shop.id.clone(), "hook-1", DeliveryState::Pending)
    );
    assert!(n.body.contains("\"payment.succeeded\""), "{}", n.body);

    let due = store.due_notifications(Timestamp::now(), 10).unwrap();
    assert_eq!(due, fed, "oldest first");
    let (zero, now) = (Timestamp::from_unix_ms(0), Timestamp::now());
    let skipped = store.due_notifications_skipping(zero, now, 10, &mut |id| fed.iter().any(|f| f.id == id)).unwrap();
    assert!(skipped.due.is_empty(), "those being delivered are passed over");
    // ... and the caller, which knows where they are due, remembers them: the scan names no entry.
    assert_eq!(skipped.first_kept, None);
    let first = store.due_notifications_skipping(zero, now, 10, &mut |_| false).unwrap();
    assert_eq!(first.first_kept, fed[0].next_attempt_at, "the first entry met is where the next scan starts");
    let after = |n: &Notification| n.next_attempt_at.map(|t| Timestamp::from_unix_ms(t.unix_ms() + 1));
    let later = store.due_notifications_skipping(after(&fed[1]).unwrap_or(now), now, 10, &mut |_| false).unwrap();
    assert!(later.due.iter().all(|d| fed.iter().all(|f| f.id != d.id)), "a scan starts where it is told");
    assert_eq!(store.notification(&shop.id, &n.id).unwrap().as_ref(), Some(n));
    assert_eq!(store.notification(&MerchantId::new(), &n.id).unwrap(), None);

    // Settle the first; the second stays due.
    let (first, n) = (&fed[0], &fed[1]);
    let mut settled = first.clone();
    settled.state = DeliveryState::Delivered;
    settled.next_attempt_at = None;
    wait(store.save_notification(first, &settled, None).unwrap());
    let mut delivered = n.clone();
    delivered.state = DeliveryState::Delivered;
    delivered.next_attempt_at = None;
    delivered.total_attempts = 1;
    wait(store.save_notification(n, &delivered, None).unwrap());
    assert!(store.due_notifications(Timestamp::now(), 10).unwrap().is_empty());
    let listed = store.notifications(&shop.id, None, 10, &mut |_| true).unwrap();
    assert_eq!(listed.data, [delivered.clone(), settled], "newest first");
    assert!(store
        .notifications(&shop.id, None, 10, &mut |n| n.state == DeliveryState::Failed)
        .unwrap()
        .data
        .is_empty());

    // A save made from a stale read names another due time: the entry it leaves behind is never offered.
    let mut stale = delivered.clone();
    stale.state = DeliveryState::Pending;
    stale.next_attempt_at = Some(Timestamp::from_unix_ms(1));
    let mut again = delivered.clone();
    again.next_attempt_at = None;
    wait(store.save_notification(&stale, &again, None).unwrap());
    assert!(store.due_notifications(Timestamp::now(), 10).unwrap().is_empty());
}

/// Accounts are found by id, by secret key and by e-mail whatever its case; a rolled key stops working in
/// the same write; a second account cannot take an e-mail; every change moves the generation.
fn accounts_are_found_by_key_and_email(backend: &dyn Backend) {
    let place = backend.place();
    let store = place.open();
    assert_eq!(store.merchant_count().unwrap(), 0);
    let id = MerchantId::new();
    let first = account(&id, 1);
    let before = store.merchants_generation();
    wait(store.put_merchant(first.clone(), None).unwrap());
    assert_ne!(store.merchants_generation(), before);
    assert_eq!(store.merchant(&id).unwrap(), Some(first.clone()));
    assert_eq!(store.merchant_by_key("sk_test_conformance1").unwrap(), Some(first.clone()));
    assert_eq!(store.merchant_by_email("boutique1@example.COM").unwrap(), Some(first.clone()));
    assert_eq!(store.merchant_count().unwrap(), 1);

    let mut rolled = first.clone();
    rolled.secret_key = "sk_test_rolled".into();
    wait(store.put_merchant(rolled.clone(), Some(first.secret_key.clone())).unwrap());
    assert_eq!(store.merchant_by_key("sk_test_conformance1").unwrap(), None, "the old key stops working");
    assert_eq!(store.merchant_by_key("sk_test_rolled").unwrap(), Some(rolled.clone()));

    // A roll with a grace: both keys find the merchant, and the old one says until when it is valid.
    let mut graced = rolled.clone();
    graced.secret_key = "sk_test_graced".into();
    let until = Timestamp::from_unix_ms(1_900_000_000_000);
    wait(store.put_merchant_keeping(graced.clone(), rolled.secret_key.clone(), until).unwrap());
    assert_eq!(store.merchant_by_key("sk_test_graced").unwrap(), Some(graced.clone()));
    assert_eq!(store.merchant_by_key("sk_test_rolled").unwrap(), Some(graced.clone()), "the old key still finds it");
    assert_eq!(store.retired_key_until("sk_test_rolled").unwrap(), Some(until));
    assert_eq!(store.retired_key_until("sk_test_graced").unwrap(), None);

    let mut thief = account(&MerchantId::new(), 2);
    thief.email = first.email.to_uppercase();
    let refused = store.put_merchant(thief, None).map(|ticket| ticket.blocking_recv());
    assert!(matches!(refused, Err(StoreError::EmailTaken(_)) | Ok(Ok(Err(StoreError::EmailTaken(_))))), "{refused:?}");
    assert_eq!(store.merchant_count().unwrap(), 1);

    // Listed newest first, a page at a time; suspended and resumed.
    std::thread::sleep(std::time::Duration::from_millis(2));
    let second = account(&MerchantId::new(), 3);
    wait(store.put_merchant(second.clone(), None).unwrap());
    let all: Vec<MerchantId> = store.merchants(None, 10).unwrap().into_iter().map(|m| m.id).collect();
    assert_eq!(all, [second.id.clone(), id.clone()]);
    let rest: Vec<MerchantId> = store.merchants(Some(&second.id), 10).unwrap().into_iter().map(|m| m.id).collect();
    assert_eq!(rest, std::slice::from_ref(&id));
    assert_eq!(store.merchants(None, 1).unwrap().len(), 1);
    assert_eq!(store.suspended_since(&id).unwrap(), None);
    let at = Timestamp::from_unix_ms(1_800_000_000_000);
    let before = store.merchants_generation();
    wait(store.set_suspended(&id, Some(at)).unwrap());
    assert_ne!(store.merchants_generation(), before, "a suspension moves the generation: the API caches it");
    assert_eq!(store.suspended_since(&id).unwrap(), Some(at));
    assert_eq!(store.suspended_since(&second.id).unwrap(), None, "only that merchant");
    let before = store.merchants_generation();
    wait(store.set_suspended(&id, None).unwrap());
    assert_ne!(store.merchants_generation(), before);
    assert_eq!(store.suspended_since(&id).unwrap(), None);
}

/// Once a write of an actor failed (its latch is set), every later write carrying the latch is refused at
/// once and changes nothing.
fn a_tripped_latch_refuses_the_write(backend: &dyn Backend) {
    let place = backend.place();
    let store = place.open();
    let mut shop = Shop::new();
    shop.pay(&*store, 1_000, "latch-1");
    shop.latch.store(true, std::sync::atomic::Ordering::Release);
    let (change, _) = shop.change(&Command::InitiatePayment(new_payment(1_000, Some("latch-2"))), None);
    let refused = store.commit(change, &shop.latch).map(|ticket| ticket.blocking_recv());
    assert!(matches!(refused, Err(StoreError::Aborted) | Ok(Ok(Err(StoreError::Aborted)))), "{refused:?}");
    assert_eq!(store.payment(&shop.id, "latch-2").unwrap(), None);
    assert_eq!(store.recover_merchant(&shop.id).unwrap().seq, 1);
    assert!(store.healthy());
}

/// Everything survives a stop and a new open: records, lists, accounts, notifications, and a recovery and an
/// audit that agree with the balances the changes produced.
fn everything_survives_a_reopen_and_the_audit_agrees(backend: &dyn Backend) {
    let place = backend.place();
    let (mut a, mut b) = (Shop::new(), Shop::new());
    let a_account = account(&a.id, 1);
    {
        let store = place.open();
        wait(store.put_merchant(a_account.clone(), None).unwrap());
        for n in 0..5 {
            a.pay(&*store, 1_000 * (n + 1), &format!("a-{n}"));
            a.confirm(&*store, &format!("a-{n}"));
        }
        b.pay(&*store, 7_000, "b-0");
        b.confirm(&*store, "b-0");
        let payout = b.run(&*store, Command::CreatePayout(new_payout(2_000)), None);
        let outcome = PayoutOutcome::Sent;
        b.run(&*store, Command::PayoutNotice { id: payout.key().to_owned(), outcome }, None);
    }
    let store = place.open();
    for shop in [&a, &b] {
        let recovered = store.recover_merchant(&shop.id).unwrap();
        assert_eq!((recovered.seq, &recovered.balances), (shop.seq, &shop.balances));
        assert_eq!(store.journal(&shop.id, 1, 100).unwrap().len() as u64, shop.seq);
    }
    assert_eq!(store.merchant(&a.id).unwrap(), Some(a_account));
    assert_eq!(store.transactions(&a.id, None, 100, &mut |_| true).unwrap().data.len(), 5);
    assert_eq!(store.payouts(&b.id, None, 100, &mut |_| true).unwrap().data.len(), 1);
    // Each payment notified its initiation and its success.
    assert_eq!(store.notifications(&a.id, None, 100, &mut |_| true).unwrap().data.len(), 10);
    let report = store.audit().unwrap();
    assert_eq!((report.merchants, report.events), (2, a.seq + b.seq));
}

/// A merchant's changes queued back to back, as a busy actor queues them, are committed together: each event
/// reads back in order wherever a read starts, after a reopen too.
fn changes_queued_together_read_back_event_by_event(backend: &dyn Backend) {
    queue_and_read_back(&*backend.place());
}

/// Queues 600 payments of one merchant back to back and confirms one, then checks what reads back after a
/// reopen; returns the number of journal events written.
fn queue_and_read_back(place: &dyn Place) -> u64 {
    let mut shop = Shop::new();
    // More than one stored run of events holds (256), so a batch that took them all is split.
    let count: u64 = 600;
    {
        let store = place.open();
        let tickets: Vec<Ticket> = (0..count)
            .map(|n| {
                let payment = new_payment(1_000 + n as i64, Some(&format!("q-{n}")));
                shop.queue(&*store, Command::InitiatePayment(payment))
            })
            .collect();
        tickets.into_iter().for_each(wait);
        let reference = Reference::parse("q-7").unwrap();
        shop.run(&*store, Command::PaymentNotice { reference, notice: PaymentNotice::Confirmed }, None);
    }
    let store = place.open();
    let seqs = |from: u64, limit: usize| -> Vec<u64> {
        store.journal(&shop.id, from, limit).unwrap().iter().map(|event| event.seq).collect()
    };
    assert_eq!(seqs(1, 1_000), (1..=count + 1).collect::<Vec<_>>());
    assert_eq!(seqs(250, 10), (250..260).collect::<Vec<_>>());
    assert_eq!(seqs(count + 1, 5), vec![count + 1]);
    let recovered = store.recover_merchant(&shop.id).unwrap();
    assert_eq!((recovered.seq, &recovered.balances), (shop.seq, &shop.balances));
    assert_eq!(store.audit().unwrap().events, shop.seq);
    shop.seq
}

/// Many merchants' changes queued at once, as a busy node queues them, land each merchant's in its order,
/// however the store groups them into transactions.
fn many_merchants_changes_queued_at_once_land_in_each_merchants_order(backend: &dyn Backend) {
    let place = backend.place();
    let mut shops: Vec<Shop> = (0..40).map(|_| Shop::new()).collect();
    {
        let store = place.open();
        let mut tickets = Vec::new();
        for n in 0..50 {
            for shop in &mut shops {
                let payment = new_payment(100 + n, Some(&format!("m-{n}")));
                tickets.push(shop.queue(&*store, Command::InitiatePayment(payment)));
            }
        }
        tickets.into_iter().for_each(wait);
    }
    let store = place.open();
    for shop in &shops {
        let seqs: Vec<u64> = store.journal(&shop.id, 1, 100).unwrap().iter().map(|event| event.seq).collect();
        assert_eq!(seqs, (1..=50).collect::<Vec<_>>());
        let recovered = store.recover_merchant(&shop.id).unwrap();
        assert_eq!((recovered.seq, &recovered.balances), (shop.seq, &shop.balances));
    }
    assert_eq!(store.audit().unwrap().events, 40 * 50);
}

/// The audit at start replays each merchant's journal from its last audit checkpoint: what a passed audit
/// replayed is not replayed again after a reopen, while the full audit still replays everything.
fn the_audit_since_checkpoints_replays_only_what_is_new(backend: &dyn Backend) {
    let place = backend.place();
    let mut shop = Shop::new();
    let first = {
        let store = place.open();
        for n in 0..3 {
            shop.pay(&*store, 1_000, &format!("p-{n}"));
            shop.confirm(&*store, &format!("p-{n}"));
        }
        let report = store.audit_since_checkpoints().unwrap();
        assert_eq!((report.merchants, report.events, report.from_checkpoint), (1, shop.seq, 0));
        shop.seq
    };
    let store = place.open();
    assert_eq!(store.audit_since_checkpoints().unwrap().events, 0);
    shop.pay(&*store, 2_000, "p-3");
    shop.confirm(&*store, "p-3");
    let report = store.audit_since_checkpoints().unwrap();
    assert_eq!((report.merchants, report.events, report.from_checkpoint), (1, shop.seq - first, 1));
    assert_eq!(store.audit().unwrap().events, shop.seq);
    assert_eq!(store.recover_merchant(&shop.id).unwrap().balances, shop.balances);
}

/// What retention reads and deletes: idempotency records by the time they were made, notifications by theirs,
/// each merchant's in turn; deleting takes the index entry (and the record, or the notification's due entry)
/// in one write. Then a close: everything stays readable after a reopen, and writes after it are refused.
fn retention_finds_by_time_and_forgets_and_a_close_refuses_later_writes(backend: &dyn Backend) {
    use caisse_engine::store::ExpiredIdempotency;
    let place = backend.place();
    let mut shop = Shop::new();
    {
        let store = place.open();
        shop.run(&*store, Command::InitiatePayment(new_payment(2_000, Some("kept-1"))), Some("key-1"));
        shop.run(&*store, Command::InitiatePayment(new_payment(2_000, Some("kept-2"))), Some("key-2"));
        let later = Timestamp::now().plus_ms(1);
        let made = store.idempotency_made_before(&shop.id, later, 10).unwrap();
        assert_eq!(made.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["key-1", "key-2"], "oldest first");
        assert!(store.idempotency_made_before(&shop.id, Timestamp::EPOCH, 10).unwrap().is_empty());
        assert_eq!(store.next_merchant_with_idempotency(None).unwrap(), Some(shop.id.clone()));
        assert_eq!(store.next_merchant_with_idempotency(Some(&shop.id)).unwrap(), None);
        let (key, made_at) = made[0].clone();
        wait(
            store
                .forget_idempotency(&shop.id, &[ExpiredIdempotency { key: key.clone(), made_at, record: true }], None)
                .unwrap(),
        );
        assert_eq!(store.idempotency(&shop.id, &key).unwrap(), None);
        assert_eq!(store.idempotency_made_before(&shop.id, later, 10).unwrap().len(), 1);

        // One notification per payment (initiated), oldest first.
        let notes = store.notifications_made_before(&shop.id, later, None, 10).unwrap();
        assert_eq!(notes.len(), 2);
        assert!(notes[0].id < notes[1].id);
        let rest = store.notifications_made_before(&shop.id, later, Some(&notes[0].id), 10).unwrap();
        assert_eq!(rest, notes[1..]);
        assert_eq!(store.next_merchant_with_notifications(None).unwrap(), Some(shop.id.clone()));
        wait(store.forget_notifications(&notes[..1]).unwrap());
        assert_eq!(store.notification(&shop.id, &notes[0].id).unwrap(), None);
        let due = store.due_notifications(Timestamp::now(), 10).unwrap();
        assert!(due.iter().all(|n| n.id != notes[0].id), "its due entry went with it");

        store.close().unwrap();
        let refused = store.put_merchant(account(&shop.id, 9), None);
        assert!(matches!(refused, Err(StoreError::Closed)), "{refused:?}");
    }
    let store = place.open();
    assert_eq!(store.notifications_made_before(&shop.id, Timestamp::now(), None, 10).unwrap().len(), 1);
    assert!(store.idempotency(&shop.id, &IdempotencyKey::parse("key-2").unwrap()).unwrap().is_some());
}

/// The provider side of a transaction is written with the change that carries it and read by transaction id:
/// the route with the creation, the provider's reference with an answer; a transaction without them has none.
fn provider_trails_are_kept_with_their_change(backend: &dyn Backend) {
    let place = backend.place();
    let mut shop = Shop::new();
    let route = ProviderRoute {
        adapter: AdapterName::parse("pawapay").unwrap(),
        return_url: Some(ReturnUrl::parse("https://shop.example/merci", true).unwrap()),
    };
    let reference = ProviderReference::parse("MP250101.1200.A00001").unwrap();
    let transaction_id = {
        let store = place.open();
        let (mut change, balances) = shop.change(&Command::InitiatePayment(new_payment(2_000, Some("routed"))), None);
        let Record::Payment(payment) = change.record.clone() else { unreachable!() };
        change.route = Some((payment.transaction_id.clone(), route.clone()));
        wait(store.commit(change, &shop.latch).unwrap());
        shop.seq += 1;
        shop.balances = balances;
        shop.records.insert("routed".into(), Record::Payment(payment.clone()));
        let trail = store.provider_trail(&payment.transaction_id).unwrap();
        assert_eq!((trail.route.as_ref(), trail.reference.as_ref()), (Some(&route), None));

        let notice =
            Command::PaymentNotice { reference: Reference::parse("routed").unwrap(), notice: PaymentNotice::Confirmed };
        let (mut change, balances) = shop.change(&notice, None);
        change.provider_reference = Some((payment.transaction_id.clone(), reference.clone()));
        wait(store.commit(change, &shop.latch).unwrap());
        shop.seq += 1;
        shop.balances = balances;

        let Record::Payment(plain) = shop.pay(&*store, 1_000, "plain") else { unreachable!() };
        assert_eq!(store.provider_trail(&plain.transaction_id).unwrap(), ProviderTrail::default());
        payment.transaction_id
    };
    let store = place.open();
    let trail = store.provider_trail(&transaction_id).unwrap();
    assert_eq!(trail, ProviderTrail { route: Some(route), reference: Some(reference) });
    assert_eq!(store.provider_trail("tx_01JD0000000000000000000000").unwrap(), ProviderTrail::default());
}

/// Every check above as a test of one backend.
macro_rules! conformance {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;

            #[test]
            fn a_change_reads_back_through_every_view() {
                super::a_change_reads_back_through_every_view(&$backend);
            }

            #[test]
            fn links_read_back_with_their_payments() {
                super::links_read_back_with_their_payments(&$backend);
            }

            #[test]
            fn lists_page_newest_first_with_cursors() {
                super::lists_page_newest_first_with_cursors(&$backend);
            }

            #[test]
            fn idempotency_records_belong_to_their_merchant() {
                super::idempotency_records_belong_to_their_merchant(&$backend);
            }

            #[test]
            fn notifications_are_fed_come_due_and_settle() {
                super::notifications_are_fed_come_due_and_settle(&$backend);
            }

            #[test]
            fn accounts_are_found_by_key_and_email() {
                super::accounts_are_found_by_key_and_email(&$backend);
            }

            #[test]
            fn a_tripped_latch_refuses_the_write() {
                super::a_tripped_latch_refuses_the_write(&$backend);
            }

            #[test]
            fn provider_trails_are_kept_with_their_change() {
                super::provider_trails_are_kept_with_their_change(&$backend);
            }

            #[test]
            fn everything_survives_a_reopen_and_the_audit_agrees() {
                super::everything_survives_a_reopen_and_the_audit_agrees(&$backend);
            }

            #[test]
            fn retention_finds_by_time_and_forgets_and_a_close_refuses_later_writes() {
                super::retention_finds_by_time_and_forgets_and_a_close_refuses_later_writes(&$backend);
            }

            #[test]
            fn many_merchants_changes_queued_at_once_land_in_each_merchants_order() {
                super::many_merchants_changes_queued_at_once_land_in_each_merchants_order(&$backend);
            }

            #[test]
            fn changes_queued_together_read_back_event_by_event() {
                super::changes_queued_together_read_back_event_by_event(&$backend);
            }

            #[test]
            fn the_audit_since_checkpoints_replays_only_what_is_new() {
                super::the_audit_since_checkpoints_replays_only_what_is_new(&$backend);
            }
        }
    };
}

conformance!(fjall, Fjall);
conformance!(postgresql, Postgres);

/// A merchant's events committed together are stored as runs, one row each, rather than a row per event.
#[test]
fn postgresql_stores_a_merchants_events_committed_together_in_fewer_rows() {
    let database = postgres::database();
    let events = queue_and_read_back(&database);
    let rows: u64 = postgres::query_value(&database.url, "SELECT count(*) FROM kv_journal").parse().unwrap();
    assert!(rows < events, "{rows} journal rows for {events} events: none were joined");
}

/// A URL naming several servers (a primary and its standbys, in any order) is served by the one that takes
/// writes, for writes and reads alike: a standby named first, which would refuse the schema's migration and
/// could answer reads from behind the primary, is passed over.
#[test]
fn postgresql_connects_only_to_the_server_that_takes_writes_of_those_a_url_names() {
    let database = postgres::database();
    let Some(standby) = postgres::read_only_twin(&database) else {
        eprintln!("skipped: CAISSE_TEST_DATABASE_URL names the server, and no second one is started beside it");
        return;
    };
    let store: Arc<dyn Store> =
        Arc::new(PgStore::open(&database.url_with_first_host(&standby)).expect("open the store on the primary"));
    let mut shop = Shop::new();
    shop.pay(&*store, 1_000, "first");
    shop.pay(&*store, 2_000, "second");
    let recovered = store.recover_merchant(&shop.id).unwrap();
    assert_eq!((recovered.seq, &recovered.balances), (shop.seq, &shop.balances));
    let payments = postgres::query_value(&database.url, "SELECT count(*) FROM kv_payments");
    assert_eq!(payments, "2", "both payments are on the primary");
}

/// The keys a change makes are inserted without a search for a row to update. A journal position a row holds
/// all the same means the change was decided on a stale view of its merchant (a sequence number used twice, as
/// a commit whose answer was lost and that landed late could cause): that change is refused as after a failed
/// write, nothing is written over the row, and the other merchants' changes, queued at the same time, land.
#[test]
fn postgresql_refuses_a_change_whose_journal_position_a_row_holds() {
    let database = postgres::database();
    let mut shops: Vec<Shop> = (0..3).map(|_| Shop::new()).collect();
    let store = database.open();
    for shop in &mut shops {
        shop.pay(&*store, 1_000, "first");
    }
    // The key of the middle merchant's next journal event: its id, then the event's sequence number.
    let mut key: Vec<u8> = shops[1].id.as_bytes().to_vec();
    key.extend_from_slice(&(shops[1].seq + 1).to_be_bytes());
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    database.execute(&format!("INSERT INTO kv_journal (k, v) VALUES ('\\x{hex}', '\\x00')"));
    let mut tickets: Vec<Ticket> = shops
        .iter_mut()
        .map(|shop| shop.queue(&*store, Command::InitiatePayment(new_payment(2_000, Some("second")))))
        .collect();
    // The refused merchant's actor also queued a request's answer written again, which builds on that change.
    let key = IdempotencyKey::parse("key-after").unwrap();
    let answer =
        IdempotencyRecord { fingerprint: "f".into(), status: 201, body: "{}".into(), created_at: Timestamp::now() };
    tickets.push(store.rewrite_answer(&shops[1].id, &key, &answer, &shops[1].latch, None).unwrap());
    let answers: Vec<Result<(), StoreError>> =
        tickets.into_iter().map(|ticket| ticket.blocking_recv().expect("answered")).collect();
    assert!(matches!(answers[1], Err(StoreError::Aborted)), "{:?}", answers[1]);
    assert!(matches!(answers[3], Err(StoreError::Aborted)), "the answer too: {:?}", answers[3]);
    assert_eq!(store.idempotency(&shops[1].id, &key).unwrap(), None);
    assert!(answers[0].is_ok() && answers[2].is_ok(), "{answers:?}");
    assert!(shops[1].latch.load(std::sync::atomic::Ordering::Acquire), "the refused merchant's later writes wait");
    drop(store);
    let held =
        postgres::query_value(&database.url, &format!("SELECT encode(v, 'hex') FROM kv_journal WHERE k = '\\x{hex}'"));
    assert_eq!(held, "00", "the row in the way is left as it was");
    let store = database.open();
    assert!(store.payment(&shops[1].id, "second").unwrap().is_none(), "nothing of the refused change is written");
    for shop in [&shops[0], &shops[2]] {
        let seqs: Vec<u64> = store.journal(&shop.id, 1, 10).unwrap().iter().map(|event| event.seq).collect();
        assert_eq!(seqs, vec![1, 2]);
        let recovered = store.recover_merchant(&shop.id).unwrap();
        assert_eq!((recovered.seq, &recovered.balances), (shop.seq, &shop.balances));
        assert!(store.payment(&shop.id, "second").unwrap().is_some());
    }
}

/// Whether a session other than the asker's is in a transaction on the test's database.
fn a_session_is_in_a_transaction(database: &postgres::TestDatabase) -> bool {
    let open = postgres::query_value(
        &database.url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND backend_type = 'client backend' AND xact_start IS NOT NULL AND pid <> pg_backend_pid()",
    );
    open != "0"
}

/// A fresh database, a proxy to it, a store that reaches it through the proxy, and a merchant with a first
/// payment committed there.
fn behind_a_proxy() -> (postgres::TestDatabase, proxy::Proxy, Arc<dyn Store>, Shop) {
    let database = postgres::database();
    let proxy = proxy::Proxy::start(&database.server_address());
    let store: Arc<dyn Store> = Arc::new(PgStore::open(&database.url_via(proxy.port)).expect("open the store"));
    let mut shop = Shop::new();
    shop.pay(&*store, 1_000, "first");
    (database, proxy, store, shop)
}

/// A commit whose answer is lost (the connection closed once its `COMMIT` was sent) is acknowledged when the
/// database says it committed: the change is there, its merchant's later changes are not refused.
#[test]
fn postgresql_acknowledges_a_commit_whose_answer_was_lost_once_it_learns_it_landed() {
    let (_database, proxy, store, mut shop) = behind_a_proxy();
    proxy.lose_next_commit_answer();
    shop.pay(&*store, 2_000, "second");
    assert_eq!(proxy.commits_caught(), 1, "the answer to the second payment's commit was lost");
    assert!(!shop.latch.load(std::sync::atomic::Ordering::Acquire), "nothing was refused");
    shop.pay(&*store, 3_000, "third");
    let seqs: Vec<u64> = store.journal(&shop.id, 1, 10).unwrap().iter().map(|event| event.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    let recovered = store.recover_merchant(&shop.id).unwrap();
    assert_eq!((recovered.seq, &recovered.balances), (shop.seq, &shop.balances));
}

/// A commit still running when the writer stops waiting for its answer (here a deferred check that takes 15 s;
/// in production, a wait for a synchronous standby) is waited for, not cut short, and acknowledged once it
/// has landed.
#[test]
fn postgresql_waits_for_a_commit_still_running_when_its_answer_is_late_and_acknowledges_it() {
    let (database, _proxy, store, mut shop) = behind_a_proxy();
    database.execute(
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM pg_sleep(15); RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT OR UPDATE ON kv_journal \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()",
    );
    let acknowledged = || METRICS.lost_commits(LostCommit::Acknowledged);
    let before = acknowledged();
    shop.pay(&*store, 2_000, "second");
    assert!(acknowledged() > before, "acknowledged once the database said it committed, not before");
    assert!(!shop.latch.load(std::sync::atomic::Ordering::Acquire), "nothing was refused");
    let seqs: Vec<u64> = store.journal(&shop.id, 1, 10).unwrap().iter().map(|event| event.seq).collect();
    assert_eq!(seqs, vec![1, 2]);
}

/// With the database out of reach, a commit whose answer is lost is answered as failed, its outcome unknown,
/// within the writer's bound; by then the server has ended the transaction itself, so its `COMMIT`, delivered
/// late, lands nothing.
#[test]
fn postgresql_answers_a_lost_commit_as_unknown_with_the_database_out_of_reach_and_it_never_lands() {
    let (database, proxy, store, shop) = behind_a_proxy();
    let unknown = || METRICS.lost_commits(LostCommit::Unknown);
    let before = unknown();
    proxy.hold_next_commit();
    let (change, _) = shop.change(&Command::InitiatePayment(new_payment(2_000, Some("second"))), None);
    let ticket = store.commit(change, &shop.latch).expect("queued");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !proxy.holds_commit() {
        assert!(std::time::Instant::now() < deadline, "the COMMIT reached the proxy within 10 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    proxy.cut();
    let failure = ticket.blocking_recv().expect("answered").expect_err("answered as failed").to_string();
    assert!(failure.contains("unknown"), "{failure}");
    assert!(unknown() > before, "counted as unknown");
    proxy.heal();
    proxy.release();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while a_session_is_in_a_transaction(&database) {
        assert!(std::time::Instant::now() < deadline, "sessions still in a transaction after 30 s");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let events = postgres::query_value(&database.url, "SELECT count(*) FROM kv_journal");
    assert_eq!(events, "1", "only the first payment's event is there");
}

/// A commit whose `COMMIT` is held up in the network (the connection silent, as in a partition) fails only
/// once it can no longer land: delivered late, after the failure was answered, it commits nothing, so the
/// merchant's actor reloads a view that stays true.
#[test]
fn postgresql_fails_a_commit_held_up_in_the_network_only_once_it_cannot_land() {
    let (database, proxy, store, shop) = behind_a_proxy();
    proxy.hold_next_commit();
    let (change, _) = shop.change(&Command::InitiatePayment(new_payment(2_000, Some("second"))), None);
    let answer = store.commit(change, &shop.latch).expect("queued").blocking_recv().expect("answered");
    // Failed because this node ended the transaction (or, on a machine too loaded to ask in time, because the
    // server gave up waiting for its COMMIT first); either way it cannot land any more.
    let failure = answer.expect_err("the held-up commit is answered as failed").to_string();
    assert!(failure.contains("this node ended the transaction") || failure.contains("rolled back"), "{failure}");
    assert!(proxy.holds_commit(), "the COMMIT was held up");
    assert!(shop.latch.load(std::sync::atomic::Ordering::Acquire), "the merchant's later writes wait for a reload");
    proxy.release();
    // The late COMMIT has landed, or found no transaction, once no session is in one.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while a_session_is_in_a_transaction(&database) {
        assert!(std::time::Instant::now() < deadline, "sessions still in a transaction after 30 s");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(store.payment(&shop.id, "second").unwrap().is_none(), "the late COMMIT committed nothing");
    let seqs: Vec<u64> = store.journal(&shop.id, 1, 10).unwrap().iter().map(|event| event.seq).collect();
    assert_eq!(seqs, vec![1]);
}

/// What only a store several nodes share does: shards placed on one node at a time, and the fence that refuses
/// a write made under a token another node has raised.
mod postgresql_cluster {
    use std::time::{Duration, Instant};

    use caisse_engine::store::pg_store::{shard_of, NodeIdentity, SHARDS};
    use caisse_engine::store::{Accounts, Commits, Outbox, Placement, Records};

    use super::*;

    fn node(db: &postgres::TestDatabase, name: &str) -> PgStore {
        let me = NodeIdentity { id: name.into(), url: format!("http://{name}.invalid") };
        let store = PgStore::open_node(&db.url, me).expect("open a node");
        store.join().expect("join the placement");
        store
    }

    /// Waits, a bounded time, until `done` holds.
    fn until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !done() {
            assert!(Instant::now() < deadline, "{what} within {limit:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn a_write_under_a_token_another_node_raised_fails_and_writes_nothing() {
        let db = postgres::database();
        let a = node(&db, "a");
        assert_eq!(a.shards_held(), SHARDS as usize, "a lone node holds every shard after its first round");
        let mut shop = Shop::new();
        let recovered = a.recover_merchant(&shop.id).expect("the holder claims the merchant");
        let fence = recovered.fence.expect("a node's recovery carries the shard's token");
        assert_eq!(fence.shard, shard_of(&shop.id));

        let (mut first, balances) = shop.change(&Command::InitiatePayment(new_payment(5_000, Some("first"))), None);
        first.fence = Some(fence);
        wait(a.commit(first, &shop.latch).expect("queued"));
        shop.seq += 1;
        shop.balances = balances;

        // Another node takes the shard: what a takeover after this node's lease ended does.
        db.execute(&format!(
            "UPDATE caisse_shards SET owner = 'b', fence = fence + 1, expires_at = now() + interval '1 hour' \
             WHERE shard = {}",
            fence.shard
        ));
        let (mut second, _) = shop.change(&Command::InitiatePayment(new_payment(7_000, Some("second"))), None);
        second.fence = Some(fence);
        let refused = a.commit(second, &shop.latch).expect("queued").blocking_recv().expect("answered");
        assert!(matches!(refused, Err(StoreError::NotOwner(_))), "{refused:?}");
        assert_eq!(a.journal(&shop.id, 1, 10).unwrap().len(), 1, "nothing of the fenced change was written");
        assert!(a.payment(&shop.id, "second").unwrap().is_none());
        // The actor's later writes are refused too: its memory is ahead of what the new holder reads.
        let (mut third, _) = shop.change(&Command::InitiatePayment(new_payment(1_000, Some("third"))), None);
        third.fence = Some(fence);
        assert!(matches!(a.commit(third, &shop.latch), Err(StoreError::Aborted)));
    }

    /// A delivery's outcome is saved under the fence its notification was read under: once another node has
    /// taken the shard, the save is refused and the notification stays as the database has it.
    #[test]
    fn a_delivery_outcome_saved_under_a_fence_another_node_raised_is_refused() {
        let db = postgres::database();
        let a = node(&db, "a");
        let shop = Shop::new();
        let fence = a.recover_merchant(&shop.id).expect("the holder claims the merchant").fence;
        assert_eq!(a.delivery_fence(&shop.id), fence, "deliveries are fenced as the actor's writes are");
        let (mut paid, _) = shop.change(&Command::InitiatePayment(new_payment(5_000, Some("hooked"))), None);
        paid.fence = fence;
        wait(a.commit(paid, &shop.latch).expect("queued"));
        let listed = a.notifications(&shop.id, None, 10, &mut |_| true).unwrap().data;
        let [read] = listed.as_slice() else { panic!("one notification: {listed:?}") };
        let attempted = |n: &caisse_engine::domain::records::Notification, attempts: u32| {
            let mut after = n.clone();
            after.total_attempts = attempts;
            after.next_attempt_at = Some(Timestamp::from_unix_ms(n.created_at.unix_ms() + 60_000));
            after
        };
        let once = attempted(read, 1);
        wait(a.save_notification(read, &once, fence).expect("queued"));
        assert_eq!(a.notification(&shop.id, &read.id).unwrap(), Some(once.clone()), "saved under the held fence");

        let shard = fence.expect("a node's fence").shard;
        db.execute(&format!(
            "UPDATE caisse_shards SET owner = 'b', fence = fence + 1, expires_at = now() + interval '1 hour' \
             WHERE shard = {shard}"
        ));
        let late = attempted(&once, 2);
        let refused = a.save_notification(&once, &late, fence).expect("queued").blocking_recv().expect("answered");
        assert!(matches!(refused, Err(StoreError::NotOwner(_))), "{refused:?}");
        assert_eq!(a.notification(&shop.id, &read.id).unwrap(), Some(once), "nothing of the refused save");
    }

    /// Two processes on one database creating merchants with one e-mail at the same moment: each passes the
    /// check before its write, and the database gives the e-mail to one of them. Within one process's batch,
    /// the later of two claims is refused the same way. The refused write leaves nothing behind.
    #[test]
    fn one_email_goes_to_one_merchant_across_processes_and_within_a_batch() {
        let answer = |queued: Result<Ticket, StoreError>| queued.and_then(|t| t.blocking_recv().expect("answered"));
        let db = postgres::database();
        let (a, b) = (PgStore::open(&db.url).expect("open a"), PgStore::open(&db.url).expect("open b"));
        for round in 0..4u32 {
            let (first, mut second) =
                (account(&MerchantId::new(), 10 + round), account(&MerchantId::new(), 20 + round));
            second.email = first.email.clone();
            // Both queued before either is awaited: the two writers commit at about the same moment, and
            // whichever check comes after the other's commit refuses at once.
            let (one, two) = (a.put_merchant(first.clone(), None), b.put_merchant(second.clone(), None));
            let answers = [answer(one), answer(two)];
            let won: Vec<bool> = answers.iter().map(|r| r.is_ok()).collect();
            assert_eq!(won.iter().filter(|w| **w).count(), 1, "round {round}: {answers:?}");
            assert!(answers.iter().any(|r| matches!(r, Err(StoreError::EmailTaken(_)))), "{answers:?}");
            let (winner, loser) = if won[0] { (&first, &second) } else { (&second, &first) };
            assert_eq!(a.merchant_by_email(&first.email).unwrap().map(|m| m.id), Some(winner.id.clone()));
            assert_eq!(b.merchant(&loser.id).unwrap(), None, "nothing of the refused merchant was written");
            assert_eq!(b.merchant_by_key(&loser.secret_key).unwrap(), None);
        }

        let (first, mut second) = (account(&MerchantId::new(), 30), account(&MerchantId::new(), 31));
        second.email = first.email.clone();
        let (one, two) = (a.put_merchant(first.clone(), None), a.put_merchant(second.clone(), None));
        let answers = [answer(one), answer(two)];
        assert_eq!(answers.iter().filter(|r| r.is_ok()).count(), 1, "{answers:?}");
        assert_eq!(a.merchant_count().unwrap(), 5);
        // The merchant that holds an e-mail writes it again freely (a key roll writes the whole account).
        let mut rolled = a.merchant_by_email(&first.email).unwrap().expect("the winner");
        rolled.secret_key = "sk_test_rolled_in_cluster".into();
        wait(a.put_merchant(rolled.clone(), None).unwrap());
        assert_eq!(b.merchant_by_key("sk_test_rolled_in_cluster").unwrap().map(|m| m.id), Some(rolled.id));
    }

    #[test]
    fn a_node_writes_for_an_actor_only_under_a_token_and_a_client_claims_nothing() {
        let db = postgres::database();
        let client = PgStore::open(&db.url).expect("open a client");
        let shop = Shop::new();
        assert_eq!(client.recover_merchant(&shop.id).unwrap().fence, None);
        let a = node(&db, "a");
        let (change, _) = shop.change(&Command::InitiatePayment(new_payment(5_000, Some("unfenced"))), None);
        assert!(matches!(a.commit(change, &shop.latch), Err(StoreError::NotOwner(_))));
    }

    /// Until a round has read the accounts' version (and again whenever rounds fail, as on a node cut off the
    /// database), a node's generation of the accounts moves at every look, so no cache of them is trusted.
    #[test]
    fn a_node_that_has_not_read_the_accounts_version_lately_trusts_no_cache() {
        let db = postgres::database();
        let me = NodeIdentity { id: "a".into(), url: "http://a.invalid".into() };
        let store = PgStore::open_node(&db.url, me).expect("open a node");
        assert_ne!(store.merchants_generation(), store.merchants_generation(), "no round yet");
        store.join().expect("join the placement");
        until("a round read the version", Duration::from_secs(10), || {
            store.merchants_generation() == store.merchants_generation()
        });
    }

    /// A change of accounts made through one node (or `caisse merchant ...` on the database) moves every
    /// node's generation within a round, so their caches of keys and suspensions read again.
    #[test]
    fn a_suspension_written_by_one_node_moves_the_others_generation() {
        let db = postgres::database();
        let a = node(&db, "a");
        let b = node(&db, "b");
        let id = MerchantId::new();
        wait(a.put_merchant(account(&id, 7), None).unwrap());
        until("b sees the new account", Duration::from_secs(10), || b.merchant(&id).unwrap().is_some());
        let before = b.merchants_generation();
        wait(a.set_suspended(&id, Some(Timestamp::from_unix_ms(1_800_000_000_000))).unwrap());
        until("b's generation moves", Duration::from_secs(10), || b.merchants_generation() != before);
        assert!(b.suspended_since(&id).unwrap().is_some());
    }

    /// An account lock taken through one process holds another's off until it is dropped, and not longer.
    #[test]
    fn an_account_lock_holds_other_processes_off_until_dropped() {
        let db = postgres::database();
        let (a, b) = (PgStore::open(&db.url).expect("open a"), PgStore::open(&db.url).expect("open b"));
        let id = MerchantId::new();
        let held = a.lock_account(&id).expect("a locks");
        let (took, taken) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let lock = b.lock_account(&id);
            let _ = took.send(());
            lock.map(drop)
        });
        assert!(taken.recv_timeout(Duration::from_millis(500)).is_err(), "b took the lock a holds");
        // Another merchant's lock is not held up.
        drop(a.lock_account(&MerchantId::new()).expect("another merchant's lock"));
        drop(held);
        taken.recv_timeout(Duration::from_secs(5)).expect("b takes the lock once a drops it");
        waiter.join().expect("waiter").expect("b's lock");
    }

    /// Two nodes change one account at the same moment, over and over: one rolls the key, the other sets the
    /// webhook URL. Each change reads the account under the lock, so neither writes back an older copy: the
    /// account ends with both last changes, and no rolled-away key authenticates again.
    #[test]
    fn account_changes_on_two_nodes_at_once_keep_each_other() {
        use caisse_engine::{Engine, EngineConfig, KeyChange};
        let db = postgres::database();
        let dir = tempfile::tempdir().expect("tempdir");
        let id = MerchantId::new();
        let first = account(&id, 40);
        let report = actix::System::new().block_on(async move {
            let engine = |name: &str| {
                let store = Arc::new(PgStore::open(&db.url).expect("open a store"));
                Engine::with_store(store, EngineConfig::new(dir.path().join(name))).expect("an engine")
            };
            let (a, b) = (engine("a"), engine("b"));
            a.put_merchant(first.clone(), None).await.expect("create the merchant");
            const ROUNDS: usize = 12;
            let rolls = async {
                for round in 0..ROUNDS {
                    let rolled = a.update_merchant(&id, move |m| {
                        KeyChange::Revoked(std::mem::replace(&mut m.secret_key, format!("sk_test_rolled_{round}")))
                    });
                    rolled.await.expect("a roll").expect("the merchant");
                }
            };
            let urls = async {
                for round in 0..ROUNDS {
                    let saved = b.update_merchant(&id, move |m| {
                        m.webhook_url = Some(format!("https://b.example.com/hook/{round}"));
                        KeyChange::Kept
                    });
                    saved.await.expect("a URL change").expect("the merchant");
                }
            };
            futures_util::future::join(rolls, urls).await;
            let last = a.merchant(&id).expect("read").expect("the merchant");
            let mut revived = Vec::new();
            for key in std::iter::once(first.secret_key.clone())
                .chain((0..ROUNDS - 1).map(|round| format!("sk_test_rolled_{round}")))
            {
                if b.merchant_by_key(&key).expect("lookup").is_some() {
                    revived.push(key);
                }
            }
            (last, revived, ROUNDS)
        });
        let (last, revived, rounds) = report;
        assert_eq!(last.secret_key, format!("sk_test_rolled_{}", rounds - 1), "the last roll was kept");
        assert_eq!(last.webhook_url.as_deref(), Some(format!("https://b.example.com/hook/{}", rounds - 1).as_str()));
        assert!(revived.is_empty(), "rolled-away keys authenticate again: {revived:?}");
    }

    #[test]
    fn two_nodes_share_the_shards_and_a_stopped_node_gives_its_own_back() {
        let db = postgres::database();
        let a = node(&db, "a");
        let b = node(&db, "b");
        let half = SHARDS as usize / 2;
        until("the shards are balanced", Duration::from_secs(15), || {
            a.shards_held() == half && b.shards_held() == half
        });
        // Each node reads where the others' shards are once per round: until then a shard just taken is nowhere.
        let merchants: Vec<MerchantId> = (0..64).map(|_| MerchantId::new()).collect();
        until("each node knows where the other's merchants are", Duration::from_secs(10), || {
            merchants.iter().all(|m| a.placement(m) != Placement::Nobody && b.placement(m) != Placement::Nobody)
        });
        let mut on_a = 0;
        for m in &merchants {
            match (a.placement(m), b.placement(m)) {
                (Placement::Here, Placement::Node { id, url }) => {
                    assert_eq!((id.as_str(), url.as_str()), ("a", "http://a.invalid"));
                    on_a += 1;
                    assert!(matches!(b.recover_merchant(m), Err(StoreError::NotOwner(_))));
                }
                (Placement::Node { id, .. }, Placement::Here) => {
                    assert_eq!(id, "b");
                    assert!(matches!(a.recover_merchant(m), Err(StoreError::NotOwner(_))));
                }
                other => panic!("one merchant, two placements: {other:?}"),
            }
        }
        assert!(on_a > 0 && on_a < 64, "merchants on both nodes: {on_a} of 64 on a");
        a.close().unwrap();
        drop(a);
        // Within a round or two: the stopped node gave its shards back and said it is gone (its leases, which
        // would also end, last 10 s).
        until("the remaining node holds every shard", Duration::from_secs(6), || b.shards_held() == SHARDS as usize);
    }
}

/// TLS to PostgreSQL, against a private server that refuses plain connections and presents a certificate
/// signed by a CA of the test's own: the store connects with `sslmode=verify-full` (or `require`) and that CA
/// in `sslrootcert`, and nowhere else.
mod postgresql_tls {
    use caisse_engine::store::Accounts;

    use super::*;

    #[test]
    fn the_store_connects_over_tls_to_a_server_it_can_verify_and_only_then() {
        let ca_key = rcgen::KeyPair::generate().expect("a CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).expect("the CA");
        let server_key = rcgen::KeyPair::generate().expect("a server key");
        let server = rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("server parameters")
            .signed_by(&server_key, &ca, &ca_key)
            .expect("the server certificate");
        let Some(db) = postgres::tls_only_database(&server.pem(), &server_key.serialize_pem()) else {
            println!("CAISSE_TEST_DATABASE_URL is set: its server's TLS is not this test's to set up");
            return;
        };
        let dir = tempfile::tempdir().expect("a directory");
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).expect("write the CA");
        let refused = |url: &str| match PgStore::open(url) {
            Ok(_) => panic!("{url} connected"),
            Err(e) => e.to_string(),
        };

        let plain = refused(&db.url);
        assert!(plain.contains("pg_hba") || plain.contains("no encryption"), "{plain}");
        let unverified = refused(&format!("{}?sslmode=require", db.url));
        assert!(unverified.contains("TLS"), "a certificate of an unknown CA is refused: {unverified}");

        for (n, mode) in [(9, "require"), (10, "verify-full")] {
            let url = format!("{}?sslmode={mode}&sslrootcert={}", db.url, ca_file.display());
            let store = PgStore::open(&url).unwrap_or_else(|e| panic!("{mode}: {e}"));
            let id = MerchantId::new();
            wait(store.put_merchant(account(&id, n), None).unwrap());
            assert_eq!(store.merchant(&id).unwrap().map(|m| m.id), Some(id), "{mode}: written and read over TLS");
        }
    }
}
