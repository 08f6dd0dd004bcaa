//! `GET /metrics`: Prometheus text with the metrics operators alert on, moving with the traffic.

use crate::start;

/// The value of the sample whose line starts with `series` (labels included), 0 when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse::<f64>().ok()))
        .unwrap_or(0.0)
}

#[actix_web::test]
async fn metrics_are_present_and_move_with_the_traffic() {
    let (app, admin) = start().await;
    let read = || async {
        let answer = admin.fetch(admin.get("/metrics")).await;
        answer.expect(200);
        assert!(answer.header("content-type").unwrap_or_default().starts_with("text/plain"));
        String::from_utf8(answer.body.to_vec()).expect("text")
    };
    let before = read().await;
    for name in [
        "caisse_http_requests_total",
        "caisse_http_request_duration_seconds",
        "caisse_payments_total",
        "caisse_webhook_deliveries_total",
        "caisse_webhook_queue_depth",
        "caisse_provider_requests_total",
        "caisse_store_commit_duration_seconds",
        "caisse_store_lost_commit_answers_total",
        "caisse_merchant_actors",
        "caisse_ledger_audits_total",
        "caisse_ledger_audit_failing",
        "caisse_ledger_audit_last_pass_timestamp_seconds",
        "caisse_ledger_audit_events",
    ] {
        assert!(before.contains(&format!("# TYPE {name} ")), "{name} missing:\n{before}");
    }
    let pings = "caisse_http_requests_total{route=\"/v1/ping\",status=\"200\"}";
    let initiations = "caisse_http_requests_total{route=\"/v1/paiement/initier\",status=\"201\"}";
    let succeeded = "caisse_payments_total{fournisseur=\"mtn_momo\",statut=\"succes\"}";
    let commits = "caisse_store_commit_duration_seconds_count";

    app.send(app.get("/v1/ping")).await.expect(200);
    app.fund(5_000).await;
    let after = read().await;
    // Other tests in this process move the same counters: only "at least" holds.
    assert!(sample(&after, pings) >= sample(&before, pings) + 1.0, "{after}");
    assert!(sample(&after, initiations) >= sample(&before, initiations) + 1.0, "{after}");
    assert!(sample(&after, succeeded) >= sample(&before, succeeded) + 1.0, "{after}");
    assert!(sample(&after, commits) >= sample(&before, commits) + 2.0, "{after}");
    assert!(sample(&after, "caisse_merchant_actors") >= 1.0, "{after}");
}
