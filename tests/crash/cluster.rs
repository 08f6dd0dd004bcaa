//! The crash test on a cluster: two `caisse serve` nodes share one PostgreSQL database and take the same load,
//! each request going to the nodes in turn (so a merchant's requests reach both the node that holds it and one
//! that forwards to it). Cycles go in fours, each done to a node that holds one of the merchants. In the first,
//! that node is killed with SIGKILL while the load goes on against the other, which (one time in two) takes
//! every shard over once the dead node's leases end (the test waits for it); requests that lost their answer
//! (or got a `503` from a node whose forwarded request died with the other) are sent again with the same
//! `Idempotency-Key`, and the killed node is started again under the same id (the other time in two, before
//! its leases end: it takes its own shards back). In the second, one node is frozen with SIGSTOP until the
//! other holds every shard, past the frozen node's leases, and writes for its merchants; then the
//! frozen node is let go with SIGCONT still holding in memory the merchants it no longer owns, with requests
//! queued on its sockets: its writes must fail the fence, so that it acknowledges nothing that is not stored.
//! In the third, the database itself is restarted at once, as a crash of its server, while both nodes take the
//! load. In the fourth, one node is cut off the database (each node reaches it through a proxy the test cuts:
//! silence, not an error) past its leases: the other takes its merchants over, and once the proxy heals the cut
//! node must reconnect and take its share back. After each cycle the checks of the single-node test run:
//! everything acknowledged is there, nothing twice, balances equal to the movements and never negative. Then a
//! third node joins under load and the shards spread over the three; its requests count like the others'. At
//! the end every notification the final states imply reaches its receiver, and the database, read by a client,
//! passes the full audit and holds exactly the notifications the receivers got.
use std::net::TcpListener;
use std::time::{Duration, Instant};

use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::DeliveryState;
use caisse_engine::store::pg_store::shard_of;
use caisse_engine::store::{Outbox, PgStore};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::load::{Merchant, Run};
use crate::receiver::Receiver;
use crate::server::{create_merchant_with, Server, Target};
use crate::support::postgres;
use crate::support::proxy::Proxy;
use crate::support::{free_port, sleep_ms};
use crate::{check_all, checks, deliveries_once_quiet, env_number, every_implied_notification_is_acknowledged};
use crate::{store, MERCHANTS, WORKERS_PER_MERCHANT};

/// The nodes of the cycles; one more joins at the end.
const NODES: usize = 2;
/// A kill, a freeze, a database restart and a cut.
const DEFAULT_CYCLES: u32 = 4;
/// The database's shards (`caisse_shards`).
const SHARDS: usize = 64;
/// How long a node may take to hold its share of the shards once it can: a few lease rounds.
const SHARE_DEADLINE: Duration = Duration::from_secs(30);
/// How long a node may take to hold every shard once the other stopped renewing: the other's leases (10 s)
/// and its time to count as gone (10 s), then rounds that may each take a few seconds on a loaded machine.
const TAKEOVER_DEADLINE: Duration = Duration::from_secs(60);

/// How long every notification may take to be stored as delivered once the load ended: an attempt whose
/// outcome could not be saved is sent again after at most a minute.
const SAVED_DEADLINE: Duration = Duration::from_secs(90);

/// Notifications of the run's merchants the database holds as still to deliver.
fn pending_notifications(store: &PgStore, run: &Run) -> usize {
    let mut pending = 0;
    for merchant in &run.merchants {
        let id = MerchantId::parse(&merchant.id).expect("a merchant id");
        let mut cursor: Option<String> = None;
        loop {
            let page = store.notifications(&id, cursor.as_deref(), 100, &mut |_| true).expect("notifications");
            pending += page.data.iter().filter(|n| n.state == DeliveryState::Pending).count();
            match page.next_cursor {
                Some(next) if page.has_more => cursor = Some(next),
                _ => break,
            }
        }
    }
    pending
}

/// [`postgres::query_value`] on a thread of its own: the load runs on this test's one thread and keeps going
/// meanwhile.
async fn query_aside(url: &str, sql: String) -> String {
    let url = url.to_owned();
    let query = std::thread::spawn(move || postgres::query_value(&url, &sql));
    while !query.is_finished() {
        sleep_ms(10).await;
    }
    query.join().expect("the query's thread")
}

