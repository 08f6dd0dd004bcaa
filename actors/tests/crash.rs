//! Crash test, in the style of sled's own: a child process applies changes as fast as it can, the parent kills it
//! with SIGKILL at a random moment, reopens the store and checks that nothing acknowledged was lost or doubled.
//!
//! # Method
//!
//! The test binary runs itself again as a child (`std::env::current_exe()` with `--exact <test> --nocapture`
//! and `CAISSE_CRASH_CHILD=1` in its environment). The child opens the engine on the shared data directory and
//! runs 32 tasks over 8 merchants whose ids the parent generated once, so every cycle works on the same
//! accounts. Each task initiates payments (with a reference made of the cycle, the task and a counter),
//! confirms, declines, expires or leaves them pending, requests refunds and completes or refuses them, and
//! creates payouts and sends or rejects them. On restart the child also picks up records a previous cycle left
//! half way (pending payments, refunds in progress, payouts waiting) and moves them on, so recovered records
//! and balances are used, not only read. After every `Ok` from [`Engine::execute`] the child writes one line,
//! `ACK <merchant> <payment|payout> <key> <state> <command>`, and flushes it before doing anything else.
//!
//! The parent reads those lines, waits until the child says it is ready, sleeps 50 to 400 ms (or, in one
//! cycle out of eight, kills it 0 to 40 ms after the start, while it opens or recovers the store), kills it,
//! reopens the store with [`Engine::open`] (whose startup audit must pass) and checks:
//!
//! - every acknowledged record exists, in the acknowledged state or exactly one move further (the child issues
//!   one command at a time per record, so at most one unacknowledged move can have landed); a record nobody
//!   acknowledged may only exist in its first state;
//! - nothing is doubled: each `(reference, trigger)` appears at most once in the journal, a payment is
//!   credited (an entry on the customer-funds account) once if it is `succes` or `rembourse` and never
//!   otherwise;
//! - the journal is contiguous from 1, every event balances, and `disponible` and `en_attente` never go
//!   below zero along it;
//! - three views of the balances agree: the journal replayed here, the balances the records imply, and the
//!   balances of the recovered merchant actor (snapshot plus journal tail; snapshots are taken every 16
//!   events to exercise that path);
//! - the record, its journal, the transaction index and the webhook outbox were written together: the last
//!   journal status of each reference is the record's status, the transaction list holds exactly the
//!   journal's payments, refunds and payouts, and the outbox holds exactly the notifications the journal's
//!   events cause.
//!
//! Dropping the parent's engine must release the store's lock, or the next child cannot open the store; the child
//! then fails and so does the test. The cycle repeats 20 times by default (`CAISSE_CRASH_CYCLES` for more).
//!
//! # What this proves, and what it does not
//!
//! SIGKILL ends the process but keeps the operating system's page cache, so this test proves that the engine
//! answers only after its write reached the operating system, that each change is all-or-nothing, and that
//! recovery and the audit agree with what was acknowledged. It does not prove that `fsync` is called: that
//! needs a power cut, which a process cannot simulate. `the_checker_catches_lost_doubled_and_regressed_changes`
//! shows that the checks can fail: a fabricated acknowledgement, a regressed state and a forged second credit
//! are each caught.

mod support;

use support::{new_payment, new_payout};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, ExitStatus, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use caisse_engine::core::{Command, PaymentNotice, PayoutOutcome, RefundOutcome};
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::ledger::Account;
use caisse_engine::domain::money::{Amount, Currency};
use caisse_engine::domain::records::TransactionType;
use caisse_engine::domain::status::{EventKind, PaymentStatus, PayoutStatus, RefundStatus, Trigger};
use caisse_engine::domain::text::Reference;
use caisse_engine::domain::time::Timestamp;
use caisse_engine::store::{Change, Store};
use caisse_engine::{Engine, EngineConfig, EngineError, Executed, Record, Rejection};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const TEST_NAME: &str = "acknowledged_changes_survive_kill_9";
const CHILD_ENV: &str = "CAISSE_CRASH_CHILD";
const DIR_ENV: &str = "CAISSE_CRASH_DIR";
const MERCHANTS_ENV: &str = "CAISSE_CRASH_MERCHANTS";
const CYCLE_ENV: &str = "CAISSE_CRASH_CYCLE";
const CYCLES_ENV: &str = "CAISSE_CRASH_CYCLES";
const DEFAULT_CYCLES: u64 = 20;
const MERCHANTS: usize = 8;
const TASKS: usize = 32;
/// Small, so that recovery from a snapshot plus a journal tail happens in every cycle.
const SNAPSHOT_EVERY: u64 = 16;
/// How long a child may take to open and recover the store before the test gives up on it.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

fn config(dir: &Path) -> EngineConfig {
    let mut config = EngineConfig::new(dir);
    config.actors.snapshot_every = SNAPSHOT_EVERY;
    config
}

// ---------------------------------------------------------------------------------------------------------
// Records as the test sees them: a kind, a key and a state.
// ---------------------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Payment,
    Payout,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Payment => "payment",
            Kind::Payout => "payout",
        }
    }

    fn parse(text: &str) -> Option<Kind> {
        [Kind::Payment, Kind::Payout].into_iter().find(|k| k.as_str() == text)
    }

    /// The state a record of this kind is created in.
    fn first_state(self) -> &'static str {
        match self {
            Kind::Payment => "initie",
            Kind::Payout => "en_attente",
        }
    }
}

