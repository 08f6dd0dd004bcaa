//! Reading a request: the merchant behind the bearer key, the JSON body (size, content type, shape), the
//! query string, and the idempotency key. Each turns bad input into the API's 4xx, never a 500.

use std::collections::BTreeMap;

use actix_web::http::header::HeaderMap;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::Merchant;
use caisse_engine::domain::text::IdempotencyKey;
use caisse_engine::domain::time::Timestamp;
use caisse_engine::{Executed, Idempotency, Part, Record};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::AppState;
use crate::config::Environment;

/// Largest request body accepted; a larger one is answered 413 `payload_too_large`.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// How long a whole body may take to arrive. actix-web bounds the wait for a request's head (its client
/// request timeout) but not for its body: without this, a client that announces a body and never sends it
/// would hold its connection and its handler for ever.
pub const BODY_TIMEOUT_MS: u64 = 10_000;
const KEY_RANDOM_LEN: usize = 32;

/// Checks `Authorization: Bearer <secret key>` and returns the merchant.
///
/// The key is looked up by its SHA-256 (the lookup's timing depends only on the hash) and then compared whole
/// in constant time. A well-formed key of the other environment gets `wrong_environment`, so a merchant who
/// pasted the wrong key learns why.
pub fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Merchant, ApiError> {
    let header = headers
        .get("authorization")
        .ok_or_else(|| ApiError::unauthorized("missing Authorization: Bearer <secret key>"))?
        .to_str()
        .map_err(|_| ApiError::unauthorized("Authorization must be printable ASCII: Bearer <secret key>"))?;
    let key = bearer_token(header)
        .ok_or_else(|| ApiError::unauthorized("the Authorization header must be Bearer <secret key>"))?;
    let env = state.settings.environment;
    let other = match env {
        Environment::Sandbox => Environment::Production.key_prefix(),
        Environment::Production => Environment::Sandbox.key_prefix(),
    };
    if let Some(rest) = key.strip_prefix(other) {
        if rest.len() == KEY_RANDOM_LEN && rest.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "wrong_environment",
                format!("this server is the {} environment; use a {}… key", env.as_str(), env.key_prefix()),
            ));
        }
    }
    let unknown = || ApiError::unauthorized("unknown secret key");
    let merchant = state.engine.merchant_by_key(key)?.ok_or_else(unknown)?;
    if !bool::from(merchant.secret_key.as_bytes().ct_eq(key.as_bytes())) {
        // The lookup by hash found the merchant, so this is a key it had: valid only within its roll's grace.
        let until = state.engine.retired_key_until(key)?.ok_or_else(unknown)?;
        if Timestamp::now() >= until {
            return Err(ApiError::unauthorized("this secret key was replaced; use the merchant's current key"));
        }
        tracing::info!(merchant = %merchant.id, "API call with a rolled key, within its grace");
    }
    if state.engine.suspended_since(&merchant.id)?.is_some() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "merchant_suspended",
            "this merchant account is suspended; contact the operator of this service",
        ));
    }
    state.rate_limiter.check(&merchant.id)?;
    Ok(merchant)
}

/// The credentials of an `Authorization: Bearer <credentials>` value. The scheme's name is case-insensitive
/// (RFC 9110 § 11.1): `bearer` and `BEARER` are `Bearer`.
pub fn bearer_token(header: &str) -> Option<&str> {
    let scheme = header.get(..7)?;
    scheme.eq_ignore_ascii_case("bearer ").then(|| header[7..].trim())
}

/// Reads the whole body, refusing more than [`MAX_BODY_BYTES`] as soon as it is exceeded.
pub async fn read_body(req: &HttpRequest, payload: web::Payload) -> Result<web::Bytes, ApiError> {
    read_body_within(req, payload, MAX_BODY_BYTES).await
}

