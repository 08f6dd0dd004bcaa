//! MTN's sandbox magic MSISDNs (momodeveloper "Sandbox Use Cases", numbers 46733123450 to 46733123463),
//! generalised so West-African numbers work too: for an MSISDN party, only the **last two digits** decide, with
//! any country prefix (22997000050 behaves as 46733123450). Every other number, and EMAIL / PARTY_CODE
//! parties, succeeds.
//!
//! | last two digits | requesttopay | transfer (and refund) |
//! |---|---|---|
//! | 50 | FAILED, no reason | FAILED, no reason |
//! | 51 | FAILED APPROVAL_REJECTED | FAILED APPROVAL_REJECTED |
//! | 52 | FAILED EXPIRED | FAILED EXPIRED |
//! | 53 | stays PENDING, no callback | same |
//! | 54 | PENDING for 10 × settle-ms, then SUCCESSFUL | same |
//! | 55 | FAILED PAYER_NOT_FOUND | FAILED NOT_ENOUGH_FUNDS |
//! | 56 | FAILED PAYER_LIMIT_REACHED | FAILED PAYEE_NOT_ALLOWED_TO_RECEIVE |
//! | 57 | FAILED NOT_ALLOWED | FAILED PAYEE_NOT_FOUND |
//! | 58 | FAILED NOT_ALLOWED_TARGET_ENVIRONMENT | same |
//! | 59 | FAILED INVALID_CALLBACK_URL_HOST | same |
//! | 60 | FAILED INVALID_CURRENCY | same |
//! | 61 | FAILED INTERNAL_PROCESSING_ERROR | same |
//! | 62 | FAILED SERVICE_UNAVAILABLE | same |
//! | 63 | FAILED COULD_NOT_PERFORM_TRANSACTION | same |
//! | anything else | SUCCESSFUL after settle-ms | same |

use crate::common::{is_digits, Plan};

/// How many settle periods the "delayed" number (…54) waits before succeeding.
pub const DELAYED_FACTOR: u64 = 10;

/// The outcome and the delay factor (in settle periods) for a party of a requesttopay (`collection`) or a
/// transfer/refund (`!collection`).
pub fn plan(party_id_type: &str, party_id: &str, collection: bool) -> (Plan, u64) {
    if party_id_type != "MSISDN" || !is_digits(party_id) || party_id.len() < 2 {
        return (Plan::Succeed, 1);
    }
    let fail = |reason: &str| (Plan::Fail(Some(reason.to_owned())), 1);
    let pick = |rtp: &str, transfer: &str| fail(if collection { rtp } else { transfer });
    match &party_id[party_id.len() - 2..] {
        "50" => (Plan::Fail(None), 1),
        "51" => fail("APPROVAL_REJECTED"),
        "52" => fail("EXPIRED"),
        "53" => (Plan::Stuck, 1),
        "54" => (Plan::Succeed, DELAYED_FACTOR),
        "55" => pick("PAYER_NOT_FOUND", "NOT_ENOUGH_FUNDS"),
        "56" => pick("PAYER_LIMIT_REACHED", "PAYEE_NOT_ALLOWED_TO_RECEIVE"),
        "57" => pick("NOT_ALLOWED", "PAYEE_NOT_FOUND"),
        "58" => fail("NOT_ALLOWED_TARGET_ENVIRONMENT"),
        "59" => fail("INVALID_CALLBACK_URL_HOST"),
        "60" => fail("INVALID_CURRENCY"),
        "61" => fail("INTERNAL_PROCESSING_ERROR"),
        "62" => fail("SERVICE_UNAVAILABLE"),
        "63" => fail("COULD_NOT_PERFORM_TRANSACTION"),
        _ => (Plan::Succeed, 1),
    }
}

/// The currency each production target environment accepts; the sandbox takes EUR only. Environments not
/// listed take any currency.
pub fn currency_of(target_environment: &str) -> Option<&'static str> {
    Some(match target_environment {
        "sandbox" => "EUR",
        "mtnbenin" | "mtnivorycoast" => "XOF",
        "mtncameroon" | "mtncongo" => "XAF",
        "mtnguineaconakry" => "GNF",
        "mtnghana" => "GHS",
        "mtnuganda" => "UGX",
        "mtnzambia" => "ZMW",
        "mtnrwanda" => "RWF",
        "mtnliberia" => "LRD",
        "mtnswaziland" => "SZL",
        "mtnsouthafrica" => "ZAR",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_table() {
        let fail = |r: &str| (Plan::Fail(Some(r.into())), 1);
        assert_eq!(plan("MSISDN", "46733123450", true), (Plan::Fail(None), 1));
        assert_eq!(plan("MSISDN", "46733123451", true), fail("APPROVAL_REJECTED"));
        assert_eq!(plan("MSISDN", "46733123452", false), fail("EXPIRED"));
        assert_eq!(plan("MSISDN", "46733123453", true), (Plan::Stuck, 1));
        assert_eq!(plan("MSISDN", "46733123454", true), (Plan::Succeed, DELAYED_FACTOR));
        assert_eq!(plan("MSISDN", "46733123455", true), fail("PAYER_NOT_FOUND"));
        assert_eq!(plan("MSISDN", "46733123455", false), fail("NOT_ENOUGH_FUNDS"));
        assert_eq!(plan("MSISDN", "46733123456", false), fail("PAYEE_NOT_ALLOWED_TO_RECEIVE"));
        assert_eq!(plan("MSISDN", "46733123457", true), fail("NOT_ALLOWED"));
        assert_eq!(plan("MSISDN", "46733123457", false), fail("PAYEE_NOT_FOUND"));
        assert_eq!(plan("MSISDN", "46733123463", true), fail("COULD_NOT_PERFORM_TRANSACTION"));
        assert_eq!(plan("MSISDN", "46733123464", true), (Plan::Succeed, 1));
    }

    #[test]
    fn west_african_numbers_use_the_last_two_digits() {
        assert_eq!(plan("MSISDN", "22997000000", true), (Plan::Succeed, 1));
        assert_eq!(plan("MSISDN", "22997000055", true), (Plan::Fail(Some("PAYER_NOT_FOUND".into())), 1));
        assert_eq!(plan("MSISDN", "2250500000053", true), (Plan::Stuck, 1));
        assert_eq!(plan("EMAIL", "someone55@example.com", true), (Plan::Succeed, 1));
        assert_eq!(plan("MSISDN", "5", true), (Plan::Succeed, 1), "short ids do not panic");
    }
}