/// A record's state in one word: the payout's status, or the payment's status followed by its latest
/// refund's and the number of its refunds (`rembourse_partiellement/en_cours#2`), because refunds live inside
/// their payment and move with it.
fn describe(record: &Record) -> (Kind, String, String) {
    match record {
        Record::Payment(p) => {
            let state = match &p.refund {
                Some(r) => format!("{}/{}#{}", p.status.as_str(), r.status.as_str(), p.refunds.len()),
                None => p.status.as_str().to_owned(),
            };
            (Kind::Payment, p.reference.as_str().to_owned(), state)
        }
        Record::Payout(o) => (Kind::Payout, o.id.clone(), o.status.as_str().to_owned()),
        Record::Link(l) => panic!("the crash test makes no payment links, yet found {}", l.id),
    }
}

/// The states one command of the child can move a record to. This is the child's repertoire (see
/// [`next_command`]), written out independently of the engine's transition table so that the check does not
/// trust the code it checks.
fn next_states(kind: Kind, state: &str) -> Vec<String> {
    let owned = |states: &[&str]| states.iter().map(|s| (*s).to_owned()).collect();
    match (kind, state) {
        (Kind::Payment, "initie") => owned(&["en_cours", "succes", "echec", "expire"]),
        (Kind::Payment, "en_cours") => owned(&["succes", "echec", "expire"]),
        (Kind::Payment, "expire") => owned(&["succes"]),
        (Kind::Payment, "succes") => owned(&["succes/en_cours#1"]),
        (Kind::Payout, "en_attente") => owned(&["traite", "rejete"]),
        (Kind::Payment, refunded) => {
            let Some((payment, rest)) = refunded.split_once('/') else { return Vec::new() };
            let Some((Ok(count), refund)) = rest.split_once('#').map(|(r, n)| (n.parse::<usize>(), r)) else {
                return Vec::new();
            };
            let paid = matches!(payment, "succes" | "rembourse_partiellement");
            match refund {
                // The refund under way completes (in part or in full) or is refused.
                "en_cours" if paid => vec![
                    format!("rembourse_partiellement/succes#{count}"),
                    format!("rembourse/succes#{count}"),
                    format!("{payment}/echec#{count}"),
                ],
                // Over: the next refund may start.
                "succes" | "echec" if paid && count < CHILD_MAX_REFUNDS => {
                    vec![format!("{payment}/en_cours#{}", count + 1)]
                }
                _ => Vec::new(),
            }
        }
        _ => Vec::new(),
    }
}

/// The child asks for no more refunds of one payment than this.
const CHILD_MAX_REFUNDS: usize = 6;

/// A paid payment with no refund under way: moved on only now and then (a new refund, a repeated
/// confirmation), as such payments are most of a merchant's.
fn at_rest(state: &str) -> bool {
    state == "succes" || (state.contains("/succes#") || state.contains("/echec#")) && !state.starts_with("rembourse/")
}

/// The record's state the parent expects: the last acknowledged one, or what the previous check recovered.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Known {
    kind: Kind,
    state: String,
}

/// `(merchant, payment reference or payout id)`.
type Key = (String, String);

/// One acknowledged change, as the child reported it.
#[derive(Debug, Clone)]
struct Ack {
    merchant: String,
    kind: Kind,
    key: String,
    state: String,
    line: String,
}

fn ack_line(merchant: &MerchantId, record: &Record, command: &str) -> String {
    let (kind, key, state) = describe(record);
    format!("ACK {merchant} {} {key} {state} {command}", kind.as_str())
}

fn parse_ack(line: &str) -> Option<Result<Ack, String>> {
    let rest = line.strip_prefix("ACK ")?;
    let parts: Vec<&str> = rest.split(' ').collect();
    Some(match parts.as_slice() {
        [merchant, kind, key, state, _command] => match Kind::parse(kind) {
            Some(kind) => Ok(Ack {
                merchant: (*merchant).to_owned(),
                kind,
                key: (*key).to_owned(),
                state: (*state).to_owned(),
                line: line.to_owned(),
            }),
            None => Err(format!("unknown record kind in {line:?}")),
        },
        _ => Err(format!("malformed acknowledgement {line:?}")),
    })
}

// ---------------------------------------------------------------------------------------------------------
// The child: applies changes forever and reports each acknowledged one.
// ---------------------------------------------------------------------------------------------------------

/// Writes one line and flushes it, so that it reaches the pipe before the next change is even asked for.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        // The parent is gone; nobody is listening any more.
        std::process::exit(3);
    }
}

/// Reports an unexpected engine answer; the parent fails the test on a `FAIL` line.
fn fail(message: String) -> ! {
    say(&format!("FAIL {message}"));
    std::process::exit(2);
}

