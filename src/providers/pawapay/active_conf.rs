//! pawaPay's own limits, from `GET /v2/active-conf`: per provider code (MTN_MOMO_BEN, ...) and operation, the
//! smallest and largest amount, whether amounts may carry decimals, and whether the provider is operational.
//!
//! Caisse checks an amount against them before it creates anything, so a merchant gets a clear 400 naming
//! pawaPay's bounds rather than a payment that fails a moment later. They are fetched in the background (the
//! sweep calls [`Pawapay::refresh`](super::Pawapay) every pass; a fetch happens at most every
//! [`REFRESH_EVERY`]); until the first answer, and when pawaPay has nothing for a provider, only the
//! configuration's bounds apply and pawaPay's own answer to the request decides.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use caisse_engine::domain::money::{Amount, Currency};
use serde_json::Value;

use crate::config::Operation;

/// How long one answer of `active-conf` is trusted; pawaPay changes limits rarely, and status (a provider's
/// outage) is what this refresh is for.
pub const REFRESH_EVERY: Duration = Duration::from_secs(5 * 60);

/// Entries one answer may hold; more is not an answer of pawaPay's (it has a few dozen providers).
const MAX_ENTRIES: usize = 1_024;

/// pawaPay's limits for one provider, currency and operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Bounds in the currency's smallest unit, when given.
    pub min: Option<i64>,
    pub max: Option<i64>,
    /// `decimalsInAmount: NONE`: whole major units only (always so for XOF and XAF).
    pub whole_only: bool,
    /// `status`: `OPERATIONAL`, or `DELAYED` (pawaPay takes payouts and enqueues them until the provider is back);
    /// anything else (`CLOSED`, ...) means pawaPay refuses new requests for now.
    pub operational: bool,
}

/// The last answer, keyed by (provider code, currency, operation).
#[derive(Debug, Default)]
pub struct ActiveConf {
    limits: HashMap<(String, String, &'static str), Limits>,
    fetched: Option<Instant>,
    in_flight: bool,
}

impl ActiveConf {
    /// True when a fetch should start now (and marks it started).
    pub fn start_refresh(&mut self, now: Instant) -> bool {
        let due = self.fetched.is_none_or(|at| now.duration_since(at) >= REFRESH_EVERY);
        if due && !self.in_flight {
            self.in_flight = true;
            return true;
        }
        false
    }

