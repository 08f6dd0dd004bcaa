//! Placement of merchants on the nodes of a cluster: fixed shards, leases taken and renewed on the database's
//! clock, and the fencing token every write is checked against.
//!
//! Merchants fall into [`SHARDS`] shards by a hash of their id. A shard has one row in `caisse_shards`: its
//! owner, its fencing token and when the owner's lease ends. Every node runs [`Membership::run`]: each
//! [`RENEW_EVERY`] it says it is alive (`caisse_nodes`), renews the leases it holds (an update that only
//! matches the shards it holds with the token it took them with), and takes or gives back shards so that every
//! live node holds its fair share: free or expired shards are taken by raising their token, and a node
//! holding more than its share once another has joined gives the extra ones back.
//!
//! The lease only says where a merchant's actor should run. What makes "one writer per merchant" true is the
//! token: an actor reads its merchant's state after its node took the shard and puts the token in every
//! change, and the group commit checks the tokens in the same transaction (`writer`), holding the shard rows
//! shared until it commits. A node paused or cut off past its lease finds, when it wakes, that another node
//! raised the token: its writes fail and it acknowledges nothing. A taking waits for the commits that hold the
//! row, so the new owner reads everything the old one committed.
//!
//! A node also stops counting a shard as its own once its lease may have ended by its own clock (renewal
//! time plus the lease, less a margin), so that it does not serve a merchant's balances from memory after a
//! pause long enough for another node to have taken over. That clock ([`LeaseClock`]) counts the time the
//! machine spent suspended, which `Instant` does not.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::conn::{db_error, Conn};
use crate::domain::ids::MerchantId;
use crate::store::layout::MERCHANTS;
use crate::store::{Fence, Placement, StoreError};

/// Shards merchants are spread over. Part of the stored state: the schema creates this many rows, and a
/// merchant's shard must not change while nodes run.
pub const SHARDS: u32 = 64;

/// How long a lease lasts past its renewal, on the database's clock.
pub(super) const LEASE: Duration = Duration::from_secs(10);
/// How often a node renews its leases and balances shards.
pub(super) const RENEW_EVERY: Duration = Duration::from_secs(2);
/// Taken off the lease on this node's clock before it stops counting a shard as its own.
const MARGIN: Duration = Duration::from_secs(2);
/// A node not seen for this long no longer counts in the fair share.
const NODE_TIMEOUT: Duration = Duration::from_secs(10);

/// The shard a merchant belongs to: the first four bytes of the SHA-256 of its id, modulo [`SHARDS`].
pub fn shard_of(merchant: &MerchantId) -> u32 {
    let digest = Sha256::digest(merchant.as_bytes());
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) % SHARDS
}

/// This node, as the others see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    /// Unique among the nodes of a cluster.
    pub id: String,
    /// Where the other nodes reach this one's API (to forward a merchant's requests to it).
    pub url: String,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    token: i64,
    /// Past this, on this node's clock, the lease may have ended.
    until: LeaseClock,
}

/// A reading of the clock this node judges its leases by: `CLOCK_BOOTTIME` on Linux, which goes on while the
/// machine is suspended, where `Instant` (`CLOCK_MONOTONIC`) stops. A node whose machine slept past its leases
/// must find them ended when it wakes, before it answers a balance from memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct LeaseClock(Duration);

#[cfg(target_os = "linux")]
const LEASE_CLOCK: libc::clockid_t = libc::CLOCK_BOOTTIME;
#[cfg(not(target_os = "linux"))]
const LEASE_CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC;

impl LeaseClock {
    /// The clock, read to judge a lease: if it cannot be read (never seen), as late as can be, so that every
    /// lease has ended, which only forwards or refuses work.
    pub(super) fn now() -> LeaseClock {
        LeaseClock::read().unwrap_or(LeaseClock(Duration::MAX))
    }

    /// The clock, read as a lease starts: if it cannot be read, as early as can be, so that a lease counted
    /// from it has ended already.
    fn start() -> LeaseClock {
        LeaseClock::read().unwrap_or(LeaseClock(Duration::ZERO))
    }