/// What the child does next with a record, or `None` to leave it as it is (for a later cycle, or for good).
fn next_command(record: &Record, rng: &mut StdRng) -> Option<(Command, &'static str)> {
    let roll = rng.gen_range(0..100);
    match record {
        Record::Payment(p) => {
            let notice = |notice| Command::PaymentNotice { reference: p.reference.clone(), notice };
            let declined = || PaymentNotice::Declined { failure_code: "insufficient_funds".into() };
            let latest = p.refund.as_ref();
            let refund = |outcome| Command::RefundNotice {
                reference: p.reference.clone(),
                refund: latest.map(|r| r.reference.clone()).unwrap_or_default(),
                outcome,
            };
            let paid = matches!(p.status, PaymentStatus::Succeeded | PaymentStatus::PartlyRefunded);
            let at_rest = paid && latest.is_none_or(|r| r.status != RefundStatus::Processing);
            match (p.status, latest.map(|r| r.status)) {
                (PaymentStatus::Initiated, None) => match roll {
                    0..10 => None,
                    10..20 => Some((notice(PaymentNotice::Processing), "processing")),
                    20..27 => Some((notice(declined()), "decline")),
                    27..32 => Some((notice(PaymentNotice::Expired), "expire")),
                    _ => Some((notice(PaymentNotice::Confirmed), "confirm")),
                },
                (PaymentStatus::Processing, None) => match roll {
                    0..70 => Some((notice(PaymentNotice::Confirmed), "confirm")),
                    70..85 => Some((notice(declined()), "decline")),
                    _ => Some((notice(PaymentNotice::Expired), "expire")),
                },
                // The customer paid after all: a late success must credit the merchant, once.
                (PaymentStatus::Expired, None) => {
                    (roll < 60).then(|| (notice(PaymentNotice::Confirmed), "late-confirm"))
                }
                // Without an amount, the rest is refunded; with one, part of what is left.
                _ if at_rest && p.refunds.len() < CHILD_MAX_REFUNDS => match roll {
                    0..35 => {
                        let amount = match rng.gen_bool(0.3) {
                            true => None,
                            false => Some(Amount::positive(rng.gen_range(1..=p.refundable().minor())).unwrap()),
                        };
                        let command = Command::RequestRefund { reference: p.reference.clone(), amount, reason: None };
                        Some((command, "refund"))
                    }
                    // A provider repeating itself: acknowledged, and must not credit a second time.
                    35..45 => Some((notice(PaymentNotice::Confirmed), "duplicate-confirm")),
                    _ => None,
                },
                (_, Some(RefundStatus::Processing)) => match roll {
                    0..75 => Some((refund(RefundOutcome::Completed), "refund-complete")),
                    _ => Some((refund(RefundOutcome::Refused), "refund-refuse")),
                },
                _ => None,
            }
        }
        Record::Payout(o) if o.status == PayoutStatus::Pending => {
            let outcome = match roll {
                0..80 => PayoutOutcome::Sent,
                _ => PayoutOutcome::Refused { reason: "beneficiary_unknown".into() },
            };
            Some((Command::PayoutNotice { id: o.id.clone(), outcome }, "payout-notice"))
        }
        Record::Payout(_) | Record::Link(_) => None,
    }
}

/// Executes one command; prints its acknowledgement on success. `None` when the balance is too low, which is
/// an ordinary refusal; any other error stops the child and fails the test.
async fn run(engine: &Engine, m: &MerchantId, command: Command, label: &str) -> Option<Record> {
    match engine.execute(m, command, None).await {
        Ok(Executed::Done(record)) => {
            say(&ack_line(m, &record, label));
            Some(record)
        }
        Ok(other) => fail(format!("{label} for {m}: unexpected answer {other:?}")),
        Err(EngineError::Rejected(Rejection::InsufficientBalance { .. })) => None,
        Err(err) => fail(format!("{label} for {m}: {err}")),
    }
}

/// Moves one record on, one command at a time, until the child decides to leave it.
async fn drive(engine: &Engine, m: &MerchantId, mut record: Record, rng: &mut StdRng) {
    while let Some((command, label)) = next_command(&record, rng) {
        match run(engine, m, command, label).await {
            Some(next) => record = next,
            None => return,
        }
    }
}

async fn child_task(engine: Engine, m: MerchantId, cycle: u64, task: usize, leftovers: Vec<Record>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for record in leftovers {
        drive(&engine, &m, record, &mut rng).await;
    }
    for n in 0u64.. {
        let created = if rng.gen_bool(0.75) {
            let reference = format!("c{cycle}-t{task}-n{n}");
            let command = Command::InitiatePayment(new_payment(rng.gen_range(1_000..50_000), Some(&reference)));
            run(&engine, &m, command, "initiate").await
        } else {
            run(&engine, &m, Command::CreatePayout(new_payout(rng.gen_range(500..20_000))), "payout").await
        };
        if let Some(record) = created {
            drive(&engine, &m, record, &mut rng).await;
        }
    }
}

/// Records an earlier cycle left half way, read from the store as recovered; a few succeeded payments are
/// taken too, for a refund or a repeated provider confirmation after the restart.
fn leftovers(engine: &Engine, store: &dyn Store, m: &MerchantId, rng: &mut StdRng) -> Result<Vec<Record>, String> {
    let journal = engine.journal(m, 1, usize::MAX).map_err(|e| e.to_string())?;
    let mut found = Vec::new();
    for event in journal {
        let record = match event.trigger {
            Trigger::PaymentAccepted => store.payment(m, &event.reference).map(|p| p.map(Record::Payment)),
            Trigger::PayoutRequested => store.payout(m, &event.reference).map(|o| o.map(Record::Payout)),
            _ => continue,
        };
        let record = record.map_err(|e| e.to_string())?.ok_or_else(|| format!("{} has no record", event.reference))?;
        let (kind, _, state) = describe(&record);
        let unfinished = !next_states(kind, &state).is_empty();
        if unfinished && (!at_rest(&state) || rng.gen_bool(0.05)) {
            found.push(record);
        }
    }
    Ok(found)
}

