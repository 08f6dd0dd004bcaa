//! Identifiers: prefixed, time-sortable ids, merchant ids and random secrets.
//!
//! The API's ids look like `pay_…` and sort by creation time (docs/api.md § Conventions). Each id is a kind
//! prefix, `_`, and a ULID: 48 bits of Unix milliseconds and 80 random bits written as 26
//! Crockford base32 characters, so string order is time order. This module owns the process-wide
//! generator that keeps that order strict even when several ids are made in the same millisecond
//! or the wall clock steps backwards, because lists and store keys are ordered by id.

use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};

use rand::distributions::Alphanumeric;
use rand::rngs::OsRng;
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::time::Timestamp;

/// Crockford's base32 alphabet: no I, L, O or U, so ids cannot be misread or spell words.
const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
/// Characters in the ULID part of an id.
const ULID_LEN: usize = 26;
/// Largest time a ULID can hold (48 bits of milliseconds, in the year 10889).
const MAX_MS: u64 = (1 << 48) - 1;
/// Mask of the 80 random bits.
const RANDOM_MASK: u128 = (1 << 80) - 1;
/// The largest step, less one, between two ids made in the same millisecond.
const STEP_MASK: u128 = (1 << 40) - 1;

/// Length of a [`MerchantId`] in bytes: `mch_` plus 26 characters.
///
/// Store keys put the merchant id first and rely on this fixed width to split keys.
pub const MERCHANT_ID_LEN: usize = 30;

/// Why an identifier string was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum IdError {
    /// The id does not start with the prefix of its kind.
    #[error("identifier must start with `{expected}_`")]
    WrongPrefix {
        /// The prefix that was expected, without the underscore.
        expected: &'static str,
    },
    /// The id does not have the length of a prefix plus a 26-character ULID.
    #[error("identifier must be {expected} characters long, found {found}")]
    BadLength {
        /// The required length in bytes.
        expected: usize,
        /// The length that was found, in bytes.
        found: usize,
    },
    /// The ULID part contains a character outside uppercase Crockford base32.
    #[error("identifier contains a character outside Crockford base32 (0-9, A-Z without I, L, O, U)")]
    InvalidChar,
}

/// The kinds of object that carry a prefixed id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IdKind {
    /// `pay_…`
    Payment,
    /// `rmb_…` (remboursement)
    Refund,
    /// `ret_…` (retrait)
    Payout,
    /// `tx_…`
    Transaction,
    /// `mch_…`
    Merchant,
    /// `evt_…`
    Event,
    /// `lnk_…` (lien de paiement)
    Link,
}

impl IdKind {
    /// Every kind, for code that needs to try them all.
    pub const ALL: [IdKind; 7] = [
        IdKind::Payment,
        IdKind::Refund,
        IdKind::Payout,
        IdKind::Transaction,
        IdKind::Merchant,
        IdKind::Event,
        IdKind::Link,
    ];

    /// The prefix written before the `_`.
    pub fn prefix(self) -> &'static str {
        match self {
            IdKind::Payment => "pay",
            IdKind::Refund => "rmb",
            IdKind::Payout => "ret",
            IdKind::Transaction => "tx",
            IdKind::Merchant => "mch",
            IdKind::Event => "evt",
            IdKind::Link => "lnk",
        }
    }

    /// Length in bytes of every id of this kind.
    pub fn id_len(self) -> usize {
        self.prefix().len() + 1 + ULID_LEN
    }
}

/// The state behind monotonic ids: the time and random part of the last id handed out.
struct Generator {
    last: Option<(u64, u128)>,
}

impl Generator {
    const fn new() -> Generator {
        Generator { last: None }
    }

