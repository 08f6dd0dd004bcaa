//! The knobs: the behaviour switches a test sets with `POST /__fake/knobs` (listed in docs/fakes.md).
//!
//! A patch is checked as a whole before any of it applies, and unknown names are refused, so a typo in a
//! test is an error rather than a knob silently left as it was.

use serde::{Deserialize, Serialize};

use crate::common::is_http_url;

/// How final-state callbacks are delivered (`callbacks` knob).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallbackMode {
    /// One delivery (retried on failure).
    Once,
    /// The same callback twice.
    Duplicate,
    /// One delivery, two seconds after the transaction became final.
    Late,
    /// No callback at all.
    Never,
    /// A callback claiming success whatever the outcome (pawaPay: with a signature that does not verify).
    Forged,
    /// The final callback, then one carrying an earlier, non-final status.
    OutOfOrder,
}

/// The behaviour switches a test sets with `POST /__fake/knobs`. Counts are consumed one per matching call.
#[derive(Clone, Debug, Serialize)]
pub struct Knobs {
    pub latency_ms: u64,
    pub create_500_but_created: u32,
    pub never_answer: u32,
    pub too_many_requests: u32,
    pub callbacks: CallbackMode,
    pub callback_method: String,
    pub signed: bool,
    pub signature_encoding: String,
    pub not_found_after_create_ms: u64,
    pub token_ttl_s: u64,
    pub in_reconciliation: bool,
    pub payouts_enqueued: bool,
    pub deposit_callback_url: Option<String>,
    pub payout_callback_url: Option<String>,
    pub refund_callback_url: Option<String>,
    /// Wave: where webhooks go.
    pub webhook_url: Option<String>,
    /// Wave: how webhooks are authenticated (`concatenated`, `dot`, `rotated`, `bearer`, `stale`, `bad`).
    pub wave_signature: String,
    /// Wave: how long a checkout session stays open, in seconds of the fake clock.
    pub session_ttl_s: u64,
}

/// The Wave webhook authentications the fake can send.
const WAVE_SIGNATURES: [&str; 6] = ["concatenated", "dot", "rotated", "bearer", "stale", "bad"];

impl Default for Knobs {
    fn default() -> Knobs {
        Knobs {
            latency_ms: 0,
            create_500_but_created: 0,
            never_answer: 0,
            too_many_requests: 0,
            callbacks: CallbackMode::Once,
            callback_method: "POST".into(),
            signed: false,
            signature_encoding: "raw".into(),
            not_found_after_create_ms: 0,
            token_ttl_s: 3600,
            in_reconciliation: false,
            payouts_enqueued: false,
            deposit_callback_url: None,
            payout_callback_url: None,
            refund_callback_url: None,
            webhook_url: None,
            wave_signature: "concatenated".into(),
            session_ttl_s: 1800,
        }
    }
}

/// The body of `POST /__fake/knobs`: every field optional, unknown fields refused so a typo is not ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KnobsPatch {
    latency_ms: Option<u64>,
    create_500_but_created: Option<u32>,
    never_answer: Option<u32>,
    too_many_requests: Option<u32>,
    callbacks: Option<CallbackMode>,
    callback_method: Option<String>,
    signed: Option<bool>,
    signature_encoding: Option<String>,
    not_found_after_create_ms: Option<u64>,
    token_ttl_s: Option<u64>,
    in_reconciliation: Option<bool>,
    payouts_enqueued: Option<bool>,
    deposit_callback_url: Option<String>,
    payout_callback_url: Option<String>,
    refund_callback_url: Option<String>,
    webhook_url: Option<String>,
    wave_signature: Option<String>,
    session_ttl_s: Option<u64>,
}

/// Latency above this (ten minutes) is refused: no client waits that long.
const LATENCY_MS_MAX: u64 = 600_000;

