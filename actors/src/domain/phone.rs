//! Customer and beneficiary phone numbers in E.164 form.
//!
//! Mobile-money providers address people by phone number, so a malformed number must be
//! refused at the API edge (docs/api.md § Payments, Payouts) rather than reach a provider. This module
//! owns the one stored spelling: `+`, then 8 to 15 digits, the first of which is not `0`, which is the exact
//! string the provider and the sandbox will see. [`Phone::parse_written`] reads a number as people write it
//! (spaces, dashes, dots, parentheses, a `00` international prefix) into that spelling.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why a phone number was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum PhoneError {
    /// E.164 numbers are written with a leading `+`.
    #[error("phone number must start with '+' (E.164, e.g. +22997000001)")]
    MissingPlus,
    /// Only ASCII digits may follow the `+`.
    #[error("phone number must contain only digits after '+'")]
    NonDigit,
    /// E.164 allows at most 15 digits; fewer than 8 cannot be a real subscriber number.
    #[error("phone number must have 8 to 15 digits after '+', found {digits}")]
    BadLength {
        /// How many characters followed the `+`.
        digits: usize,
    },
    /// Country codes never start with `0`.
    #[error("phone number country code must not start with 0")]
    LeadingZero,
}

/// Calling codes of the countries Caisse's providers serve, and their ISO 3166 alpha-2 codes. Codes are
/// prefix-free within West and Central Africa, so the first match is the only one.
const COUNTRY_CODES: &[(&str, &str)] = &[
    ("221", "SN"),
    ("223", "ML"),
    ("224", "GN"),
    ("225", "CI"),
    ("226", "BF"),
    ("227", "NE"),
    ("228", "TG"),
    ("229", "BJ"),
    ("233", "GH"),
    ("234", "NG"),
    ("237", "CM"),
    ("241", "GA"),
    ("242", "CG"),
    ("243", "CD"),
    ("33", "FR"),
];

/// Countries whose national numbers are dialled with a leading `0` that the international form drops.
const TRUNK_PREFIXED: [&str; 3] = ["FR", "GH", "NG"];

/// The calling code of a country Caisse's providers serve (ISO 3166 alpha-2, `BJ` -> `229`).
pub fn calling_code(country: &str) -> Option<&'static str> {
    COUNTRY_CODES.iter().find(|(_, c)| *c == country).map(|(code, _)| *code)
}

/// A phone number in E.164 form, e.g. `+22997000001`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Phone(String);

impl Phone {
    /// Fewest digits accepted after the `+`.
    pub const MIN_DIGITS: usize = 8;
    /// Most digits accepted after the `+`, the E.164 maximum.
    pub const MAX_DIGITS: usize = 15;

    /// Longest input [`Phone::parse_written`] looks at: separators included, a number is never longer.
    const MAX_WRITTEN: usize = 40;

    /// A number as people write it (`+229 97 00 00 01`, `+229-97.00.00.01`, `0022997000001`): spaces,
    /// dashes, dots and parentheses are dropped and a leading `00` is read as `+`, then the result must be
    /// E.164 ([`Phone::parse`]). A number without its country code cannot be read without knowing the
    /// country, so it is refused like any other non-E.164 text.
    pub fn parse_written(input: &str) -> Result<Phone, PhoneError> {
        if input.len() > Self::MAX_WRITTEN {
            return Err(PhoneError::BadLength { digits: input.len() });
        }
        let compact: String =
            input.trim().chars().filter(|c| !matches!(c, ' ' | '-' | '.' | '(' | ')' | '\u{a0}')).collect();
        match compact.strip_prefix("00") {
            Some(rest) => Phone::parse(&format!("+{rest}")),
            None => Phone::parse(&compact),
        }
    }

