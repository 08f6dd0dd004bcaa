//! The server's metrics in Prometheus' text format (version 0.0.4), which the admin listener serves at
//! `GET /metrics`: the server's own counters (HTTP requests by route and status with their latency, provider
//! calls by adapter and outcome) and the engine's (`caisse_engine::metrics`: commit latency, payments,
//! webhooks, actors, ledger audits).
//!
//! The text format is small and fixed (`# HELP`, `# TYPE`, one line per series), so it is written here
//! rather than through a metrics library: the counters stay plain atomics next to what they measure.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use caisse_engine::metrics::{
    AuditResult, DeliveryResult, Histogram, HistogramSnapshot, LostCommit, METRICS as ENGINE,
};
use caisse_engine::store::AuditScope;
use dashmap::DashMap;

/// The server's counters.
#[derive(Default)]
pub struct ServerMetrics {
    /// By (route pattern, status). Routes are the API's patterns, so the label set stays small.
    requests: DashMap<(String, u16), AtomicU64>,
    durations: DashMap<String, Histogram>,
    /// By (adapter, outcome).
    provider_calls: DashMap<(String, &'static str), AtomicU64>,
}

pub static METRICS: LazyLock<ServerMetrics> = LazyLock::new(ServerMetrics::default);

impl ServerMetrics {
    /// One answered request; `route` is the matched pattern (`/v1/paiement/{reference}`), or `unmatched`.
    pub fn request(&self, route: &str, status: u16, elapsed: Duration) {
        bump(&self.requests, (route.to_owned(), status));
        match self.durations.get(route) {
            Some(h) => h.observe(elapsed),
            None => self.durations.entry(route.to_owned()).or_default().observe(elapsed),
        }
    }

