//! What became of a group commit whose answer was lost: the connection closed, or went silent, after `COMMIT`
//! was sent. The transaction may have committed, may have rolled back, or may still be open at the server,
//! waiting for a `COMMIT` held up in the network that could land seconds later. Answered "failed" at once, its
//! merchant's actor would reload from the database and decide its next changes on a view lacking one that may
//! then land: a sequence number used twice.
//!
//! So the writer learns the outcome before it answers the batch's jobs ([`resolve`]). It reads the
//! transaction's id and its server process inside the transaction ([`InDoubt`]) and asks on a fresh
//! connection: a transaction still idle, waiting for its `COMMIT`, is ended by terminating that process, so
//! it can no longer land, and its jobs fail; one that committed is acknowledged, as if the answer had
//! arrived; one that rolled back fails. [`next`] decides each step from what was seen.
//!
//! A transaction whose `COMMIT` the server is processing (or that waits for a synchronous standby) is not
//! terminated: ending it there would keep it committed on the primary alone. The writer waits for it to
//! finish, for at most [`RESOLVE_FOR`]. The same holds for one the writer itself signalled and that then
//! committed (its `COMMIT` arrived in the instant between the look and the signal): it is answered as failed,
//! since the signal may have cut its wait for the standby; a retry with the same idempotency key finds it.
//!
//! When the database cannot be reached for all of [`RESOLVE_FOR`], the jobs fail with the outcome unknown.
//! By then the server has ended any transaction still waiting for its `COMMIT` (the connections' idle
//! time-out, [`IDLE_IN_TRANSACTION`]), so what the actors reload is final, unless that transaction's `COMMIT`
//! was still waiting for a standby.

use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;

use super::conn::{db_error, Conn, IDLE_IN_TRANSACTION};
use super::tls::Endpoint;
use crate::store::StoreError;

/// How long a writer tries to learn what became of a commit whose answer was lost: as long as the server may
/// keep the transaction open waiting for its `COMMIT`.
pub(super) const RESOLVE_FOR: Duration = IDLE_IN_TRANSACTION;

/// How often the writer looks again at a transaction whose outcome is not yet known.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// How long the writer waits before asking again when the database could not be asked: a connection to a
/// database that is away fails fast, and must not be retried in a tight loop.
const ASK_AGAIN: Duration = Duration::from_secs(1);

/// A transaction whose `COMMIT` was sent: its id (`txid_current()`, epoch included) and the server process
/// that runs it (`pg_backend_pid()`), both read inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct InDoubt {
    pub(super) txid: i64,
    pub(super) pid: i32,
}

/// What the database says of a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// Not ended: `idle` when its process is idle in it, still waiting for its `COMMIT`.
    Running {
        idle: bool,
    },
    Committed,
    Aborted,
    /// Unknown to the database: too old for it to tell (`txid_status` answers NULL), or newer than any it has
    /// seen, which seconds after the transaction ran means that the database answering is not the one that
    /// ran it.
    Forgotten,
}

/// What the writer does next about a transaction in doubt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// It committed: its jobs are acknowledged.
    Acknowledge,
    /// It did not commit, or it did but is answered as failed all the same: the jobs fail with this.
    Fail(&'static str),
    /// It waits for a `COMMIT` that has not arrived: its process is terminated, and the writer looks again.
    Terminate,
    /// It is ending: the writer looks again.
    Wait,
}

/// The step after seeing `seen`, once the writer has (`signalled`) or has not yet terminated the transaction's
/// process.
fn next(seen: Seen, signalled: bool) -> Step {
    match seen {
        Seen::Committed if signalled => Step::Fail(
            "PostgreSQL committed a group commit whose answer was lost, after this node signalled its session to \
             end (so perhaps before a synchronous standby had it): answered as failed, a retry finds it",
        ),
        Seen::Committed => Step::Acknowledge,
        Seen::Aborted => Step::Fail("PostgreSQL rolled back a group commit whose answer was lost"),
        Seen::Forgotten => Step::Fail("the database does not know the group commit whose answer was lost"),
        // A second signal is harmless, and covers a first that arrived while the process was busy.
        Seen::Running { idle: true } => Step::Terminate,
        Seen::Running { idle: false } => Step::Wait,
    }
}

