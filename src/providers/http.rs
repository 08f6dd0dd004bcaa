//! Outbound calls to provider APIs: one bounded, observable way to send a request and read its answer.
//!
//! Every call has a deadline covering the whole exchange (awc's own timeout stops at the response headers),
//! a cap on the answer's size, no redirects (a provider that redirects an API call is misconfigured, and
//! following it could send credentials elsewhere), and a bounded number of calls in flight per adapter. Calls
//! that create something carry the provider's idempotency id, so they are retried on a timeout, a 5xx or a
//! 429 with the same id, a few times with growing, jittered waits. After several failures in a row an
//! adapter's circuit opens: calls fail at once for a while instead of piling up on a provider that is down,
//! and the log says which adapter is degraded. Nothing here decides what an answer means; the adapters do.
//!
//! awc's client is not `Send`, so each actix thread keeps its own, made on first use.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use awc::http::{Method, StatusCode};
use rand::Rng;

use super::ProviderError;
use crate::metrics::METRICS;

/// The whole exchange, connect to last byte of the answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// A provider's answer larger than this is not one of theirs.
const MAX_ANSWER_BYTES: usize = 256 * 1024;
/// Attempts of an idempotent call (the first included).
const MAX_ATTEMPTS: u32 = 3;
/// First wait before a retry; doubled each time, plus up to as much again of jitter.
const RETRY_BASE: Duration = Duration::from_millis(250);
/// Failures in a row that open an adapter's circuit, and how long it stays open.
const CIRCUIT_FAILURES: u32 = 5;
const CIRCUIT_OPEN: Duration = Duration::from_secs(30);
/// Calls one adapter may have in flight at once; beyond it callers wait (the sweeps and the API alike).
const CALLS_IN_FLIGHT: usize = 32;

thread_local! {
    static CLIENT: awc::Client = client();
}

fn client() -> awc::Client {
    caisse_engine::outbound::client(CALL_TIMEOUT, "provider")
}

/// A provider's answer: status and body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Result<serde_json::Value, ProviderError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| ProviderError::Unreachable(format!("answer {} is not JSON: {e}", self.status)))
    }
}

/// One request to send.
#[derive(Clone)]
pub struct Call<'a> {
    pub method: Method,
    pub url: String,
    pub headers: Vec<(&'a str, String)>,
    pub body: Option<serde_json::Value>,
    /// True when repeating it cannot create a second transaction (it carries the idempotency id, or reads).
    pub idempotent: bool,
}

/// Per adapter: calls in flight and the circuit.
pub struct Outbound {
    name: &'static str,
    permits: Arc<tokio::sync::Semaphore>,
    failures: AtomicU32,
    open_until_ms: AtomicU64,
}

impl Outbound {
    pub fn new(name: &'static str) -> Outbound {
        Outbound {
            name,
            permits: Arc::new(tokio::sync::Semaphore::new(CALLS_IN_FLIGHT)),
            failures: AtomicU32::new(0),
            open_until_ms: AtomicU64::new(0),
        }
    }

    /// True while the circuit is open: the provider failed repeatedly and is left alone for a while.
    pub fn degraded(&self) -> bool {
        now_ms() < self.open_until_ms.load(Ordering::Acquire)
    }

    /// Sends `call`, retrying an idempotent one on a timeout, a 5xx or a 429. Any answer the provider gave
    /// (4xx and the last 5xx included) is returned for the adapter to read; `Err` means no answer at all.
    pub async fn send(&self, call: Call<'_>) -> Result<Answer, ProviderError> {
        self.send_with(call, None).await
    }

