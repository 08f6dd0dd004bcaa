//! The dashboard sessions of a cluster, in `caisse_sessions` ([`SharedSessions`]): every node reads them there,
//! so a session opened on one node is valid on every node and one ended anywhere is ended everywhere. The login
//! attempts are counted in `caisse_login_attempts` the same way, each reservation one atomic upsert.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio_postgres::types::ToSql;

use crate::cluster::{SharedSession, SharedSessions};
use crate::domain::ids::MerchantId;
use crate::store::StoreError;

use super::conn::db_error;
use super::PgStore;

fn ms(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The database's clock in milliseconds: every node counts a window on the same clock.
const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// One reservation in this many also deletes the counters whose window has ended, which bounds the table by
/// the attempts of one window whatever the number of addresses a flood comes from.
const SWEEP_EVERY: u64 = 256;
static RESERVATIONS: AtomicU64 = AtomicU64::new(0);

fn limit(max: u32) -> i32 {
    i32::try_from(max).unwrap_or(i32::MAX)
}

impl SharedSessions for PgStore {
    fn put(
        &self,
        digest: [u8; 32],
        session: &SharedSession,
        per_merchant: usize,
        idle_before: u64,
        made_before: u64,
    ) -> Result<(), StoreError> {
        let inner = self.kv.inner.clone();
        let session = session.clone();
        let keep = i64::try_from(per_merchant.saturating_sub(1)).unwrap_or(i64::MAX);
        self.kv.inner.bridge.run(async move {
            let conn = inner.readers.conn().await?;
            let merchant = session.merchant.as_str();
            conn.client
                .execute(
                    "DELETE FROM caisse_sessions WHERE last_seen_ms < $1 OR created_ms < $2",
                    &[&ms(idle_before), &ms(made_before)],
                )
                .await
                .map_err(|e| db_error("delete ended sessions", e))?;
            conn.client
                .execute(
                    "DELETE FROM caisse_sessions WHERE digest IN (SELECT digest FROM caisse_sessions \
                     WHERE merchant = $1 ORDER BY last_seen_ms DESC OFFSET $2)",
                    &[&merchant, &keep],
                )
                .await
                .map_err(|e| db_error("bound a merchant's sessions", e))?;
            conn.client
                .execute(
                    "INSERT INTO caisse_sessions (digest, merchant, csrf, created_ms, last_seen_ms) \
                     VALUES ($1, $2, $3, $4, $5)",
                    &[&digest.as_slice(), &merchant, &session.csrf, &ms(session.created_ms), &ms(session.last_seen_ms)],
                )
                .await
                .map_err(|e| db_error("open a session", e))?;
            Ok(())
        })
    }

    fn get(&self, digest: [u8; 32]) -> Result<Option<SharedSession>, StoreError> {
        let inner = self.kv.inner.clone();
        self.kv.inner.bridge.run(async move {
            let conn = inner.readers.conn().await?;
            let row = conn
                .client
                .query_opt(
                    "SELECT merchant, csrf, created_ms, last_seen_ms FROM caisse_sessions WHERE digest = $1",
                    &[&digest.as_slice()],
                )
                .await
                .map_err(|e| db_error("read a session", e))?;
            let Some(row) = row else { return Ok(None) };
            let corrupt = |e: &dyn std::fmt::Display| StoreError::Corrupt(format!("caisse_sessions: {e}"));
            let merchant: String = row.try_get(0).map_err(|e| corrupt(&e))?;
            let created: i64 = row.try_get(2).map_err(|e| corrupt(&e))?;
            let seen: i64 = row.try_get(3).map_err(|e| corrupt(&e))?;
            Ok(Some(SharedSession {
                merchant: MerchantId::parse(&merchant).map_err(|e| corrupt(&e))?,
                csrf: row.try_get(1).map_err(|e| corrupt(&e))?,
                created_ms: u64::try_from(created).unwrap_or(0),
                last_seen_ms: u64::try_from(seen).unwrap_or(0),
            }))
        })
    }

    fn touch(&self, digest: [u8; 32], at_ms: u64) -> Result<(), StoreError> {
        let sql = "UPDATE caisse_sessions SET last_seen_ms = $2 WHERE digest = $1";
        self.statement(sql, vec![Box::new(digest.to_vec()), Box::new(ms(at_ms))], "record a session's activity")
    }

    fn remove(&self, digest: [u8; 32]) -> Result<(), StoreError> {
        self.statement(
            "DELETE FROM caisse_sessions WHERE digest = $1",
            vec![Box::new(digest.to_vec())],
            "end a session",
        )
    }

    fn remove_merchant(&self, merchant: &MerchantId) -> Result<(), StoreError> {
        let sql = "DELETE FROM caisse_sessions WHERE merchant = $1";
        self.statement(sql, vec![Box::new(merchant.as_str().to_owned())], "end a merchant's sessions")
    }

    fn reserve_attempt(&self, kind: u8, key: [u8; 32], max: u32, window_ms: u64) -> Result<Option<u64>, StoreError> {
        let inner = self.kv.inner.clone();
        let sweep = RESERVATIONS.fetch_add(1, Ordering::Relaxed).is_multiple_of(SWEEP_EVERY);
        self.kv.inner.bridge.run(async move {
            let conn = inner.readers.conn().await?;
            let (kind, window) = (i16::from(kind), ms(window_ms));
            if sweep {
                let sql = format!("DELETE FROM caisse_login_attempts WHERE kind = $1 AND since_ms <= {NOW_MS} - $2");
                conn.client.execute(&sql, &[&kind, &window]).await.map_err(|e| db_error("forget old attempts", e))?;
            }
            // The row is inserted or counted only while its window has room (or has ended, which starts a new
            // one); a refused attempt changes nothing and returns no row.
            let sql = format!(
                "INSERT INTO caisse_login_attempts AS a (kind, key, count, since_ms) VALUES ($1, $2, 1, {NOW_MS}) \
                 ON CONFLICT (kind, key) DO UPDATE SET \
                 count = CASE WHEN a.since_ms <= excluded.since_ms - $3 THEN 1 ELSE a.count + 1 END, \
                 since_ms = CASE WHEN a.since_ms <= excluded.since_ms - $3 THEN excluded.since_ms ELSE a.since_ms END \
                 WHERE a.since_ms <= excluded.since_ms - $3 OR a.count < $4 RETURNING count"
            );
            let counted = conn
                .client
                .query_opt(&sql, &[&kind, &key.as_slice(), &window, &limit(max)])
                .await
                .map_err(|e| db_error("count a login attempt", e))?;
            if counted.is_some() {
                return Ok(None);
            }
            let sql = format!(
                "SELECT greatest(since_ms + $3 - {NOW_MS}, 1) FROM caisse_login_attempts WHERE kind = $1 AND key = $2"
            );
            let row = conn
                .client
                .query_opt(&sql, &[&kind, &key.as_slice(), &window])
                .await
                .map_err(|e| db_error("read a login counter", e))?;
            let wait: i64 = match row {
                Some(row) => row.try_get(0).map_err(|e| StoreError::Corrupt(format!("caisse_login_attempts: {e}")))?,
                None => 1,
            };
            Ok(Some(u64::try_from(wait).unwrap_or(1)))
        })
    }

    fn attempts_locked(&self, kind: u8, key: [u8; 32], max: u32, window_ms: u64) -> Result<Option<u64>, StoreError> {
        let inner = self.kv.inner.clone();
        self.kv.inner.bridge.run(async move {
            let conn = inner.readers.conn().await?;
            let sql = format!(
                "SELECT since_ms + $3 - {NOW_MS} FROM caisse_login_attempts \
                 WHERE kind = $1 AND key = $2 AND count >= $4 AND since_ms > {NOW_MS} - $3"
            );
            let row = conn
                .client
                .query_opt(&sql, &[&i16::from(kind), &key.as_slice(), &ms(window_ms), &limit(max)])
                .await
                .map_err(|e| db_error("read a login counter", e))?;
            let Some(row) = row else { return Ok(None) };
            let wait: i64 = row.try_get(0).map_err(|e| StoreError::Corrupt(format!("caisse_login_attempts: {e}")))?;
            Ok(Some(u64::try_from(wait).unwrap_or(0).max(1)))
        })
    }

    fn forgive_attempt(&self, kind: u8, key: [u8; 32]) -> Result<(), StoreError> {
        let sql = "UPDATE caisse_login_attempts SET count = greatest(count - 1, 0) WHERE kind = $1 AND key = $2";
        self.statement(sql, vec![Box::new(i16::from(kind)), Box::new(key.to_vec())], "give a login attempt back")
    }

    fn clear_attempts(&self, kind: u8, key: [u8; 32]) -> Result<(), StoreError> {
        let sql = "DELETE FROM caisse_login_attempts WHERE kind = $1 AND key = $2";
        self.statement(sql, vec![Box::new(i16::from(kind)), Box::new(key.to_vec())], "clear login attempts")
    }

    fn count(&self) -> Result<u64, StoreError> {
        let inner = self.kv.inner.clone();
        self.kv.inner.bridge.run(async move {
            let conn = inner.readers.conn().await?;
            let row = conn
                .client
                .query_one("SELECT count(*) FROM caisse_sessions", &[])
                .await
                .map_err(|e| db_error("count sessions", e))?;
            let count: i64 = row.try_get(0).map_err(|e| StoreError::Corrupt(format!("caisse_sessions: {e}")))?;
            Ok(u64::try_from(count).unwrap_or(0))
        })
    }
}

impl PgStore {
    /// Runs one statement that answers no rows, with these parameters, on a reader connection.
    fn statement(
        &self,
        sql: &'static str,
        params: Vec<Box<dyn ToSql + Send + Sync>>,
        what: &'static str,
    ) -> Result<(), StoreError> {
        let inner = self.kv.inner.clone();
        self.kv.inner.bridge.run(async move {
            let conn = inner.readers.conn().await?;
            let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
            conn.client.execute(sql, &params).await.map_err(|e| db_error(what, e)).map(drop)
        })
    }
}