    /// Keeps a fetch's result; a failed fetch keeps the previous answer and is tried again next pass.
    pub fn finish_refresh(&mut self, now: Instant, answer: Option<HashMap<(String, String, &'static str), Limits>>) {
        self.in_flight = false;
        if let Some(limits) = answer {
            self.limits = limits;
            self.fetched = Some(now);
        }
    }

    /// Whether pawaPay takes `amount` for this provider code and operation; the refusal says why in words a
    /// merchant reads.
    pub fn check(&self, code: &str, currency: Currency, operation: Operation, amount: Amount) -> Result<(), String> {
        let key = (code.to_owned(), currency.code().to_owned(), operation_type(operation));
        let Some(limits) = self.limits.get(&key) else { return Ok(()) };
        if !limits.operational {
            return Err(format!("pawaPay does not take {code} requests at the moment; try again later"));
        }
        let scale = 10i64.pow(u32::from(currency.info().decimals));
        if limits.whole_only && amount.minor() % scale != 0 {
            return Err(format!("pawaPay takes whole {currency} amounts only for {code}"));
        }
        let major = |minor: i64| caisse_engine::domain::money::format_major(minor, currency);
        match (limits.min, limits.max) {
            (Some(min), _) if amount.minor() < min => {
                Err(format!("pawaPay takes at least {} {currency} for {code}", major(min)))
            }
            (_, Some(max)) if amount.minor() > max => {
                Err(format!("pawaPay takes at most {} {currency} for {code}", major(max)))
            }
            _ => Ok(()),
        }
    }
}

pub fn operation_type(operation: Operation) -> &'static str {
    match operation {
        Operation::Payment => "DEPOSIT",
        Operation::Payout => "PAYOUT",
        Operation::Refund => "REFUND",
    }
}

/// Reads an answer of `GET /v2/active-conf`: `countries[].providers[].currencies[].operationTypes.{DEPOSIT,
/// PAYOUT, REFUND}.{minAmount, maxAmount, decimalsInAmount, status}`. Untrusted input: entries that do not
/// read are skipped, and `None` means the answer as a whole is not one.
pub fn parse(body: &Value) -> Option<HashMap<(String, String, &'static str), Limits>> {
    let countries = body["countries"].as_array()?;
    let mut limits = HashMap::new();
    let providers = countries.iter().filter_map(|c| c["providers"].as_array()).flatten();
    for provider in providers {
        let Some(code) = provider["provider"].as_str().filter(|c| c.len() <= 64) else { continue };
        for entry in provider["currencies"].as_array().into_iter().flatten() {
            let Some(currency) = entry["currency"].as_str().and_then(|c| Currency::parse(c).ok()) else { continue };
            for operation in ["DEPOSIT", "PAYOUT", "REFUND"] {
                let conf = &entry["operationTypes"][operation];
                if !conf.is_object() || limits.len() >= MAX_ENTRIES {
                    continue;
                }
                let decimals = u32::from(currency.info().decimals);
                let read = Limits {
                    // A fractional bound of a currency without decimals rounds inwards.
                    min: conf["minAmount"].as_str().and_then(|t| minor_units(t, decimals, true)),
                    max: conf["maxAmount"].as_str().and_then(|t| minor_units(t, decimals, false)),
                    whole_only: conf["decimalsInAmount"].as_str() == Some("NONE"),
                    // pawaPay's `DELAYED` is about payouts: it enqueues them until the provider is back.
                    operational: conf["status"]
                        .as_str()
                        .is_none_or(|s| s == "OPERATIONAL" || (s == "DELAYED" && operation == "PAYOUT")),
                };
                limits.insert((code.to_owned(), currency.code().to_owned(), operation), read);
            }
        }
    }
    Some(limits)
}

/// A decimal string in major units (`"100"`, `"2500.50"`) as smallest units; a value with more decimals than
/// the currency has is rounded up for a minimum and down for a maximum.
fn minor_units(text: &str, decimals: u32, round_up: bool) -> Option<i64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() || whole.len() > 15 || fraction.len() > 6 {
        return None;
    }
    if !whole.bytes().chain(fraction.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let scale = 10i64.pow(decimals);
    let mut minor = whole.parse::<i64>().ok()?.checked_mul(scale)?;
    let kept: String = fraction.chars().take(decimals as usize).collect();
    if !kept.is_empty() {
        minor += format!("{kept:0<width$}", width = decimals as usize).parse::<i64>().ok()?;
    }
    let dropped = fraction.chars().skip(decimals as usize).any(|c| c != '0');
    if dropped && round_up {
        minor += 1;
    }
    Some(minor)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn xof() -> Currency {
        Currency::parse("XOF").unwrap()
    }

    fn answer(status: &str) -> Value {
        json!({"countries": [{"country": "BEN", "providers": [{"provider": "MTN_MOMO_BEN", "currencies": [
            {"currency": "XOF", "operationTypes": {
                "DEPOSIT": {"minAmount": "100", "maxAmount": "1000000", "decimalsInAmount": "NONE", "status": status},
                "PAYOUT": {"minAmount": "500.5", "maxAmount": "x", "decimalsInAmount": "NONE"}}}]}]}]})
    }

    #[test]
    fn bounds_and_status_are_read_and_checked() {
        let mut conf = ActiveConf::default();
        conf.finish_refresh(Instant::now(), parse(&answer("OPERATIONAL")));
        let check = |op, amount| conf.check("MTN_MOMO_BEN", xof(), op, Amount::positive(amount).unwrap());
        assert!(check(Operation::Payment, 100).is_ok());
        assert!(check(Operation::Payment, 1_000_000).is_ok());
        let low = check(Operation::Payment, 99).unwrap_err();
        assert!(low.contains("at least 100") && low.contains("MTN_MOMO_BEN"), "{low}");
        assert!(check(Operation::Payment, 1_000_001).unwrap_err().contains("at most 1"));
        // A fractional minimum of a currency without decimals rounds up; an unreadable maximum is no bound.
        assert!(check(Operation::Payout, 500).is_err());
        assert!(check(Operation::Payout, 501).is_ok());
        assert!(check(Operation::Payout, 10_000_000).is_ok());
        // Nothing known: pawaPay's own answer decides.
        assert!(check(Operation::Refund, 1).is_ok());
        assert!(conf.check("ORANGE_CIV", xof(), Operation::Payment, Amount::positive(1).unwrap()).is_ok());

        // Delayed: pawaPay takes payouts and enqueues them; it says nothing of payments being taken.
        let mut delayed = answer("DELAYED");
        delayed["countries"][0]["providers"][0]["currencies"][0]["operationTypes"]["PAYOUT"]["status"] =
            json!("DELAYED");
        conf.finish_refresh(Instant::now(), parse(&delayed));
        assert!(conf.check("MTN_MOMO_BEN", xof(), Operation::Payout, Amount::positive(1_000).unwrap()).is_ok());
        assert!(conf.check("MTN_MOMO_BEN", xof(), Operation::Payment, Amount::positive(1_000).unwrap()).is_err());
        conf.finish_refresh(Instant::now(), parse(&answer("CLOSED")));
        let closed = conf.check("MTN_MOMO_BEN", xof(), Operation::Payment, Amount::positive(1_000).unwrap());
        assert!(closed.unwrap_err().contains("at the moment"));
    }

    #[test]
    fn refreshes_are_spaced_and_a_failed_one_keeps_the_last_answer() {
        let mut conf = ActiveConf::default();
        let start = Instant::now();
        assert!(conf.start_refresh(start));
        assert!(!conf.start_refresh(start), "one fetch at a time");
        conf.finish_refresh(start, parse(&answer("OPERATIONAL")));
        assert!(!conf.start_refresh(start + Duration::from_secs(1)));
        let later = start + REFRESH_EVERY;
        assert!(conf.start_refresh(later));
        conf.finish_refresh(later, None);
        assert!(conf.check("MTN_MOMO_BEN", xof(), Operation::Payment, Amount::positive(1).unwrap()).is_err());
        assert!(conf.start_refresh(later), "a failed fetch is tried again at once");
    }

    #[test]
    fn hostile_answers_are_not_answers() {
        assert!(parse(&json!({"countries": "no"})).is_none());
        assert!(parse(&json!([])).is_none());
        let odd = json!({"countries": [{"providers": [{"provider": 7}, {"provider": "X", "currencies": [{"currency": "???"}]}]}]});
        assert_eq!(parse(&odd).map(|l| l.len()), Some(0));
        assert_eq!(minor_units("12.345", 2, true), Some(1_235));
        assert_eq!(minor_units("12.345", 2, false), Some(1_234));
        assert_eq!(minor_units("-1", 0, true), None);
        assert_eq!(minor_units("1e9", 0, true), None);
        assert_eq!(minor_units("99999999999999999", 0, true), None);
    }
}