    /// Sends a form (`application/x-www-form-urlencoded`), as CinetPay's Transfer API wants; repeated like an
    /// idempotent call (its requests carry our id, or only read).
    pub async fn send_form(
        &self,
        method: Method,
        url: String,
        headers: Vec<(&'static str, String)>,
        form: Option<Vec<(&'static str, String)>>,
    ) -> Result<Answer, ProviderError> {
        let call = Call { method, url, headers, body: None, idempotent: true };
        self.send_with(call, form.as_deref()).await
    }

    async fn send_with(
        &self,
        call: Call<'_>,
        form: Option<&[(&'static str, String)]>,
    ) -> Result<Answer, ProviderError> {
        if self.degraded() {
            METRICS.provider_call(self.name, "circuit_open");
            return Err(ProviderError::Unreachable(format!("{} is degraded; calls resume shortly", self.name)));
        }
        let _permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ProviderError::Unreachable("the adapter is shutting down".into()))?;
        let attempts = if call.idempotent { MAX_ATTEMPTS } else { 1 };
        let mut last = Err(ProviderError::Unreachable("not sent".into()));
        for attempt in 0..attempts {
            if attempt > 0 {
                let wait = RETRY_BASE * 2u32.pow(attempt - 1);
                let jitter = rand::thread_rng().gen_range(0..=wait.as_millis() as u64);
                actix_web::rt::time::sleep(wait + Duration::from_millis(jitter)).await;
            }
            last = self.once(&call, form).await;
            let retry = match &last {
                Ok(answer) => answer.status.is_server_error() || answer.status == StatusCode::TOO_MANY_REQUESTS,
                Err(_) => true,
            };
            if !retry {
                break;
            }
        }
        self.record(&last);
        let outcome = match &last {
            Ok(answer) if answer.status.is_server_error() || answer.status == StatusCode::TOO_MANY_REQUESTS => {
                "http_error"
            }
            Ok(_) => "ok",
            Err(_) => "unreachable",
        };
        METRICS.provider_call(self.name, outcome);
        last
    }

    async fn once(&self, call: &Call<'_>, form: Option<&[(&'static str, String)]>) -> Result<Answer, ProviderError> {
        let exchange = async {
            let mut request = CLIENT.with(|c| c.request(call.method.clone(), &call.url));
            for (name, value) in &call.headers {
                request = request.insert_header((*name, value.as_str()));
            }
            let mut response = match (&call.body, form) {
                (_, Some(form)) => request.send_form(&form).await,
                (Some(body), None) => request.send_json(body).await,
                (None, None) => request.send().await,
            }
            .map_err(|e| ProviderError::Unreachable(format!("{} {}: {e}", call.method, shown(&call.url))))?;
            let status = response.status();
            let body = response.body().limit(MAX_ANSWER_BYTES).await.map_err(|e| {
                ProviderError::Unreachable(format!("{} {}: reading the answer: {e}", call.method, shown(&call.url)))
            })?;
            Ok(Answer { status, body: body.to_vec() })
        };
        match actix_web::rt::time::timeout(CALL_TIMEOUT, exchange).await {
            Ok(result) => result,
            Err(_) => Err(ProviderError::Unreachable(format!(
                "{} {}: no answer within {CALL_TIMEOUT:?}",
                call.method,
                shown(&call.url)
            ))),
        }
    }

    fn record(&self, result: &Result<Answer, ProviderError>) {
        let failed = match result {
            Ok(answer) => answer.status.is_server_error(),
            Err(_) => true,
        };
        if !failed {
            self.failures.store(0, Ordering::Release);
            return;
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures >= CIRCUIT_FAILURES {
            self.failures.store(0, Ordering::Release);
            self.open_until_ms.store(now_ms() + CIRCUIT_OPEN.as_millis() as u64, Ordering::Release);
            tracing::error!(adapter = self.name, failures, "provider failing: calls paused for {CIRCUIT_OPEN:?}");
        }
    }
}

/// A URL as errors and logs show it: without its query string, which may carry a token (CinetPay's Transfer API).
fn shown(url: &str) -> &str {
    url.split('?').next().unwrap_or(url)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_failures_open_the_circuit_and_a_success_resets_the_count() {
        let outbound = Outbound::new("test");
        let failed = || Err(ProviderError::Unreachable("down".into()));
        let ok = || Ok(Answer { status: StatusCode::OK, body: Vec::new() });
        for _ in 0..CIRCUIT_FAILURES - 1 {
            outbound.record(&failed());
        }
        outbound.record(&ok());
        for _ in 0..CIRCUIT_FAILURES - 1 {
            outbound.record(&failed());
        }
        assert!(!outbound.degraded(), "a success in between resets the count");
        outbound.record(&Ok(Answer { status: StatusCode::BAD_GATEWAY, body: Vec::new() }));
        assert!(outbound.degraded(), "{CIRCUIT_FAILURES} failures in a row open it");
    }

    #[actix_web::test]
    async fn an_open_circuit_fails_calls_at_once() {
        let outbound = Outbound::new("test");
        outbound.open_until_ms.store(now_ms() + 60_000, Ordering::Release);
        let call = Call {
            method: Method::GET,
            url: "http://127.0.0.1:9/x".into(),
            headers: Vec::new(),
            body: None,
            idempotent: true,
        };
        // Nothing listens on port 9: reaching it would fail differently; the circuit answers first.
        assert!(matches!(outbound.send(call).await, Err(ProviderError::Unreachable(why)) if why.contains("degraded")));
    }
}