    /// One call to a provider's API, retries included: `ok` (an answer that is not a 5xx or 429),
    /// `http_error` (5xx or 429 after the retries), `unreachable` (no answer, timeout), `circuit_open`.
    pub fn provider_call(&self, adapter: &str, outcome: &'static str) {
        bump(&self.provider_calls, (adapter.to_owned(), outcome));
    }
}

fn bump<K: std::hash::Hash + Eq>(map: &DashMap<K, AtomicU64>, key: K) {
    map.entry(key).or_default().fetch_add(1, Ordering::Relaxed);
}

/// Every metric, as Prometheus reads them.
pub fn text(actors: usize) -> String {
    let mut out = String::with_capacity(8 * 1024);
    let m = &*METRICS;

    header(&mut out, "caisse_http_requests_total", "counter", "HTTP requests answered, by route and status.");
    let mut rows: Vec<_> = m.requests.iter().map(|e| (e.key().clone(), e.value().load(Ordering::Relaxed))).collect();
    rows.sort();
    for ((route, status), n) in rows {
        let _ = writeln!(out, "caisse_http_requests_total{{route=\"{}\",status=\"{status}\"}} {n}", escape(&route));
    }

    header(&mut out, "caisse_http_request_duration_seconds", "histogram", "Time to answer an HTTP request.");
    let mut routes: Vec<_> = m.durations.iter().map(|e| (e.key().clone(), e.value().snapshot())).collect();
    routes.sort_by(|a, b| a.0.cmp(&b.0));
    for (route, snapshot) in routes {
        histogram(
            &mut out,
            "caisse_http_request_duration_seconds",
            &format!("route=\"{}\"", escape(&route)),
            &snapshot,
        );
    }

    header(&mut out, "caisse_payments_total", "counter", "Payments that reached a status, by fournisseur and statut.");
    let mut rows: Vec<_> =
        ENGINE.payments.iter().map(|e| (e.key().clone(), e.value().load(Ordering::Relaxed))).collect();
    rows.sort();
    for ((provider, status), n) in rows {
        let _ = writeln!(out, "caisse_payments_total{{fournisseur=\"{}\",statut=\"{status}\"}} {n}", escape(&provider));
    }

    header(&mut out, "caisse_webhook_deliveries_total", "counter", "Webhook delivery attempts, by result.");
    for result in DeliveryResult::ALL {
        let _ = writeln!(
            out,
            "caisse_webhook_deliveries_total{{result=\"{}\"}} {}",
            result.as_str(),
            ENGINE.deliveries(result)
        );
    }

    header(&mut out, "caisse_webhook_queue_depth", "gauge", "Notifications being delivered or waiting for a worker.");
    let _ = writeln!(out, "caisse_webhook_queue_depth {}", ENGINE.webhook_queue.load(Ordering::Relaxed).max(0));

    header(&mut out, "caisse_provider_requests_total", "counter", "Calls to providers' APIs, by adapter and outcome.");
    let mut rows: Vec<_> =
        m.provider_calls.iter().map(|e| (e.key().clone(), e.value().load(Ordering::Relaxed))).collect();
    rows.sort();
    for ((adapter, outcome), n) in rows {
        let _ = writeln!(
            out,
            "caisse_provider_requests_total{{adapter=\"{}\",outcome=\"{outcome}\"}} {n}",
            escape(&adapter)
        );
    }

    header(&mut out, "caisse_store_commit_duration_seconds", "histogram", "From a change queued to its durability.");
    histogram(&mut out, "caisse_store_commit_duration_seconds", "", &ENGINE.commit_latency.snapshot());

    header(
        &mut out,
        "caisse_webhook_notifications_forgotten_total",
        "counter",
        "Delivered notifications deleted once past their retention.",
    );
    let _ = writeln!(
        out,
        "caisse_webhook_notifications_forgotten_total {}",
        ENGINE.notifications_forgotten.load(Ordering::Relaxed)
    );

    header(
        &mut out,
        "caisse_store_lost_commit_answers_total",
        "counter",
        "PostgreSQL commits whose answer was lost, by what the node answered once it asked the database.",
    );
    for outcome in LostCommit::ALL {
        let _ = writeln!(
            out,
            "caisse_store_lost_commit_answers_total{{outcome=\"{}\"}} {}",
            outcome.as_str(),
            ENGINE.lost_commits(outcome)
        );
    }

    header(&mut out, "caisse_merchant_actors", "gauge", "Merchant actors in memory.");
    let _ = writeln!(out, "caisse_merchant_actors {actors}");

    let audits = &ENGINE.audits;
    header(&mut out, "caisse_ledger_audits_total", "counter", "Ledger audits run, by kind and result.");
    for kind in AuditScope::ALL {
        for result in AuditResult::ALL {
            let _ = writeln!(
                out,
                "caisse_ledger_audits_total{{kind=\"{}\",result=\"{}\"}} {}",
                kind.as_str(),
                result.as_str(),
                audits.runs(kind, result)
            );
        }
    }
    header(
        &mut out,
        "caisse_ledger_audit_failing",
        "gauge",
        "1 when the last ledger audit of this kind found a balance, snapshot or checkpoint that disagrees with the ledger.",
    );
    for kind in AuditScope::ALL {
        let _ = writeln!(
            out,
            "caisse_ledger_audit_failing{{kind=\"{}\"}} {}",
            kind.as_str(),
            u8::from(audits.failing(kind))
        );
    }
    header(
        &mut out,
        "caisse_ledger_audit_last_pass_timestamp_seconds",
        "gauge",
        "When the last ledger audit of this kind passed (Unix time; 0: not since the start).",
    );
    for kind in AuditScope::ALL {
        let _ = writeln!(
            out,
            "caisse_ledger_audit_last_pass_timestamp_seconds{{kind=\"{}\"}} {}",
            kind.as_str(),
            audits.passed_at(kind)
        );
    }
    header(
        &mut out,
        "caisse_ledger_audit_events",
        "gauge",
        "Journal events the last passing audit of this kind replayed.",
    );
    for kind in AuditScope::ALL {
        let _ = writeln!(out, "caisse_ledger_audit_events{{kind=\"{}\"}} {}", kind.as_str(), audits.events(kind));
    }
    out
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn histogram(out: &mut String, name: &str, labels: &str, s: &HistogramSnapshot) {
    let sep = if labels.is_empty() { "" } else { "," };
    for (bound, n) in &s.cumulative {
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {n}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", s.count);
    let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
    let _ = writeln!(out, "{name}_sum{braces} {}", s.sum_s);
    let _ = writeln!(out, "{name}_count{braces} {}", s.count);
}

/// A label value as the text format wants it: backslash, double quote and line feed escaped.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_is_a_comment_or_a_sample() {
        METRICS.request("/v1/ping", 200, Duration::from_millis(2));
        METRICS.provider_call("pawa\"pay", "ok");
        let text = text(3);
        for line in text.lines() {
            let sample = line
                .rsplit_once(' ')
                .is_some_and(|(series, value)| value.parse::<f64>().is_ok() && series.starts_with("caisse_"));
            assert!(line.starts_with("# HELP ") || line.starts_with("# TYPE ") || sample, "{line}");
        }
        assert!(text.contains("caisse_http_requests_total{route=\"/v1/ping\",status=\"200\"}"));
        assert!(text.contains("adapter=\"pawa\\\"pay\""), "label values are escaped");
        assert!(text.contains("caisse_http_request_duration_seconds_bucket{route=\"/v1/ping\",le=\"+Inf\"}"));
        assert!(text.contains("caisse_store_commit_duration_seconds_bucket{le=\"0.001\"}"));
        assert!(text.contains("caisse_merchant_actors 3"));
    }
}