/// Learns, on connections of its own, whether the transaction `doubt` committed, ending it first if it still
/// waits for its `COMMIT`: `Ok` when it committed (and may be acknowledged), an error saying why otherwise.
pub(super) async fn resolve(endpoint: &Endpoint, doubt: InDoubt) -> Result<(), StoreError> {
    let deadline = Instant::now() + RESOLVE_FOR;
    let mut conn: Option<Conn> = None;
    let mut signalled = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let seen = match tokio::time::timeout(left, look(&mut conn, endpoint, doubt)).await {
            Ok(Ok(seen)) => seen,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, txid = doubt.txid, "could not ask PostgreSQL about a group commit");
                conn = None;
                tokio::time::sleep(ASK_AGAIN.min(left)).await;
                continue;
            }
            Err(_) => {
                return Err(StoreError::Io(format!(
                    "the answer to a group commit was lost and PostgreSQL could not say within {RESOLVE_FOR:?} \
                     whether it committed"
                )))
            }
        };
        match next(seen, signalled) {
            Step::Acknowledge => return Ok(()),
            Step::Fail(why) => return Err(StoreError::Io(why.into())),
            Step::Terminate => {
                signalled = true;
                if let Err(e) = terminate(&mut conn, endpoint, doubt).await {
                    tracing::warn!(error = %e, pid = doubt.pid, "could not end a session waiting for its COMMIT");
                    conn = None;
                }
            }
            Step::Wait => {}
        }
        tokio::time::sleep(LOOK_EVERY.min(left)).await;
    }
}

/// The transaction's process, matched by its id too: a process id is reused once its session ends.
const SESSION: &str = "FROM pg_stat_activity WHERE pid = $2 AND backend_xid = ($1::bigint % 4294967296)::text::xid";

async fn look(conn: &mut Option<Conn>, endpoint: &Endpoint, doubt: InDoubt) -> Result<Seen, StoreError> {
    let conn = Conn::ensure(conn, endpoint).await?;
    let sql = format!("SELECT txid_status($1::bigint), (SELECT state {SESSION})");
    let row = match conn.client.query_one(&sql, &[&doubt.txid, &doubt.pid]).await {
        Ok(row) => row,
        // A transaction id past the database's own: the database answering is not the one that ran the
        // transaction (a standby promoted before the transaction reached it), which never committed it.
        Err(e) if e.code() == Some(&SqlState::INVALID_PARAMETER_VALUE) => return Ok(Seen::Forgotten),
        Err(e) => return Err(db_error("ask what became of a group commit", e)),
    };
    let status: Option<&str> = row.get(0);
    let state: Option<&str> = row.get(1);
    match status {
        None => Ok(Seen::Forgotten),
        Some("committed") => Ok(Seen::Committed),
        Some("aborted") => Ok(Seen::Aborted),
        // `idle in transaction (aborted)` too: a failed transaction waits for its end just the same.
        Some("in progress") => Ok(Seen::Running { idle: state.is_some_and(|s| s.starts_with("idle in transaction")) }),
        Some(other) => Err(StoreError::Io(format!("PostgreSQL gave a transaction the status {other:?}"))),
    }
}

/// Terminates the transaction's process if it is still idle in it (checked again in the same statement, so
/// that a `COMMIT` that arrived since the look is left to finish).
async fn terminate(conn: &mut Option<Conn>, endpoint: &Endpoint, doubt: InDoubt) -> Result<(), StoreError> {
    let conn = Conn::ensure(conn, endpoint).await?;
    let sql = format!("SELECT pg_terminate_backend(pid) {SESSION} AND state LIKE 'idle in transaction%'");
    conn.client
        .query(&sql, &[&doubt.txid, &doubt.pid])
        .await
        .map_err(|e| db_error("end a session waiting for its COMMIT", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_is_acknowledged_only_when_this_node_did_not_signal_its_session() {
        assert_eq!(next(Seen::Committed, false), Step::Acknowledge);
        assert!(matches!(next(Seen::Committed, true), Step::Fail(_)));
    }

    #[test]
    fn a_rolled_back_or_forgotten_transaction_fails_whatever_was_done() {
        for signalled in [false, true] {
            assert!(matches!(next(Seen::Aborted, signalled), Step::Fail(_)));
            assert!(matches!(next(Seen::Forgotten, signalled), Step::Fail(_)));
        }
    }

    #[test]
    fn only_a_session_idle_in_its_transaction_is_ended_and_a_busy_one_is_waited_for() {
        for signalled in [false, true] {
            assert_eq!(next(Seen::Running { idle: true }, signalled), Step::Terminate);
            assert_eq!(next(Seen::Running { idle: false }, signalled), Step::Wait);
        }
    }
}
