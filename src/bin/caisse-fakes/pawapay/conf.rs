//! The pawaPay fake's static world: the providers of docs.pawapay.io/v2/docs/providers for Benin, Burkina
//! Faso, Cameroon, Côte d'Ivoire and Senegal, their limits, the sandbox's magic phone numbers, and the two
//! toolkit endpoints built from them (`/v2/active-conf`, `/v2/predict-provider`).

use serde_json::{json, Value};

use super::failure;
use crate::common::{is_digits, Plan};
use crate::server::Reply;

/// Smallest and largest amount the fake accepts for every provider and operation (XOF/XAF, no decimals).
pub const AMOUNT_MIN: u64 = 100;
pub const AMOUNT_MAX: u64 = 2_000_000;

pub struct Country {
    pub code: &'static str,
    pub prefix: &'static str,
    pub name_en: &'static str,
    pub name_fr: &'static str,
    /// Digits after the country prefix.
    pub national_lengths: &'static [usize],
}

pub const COUNTRIES: &[Country] = &[
    // Benin moved to 10-digit numbers (01 + the old 8) in 2024; the sandbox's numbers are still 8 digits.
    Country { code: "BEN", prefix: "229", name_en: "Benin", name_fr: "Bénin", national_lengths: &[8, 10] },
    Country { code: "BFA", prefix: "226", name_en: "Burkina Faso", name_fr: "Burkina Faso", national_lengths: &[8] },
    Country { code: "CMR", prefix: "237", name_en: "Cameroon", name_fr: "Cameroun", national_lengths: &[9] },
    Country {
        code: "CIV", prefix: "225", name_en: "Côte d'Ivoire", name_fr: "Côte d'Ivoire", national_lengths: &[10]
    },
    Country { code: "SEN", prefix: "221", name_en: "Senegal", name_fr: "Sénégal", national_lengths: &[9] },
];

pub struct ProviderInfo {
    pub code: &'static str,
    pub country: &'static str,
    pub currency: &'static str,
    pub display_name: &'static str,
    /// PROVIDER_AUTH (PIN prompt), PREAUTH (customer OTP) or REDIRECT_AUTH (Wave).
    pub auth_type: &'static str,
}

const fn provider(
    code: &'static str,
    country: &'static str,
    currency: &'static str,
    display_name: &'static str,
    auth_type: &'static str,
) -> ProviderInfo {
    ProviderInfo { code, country, currency, display_name, auth_type }
}

pub const PROVIDERS: &[ProviderInfo] = &[
    provider("MTN_MOMO_BEN", "BEN", "XOF", "MTN", "PROVIDER_AUTH"),
    provider("MOOV_BEN", "BEN", "XOF", "Moov", "PROVIDER_AUTH"),
    provider("MOOV_BFA", "BFA", "XOF", "Moov", "PROVIDER_AUTH"),
    provider("ORANGE_BFA", "BFA", "XOF", "Orange", "PREAUTH"),
    provider("MTN_MOMO_CMR", "CMR", "XAF", "MTN", "PROVIDER_AUTH"),
    provider("ORANGE_CMR", "CMR", "XAF", "Orange", "PROVIDER_AUTH"),
    provider("MTN_MOMO_CIV", "CIV", "XOF", "MTN", "PROVIDER_AUTH"),
    provider("ORANGE_CIV", "CIV", "XOF", "Orange", "PROVIDER_AUTH"),
    provider("WAVE_CIV", "CIV", "XOF", "Wave", "REDIRECT_AUTH"),
    provider("ORANGE_SEN", "SEN", "XOF", "Orange", "PROVIDER_AUTH"),
    provider("FREE_SEN", "SEN", "XOF", "Free", "PROVIDER_AUTH"),
    provider("WAVE_SEN", "SEN", "XOF", "Wave", "REDIRECT_AUTH"),
];

pub fn provider_info(code: &str) -> Option<&'static ProviderInfo> {
    PROVIDERS.iter().find(|p| p.code == code)
}

pub fn country(code: &str) -> Option<&'static Country> {
    COUNTRIES.iter().find(|c| c.code == code)
}

/// True when `phone` is digits only, starts with the provider's country prefix and has that country's length.
pub fn phone_fits(phone: &str, info: &ProviderInfo) -> bool {
    let Some(country) = country(info.country) else { return false };
    is_digits(phone)
        && phone.starts_with(country.prefix)
        && country.national_lengths.contains(&(phone.len() - country.prefix.len()))
}