fn child_main() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| fail(format!("{name} is not set")));
    let dir = PathBuf::from(var(DIR_ENV));
    let merchants: Vec<MerchantId> = var(MERCHANTS_ENV).split(',').map(|m| MerchantId::parse(m).unwrap()).collect();
    let cycle: u64 = var(CYCLE_ENV).parse().unwrap();
    actix::System::new().block_on(async move {
        let (engine, store) =
            support::try_engine_and_store(config(&dir)).unwrap_or_else(|e| fail(format!("open: {e}")));
        let mut rng = StdRng::from_entropy();
        // Each leftover goes to exactly one task, so a record never has two commands in flight.
        let per_merchant = TASKS / merchants.len();
        let mut work: Vec<Vec<Record>> = vec![Vec::new(); TASKS];
        for (i, m) in merchants.iter().enumerate() {
            let found =
                leftovers(&engine, &*store, m, &mut rng).unwrap_or_else(|e| fail(format!("leftovers of {m}: {e}")));
            for (j, record) in found.into_iter().enumerate() {
                work[i + merchants.len() * (j % per_merchant)].push(record);
            }
        }
        say("READY");
        for (task, own) in work.into_iter().enumerate() {
            let m = merchants[task % merchants.len()].clone();
            actix::spawn(child_task(engine.clone(), m, cycle, task, own, rng.gen()));
        }
        std::future::pending::<()>().await;
    });
}

// ---------------------------------------------------------------------------------------------------------
// The parent: starts, kills and checks.
// ---------------------------------------------------------------------------------------------------------

/// Kills the child when dropped, so that a failing assertion never leaves it running.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Run {
    lines: Vec<String>,
    stderr: String,
    ready: bool,
    early: bool,
    status: ExitStatus,
}

fn run_child(dir: &Path, merchants: &[MerchantId], cycle: u64, rng: &mut StdRng) -> Run {
    let ids: Vec<&str> = merchants.iter().map(|m| m.as_str()).collect();
    let child = Process::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env(DIR_ENV, dir)
        .env(MERCHANTS_ENV, ids.join(","))
        .env(CYCLE_ENV, cycle.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the child");
    let mut child = ChildGuard(child);
    let stdout = child.0.stdout.take().unwrap();
    let mut stderr = child.0.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let out_reader = std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                // A line without its newline was cut by the kill: the child never finished saying it.
                Ok(_) if !line.ends_with('\n') => break,
                Ok(_) => {
                    // The harness writes `test <name> ... ` without a newline before running the test, so the
                    // child's first line arrives behind it.
                    let line = line.trim_end();
                    let line = match line.split_once(" ... ") {
                        Some((prefix, rest)) if prefix.starts_with("test ") => rest,
                        _ => line,
                    };
                    if tx.send(line.to_owned()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });

    let mut lines = Vec::new();
    let early = rng.gen_ratio(1, 8);
    let mut ready = false;
    if early {
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..40)));
    } else {
        let deadline = Instant::now() + READY_TIMEOUT;
        while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            ready = line == "READY";
            lines.push(line);
            if ready {
                break;
            }
        }
        if ready {
            std::thread::sleep(Duration::from_millis(rng.gen_range(50..400)));
        }
    }
    // `Child::kill` is SIGKILL on unix: no destructor, no flush, no chance to finish a write.
    let _ = child.0.kill();
    let status = child.0.wait().expect("wait for the child");
    out_reader.join().expect("stdout reader");
    lines.extend(rx.iter());
    let stderr = err_reader.join().expect("stderr reader");
    Run { lines, stderr, ready, early, status }
}

/// What one check found: every record's state, for the next cycle's expectations.
#[derive(Debug)]
struct Audit {
    states: HashMap<Key, Known>,
    events: u64,
}

