//! Money: amounts, currencies, fee rules and their display.
//!
//! The API (docs/api.md § Conventions, Payments) takes amounts as integers in the currency's smallest unit,
//! that only a fixed set of currencies exists, and that money arithmetic is checked so an
//! overflow becomes a client error instead of a wrap or a panic. This module owns those rules so
//! that no other part of the engine does raw arithmetic on money.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why a money value or a money computation was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone, Serialize, Deserialize)]
pub enum MoneyError {
    /// Amounts are never negative; a debit that would go below zero is refused.
    #[error("amount must not be negative")]
    Negative,
    /// Payment and payout amounts must be strictly greater than zero.
    #[error("amount must be greater than zero")]
    NotPositive,
    /// The result does not fit in a 64-bit integer.
    #[error("amount is too large (arithmetic overflow)")]
    Overflow,
    /// The code is not in the currency catalogue.
    #[error("unknown currency `{0}` (supported: XOF, XAF, GNF, EUR, USD)")]
    UnknownCurrency(String),
    /// A percentage above 100 % (10 000 basis points) makes no sense for a fee.
    #[error("fee rate of {0} basis points is above the maximum of 10000")]
    FeeRateTooHigh(u32),
}

/// A non-negative amount in the smallest unit of its currency.
///
/// The currency is not stored here because amounts are always carried next to a [`Currency`]
/// field in the records; keeping this type a bare integer keeps the JSON shape the API
/// promises (`"montant": 1050`). Deserialisation goes through [`Amount::new`], so a negative
/// number in a request or in the store can never become an `Amount`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct Amount(i64);

impl Amount {
    /// The zero amount, the starting point of every balance.
    pub const ZERO: Amount = Amount(0);

    /// Builds an amount that may be zero, as balances and fees can be.
    pub fn new(minor: i64) -> Result<Amount, MoneyError> {
        if minor < 0 {
            return Err(MoneyError::Negative);
        }
        Ok(Amount(minor))
    }

    /// Builds an amount that must be strictly positive, as payment and payout amounts are.
    pub fn positive(minor: i64) -> Result<Amount, MoneyError> {
        if minor <= 0 {
            return Err(MoneyError::NotPositive);
        }
        Ok(Amount(minor))
    }

    /// The value in the currency's smallest unit.
    pub fn minor(self) -> i64 {
        self.0
    }

    /// Whether the amount is zero.
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Adds two amounts, refusing overflow.
    pub fn checked_add(self, other: Amount) -> Result<Amount, MoneyError> {
        self.0.checked_add(other.0).map(Amount).ok_or(MoneyError::Overflow)
    }

    /// Adds two amounts, staying at the largest amount instead of overflowing (a counter, never a balance).
    pub fn saturating_add(self, other: Amount) -> Amount {
        Amount(self.0.saturating_add(other.0))
    }

    /// Subtracts `other`, refusing a result below zero so a balance can never go negative.
    pub fn checked_sub(self, other: Amount) -> Result<Amount, MoneyError> {
        let diff = self.0.checked_sub(other.0).ok_or(MoneyError::Overflow)?;
        Amount::new(diff)
    }
}

impl TryFrom<i64> for Amount {
    type Error = MoneyError;

    fn try_from(minor: i64) -> Result<Amount, MoneyError> {
        Amount::new(minor)
    }
}

impl From<Amount> for i64 {
    fn from(amount: Amount) -> i64 {
        amount.0
    }
}

impl fmt::Display for Amount {
    /// Shows the raw minor-unit integer; use [`format_major`] for a human display.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One entry of the currency catalogue published by `GET /v1/devises`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct CurrencyInfo {
    /// ISO 4217 code, always three uppercase letters.
    pub code: &'static str,
    /// Display name, in French like the rest of the product.
    pub name: &'static str,
    /// Number of decimals between the major and the smallest unit.
    pub decimals: u8,
}