/// The deposit outcome the sandbox's test numbers ask for, by their last three digits, for every provider
/// (docs.pawapay.io/v2/docs/test_numbers; the BFA numbers end in 048/068/138 instead).
pub fn deposit_plan(phone: &str) -> Plan {
    let fail = |code: &str| Plan::Fail(Some(code.to_owned()));
    match phone.get(phone.len().saturating_sub(3)..).unwrap_or("") {
        "019" => fail("PAYER_LIMIT_REACHED"),
        "029" => fail("PAYER_NOT_FOUND"),
        "039" => fail("PAYMENT_NOT_APPROVED"),
        "048" | "049" => fail("INSUFFICIENT_BALANCE"),
        "068" | "069" => fail("UNSPECIFIED_FAILURE"),
        "129" | "138" => Plan::Stuck,
        _ => Plan::Succeed,
    }
}

/// The payout outcome of the test numbers, by their last three digits.
pub fn payout_plan(phone: &str) -> Plan {
    let fail = |code: &str| Plan::Fail(Some(code.to_owned()));
    match phone.get(phone.len().saturating_sub(3)..).unwrap_or("") {
        "089" => fail("RECIPIENT_NOT_FOUND"),
        "119" => fail("UNSPECIFIED_FAILURE"),
        "129" | "138" => Plan::Stuck,
        _ => Plan::Succeed,
    }
}

/// `GET /v2/active-conf`, optionally narrowed by `country` and `operationType` query parameters.
pub fn active_conf(query: &str) -> Value {
    let param =
        |name: &str| query.split('&').find_map(|kv| kv.strip_prefix(name).and_then(|rest| rest.strip_prefix('=')));
    let (only_country, only_operation) = (param("country"), param("operationType"));
    let countries: Vec<Value> = COUNTRIES
        .iter()
        .filter(|c| only_country.is_none_or(|o| o == c.code))
        .map(|c| {
            let providers: Vec<Value> =
                PROVIDERS.iter().filter(|p| p.country == c.code).map(|p| provider_conf(p, only_operation)).collect();
            json!({
                "country": c.code,
                "displayName": {"en": c.name_en, "fr": c.name_fr},
                "prefix": c.prefix,
                "providers": providers,
            })
        })
        .collect();
    json!({
        "companyName": "Caisse fake merchant",
        "signatureConfiguration": {"signedRequestsOnly": false, "signedCallbacks": true},
        "countries": countries,
    })
}

fn provider_conf(p: &ProviderInfo, only_operation: Option<&str>) -> Value {
    let limits = |extra: Value| {
        let mut conf = json!({
            "minAmount": AMOUNT_MIN.to_string(),
            "maxAmount": AMOUNT_MAX.to_string(),
            "decimalsInAmount": "NONE",
            "status": "OPERATIONAL",
        });
        if let (Some(conf), Some(extra)) = (conf.as_object_mut(), extra.as_object()) {
            conf.extend(extra.clone());
        }
        conf
    };
    let mut operations = serde_json::Map::new();
    for operation in ["DEPOSIT", "PAYOUT", "REFUND"] {
        if only_operation.is_some_and(|o| o != operation) {
            continue;
        }
        let extra = if operation == "DEPOSIT" { json!({"authType": p.auth_type}) } else { json!({}) };
        operations.insert(operation.to_owned(), limits(extra));
    }
    json!({
        "provider": p.code,
        "displayName": p.display_name,
        "nameDisplayedToCustomer": "Caisse fake merchant",
        "currencies": [{"currency": p.currency, "displayName": "CFA", "operationTypes": operations}],
    })
}

/// `POST /v2/predict-provider`: the sanitised number, its country and the likely provider, by the operators'
/// national prefixes (a heuristic: numbers ported between operators are predicted wrongly, as on the real API).
pub fn predict(raw: &str) -> Option<Value> {
    let phone: String = raw.chars().filter(|c| !matches!(c, '+' | ' ' | '-' | '(' | ')')).collect();
    let country = COUNTRIES.iter().find(|c| phone.starts_with(c.prefix))?;
    let national = &phone[country.prefix.len()..];
    if !is_digits(&phone) || !country.national_lengths.contains(&national.len()) {
        return None;
    }
    let two = national.get(..2).unwrap_or("");
    let three = national.get(..3).unwrap_or("");
    let provider = match country.code {
        "BEN" => {
            let two = if national.len() == 10 { national.get(2..4).unwrap_or("") } else { two };
            if ["55", "58", "60", "63", "64", "65", "68", "94", "95", "98", "99"].contains(&two) {
                "MOOV_BEN"
            } else {
                "MTN_MOMO_BEN"
            }
        }
        "BFA"
            if ["05", "06", "07", "54", "55", "56", "57", "64", "65", "66", "67", "74", "75", "76", "77"]
                .contains(&two) =>
        {
            "ORANGE_BFA"
        }
        "BFA" => "MOOV_BFA",
        "CMR" if two == "69" || ["655", "656", "657", "658", "659", "640"].contains(&three) => "ORANGE_CMR",
        "CMR" => "MTN_MOMO_CMR",
        "CIV" if two == "07" => "ORANGE_CIV",
        "CIV" => "MTN_MOMO_CIV",
        "SEN" if two == "76" => "FREE_SEN",
        _ => "ORANGE_SEN",
    };
    Some(json!({"country": country.code, "provider": provider, "phoneNumber": phone}))
}

