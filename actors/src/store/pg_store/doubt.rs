//! What became of a group commit whose answer was lost: the connection closed, or went silent, after `COMMIT`
//! was sent. The transaction may have committed, may have rolled back, or may still be open at the server,
//! waiting for a `COMMIT` held up in the network that could land seconds later. Answered "failed" at once, its
//! merchant's actor would reload from the database and decide its next changes on a view lacking one that may
//! then land: a sequence number used twice.
//!
//! So the writer learns the outcome before it answers the batch's jobs ([`resolve`]). Inside the transaction
//! it reads the transaction's id and its server process, and it notes one key the transaction writes, its
//! witness ([`InDoubt`]). It then asks on a fresh connection, every [`LOOK_EVERY`]:
//!
//! - While the transaction's process still holds it (`pg_stat_activity.backend_xid`, which PostgreSQL clears
//!   only once the transaction has ended for every other session, a wait for a synchronous standby included),
//!   it is not over. A process idle in it is still waiting for its `COMMIT`: it is terminated, so that the
//!   `COMMIT` can no longer land. A busy one (committing, or waiting for a standby) is waited for: ending it
//!   there would keep the commit on the primary alone.
//! - Once it is over, the witness's row is read in a later statement: it committed only if that row is there
//!   with the transaction's id as its `xmin`. Reading the row rather than `txid_status`, which answers
//!   "committed" while the commit still waits for a standby, also keeps an id PostgreSQL hands out again after
//!   a crash (ids are not logged until used) from passing for this one, unless the transaction given it
//!   writes the same key. A batch that wrote no key (only deletions) has no witness and is answered as failed.
//! - Only a primary can tell: every connection of the store asks for a read-write server
//!   (`target_session_attrs`, for a URL naming several hosts), and should a standby answer all the same, the
//!   writer asks again.
//!
//! [`next`] decides each step from what was seen. A transaction the writer's signal ended after it committed
//! (its `COMMIT` arrived between the look and the signal) is answered as failed, since the signal may have cut
//! its wait for a standby; a retry with the same idempotency key finds it.
//!
//! A transaction still busy after [`RESOLVE_FOR`] (its `COMMIT` waiting for a standby that is away) has its
//! session ended all the same, and is answered as failed: a commit that the signal cuts short stays on the
//! primary alone, so it must not be acknowledged. The writer then waits for the session to end, for up to
//! [`AFTER_SIGNAL`] while the database answers, so that the commit is visible before the merchant's actor
//! reloads rather than after. When the database cannot be asked for all of [`RESOLVE_FOR`] and [`MARGIN`],
//! or a session it signalled outlives [`AFTER_SIGNAL`], the jobs fail with the outcome unknown. By then the
//! server has ended any transaction still idle, waiting for its `COMMIT` (the connections' idle time-out,
//! [`IDLE_IN_TRANSACTION`]), so what the actors reload is final, unless that `COMMIT` had arrived and was
//! still waiting for a standby, or a signalled session never ended.
//!
//! Each outcome is counted for the operator (`caisse_store_lost_commit_answers_total`).

use std::time::{Duration, Instant};

use super::conn::{db_error, Conn, IDLE_IN_TRANSACTION};
use super::tls::Endpoint;
use crate::metrics::{LostCommit, METRICS};
use crate::store::StoreError;

/// How long a writer tries to learn what became of a commit whose answer was lost: as long as the server may
/// keep the transaction open waiting for its `COMMIT`.
pub(super) const RESOLVE_FOR: Duration = IDLE_IN_TRANSACTION;

/// How long, after [`RESOLVE_FOR`], the writer keeps trying to end a transaction still busy.
const MARGIN: Duration = Duration::from_secs(5);

/// How long the writer waits, once it signalled a session, for the session to end while the database answers:
/// a session ends within milliseconds of its signal unless it is writing its commit with interrupts held.
const AFTER_SIGNAL: Duration = Duration::from_secs(60);

/// How often the writer looks again at a transaction whose outcome is not yet known.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// How long the writer waits before asking again when the database could not be asked: a connection to a
/// database that is away fails fast, and must not be retried in a tight loop.
const ASK_AGAIN: Duration = Duration::from_secs(1);

/// A transaction whose `COMMIT` was sent: its id (`txid_current()`, epoch included), the server process that
/// runs it (`pg_backend_pid()`), both read inside it, and a key it writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct InDoubt {
    pub(super) txid: i64,
    pub(super) pid: i32,
    /// The table and key of a row the transaction inserts or updates, if it writes any.
    pub(super) witness: Option<(String, Vec<u8>)>,
}