/// Every currency the engine accepts. Anything else is refused at the edge.
pub const CURRENCIES: &[CurrencyInfo] = &[
    CurrencyInfo { code: "XOF", name: "Franc CFA BCEAO", decimals: 0 },
    CurrencyInfo { code: "XAF", name: "Franc CFA BEAC", decimals: 0 },
    CurrencyInfo { code: "GNF", name: "Franc guinéen", decimals: 0 },
    CurrencyInfo { code: "EUR", name: "Euro", decimals: 2 },
    CurrencyInfo { code: "USD", name: "Dollar américain", decimals: 2 },
];

/// Stands in for a catalogue entry that cannot be missing.
///
/// A [`Currency`] can only be built from a catalogue code, so the lookup in [`Currency::info`]
/// always succeeds; this entry exists only so that lookup needs no panicking branch.
static UNKNOWN_CURRENCY: CurrencyInfo = CurrencyInfo { code: "???", name: "Devise inconnue", decimals: 0 };

/// A currency from the static catalogue, stored as its three-letter code.
///
/// The code is kept as three bytes so the type is `Copy` and cheap to compare; the only way to
/// build one is [`Currency::parse`], which guarantees the code is in [`CURRENCIES`]. Serde reads and
/// writes the code without an intermediate `String` (every ledger entry carries one).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Currency([u8; 3]);

impl Currency {
    /// West African CFA franc.
    pub const XOF: Currency = Currency(*b"XOF");
    /// Central African CFA franc.
    pub const XAF: Currency = Currency(*b"XAF");
    /// Guinean franc.
    pub const GNF: Currency = Currency(*b"GNF");
    /// Euro.
    pub const EUR: Currency = Currency(*b"EUR");
    /// US dollar.
    pub const USD: Currency = Currency(*b"USD");

    /// Accepts exactly an uppercase catalogue code; `"xof"` or `" XOF"` are refused so that
    /// requests and stored records always carry the canonical spelling.
    pub fn parse(code: &str) -> Result<Currency, MoneyError> {
        CURRENCIES
            .iter()
            .find(|info| info.code == code)
            .and_then(|info| <[u8; 3]>::try_from(info.code.as_bytes()).ok())
            .map(Currency)
            .ok_or_else(|| MoneyError::UnknownCurrency(code.to_string()))
    }

    /// The ISO 4217 code, e.g. `"XOF"`.
    pub fn code(&self) -> &str {
        self.info().code
    }

    /// The catalogue entry for this currency.
    pub fn info(&self) -> &'static CurrencyInfo {
        CURRENCIES.iter().find(|info| info.code.as_bytes() == self.0).unwrap_or(&UNKNOWN_CURRENCY)
    }

    /// Number of decimals of the smallest unit (0 for XOF, 2 for EUR).
    pub fn decimals(&self) -> u8 {
        self.info().decimals
    }

    /// Display name, e.g. `"Franc CFA BCEAO"`.
    pub fn name(&self) -> &'static str {
        self.info().name
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

impl fmt::Debug for Currency {
    /// Shows the code rather than three raw bytes, which is what a reader of a log wants.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Currency({})", self.code())
    }
}

impl FromStr for Currency {
    type Err = MoneyError;

    fn from_str(code: &str) -> Result<Currency, MoneyError> {
        Currency::parse(code)
    }
}

impl Serialize for Currency {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.code())
    }
}

impl<'de> Deserialize<'de> for Currency {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Currency, D::Error> {
        super::parse_str(deserializer, "a currency code", Currency::parse)
    }
}

impl TryFrom<String> for Currency {
    type Error = MoneyError;

    fn try_from(code: String) -> Result<Currency, MoneyError> {
        Currency::parse(&code)
    }
}

impl From<Currency> for String {
    fn from(currency: Currency) -> String {
        currency.code().to_string()
    }
}