impl Knobs {
    /// Applies a patch, or says which field was out of range (nothing is applied then).
    pub fn apply(&mut self, patch: KnobsPatch) -> Result<(), String> {
        if patch.latency_ms.is_some_and(|l| l > LATENCY_MS_MAX) {
            return Err(format!("latency_ms must be at most {LATENCY_MS_MAX}"));
        }
        if let Some(m) = &patch.callback_method {
            if m != "POST" && m != "PUT" {
                return Err("callback_method must be POST or PUT".into());
            }
        }
        if let Some(e) = &patch.signature_encoding {
            if e != "raw" && e != "der" {
                return Err("signature_encoding must be raw or der".into());
            }
        }
        if patch.wave_signature.as_deref().is_some_and(|s| !WAVE_SIGNATURES.contains(&s)) {
            return Err(format!("wave_signature must be one of {}", WAVE_SIGNATURES.join(", ")));
        }
        if patch.session_ttl_s == Some(0) {
            return Err("session_ttl_s must be at least 1".into());
        }
        if patch.token_ttl_s == Some(0) {
            return Err("token_ttl_s must be at least 1".into());
        }
        for url in
            [&patch.deposit_callback_url, &patch.payout_callback_url, &patch.refund_callback_url, &patch.webhook_url]
                .into_iter()
                .flatten()
        {
            if !url.is_empty() && !is_http_url(url) {
                return Err(format!("{url:?} is not an http(s) URL"));
            }
        }
        let keep = |new: Option<String>, old: &mut Option<String>| {
            if let Some(url) = new {
                *old = if url.is_empty() { None } else { Some(url) };
            }
        };
        keep(patch.deposit_callback_url, &mut self.deposit_callback_url);
        keep(patch.payout_callback_url, &mut self.payout_callback_url);
        keep(patch.refund_callback_url, &mut self.refund_callback_url);
        keep(patch.webhook_url, &mut self.webhook_url);
        self.wave_signature = patch.wave_signature.unwrap_or(std::mem::take(&mut self.wave_signature));
        self.session_ttl_s = patch.session_ttl_s.unwrap_or(self.session_ttl_s);
        self.latency_ms = patch.latency_ms.unwrap_or(self.latency_ms);
        self.create_500_but_created = patch.create_500_but_created.unwrap_or(self.create_500_but_created);
        self.never_answer = patch.never_answer.unwrap_or(self.never_answer);
        self.too_many_requests = patch.too_many_requests.unwrap_or(self.too_many_requests);
        self.callbacks = patch.callbacks.unwrap_or(self.callbacks);
        self.callback_method = patch.callback_method.unwrap_or(std::mem::take(&mut self.callback_method));
        self.signed = patch.signed.unwrap_or(self.signed);
        self.signature_encoding = patch.signature_encoding.unwrap_or(std::mem::take(&mut self.signature_encoding));
        self.not_found_after_create_ms = patch.not_found_after_create_ms.unwrap_or(self.not_found_after_create_ms);
        self.token_ttl_s = patch.token_ttl_s.unwrap_or(self.token_ttl_s);
        self.in_reconciliation = patch.in_reconciliation.unwrap_or(self.in_reconciliation);
        self.payouts_enqueued = patch.payouts_enqueued.unwrap_or(self.payouts_enqueued);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn knobs_patch_is_checked_before_it_applies() {
        let mut knobs = Knobs::default();
        let patch: KnobsPatch = serde_json::from_value(json!({"latency_ms": 5, "callback_method": "GET"})).unwrap();
        assert!(knobs.apply(patch).is_err());
        assert_eq!(knobs.latency_ms, 0, "nothing applied");
        let patch: KnobsPatch = serde_json::from_value(
            json!({"callbacks": "out_of_order", "deposit_callback_url": "http://127.0.0.1:9/cb"}),
        )
        .unwrap();
        knobs.apply(patch).unwrap();
        assert_eq!(knobs.callbacks, CallbackMode::OutOfOrder);
        assert_eq!(knobs.deposit_callback_url.as_deref(), Some("http://127.0.0.1:9/cb"));
        assert!(serde_json::from_value::<KnobsPatch>(json!({"latncy_ms": 1})).is_err(), "typos refused");
    }
}