    /// Returns the (ms, random) pair for the next id, strictly greater than the previous one.
    ///
    /// When the clock has not moved past the last id's millisecond (same millisecond, or the clock stepped
    /// back), the last millisecond is kept and the random part grows, as the ULID spec's monotonic mode does,
    /// but by a random step of up to 2^40 rather than by one: ids made in the same millisecond stay in order
    /// without one being guessable from another. (A customer who sees their transaction's id in an address
    /// must not find the next customer's by adding one.) `fresh` supplies the randomness.
    fn next(&mut self, now_ms: u64, fresh: impl FnOnce() -> u128) -> (u64, u128) {
        let now_ms = now_ms.min(MAX_MS);
        let next = match self.last {
            Some((last_ms, last_random)) if now_ms <= last_ms => {
                let step = (fresh() & STEP_MASK) + 1;
                match last_random.checked_add(step).filter(|r| *r <= RANDOM_MASK) {
                    Some(random) => (last_ms, random),
                    // 2^40 ids in one millisecond cannot happen, but borrowing the next millisecond keeps the
                    // order strict without a panic if it ever did.
                    None if last_ms < MAX_MS => (last_ms + 1, 0),
                    // The end of ULID time (year 10889): nothing larger exists, so repeat.
                    None => (last_ms, last_random),
                }
            }
            _ => (now_ms, fresh() & RANDOM_MASK),
        };
        self.last = Some(next);
        next
    }
}

/// The process-wide generator. A mutex is enough: making an id is a few nanoseconds of work.
static GENERATOR: Mutex<Generator> = Mutex::new(Generator::new());

/// 80 fresh random bits from the thread-local CSPRNG, so ids are not guessable.
fn random_bits() -> u128 {
    rand::thread_rng().gen::<u128>() & RANDOM_MASK
}

/// Writes a 48-bit time and an 80-bit random part as 26 Crockford base32 characters.
fn encode_ulid(ms: u64, random: u128) -> [u8; ULID_LEN] {
    let value = (u128::from(ms.min(MAX_MS)) << 80) | (random & RANDOM_MASK);
    let mut out = [b'0'; ULID_LEN];
    for (index, slot) in out.iter_mut().enumerate() {
        // 26 characters hold 130 bits; the first one carries only the top 3 bits of the 128.
        let shift = 5 * (ULID_LEN - 1 - index);
        *slot = ALPHABET[((value >> shift) & 31) as usize];
    }
    out
}

/// Joins a prefix and an encoded ULID.
fn format_id(kind: IdKind, ulid: &[u8; ULID_LEN]) -> String {
    let mut id = String::with_capacity(kind.id_len());
    id.push_str(kind.prefix());
    id.push('_');
    // The bytes all come from `ALPHABET`, which is ASCII.
    id.extend(ulid.iter().map(|&b| char::from(b)));
    id
}

/// Makes a new id of `kind` at the current time, e.g. `pay_01JD3ZK0…`.
///
/// Ids made by this function in one process are strictly increasing in string order, across
/// all kinds, even if the wall clock goes backwards.
pub fn new_id(kind: IdKind) -> String {
    let now = Timestamp::now().unix_ms();
    // A panic while the lock was held cannot leave the state half-written (it is one
    // assignment), so a poisoned lock is still safe to use.
    let (ms, random) = GENERATOR.lock().unwrap_or_else(PoisonError::into_inner).next(now, random_bits);
    format_id(kind, &encode_ulid(ms, random))
}

/// Makes an id of `kind` whose time part is exactly `unix_ms` (clamped to 48 bits).
///
/// This is for tests and fixtures that need ids at chosen instants. It does not go through the
/// process-wide monotonic state: ids made in the same millisecond are ordered by their random
/// part only, and calling it never disturbs the order of [`new_id`].
pub fn new_id_at(kind: IdKind, unix_ms: u64) -> String {
    format_id(kind, &encode_ulid(unix_ms, random_bits()))
}

/// The smallest id of `kind` made at `unix_ms`: every id made before that instant sorts below it, so it bounds
/// a range of ids by time.
pub fn first_id_at(kind: IdKind, unix_ms: u64) -> String {
    format_id(kind, &encode_ulid(unix_ms, 0))
}

/// Checks that `id` is `kind`'s prefix, `_`, and 26 uppercase Crockford base32 characters.
pub fn validate_id(kind: IdKind, id: &str) -> Result<(), IdError> {
    let expected = kind.prefix();
    let body =
        id.strip_prefix(expected).and_then(|rest| rest.strip_prefix('_')).ok_or(IdError::WrongPrefix { expected })?;
    if id.len() != kind.id_len() {
        return Err(IdError::BadLength { expected: kind.id_len(), found: id.len() });
    }
    if !body.bytes().all(|b| ALPHABET.contains(&b)) {
        return Err(IdError::InvalidChar);
    }
    Ok(())
}

