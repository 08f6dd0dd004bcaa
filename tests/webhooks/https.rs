//! Delivery over HTTPS: a receiver whose self-signed certificate is in `webhook_extra_ca` gets its webhooks;
//! one whose certificate nobody trusts gets nothing, and the failure is logged.

use caisse_engine::domain::records::DeliveryState;

use crate::delivery::{assert_signed, self_signed};
use crate::support::*;

#[actix_web::test]
async fn an_https_receiver_with_a_trusted_self_signed_certificate_gets_its_webhooks() {
    let certs = tempfile::TempDir::new().expect("temp dir");
    let trusted_pem = certs.path().join("receiver.pem");
    let trusted = Receiver::start_tls(always(200), self_signed(&trusted_pem));
    // Same names, another key: only the first certificate is trusted.
    let stranger = Receiver::start_tls(always(200), self_signed(&certs.path().join("stranger.pem")));
    let app = spawn_app_with(|s| {
        s.webhook_retry_schedule_ms = vec![200];
        s.webhook_extra_ca = Some(trusted_pem.clone());
    })
    .await;
    assert!(trusted.base.starts_with("https://localhost:"), "{}", trusted.base);
    let merchant = app.create_merchant("Secure", Some(&format!("{}/hook", trusted.base))).await.merchant;
    let other = app.create_merchant("Untrusted", Some(&format!("{}/hook", stranger.base))).await.merchant;
    let reference = reference_of(&app.with_key(&merchant.secret_key).fund(10_000).await);
    app.with_key(&other.secret_key).fund(10_000).await;

    let log = app.wait_notifications(&merchant.id, 3, DEADLINE, |n| n.state == DeliveryState::Delivered).await;
    let hits = trusted.hits();
    assert_eq!(hits.len(), 3);
    for hit in &hits {
        assert_signed(hit, &merchant.secret_key);
        assert_eq!(hit.reference(), reference);
        assert!(log.iter().any(|n| n.body.as_bytes() == hit.body.as_slice()));
    }

    let refused = app.wait_notifications(&other.id, 3, DEADLINE, |n| n.state == DeliveryState::Failed).await;
    for n in &refused {
        assert_eq!(n.total_attempts, 2, "{}", describe(&refused));
        assert!(n.attempts.iter().all(|a| a.http_status.is_none() && a.error.is_some()), "{:?}", n.attempts);
    }
    assert!(stranger.hits().is_empty(), "no request reaches a receiver whose certificate is not trusted");
}