    fn read() -> Option<LeaseClock> {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime only writes the timespec it is given, which lives for the call.
        if unsafe { libc::clock_gettime(LEASE_CLOCK, &mut ts) } != 0 {
            return None;
        }
        let secs = u64::try_from(ts.tv_sec).ok()?;
        let nanos = u32::try_from(ts.tv_nsec).ok()?.min(999_999_999);
        Some(LeaseClock(Duration::new(secs, nanos)))
    }

    fn plus(self, span: Duration) -> LeaseClock {
        LeaseClock(self.0.saturating_add(span))
    }

    fn since(self, earlier: LeaseClock) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

/// What this node holds and where every other shard is, as of the last renewal.
pub struct Membership {
    pub(super) me: NodeIdentity,
    held: RwLock<Vec<Option<Held>>>,
    /// The owner of every shard this node does not hold, as last read: (node id, its URL).
    owners: RwLock<Vec<Option<(String, String)>>>,
    stopped: AtomicBool,
    /// Wakes the loop from its sleep when the node stops.
    wake: tokio::sync::Notify,
    /// Set once a stopped node has given its shards back (or given up trying).
    left: AtomicBool,
    config: super::tls::Endpoint,
    /// This process among those that ran under the node's id: a process leaving marks the node gone only if no
    /// later process (a restart that overlapped it) said it is alive since.
    incarnation: String,
    /// Set by the first [`Membership::start`].
    started: AtomicBool,
    /// Rounds completed, so that a start can wait for the first.
    rounds: AtomicU64,
    /// When the last round completed, in milliseconds since `born` (0: never).
    last_round_ms: AtomicU64,
    born: LeaseClock,
    /// Rounds that took shards (`Commits::takeovers`).
    takeovers: AtomicU64,
    /// The store's generation numbers, and the version of the merchant accounts last read: a change another
    /// node (or a merchant command) made moves this node's generation of the accounts within a round.
    generations: Arc<Vec<AtomicU64>>,
    accounts_version: AtomicI64,
}

impl Membership {
    pub(super) fn new(me: NodeIdentity, generations: Arc<Vec<AtomicU64>>, config: super::tls::Endpoint) -> Membership {
        Membership {
            me,
            held: RwLock::new(vec![None; SHARDS as usize]),
            owners: RwLock::new(vec![None; SHARDS as usize]),
            stopped: AtomicBool::new(false),
            started: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            left: AtomicBool::new(false),
            config,
            incarnation: crate::domain::ids::random_base62(22),
            rounds: AtomicU64::new(0),
            last_round_ms: AtomicU64::new(0),
            born: LeaseClock::start(),
            takeovers: AtomicU64::new(0),
            generations,
            accounts_version: AtomicI64::new(i64::MIN),
        }
    }