/// Which webhook event a journal event causes, as docs/api.md lists them.
fn webhook_of(trigger: Trigger) -> Option<EventKind> {
    match trigger {
        Trigger::PaymentAccepted => Some(EventKind::PaymentInitiated),
        Trigger::ProviderProcessing => Some(EventKind::PaymentProcessing),
        Trigger::ProviderConfirmed => Some(EventKind::PaymentSucceeded),
        Trigger::ProviderDeclined | Trigger::TtlExpired => Some(EventKind::PaymentFailed),
        Trigger::RefundCompleted | Trigger::RefundedInPart | Trigger::RefundedInFull => {
            Some(EventKind::PaymentRefunded)
        }
        Trigger::PayoutSent => Some(EventKind::PayoutProcessed),
        Trigger::PayoutRefused => Some(EventKind::PayoutRejected),
        Trigger::RefundRequested | Trigger::RefundRefused | Trigger::PayoutRequested => None,
        Trigger::LinkCreated | Trigger::LinkPaid | Trigger::LinkDeactivated => None,
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Sums {
    available: i64,
    pending: i64,
}

/// Checks one merchant's journal, records, indexes and balances against each other; adds its records'
/// states to `states` and the notifications its journal implies to `webhooks`.
async fn audit_merchant(
    engine: &Engine,
    store: &dyn Store,
    m: &MerchantId,
    states: &mut HashMap<Key, Known>,
    webhooks: &mut HashMap<(String, String, EventKind), i64>,
    errors: &mut Vec<String>,
) -> u64 {
    let journal = match engine.journal(m, 1, usize::MAX) {
        Ok(journal) => journal,
        Err(e) => {
            errors.push(format!("{m}: journal unreadable: {e}"));
            return 0;
        }
    };

    // The journal alone: contiguous, balanced, never negative, nothing applied twice.
    let mut ledger: BTreeMap<Currency, Sums> = BTreeMap::new();
    let mut seen: HashMap<(String, Trigger), u32> = HashMap::new();
    let mut credits: HashMap<String, u32> = HashMap::new();
    let mut last_status: HashMap<String, String> = HashMap::new();
    let (mut payments, mut refunds, mut payouts) = (Vec::new(), Vec::new(), Vec::new());
    let mut refund_completions = Vec::new();
    for (i, event) in journal.iter().enumerate() {
        if event.seq != i as u64 + 1 {
            errors.push(format!("{m}: journal position {} holds seq {}", i + 1, event.seq));
        }
        let mut sum: BTreeMap<Currency, i64> = BTreeMap::new();
        for entry in &event.entries {
            *sum.entry(entry.currency).or_default() += entry.amount_minor;
            let sums = ledger.entry(entry.currency).or_default();
            match entry.account {
                Account::Available => sums.available += entry.amount_minor,
                Account::Pending => sums.pending += entry.amount_minor,
                Account::CustomerFunds => *credits.entry(event.reference.clone()).or_default() += 1,
                _ => {}
            }
        }
        if sum.values().any(|s| *s != 0) {
            errors.push(format!("{m}: event {} does not balance: {sum:?}", event.seq));
        }
        for (currency, sums) in &ledger {
            if sums.available < 0 || sums.pending < 0 {
                errors.push(format!("{m} {currency}: balance below zero after event {}: {sums:?}", event.seq));
            }
        }
        *seen.entry((event.reference.clone(), event.trigger)).or_default() += 1;
        last_status.insert(event.reference.clone(), event.status.clone());
        match event.trigger {
            Trigger::PaymentAccepted => payments.push(event.reference.clone()),
            Trigger::RefundRequested => refunds.push(event.reference.clone()),
            Trigger::PayoutRequested => payouts.push(event.reference.clone()),
            Trigger::RefundCompleted => refund_completions.push(event.reference.clone()),
            _ => {}
        }
        if let Some(kind) = webhook_of(event.trigger).filter(|_| event.trigger != Trigger::RefundCompleted) {
            *webhooks.entry((m.to_string(), event.reference.clone(), kind)).or_default() += 1;
        }
    }
    for ((reference, trigger), count) in &seen {
        if *count > 1 {
            errors.push(format!("{m}: {trigger:?} applied {count} times to {reference} (twice or more)"));
        }
    }

    // The records: each consistent with its journal, and together implying the balances.
    let mut implied: BTreeMap<Currency, Sums> = BTreeMap::new();
    let mut refund_owner: HashMap<String, String> = HashMap::new();
    for reference in &payments {
        let p = match store.payment(m, reference) {
            Ok(Some(p)) => p,
            other => {
                errors.push(format!("{m}: journal has payment {reference} but the store gives {other:?}"));
                continue;
            }
        };
        let sums = implied.entry(p.currency).or_default();
        let credited =
            matches!(p.status, PaymentStatus::Succeeded | PaymentStatus::PartlyRefunded | PaymentStatus::Refunded);
        let count = credits.get(reference).copied().unwrap_or(0);
        if count != u32::from(credited) {
            errors.push(format!("{m}: payment {reference} is {} but was credited {count} times", p.status.as_str()));
        }
        if credited {
            sums.available += p.net_amount.minor();
        }
        // Completing a refund moves the payment on under the refund's reference.
        let journal_status = match p.status {
            PaymentStatus::PartlyRefunded | PaymentStatus::Refunded => "succes",
            other => other.as_str(),
        };
        if last_status.get(reference).map(String::as_str) != Some(journal_status) {
            errors.push(format!(
                "{m}: payment {reference} is {} but its journal ends at {:?}",
                p.status.as_str(),
                last_status.get(reference)
            ));
        }
        let refunded: i64 =
            p.refunds.iter().filter(|r| r.status == RefundStatus::Succeeded).map(|r| r.amount.minor()).sum();
        if refunded != p.refunded_amount.minor() || p.refund.as_ref() != p.refunds.last() {
            errors
                .push(format!("{m}: payment {reference}'s refunded total or latest refund disagrees with its refunds"));
        }
        for r in &p.refunds {
            refund_owner.insert(r.reference.clone(), reference.clone());
            match r.status {
                RefundStatus::Processing => {
                    sums.available -= r.amount.minor();
                    sums.pending += r.amount.minor();
                }
                RefundStatus::Succeeded => sums.available -= r.amount.minor(),
                RefundStatus::Failed => {}
            }
            if last_status.get(&r.reference).map(String::as_str) != Some(r.status.as_str()) {
                errors.push(format!(
                    "{m}: refund {} is {} but its journal ends at {:?}",
                    r.reference,
                    r.status.as_str(),
                    last_status.get(&r.reference)
                ));
            }
        }
        let (kind, key, state) = describe(&Record::Payment(p));
        states.insert((m.to_string(), key), Known { kind, state });
    }
    for reference in &refunds {
        match store.locate(m, reference) {
            Ok(Some(located))
                if matches!(&located.record, Record::Payment(p)
                    if p.refund_named(reference).is_some()) => {}
            other => errors.push(format!("{m}: journal has refund {reference} but the store gives {other:?}")),
        }
        if !refund_owner.contains_key(reference) {
            errors.push(format!("{m}: refund {reference} belongs to no payment of the journal"));
        }
    }
    for reference in &refund_completions {
        match refund_owner.get(reference) {
            Some(owner) => {
                *webhooks.entry((m.to_string(), owner.clone(), EventKind::PaymentRefunded)).or_default() += 1;
            }
            None => errors.push(format!("{m}: completed refund {reference} belongs to no payment")),
        }
    }
    for id in &payouts {
        let o = match store.payout(m, id) {
            Ok(Some(o)) => o,
            other => {
                errors.push(format!("{m}: journal has payout {id} but the store gives {other:?}"));
                continue;
            }
        };
        let sums = implied.entry(o.currency).or_default();
        match o.status {
            PayoutStatus::Pending => {
                sums.available -= o.amount.minor();
                sums.pending += o.amount.minor();
            }
            PayoutStatus::Sent => sums.available -= o.amount.minor(),
            PayoutStatus::Rejected => {}
        }
        if last_status.get(id).map(String::as_str) != Some(o.status.as_str()) {
            errors.push(format!(
                "{m}: payout {id} is {} but its journal ends at {:?}",
                o.status.as_str(),
                last_status.get(id)
            ));
        }
        let (kind, key, state) = describe(&Record::Payout(o));
        states.insert((m.to_string(), key), Known { kind, state });
    }

    // The transaction index: exactly the journal's payments, refunds and payouts, each once.
    let mut listed: Vec<(TransactionType, String)> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        match store.transactions(m, cursor.as_deref(), usize::MAX, &mut |_| true) {
            Ok(page) => {
                listed.extend(page.data.into_iter().map(|t| (t.kind, t.reference)));
                match page.next_cursor {
                    Some(next) if page.has_more => cursor = Some(next),
                    _ => break,
                }
            }
            Err(e) => {
                errors.push(format!("{m}: transactions unreadable: {e}"));
                break;
            }
        }
    }
    let mut expected: Vec<(TransactionType, String)> = Vec::new();
    expected.extend(payments.iter().map(|r| (TransactionType::Payment, r.clone())));
    expected.extend(refunds.iter().map(|r| (TransactionType::Refund, r.clone())));
    expected.extend(payouts.iter().map(|r| (TransactionType::Payout, r.clone())));
    let key = |t: &(TransactionType, String)| (t.0.as_str(), t.1.clone());
    listed.sort_by_key(key);
    expected.sort_by_key(key);
    if listed != expected {
        let (l, e): (HashSet<_>, HashSet<_>) = (listed.iter().collect(), expected.iter().collect());
        errors.push(format!(
            "{m}: the transaction list ({}) differs from the journal ({}): only listed {:?}, only journaled {:?}",
            listed.len(),
            expected.len(),
            l.difference(&e).take(5).collect::<Vec<_>>(),
            e.difference(&l).take(5).collect::<Vec<_>>()
        ));
    }

    // Three views of the balances: replayed journal, records, and the recovered actor.
    let actor = match engine.balances(m).await {
        Ok(balances) => balances,
        Err(e) => {
            errors.push(format!("{m}: balances unavailable after recovery: {e}"));
            return journal.len() as u64;
        }
    };
    let currencies: HashSet<Currency> = ledger.keys().chain(implied.keys()).chain(actor.0.keys()).copied().collect();
    for currency in currencies {
        let from_journal = ledger.get(&currency).copied().unwrap_or_default();
        let from_records = implied.get(&currency).copied().unwrap_or_default();
        let b = actor.get(currency);
        let from_actor = Sums { available: b.available, pending: b.pending };
        if from_journal != from_records || from_journal != from_actor {
            errors.push(format!(
                "{m} {currency}: balances disagree: journal {from_journal:?}, records {from_records:?}, \
                 recovered actor {from_actor:?}"
            ));
        }
    }
    journal.len() as u64
}

/// Checks the reopened store against what was known before this cycle and what the child acknowledged in it.
async fn check(
    engine: &Engine,
    store: &dyn Store,
    merchants: &[MerchantId],
    before: &HashMap<Key, Known>,
    acks: &[Ack],
) -> Result<Audit, Vec<String>> {
    let mut errors = Vec::new();

    // What must be there: the previous cycle's records, moved on by this cycle's acknowledgements. Each
    // acknowledged move must itself be one the child can make: anything else is a wrong answer of the engine.
    let mut expected = before.clone();
    for ack in acks {
        let key = (ack.merchant.clone(), ack.key.clone());
        let allowed = match expected.get(&key) {
            None => ack.state == ack.kind.first_state(),
            Some(prev) => {
                prev.kind == ack.kind
                    && (prev.state == ack.state || next_states(prev.kind, &prev.state).contains(&ack.state))
            }
        };
        if !allowed {
            errors.push(format!("acknowledged an impossible move from {:?}: {}", expected.get(&key), ack.line));
        }
        expected.insert(key, Known { kind: ack.kind, state: ack.state.clone() });
    }

    // What is there, checked for internal consistency merchant by merchant.
    let mut states = HashMap::new();
    let mut webhooks = HashMap::new();
    let mut events = 0;
    for m in merchants {
        events += audit_merchant(engine, store, m, &mut states, &mut webhooks, &mut errors).await;
    }
    match engine.due_notifications(Timestamp::now(), usize::MAX) {
        Ok(due) => {
            for n in due {
                *webhooks.entry((n.merchant.to_string(), n.reference.clone(), n.event)).or_default() -= 1;
            }
            let mut wrong: Vec<_> = webhooks.iter().filter(|(_, n)| **n != 0).collect();
            wrong.sort_by_key(|(k, _)| (k.0.clone(), k.1.clone()));
            for ((m, reference, event), n) in wrong.into_iter().take(10) {
                let what = if *n > 0 { "missing from" } else { "extra in" };
                errors.push(format!("{m}: {} {event:?} notification(s) for {reference} {what} the outbox", n.abs()));
            }
        }
        Err(e) => errors.push(format!("outbox unreadable: {e}")),
    }

    // The core of the test: nothing acknowledged is missing or went back.
    let mut expected_keys: Vec<&Key> = expected.keys().collect();
    expected_keys.sort();
    for key in expected_keys {
        let want = &expected[key];
        match states.get(key) {
            None => errors.push(format!(
                "{} {} {} acknowledged as {} is missing after kill -9",
                key.0,
                want.kind.as_str(),
                key.1,
                want.state
            )),
            Some(got) => {
                let reachable = got.kind == want.kind
                    && (got.state == want.state || next_states(want.kind, &want.state).contains(&got.state));
                if !reachable {
                    errors.push(format!(
                        "{} {} {} acknowledged as {} regressed to {} after kill -9",
                        key.0,
                        want.kind.as_str(),
                        key.1,
                        want.state,
                        got.state
                    ));
                }
            }
        }
    }
    // A record nobody heard about was created by the command in flight at the kill, and nothing more.
    for (key, got) in &states {
        if !expected.contains_key(key) && got.state != got.kind.first_state() {
            errors.push(format!(
                "{} {} {} was never acknowledged but is {}",
                key.0,
                got.kind.as_str(),
                key.1,
                got.state
            ));
        }
    }

    if errors.is_empty() {
        Ok(Audit { states, events })
    } else {
        Err(errors)
    }
}

/// Reopens the store (running the startup audit), checks it, and closes it again.
fn reopen_and_check(
    dir: &Path,
    merchants: &[MerchantId],
    before: &HashMap<Key, Known>,
    acks: &[Ack],
) -> Result<Audit, Vec<String>> {
    actix::System::new().block_on(async {
        let (engine, store) = support::try_engine_and_store(config(dir))
            .map_err(|e| vec![format!("reopening after kill -9 failed: {e}")])?;
        let audit = check(&engine, &*store, merchants, before, acks).await;
        // Dropping the engine joins its threads and closes the store; the next child cannot open the store otherwise.
        drop(engine);
        audit
    })
}

fn report(cycle: u64, dir: tempfile::TempDir, what: &str, errors: &[String], run: &Run) -> ! {
    let kept = dir.keep();
    let shown: Vec<&str> = errors.iter().take(40).map(String::as_str).collect();
    let tail: Vec<&String> = run.lines.iter().rev().take(10).collect();
    panic!(
        "cycle {cycle}: {what} ({} problems, first ones below)\n{}\n\nchild: ready {}, early kill {}, status {:?}, \
         {} lines, last ones (newest first): {tail:#?}\nchild stderr:\n{}\n\ndata kept in {}",
        errors.len(),
        shown.join("\n"),
        run.ready,
        run.early,
        run.status,
        run.lines.len(),
        run.stderr,
        kept.display()
    );
}

#[test]
fn acknowledged_changes_survive_kill_9() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child_main();
        return;
    }
    let cycles = std::env::var(CYCLES_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_CYCLES);
    let dir = tempfile::tempdir().unwrap();
    let merchants: Vec<MerchantId> = (0..MERCHANTS).map(|_| MerchantId::new()).collect();
    let mut rng = StdRng::from_entropy();
    let mut known: HashMap<Key, Known> = HashMap::new();
    let started = Instant::now();
    let (mut total_acks, mut early_kills, mut events) = (0usize, 0u64, 0u64);

    for cycle in 0..cycles {
        let run = run_child(dir.path(), &merchants, cycle, &mut rng);
        let failures: Vec<String> = run.lines.iter().filter(|l| l.starts_with("FAIL")).cloned().collect();
        if !failures.is_empty() {
            report(cycle, dir, "the child hit an unexpected engine error", &failures, &run);
        }
        if !run.early && !run.ready {
            report(cycle, dir, "the child never became ready", &[], &run);
        }
        // A child that stopped by itself did not wait for the kill: it crashed or refused to start.
        if run.status.signal() != Some(9) {
            report(cycle, dir, "the child ended before it was killed", &[], &run);
        }
        let (acks, malformed): (Vec<_>, Vec<_>) =
            run.lines.iter().filter_map(|l| parse_ack(l)).partition(Result::is_ok);
        if !malformed.is_empty() {
            let malformed: Vec<String> = malformed.into_iter().filter_map(Result::err).collect();
            report(cycle, dir, "the child wrote malformed lines", &malformed, &run);
        }
        let acks: Vec<Ack> = acks.into_iter().filter_map(Result::ok).collect();
        total_acks += acks.len();
        early_kills += u64::from(run.early);
        match reopen_and_check(dir.path(), &merchants, &known, &acks) {
            Ok(audit) => {
                known = audit.states;
                events = audit.events;
            }
            Err(errors) => {
                report(cycle, dir, "the store after kill -9 disagrees with what was acknowledged", &errors, &run)
            }
        }
        // Long runs say where they are; the harness shows this only with `--nocapture`.
        if (cycle + 1) % 10 == 0 {
            eprintln!(
                "crash test: {} cycles, {total_acks} acknowledged, {events} events, {:.1?}",
                cycle + 1,
                started.elapsed()
            );
        }
    }
    eprintln!(
        "{cycles} kill -9 cycles ({early_kills} during startup) in {:.1?}: {total_acks} acknowledged changes, \
         {} records and {events} journal events checked",
        started.elapsed(),
        known.len()
    );
    assert!(total_acks > 0, "the children never acknowledged anything: the test proved nothing");
}