/// How many shards node `node` holds with a lease that has not ended, read from the database.
async fn shards_held(url: &str, node: &str) -> usize {
    let sql = format!("SELECT count(*) FROM caisse_shards WHERE owner = '{node}' AND expires_at > now()");
    let count = query_aside(url, sql).await;
    count.parse().unwrap_or_else(|e| panic!("a count of shards, not {count:?}: {e}"))
}

/// A node of the cycles that holds the shard of one of the run's merchants (one of them at random), read from the
/// database, so that what is done to it hits a merchant's holder and not only a node that forwards.
async fn a_merchants_holder(url: &str, run: &Run, rng: &mut StdRng) -> usize {
    let shards: Vec<String> =
        run.merchants.iter().map(|m| shard_of(&MerchantId::parse(&m.id).expect("a merchant id")).to_string()).collect();
    let sql = format!(
        "SELECT string_agg(DISTINCT owner, ',') FROM caisse_shards WHERE shard IN ({}) AND expires_at > now()",
        shards.join(",")
    );
    // Just after a cycle (a database restart, say) the leases may be between two rounds: ask again a while.
    let started = Instant::now();
    loop {
        let owners = query_aside(url, sql.clone()).await;
        let holders: Vec<usize> = (0..NODES).filter(|i| owners.split(',').any(|o| o == format!("node-{i}"))).collect();
        if !holders.is_empty() {
            return holders[rng.gen_range(0..holders.len())];
        }
        assert!(
            started.elapsed() < SHARE_DEADLINE,
            "no node of the cycles holds a merchant's shard: owners {owners:?}"
        );
        sleep_ms(200).await;
    }
}

/// Waits until `node` holds at least `least` shards, at most [`SHARE_DEADLINE`] ([`TAKEOVER_DEADLINE`] for
/// every shard).
async fn until_held(url: &str, node: &str, least: usize, seed: u64, what: &str) {
    let deadline = if least == SHARDS { TAKEOVER_DEADLINE } else { SHARE_DEADLINE };
    let started = Instant::now();
    loop {
        let held = shards_held(url, node).await;
        if held >= least {
            return;
        }
        assert!(started.elapsed() < deadline, "seed {seed}, {what}: {node} holds {held} shards, not {least}");
        sleep_ms(200).await;
    }
}

/// One node: its port, data directory and settings.
struct Node {
    port: u16,
    data_dir: std::path::PathBuf,
    env: Vec<(String, String)>,
}

impl Node {
    async fn start(&self, work_dir: &std::path::Path) -> Server {
        Server::start_with(work_dir, &self.data_dir, self.port, &self.env).await
    }
}