/// A provider's fee: a percentage in basis points plus a fixed part, both in the payment's
/// currency.
///
/// The fee is fixed at initiation (docs/api.md § Payments), so the rule is copied into the payment record
/// rather than looked up again later.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "FeeRuleFields")]
pub struct FeeRule {
    /// Percentage part in basis points (100 = 1 %), at most 10 000.
    #[serde(rename = "pourcentage_bps")]
    pub percentage_bps: u32,
    /// Fixed part in the smallest unit of the currency.
    #[serde(rename = "fixe")]
    pub fixed: Amount,
}

/// The raw shape of a [`FeeRule`], so deserialisation can check the rate like [`FeeRule::new`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FeeRuleFields {
    #[serde(rename = "pourcentage_bps")]
    percentage_bps: u32,
    #[serde(rename = "fixe")]
    fixed: Amount,
}

impl TryFrom<FeeRuleFields> for FeeRule {
    type Error = MoneyError;

    fn try_from(fields: FeeRuleFields) -> Result<FeeRule, MoneyError> {
        FeeRule::new(fields.percentage_bps, fields.fixed)
    }
}

impl FeeRule {
    /// The largest percentage part: 10 000 basis points is 100 %.
    pub const MAX_BPS: u32 = 10_000;

    /// Builds a rule, refusing a percentage above 100 %.
    pub fn new(percentage_bps: u32, fixed: Amount) -> Result<FeeRule, MoneyError> {
        if percentage_bps > Self::MAX_BPS {
            return Err(MoneyError::FeeRateTooHigh(percentage_bps));
        }
        Ok(FeeRule { percentage_bps, fixed })
    }

    /// Computes `(montant * bps + 5000) / 10000 + fixe`.
    ///
    /// Adding 5000 before the integer division rounds half up, as docs/api.md § Payments fixes.
    /// The product is taken in `i128` so it cannot overflow; only the final conversion back to
    /// `i64` and the addition of the fixed part can, and both report [`MoneyError::Overflow`].
    pub fn fee(&self, amount: Amount) -> Result<Amount, MoneyError> {
        let product = i128::from(amount.minor())
            .checked_mul(i128::from(self.percentage_bps))
            .and_then(|p| p.checked_add(5_000))
            .ok_or(MoneyError::Overflow)?;
        let percentage = i64::try_from(product / 10_000).map_err(|_| MoneyError::Overflow)?;
        Amount::new(percentage)?.checked_add(self.fixed)
    }
}

/// Formats a minor-unit amount for people: `1050` EUR is `"10,50 EUR"`, `1234567` XOF is
/// `"1 234 567 XOF"`.
///
/// The French conventions apply (space between thousands, comma before decimals) because the
/// dashboard is in French. Negative values are allowed because ledger deltas can be negative.
pub fn format_major(amount_minor: i64, currency: Currency) -> String {
    let sign = if amount_minor < 0 { "-" } else { "" };
    // `unsigned_abs` also handles `i64::MIN`, whose absolute value does not fit in an i64.
    let magnitude = amount_minor.unsigned_abs();
    let decimals = u32::from(currency.decimals());
    let divisor = 10u64.pow(decimals);
    let whole = group_thousands(magnitude / divisor);
    if decimals == 0 {
        format!("{sign}{whole} {currency}")
    } else {
        let fraction = magnitude % divisor;
        let width = decimals as usize;
        format!("{sign}{whole},{fraction:0width$} {currency}")
    }
}