    /// A number as a customer types it on a page that offers a country: international forms as
    /// [`Phone::parse_written`] reads them, and otherwise a national number (`97 00 00 01`), whose digits
    /// follow the country's calling code. West and Central African numbering plans have no trunk prefix (a
    /// leading `0`, as in Côte d'Ivoire's `07 ...`, is part of the number); France, Ghana and Nigeria dial one
    /// (`06 12 34 56 78`), which is dropped.
    pub fn parse_national(input: &str, country: &str) -> Result<Phone, PhoneError> {
        let trimmed = input.trim();
        if trimmed.starts_with('+') || trimmed.starts_with("00") {
            return Phone::parse_written(trimmed);
        }
        let national = match TRUNK_PREFIXED.contains(&country) {
            true => trimmed.strip_prefix('0').unwrap_or(trimmed),
            false => trimmed,
        };
        match calling_code(country) {
            Some(code) => Phone::parse_written(&format!("+{code}{national}")),
            None => Phone::parse_written(trimmed),
        }
    }

    /// Checks the E.164 shape and keeps the number exactly as written.
    pub fn parse(input: &str) -> Result<Phone, PhoneError> {
        let digits = input.strip_prefix('+').ok_or(PhoneError::MissingPlus)?;
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(PhoneError::NonDigit);
        }
        // Every byte is an ASCII digit here, so the byte length is the digit count.
        if !(Self::MIN_DIGITS..=Self::MAX_DIGITS).contains(&digits.len()) {
            return Err(PhoneError::BadLength { digits: digits.len() });
        }
        if digits.starts_with('0') {
            return Err(PhoneError::LeadingZero);
        }
        Ok(Phone(input.to_string()))
    }

    /// The number as written, with its `+`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The ISO 3166 alpha-2 country of the number's calling code, for the countries Caisse's providers serve;
    /// `None` for another one. Providers route by country, so this decides which adapter carries a payment.
    pub fn country(&self) -> Option<&'static str> {
        let digits = self.digits();
        COUNTRY_CODES.iter().find(|(code, _)| digits.starts_with(code)).map(|(_, country)| *country)
    }

    /// The digits without the `+`, as most provider APIs want the number (`22997000001`).
    pub fn digits(&self) -> &str {
        self.0.strip_prefix('+').unwrap_or(&self.0)
    }

    /// The last two digits, which the sandbox provider reads to pick a scripted outcome.
    pub fn last_two_digits(&self) -> &str {
        // The number holds at least 9 ASCII bytes, so this slice is always two digits; `get`
        // keeps the function panic-free even so.
        self.0.get(self.0.len().saturating_sub(2)..).unwrap_or("")
    }
}

impl fmt::Display for Phone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Phone {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for Phone {
    type Err = PhoneError;

    fn from_str(input: &str) -> Result<Phone, PhoneError> {
        Phone::parse(input)
    }
}

impl TryFrom<String> for Phone {
    type Error = PhoneError;