/// Executes a command in the self-test, recording its acknowledgement as the child would print it.
async fn execute(engine: &Engine, m: &MerchantId, command: Command, lines: &mut Vec<String>) -> Record {
    match engine.execute(m, command, None).await {
        Ok(Executed::Done(record)) => {
            lines.push(ack_line(m, &record, "self-test"));
            record
        }
        other => panic!("{other:?}"),
    }
}

/// The checks above must be able to fail; this feeds them a lost, a regressed and a doubled change.
#[test]
fn the_checker_catches_lost_doubled_and_regressed_changes() {
    let dir = tempfile::tempdir().unwrap();
    let m = MerchantId::new();
    let merchants = vec![m.clone()];
    actix::System::new().block_on(async {
        let (engine, store) = support::engine_and_store(config(dir.path()));
        let mut lines = Vec::new();
        execute(&engine, &m, Command::InitiatePayment(new_payment(10_000, Some("pending"))), &mut lines).await;
        execute(&engine, &m, Command::InitiatePayment(new_payment(20_000, Some("paid"))), &mut lines).await;
        let confirm =
            Command::PaymentNotice { reference: Reference::parse("paid").unwrap(), notice: PaymentNotice::Confirmed };
        let paid = execute(&engine, &m, confirm, &mut lines).await;
        execute(&engine, &m, Command::CreatePayout(new_payout(5_000)), &mut lines).await;
        let acks = |lines: &[String]| -> Vec<Ack> { lines.iter().map(|l| parse_ack(l).unwrap().unwrap()).collect() };
        let honest = acks(&lines);
        check(&engine, &*store, &merchants, &HashMap::new(), &honest).await.expect("an honest history passes");

        // An acknowledgement for a change that was never made: lost.
        let mut ghost = lines.clone();
        ghost.push(format!("ACK {m} payment never-made initie initiate"));
        let errors = check(&engine, &*store, &merchants, &HashMap::new(), &acks(&ghost)).await.unwrap_err();
        assert!(errors.iter().any(|e| e.contains("never-made") && e.contains("missing")), "{errors:#?}");

        // An acknowledged success that reads back as pending: regressed.
        let mut regressed = lines.clone();
        regressed.push(format!("ACK {m} payment pending succes confirm"));
        let errors = check(&engine, &*store, &merchants, &HashMap::new(), &acks(&regressed)).await.unwrap_err();
        assert!(errors.iter().any(|e| e.contains("pending") && e.contains("regressed")), "{errors:#?}");

        // A second credit of the same payment, forged straight into the store: doubled.
        let journal = engine.journal(&m, 1, usize::MAX).unwrap();
        let mut forged =
            journal.iter().find(|e| e.reference == "paid" && e.trigger == Trigger::ProviderConfirmed).unwrap().clone();
        forged.seq = journal.len() as u64 + 1;
        let change = Change {
            merchant: m.clone(),
            journal: forged,
            record: paid,
            linked: None,
            created: None,
            outbox: Vec::new(),
            idempotency: None,
            snapshot: None,
            route: None,
            provider_reference: None,
            fence: None,
        };
        let ticket = store.commit(change, &Arc::new(AtomicBool::new(false))).unwrap();
        ticket.await.unwrap().unwrap();
        let errors = check(&engine, &*store, &merchants, &HashMap::new(), &honest).await.unwrap_err();
        assert!(errors.iter().any(|e| e.contains("paid") && e.contains("credited 2 times")), "{errors:#?}");
        assert!(errors.iter().any(|e| e.contains("twice")), "{errors:#?}");
        assert!(errors.iter().any(|e| e.contains("balances disagree")), "{errors:#?}");
    });
}
