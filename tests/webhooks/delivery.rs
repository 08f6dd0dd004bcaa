//! What every webhook delivery must be (docs/api.md § Webhook body and § Webhook signature), and the certificate of
//! the HTTPS receivers. The receiver itself is the shared harness's ([`crate::support::Receiver`]).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use caisse_engine::domain::time::Timestamp;
use serde_json::Value;

use crate::support::Hit;

/// A self-signed certificate for `localhost` and 127.0.0.1: the receiver's config and the certificate's PEM.
pub fn self_signed(pem_path: &Path) -> rustls::ServerConfig {
    let rcgen::CertifiedKey { cert, key_pair } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).expect("certificate");
    std::fs::write(pem_path, cert.pem()).expect("PEM written");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key_pair.serialize_der().into());
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .expect("server certificate")
}

/// docs/api.md § Webhook signature: a POST of JSON, signed with `key` over the raw body, with a timestamp taken when it was
/// sent (within a second or two of its arrival).
#[track_caller]
pub fn assert_signed(hit: &Hit, key: &str) {
    assert_eq!(hit.method, "POST");
    assert_eq!(hit.header("content-type"), Some("application/json"), "{:?}", hit.headers);
    let signature = hit.header("x-service-signature").expect("X-Service-Signature");
    let timestamp = hit.header("x-service-timestamp").expect("X-Service-Timestamp");
    assert!(
        signature.starts_with("sha256=")
            && signature.len() == 71
            && signature[7..].bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "`sha256=` + lowercase hex: {signature}"
    );
    assert!(timestamp.bytes().all(|b| b.is_ascii_digit()), "Unix seconds as text: {timestamp}");
    assert_eq!(caisse_engine::webhook::verify(key, signature, timestamp, &hit.body, hit.at_unix_s), Ok(()));
    // The Standard Webhooks headers beside the spec's (docs/api.md § Webhook signature), over the same timestamp.
    let id = hit.header("webhook-id").expect("webhook-id");
    assert!(id.starts_with("evt_") && id.len() == 30, "webhook-id is the notification's id: {id}");
    assert_eq!(hit.header("webhook-timestamp"), Some(timestamp));
    let standard = hit.header("webhook-signature").expect("webhook-signature");
    assert!(standard.starts_with("v1,"), "{standard}");
    assert_eq!(caisse_engine::webhook::verify_standard(key, id, standard, timestamp, &hit.body, hit.at_unix_s), Ok(()));
    assert!(hit.timestamp().abs_diff(hit.at_unix_s) <= 2, "fresh timestamp: {timestamp} vs arrival {}", hit.at_unix_s);
}

/// docs/api.md § Webhook body: exactly `event`, `created_at`, `data`; `data` exactly the eleven fields, with
/// their types. Returns `data`.
#[track_caller]
pub fn assert_shape(body: &Value, event: &str) -> Value {
    let top = body.as_object().unwrap_or_else(|| panic!("not an object: {body}"));
    assert_eq!(
        top.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        BTreeSet::from(["event", "created_at", "data"])
    );
    assert_eq!(body["event"], event);
    assert_rfc3339(&body["created_at"]);
    let data = body["data"].as_object().unwrap_or_else(|| panic!("data is not an object: {body}"));
    let fields = [
        "reference",
        "transaction_id",
        "fournisseur",
        "montant",
        "devise",
        "frais",
        "montant_net",
        "statut",
        "client_email",
        "metadata",
        "paid_at",
    ];
    // `payment.refunded` adds the refunded total (docs/api.md § Webhook body); every other event has the spec's eleven.
    let mut expected = BTreeSet::from(fields);
    if event == "payment.refunded" {
        expected.insert("montant_rembourse");
        assert!(data.get("montant_rembourse").and_then(Value::as_i64).is_some_and(|m| m > 0), "{body}");
    }
    assert_eq!(data.keys().map(String::as_str).collect::<BTreeSet<_>>(), expected, "{body}");
    for field in ["reference", "transaction_id", "fournisseur", "devise", "statut"] {
        assert!(data[field].as_str().is_some_and(|s| !s.is_empty()), "{field}: {body}");
    }
    let (amount, fee, net) = (data["montant"].as_i64(), data["frais"].as_i64(), data["montant_net"].as_i64());
    let (Some(amount), Some(fee), Some(net)) = (amount, fee, net) else { panic!("amounts are integers: {body}") };
    assert!(amount > 0 && fee >= 0 && net == amount - fee, "montant_net = montant - frais: {body}");
    assert!(data["client_email"].is_null() || data["client_email"].is_string(), "{body}");
    assert!(data["metadata"].is_object(), "{body}");
    if !data["paid_at"].is_null() {
        assert_rfc3339(&data["paid_at"]);
    }
    Value::Object(data.clone())
}

#[track_caller]
fn assert_rfc3339(v: &Value) {
    let text = v.as_str().unwrap_or_else(|| panic!("not a string: {v}"));
    assert!(text.ends_with('Z') && Timestamp::parse_rfc3339(text).is_ok(), "RFC 3339 UTC: {text}");
}