/// The 128 bits of the ULID an id of ours ends with (`tx_01JD…`, `rmb_…`, `ret_…`); `None` for anything else.
pub fn ulid_bits(id: &str) -> Option<u128> {
    let (_, body) = id.split_once('_')?;
    if body.len() != ULID_LEN {
        return None;
    }
    let mut value: u128 = 0;
    for (index, byte) in body.bytes().enumerate() {
        let digit = ALPHABET.iter().position(|&a| a == byte)? as u128;
        // The first character carries only the top 3 of the 128 bits.
        if index == 0 && digit > 7 {
            return None;
        }
        value = (value << 5) | digit;
    }
    Some(value)
}

/// An id of ours written as a UUID of version 4 (RFC 9562 variant), for providers that require their
/// client-chosen ids in that form (pawaPay's `depositId`, MTN's `X-Reference-Id`).
///
/// Derived, not drawn: the outbound id of a transaction is fixed the moment the transaction is durably created,
/// so a retry, a status query or a restart always uses the same one and a provider can never be asked twice
/// under two ids. The ULID's 128 bits go in as they are, except the six bits the UUID format fixes (the version
/// nibble and the variant's two bits); both fall in the ULID's random part, which keeps 74 of its 80 bits.
pub fn uuid_of(id: &str) -> Option<String> {
    let mut bits = ulid_bits(id)?;
    bits = (bits & !(0xF << 76)) | (0x4 << 76);
    bits = (bits & !(0x3 << 62)) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    Some(format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]))
}

/// A merchant's id, `mch_` plus a ULID: always exactly [`MERCHANT_ID_LEN`] ASCII bytes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MerchantId(String);

impl MerchantId {
    /// Generates a fresh merchant id.
    // A `Default` that invents a new random merchant would be surprising, so none is provided.
    #[allow(clippy::new_without_default)]
    pub fn new() -> MerchantId {
        MerchantId(new_id(IdKind::Merchant))
    }

    /// Checks prefix, length and alphabet.
    pub fn parse(id: &str) -> Result<MerchantId, IdError> {
        validate_id(IdKind::Merchant, id)?;
        Ok(MerchantId(id.to_string()))
    }