    fn try_from(input: String) -> Result<Phone, PhoneError> {
        Phone::parse(&input)
    }
}

impl From<Phone> for String {
    fn from(phone: Phone) -> String {
        phone.0
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn national_numbers_take_the_country_offered() {
        for written in ["97 00 00 01", "97-00-00-01", "+229 97000001", "0022997000001", " 97000001 "] {
            assert_eq!(Phone::parse_national(written, "BJ").unwrap().as_str(), "+22997000001", "{written}");
        }
        assert_eq!(Phone::parse_national("07 07 00 00 01", "CI").unwrap().as_str(), "+2250707000001");
        assert_eq!(Phone::parse_national("06 12 34 56 78", "FR").unwrap().as_str(), "+33612345678");
        assert_eq!(Phone::parse_national("+221 77 000 00 01", "BJ").unwrap().country(), Some("SN"));
        assert!(Phone::parse_national("97 00 ab 01", "BJ").is_err());
        assert!(Phone::parse_national("", "BJ").is_err());
        assert_eq!(calling_code("SN"), Some("221"));
        assert_eq!(calling_code("ZZ"), None);
    }

    use super::*;

    #[test]
    fn written_numbers_are_read_into_e164() {
        for written in
            ["+229 97 00 00 01", "+229-97-00-00-01", "+229.97.00.00.01", "0022997000001", " +229 (97) 000001 "]
        {
            assert_eq!(
                Phone::parse_written(written).map(|p| p.as_str().to_owned()),
                Ok("+22997000001".into()),
                "{written}"
            );
        }
        assert_eq!(Phone::parse_written("97 00 00 01"), Err(PhoneError::MissingPlus), "no country code");
        assert!(Phone::parse_written("+229 97 00 00 0a").is_err());
        assert!(Phone::parse_written(&format!("+229{}", " ".repeat(60))).is_err());
        assert_eq!(Phone::parse("+229 97000001"), Err(PhoneError::NonDigit), "the stored form stays strict");
    }

    #[test]
    fn the_country_comes_from_the_calling_code() {
        let country = |n: &str| Phone::parse(n).unwrap().country();
        assert_eq!(country("+22997000001"), Some("BJ"));
        assert_eq!(country("+2250707000001"), Some("CI"));
        assert_eq!(country("+221771234567"), Some("SN"));
        assert_eq!(country("+237650000000"), Some("CM"));
        assert_eq!(country("+33612345678"), Some("FR"));
        assert_eq!(country("+15551234567"), None);
        assert_eq!(Phone::parse("+22997000001").unwrap().digits(), "22997000001");
    }

    #[test]
    fn parse_accepts_e164() {
        for good in ["+22997000001", "+12345678", "+123456789012345", "+33612345678"] {
            let phone = Phone::parse(good).unwrap();
            assert_eq!(phone.as_str(), good);
            assert_eq!(phone.to_string(), good);
        }
    }

    #[test]
    fn parse_rejects_malformed() {
        assert_eq!(Phone::parse(""), Err(PhoneError::MissingPlus));
        assert_eq!(Phone::parse("22997000001"), Err(PhoneError::MissingPlus));
        assert_eq!(Phone::parse(" +22997000001"), Err(PhoneError::MissingPlus));
        assert_eq!(Phone::parse("+229 97000001"), Err(PhoneError::NonDigit));
        assert_eq!(Phone::parse("+229-97000001"), Err(PhoneError::NonDigit));
        assert_eq!(Phone::parse("+22997000001 "), Err(PhoneError::NonDigit));
        assert_eq!(Phone::parse("++22997000001"), Err(PhoneError::NonDigit));
        assert_eq!(Phone::parse("+٢٢٩٩٧٠٠٠٠٠١"), Err(PhoneError::NonDigit));
        assert_eq!(Phone::parse("+"), Err(PhoneError::BadLength { digits: 0 }));
        assert_eq!(Phone::parse("+1234567"), Err(PhoneError::BadLength { digits: 7 }));
        assert_eq!(Phone::parse("+1234567890123456"), Err(PhoneError::BadLength { digits: 16 }));
        assert_eq!(Phone::parse("+02997000001"), Err(PhoneError::LeadingZero));
    }

    #[test]
    fn last_two_digits_reads_the_end() {
        assert_eq!(Phone::parse("+22997000001").unwrap().last_two_digits(), "01");
        assert_eq!(Phone::parse("+12345678").unwrap().last_two_digits(), "78");
    }

    #[test]
    fn serde_is_the_checked_string() {
        let phone = Phone::parse("+22997000001").unwrap();
        assert_eq!(serde_json::to_string(&phone).unwrap(), "\"+22997000001\"");
        assert_eq!(serde_json::from_str::<Phone>("\"+22997000001\"").unwrap(), phone);
        assert!(serde_json::from_str::<Phone>("\"22997000001\"").is_err());
        assert!(serde_json::from_str::<Phone>("22997000001").is_err());
    }
}