/// [`read_body`] with another bound than the API's.
pub async fn read_body_within(
    req: &HttpRequest,
    mut payload: web::Payload,
    max: usize,
) -> Result<web::Bytes, ApiError> {
    let too_large =
        || ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", format!("the body exceeds {max} bytes"));
    let declared =
        req.headers().get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max as u64) {
        return Err(too_large());
    }
    let read = async move {
        let mut body = web::BytesMut::new();
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(|e| ApiError::invalid_json(format!("the body could not be read: {e}")))?;
            if body.len() + chunk.len() > max {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    };
    actix_web::rt::time::timeout(std::time::Duration::from_millis(BODY_TIMEOUT_MS), read).await.unwrap_or_else(|_| {
        Err(ApiError::invalid_json(format!("the body did not arrive within {} s", BODY_TIMEOUT_MS / 1000)))
    })
}

/// Checks the content type and parses the body into `T` (whose serde rules refuse unknown fields).
/// `optional`: an empty body (with or without a content type) parses as `{}`.
pub fn parse_json<T: DeserializeOwned>(req: &HttpRequest, body: &[u8], optional: bool) -> Result<T, ApiError> {
    let empty = body.iter().all(u8::is_ascii_whitespace);
    if !(optional && empty) {
        let is_json = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"));
        if !is_json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the body must be JSON with Content-Type: application/json",
            ));
        }
    }
    let body: &[u8] = if optional && empty { b"{}" } else { body };
    // The whole body must be JSON before its shape is judged: `{"montant": 1} garbage` is `invalid_json`,
    // not a missing field.
    serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(|e| json_error(".", &e))?;
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        json_error(&path, &inner)
    })?;
    de.end().map_err(|e| json_error(".", &e))?;
    Ok(value)
}

/// Syntax errors are `invalid_json`; a body of the wrong shape is `invalid_request` naming the field.
fn json_error(path: &str, err: &serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    match err.classify() {
        Category::Syntax | Category::Eof | Category::Io => {
            ApiError::invalid_json(format!("the body is not valid JSON: {err}"))
        }
        Category::Data => {
            let text = err.to_string();
            let quoted = text.split('`').nth(1).map(str::to_owned);
            let field = if text.starts_with("missing field") || text.starts_with("unknown field") {
                let name = quoted.unwrap_or_default();
                // An unknown field's path already ends at the field itself; a missing one's is its parent.
                if path == "." {
                    name
                } else if path == name || path.ends_with(&format!(".{name}")) {
                    path.to_owned()
                } else {
                    format!("{path}.{name}")
                }
            } else {
                path.to_owned()
            };
            let message = plain_words(text.split(" at line ").next().unwrap_or(&text));
            if field == "." || field.is_empty() {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
            } else {
                ApiError::invalid(field, message)
            }
        }
    }
}

/// serde's message with Rust's names for types replaced by words a merchant reads ("expected i64" becomes
/// "expected a whole number", "expected struct InitiateBody" becomes "expected an object").
fn plain_words(message: &str) -> String {
    let mut text = message.to_owned();
    if let Some(at) = text.find("expected struct ") {
        let rest = &text[at + "expected struct ".len()..];
        let end = rest.find(|c: char| !c.is_alphanumeric() && c != '_').unwrap_or(rest.len());
        text = format!("{}expected an object{}", &text[..at], &rest[end..]);
    }
    const NAMES: [(&str, &str); 12] = [
        ("expected i64", "expected a whole number"),
        ("expected i32", "expected a whole number"),
        ("expected u64", "expected a whole number, zero or more"),
        ("expected u32", "expected a whole number, zero or more"),
        ("expected u16", "expected a whole number, zero or more"),
        ("expected u8", "expected a whole number, zero or more"),
        ("expected f64", "expected a number"),
        ("expected a map", "expected an object"),
        ("expected a sequence", "expected a list"),
        ("expected a borrowed string", "expected a string"),
        ("invalid type: map", "invalid type: object"),
        ("invalid type: sequence", "invalid type: list"),
    ];
    for (rust, words) in NAMES {
        text = text.replace(rust, words);
    }
    text
}