/// What the database says of a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// Not over: `idle` when its process is idle in it, still waiting for its `COMMIT`.
    Running { idle: bool },
    /// Over: whether its witness's row is there, written by it (`None`: it has no witness).
    Ended { witnessed: Option<bool> },
}

/// What the writer does next about a transaction in doubt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// It committed: its jobs are acknowledged.
    Acknowledge,
    /// It did not commit, or may have, or did but is answered as failed all the same: the jobs fail with this.
    Fail(&'static str),
    /// It waits for a `COMMIT` that has not arrived: its process is terminated, and the writer looks again.
    Terminate,
    /// It is still busy after [`RESOLVE_FOR`]: its process is terminated whatever it does, and the writer looks
    /// again.
    End,
    /// It is committing, waiting for a standby, or ending after a signal: the writer looks again.
    Wait,
}

/// The step after seeing `seen`, once the writer has (`signalled`) or has not yet terminated the transaction's
/// process, before or after (`overdue`) [`RESOLVE_FOR`].
fn next(seen: Seen, signalled: bool, overdue: bool) -> Step {
    match seen {
        Seen::Ended { witnessed: Some(true) } if signalled => Step::Fail(
            "PostgreSQL committed a group commit whose answer was lost, after this node signalled its session to \
             end (so perhaps before a synchronous standby had it): answered as failed, a retry finds it",
        ),
        Seen::Ended { witnessed: Some(true) } => Step::Acknowledge,
        Seen::Ended { witnessed: Some(false) } if signalled => Step::Fail(
            "the answer to a group commit was lost and this node ended the transaction before it committed (its \
             COMMIT held up on the way, or the commit still busy when the node stopped waiting): it wrote nothing",
        ),
        Seen::Ended { witnessed: Some(false) } => {
            Step::Fail("PostgreSQL rolled back a group commit whose answer was lost: it wrote nothing")
        }
        Seen::Ended { witnessed: None } => Step::Fail(
            "the answer to a group commit that only deleted keys was lost: PostgreSQL has ended it, committed or not",
        ),
        // A second signal is harmless, and covers a first that arrived while the process was busy.
        Seen::Running { idle: true } => Step::Terminate,
        Seen::Running { idle: false } if overdue => Step::End,
        Seen::Running { idle: false } => Step::Wait,
    }
}

/// Learns, on connections of its own, whether the transaction `doubt` committed, ending it first if it still
/// waits for its `COMMIT`: `Ok` when it committed (and may be acknowledged), an error saying why otherwise.
pub(super) async fn resolve(endpoint: &Endpoint, doubt: &InDoubt) -> Result<(), StoreError> {
    let started = Instant::now();
    let overdue_at = started + RESOLVE_FOR;
    let mut deadline = overdue_at + MARGIN;
    let mut conn: Option<Conn> = None;
    let mut signalled = false;
    // Whether the deadline was moved to wait for a signalled session.
    let mut waited_for = false;
    let (outcome, counted) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // One look, and the signal it calls for, within what is left: a database that goes silent holds a
        // query as long as TCP retransmits (minutes).
        let round = async {
            let seen = look(&mut conn, endpoint, doubt).await?;
            let step = next(seen, signalled, Instant::now() >= overdue_at);
            if let Step::Terminate | Step::End = step {
                // Counted as signalled unless the database answers that no session was: a signal whose answer
                // is lost may have cut a wait for a standby.
                let before = signalled;
                signalled = true;
                signalled = terminate(&mut conn, endpoint, doubt, step == Step::Terminate).await? || before;
            }
            Ok::<_, StoreError>(step)
        };
        match tokio::time::timeout(left, round).await {
            Ok(Ok(Step::Acknowledge)) => break (Ok(()), LostCommit::Acknowledged),
            Ok(Ok(Step::Fail(why))) => break (Err(StoreError::Io(why.into())), LostCommit::Failed),
            Ok(Ok(_)) => {
                if signalled && !waited_for {
                    // Once signalled, the session is waited for, once, while the database answers.
                    deadline = deadline.max(Instant::now() + AFTER_SIGNAL);
                    waited_for = true;
                }
                tokio::time::sleep(LOOK_EVERY.min(left)).await;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, txid = doubt.txid, "could not ask PostgreSQL about a group commit");
                conn = None;
                tokio::time::sleep(ASK_AGAIN.min(left)).await;
            }
            Err(_) => {
                let unknown = format!(
                    "the answer to a group commit was lost and, after {:?}, whether it committed is unknown",
                    started.elapsed()
                );
                break (Err(StoreError::Io(unknown)), LostCommit::Unknown);
            }
        }
    };
    METRICS.lost_commit(counted);
    outcome
}