    /// Reads a merchant id back from the first bytes of a store key.
    pub fn from_bytes(bytes: &[u8]) -> Result<MerchantId, IdError> {
        let id = std::str::from_utf8(bytes).map_err(|_| IdError::InvalidChar)?;
        MerchantId::parse(id)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as bytes; always [`MERCHANT_ID_LEN`] long, which store keys rely on.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Display for MerchantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for MerchantId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for MerchantId {
    type Err = IdError;

    fn from_str(id: &str) -> Result<MerchantId, IdError> {
        MerchantId::parse(id)
    }
}

impl TryFrom<String> for MerchantId {
    type Error = IdError;

    fn try_from(id: String) -> Result<MerchantId, IdError> {
        validate_id(IdKind::Merchant, &id)?;
        Ok(MerchantId(id))
    }
}

impl From<MerchantId> for String {
    fn from(id: MerchantId) -> String {
        id.0
    }
}

/// A random string of `len` characters from `[A-Za-z0-9]`, for secret keys and passwords.
///
/// The characters come straight from the operating system's CSPRNG, and `Alphanumeric` samples
/// without modulo bias, so each character carries log2(62) ≈ 5.95 bits of entropy.
pub fn random_base62(len: usize) -> String {
    OsRng.sample_iter(Alphanumeric).take(len).map(char::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_as_a_uuid_is_version_4_stable_and_distinct() {
        let id = new_id(IdKind::Transaction);
        let uuid = uuid_of(&id).unwrap();
        assert_eq!(uuid.len(), 36);
        let groups: Vec<&str> = uuid.split('-').collect();
        assert_eq!(groups.iter().map(|g| g.len()).collect::<Vec<_>>(), [8, 4, 4, 4, 12]);
        assert!(groups[2].starts_with('4'), "{uuid}");
        assert!(matches!(groups[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'), "{uuid}");
        assert_eq!(uuid_of(&id), Some(uuid.clone()), "the same id gives the same UUID");
        let ulid = &id[3..];
        assert_eq!(uuid_of(&format!("rmb_{ulid}")), Some(uuid), "the prefix does not matter");
        let next = new_id(IdKind::Transaction);
        assert_ne!(uuid_of(&next), uuid_of(&id));
        for bad in ["tx_", "tx_short", "nothing", "tx_8ZZZZZZZZZZZZZZZZZZZZZZZZZ", "tx_01JD000000000000000000000I"] {
            assert_eq!(uuid_of(bad), None, "{bad}");
        }
        assert_eq!(ulid_bits("tx_00000000000000000000000001"), Some(1));
    }

    /// Reads the time part back, to check what was encoded.
    fn decode_ms(id: &str) -> u64 {
        let body = &id[id.len() - ULID_LEN..];
        let mut value: u128 = 0;
        for b in body.bytes() {
            value = (value << 5) | ALPHABET.iter().position(|&a| a == b).unwrap() as u128;
        }
        (value >> 80) as u64
    }

    #[test]
    fn encoding_matches_the_ulid_spec() {
        assert_eq!(&encode_ulid(1_469_922_850_259, 0)[..10], b"01ARZ3NDEK");
        assert_eq!(&encode_ulid(0, 0), b"00000000000000000000000000");
        assert_eq!(&encode_ulid(MAX_MS, RANDOM_MASK), b"7ZZZZZZZZZZZZZZZZZZZZZZZZZ");
    }

    #[test]
    fn ids_have_prefix_and_length() {
        for kind in IdKind::ALL {
            let id = new_id(kind);
            assert!(id.starts_with(&format!("{}_", kind.prefix())), "{id}");
            assert_eq!(id.len(), kind.id_len());
            assert_eq!(validate_id(kind, &id), Ok(()));
        }
        assert_eq!(new_id(IdKind::Transaction).len(), 29);
        assert_eq!(new_id(IdKind::Merchant).len(), MERCHANT_ID_LEN);
    }

    #[test]
    fn ids_are_strictly_increasing() {
        let mut previous = new_id(IdKind::Payment);
        for _ in 0..10_000 {
            let next = new_id(IdKind::Payment);
            assert!(next > previous, "{next} <= {previous}");
            previous = next;
        }
    }

    #[test]
    fn generator_survives_a_clock_going_backwards() {
        let mut generator = Generator::new();
        let steps = [1_000, 1_000, 999, 500, 1_000, 1_001, 0];
        let mut previous = String::new();
        for now in steps {
            let (ms, random) = generator.next(now, || 42);
            let id = String::from_utf8(encode_ulid(ms, random).to_vec()).unwrap();
            assert!(id > previous, "{id} <= {previous}");
            previous = id;
        }
        // From 1,001 on, a new millisecond: 42, then 42 plus a step of 43 when the clock goes back to 0.
        assert_eq!(generator.last, Some((1_001, 85)));
    }

    /// Ids of one millisecond grow by random steps: knowing one does not give the next.
    #[test]
    fn ids_of_one_millisecond_are_not_consecutive() {
        let mut generator = Generator::new();
        let mut previous = generator.next(7, random_bits).1;
        for _ in 0..100 {
            let (ms, random) = generator.next(7, random_bits);
            assert_eq!(ms, 7);
            assert!(random > previous + 1 && random - previous <= 1 << 40, "{previous} then {random}");
            previous = random;
        }
    }

    #[test]
    fn generator_rolls_over_a_full_random_part() {
        let mut generator = Generator::new();
        assert_eq!(generator.next(5, || RANDOM_MASK), (5, RANDOM_MASK));
        assert_eq!(generator.next(5, || 0), (6, 0));
        let mut at_end = Generator::new();
        at_end.next(u64::MAX, || RANDOM_MASK);
        assert_eq!(at_end.next(0, || 0), (MAX_MS, RANDOM_MASK));
    }

    #[test]
    fn new_id_at_encodes_the_given_time() {
        let id = new_id_at(IdKind::Event, 1_700_000_000_000);
        assert!(id.starts_with("evt_01HF7YAT00"), "{id}");
        assert_eq!(decode_ms(&id), 1_700_000_000_000);
        assert!(new_id_at(IdKind::Event, 1_000) < new_id_at(IdKind::Event, 2_000));
        assert_eq!(decode_ms(&new_id_at(IdKind::Event, u64::MAX)), MAX_MS);
    }

    #[test]
    fn validate_id_rejects_bad_ids() {
        let good = new_id_at(IdKind::Payment, 1);
        assert_eq!(validate_id(IdKind::Payment, &good), Ok(()));
        assert_eq!(validate_id(IdKind::Refund, &good), Err(IdError::WrongPrefix { expected: "rmb" }));
        assert_eq!(
            validate_id(IdKind::Payment, "pay01ARZ3NDEKTSV4RRFFQ69G5FAV"),
            Err(IdError::WrongPrefix { expected: "pay" })
        );
        assert_eq!(validate_id(IdKind::Payment, "pay_01ARZ3NDEK"), Err(IdError::BadLength { expected: 30, found: 14 }));
    }

    #[test]
    fn merchant_id_new_and_parse() {
        let id = MerchantId::new();
        assert_eq!(id.as_bytes().len(), MERCHANT_ID_LEN);
        assert_eq!(MerchantId::parse(id.as_str()).unwrap(), id);
        assert_eq!(MerchantId::from_bytes(id.as_bytes()).unwrap(), id);
        assert_eq!(id.to_string(), id.as_str());
        assert!(MerchantId::new() > id);
        let fixed = MerchantId::parse("mch_01ARZ3NDEKTSV4RRFFQ69G5FAV").unwrap();
        assert_eq!(fixed.as_str(), "mch_01ARZ3NDEKTSV4RRFFQ69G5FAV");
    }

    #[test]
    fn merchant_id_parse_rejects_bad_values() {
        let wrong_prefix = Err(IdError::WrongPrefix { expected: "mch" });
        assert_eq!(MerchantId::parse(""), wrong_prefix);
        assert_eq!(MerchantId::parse("pay_01ARZ3NDEKTSV4RRFFQ69G5FAV"), wrong_prefix);
        assert_eq!(MerchantId::parse("MCH_01ARZ3NDEKTSV4RRFFQ69G5FAV"), wrong_prefix);
        assert_eq!(
            MerchantId::parse("mch_01ARZ3NDEKTSV4RRFFQ69G5FA"),
            Err(IdError::BadLength { expected: 30, found: 29 })
        );
        assert_eq!(
            MerchantId::parse("mch_01ARZ3NDEKTSV4RRFFQ69G5FAVX"),
            Err(IdError::BadLength { expected: 30, found: 31 })
        );
        for bad in [
            "mch_01arz3ndektsv4rrffq69g5fav",
            "mch_01ARZ3NDEKTSV4RRFFQ69G5FAI",
            "mch_01ARZ3NDEKTSV4RRFFQ69G5FAU",
            "mch_01ARZ3NDEKTSV4RRFFQ69G5F_V",
        ] {
            assert_eq!(MerchantId::parse(bad), Err(IdError::InvalidChar), "{bad}");
        }
        // A multi-byte character keeps the byte length at 30 but is not in the alphabet.
        assert_eq!(MerchantId::parse("mch_01ARZ3NDEKTSV4RRFFQ69G5Fé"), Err(IdError::InvalidChar));
        assert_eq!(MerchantId::from_bytes(&[0xff; MERCHANT_ID_LEN]), Err(IdError::InvalidChar));
    }

    #[test]
    fn merchant_id_serde_is_the_checked_string() {
        let id = MerchantId::parse("mch_01ARZ3NDEKTSV4RRFFQ69G5FAV").unwrap();
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"mch_01ARZ3NDEKTSV4RRFFQ69G5FAV\"");
        assert_eq!(serde_json::from_str::<MerchantId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<MerchantId>("\"mch_short\"").is_err());
    }

    #[test]
    fn random_base62_has_the_length_and_alphabet() {
        let secret = random_base62(32);
        assert_eq!(secret.len(), 32);
        assert!(secret.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(random_base62(32), secret);
        assert_eq!(random_base62(0), "");
    }
}
