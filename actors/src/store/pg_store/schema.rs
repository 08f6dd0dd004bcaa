//! The PostgreSQL schema: versioned migrations applied at open, one at a time across every node, and the
//! statements the engine runs on each tree's table.
//!
//! Every tree of the layout is a table `kv_<tree>` of `(k bytea primary key, v bytea)`, holding exactly what
//! the sled engine holds under the same keys: PostgreSQL compares `bytea` byte by byte, as sled orders keys,
//! so a range of keys is a range of the primary key's index. Values are the layout's encoded records; the
//! store's format version is kept in `caisse_store` and a database of another version is refused.
//!
//! A migration is applied in one transaction holding an advisory lock, so nodes starting together apply it
//! once; a migration is never edited once released, only followed by a new one.

use super::conn::{db_error, Conn};
use crate::domain::ids::MERCHANT_ID_LEN;
use crate::store::layout::{FORMAT_VERSION, TREE_NAMES};
use crate::store::StoreError;

/// Taken by the migrating transaction (`pg_advisory_xact_lock`): an arbitrary number of Caisse's own.
const MIGRATION_LOCK: i64 = 0x4361_6973_7365_0001;

/// The migrations in order: (version, SQL).
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE TABLE caisse_store (format integer NOT NULL);
     CREATE TABLE kv_merchants (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_merchant_keys (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_merchant_emails (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_journal (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_snapshots (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_payments (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_payouts (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_refs (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_tx_index (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_tx_owner (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_idempotency (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_outbox_due (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_pending (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_notifications (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_routes (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_provider_references (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_merchant_suspensions (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_retired_keys (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_links (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_link_owners (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_link_refs (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_link_payments (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_audited (k bytea PRIMARY KEY, v bytea NOT NULL);
     CREATE TABLE kv_idempotency_times (k bytea PRIMARY KEY, v bytea NOT NULL);",
    ),
    (
        2,
        // The cluster's placement (`cluster`): the nodes that said they are alive, and one row per shard.
        "CREATE TABLE caisse_nodes (
             node_id text PRIMARY KEY,
             advertise_url text NOT NULL,
             seen_at timestamptz NOT NULL,
             incarnation text NOT NULL
         );
         CREATE TABLE caisse_shards (
             shard integer PRIMARY KEY,
             owner text,
             fence bigint NOT NULL DEFAULT 0,
             expires_at timestamptz NOT NULL DEFAULT '-infinity'
         );
         INSERT INTO caisse_shards (shard) SELECT generate_series(0, 63);
         CREATE TABLE caisse_cluster (id integer PRIMARY KEY CHECK (id = 1), secret text NOT NULL);
         CREATE TABLE caisse_accounts_version (id integer PRIMARY KEY CHECK (id = 1), n bigint NOT NULL);
         INSERT INTO caisse_accounts_version VALUES (1, 0);
         CREATE TABLE caisse_sessions (
             digest bytea PRIMARY KEY,
             merchant text NOT NULL,
             csrf text NOT NULL,
             created_ms bigint NOT NULL,
             last_seen_ms bigint NOT NULL
         );
         CREATE INDEX caisse_sessions_merchant ON caisse_sessions (merchant, last_seen_ms);",
    ),
    (
        3,
        // The dashboard's login attempts (`sessions`), counted for every node alike: one row per counter kind
        // (address, account, pair) and SHA-256 of what it counts, so no e-mail is kept in clear.
        "CREATE TABLE caisse_login_attempts (
             kind smallint NOT NULL,
             key bytea NOT NULL,
             count integer NOT NULL,
             since_ms bigint NOT NULL,
             PRIMARY KEY (kind, key)
         );",
    ),
    (
        4,
        // Payments, payouts and notifications are written when made and changed a few times after (a status,
        // a refund, a delivery). Pages filled only halfway leave room for those changes beside the row, so
        // PostgreSQL updates in place (a heap-only tuple) instead of moving the row and adding an index entry.
        // It applies to pages filled from now on.
        "ALTER TABLE kv_payments SET (fillfactor = 50);
         ALTER TABLE kv_payouts SET (fillfactor = 50);
         ALTER TABLE kv_notifications SET (fillfactor = 50);",
    ),
];

/// Creates or migrates the schema, then checks the store's format version.
pub(super) async fn migrate(conn: &mut Conn) -> Result<(), StoreError> {
    let tx = conn.client.transaction().await.map_err(|e| db_error("begin the migration", e))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| db_error("lock the schema", e))?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS caisse_migrations (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
        .await
        .map_err(|e| db_error("create caisse_migrations", e))?;
    let applied: i32 = tx
        .query_one("SELECT coalesce(max(version), 0) FROM caisse_migrations", &[])
        .await
        .map_err(|e| db_error("read caisse_migrations", e))?
        .get(0);
    let newest = MIGRATIONS.last().map_or(0, |(v, _)| *v);
    if applied > newest {
        return Err(StoreError::Format(format!(
            "the database was migrated to schema version {applied} by a newer Caisse; this build knows versions up \
             to {newest}: run the newer build"
        )));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > applied) {
        tx.batch_execute(sql).await.map_err(|e| db_error(&format!("apply migration {version}"), e))?;
        tx.execute("INSERT INTO caisse_migrations (version) VALUES ($1)", &[version])
            .await
            .map_err(|e| db_error("record a migration", e))?;
        tracing::info!(version, "applied a PostgreSQL migration");
    }
    let format = i32::try_from(FORMAT_VERSION).map_err(|_| StoreError::Format("format version out of range".into()))?;
    let stored: Option<i32> = tx
        .query_opt("SELECT format FROM caisse_store", &[])
        .await
        .map_err(|e| db_error("read the store format", e))?
        .map(|row| row.get(0));
    match stored {
        None => {
            tx.execute("INSERT INTO caisse_store (format) VALUES ($1)", &[&format])
                .await
                .map_err(|e| db_error("record the store format", e))?;
        }
        Some(stored) if stored == format => {}
        Some(stored) => {
            return Err(StoreError::Format(format!(
                "the database holds store format {stored}; this build reads format {format} only"
            )))
        }
    }
    tx.commit().await.map_err(|e| db_error("commit the migration", e))
}

/// The statements of one tree's table.
pub(super) struct TreeSql {
    /// The table's name.
    pub(super) table: String,
    pub(super) get: String,
    /// Keys from `$1` (included) on, in order, at most `$2`.
    pub(super) forward: String,
    /// Keys from `$1` (included) to `$2` (excluded), in order, at most `$3`.
    pub(super) forward_to: String,
    /// Keys from `$1` (included) on, from the last, at most `$2`.
    pub(super) reverse: String,
    /// Keys from `$1` (included) to `$2` (excluded), from the last, at most `$3`.
    pub(super) reverse_to: String,
    pub(super) count: String,
    /// Keys no row holds (`Op::Create`): a plain insert, which fails on a key held.
    pub(super) insert: String,
    pub(super) upsert: String,
    /// The upsert of a claimed tree (`layout::CLAIMED`), and of a batch's journal runs once a key it makes was
    /// found held: a key already held with another value is left as it is and not returned, so the writer
    /// learns which claims failed.
    pub(super) claim: String,
    pub(super) delete: String,
    /// Every merchant with a key, in id order: a loose index scan, one seek per merchant.
    pub(super) merchants: String,
}

pub(super) fn tree_sql() -> Vec<TreeSql> {
    TREE_NAMES
        .iter()
        .map(|name| {
            let t = format!("kv_{name}");
            let n = MERCHANT_ID_LEN;
            TreeSql {
                get: format!("SELECT v FROM {t} WHERE k = $1"),
                forward: format!("SELECT k, v FROM {t} WHERE k >= $1 ORDER BY k LIMIT $2"),
                forward_to: format!("SELECT k, v FROM {t} WHERE k >= $1 AND k < $2 ORDER BY k LIMIT $3"),
                reverse: format!("SELECT k, v FROM {t} WHERE k >= $1 ORDER BY k DESC LIMIT $2"),
                reverse_to: format!("SELECT k, v FROM {t} WHERE k >= $1 AND k < $2 ORDER BY k DESC LIMIT $3"),
                count: format!("SELECT count(*) FROM {t}"),
                insert: format!("INSERT INTO {t} (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[])"),
                upsert: format!(
                    "INSERT INTO {t} (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[]) \
                     ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"
                ),
                claim: format!(
                    "INSERT INTO {t} (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[]) \
                     ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v WHERE {t}.v = EXCLUDED.v RETURNING k"
                ),
                delete: format!("DELETE FROM {t} WHERE k = ANY($1::bytea[])"),
                // The next merchant's keys start at the previous id with its last byte raised by one
                // (`layout::past_merchant`).
                merchants: format!(
                    "WITH RECURSIVE m(id) AS ( \
                       (SELECT substring(k FROM 1 FOR {n}) FROM {t} ORDER BY k LIMIT 1) \
                       UNION ALL \
                       SELECT (SELECT substring(k FROM 1 FOR {n}) FROM {t} \
                               WHERE k >= substring(m.id FROM 1 FOR {p}) \
                                          || set_byte(substring(m.id FROM {n} FOR 1), 0, get_byte(m.id, {p}) + 1) \
                               ORDER BY k LIMIT 1) \
                       FROM m WHERE m.id IS NOT NULL \
                     ) SELECT id FROM m WHERE id IS NOT NULL",
                    p = n - 1
                ),
                table: t,
            }
        })
        .collect()
}
