//! Crash under HTTP load (issue 7): the real `caisse` binary takes concurrent payments, refunds and payouts
//! over HTTP from three merchants, is killed with SIGKILL at random moments, is started again on the same data
//! directory, and must show everything it acknowledged, nothing doubled, balances equal to its ledger and
//! never negative, and deliver every notification to receivers that verify each signature.
//!
//! # Method
//!
//! Three merchants are made with `caisse merchant create`, each with a webhook receiver in this process
//! (`receiver.rs`: it verifies the signature with its own HMAC code and refuses the first attempt of one
//! notification in eight, so retries are pending when the server dies). Then each cycle:
//!
//! 1. the load (`load.rs`, four workers per merchant) runs for 0.2 to 1.5 s: payments with every sandbox
//!    outcome, refunds of payments whose `payment.succeeded` arrived, payouts, balance reads;
//! 2. the server is killed with SIGKILL in the same synchronous step that closes the load's gate, so every
//!    request in flight died with it; in one cycle out of four a second server is started and killed 0 to
//!    400 ms later, while it opens and recovers the store or resubmits pending work;
//! 3. the server is started again on the same port and data (its startup audit must pass, or it does not
//!    start), and the checks (`checks.rs`) run with the load paused: every acknowledged payment, refund and
//!    payout is listed, and those answered in this cycle are read one by one; nothing is listed twice or
//!    comes from a refused request; no status went back from one seen in an answer or a webhook; the balances
//!    are the sum of the listed movements and not negative.
//!
//! Requests that lost their answer are sent again after the restart when they carry an `Idempotency-Key` (or,
//! for payments, a merchant reference), so the idempotency records are tested across crashes too.
//!
//! At the end the load runs once more without a kill, everything settles, the same checks run (reading every
//! acknowledged operation), each receiver must have acknowledged every notification the final states imply,
//! and, after a last kill, the store is opened directly: its audit passes, every stored notification is
//! delivered and was received with exactly its stored body, and nothing was received that the store does not
//! hold (a notification of a change the crash lost).
//!
//! Cycles: 3 by default, `CAISSE_CRASH_CYCLES=20` for the full run (the engine's crash test reads the same
//! variable). The seed of every random choice is printed; `CAISSE_CRASH_SEED` replays it (the load's timing,
//! and so its exact interleaving, still varies).
//!
//! SIGKILL keeps the operating system's page cache, so this proves that answers come after the write reached
//! the operating system, not that it reached the disk.

#[path = "../support/mod.rs"]
mod support;

mod checks;
mod cluster;
mod format;
mod load;
mod receiver;
mod selftest;
mod server;
mod sigterm;
mod store;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::checks::Snapshot;
use crate::load::{Merchant, Outcome, Run};
use crate::receiver::Receiver;
use crate::server::{create_merchant, Server, Target};
use crate::support::{free_port, sleep_ms};

const DEFAULT_CYCLES: u32 = 3;
const MERCHANTS: usize = 3;
const WORKERS_PER_MERCHANT: usize = 4;
/// How long the receivers have, once everything settled, to acknowledge every notification.
const DELIVERY_DEADLINE: Duration = Duration::from_secs(60);

fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    let value = std::env::var(name).ok()?;
    Some(value.parse().unwrap_or_else(|_| panic!("{name}={value} is not a number")))
}

/// Refusals the load can meet legitimately; any other means something is wrong.
fn expected_refusal(kind: &str, code: &str) -> bool {
    matches!((kind, code), ("refund" | "payout", "409 insufficient_balance"))
}

