//! The dashboard sessions of a cluster, in `caisse_sessions` ([`SharedSessions`]): every node reads them there,
//! so a session opened on one node is valid on every node and one ended anywhere is ended everywhere.

use crate::cluster::{SharedSession, SharedSessions};
use crate::domain::ids::MerchantId;
use crate::store::StoreError;

use super::conn::db_error;
use super::PgStore;

fn ms(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
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
        self.session_statement("UPDATE caisse_sessions SET last_seen_ms = $2 WHERE digest = $1", digest, Some(at_ms))
    }

    fn remove(&self, digest: [u8; 32]) -> Result<(), StoreError> {
        self.session_statement("DELETE FROM caisse_sessions WHERE digest = $1", digest, None)
    }

    fn remove_merchant(&self, merchant: &MerchantId) -> Result<(), StoreError> {
        let inner = self.kv.inner.clone();
        let merchant = merchant.as_str().to_owned();
        self.kv.inner.bridge.run(async move {
            let conn = inner.readers.conn().await?;
            conn.client
                .execute("DELETE FROM caisse_sessions WHERE merchant = $1", &[&merchant])
                .await
                .map_err(|e| db_error("end a merchant's sessions", e))
                .map(drop)
        })
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
            let count: i64 = row.get(0);
            Ok(u64::try_from(count).unwrap_or(0))
        })
    }
}

impl PgStore {
    /// Runs one statement on a session's row: `$1` its digest, `$2` a time when given.
    fn session_statement(&self, sql: &'static str, digest: [u8; 32], at_ms: Option<u64>) -> Result<(), StoreError> {
        let inner = self.kv.inner.clone();
        self.kv.inner.bridge.run(async move {
            let conn = inner.readers.conn().await?;
            let digest = digest.as_slice();
            let result = match at_ms {
                Some(at) => conn.client.execute(sql, &[&digest, &ms(at)]).await,
                None => conn.client.execute(sql, &[&digest]).await,
            };
            result.map_err(|e| db_error("change a session", e)).map(drop)
        })
    }
}