/// Writes a number with a space every three digits from the right.
fn group_thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(digit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn amount_new_accepts_zero_and_positive() {
        assert_eq!(Amount::new(0).unwrap(), Amount::ZERO);
        assert_eq!(Amount::new(1050).unwrap().minor(), 1050);
        assert_eq!(Amount::new(i64::MAX).unwrap().minor(), i64::MAX);
    }

    #[test]
    fn amount_new_rejects_negative() {
        assert_eq!(Amount::new(-1), Err(MoneyError::Negative));
        assert_eq!(Amount::new(i64::MIN), Err(MoneyError::Negative));
    }

    #[test]
    fn amount_positive_rejects_zero_and_negative() {
        assert_eq!(Amount::positive(1).unwrap().minor(), 1);
        assert_eq!(Amount::positive(0), Err(MoneyError::NotPositive));
        assert_eq!(Amount::positive(-5), Err(MoneyError::NotPositive));
    }

    #[test]
    fn amount_arithmetic_is_checked() {
        let a = Amount::new(100).unwrap();
        let b = Amount::new(30).unwrap();
        assert_eq!(a.checked_add(b).unwrap().minor(), 130);
        assert_eq!(a.checked_sub(b).unwrap().minor(), 70);
        assert_eq!(a.checked_sub(a).unwrap(), Amount::ZERO);
        assert_eq!(b.checked_sub(a), Err(MoneyError::Negative));
        let max = Amount::new(i64::MAX).unwrap();
        assert_eq!(max.checked_add(Amount::new(1).unwrap()), Err(MoneyError::Overflow));
    }

    #[test]
    fn amount_serde_is_a_bare_checked_integer() {
        let a = Amount::new(1050).unwrap();
        assert_eq!(serde_json::to_string(&a).unwrap(), "1050");
        assert_eq!(serde_json::from_str::<Amount>("1050").unwrap(), a);
        assert!(serde_json::from_str::<Amount>("-1").is_err());
        assert!(serde_json::from_str::<Amount>("10.5").is_err());
        assert!(serde_json::from_str::<Amount>("\"1050\"").is_err());
        assert!(serde_json::from_str::<Amount>("99999999999999999999").is_err());
    }

    #[test]
    fn currency_parse_accepts_catalogue_codes() {
        for info in CURRENCIES {
            let currency = Currency::parse(info.code).unwrap();
            assert_eq!(currency.code(), info.code);
            assert_eq!(currency.name(), info.name);
            assert_eq!(currency.decimals(), info.decimals);
            assert_eq!(currency.info(), info);
            assert_eq!(currency.to_string(), info.code);
        }
        assert_eq!(Currency::parse("XOF").unwrap(), Currency::XOF);
        assert_eq!(Currency::EUR.decimals(), 2);
        assert_eq!(Currency::GNF.name(), "Franc guinéen");
    }

    #[test]
    fn currency_parse_rejects_others() {
        for bad in ["", "xof", "Xof", " XOF", "XOF ", "XO", "XOFF", "GBP", "€"] {
            assert_eq!(Currency::parse(bad), Err(MoneyError::UnknownCurrency(bad.to_string())), "{bad:?}");
        }
    }

    #[test]
    fn currency_serde_is_the_code() {
        assert_eq!(serde_json::to_string(&Currency::USD).unwrap(), "\"USD\"");
        assert_eq!(serde_json::from_str::<Currency>("\"XAF\"").unwrap(), Currency::XAF);
        // An escaped spelling is the same text once read.
        assert_eq!(serde_json::from_str::<Currency>("\"\\u0058OF\"").unwrap(), Currency::XOF);
        let refused = serde_json::from_str::<Currency>("\"usd\"").unwrap_err().to_string();
        assert!(refused.starts_with("unknown currency `usd` (supported:"), "{refused}");
        let refused = serde_json::from_str::<Currency>("952").unwrap_err().to_string();
        assert!(refused.starts_with("invalid type: integer `952`, expected a currency code"), "{refused}");
    }

    #[test]
    fn fee_rule_new_checks_rate() {
        let fixed = Amount::new(25).unwrap();
        assert_eq!(FeeRule::new(0, fixed).unwrap().percentage_bps, 0);
        assert_eq!(FeeRule::new(10_000, fixed).unwrap().fixed, fixed);
        assert_eq!(FeeRule::new(10_001, fixed), Err(MoneyError::FeeRateTooHigh(10_001)));
    }

    #[test]
    fn fee_rounds_half_up() {
        let rule = FeeRule::new(100, Amount::ZERO).unwrap(); // 1 %
        let fee = |m| rule.fee(Amount::new(m).unwrap()).unwrap().minor();
        assert_eq!(fee(149), 1); // 1.49 -> 1
        assert_eq!(fee(150), 2); // 1.50 -> 2
        assert_eq!(fee(250), 3); // 2.50 -> 3 (half up, not half even)
        assert_eq!(fee(0), 0);
        let rule = FeeRule::new(150, Amount::new(50).unwrap()).unwrap(); // 1.5 % + 50
        assert_eq!(rule.fee(Amount::new(10_000).unwrap()).unwrap().minor(), 200);
    }

    #[test]
    fn fee_overflow_is_an_error() {
        let rule = FeeRule::new(10_000, Amount::new(1).unwrap()).unwrap();
        assert_eq!(rule.fee(Amount::new(i64::MAX).unwrap()), Err(MoneyError::Overflow));
        // A rate built directly through the public fields, above 100 %, still cannot panic.
        let wild = FeeRule { percentage_bps: u32::MAX, fixed: Amount::ZERO };
        assert_eq!(wild.fee(Amount::new(i64::MAX).unwrap()), Err(MoneyError::Overflow));
    }

    #[test]
    fn fee_rule_serde_checks_rate() {
        let rule = FeeRule::new(150, Amount::new(50).unwrap()).unwrap();
        let json = serde_json::to_string(&rule).unwrap();
        assert_eq!(json, r#"{"pourcentage_bps":150,"fixe":50}"#);
        assert_eq!(serde_json::from_str::<FeeRule>(&json).unwrap(), rule);
        assert!(serde_json::from_str::<FeeRule>(r#"{"pourcentage_bps":10001,"fixe":0}"#).is_err());
        assert!(serde_json::from_str::<FeeRule>(r#"{"pourcentage_bps":1,"fixe":-1}"#).is_err());
        assert!(serde_json::from_str::<FeeRule>(r#"{"pourcentage_bps":1}"#).is_err());
    }

    #[test]
    fn format_major_examples() {
        assert_eq!(format_major(1050, Currency::EUR), "10,50 EUR");
        assert_eq!(format_major(5, Currency::EUR), "0,05 EUR");
        assert_eq!(format_major(0, Currency::USD), "0,00 USD");
        assert_eq!(format_major(123_456_789, Currency::USD), "1 234 567,89 USD");
        assert_eq!(format_major(5000, Currency::XOF), "5 000 XOF");
        assert_eq!(format_major(1_234_567, Currency::XOF), "1 234 567 XOF");
        assert_eq!(format_major(999, Currency::XAF), "999 XAF");
        assert_eq!(format_major(100_000, Currency::GNF), "100 000 GNF");
        assert_eq!(format_major(-1050, Currency::EUR), "-10,50 EUR");
        assert_eq!(format_major(-5000, Currency::XOF), "-5 000 XOF");
        assert_eq!(format_major(i64::MIN, Currency::XOF), "-9 223 372 036 854 775 808 XOF");
    }

    proptest! {
        #[test]
        fn fee_never_panics(amount in 0i64..=i64::MAX, bps in 0u32..=10_000, fixed in 0i64..=i64::MAX) {
            let rule = FeeRule::new(bps, Amount::new(fixed).unwrap()).unwrap();
            let _ = rule.fee(Amount::new(amount).unwrap());
        }

        #[test]
        fn fee_percentage_part_never_exceeds_amount(amount in 0i64..=i64::MAX, bps in 0u32..=10_000) {
            let rule = FeeRule::new(bps, Amount::ZERO).unwrap();
            let fee = rule.fee(Amount::new(amount).unwrap()).unwrap();
            prop_assert!(fee.minor() <= amount);
        }

        #[test]
        fn format_major_keeps_the_digits(value in any::<i64>()) {
            for currency in [Currency::XOF, Currency::EUR] {
                let text = format_major(value, currency);
                let digits: String = text.chars().filter(char::is_ascii_digit).collect();
                let expected = value.unsigned_abs().to_string();
                prop_assert_eq!(digits.trim_start_matches('0'), expected.trim_start_matches('0'));
            }
        }
    }
}