/// Runs the checks of every merchant and fails the test, naming the seed, on any finding.
async fn check_all(run: &Run, since_cycle: u32, webhooks_read: &mut [usize], seed: u64, when: &str) {
    let mut wrong: Vec<String> = run.violations.borrow_mut().drain(..).collect();
    for (merchant, read) in run.merchants.iter().zip(webhooks_read.iter_mut()) {
        // Webhooks first: what they carried was durable before the snapshot is read.
        checks::observe_webhooks(merchant, read);
        let snap = checks::snapshot(&run.target, merchant).await;
        wrong.extend(checks::check_merchant(&run.target, merchant, &snap, since_cycle).await);
        wrong.extend(
            merchant.receiver.invalid().into_iter().map(|w| format!("{}: invalid webhook: {w}", merchant.name)),
        );
        let book = merchant.book.borrow();
        let ops = [("payment", &book.payments), ("refund", &book.refunds), ("payout", &book.payouts)];
        for (kind, ops) in ops {
            for (what, op) in ops.iter() {
                if let Outcome::Refused(code) = &op.outcome {
                    if !expected_refusal(kind, code) {
                        wrong.push(format!("{}: {kind} {what} was refused: {code}", merchant.name));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "seed {seed}, {when}: {} failures:\n{}", wrong.len(), wrong.join("\n"));
}

/// Where the server runs: its working directory, its data directory and its port, the same at every start.
#[derive(Clone, Copy)]
struct Place<'a> {
    work_dir: &'a Path,
    data_dir: &'a Path,
    port: u16,
}

/// The SIGKILLs sent, and how many of them hit a server while it was starting.
#[derive(Default)]
struct Kills {
    all: u32,
    while_starting: u32,
}

#[actix_web::test]
async fn acknowledged_changes_survive_kill_9_under_http_load() {
    let started = Instant::now();
    let cycles: u32 = env_number("CAISSE_CRASH_CYCLES").unwrap_or(DEFAULT_CYCLES);
    let seed: u64 = env_number("CAISSE_CRASH_SEED").unwrap_or_else(rand::random);
    println!("crash test: {cycles} cycles, seed {seed} (CAISSE_CRASH_SEED={seed} replays it)");
    let mut rng = StdRng::seed_from_u64(seed);

    let dir = tempfile::TempDir::new().expect("temp dir");
    let data_dir = dir.path().join("data");
    let place = Place { work_dir: dir.path(), data_dir: &data_dir, port: free_port() };
    let (run, workers) =
        Run::start(Target::new(place.port), merchants_with_receivers(place), WORKERS_PER_MERCHANT, &mut rng);

    let mut webhooks_read = vec![0; MERCHANTS];
    let (server, mut kills) = kill_cycles(&run, place, cycles, &mut rng, seed, &mut webhooks_read).await;

    // The last stretch: load without a kill, then nothing new until everything settled.
    run.cycle.set(cycles + 1);
    run.target.open();
    sleep_ms(1_000).await;
    run.target.stop();
    for worker in workers {
        worker.await.expect("a worker ends");
    }
    let settled = checks::settle(&run).await;
    check_all(&run, 0, &mut webhooks_read, seed, "at the end").await;
    every_implied_notification_is_acknowledged(&run, &settled, seed).await;
    // Let the last attempts' outcomes be written (nothing arrives for a while), then kill and read the store.
    let deliveries = deliveries_once_quiet(&run).await;
    server.kill().unwrap_or_else(|e| panic!("seed {seed}, the last kill: {e}"));
    kills.all += 1;
    let stored = store::check_store(&data_dir, &run)
        .await
        .unwrap_or_else(|wrong| panic!("seed {seed}, the store: {} failures:\n{}", wrong.len(), wrong.join("\n")));
    println!(
        "crash test: seed {seed}, {cycles} cycles, {} kills ({} while starting), {:.1} s",
        kills.all,
        kills.while_starting,
        started.elapsed().as_secs_f64()
    );
    report(&run, stored, deliveries);
}

/// The merchants, made with `caisse merchant create`, each with its verifying webhook receiver.
fn merchants_with_receivers(place: Place) -> Vec<Merchant> {
    let mut merchants = Vec::new();
    for i in 0..MERCHANTS {
        let listener = TcpListener::bind("127.0.0.1:0").expect("receiver binds");
        let url = format!("http://127.0.0.1:{}/webhooks", listener.local_addr().expect("receiver address").port());
        let name = format!("m{i}");
        let created = create_merchant(place.work_dir, place.data_dir, &name, &url);
        let receiver = Receiver::start(listener, created.secret_key.clone());
        merchants.push(Merchant::new(name, created.id, created.secret_key, receiver));
    }
    merchants
}

/// Each cycle: the load runs, the server is killed (in one cycle out of four a second server too, while it
/// starts), started again, and everything is checked. Returns the server running after the last cycle.
async fn kill_cycles(
    run: &Run,
    place: Place<'_>,
    cycles: u32,
    rng: &mut StdRng,
    seed: u64,
    webhooks_read: &mut [usize],
) -> (Server, Kills) {
    let mut kills = Kills::default();
    let mut server = Server::start(place.work_dir, place.data_dir, place.port).await;
    for cycle in 1..=cycles {
        run.cycle.set(cycle);
        run.target.open();
        sleep_ms(rng.gen_range(200..1_500)).await;
        run.target.close();
        server.kill().unwrap_or_else(|e| panic!("seed {seed}, cycle {cycle}: {e}"));
        kills.all += 1;
        if rng.gen_ratio(1, 4) {
            let early = Server::spawn(place.work_dir, place.data_dir, place.port);
            sleep_ms(rng.gen_range(0..400)).await;
            early.kill().unwrap_or_else(|e| panic!("seed {seed}, cycle {cycle}, early kill: {e}"));
            kills.all += 1;
            kills.while_starting += 1;
        }
        server = Server::start(place.work_dir, place.data_dir, place.port).await;
        check_all(run, cycle, webhooks_read, seed, &format!("after kill {cycle}")).await;
    }
    (server, kills)
}

/// Every notification the final states imply reaches its receiver, verified, within [`DELIVERY_DEADLINE`].
async fn every_implied_notification_is_acknowledged(run: &Run, settled: &[Snapshot], seed: u64) {
    let expected: Vec<BTreeSet<(String, String)>> =
        run.merchants.iter().zip(settled).map(|(m, snap)| checks::expected_notifications(m, snap)).collect();
    let waiting = Instant::now();
    loop {
        let missing: Vec<String> = run
            .merchants
            .iter()
            .zip(&expected)
            .flat_map(|(m, expected)| {
                let acknowledged = store::acknowledged_notifications(m);
                let name = m.name.clone();
                expected.difference(&acknowledged).map(move |(e, r)| format!("{name}: {e} {r}")).collect::<Vec<_>>()
            })
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            waiting.elapsed() < DELIVERY_DEADLINE,
            "seed {seed}: {} notifications not acknowledged after {DELIVERY_DEADLINE:?}:\n{}",
            missing.len(),
            missing.join("\n")
        );
        sleep_ms(100).await;
    }
}

/// Waits until no verified delivery arrives for 1.5 s; returns how many arrived in all.
async fn deliveries_once_quiet(run: &Run) -> usize {
    // Deliveries still coming after this long are a redelivery loop, not a tail.
    const QUIET_WITHIN: Duration = Duration::from_secs(120);
    let started = Instant::now();
    let mut deliveries = 0;
    loop {
        let now: usize = run.merchants.iter().map(|m| m.receiver.delivery_count()).sum();
        if now == deliveries {
            return deliveries;
        }
        assert!(started.elapsed() < QUIET_WITHIN, "deliveries still arriving after {QUIET_WITHIN:?}: {now}");
        deliveries = now;
        sleep_ms(1_500).await;
    }
}

/// What the run did, for the log.
fn report(run: &Run, stored: usize, deliveries: usize) {
    let acknowledged: usize = run.merchants.iter().map(|m| store::acknowledged_notifications(m).len()).sum();
    let refused_on_purpose: usize =
        run.merchants.iter().map(|m| m.receiver.deliveries_from(0).iter().filter(|d| d.answered != 200).count()).sum();
    println!(
        "  acknowledged: {} payments, {} refunds, {} payouts",
        run.count_of("payment acknowledged"),
        run.count_of("refund acknowledged"),
        run.count_of("payout acknowledged")
    );
    println!(
        "  notifications: {stored} stored, {acknowledged} verified and acknowledged, {deliveries} verified \
         deliveries ({refused_on_purpose} first attempts refused on purpose)"
    );
    for (what, count) in run.tally.borrow().iter() {
        println!("  {what}: {count}");
    }
}