/// The query string as a map, refusing repeated or unexpected parameters.
pub fn parse_query(req: &HttpRequest, allowed: &[&str]) -> Result<BTreeMap<String, String>, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(req.query_string())
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", format!("bad query string: {e}")))?;
    let mut map = BTreeMap::new();
    for (key, value) in pairs {
        if !allowed.contains(&key.as_str()) {
            return Err(ApiError::invalid(&key, format!("unknown query parameter; allowed: {}", allowed.join(", "))));
        }
        if map.insert(key.clone(), value).is_some() {
            return Err(ApiError::invalid(&key, "given more than once"));
        }
    }
    Ok(map)
}

/// The `Idempotency-Key` of a POST, with the fingerprint of the request it stands for.
pub fn idempotency(
    req: &HttpRequest,
    body: &[u8],
    success_status: StatusCode,
) -> Result<Option<Idempotency>, ApiError> {
    let Some(value) = req.headers().get("idempotency-key") else { return Ok(None) };
    let text = value.to_str().map_err(|_| ApiError::invalid("Idempotency-Key", "must be printable ASCII"))?;
    let key = IdempotencyKey::parse(text).map_err(|e| ApiError::invalid("Idempotency-Key", e.to_string()))?;
    let fingerprint = |bytes: &[u8]| {
        let mut hash = Sha256::new();
        hash.update(req.method().as_str().as_bytes());
        hash.update(b" ");
        hash.update(req.path().as_bytes());
        hash.update(b"\n");
        hash.update(bytes);
        hex::encode(hash.finalize())
    };
    // The parsed request, not its bytes: the same JSON with other whitespace or key order is the same
    // request. Its canonical form is serde_json's (object keys sorted, no spaces), marked so that it can never
    // equal a fingerprint of raw bytes.
    let canonical = serde_json::from_slice::<serde_json::Value>(body).ok().and_then(|v| serde_json::to_vec(&v).ok());
    let (fingerprint, earlier_fingerprint) = match canonical {
        Some(canonical) => (format!("json:{}", fingerprint(&canonical)), Some(fingerprint(body))),
        None => (fingerprint(body), None),
    };
    Ok(Some(Idempotency {
        key,
        fingerprint,
        earlier_fingerprint,
        success_status: success_status.as_u16(),
        part: Part::Only,
    }))
}

/// What a request the checks refused answers. When its key already has an answer, the checks met settings or
/// state changed since the first request was accepted (a link's `expire_at` now past, a provider turned off),
/// or the key is another request's: the first answer again, or 409 `idempotency_key_reused`, as the merchant's
/// actor would answer. Otherwise the refusal. Asked only once the checks refuse: a retry that passes them goes to
/// the actor, which also knows a first request still going on (409 `idempotency_key_in_use`), where the store
/// holds only the answer written at its start (which a retry the checks refuse meanwhile is given).
pub fn unless_answered(
    state: &AppState,
    merchant: &MerchantId,
    idem: Option<&Idempotency>,
    refused: ApiError,
) -> Result<Executed, ApiError> {
    match idem {
        Some(idem) => state.engine.replay(merchant, idem)?.ok_or(refused),
        None => Err(refused),
    }
}

/// The answer to a change: the record with `status`, or the first answer again for a replayed key.
pub fn respond(executed: Executed, status: StatusCode) -> Result<HttpResponse, ApiError> {
    match executed {
        Executed::Done(Record::Payment(p)) => Ok(HttpResponse::build(status).json(p)),
        Executed::Done(Record::Payout(o)) => Ok(HttpResponse::build(status).json(o)),
        Executed::Done(Record::Link(l)) => Ok(HttpResponse::build(status).json(l.as_of(Timestamp::now()))),
        Executed::Replayed { status, body } => {
            let status = StatusCode::from_u16(status).map_err(|e| ApiError::internal("idempotent replay", e))?;
            Ok(HttpResponse::build(status)
                .insert_header(("Idempotent-Replayed", "true"))
                .content_type("application/json")
                .body(body))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_types_in_plain_words() {
        assert_eq!(
            plain_words("invalid type: string \"abc\", expected i64"),
            "invalid type: string \"abc\", expected a whole number"
        );
        assert_eq!(
            plain_words("invalid type: sequence, expected struct InitiateBody"),
            "invalid type: list, expected an object"
        );
        let already = "invalid type: integer `5`, expected a string";
        assert_eq!(plain_words(already), already);
    }
}
