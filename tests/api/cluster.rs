//! The API on a node of a cluster: the nodes forward a merchant's messages to its holder, signed, with the
//! forwarding protocol named, and a node refuses a message of another protocol (a build that lays messages out
//! otherwise) with `503 unavailable` and `Retry-After`, the answer a client retries, rather than reading it.
//! Merchants managed with `caisse merchant` beside the running nodes are seen by all of them.

use caisse_engine::cluster::{Forwarding, CONTENT_TYPE, FORWARD_PATH, PROTOCOL, VERSION_HEADER};
use caisse_engine::domain::time::Timestamp;

use std::time::Duration;

use crate::support::{caisse_beside, eventually, postgres, spawn_cluster_node, text};

#[actix_web::test]
async fn a_node_reads_forwarded_messages_of_its_own_protocol_only() {
    let db = postgres::database();
    let node = spawn_cluster_node(&db, "node-a").await;
    let secret = postgres::query_value(&db.url, "SELECT secret FROM caisse_cluster");
    let forwarding = Forwarding::new(&secret);
    // Not a message of any protocol: the holder answers it with an error of its own encoding.
    let body = b"\xff\xff\xff".to_vec();
    let signed = || forwarding.sign(Timestamp::now().unix_ms(), &body);
    let forward = |protocol: &str, authorization: &str| {
        node.api
            .post(FORWARD_PATH)
            .no_auth()
            .header("authorization", authorization)
            .header(VERSION_HEADER, protocol)
            .raw(Some(CONTENT_TYPE), body.clone())
    };

    let first = signed();
    let ours = node.api.fetch(forward(PROTOCOL, &first)).await;
    assert_eq!(ours.status, 200, "{:?}", ours.body);
    assert_eq!(ours.header("content-type"), Some(CONTENT_TYPE));

    for other in ["caisse-forward/1", "0.1.0/1", ""] {
        let refused = node.api.fetch(forward(other, &signed())).await;
        assert_eq!(refused.status, 503, "protocol {other:?}: {:?}", refused.body);
        assert_eq!(refused.json["error"]["code"], "unavailable");
        assert_eq!(refused.header("retry-after"), Some("2"), "a 503 says when to retry");
    }

    // Without a signature under the cluster's secret the endpoint does not exist, whatever the protocol: the
    // secret itself, a signature seen before, one of another body or another cluster, one too old.
    let other_cluster = Forwarding::new("not-the-secret");
    let old = forwarding.sign(Timestamp::now().unix_ms() - 120_000, &body);
    let other_body = forwarding.sign(Timestamp::now().unix_ms(), b"other");
    for stranger in
        [format!("Bearer {secret}"), first, other_cluster.sign(Timestamp::now().unix_ms(), &body), old, other_body]
    {
        let refused = node.api.fetch(forward(PROTOCOL, &stranger)).await;
        assert_eq!(refused.status, 404, "{stranger}");
    }
}

/// `caisse merchant` run beside the nodes, on the shared database (no admin token: it writes there
/// directly). A merchant it makes is served by every node at once; a suspension it makes is enforced by
/// every node within a few seconds, though both had the merchant's key cached from requests they served, and
/// a resume likewise.
#[actix_web::test]
async fn merchants_made_and_suspended_beside_the_running_nodes_are_seen_by_every_node() {
    let db = postgres::database();
    let a = spawn_cluster_node(&db, "node-a").await;
    let b = spawn_cluster_node(&db, "node-b").await;
    let work = tempfile::tempdir().expect("work dir");
    let caisse = |args: &[&str]| {
        let output = caisse_beside(&db, work.path()).args(args).output().expect("caisse runs");
        assert!(output.status.success(), "caisse {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let printed = caisse(&["merchant", "create", "--name", "Kiosque", "--email", "kiosque@example.com", "--json"]);
    let created: serde_json::Value = serde_json::from_str(printed.trim()).expect("one JSON object");
    let (id, key) = (text(&created["id"]).to_owned(), text(&created["secret_key"]).to_owned());
    let nodes = [a.api.with_key(&key), b.api.with_key(&key)];
    for (node, api) in nodes.iter().enumerate() {
        let balances = api.send(api.get("/v1/soldes")).await;
        assert_eq!(balances.status, 200, "node {node} serves the new merchant at once: {:?}", balances.json);
    }

    caisse(&["merchant", "suspend", &id]);
    for (node, api) in nodes.iter().enumerate() {
        eventually(&format!("node {node} refuses the suspended merchant"), Duration::from_secs(15), || async {
            let answer = api.send(api.get("/v1/soldes")).await;
            match (answer.status, answer.json["error"]["code"].as_str()) {
                (403, Some("merchant_suspended")) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
    caisse(&["merchant", "resume", &id]);
    for (node, api) in nodes.iter().enumerate() {
        eventually(&format!("node {node} serves the resumed merchant"), Duration::from_secs(15), || async {
            let answer = api.send(api.get("/v1/soldes")).await;
            (answer.status == 200).then_some(()).ok_or(format!("{} {:?}", answer.status, answer.json))
        })
        .await;
    }
}

/// A node cut off the database with nothing to write says so: its ping answers 503 once its leases may have
/// run out (its rounds fail for a lease's length), and 200 again once it reaches the database. The node is a
/// process of its own, reached through a proxy the test cuts (silence, not an error).
#[actix_web::test]
async fn an_idle_node_cut_off_the_database_answers_its_ping_503_until_it_is_back() {
    let db = postgres::database();
    let proxy = crate::support::proxy::Proxy::start(&db.server_address());
    let work = tempfile::tempdir().expect("work dir");
    let port = crate::support::free_port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_caisse"))
        .current_dir(work.path())
        .env("CAISSE_STORE", db.url_via(proxy.port))
        .env("CAISSE_NODE_ID", "node-a")
        .env("CAISSE_LISTEN", format!("127.0.0.1:{port}"))
        .env("CAISSE_ADVERTISE_URL", format!("http://127.0.0.1:{port}"))
        .env("CAISSE_DATA_DIR", work.path().join("data"))
        .env("CAISSE_LOG", "warn")
        .env_remove("CAISSE_ADMIN_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .arg("serve")
        .spawn()
        .expect("caisse serve starts");
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _node = Killed(child);
    let client = awc::Client::builder().timeout(Duration::from_secs(5)).finish();
    let ping = || async {
        let answer = client.get(format!("http://127.0.0.1:{port}/v1/ping")).send().await;
        answer.map(|a| a.status().as_u16()).map_err(|e| e.to_string())
    };
    let answers = |wanted: u16| {
        move |answer: Result<u16, String>| match answer {
            Ok(status) if status == wanted => Ok(()),
            other => Err(format!("{other:?}")),
        }
    };
    eventually("the node to serve", Duration::from_secs(30), || async { answers(200)(ping().await) }).await;
    proxy.cut();
    eventually("the cut node's ping to answer 503", Duration::from_secs(25), || async { answers(503)(ping().await) })
        .await;
    proxy.heal();
    eventually("its ping to answer 200 again", Duration::from_secs(25), || async { answers(200)(ping().await) }).await;
}