    /// Whether a round read the accounts' version lately. A node whose rounds fail (cut off the database)
    /// cannot tell whether another node changed an account, a suspension or a key meanwhile: its caches of
    /// them must not be trusted until a round succeeds again.
    pub(super) fn accounts_fresh(&self) -> bool {
        let last = self.last_round_ms.load(Ordering::Acquire);
        let now = u64::try_from(LeaseClock::now().since(self.born).as_millis()).unwrap_or(u64::MAX);
        last > 0 && now.saturating_sub(last) < u64::try_from((RENEW_EVERY * 2).as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether this node's rounds reach the database: none has failed for as long as a lease lasts. Before
    /// its first round, the time since it started counts (opening the store reached the database).
    pub(super) fn in_touch(&self) -> bool {
        let last = self.last_round_ms.load(Ordering::Acquire);
        let now = u64::try_from(LeaseClock::now().since(self.born).as_millis()).unwrap_or(u64::MAX);
        now.saturating_sub(last) < u64::try_from(LEASE.as_millis()).unwrap_or(u64::MAX)
    }

    /// The token this node holds `shard` with, while its lease lasts by this node's clock.
    pub(super) fn fence(&self, shard: u32) -> Option<Fence> {
        let held = self.held.read().ok()?;
        let h = held.get(shard as usize).copied().flatten()?;
        (LeaseClock::now() < h.until).then_some(Fence { shard, token: h.token })
    }

    pub(super) fn placement(&self, merchant: &MerchantId) -> Placement {
        let shard = shard_of(merchant);
        if self.fence(shard).is_some() {
            return Placement::Here;
        }
        match self.owners.read().ok().and_then(|o| o.get(shard as usize).cloned().flatten()) {
            Some((id, url)) if id != self.me.id => Placement::Node { id, url },
            _ => Placement::Nobody,
        }
    }

    /// How many shards this node holds now.
    pub fn held_count(&self) -> usize {
        let now = LeaseClock::now();
        self.held.read().map_or(0, |h| h.iter().filter(|s| s.is_some_and(|h| now < h.until)).count())
    }

    /// Waits (blocking) until the first round is done, at most `limit`: a lone node then holds every shard.
    pub(super) fn wait_first_round(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.rounds.load(Ordering::Acquire) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub(super) fn takeovers(&self) -> u64 {
        self.takeovers.load(Ordering::Acquire)
    }

    /// True the first time only: the caller then runs [`Membership::run`].
    pub(super) fn start(&self) -> bool {
        !self.started.swap(true, Ordering::AcqRel)
    }

    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.wake.notify_one();
    }

    /// Stops, and waits (blocking, at most `limit`) until the node has given its shards back and said it is
    /// gone, so that the other nodes take its merchants at their next round rather than after the leases.
    pub(super) fn leave(&self, limit: Duration) {
        self.stop();
        if !self.started.load(Ordering::Acquire) {
            return;
        }
        let deadline = Instant::now() + limit;
        while !self.left.load(Ordering::Acquire) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Renews, balances and reads placement every [`RENEW_EVERY`] until [`Membership::stop`], then gives
    /// back what it holds so that other nodes take it at once rather than after the lease.
    pub(super) async fn run(self: Arc<Self>) {
        let config = self.config.clone();
        let mut conn: Option<Conn> = None;
        while !self.stopped.load(Ordering::Acquire) {
            let started = Instant::now();
            let leased_at = LeaseClock::start();
            let round = async {
                if conn.as_ref().is_none_or(|c| c.is_closed()) {
                    conn = Some(Conn::open(&config).await?);
                }
                match conn.as_ref() {
                    Some(c) => self.round(c, leased_at).await,
                    None => Err(StoreError::Closed),
                }
            };
            match tokio::time::timeout(RENEW_EVERY * 2, round).await {
                Ok(Ok(())) => {
                    self.rounds.fetch_add(1, Ordering::AcqRel);
                    // Read as a start: a clock that cannot be read leaves the accounts' caches looking stale.
                    let at = u64::try_from(LeaseClock::start().since(self.born).as_millis()).unwrap_or(u64::MAX).max(1);
                    self.last_round_ms.store(at, Ordering::Release);
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, node = %self.me.id, "renewing the shard leases failed");
                    conn = None;
                }
                Err(_) => {
                    tracing::warn!(node = %self.me.id, "renewing the shard leases timed out");
                    conn = None;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(RENEW_EVERY.saturating_sub(started.elapsed())) => {}
                _ = self.wake.notified() => {}
            }
        }
        // Only what this process holds, with its tokens: another process under the same id (a restart that
        // overlapped this one) keeps what it took.
        let (shards, tokens): (Vec<i32>, Vec<i64>) = match self.held.write() {
            Ok(mut held) => {
                held.iter_mut().enumerate().filter_map(|(shard, h)| h.take().map(|h| (shard as i32, h.token))).unzip()
            }
            Err(_) => (Vec::new(), Vec::new()),
        };
        let leave = async {
            let conn = match conn {
                Some(c) if !c.is_closed() => c,
                _ => Conn::open(&config).await?,
            };
            self.give_back(&conn, &shards, &tokens).await?;
            conn.client
                .execute(
                    "UPDATE caisse_nodes SET seen_at = '-infinity' WHERE node_id = $1 AND incarnation = $2",
                    &[&self.me.id, &self.incarnation],
                )
                .await
                .map(drop)
                .map_err(|e| db_error("say this node is gone", e))
        };
        match tokio::time::timeout(RENEW_EVERY * 2, leave).await {
            Ok(Ok(())) => tracing::info!(node = %self.me.id, "gave the shards back"),
            Ok(Err(e)) => {
                tracing::warn!(node = %self.me.id, error = %e, "the shards were not given back; their leases end")
            }
            Err(_) => tracing::warn!(node = %self.me.id, "giving the shards back timed out; their leases end"),
        }
        self.left.store(true, Ordering::Release);
    }

    /// Gives back the shards this node holds with these tokens (and no other: a shard taken since by another
    /// process keeps its owner), so that other nodes take them at their next round.
    async fn give_back(&self, conn: &Conn, shards: &[i32], tokens: &[i64]) -> Result<(), StoreError> {
        conn.client
            .execute(
                "UPDATE caisse_shards SET owner = NULL, expires_at = '-infinity' \
                 WHERE owner = $1 AND (shard, fence) IN (SELECT * FROM unnest($2::int[], $3::bigint[]))",
                &[&self.me.id, &shards, &tokens],
            )
            .await
            .map(drop)
            .map_err(|e| db_error("give shards back", e))
    }

    /// One renewal: alive, renew, take or give back, read where the rest is.
    async fn round(&self, conn: &Conn, started: LeaseClock) -> Result<(), StoreError> {
        let lease_s = LEASE.as_secs_f64();
        let until = started.plus(LEASE - MARGIN);
        conn.client
            .execute(
                "INSERT INTO caisse_nodes (node_id, advertise_url, seen_at, incarnation) VALUES ($1, $2, now(), $3) \
                 ON CONFLICT (node_id) DO UPDATE SET advertise_url = EXCLUDED.advertise_url, seen_at = now(), \
                 incarnation = EXCLUDED.incarnation",
                &[&self.me.id, &self.me.url, &self.incarnation],
            )
            .await
            .map_err(|e| db_error("say this node is alive", e))?;
        // Renew exactly what is held with the tokens it was taken with. Shards whose lease ran out by this
        // node's clock before this round counted as other nodes' meanwhile, so work of theirs may have been
        // passed over: renewed, they are taken back like new ones.
        let (shards, tokens, lapsed) = {
            let held = self.held.read().map_err(|_| poisoned())?;
            let now = LeaseClock::now();
            let held: Vec<(i32, Held)> =
                held.iter().enumerate().filter_map(|(shard, h)| h.map(|h| (shard as i32, h))).collect();
            let lapsed: Vec<i32> = held.iter().filter(|(_, h)| h.until <= now).map(|(shard, _)| *shard).collect();
            let (shards, tokens): (Vec<i32>, Vec<i64>) = held.into_iter().map(|(shard, h)| (shard, h.token)).unzip();
            (shards, tokens, lapsed)
        };
        let renewed = conn
            .client
            .query(
                "UPDATE caisse_shards SET expires_at = now() + make_interval(secs => $4) \
                 WHERE owner = $1 AND (shard, fence) IN (SELECT * FROM unnest($2::int[], $3::bigint[])) \
                 RETURNING shard, fence",
                &[&self.me.id, &shards, &tokens, &lease_s],
            )
            .await
            .map_err(|e| db_error("renew the shard leases", e))?;
        let mut now_held: Vec<Option<Held>> = vec![None; SHARDS as usize];
        for row in &renewed {
            let (shard, token): (i32, i64) = (row.get(0), row.get(1));
            if let Some(slot) = now_held.get_mut(shard as usize) {
                *slot = Some(Held { token, until });
            }
        }
        let lost = shards.iter().filter(|s| now_held.get(**s as usize).is_some_and(|h| h.is_none())).count();
        if lost > 0 {
            tracing::warn!(node = %self.me.id, lost, "shard leases were lost to other nodes");
        }
        let live: i64 = conn
            .client
            .query_one(
                "SELECT count(*) FROM caisse_nodes WHERE seen_at > now() - make_interval(secs => $1)",
                &[&NODE_TIMEOUT.as_secs_f64()],
            )
            .await
            .map_err(|e| db_error("count the live nodes", e))?
            .get(0);
        let live = u32::try_from(live.max(1)).unwrap_or(1);
        let share = SHARDS.div_ceil(live) as usize;
        let holding = now_held.iter().filter(|h| h.is_some()).count();
        let mut took = lapsed.iter().any(|shard| now_held.get(*shard as usize).is_some_and(|h| h.is_some()));
        // Besides free and expired shards, a node takes those still leased to its own id that it does not hold:
        // it was restarted (or a second process was started under its id by mistake), and raising the token
        // fences the earlier process off at once instead of after its lease.
        let held_now: Vec<i32> =
            now_held.iter().enumerate().filter(|(_, h)| h.is_some()).map(|(shard, _)| shard as i32).collect();
        if holding < share {
            let taken = conn
                .client
                .query(
                    "UPDATE caisse_shards SET owner = $1, fence = fence + 1, expires_at = now() + make_interval(secs => $3) \
                     WHERE shard IN (SELECT shard FROM caisse_shards \
                                     WHERE (expires_at < now() OR owner = $1) AND NOT (shard = ANY($4::int[])) \
                                     ORDER BY shard LIMIT $2 FOR UPDATE SKIP LOCKED) \
                     RETURNING shard, fence",
                    &[&self.me.id, &((share - holding) as i64), &lease_s, &held_now],
                )
                .await
                .map_err(|e| db_error("take free shards", e))?;
            for row in &taken {
                let (shard, token): (i32, i64) = (row.get(0), row.get(1));
                if let Some(slot) = now_held.get_mut(shard as usize) {
                    *slot = Some(Held { token, until });
                }
            }
            if !taken.is_empty() {
                tracing::info!(node = %self.me.id, taken = taken.len(), share, "took shards");
                // Counted once the shards are held (below), so whoever sees the number finds them here.
                took = true;
            }
        } else if holding > share {
            // Give back the extra shards, highest first; no longer counted here from this moment, so their
            // merchants' requests go to the node that takes them.
            let extra: Vec<(i32, i64)> = now_held
                .iter()
                .enumerate()
                .rev()
                .filter_map(|(shard, h)| h.map(|h| (shard as i32, h.token)))
                .take(holding - share)
                .collect();
            for (shard, _) in &extra {
                now_held[*shard as usize] = None;
            }
            *self.held.write().map_err(|_| poisoned())? = now_held.clone();
            let (shards, tokens): (Vec<i32>, Vec<i64>) = extra.into_iter().unzip();
            self.give_back(conn, &shards, &tokens).await?;
            tracing::info!(node = %self.me.id, given = shards.len(), share, "gave back shards to balance the cluster");
        }
        *self.held.write().map_err(|_| poisoned())? = now_held;
        if took {
            self.takeovers.fetch_add(1, Ordering::AcqRel);
        }
        let rows = conn
            .client
            .query(
                "SELECT s.shard, s.owner, n.advertise_url FROM caisse_shards s \
                 JOIN caisse_nodes n ON n.node_id = s.owner WHERE s.expires_at > now()",
                &[],
            )
            .await
            .map_err(|e| db_error("read where the shards are", e))?;
        let mut owners: Vec<Option<(String, String)>> = vec![None; SHARDS as usize];
        for row in &rows {
            let shard: i32 = row.get(0);
            if let Some(slot) = owners.get_mut(shard as usize) {
                *slot = Some((row.get(1), row.get(2)));
            }
        }
        *self.owners.write().map_err(|_| poisoned())? = owners;
        let version: i64 = conn
            .client
            .query_one("SELECT n FROM caisse_accounts_version WHERE id = 1", &[])
            .await
            .map_err(|e| db_error("read the accounts' version", e))?
            .get(0);
        if self.accounts_version.swap(version, Ordering::AcqRel) != version {
            if let Some(generation) = self.generations.get(MERCHANTS) {
                generation.fetch_add(1, Ordering::AcqRel);
            }
        }
        Ok(())
    }
}

fn poisoned() -> StoreError {
    StoreError::Io("the shard table was poisoned".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_clock_goes_forward_and_a_lease_ends_past_its_span() {
        let first = LeaseClock::now();
        std::thread::sleep(Duration::from_millis(20));
        let second = LeaseClock::now();
        assert!(second.since(first) >= Duration::from_millis(20), "{first:?} then {second:?}");
        let until = first.plus(Duration::from_millis(10));
        assert!(second >= until, "a lease of 10 ms has ended 20 ms later");
        assert!(first < first.plus(LEASE - MARGIN));
        assert_eq!(LeaseClock(Duration::MAX).plus(LEASE), LeaseClock(Duration::MAX), "saturates");
    }

    /// On Linux the clock counts from boot, suspensions included, as `/proc/uptime` does.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_lease_clock_is_the_boot_clock() {
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .ok()
            .and_then(|text| text.split_whitespace().next()?.parse().ok())
            .expect("/proc/uptime");
        let clock = LeaseClock::now().0.as_secs_f64();
        assert!((clock - uptime).abs() < 1.0, "lease clock {clock} s, uptime {uptime} s");
    }
}
