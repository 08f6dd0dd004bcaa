//! The API on a node of a cluster: the nodes forward a merchant's messages to its holder with the forwarding
//! protocol named, and a node refuses a message of another protocol (a build that lays messages out
//! otherwise) with `503 unavailable` and `Retry-After`, the answer a client retries, rather than reading it.

use caisse_engine::cluster::{CONTENT_TYPE, FORWARD_PATH, PROTOCOL, VERSION_HEADER};

use crate::support::{postgres, spawn_cluster_node};

#[actix_web::test]
async fn a_node_reads_forwarded_messages_of_its_own_protocol_only() {
    let db = postgres::database();
    let node = spawn_cluster_node(&db, "node-a").await;
    let secret = postgres::query_value(&db.url, "SELECT secret FROM caisse_cluster");
    let forward = |protocol: &str| {
        node.api
            .post(FORWARD_PATH)
            .auth(&secret)
            .header(VERSION_HEADER, protocol)
            // Not a message of any protocol: the holder answers it with an error of its own encoding.
            .raw(Some(CONTENT_TYPE), b"\xff\xff\xff".to_vec())
    };

    let ours = node.api.fetch(forward(PROTOCOL)).await;
    assert_eq!(ours.status, 200, "{:?}", ours.body);
    assert_eq!(ours.header("content-type"), Some(CONTENT_TYPE));

    for other in ["caisse-forward/1", "0.1.0/1", ""] {
        let refused = node.api.fetch(forward(other)).await;
        assert_eq!(refused.status, 503, "protocol {other:?}: {:?}", refused.body);
        assert_eq!(refused.json["error"]["code"], "unavailable");
        assert_eq!(refused.header("retry-after"), Some("2"), "a 503 says when to retry");
    }

    // Without the cluster's secret the endpoint does not exist, whatever the protocol.
    let stranger = node.api.fetch(forward(PROTOCOL).auth("not-the-secret")).await;
    assert_eq!(stranger.status, 404);
}