/// `POST /v2/predict-provider` `{"phoneNumber"}`.
pub fn predict_provider(body: &[u8]) -> Reply {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let Some(phone) = parsed.as_ref().and_then(|v| v.get("phoneNumber")).and_then(Value::as_str) else {
        return Reply::json(400, failure("INVALID_INPUT", "We are unable to parse the body of the request."));
    };
    match predict(phone) {
        Some(prediction) => Reply::json(200, prediction),
        None => {
            Reply::json(400, failure("INVALID_PHONE_NUMBER", "The phone number is not valid for any served country."))
        }
    }
}

/// `GET /v2/availability`: every provider operational.
pub fn availability() -> Value {
    let countries: Vec<Value> = COUNTRIES
        .iter()
        .map(|c| {
            let providers: Vec<Value> = PROVIDERS
                .iter()
                .filter(|p| p.country == c.code)
                .map(|p| json!({"provider": p.code, "operationTypes": {"DEPOSIT": "OPERATIONAL", "PAYOUT": "OPERATIONAL", "REFUND": "OPERATIONAL"}}))
                .collect();
            json!({"country": c.code, "providers": providers})
        })
        .collect();
    Value::Array(countries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_numbers() {
        let fail = |c: &str| Plan::Fail(Some(c.into()));
        assert_eq!(deposit_plan("22951345029"), fail("PAYER_NOT_FOUND"));
        assert_eq!(deposit_plan("22951345039"), fail("PAYMENT_NOT_APPROVED"));
        assert_eq!(deposit_plan("22951345069"), fail("UNSPECIFIED_FAILURE"));
        assert_eq!(deposit_plan("237653456019"), fail("PAYER_LIMIT_REACHED"));
        assert_eq!(deposit_plan("22602345048"), fail("INSUFFICIENT_BALANCE"));
        assert_eq!(deposit_plan("22951345129"), Plan::Stuck);
        assert_eq!(deposit_plan("22951345789"), Plan::Succeed);
        assert_eq!(deposit_plan("22997000000"), Plan::Succeed, "any other number completes");
        assert_eq!(payout_plan("22951345089"), fail("RECIPIENT_NOT_FOUND"));
        assert_eq!(payout_plan("22951345119"), fail("UNSPECIFIED_FAILURE"));
        assert_eq!(payout_plan("22951345129"), Plan::Stuck);
        assert_eq!(payout_plan("22951345029"), Plan::Succeed, "deposit numbers do not fail payouts");
        assert_eq!(deposit_plan("1"), Plan::Succeed, "short input does not panic");
    }

    #[test]
    fn phone_must_fit_the_providers_country() {
        let mtn_ben = provider_info("MTN_MOMO_BEN").unwrap();
        assert!(phone_fits("22951345789", mtn_ben));
        assert!(phone_fits("2290151345789", mtn_ben), "new 10-digit Benin numbers");
        assert!(!phone_fits("+22951345789", mtn_ben), "no '+'");
        assert!(!phone_fits("237653456789", mtn_ben), "Cameroon number");
        assert!(!phone_fits("2295134578", mtn_ben), "too short");
        assert!(phone_fits("2250503456789", provider_info("MTN_MOMO_CIV").unwrap()));
        assert!(phone_fits("221773456789", provider_info("ORANGE_SEN").unwrap()));
    }

    #[test]
    fn predicts_the_sandbox_happy_path_numbers() {
        for (phone, provider) in [
            ("22951345789", "MTN_MOMO_BEN"),
            ("22995345789", "MOOV_BEN"),
            ("22602345678", "MOOV_BFA"),
            ("22607345678", "ORANGE_BFA"),
            ("237653456789", "MTN_MOMO_CMR"),
            ("237693456789", "ORANGE_CMR"),
            ("2250503456789", "MTN_MOMO_CIV"),
            ("2250734567890", "ORANGE_CIV"),
            ("221773456789", "ORANGE_SEN"),
            ("+221 76-345-6789", "FREE_SEN"),
        ] {
            assert_eq!(predict(phone).unwrap()["provider"], provider, "{phone}");
        }
        assert!(predict("33612345678").is_none(), "France is not served");
        assert_eq!(active_conf("country=CMR&operationType=PAYOUT")["countries"].as_array().unwrap().len(), 1);
    }
}
