//! The double-entry ledger: every movement of money is a set of entries that sum to zero, and a merchant's
//! balances are nothing but the sums of its entries on two accounts.
//!
//! Each merchant has six accounts per currency. Two are the merchant's balances: `disponible` (free to pay out
//! or refund) and `en_attente` (reserved for payouts and refunds in progress). The other four are the other
//! side of every movement: customer funds coming in from providers, fees earned by the operator, refunds sent
//! back to customers, payouts sent to beneficiaries. Because each movement balances, the sum of all entries of
//! a merchant is always zero, which the startup audit and the property tests check.
//!
//! [`postings`] is the only place that turns a transition's [`Effect`] into entries; [`Balances::apply`] is the
//! only place balances change, and it refuses (instead of clamping) any result below zero.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::money::{Amount, Currency};
use super::status::Effect;

/// A ledger account of one merchant in one currency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Account {
    #[serde(rename = "disponible")]
    Available,
    #[serde(rename = "en_attente")]
    Pending,
    CustomerFunds,
    Fees,
    RefundsOut,
    PayoutsOut,
}

impl Account {
    pub const ALL: [Account; 6] = [
        Account::Available,
        Account::Pending,
        Account::CustomerFunds,
        Account::Fees,
        Account::RefundsOut,
        Account::PayoutsOut,
    ];
}

/// One signed movement on one account. Positive means the account holds more afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub account: Account,
    #[serde(rename = "devise")]
    pub currency: Currency,
    pub amount_minor: i64,
}

/// What a movement is about: the amounts of the payment, refund or payout it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Movement {
    pub currency: Currency,
    pub amount: Amount,
    pub fee: Amount,
    pub net_amount: Amount,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum LedgerError {
    #[error("{currency} {account:?} would become negative ({balance_minor} + {delta_minor})")]
    Negative { currency: Currency, account: Account, balance_minor: i64, delta_minor: i64 },
    #[error("{currency} {account:?} overflows")]
    Overflow { currency: Currency, account: Account },
    #[error("entries do not balance: they sum to {sum_minor}")]
    Unbalanced { sum_minor: i128 },
    #[error("montant {amount} is not frais {fee} + montant_net {net}")]
    InconsistentAmounts { amount: i64, fee: i64, net: i64 },
}

/// The balanced entries of one effect.
pub fn postings(effect: Effect, m: Movement) -> Result<Vec<Entry>, LedgerError> {
    let total = m.amount.minor();
    let (fee, net) = (m.fee.minor(), m.net_amount.minor());
    if fee.checked_add(net) != Some(total) {
        return Err(LedgerError::InconsistentAmounts { amount: total, fee, net });
    }
    let e = |account, amount_minor| Entry { account, currency: m.currency, amount_minor };
    let entries = match effect {
        Effect::None => Vec::new(),
        Effect::CreditPayment => {
            vec![e(Account::CustomerFunds, -total), e(Account::Available, net), e(Account::Fees, fee)]
        }
        Effect::ReserveRefund | Effect::ReservePayout => {
            vec![e(Account::Available, -total), e(Account::Pending, total)]
        }
        Effect::ConsumeRefund => vec![e(Account::Pending, -total), e(Account::RefundsOut, total)],
        Effect::ReleaseRefund | Effect::ReleasePayout => {
            vec![e(Account::Pending, -total), e(Account::Available, total)]
        }
        Effect::ConsumePayout => {
            vec![e(Account::Pending, -total), e(Account::PayoutsOut, net), e(Account::Fees, fee)]
        }
    };
    check_balanced(&entries)?;
    Ok(entries)
}

/// Entries of one movement must sum to zero in every currency.
pub fn check_balanced(entries: &[Entry]) -> Result<(), LedgerError> {
    let mut sums: BTreeMap<Currency, i128> = BTreeMap::new();
    for entry in entries {
        *sums.entry(entry.currency).or_default() += i128::from(entry.amount_minor);
    }
    match sums.values().find(|s| **s != 0) {
        Some(sum) => Err(LedgerError::Unbalanced { sum_minor: *sum }),
        None => Ok(()),
    }
}

/// A merchant's balances in one currency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Balance {
    #[serde(rename = "disponible")]
    pub available: i64,
    #[serde(rename = "en_attente")]
    pub pending: i64,
    /// Unix milliseconds of the last change, for the API's `updated_at`.
    pub updated_at_ms: u64,
}

impl Balance {
    pub fn total(&self) -> i64 {
        // Both are non-negative and each fits in i64, so the sum is bounded by what the ledger allowed.
        self.available.saturating_add(self.pending)
    }
}

/// A merchant's balances in every currency it has used.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Balances(pub BTreeMap<Currency, Balance>);