/// The transaction's process, matched by its id too: a process id is reused once its session ends.
const SESSION: &str = "FROM pg_stat_activity WHERE pid = $2 AND backend_xid = ($1::bigint % 4294967296)::text::xid";

async fn look(conn: &mut Option<Conn>, endpoint: &Endpoint, doubt: &InDoubt) -> Result<Seen, StoreError> {
    let conn = Conn::ensure(conn, endpoint).await?;
    // A state hidden from this role (NULL) is read as busy: the row alone says the session holds the
    // transaction.
    let sql = format!("SELECT pg_is_in_recovery(), (SELECT coalesce(state, '') {SESSION})");
    let row = conn
        .client
        .query_one(&sql, &[&doubt.txid, &doubt.pid])
        .await
        .map_err(|e| db_error("ask what became of a group commit", e))?;
    let standby: bool = row.try_get(0).map_err(|e| db_error("read whether a server is a standby", e))?;
    if standby {
        return Err(StoreError::Io("a standby answered, which cannot say what became of a group commit".into()));
    }
    let state: Option<String> = row.try_get(1).map_err(|e| db_error("read a session's state", e))?;
    if let Some(state) = state {
        // `idle in transaction (aborted)` too: a failed transaction waits for its end just the same.
        return Ok(Seen::Running { idle: state.starts_with("idle in transaction") });
    }
    // Over: its witness is read in a statement of its own, whose snapshot is taken after the end was seen (in
    // the statement above, the snapshot could predate an end its later read of the session saw).
    let Some((table, key)) = &doubt.witness else { return Ok(Seen::Ended { witnessed: None }) };
    let sql =
        format!("SELECT EXISTS (SELECT 1 FROM {table} WHERE k = $2 AND xmin = ($1::bigint % 4294967296)::text::xid)");
    let row = conn
        .client
        .query_one(&sql, &[&doubt.txid, key])
        .await
        .map_err(|e| db_error("read a group commit's witness", e))?;
    let witnessed: bool = row.try_get(0).map_err(|e| db_error("read a group commit's witness", e))?;
    Ok(Seen::Ended { witnessed: Some(witnessed) })
}

/// Terminates the transaction's process (only if it is still idle in it, with `idle_only`: checked again in
/// the same statement, so that a `COMMIT` that arrived since the look is left to finish). Whether a process
/// was signalled.
async fn terminate(
    conn: &mut Option<Conn>,
    endpoint: &Endpoint,
    doubt: &InDoubt,
    idle_only: bool,
) -> Result<bool, StoreError> {
    let conn = Conn::ensure(conn, endpoint).await?;
    let only = if idle_only { "AND state LIKE 'idle in transaction%'" } else { "" };
    let sql = format!("SELECT pg_terminate_backend(pid) {SESSION} {only}");
    let rows = conn
        .client
        .query(&sql, &[&doubt.txid, &doubt.pid])
        .await
        .map_err(|e| db_error("end a session holding a group commit", e))?;
    Ok(rows.iter().any(|row| row.try_get::<_, bool>(0).unwrap_or(false)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_is_acknowledged_only_when_its_row_is_there_and_this_node_did_not_signal_its_session() {
        for overdue in [false, true] {
            assert_eq!(next(Seen::Ended { witnessed: Some(true) }, false, overdue), Step::Acknowledge);
            assert!(matches!(next(Seen::Ended { witnessed: Some(true) }, true, overdue), Step::Fail(_)));
        }
    }

    #[test]
    fn an_ended_transaction_without_its_row_or_without_a_witness_fails_whatever_was_done() {
        for (signalled, overdue) in [(false, false), (false, true), (true, false), (true, true)] {
            assert!(matches!(next(Seen::Ended { witnessed: Some(false) }, signalled, overdue), Step::Fail(_)));
            assert!(matches!(next(Seen::Ended { witnessed: None }, signalled, overdue), Step::Fail(_)));
        }
    }

    #[test]
    fn a_session_idle_in_its_transaction_is_ended_and_a_busy_one_is_waited_for_until_overdue() {
        for signalled in [false, true] {
            for overdue in [false, true] {
                assert_eq!(next(Seen::Running { idle: true }, signalled, overdue), Step::Terminate);
            }
            assert_eq!(next(Seen::Running { idle: false }, signalled, false), Step::Wait);
            assert_eq!(next(Seen::Running { idle: false }, signalled, true), Step::End);
        }
    }
}
