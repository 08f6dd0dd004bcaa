//! The run's JSON line: counts, rates, percentiles and losses, computed once the load and its grace period are
//! over (the memory figures are added by the caller, which knows where the server runs).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};

use crate::driver::{Ctx, Op};
use crate::receiver::lock;
use crate::{Args, Server, Setup};

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn sorted(values: &std::sync::Mutex<Vec<u64>>) -> Vec<u64> {
    let mut v = lock(values).clone();
    v.sort_unstable();
    v
}

fn by_op(map: &BTreeMap<Op, u64>) -> Value {
    Value::Object(map.iter().map(|(op, n)| (op.name().to_owned(), json!(n))).collect())
}

/// The JSON report (without the memory figures) and the number of deliveries that did not verify.
pub fn report(args: &Args, setup: &Setup, ctx: &Ctx, offered_for: Duration, lives_accepted: u64) -> (Value, u64) {
    let rx = &setup.rx;
    let d = ctx.driver.borrow();
    let (mut lost, mut lost_hanging) = (0u64, 0u64);
    for (reference, merchant) in &d.lives {
        if !rx.arrivals.contains_key(&("payment.succeeded".to_owned(), reference.clone())) {
            if setup.hanging.get(*merchant).copied().unwrap_or(false) {
                lost_hanging += 1;
            } else {
                lost += 1;
            }
        }
    }
    let mut events: BTreeMap<String, u64> = BTreeMap::new();
    for entry in rx.arrivals.iter() {
        *events.entry(entry.key().0.clone()).or_default() += 1;
    }
    let mut api = d.api_latency_us.clone();
    api.sort_unstable();
    let healthy = sorted(&rx.healthy_latency_ms);
    let gaps = sorted(&rx.duplicate_gap_ms);
    let held = sorted(&rx.hanging_latency_ms);
    let completed = rx.completed.load(Ordering::Relaxed);
    let last_success_s = rx.last_success_ms.load(Ordering::Relaxed) as f64 / 1000.0;
    let window_s = offered_for.as_secs_f64().max(last_success_s);
    let healthy_completed = rx.healthy_completed.load(Ordering::Relaxed);
    let last_healthy_s = rx.last_healthy_success_ms.load(Ordering::Relaxed) as f64 / 1000.0;
    let healthy_window_s = offered_for.as_secs_f64().max(last_healthy_s);
    let ms = |us: u64| (us as f64 / 100.0).round() / 10.0;
    let unverified = rx.unverified.load(Ordering::Relaxed);
    let accepted_payments = d.accepted.get(&Op::Payment).copied().unwrap_or(0);
    // A target's sandbox delay is its own setting, unknown here.
    let sandbox_delay_ms = matches!(setup.server, Server::InProcess { .. }).then_some(args.sandbox_delay_ms);
    let report = json!({
        "scenario": args.scenario.name(),
        "merchants": setup.keys.len(),
        "receiver_ports": setup.receiver_ports,
        "duration_s": args.duration,
        "sandbox_delay_ms": sandbox_delay_ms,
        "offered_per_s": args.rate,
        "offered": (args.rate * args.duration).round() as u64,
        "issued": by_op(&d.issued),
        "accepted": by_op(&d.accepted),
        "rejected": by_op(&d.rejected),
        "rejected_codes": d.rejected_codes,
        "network_errors": d.network_errors,
        "failures_by_second": d.failures_by_second.iter().map(|(s, n)| (s.to_string(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
        "failure_span_s": match (d.failures_by_second.keys().next(), d.failures_by_second.keys().next_back()) {
            (Some(first), Some(last)) => json!(last - first + 1),
            _ => json!(0),
        },
        "dropped_at_cap": d.dropped,
        "refunds_unavailable": d.refunds_unavailable,
        "accepted_per_s": (accepted_payments as f64 / offered_for.as_secs_f64()).round(),
        "lives_accepted": lives_accepted,
        "lives_completed": completed,
        "completed_lives_per_s": (completed as f64 / window_s).round(),
        "last_success_s": last_success_s,
        "healthy_lives_completed": healthy_completed,
        "healthy_completed_lives_per_s": (healthy_completed as f64 / healthy_window_s).round(),
        "api_latency_ms": {"p50": ms(percentile(&api, 0.50)), "p99": ms(percentile(&api, 0.99)), "p100": ms(percentile(&api, 1.0))},
        "notice_to_webhook_ms": {"p50": percentile(&healthy, 0.50), "p99": percentile(&healthy, 0.99), "count": healthy.len()},
        "notice_to_webhook_hanging_ms": {"p50": percentile(&held, 0.50), "p99": percentile(&held, 0.99), "count": held.len()},
        "lost_webhooks": lost,
        "lost_webhooks_hanging": lost_hanging,
        "unverified_webhooks": unverified,
        "verified_deliveries": rx.verified.load(Ordering::Relaxed),
        "duplicate_deliveries": rx.duplicates.load(Ordering::Relaxed),
        "duplicate_gap_ms": {"p50": percentile(&gaps, 0.50), "p100": percentile(&gaps, 1.0)},
        "unparsed_webhooks": rx.unparsed.load(Ordering::Relaxed),
        "events": events,
    });
    (report, unverified)
}