impl Balances {
    pub fn get(&self, currency: Currency) -> Balance {
        self.0.get(&currency).copied().unwrap_or_default()
    }

    /// Applies entries all or nothing: on error the balances are as before.
    ///
    /// Entries on the merchant's two balance accounts change the balances; entries on the other accounts are
    /// the ledger's other side and do not. A currency appears in the map from its first movement, including a
    /// payment's initiation, so that `GET /v1/soldes` lists every currency the merchant has used.
    pub fn apply(&mut self, entries: &[Entry], at_ms: u64) -> Result<(), LedgerError> {
        let mut next = self.0.clone();
        for entry in entries {
            let balance = next.entry(entry.currency).or_default();
            let slot = match entry.account {
                Account::Available => &mut balance.available,
                Account::Pending => &mut balance.pending,
                _ => continue,
            };
            let updated = slot
                .checked_add(entry.amount_minor)
                .ok_or(LedgerError::Overflow { currency: entry.currency, account: entry.account })?;
            if updated < 0 {
                return Err(LedgerError::Negative {
                    currency: entry.currency,
                    account: entry.account,
                    balance_minor: *slot,
                    delta_minor: entry.amount_minor,
                });
            }
            *slot = updated;
            balance.updated_at_ms = at_ms;
        }
        self.0 = next;
        Ok(())
    }

    /// Makes sure the currency has a row (zero balances) from the merchant's first use of it.
    pub fn touch(&mut self, currency: Currency, at_ms: u64) {
        self.0.entry(currency).or_insert(Balance { available: 0, pending: 0, updated_at_ms: at_ms });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xof() -> Currency {
        Currency::parse("XOF").unwrap()
    }

    fn movement(amount: i64, fee: i64) -> Movement {
        Movement {
            currency: xof(),
            amount: Amount::new(amount).unwrap(),
            fee: Amount::new(fee).unwrap(),
            net_amount: Amount::new(amount - fee).unwrap(),
        }
    }

    const EFFECTS: [Effect; 8] = [
        Effect::None,
        Effect::CreditPayment,
        Effect::ReserveRefund,
        Effect::ConsumeRefund,
        Effect::ReleaseRefund,
        Effect::ReservePayout,
        Effect::ConsumePayout,
        Effect::ReleasePayout,
    ];

    #[test]
    fn every_effect_balances() {
        for effect in EFFECTS {
            let entries = postings(effect, movement(10_000, 150)).unwrap();
            assert_eq!(entries.iter().map(|e| e.amount_minor).sum::<i64>(), 0, "{effect:?}");
        }
    }

    #[test]
    fn credit_then_payout_life() {
        let mut b = Balances::default();
        b.apply(&postings(Effect::CreditPayment, movement(10_000, 150)).unwrap(), 1).unwrap();
        assert_eq!(b.get(xof()), Balance { available: 9_850, pending: 0, updated_at_ms: 1 });
        b.apply(&postings(Effect::ReservePayout, movement(5_000, 100)).unwrap(), 2).unwrap();
        assert_eq!((b.get(xof()).available, b.get(xof()).pending), (4_850, 5_000));
        b.apply(&postings(Effect::ConsumePayout, movement(5_000, 100)).unwrap(), 3).unwrap();
        assert_eq!((b.get(xof()).available, b.get(xof()).pending), (4_850, 0));
        assert_eq!(b.get(xof()).total(), 4_850);
    }

    #[test]
    fn reservation_larger_than_available_is_refused_and_changes_nothing() {
        let mut b = Balances::default();
        b.apply(&postings(Effect::CreditPayment, movement(1_000, 0)).unwrap(), 1).unwrap();
        let before = b.clone();
        let err = b.apply(&postings(Effect::ReserveRefund, movement(1_001, 0)).unwrap(), 2).unwrap_err();
        assert!(matches!(err, LedgerError::Negative { account: Account::Available, .. }));
        assert_eq!(b, before);
    }

    #[test]
    fn inconsistent_amounts_are_refused() {
        let bad = Movement { net_amount: Amount::new(1).unwrap(), ..movement(100, 10) };
        assert!(matches!(postings(Effect::CreditPayment, bad), Err(LedgerError::InconsistentAmounts { .. })));
    }

    #[test]
    fn unbalanced_entries_are_detected() {
        let entries = [Entry { account: Account::Available, currency: xof(), amount_minor: 5 }];
        assert_eq!(check_balanced(&entries), Err(LedgerError::Unbalanced { sum_minor: 5 }));
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        let mut b = Balances::default();
        let big = Entry { account: Account::Available, currency: xof(), amount_minor: i64::MAX };
        b.apply(&[big], 1).unwrap();
        assert!(matches!(b.apply(&[big], 2), Err(LedgerError::Overflow { .. })));
    }
}