#[actix_web::test]
async fn a_cluster_keeps_every_acknowledged_change_when_a_node_is_killed() {
    let started = Instant::now();
    let cycles: u32 = env_number("CAISSE_CLUSTER_CRASH_CYCLES").unwrap_or(DEFAULT_CYCLES);
    let seed: u64 = env_number("CAISSE_CRASH_SEED").unwrap_or_else(rand::random);
    println!("cluster crash test: {cycles} cycles, seed {seed} (CAISSE_CRASH_SEED={seed} replays it)");
    let mut rng = StdRng::seed_from_u64(seed);

    let db = postgres::database();
    let dir = tempfile::TempDir::new().expect("temp dir");
    let store_env = vec![("CAISSE_STORE".to_owned(), db.url.clone())];
    // The nodes of the cycles reach the database through proxies the test can cut; the joiner directly.
    let proxies: Vec<Proxy> = (0..NODES).map(|_| Proxy::start(&db.server_address())).collect();
    let nodes: Vec<Node> = (0..=NODES)
        .map(|i| {
            let port = free_port();
            let url = proxies.get(i).map_or_else(|| db.url.clone(), |proxy| db.url_via(proxy.port));
            let env = vec![
                ("CAISSE_STORE".to_owned(), url),
                ("CAISSE_NODE_ID".into(), format!("node-{i}")),
                ("CAISSE_ADVERTISE_URL".into(), format!("http://127.0.0.1:{port}")),
            ];
            Node { port, data_dir: dir.path().join(format!("data-{i}")), env }
        })
        .collect();
    let mut servers: Vec<Option<Server>> = Vec::new();
    for node in &nodes[..NODES] {
        servers.push(Some(node.start(dir.path()).await));
    }
    servers.push(None);
    // Made while the nodes run: the database is shared, so the merchant command writes to it directly.
    let merchants: Vec<Merchant> = (0..MERCHANTS)
        .map(|i| {
            let listener = TcpListener::bind("127.0.0.1:0").expect("receiver binds");
            let url = format!("http://127.0.0.1:{}/webhooks", listener.local_addr().expect("receiver address").port());
            let name = format!("c{i}");
            let created = create_merchant_with(dir.path(), &nodes[0].data_dir, &store_env, &name, &url);
            let receiver = Receiver::start(listener, created.secret_key.clone());
            Merchant::new(name, created.id, created.secret_key, receiver)
        })
        .collect();
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    let (run, workers) = Run::start(Target::nodes(&ports), merchants, WORKERS_PER_MERCHANT, &mut rng);
    // The joiner takes requests once it runs.
    run.target.set_alive(NODES, false);

    let mut webhooks_read = vec![0; MERCHANTS];
    for cycle in 1..=cycles {
        run.cycle.set(cycle);
        run.target.open();
        sleep_ms(rng.gen_range(300..1_200)).await;
        let victim = a_merchants_holder(&db.url, &run, &mut rng).await;
        let (dead, other) = (format!("node-{victim}"), format!("node-{}", 1 - victim));
        let what = if cycle % 4 == 1 {
            let server = servers[victim].take().expect("the node runs");
            run.target.set_alive(victim, false);
            server.kill().unwrap_or_else(|e| panic!("seed {seed}, cycle {cycle}: {e}"));
            // The load goes on against the other node, through the failover: the dead node's merchants answer
            // 503. Either the survivor takes them over once their leases end, then sends again what the dead
            // node had asked providers and delivers its notifications; or the dead node comes back first,
            // within its leases, and takes its own shards back under new tokens.
            if rng.gen_bool(0.5) {
                until_held(&db.url, &other, SHARDS, seed, &format!("cycle {cycle}, {dead} killed")).await;
                sleep_ms(rng.gen_range(1_000..3_000)).await;
            } else {
                sleep_ms(rng.gen_range(1_000..4_000)).await;
            }
            run.target.close();
            run.target.quiesce().await;
            servers[victim] = Some(nodes[victim].start(dir.path()).await);
            run.target.set_alive(victim, true);
            format!("killing node {victim}")
        } else if cycle % 4 == 0 {
            let (proxy, cut) = (&proxies[victim], &dead);
            proxy.cut();
            // The load goes on against both nodes. The cut node's own merchants answer 503 (its writes time out,
            // then it lets their leases go) until the other takes them over; what it forwards goes on.
            sleep_ms(rng.gen_range(3_000..6_000)).await;
            until_held(&db.url, &other, SHARDS, seed, &format!("cycle {cycle}, {cut} cut")).await;
            let before = proxy.carried();
            sleep_ms(rng.gen_range(500..1_500)).await;
            assert_eq!(proxy.carried(), before, "seed {seed}: the cut proxy carried bytes");
            proxy.heal();
            // Back, it reconnects on its own and takes its share of the shards again.
            until_held(&db.url, cut, 1, seed, &format!("cycle {cycle}, {cut} healed")).await;
            sleep_ms(rng.gen_range(1_000..3_000)).await;
            run.target.close();
            run.target.quiesce().await;
            let server = servers[victim].as_ref().expect("the node runs");
            let said = |needle: &str| server.output().iter().filter(|line| line.contains(needle)).count();
            println!(
                "  cycle {cycle}: node {victim} cut off the database: {} lease rounds failed, {} group commits failed",
                said("renewing the shard leases"),
                said("a PostgreSQL group commit failed")
            );
            format!("cutting node {victim} off the database")
        } else if cycle % 4 == 3 {
            // The database crashes and comes back under load (when it is this process's own: a server named by
            // CAISSE_TEST_DATABASE_URL is not restarted). Commits in flight fail or are kept; answers say which,
            // or are lost and retried.
            // On a thread of its own: the load runs on this test's one thread and keeps going meanwhile.
            let restart = std::thread::spawn(postgres::restart_immediately);
            while !restart.is_finished() {
                sleep_ms(20).await;
            }
            if !restart.join().expect("the restart thread") {
                println!("  cycle {cycle}: the database is CAISSE_TEST_DATABASE_URL's, not restarted");
                run.target.close();
                run.target.quiesce().await;
                continue;
            }
            sleep_ms(rng.gen_range(1_000..3_000)).await;
            let noticed: usize = servers
                .iter()
                .flatten()
                .map(|s| s.output().iter().filter(|l| l.contains("PostgreSQL") || l.contains("group commit")).count())
                .sum();
            println!("  cycle {cycle}: the database restarted; {noticed} log lines of the nodes about it");
            run.target.close();
            run.target.quiesce().await;
            "restarting the database".to_owned()
        } else {
            let server = servers[victim].as_ref().expect("the node runs");
            server.pause(true);
            // Past the frozen node's leases (10 s) and the other's next round: the other holds every merchant
            // and writes for them. Requests sent to the frozen node wait on its sockets.
            until_held(&db.url, &other, SHARDS, seed, &format!("cycle {cycle}, {dead} frozen")).await;
            sleep_ms(rng.gen_range(1_000..3_000)).await;
            server.pause(false);
            // Woken, it answers what waited (its actors still think they hold their merchants) while the load
            // goes on against both nodes.
            sleep_ms(rng.gen_range(1_000..3_000)).await;
            run.target.close();
            run.target.quiesce().await;
            let said = |needle: &str| server.output().iter().filter(|line| line.contains(needle)).count();
            println!(
                "  node {victim} woke: {} lease rounds found shards lost, {} group commits refused by the fence",
                said("shard leases were lost"),
                said("refused the writes of shards")
            );
            format!("freezing node {victim}")
        };
        let when = format!("after {what} in cycle {cycle}");
        check_all(&run, cycle, &mut webhooks_read, seed, &when).await;
    }

    // A third node joins under load: the shards spread over the three, moving between nodes while requests
    // go to all of them; a move costs at most retriable 503s.
    run.cycle.set(cycles + 1);
    run.target.open();
    sleep_ms(500).await;
    servers[NODES] = Some(nodes[NODES].start(dir.path()).await);
    run.target.set_alive(NODES, true);
    // A node takes at most its share, rounded up; so the last to fill holds at least what the others leave.
    let least = SHARDS - NODES * SHARDS.div_ceil(NODES + 1);
    for node in 0..=NODES {
        until_held(&db.url, &format!("node-{node}"), least, seed, "a third node joined").await;
    }
    sleep_ms(1_000).await;
    run.target.stop();
    for worker in workers {
        worker.await.expect("a worker ends");
    }
    run.target.quiesce().await;
    let settled = checks::settle(&run).await;
    check_all(&run, 0, &mut webhooks_read, seed, "at the end").await;
    every_implied_notification_is_acknowledged(&run, &settled, seed).await;
    // An attempt whose outcome could not be saved (the database was restarting) is held for up to a minute,
    // then sent again and saved: wait for the database to hold every notification delivered.
    let store = PgStore::open(&db.url).expect("open the cluster's database");
    let waiting = Instant::now();
    loop {
        let pending = pending_notifications(&store, &run);
        if pending == 0 {
            break;
        }
        assert!(waiting.elapsed() < SAVED_DEADLINE, "seed {seed}: {pending} notifications still pending");
        sleep_ms(500).await;
    }
    let deliveries = deliveries_once_quiet(&run).await;
    for server in servers.into_iter().flatten() {
        server.kill().unwrap_or_else(|e| panic!("seed {seed}, the last kill: {e}"));
    }
    let stored = store::check_opened_store(&store, &run)
        .unwrap_or_else(|wrong| panic!("seed {seed}, the database: {} failures:\n{}", wrong.len(), wrong.join("\n")));
    println!(
        "cluster crash test: seed {seed}, {cycles} cycles (a kill, a freeze, a database restart, a cut, in turn), then a \
         third node, {:.1} s, {stored} notifications stored, {deliveries} verified deliveries",
        started.elapsed().as_secs_f64()
    );
    crate::report(&run, stored, deliveries);
}
