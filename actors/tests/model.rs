//! Property tests of the payment engine against an independent reference model (the auditor pattern of
//! TigerBeetle, the bank invariant of Jepsen).
//!
//! Random sequences of every command the API names (payments initiated with random amounts, fee rules
//! and sometimes colliding merchant references; provider notices on existing, unknown, other merchants' and
//! wrong-kind references, so duplicated, late and out-of-order notices are the norm; several refunds per
//! payment, of partial, full ("the rest") and too large amounts, with their completion or refusal, and late
//! notices about earlier refunds; the provider's payment page given once or twice; payouts that may exceed the
//! balance, sent or refused) run over several merchants and currencies. After every single step the tests
//! prove, against a model written here with plain integer arithmetic (it never calls `ledger.rs` or the status
//! table):
//!
//! - each command is accepted, ignored as a no-op notice, or refused exactly as the model says, with the same
//!   refusal (`not_found`, `duplicate_reference`, `invalid_state`, `insufficient_balance` with the right
//!   figures, fee above amount, refund above amount);
//! - the balances (`disponible`, `en_attente` per merchant and currency) equal the model's, are never negative,
//!   and equal the sums of the journal's ledger entries; every journal event balances to zero per currency;
//!   all six ledger accounts agree with the model, so money is neither created nor lost;
//! - a payment is credited at most once (one entry on the customer-funds account per payment, ever);
//! - final statuses (`succes`, `echec`, `rembourse_partiellement`, `rembourse`) never move, except by a
//!   completed refund (to `rembourse_partiellement` while part of the amount is left, to `rembourse` once the
//!   refunds reach it), and `expire` only moves to `succes`; the refunds not refused never exceed the amount,
//!   only the latest may be under way, and `montant_rembourse` is the completed refunds' sum;
//! - every status change writes exactly one webhook notification with the API's event, whose body parses
//!   as [`WebhookBody`] with `data.statut` the new status and `data.reference` the payment reference (payout
//!   id for payouts); refund requests, refund refusals and payout creations write none;
//! - each merchant's journal is numbered 1, 2, 3, ... without gaps.
//!
//! `pure_core_matches_the_reference_model` drives [`decide`] directly, holding each merchant's state the way
//! the merchant actor does: many cases, sequences of up to 200 commands, no I/O. It also tallies what the
//! steps did and fails if some acceptance, no-op or refusal was never reached, so a passing run is not a
//! vacuous one. `engine_matches_the_reference_model` runs shorter sequences through the real [`Engine`]
//! (actix actors and the embedded store on a temporary directory), one command at a time or in pipelined
//! batches sent without waiting, observes it only through its public API (answers, balances, journal, outbox), then
//! reopens the store, which runs the startup audit, and checks that nothing changed.
//!
//! `PROPTEST_CASES` overrides the number of cases of both tests. Failing cases are not persisted to a
//! regressions file; proptest prints the minimal failing sequence instead.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Debug;

use caisse_engine::core::{
    decide, Command, Decided, JournalEvent, NewPayment, NewPayout, OutboxItem, PaymentNotice, PayoutOutcome, Record,
    RefundOutcome, Rejection, Target,
};
use caisse_engine::domain::ids::{IdKind, MerchantId};
use caisse_engine::domain::ledger::{Account, Balances};
use caisse_engine::domain::money::{Amount, Currency, FeeRule};
use caisse_engine::domain::phone::Phone;
use caisse_engine::domain::provider::ReturnUrl;
use caisse_engine::domain::records::{Payment, Payout, ProviderCode, TransactionType, WebhookBody, WebhookData};
use caisse_engine::domain::status::{EventKind, PaymentStatus, PayoutStatus, RefundStatus, Trigger};
use caisse_engine::domain::text::{Email, Metadata, Reference};
use caisse_engine::domain::time::Timestamp;
use caisse_engine::{Engine, EngineConfig, EngineError, Executed};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// The currencies the sequences use: one without decimals, one with.
const CURRENCIES: [Currency; 2] = [Currency::XOF, Currency::EUR];
/// Merchant references drawn from a small pool, so that the same merchant reuses one (refused) and different
/// merchants share one (allowed: references are unique per merchant only).
const REFERENCE_POOL: [&str; 6] = ["cmd-0", "cmd-1", "cmd-2", "cmd-3", "cmd-4", "cmd-5"];
/// A reference no merchant ever creates, for notices about unknown payments.
const GHOST: &str = "ghost-ref";
const CLIENT_EMAIL: &str = "awa@example.com";
/// The pure test's clock starts here and moves one second per step.
const T0_MS: u64 = 1_700_000_000_000;

// ---------------------------------------------------------------------------------------------------------------
// Generated operations.
// ---------------------------------------------------------------------------------------------------------------

/// Which existing record an operation is about. Indexes are resolved against the state reached when the
/// operation runs, so shrinking a sequence keeps every operation meaningful.
#[derive(Debug, Clone, Copy)]
enum Pick {
    /// A record of this merchant for which the operation can have an effect (a non-final payment for a notice,
    /// a refundable payment, a refund or payout in progress); when there is none, one where it repeats itself
    /// (a finished refund or payout), else as `Own`.
    Open(usize),
    /// Any record of this merchant, or an unknown reference.
    Own(usize),
    /// Any reference of any merchant and of any kind (refund references and payout ids too), or an unknown one.
    Global(usize),
}

#[derive(Debug, Clone, Copy)]
enum RefChoice {
    /// No merchant reference: the engine makes a `pay_…` one.
    Generated,
    Pool(usize),
    /// A reference already used (payment reference, refund reference or payout id), of this merchant when
    /// `own`, else of any merchant.
    Existing {
        own: bool,
        index: usize,
    },
}

#[derive(Debug, Clone, Copy)]
enum NoticeKind {
    Processing,
    Confirmed,
    Declined,
    Expired,
    /// The provider's page for the payment, one of [`PAYMENT_PAGES`].
    Opened(usize),
}

/// The pages a provider may give for a payment: two, so a second page for the same payment happens.
const PAYMENT_PAGES: [&str; 2] = ["https://pay.wave.com/c/cos-1", "https://pay.wave.com/c/cos-2"];

#[derive(Debug, Clone, Copy)]
enum RefundAmount {
    /// No amount: the whole payment.
    Full,
    /// A share of the payment's amount, in thousandths (a partial refund).
    PerMille(i64),
    /// More than the payment's amount by this much (refused).
    Above(i64),
    /// Any amount.
    Raw(i64),
    /// The merchant's `disponible` plus this (-1, 0 or 1): the edge of `insufficient_balance`.
    Balance(i64),
}

#[derive(Debug, Clone, Copy)]
enum PayoutAmount {
    /// A share of the merchant's `disponible` in that currency, in thousandths (above 1000 exceeds it).
    PerMille(i64),
    Raw(i64),
    /// The merchant's `disponible` plus this (-1, 0 or 1): the edge of `insufficient_balance`.
    Balance(i64),
}

#[derive(Debug, Clone, Copy)]
struct Fee {
    bps: u32,
    fixed: i64,
}

#[derive(Debug, Clone)]
enum Op {
    Initiate {
        m: usize,
        currency: usize,
        amount: i64,
        fee: Fee,
        reference: RefChoice,
    },
    Notice {
        m: usize,
        target: Pick,
        notice: NoticeKind,
    },
    Refund {
        m: usize,
        target: Pick,
        amount: RefundAmount,
    },
    /// `back`: how many refunds before the latest the notice is about.
    RefundNotice {
        m: usize,
        target: Pick,
        completed: bool,
        back: usize,
    },
    Payout {
        m: usize,
        currency: usize,
        amount: PayoutAmount,
        fee: Fee,
        reference: RefChoice,
    },
    PayoutNotice {
        m: usize,
        target: Pick,
        sent: bool,
    },
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        5 => any::<usize>().prop_map(Pick::Open),
        4 => any::<usize>().prop_map(Pick::Own),
        1 => any::<usize>().prop_map(Pick::Global),
    ]
}

fn fee() -> impl Strategy<Value = Fee> {
    (0u32..=500, 0i64..=100).prop_map(|(bps, fixed)| Fee { bps, fixed })
}

/// Small amounts often fall below the fee (refused); large ones build balances.
fn amount() -> impl Strategy<Value = i64> {
    prop_oneof![1 => 1i64..=300, 3 => 1i64..=1_000_000]
}

fn op() -> impl Strategy<Value = Op> {
    let m = 0usize..4;
    let reference = prop_oneof![
        5 => Just(RefChoice::Generated),
        4 => (0..REFERENCE_POOL.len()).prop_map(RefChoice::Pool),
        1 => (any::<bool>(), any::<usize>()).prop_map(|(own, index)| RefChoice::Existing { own, index }),
    ];
    let notice = prop_oneof![
        2 => Just(NoticeKind::Processing),
        4 => Just(NoticeKind::Confirmed),
        2 => Just(NoticeKind::Declined),
        2 => Just(NoticeKind::Expired),
        2 => (0..PAYMENT_PAGES.len()).prop_map(NoticeKind::Opened),
    ];
    let refund_amount = prop_oneof![
        4 => Just(RefundAmount::Full),
        4 => (1i64..=1000).prop_map(RefundAmount::PerMille),
        1 => prop_oneof![Just(1i64), 1i64..=10_000].prop_map(RefundAmount::Above),
        1 => (1i64..=1_000_000).prop_map(RefundAmount::Raw),
        1 => (-1i64..=1).prop_map(RefundAmount::Balance),
    ];
    let payout_amount = prop_oneof![
        4 => (1i64..=1_200).prop_map(PayoutAmount::PerMille),
        1 => (1i64..=1_000_000).prop_map(PayoutAmount::Raw),
        1 => (-1i64..=1).prop_map(PayoutAmount::Balance),
    ];
    prop_oneof![
        25 => (m.clone(), 0..CURRENCIES.len(), amount(), fee(), reference.clone())
            .prop_map(|(m, currency, amount, fee, reference)| Op::Initiate { m, currency, amount, fee, reference }),
        35 => (m.clone(), pick(), notice).prop_map(|(m, target, notice)| Op::Notice { m, target, notice }),
        15 => (m.clone(), pick(), refund_amount).prop_map(|(m, target, amount)| Op::Refund { m, target, amount }),
        15 => (m.clone(), pick(), any::<bool>(), prop_oneof![6 => Just(0usize), 1 => 1usize..=3])
            .prop_map(|(m, target, completed, back)| Op::RefundNotice { m, target, completed, back }),
        10 => (m.clone(), 0..CURRENCIES.len(), payout_amount, fee(), reference.clone())
            .prop_map(|(m, currency, amount, fee, reference)| Op::Payout { m, currency, amount, fee, reference }),
        10 => (m, pick(), any::<bool>()).prop_map(|(m, target, sent)| Op::PayoutNotice { m, target, sent }),
    ]
}

// ---------------------------------------------------------------------------------------------------------------
// The reference model: plain integers, its own status rules, no engine code.
// ---------------------------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct MPayment {
    currency: Currency,
    amount: i64,
    fee: i64,
    net: i64,
    status: PaymentStatus,
    /// Every refund, oldest first.
    refunds: Vec<MRefund>,
    /// The sum of the completed refunds.
    refunded: i64,
    /// How many times the merchant was credited for this payment (the invariant: at most once).
    credits: u32,
    /// The provider's page where the customer approves it (`url_paiement`).
    page: Option<&'static str>,
}

#[derive(Debug, Clone)]
struct MRefund {
    reference: String,
    amount: i64,
    status: RefundStatus,
}

/// The most refunds one payment takes (docs/api.md § Refunds).
const MODEL_MAX_REFUNDS: usize = 50;

impl MPayment {
    fn latest(&self) -> Option<&MRefund> {
        self.refunds.last()
    }

    /// Paid, and no refund under way: a refund may be asked for.
    fn refund_open(&self) -> bool {
        matches!(self.status, PaymentStatus::Succeeded | PaymentStatus::PartlyRefunded)
            && self.latest().is_none_or(|r| r.status != RefundStatus::Processing)
    }

    /// The amount less every refund not refused.
    fn left(&self) -> i64 {
        self.amount - self.refunds.iter().filter(|r| r.status != RefundStatus::Failed).map(|r| r.amount).sum::<i64>()
    }
}

#[derive(Debug, Clone)]
struct MPayout {
    /// The merchant's own reference, which takes its place among the merchant's references.
    reference: Option<String>,
    currency: Currency,
    amount: i64,
    fee: i64,
    net: i64,
    status: PayoutStatus,
}

/// One merchant as the model sees it.
#[derive(Debug, Clone, Default)]
struct MMerchant {
    /// The model's own six accounts per currency (only non-zero values matter).
    accounts: BTreeMap<(Currency, Account), i64>,
    /// Currencies of accepted changes: the rows `GET /v1/soldes` must list.
    currencies: BTreeSet<Currency>,
    payments: BTreeMap<String, MPayment>,
    payouts: BTreeMap<String, MPayout>,
    /// Every reference the merchant holds: payment references, refund references, payout ids.
    used: BTreeSet<String>,
    /// The notifications the merchant must have, in order: (event, data.reference, data.statut).
    events: Vec<(EventKind, String, String)>,
    /// Accepted changes so far, which is the last journal position.
    seq: u64,
}

/// How the journal reference of an accepted change is known in advance.
#[derive(Debug, Clone)]
enum Key {
    Known(String),
    /// Generated by the engine: has this prefix and is new for the merchant.
    Fresh(&'static str),
}

/// What an accepted change does to the model.
#[derive(Debug, Clone)]
enum Apply {
    NewPayment(MPayment),
    PaymentStatus { reference: String, status: PaymentStatus, page: Option<&'static str> },
    PaymentPage { reference: String, page: &'static str },
    NewRefund { payment: String, amount: i64 },
    RefundStatus { payment: String, refund: String, status: RefundStatus, payment_status: PaymentStatus },
    NewPayout(MPayout),
    PayoutStatus { id: String, status: PayoutStatus },
}

#[derive(Debug, Clone)]
struct Change {
    trigger: Trigger,
    currency: Currency,
    journal_status: &'static str,
    journal_reference: Key,
    /// Net movement per account, the model's own double entry.
    deltas: Vec<(Account, i64)>,
    /// The one notification, as (event, data.statut); `data.reference` is the record's key.
    notify: Option<(EventKind, &'static str)>,
    apply: Apply,
}

#[derive(Debug, Clone)]
enum Expect {
    Reject(Rejection),
    /// A notice that does not apply: nothing is written.
    Unchanged,
    Change(Box<Change>),
}

/// The fee rule of docs/api.md § Payments: `(montant * bps + 5000) / 10000 + fixe`, integer division.
fn model_fee(amount: i64, fee: &FeeRule) -> i64 {
    let percentage = (i128::from(amount) * i128::from(fee.percentage_bps) + 5_000) / 10_000;
    i64::try_from(percentage).unwrap() + fee.fixed.minor()
}

fn payment_name(status: PaymentStatus) -> &'static str {
    match status {
        PaymentStatus::Initiated => "initie",
        PaymentStatus::Processing => "en_cours",
        PaymentStatus::Succeeded => "succes",
        PaymentStatus::Failed => "echec",
        PaymentStatus::Expired => "expire",
        PaymentStatus::PartlyRefunded => "rembourse_partiellement",
        PaymentStatus::Refunded => "rembourse",
    }
}

fn payout_name(status: PayoutStatus) -> &'static str {
    match status {
        PayoutStatus::Pending => "en_attente",
        PayoutStatus::Sent => "traite",
        PayoutStatus::Rejected => "rejete",
    }
}

/// The event each new payment status sends (docs/api.md § Payments).
fn payment_event(status: PaymentStatus) -> EventKind {
    match status {
        PaymentStatus::Initiated => EventKind::PaymentInitiated,
        PaymentStatus::Processing => EventKind::PaymentProcessing,
        PaymentStatus::Succeeded => EventKind::PaymentSucceeded,
        PaymentStatus::Failed | PaymentStatus::Expired => EventKind::PaymentFailed,
        PaymentStatus::PartlyRefunded | PaymentStatus::Refunded => EventKind::PaymentRefunded,
    }
}

/// The event each new payout status sends (docs/api.md § Payouts; a new payout sends none).
fn payout_event(status: PayoutStatus) -> Option<EventKind> {
    match status {
        PayoutStatus::Pending => None,
        PayoutStatus::Sent => Some(EventKind::PayoutProcessed),
        PayoutStatus::Rejected => Some(EventKind::PayoutRejected),
    }
}

impl MMerchant {
    fn account(&self, currency: Currency, account: Account) -> i64 {
        self.accounts.get(&(currency, account)).copied().unwrap_or(0)
    }

    /// What docs/api.md says `cmd` must do to this merchant now.
    fn expect(&self, cmd: &Command) -> Expect {
        use Account::{Available, CustomerFunds, Fees, PayoutsOut, Pending, RefundsOut};
        let change = |c: Change| Expect::Change(Box::new(c));
        match cmd {
            Command::CreateLink(_) | Command::DeactivateLink { .. } => {
                unreachable!("the model's commands make no payment links: the link tests drive decide directly")
            }
            Command::InitiatePayment(new) => {
                if new.reference.as_ref().is_some_and(|r| self.used.contains(r.as_str())) {
                    return Expect::Reject(Rejection::DuplicateReference);
                }
                let amount = new.amount.minor();
                let fee = model_fee(amount, &new.fee);
                if fee >= amount {
                    return Expect::Reject(Rejection::AmountBelowFee { fee_minor: fee });
                }
                change(Change {
                    trigger: Trigger::PaymentAccepted,
                    currency: new.currency,
                    journal_status: "initie",
                    journal_reference: match &new.reference {
                        Some(r) => Key::Known(r.as_str().to_owned()),
                        None => Key::Fresh("pay_"),
                    },
                    deltas: Vec::new(),
                    notify: Some((EventKind::PaymentInitiated, "initie")),
                    apply: Apply::NewPayment(MPayment {
                        currency: new.currency,
                        amount,
                        fee,
                        net: amount - fee,
                        status: PaymentStatus::Initiated,
                        refunds: Vec::new(),
                        refunded: 0,
                        credits: 0,
                        page: None,
                    }),
                })
            }
            Command::PaymentNotice { reference, notice } => {
                let Some(p) = self.payments.get(reference.as_str()) else { return Expect::Reject(Rejection::NotFound) };
                use PaymentStatus::{Expired, Initiated, Processing, Succeeded};
                let page = match notice {
                    PaymentNotice::Opened { payment_url } => {
                        PAYMENT_PAGES.iter().copied().find(|u| *u == payment_url.as_str())
                    }
                    _ => None,
                };
                // A page for a payment already under way is kept, with no status move and no webhook.
                if let (Processing, Some(url)) = (p.status, page) {
                    if p.page != Some(url) {
                        return change(Change {
                            trigger: Trigger::ProviderProcessing,
                            currency: p.currency,
                            journal_status: payment_name(Processing),
                            journal_reference: Key::Known(reference.as_str().to_owned()),
                            deltas: Vec::new(),
                            notify: None,
                            apply: Apply::PaymentPage { reference: reference.as_str().to_owned(), page: url },
                        });
                    }
                }
                let (trigger, next) = match (p.status, notice) {
                    (Initiated, PaymentNotice::Processing | PaymentNotice::Opened { .. }) => {
                        (Trigger::ProviderProcessing, Processing)
                    }
                    (Initiated | Processing | Expired, PaymentNotice::Confirmed) => {
                        (Trigger::ProviderConfirmed, Succeeded)
                    }
                    (Initiated | Processing, PaymentNotice::Declined { .. }) => {
                        (Trigger::ProviderDeclined, PaymentStatus::Failed)
                    }
                    (Initiated | Processing, PaymentNotice::Expired) => (Trigger::TtlExpired, Expired),
                    // Duplicated, late or out of order: acknowledged, nothing changes.
                    _ => return Expect::Unchanged,
                };
                let deltas = if next == Succeeded {
                    vec![(CustomerFunds, -p.amount), (Available, p.net), (Fees, p.fee)]
                } else {
                    Vec::new()
                };
                change(Change {
                    trigger,
                    currency: p.currency,
                    journal_status: payment_name(next),
                    journal_reference: Key::Known(reference.as_str().to_owned()),
                    deltas,
                    notify: Some((payment_event(next), payment_name(next))),
                    apply: Apply::PaymentStatus { reference: reference.as_str().to_owned(), status: next, page },
                })
            }
            Command::RequestRefund { reference, amount, .. } => {
                let Some(p) = self.payments.get(reference.as_str()) else { return Expect::Reject(Rejection::NotFound) };
                if !p.refund_open() || p.refunds.len() >= MODEL_MAX_REFUNDS {
                    return Expect::Reject(Rejection::InvalidState(String::new()));
                }
                let left = p.left();
                let a = amount.map_or(left, Amount::minor);
                if a > left || a == 0 {
                    return Expect::Reject(Rejection::RefundAboveAmount { amount_minor: p.amount, left_minor: left });
                }
                let available = self.account(p.currency, Available);
                if a > available {
                    return Expect::Reject(Rejection::InsufficientBalance {
                        currency: p.currency,
                        available_minor: available,
                        requested_minor: a,
                    });
                }
                change(Change {
                    trigger: Trigger::RefundRequested,
                    currency: p.currency,
                    journal_status: "en_cours",
                    journal_reference: Key::Fresh("rmb_"),
                    deltas: vec![(Available, -a), (Pending, a)],
                    notify: None,
                    apply: Apply::NewRefund { payment: reference.as_str().to_owned(), amount: a },
                })
            }
            Command::RefundNotice { reference, refund, outcome } => {
                let Some(p) = self.payments.get(reference.as_str()) else { return Expect::Reject(Rejection::NotFound) };
                let Some(r) = p.refunds.iter().find(|r| r.reference == *refund) else {
                    return Expect::Reject(Rejection::NotFound);
                };
                if r.status != RefundStatus::Processing {
                    return Expect::Unchanged;
                }
                let (trigger, status, deltas, notify, payment_status) = match outcome {
                    // The payment is refunded in full once the completed refunds reach its amount.
                    RefundOutcome::Completed => {
                        let next = if p.refunded + r.amount == p.amount {
                            PaymentStatus::Refunded
                        } else {
                            PaymentStatus::PartlyRefunded
                        };
                        (
                            Trigger::RefundCompleted,
                            RefundStatus::Succeeded,
                            vec![(Pending, -r.amount), (RefundsOut, r.amount)],
                            Some((EventKind::PaymentRefunded, payment_name(next))),
                            next,
                        )
                    }
                    // A refused refund: the reservation goes back, the payment stays as it is, no event.
                    RefundOutcome::Refused => (
                        Trigger::RefundRefused,
                        RefundStatus::Failed,
                        vec![(Pending, -r.amount), (Available, r.amount)],
                        None,
                        p.status,
                    ),
                };
                change(Change {
                    trigger,
                    currency: p.currency,
                    journal_status: if status == RefundStatus::Succeeded { "succes" } else { "echec" },
                    journal_reference: Key::Known(r.reference.clone()),
                    deltas,
                    notify,
                    apply: Apply::RefundStatus {
                        payment: reference.as_str().to_owned(),
                        refund: refund.clone(),
                        status,
                        payment_status,
                    },
                })
            }
            Command::CreatePayout(new) => {
                if new.reference.as_ref().is_some_and(|r| self.used.contains(r.as_str())) {
                    return Expect::Reject(Rejection::DuplicateReference);
                }
                let amount = new.amount.minor();
                let fee = model_fee(amount, &new.fee);
                if fee >= amount {
                    return Expect::Reject(Rejection::AmountBelowFee { fee_minor: fee });
                }
                let available = self.account(new.currency, Available);
                if amount > available {
                    return Expect::Reject(Rejection::InsufficientBalance {
                        currency: new.currency,
                        available_minor: available,
                        requested_minor: amount,
                    });
                }
                change(Change {
                    trigger: Trigger::PayoutRequested,
                    currency: new.currency,
                    journal_status: "en_attente",
                    journal_reference: Key::Fresh("ret_"),
                    deltas: vec![(Available, -amount), (Pending, amount)],
                    notify: None,
                    apply: Apply::NewPayout(MPayout {
                        currency: new.currency,
                        amount,
                        fee,
                        net: amount - fee,
                        status: PayoutStatus::Pending,
                        reference: new.reference.as_ref().map(|r| r.as_str().to_owned()),
                    }),
                })
            }
            Command::PayoutNotice { id, outcome } => {
                let Some(o) = self.payouts.get(id) else { return Expect::Reject(Rejection::NotFound) };
                if o.status != PayoutStatus::Pending {
                    return Expect::Unchanged;
                }
                let (trigger, status, deltas) = match outcome {
                    PayoutOutcome::Sent => (
                        Trigger::PayoutSent,
                        PayoutStatus::Sent,
                        vec![(Pending, -o.amount), (PayoutsOut, o.net), (Fees, o.fee)],
                    ),
                    PayoutOutcome::Refused { .. } => (
                        Trigger::PayoutRefused,
                        PayoutStatus::Rejected,
                        vec![(Pending, -o.amount), (Available, o.amount)],
                    ),
                };
                change(Change {
                    trigger,
                    currency: o.currency,
                    journal_status: payout_name(status),
                    journal_reference: Key::Known(id.clone()),
                    deltas,
                    notify: payout_event(status).map(|e| (e, payout_name(status))),
                    apply: Apply::PayoutStatus { id: id.clone(), status },
                })
            }
        }
    }
}

/// Every merchant of a run, and every reference any of them holds (for operations aimed at the wrong
/// merchant or at the wrong kind of record).
struct Model {
    merchants: Vec<MMerchant>,
    all_keys: Vec<String>,
}

/// Picks `candidates[index]`, or `ghost` for one index in `len + 1`, so unknown references keep coming.
fn choose(candidates: &[String], index: usize, ghost: Option<&str>) -> String {
    let slots = candidates.len() + usize::from(ghost.is_some());
    if slots == 0 {
        return GHOST.to_owned();
    }
    match candidates.get(index % slots) {
        Some(c) => c.clone(),
        None => ghost.unwrap_or(GHOST).to_owned(),
    }
}

fn reference(text: &str) -> Reference {
    Reference::parse(text).unwrap()
}

fn new_payment(currency: Currency, amount: i64, fee: Fee, reference: Option<Reference>) -> NewPayment {
    NewPayment {
        reference,
        amount: Amount::positive(amount).unwrap(),
        currency,
        provider: ProviderCode::parse("mtn_momo").unwrap(),
        fee: FeeRule::new(fee.bps, Amount::new(fee.fixed).unwrap()).unwrap(),
        customer_phone: Phone::parse("+22997000001").unwrap(),
        customer_email: Some(Email::parse(CLIENT_EMAIL).unwrap()),
        customer_name: None,
        description: None,
        metadata: Metadata::empty(),
        link: None,
    }
}

fn new_payout(currency: Currency, amount: i64, fee: Fee, reference: Option<Reference>) -> NewPayout {
    NewPayout {
        reference,
        amount: Amount::positive(amount).unwrap(),
        currency,
        provider: ProviderCode::parse("wave").unwrap(),
        fee: FeeRule::new(fee.bps, Amount::new(fee.fixed).unwrap()).unwrap(),
        beneficiary_phone: Phone::parse("+22997000099").unwrap(),
        beneficiary_name: None,
        description: None,
        metadata: Metadata::empty(),
    }
}

impl Model {
    fn new(merchants: usize) -> Model {
        Model { merchants: vec![MMerchant::default(); merchants], all_keys: Vec::new() }
    }

    /// The key `target` designates among `records`. `Open` takes the first non-empty group of `preferred`
    /// (the records the operation can still change, then those where it repeats itself), else any record.
    fn pick_key<T>(&self, records: &BTreeMap<String, T>, preferred: &[&dyn Fn(&T) -> bool], target: Pick) -> String {
        let all: Vec<String> = records.keys().cloned().collect();
        match target {
            Pick::Open(i) => {
                for wanted in preferred {
                    let group: Vec<String> =
                        records.iter().filter(|(_, r)| wanted(r)).map(|(k, _)| k.clone()).collect();
                    if !group.is_empty() {
                        return choose(&group, i, None);
                    }
                }
                choose(&all, i, Some(GHOST))
            }
            Pick::Own(i) => choose(&all, i, Some(GHOST)),
            Pick::Global(i) => choose(&self.all_keys, i, Some(GHOST)),
        }
    }

    /// The merchant reference a new payment or payout asks for: none, one of a pool shared by every
    /// merchant, or one already used (by this merchant or any).
    fn merchant_reference(&self, m: usize, choice: RefChoice) -> Option<String> {
        match choice {
            RefChoice::Generated => None,
            RefChoice::Pool(i) => Some(REFERENCE_POOL[i % REFERENCE_POOL.len()].to_owned()),
            RefChoice::Existing { own: true, index } => {
                let used: Vec<String> = self.merchants[m].used.iter().cloned().collect();
                Some(choose(&used, index, Some("cmd-0")))
            }
            RefChoice::Existing { own: false, index } => Some(choose(&self.all_keys, index, Some("cmd-0"))),
        }
    }

    /// Resolves a generated operation into a concrete command for one merchant, given the state reached.
    fn resolve(&self, op: &Op) -> (usize, Command) {
        let n = self.merchants.len();
        match *op {
            Op::Initiate { m, currency, amount, fee, reference: choice } => {
                let m = m % n;
                let r = self.merchant_reference(m, choice);
                let new =
                    new_payment(CURRENCIES[currency % CURRENCIES.len()], amount, fee, r.as_deref().map(reference));
                (m, Command::InitiatePayment(new))
            }
            Op::Notice { m, target, notice } => {
                let m = m % n;
                let open = |p: &MPayment| {
                    matches!(p.status, PaymentStatus::Initiated | PaymentStatus::Processing | PaymentStatus::Expired)
                };
                let r = self.pick_key(&self.merchants[m].payments, &[&open], target);
                let notice = match notice {
                    NoticeKind::Processing => PaymentNotice::Processing,
                    NoticeKind::Confirmed => PaymentNotice::Confirmed,
                    NoticeKind::Declined => PaymentNotice::Declined { failure_code: "insufficient_funds".into() },
                    NoticeKind::Expired => PaymentNotice::Expired,
                    NoticeKind::Opened(n) => PaymentNotice::Opened {
                        payment_url: ReturnUrl::parse(PAYMENT_PAGES[n % PAYMENT_PAGES.len()], true)
                            .expect("a page URL"),
                    },
                };
                (m, Command::PaymentNotice { reference: reference(&r), notice })
            }
            Op::Refund { m, target, amount } => {
                let m = m % n;
                let open = |p: &MPayment| p.refund_open();
                // Half the time a payment already refunded in part, so that sequences of refunds are common.
                let again = |p: &MPayment| p.refund_open() && p.status == PaymentStatus::PartlyRefunded;
                let preferred: &[&dyn Fn(&MPayment) -> bool] =
                    if matches!(target, Pick::Open(i) if i % 2 == 0) { &[&again, &open] } else { &[&open] };
                let r = self.pick_key(&self.merchants[m].payments, preferred, target);
                let paid = self.merchants[m].payments.get(&r).map_or(1_000, |p| p.left().max(1));
                let amount = match amount {
                    RefundAmount::Full => None,
                    RefundAmount::PerMille(pm) => Some((paid * pm / 1_000).max(1)),
                    RefundAmount::Above(extra) => Some(paid + extra),
                    RefundAmount::Raw(a) => Some(a),
                    RefundAmount::Balance(delta) => {
                        let currency = self.merchants[m].payments.get(&r).map_or(Currency::XOF, |p| p.currency);
                        Some((self.merchants[m].account(currency, Account::Available) + delta).max(1))
                    }
                };
                let amount = amount.map(|a| Amount::positive(a).unwrap());
                (m, Command::RequestRefund { reference: reference(&r), amount, reason: None })
            }
            Op::RefundNotice { m, target, completed, back } => {
                let m = m % n;
                let open = |p: &MPayment| p.latest().is_some_and(|r| r.status == RefundStatus::Processing);
                let done = |p: &MPayment| !p.refunds.is_empty();
                // Half the time the second or later refund of a payment, so that sequences of refunds end.
                let again = |p: &MPayment| open(p) && p.status == PaymentStatus::PartlyRefunded;
                let preferred: &[&dyn Fn(&MPayment) -> bool] = if matches!(target, Pick::Open(i) if i % 2 == 0) {
                    &[&again, &open, &done]
                } else {
                    &[&open, &done]
                };
                let r = self.pick_key(&self.merchants[m].payments, preferred, target);
                let outcome = if completed { RefundOutcome::Completed } else { RefundOutcome::Refused };
                // Mostly about the latest refund; sometimes about an earlier one (a late or repeated notice),
                // or about a refund of another payment.
                let refunds = self.merchants[m].payments.get(&r).map(|p| p.refunds.as_slice()).unwrap_or_default();
                let earlier = refunds.len().checked_sub(1 + back).and_then(|i| refunds.get(i));
                let refund = match earlier.or(refunds.last()) {
                    Some(r) => r.reference.clone(),
                    None => choose(&self.all_keys, back, Some("rmb_00000000000000000000000000")),
                };
                (m, Command::RefundNotice { reference: reference(&r), refund, outcome })
            }
            Op::Payout { m, currency, amount, fee, reference: choice } => {
                let m = m % n;
                let currency = CURRENCIES[currency % CURRENCIES.len()];
                let amount = match amount {
                    // With nothing available, aim at a plausible amount anyway (refused as insufficient).
                    PayoutAmount::PerMille(pm) => {
                        (self.merchants[m].account(currency, Account::Available).max(1_000) * pm / 1_000).max(1)
                    }
                    PayoutAmount::Raw(a) => a,
                    PayoutAmount::Balance(delta) => {
                        (self.merchants[m].account(currency, Account::Available) + delta).max(1)
                    }
                };
                let r = self.merchant_reference(m, choice);
                (m, Command::CreatePayout(new_payout(currency, amount, fee, r.as_deref().map(reference))))
            }
            Op::PayoutNotice { m, target, sent } => {
                let m = m % n;
                let open = |o: &MPayout| o.status == PayoutStatus::Pending;
                let done = |_: &MPayout| true;
                let id = self.pick_key(&self.merchants[m].payouts, &[&open, &done], target);
                let outcome =
                    if sent { PayoutOutcome::Sent } else { PayoutOutcome::Refused { reason: "compte inconnu".into() } };
                (m, Command::PayoutNotice { id, outcome })
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Checks shared by both tests.
// ---------------------------------------------------------------------------------------------------------------

/// What one command did, as observed from the system under test.
#[derive(Debug)]
enum Outcome {
    Rejected(Rejection),
    Unchanged(Record),
    Changed { record: Record, journal: JournalEvent, outbox: Vec<OutboxItem> },
}

fn fail(what: impl Debug) -> TestCaseError {
    TestCaseError::fail(format!("{what:?}"))
}

/// Refusals compare exactly, except the wording of `invalid_state`.
fn same_rejection(expected: &Rejection, actual: &Rejection) -> bool {
    match (expected, actual) {
        (Rejection::InvalidState(_), Rejection::InvalidState(_)) => true,
        _ => expected == actual,
    }
}

/// The payment moves of docs/api.md § Payments, and nothing else.
fn payment_move_allowed(from: PaymentStatus, to: PaymentStatus) -> bool {
    use PaymentStatus::*;
    match from {
        Initiated => matches!(to, Processing | Succeeded | Failed | Expired),
        Processing => matches!(to, Succeeded | Failed | Expired),
        // A late success is the only way out of `expire`.
        Expired => to == Succeeded,
        // Final, except that completed refunds move a paid payment on.
        Succeeded => matches!(to, PartlyRefunded | Refunded),
        PartlyRefunded => to == Refunded,
        Failed | Refunded => false,
    }
}

fn sum_by_account(entries: &[caisse_engine::domain::ledger::Entry]) -> BTreeMap<Account, i64> {
    let mut sums = BTreeMap::new();
    for e in entries {
        *sums.entry(e.account).or_insert(0) += e.amount_minor;
    }
    sums.retain(|_, v| *v != 0);
    sums
}

/// Checks one accepted change without the model: legal status move, balanced entries, one notification per
/// status change with the right body, credit only on the move into `succes`.
fn check_change_shape(
    before: Option<&Record>,
    after: &Record,
    journal: &JournalEvent,
    outbox: &[OutboxItem],
) -> Result<(), TestCaseError> {
    let mut per_currency: BTreeMap<Currency, i128> = BTreeMap::new();
    for e in &journal.entries {
        prop_assert_eq!(e.currency, journal.currency, "an entry in another currency than its event: {:?}", journal);
        *per_currency.entry(e.currency).or_insert(0) += i128::from(e.amount_minor);
    }
    prop_assert!(per_currency.values().all(|s| *s == 0), "unbalanced journal event {:?}", journal);

    // Which status changed, and so which event must have been written.
    let event = match (before, after) {
        (None, Record::Payment(p)) => {
            prop_assert_eq!(p.status, PaymentStatus::Initiated);
            prop_assert!(p.refund.is_none() && p.refunds.is_empty() && p.paid_at.is_none());
            Some(EventKind::PaymentInitiated)
        }
        (None, Record::Payout(o)) => {
            prop_assert_eq!(o.status, PayoutStatus::Pending);
            None
        }
        (Some(Record::Payment(a)), Record::Payment(b)) => {
            prop_assert_eq!(&a.reference, &b.reference);
            prop_assert_eq!(&a.transaction_id, &b.transaction_id);
            prop_assert_eq!(
                (a.amount, a.currency, a.fee, a.net_amount),
                (b.amount, b.currency, b.fee, b.net_amount),
                "a payment's amounts never change"
            );
            prop_assert!(
                a.status == b.status || payment_move_allowed(a.status, b.status),
                "illegal payment move {:?} -> {:?}",
                a.status,
                b.status
            );
            prop_assert!(b.refunds.len() <= a.refunds.len() + 1, "one refund at a time");
            for (ra, rb) in a.refunds.iter().zip(&b.refunds) {
                prop_assert_eq!((&ra.reference, ra.amount), (&rb.reference, rb.amount), "a refund keeps its amount");
                prop_assert!(
                    ra.status == rb.status
                        || (ra.status == RefundStatus::Processing && rb.status != RefundStatus::Processing),
                    "illegal refund move {:?} -> {:?}",
                    ra.status,
                    rb.status
                );
            }
            if let Some(r) = b.refunds.get(a.refunds.len()) {
                prop_assert!(
                    matches!(a.status, PaymentStatus::Succeeded | PaymentStatus::PartlyRefunded),
                    "refund of a payment that is not paid"
                );
                prop_assert!(
                    a.refunds.last().is_none_or(|last| last.status != RefundStatus::Processing),
                    "a refund while another is under way"
                );
                prop_assert_eq!(r.status, RefundStatus::Processing);
                prop_assert!(!r.amount.is_zero());
            }
            prop_assert!(
                b.refunds[..b.refunds.len().saturating_sub(1)].iter().all(|r| r.status != RefundStatus::Processing),
                "only the latest refund may be under way"
            );
            prop_assert_eq!(b.refund.as_ref(), b.refunds.last(), "remboursement is the latest refund");
            let held: i64 =
                b.refunds.iter().filter(|r| r.status != RefundStatus::Failed).map(|r| r.amount.minor()).sum();
            prop_assert!(held <= b.amount.minor(), "refunds above the payment's amount: {:?}", b.refunds);
            let refunded: i64 =
                b.refunds.iter().filter(|r| r.status == RefundStatus::Succeeded).map(|r| r.amount.minor()).sum();
            prop_assert_eq!(b.refunded_amount.minor(), refunded, "montant_rembourse is the completed refunds' sum");
            let expected = match refunded {
                0 => None,
                r if r == b.amount.minor() => Some(PaymentStatus::Refunded),
                _ => Some(PaymentStatus::PartlyRefunded),
            };
            if let Some(status) = expected {
                prop_assert_eq!(b.status, status, "status after {} refunded", refunded);
            }
            // A completed refund sends `payment.refunded` even when the status stays `rembourse_partiellement`.
            if b.refunded_amount != a.refunded_amount {
                Some(EventKind::PaymentRefunded)
            } else {
                (a.status != b.status).then(|| payment_event(b.status))
            }
        }
        (Some(Record::Payout(a)), Record::Payout(b)) => {
            prop_assert_eq!(&a.id, &b.id);
            prop_assert_eq!((a.amount, a.currency, a.fee, a.net_amount), (b.amount, b.currency, b.fee, b.net_amount));
            prop_assert!(
                a.status == b.status || (a.status == PayoutStatus::Pending),
                "illegal payout move {:?} -> {:?}",
                a.status,
                b.status
            );
            if a.status != b.status {
                payout_event(b.status)
            } else {
                None
            }
        }
        (before, after) => return Err(TestCaseError::fail(format!("a record changed kind: {before:?} -> {after:?}"))),
    };

    prop_assert_eq!(outbox.len(), usize::from(event.is_some()), "notifications for {:?}: {:?}", after, outbox);
    for item in outbox {
        let body: WebhookBody = serde_json::from_str(&item.body).map_err(fail)?;
        let value: serde_json::Value = serde_json::from_str(&item.body).map_err(fail)?;
        let top: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
        prop_assert_eq!(top, ["created_at", "data", "event"]);
        prop_assert_eq!(Some(item.event), event);
        prop_assert_eq!(body.event, item.event);
        prop_assert_eq!(body.created_at, journal.at);
        prop_assert_eq!(&item.reference, after.key());
        prop_assert_eq!(&body.data.reference, after.key());
        match after {
            Record::Payment(p) => {
                prop_assert_eq!(&body.data.status, payment_name(p.status));
                prop_assert_eq!(
                    body.data.paid_at.is_some(),
                    matches!(
                        p.status,
                        PaymentStatus::Succeeded | PaymentStatus::PartlyRefunded | PaymentStatus::Refunded
                    )
                );
                if item.event == EventKind::PaymentRefunded {
                    prop_assert_eq!(body.data.refunded_amount, Some(p.refunded_amount));
                    prop_assert_eq!(&body.data, &WebhookData::of_refunded_payment(p));
                } else {
                    prop_assert_eq!(&body.data, &WebhookData::of_payment(p));
                }
            }
            Record::Payout(o) => {
                prop_assert_eq!(&body.data.status, payout_name(o.status));
                prop_assert!(body.data.customer_email.is_none());
                prop_assert_eq!(body.data.paid_at.is_some(), o.status == PayoutStatus::Sent);
                prop_assert_eq!(&body.data, &WebhookData::of_payout(o));
            }
            Record::Link(l) => return Err(fail(("a link change sends no webhook", l))),
        }
    }

    // Customer funds move only on the move into `succes`, once, for the payment's whole amount.
    let credits: Vec<i64> =
        journal.entries.iter().filter(|e| e.account == Account::CustomerFunds).map(|e| e.amount_minor).collect();
    match (before, after) {
        (Some(Record::Payment(a)), Record::Payment(b))
            if a.status != PaymentStatus::Succeeded && b.status == PaymentStatus::Succeeded =>
        {
            prop_assert_eq!(credits, vec![-b.amount.minor()]);
        }
        _ => prop_assert!(credits.is_empty(), "customer funds moved outside a confirmation: {:?}", journal),
    }
    Ok(())
}

fn check_payment(model: &MPayment, p: &Payment) -> Result<(), TestCaseError> {
    prop_assert_eq!(p.status, model.status, "payment {}", p.reference);
    prop_assert_eq!(
        (p.currency, p.amount.minor(), p.fee.minor(), p.net_amount.minor()),
        (model.currency, model.amount, model.fee, model.net)
    );
    let refunds: Vec<_> = p.refunds.iter().map(|r| (r.reference.clone(), r.amount.minor(), r.status)).collect();
    let expected: Vec<_> = model.refunds.iter().map(|r| (r.reference.clone(), r.amount, r.status)).collect();
    prop_assert_eq!(refunds, expected, "refunds of {}", p.reference);
    prop_assert_eq!(p.refund.as_ref(), p.refunds.last(), "remboursement of {}", p.reference);
    prop_assert_eq!(p.refunded_amount.minor(), model.refunded, "montant_rembourse of {}", p.reference);
    prop_assert_eq!(p.paid_at.is_some(), model.credits == 1, "paid_at of {}", p.reference);
    prop_assert_eq!(p.payment_url.as_deref(), model.page, "url_paiement of {}", p.reference);
    prop_assert_eq!(
        p.failure_code.is_some(),
        matches!(p.status, PaymentStatus::Failed | PaymentStatus::Expired),
        "failure_code of {}",
        p.reference
    );
    Ok(())
}

fn check_payout(model: &MPayout, o: &Payout) -> Result<(), TestCaseError> {
    prop_assert_eq!(o.status, model.status, "payout {}", o.id);
    prop_assert_eq!(o.reference.as_ref().map(|r| r.as_str()), model.reference.as_deref(), "payout {}", o.id);
    prop_assert_eq!(
        (o.currency, o.amount.minor(), o.fee.minor(), o.net_amount.minor()),
        (model.currency, model.amount, model.fee, model.net)
    );
    prop_assert_eq!(o.processed_at.is_some(), o.status == PayoutStatus::Sent);
    prop_assert_eq!(o.rejection_reason.is_some(), o.status == PayoutStatus::Rejected);
    Ok(())
}

fn check_record(model: &MMerchant, record: &Record) -> Result<(), TestCaseError> {
    match record {
        Record::Payment(p) => {
            let mp = model.payments.get(p.reference.as_str()).ok_or_else(|| fail(("unknown payment", p)))?;
            check_payment(mp, p)
        }
        Record::Payout(o) => {
            let mo = model.payouts.get(&o.id).ok_or_else(|| fail(("unknown payout", o)))?;
            check_payout(mo, o)
        }
        Record::Link(l) => Err(fail(("the model makes no links", l))),
    }
}

impl Model {
    /// Compares one observed step with the model's expectation, then moves the model forward.
    fn step(
        &mut self,
        m: usize,
        cmd: &Command,
        before: Option<&Record>,
        outcome: &Outcome,
        now: Option<Timestamp>,
    ) -> Result<(), TestCaseError> {
        let expect = self.merchants[m].expect(cmd);
        let change = match (&expect, outcome) {
            (Expect::Reject(e), Outcome::Rejected(a)) => {
                prop_assert!(same_rejection(e, a), "{:?}: expected refusal {:?}, got {:?}", cmd, e, a);
                return Ok(());
            }
            (Expect::Unchanged, Outcome::Unchanged(record)) => {
                prop_assert_eq!(Some(record), before, "a no-op notice must answer the record as it is");
                return Ok(());
            }
            (Expect::Change(change), Outcome::Changed { .. }) => change,
            _ => {
                return Err(TestCaseError::fail(format!(
                    "{cmd:?}: the model expected {expect:?}, the engine did {outcome:?}"
                )))
            }
        };
        let Outcome::Changed { record, journal, outbox } = outcome else { unreachable!() };
        check_change_shape(before, record, journal, outbox)?;

        let mm = &mut self.merchants[m];
        prop_assert_eq!(journal.seq, mm.seq + 1, "journal positions are contiguous");
        if let Some(now) = now {
            prop_assert_eq!(journal.at, now);
        }
        prop_assert_eq!(journal.trigger, change.trigger);
        prop_assert_eq!(journal.currency, change.currency);
        prop_assert_eq!(journal.status.as_str(), change.journal_status);
        match &change.journal_reference {
            Key::Known(k) => prop_assert_eq!(&journal.reference, k),
            Key::Fresh(prefix) => {
                prop_assert!(
                    journal.reference.starts_with(prefix),
                    "{} should start with {}",
                    journal.reference,
                    prefix
                );
                prop_assert!(!mm.used.contains(&journal.reference), "generated reference {} reused", journal.reference);
            }
        }
        let mut deltas: BTreeMap<Account, i64> = BTreeMap::new();
        for (account, d) in &change.deltas {
            *deltas.entry(*account).or_insert(0) += d;
        }
        deltas.retain(|_, v| *v != 0);
        prop_assert_eq!(sum_by_account(&journal.entries), deltas, "ledger entries of {:?}", journal);
        match change.notify {
            None => prop_assert!(outbox.is_empty(), "no notification expected for {:?}: {:?}", cmd, outbox),
            Some((event, status)) => {
                prop_assert_eq!(outbox.len(), 1);
                let body: WebhookBody = serde_json::from_str(&outbox[0].body).map_err(fail)?;
                prop_assert_eq!(outbox[0].event, event);
                prop_assert_eq!(body.data.status.as_str(), status);
            }
        }

        let key = record.key().to_owned();
        match &change.apply {
            Apply::NewPayment(p) => {
                prop_assert_eq!(&journal.reference, &key);
                mm.payments.insert(key.clone(), p.clone());
                mm.used.insert(key.clone());
                self.all_keys.push(key.clone());
            }
            Apply::PaymentStatus { reference, status, page } => {
                prop_assert_eq!(reference, &key);
                let p = mm.payments.get_mut(reference).unwrap();
                p.status = *status;
                if *status == PaymentStatus::Succeeded {
                    p.credits += 1;
                }
                if page.is_some() {
                    p.page = *page;
                }
            }
            Apply::PaymentPage { reference, page } => {
                prop_assert_eq!(reference, &key);
                mm.payments.get_mut(reference).unwrap().page = Some(*page);
            }
            Apply::NewRefund { payment, amount } => {
                prop_assert_eq!(payment, &key);
                let refund = journal.reference.clone();
                let p = mm.payments.get_mut(payment).unwrap();
                p.refunds.push(MRefund {
                    reference: refund.clone(),
                    amount: *amount,
                    status: RefundStatus::Processing,
                });
                mm.used.insert(refund.clone());
                self.all_keys.push(refund);
            }
            Apply::RefundStatus { payment, refund, status, payment_status } => {
                prop_assert_eq!(payment, &key);
                let p = mm.payments.get_mut(payment).unwrap();
                let r = p.refunds.iter_mut().find(|r| r.reference == *refund).unwrap();
                r.status = *status;
                if *status == RefundStatus::Succeeded {
                    p.refunded += r.amount;
                }
                p.status = *payment_status;
            }
            Apply::NewPayout(o) => {
                prop_assert_eq!(&journal.reference, &key);
                mm.payouts.insert(key.clone(), o.clone());
                mm.used.insert(key.clone());
                self.all_keys.push(key.clone());
                if let Some(alias) = &o.reference {
                    mm.used.insert(alias.clone());
                    self.all_keys.push(alias.clone());
                }
            }
            Apply::PayoutStatus { id, status } => {
                prop_assert_eq!(id, &key);
                mm.payouts.get_mut(id).unwrap().status = *status;
            }
        }
        for (account, d) in &change.deltas {
            *mm.accounts.entry((change.currency, *account)).or_insert(0) += d;
        }
        mm.accounts.retain(|_, v| *v != 0);
        mm.currencies.insert(change.currency);
        mm.seq += 1;
        if let Some((event, status)) = change.notify {
            mm.events.push((event, key, status.to_owned()));
        }
        check_record(mm, record)
    }
}

/// The auditor: recomputes everything from one merchant's whole journal and compares it with the balances
/// the system reports and with the model.
fn audit(model: &MMerchant, balances: &Balances, journal: &[JournalEvent]) -> Result<(), TestCaseError> {
    let mut sums: BTreeMap<(Currency, Account), i64> = BTreeMap::new();
    let mut credits: BTreeMap<&str, u32> = BTreeMap::new();
    for (i, event) in journal.iter().enumerate() {
        prop_assert_eq!(event.seq, i as u64 + 1, "journal positions run 1, 2, 3, ... without gaps");
        let mut per_currency: BTreeMap<Currency, i128> = BTreeMap::new();
        for e in &event.entries {
            *per_currency.entry(e.currency).or_insert(0) += i128::from(e.amount_minor);
            *sums.entry((e.currency, e.account)).or_insert(0) += e.amount_minor;
            if e.account == Account::CustomerFunds {
                *credits.entry(event.reference.as_str()).or_insert(0) += 1;
            }
        }
        prop_assert!(per_currency.values().all(|s| *s == 0), "unbalanced event {:?}", event);
        prop_assert!(event.entries.iter().map(|e| i128::from(e.amount_minor)).sum::<i128>() == 0);
    }
    prop_assert_eq!(journal.len() as u64, model.seq);
    for (reference, n) in &credits {
        prop_assert!(*n <= 1, "payment {} credited {} times", reference, n);
    }
    let credited: BTreeMap<&str, u32> =
        model.payments.iter().filter(|(_, p)| p.credits > 0).map(|(k, p)| (k.as_str(), p.credits)).collect();
    prop_assert_eq!(credits, credited, "credited payments");

    let rows: BTreeSet<Currency> = balances.0.keys().copied().collect();
    prop_assert_eq!(&rows, &model.currencies, "one balance row per currency used");
    for (currency, b) in &balances.0 {
        prop_assert!(b.available >= 0 && b.pending >= 0, "negative balance {} {:?}", currency, b);
        let ledger = |account| sums.get(&(*currency, account)).copied().unwrap_or(0);
        prop_assert_eq!(b.available, ledger(Account::Available), "{} disponible vs the journal", currency);
        prop_assert_eq!(b.pending, ledger(Account::Pending), "{} en_attente vs the journal", currency);
        prop_assert_eq!(
            b.available,
            model.account(*currency, Account::Available),
            "{} disponible vs the model",
            currency
        );
        prop_assert_eq!(b.pending, model.account(*currency, Account::Pending), "{} en_attente vs the model", currency);
        let total: i128 = Account::ALL.iter().map(|a| i128::from(ledger(*a))).sum();
        prop_assert_eq!(total, 0, "{} ledger does not sum to zero", currency);
    }
    sums.retain(|_, v| *v != 0);
    prop_assert_eq!(&sums, &model.accounts, "all six accounts vs the model");
    Ok(())
}

fn config(default_cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default_cases);
    // No regressions file: this test owns only its source file; the failing sequence is printed instead.
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

// ---------------------------------------------------------------------------------------------------------------
// 1. The pure core, driven the way the merchant actor drives it.
// ---------------------------------------------------------------------------------------------------------------

/// One merchant's state as the actor and the store hold it: balances, journal position, records by key,
/// every reference the merchant holds, and what was written (journal and outbox).
#[derive(Default)]
struct Shop {
    balances: Balances,
    seq: u64,
    payments: BTreeMap<String, Payment>,
    payouts: BTreeMap<String, Payout>,
    refs: BTreeMap<String, (TransactionType, String)>,
    journal: Vec<JournalEvent>,
    outbox: Vec<OutboxItem>,
}

impl Shop {
    /// The record a command is about, as the actor's lookup finds it in the store.
    fn lookup(&self, target: &Target) -> Option<Record> {
        match target {
            Target::NewPayment(None) | Target::NewPayout(None) => None,
            // A new reference must not collide with any reference of the merchant, refunds and payouts too.
            Target::NewPayment(Some(r)) | Target::NewPayout(Some(r)) => match self.refs.get(r.as_str())? {
                (TransactionType::Payout, owner) => self.payouts.get(owner).cloned().map(Record::Payout),
                (_, owner) => self.payments.get(owner).cloned().map(Record::Payment),
            },
            Target::Payment(r) => self.payments.get(r.as_str()).cloned().map(Record::Payment),
            Target::Payout(id) => self.payouts.get(id).cloned().map(Record::Payout),
            Target::NewLink(_) | Target::Link(_) => None,
        }
    }

    /// Keeps a record seen in an answer, with the references it holds (for the engine test, which does not
    /// see the store's index).
    fn remember(&mut self, record: &Record) {
        match record {
            Record::Payment(p) => {
                let key = p.reference.as_str().to_owned();
                self.refs.insert(key.clone(), (TransactionType::Payment, key.clone()));
                for r in &p.refunds {
                    self.refs.insert(r.reference.clone(), (TransactionType::Refund, key.clone()));
                }
                self.payments.insert(key, p.clone());
            }
            Record::Payout(o) => {
                self.refs.insert(o.id.clone(), (TransactionType::Payout, o.id.clone()));
                if let Some(alias) = &o.reference {
                    self.refs.insert(alias.as_str().to_owned(), (TransactionType::Payout, o.id.clone()));
                }
                self.payouts.insert(o.id.clone(), o.clone());
            }
            Record::Link(_) => {}
        }
    }
}

fn run_pure(merchants: usize, ops: &[Op], tally: &mut dyn FnMut(String)) -> Result<(), TestCaseError> {
    let mut model = Model::new(merchants);
    let mut shops: Vec<Shop> = (0..merchants).map(|_| Shop::default()).collect();
    let mut counter = 0u64;
    let mut ids = |kind: IdKind| {
        counter += 1;
        format!("{}_{counter:026}", kind.prefix())
    };
    for (step, op) in ops.iter().enumerate() {
        let now = Timestamp::from_unix_ms(T0_MS + step as u64 * 1_000);
        let (m, cmd) = model.resolve(op);
        let shop = &mut shops[m];
        let before = shop.lookup(&cmd.target());
        let outcome = match decide(&shop.balances, shop.seq + 1, before.as_ref(), None, &cmd, now, &mut ids) {
            Err(rejection) => Outcome::Rejected(rejection),
            Ok(Decided::Unchanged(record)) => Outcome::Unchanged(record),
            Ok(Decided::Changed(decision)) => {
                // A new transaction is indexed exactly when a payment, refund or payout comes into being.
                let new_refund = match (&before, &decision.record) {
                    (Some(Record::Payment(a)), Record::Payment(b)) => b.refunds.len() > a.refunds.len(),
                    _ => false,
                };
                let created = decision.created.as_ref();
                prop_assert_eq!(created.is_some(), before.is_none() || new_refund, "created: {:?}", created);
                if let Some(c) = created {
                    let kind = match &decision.record {
                        Record::Payout(_) => TransactionType::Payout,
                        Record::Payment(_) if new_refund => TransactionType::Refund,
                        Record::Payment(_) => TransactionType::Payment,
                        Record::Link(l) => return Err(fail(("the model makes no links", l))),
                    };
                    prop_assert_eq!(c.kind, kind);
                    prop_assert_eq!(&c.owner, decision.record.key());
                    prop_assert_eq!(&c.reference, &decision.journal.reference);
                    prop_assert!(!shop.refs.contains_key(&c.reference), "reference {} indexed twice", c.reference);
                }
                // Store the decision as the actor and the store would: all of it, in one step.
                shop.seq = decision.journal.seq;
                shop.balances = decision.balances.clone();
                match &decision.record {
                    Record::Payment(p) => {
                        shop.payments.insert(p.reference.as_str().to_owned(), p.clone());
                    }
                    Record::Payout(o) => {
                        shop.payouts.insert(o.id.clone(), o.clone());
                    }
                    Record::Link(l) => return Err(fail(("the model makes no links", l))),
                }
                if let Some(c) = &decision.created {
                    shop.refs.insert(c.reference.clone(), (c.kind, c.owner.clone()));
                    if let Some(alias) = &c.alias {
                        prop_assert!(!shop.refs.contains_key(alias), "reference {} indexed twice", alias);
                        shop.refs.insert(alias.clone(), (c.kind, c.owner.clone()));
                    }
                }
                shop.journal.push(decision.journal.clone());
                shop.outbox.extend(decision.outbox.iter().cloned());
                Outcome::Changed { record: decision.record, journal: decision.journal, outbox: decision.outbox }
            }
        };
        tally(label(&cmd, before.as_ref(), &outcome));
        model.step(m, &cmd, before.as_ref(), &outcome, Some(now))?;
        audit(&model.merchants[m], &shop.balances, &shop.journal)?;
    }

    // At the end, every record, every notification and every merchant once more, from scratch.
    let mut outbox_ids = HashSet::new();
    for (mm, shop) in model.merchants.iter().zip(&shops) {
        audit(mm, &shop.balances, &shop.journal)?;
        prop_assert_eq!(shop.payments.len(), mm.payments.len());
        prop_assert_eq!(shop.payouts.len(), mm.payouts.len());
        for p in shop.payments.values() {
            check_record(mm, &Record::Payment(p.clone()))?;
        }
        for o in shop.payouts.values() {
            check_record(mm, &Record::Payout(o.clone()))?;
        }
        let written: Vec<(EventKind, String, String)> = shop
            .outbox
            .iter()
            .map(|n| {
                let body: WebhookBody = serde_json::from_str(&n.body).unwrap();
                (n.event, n.reference.clone(), body.data.status)
            })
            .collect();
        prop_assert_eq!(&written, &mm.events, "the outbox holds exactly the expected notifications, in order");
        for n in &shop.outbox {
            prop_assert!(outbox_ids.insert(n.id.clone()), "notification id {} used twice", n.id);
        }
    }
    Ok(())
}

/// The name of what a step did, for the coverage tally: command, then outcome (and the notable cases).
fn label(cmd: &Command, before: Option<&Record>, outcome: &Outcome) -> String {
    let command = match cmd {
        Command::InitiatePayment(_) => "initiate",
        Command::PaymentNotice { notice: PaymentNotice::Processing, .. } => "notice processing",
        Command::PaymentNotice { notice: PaymentNotice::Confirmed, .. } => "notice confirmed",
        Command::PaymentNotice { notice: PaymentNotice::Declined { .. }, .. } => "notice declined",
        Command::PaymentNotice { notice: PaymentNotice::Expired, .. } => "notice expired",
        Command::PaymentNotice { notice: PaymentNotice::Opened { .. }, .. } => "notice opened",
        Command::RequestRefund { .. } => match before {
            Some(Record::Payment(p)) if p.status == PaymentStatus::PartlyRefunded => "refund again",
            _ => "refund",
        },
        Command::RefundNotice { outcome: RefundOutcome::Completed, .. } => "refund completed",
        Command::RefundNotice { outcome: RefundOutcome::Refused, .. } => "refund refused",
        Command::CreatePayout(_) => "payout",
        Command::CreateLink(_) | Command::DeactivateLink { .. } => "link",
        Command::PayoutNotice { outcome: PayoutOutcome::Sent, .. } => "payout sent",
        Command::PayoutNotice { outcome: PayoutOutcome::Refused { .. }, .. } => "payout refused",
    };
    let result = match outcome {
        Outcome::Rejected(r) => format!("{r:?}").split(['(', ' ', '{']).next().unwrap_or_default().to_owned(),
        Outcome::Unchanged(_) => "Unchanged".to_owned(),
        Outcome::Changed { record: Record::Payment(b), .. } => match before {
            Some(Record::Payment(a)) if a.status != b.status => format!("{:?} -> {:?}", a.status, b.status),
            _ => "Changed".to_owned(),
        },
        Outcome::Changed { .. } => "Changed".to_owned(),
    };
    format!("{command}: {result}")
}

/// The main property: `decide` over long random sequences, checked against the model after every step.
///
/// Run by hand rather than with the `proptest!` macro so that, once all cases pass, the test can also prove
/// the generator is not vacuous: every kind of acceptance, no-op and refusal was reached many times.
#[test]
fn pure_core_matches_the_reference_model() {
    let config = config(256);
    let cases = config.cases;
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let tally = std::cell::RefCell::new(BTreeMap::<String, u64>::new());
    let result = runner.run(&(2usize..=4, vec(op(), 1..=200)), |(merchants, ops)| {
        run_pure(merchants, &ops, &mut |l| *tally.borrow_mut().entry(l).or_insert(0) += 1)
    });
    if let Err(err) = result {
        panic!("{err}");
    }
    let tally = tally.into_inner();
    for (label, n) in &tally {
        eprintln!("{n:>8}  {label}");
    }
    // Each of these happens a dozen times or more in 256 cases; with fewer cases a miss proves nothing.
    if cases >= 200 {
        let missing: Vec<&str> = REACHED.iter().copied().filter(|l| !tally.contains_key(*l)).collect();
        assert!(missing.is_empty(), "the generated sequences never reached {missing:?}");
    }
}

/// Every outcome the sequences must reach, so that a passing run means something.
const REACHED: &[&str] = &[
    "initiate: Changed",
    "initiate: DuplicateReference",
    "initiate: AmountBelowFee",
    "notice processing: Initiated -> Processing",
    "notice opened: Initiated -> Processing",
    "notice opened: Changed",
    "notice opened: Unchanged",
    "notice processing: Unchanged",
    "notice processing: NotFound",
    "notice confirmed: Initiated -> Succeeded",
    "notice confirmed: Processing -> Succeeded",
    "notice confirmed: Expired -> Succeeded",
    "notice confirmed: Unchanged",
    "notice confirmed: NotFound",
    "notice declined: Initiated -> Failed",
    "notice declined: Processing -> Failed",
    "notice declined: Unchanged",
    "notice expired: Initiated -> Expired",
    "notice expired: Processing -> Expired",
    "notice expired: Unchanged",
    "refund: Changed",
    "refund: InvalidState",
    "refund: RefundAboveAmount",
    "refund: InsufficientBalance",
    "refund: NotFound",
    "refund completed: Succeeded -> Refunded",
    "refund completed: Succeeded -> PartlyRefunded",
    "refund again: Changed",
    "refund again: InsufficientBalance",
    "refund again: RefundAboveAmount",
    "refund completed: Unchanged",
    "refund completed: NotFound",
    "refund refused: Changed",
    "refund refused: Unchanged",
    "payout: Changed",
    "payout: InsufficientBalance",
    "payout: AmountBelowFee",
    "payout: DuplicateReference",
    "payout sent: Changed",
    "payout sent: Unchanged",
    "payout sent: NotFound",
    "payout refused: Changed",
    "payout refused: Unchanged",
];

// ---------------------------------------------------------------------------------------------------------------
// 2. The real engine: actors, group commit, the embedded store, recovery and the startup audit.
// ---------------------------------------------------------------------------------------------------------------

/// Everything the engine shows about one merchant, read through its public API.
async fn observe_merchant(engine: &Engine, id: &MerchantId) -> Result<(Balances, Vec<JournalEvent>), TestCaseError> {
    let balances = engine.balances(id).await.map_err(fail)?;
    let journal = engine.journal(id, 1, usize::MAX).map_err(fail)?;
    Ok((balances, journal))
}

/// Every record of the merchant, read back through the engine, equals the model's.
async fn check_all_records(engine: &Engine, id: &MerchantId, mm: &MMerchant) -> Result<(), TestCaseError> {
    for (reference, mp) in &mm.payments {
        let p = engine.payment(id, reference).await.map_err(fail)?.ok_or_else(|| fail(("lost payment", reference)))?;
        check_payment(mp, &p)?;
    }
    for (key, mo) in &mm.payouts {
        let o = engine.payout(id, key).await.map_err(fail)?.ok_or_else(|| fail(("lost payout", key)))?;
        check_payout(mo, &o)?;
    }
    Ok(())
}

fn far_future() -> Timestamp {
    Timestamp::from_unix_ms(u64::MAX / 2)
}

/// An answer of the engine during a batch.
// A handful per batch, consumed at once: boxing the large variant would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Reply {
    Executed(Result<Executed, EngineError>),
    Balances(Result<Balances, EngineError>),
}

type Pending<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + 'a>>;

/// Runs `futures` concurrently, polling each for the first time in order, so that their messages reach the
/// merchant actors' mailboxes in that order; returns the answers in the same order.
async fn in_order(mut futures: Vec<Pending<'_>>) -> Vec<Reply> {
    let mut replies: Vec<Option<Reply>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (future, reply) in futures.iter_mut().zip(replies.iter_mut()) {
            if reply.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(r) => *reply = Some(r),
                    std::task::Poll::Pending => waiting = true,
                }
            }
        }
        if waiting {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    replies.into_iter().map(|r| r.expect("every future finished")).collect()
}

/// Runs `ops` through a real engine, `batch` commands at a time: a batch is sent without waiting, so the
/// merchant actors pipeline it (decide the next command while the previous one is still being written), and
/// the answers are then checked in order against the model. A batch of 1 is the plain sequential case.
fn run_engine(merchants: usize, ops: &[Op], batch: usize, snapshot_every: u64) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(fail)?;
    let ids: Vec<MerchantId> = (0..merchants).map(|_| MerchantId::new()).collect();
    let mut config = EngineConfig::new(dir.path());
    config.shards = 2;
    // Small and random, so recovery after the reopen starts from a snapshot as well as from the journal.
    config.actors.snapshot_every = snapshot_every;

    let (model, balances_before) = actix::System::new().block_on({
        let (config, ids, ops) = (config.clone(), ids.clone(), ops.to_vec());
        async move {
            let engine = Engine::open(config).map_err(fail)?;
            let mut model = Model::new(ids.len());
            // The records as the answers showed them: what each next command finds.
            let mut seen_records: Vec<Shop> = ids.iter().map(|_| Shop::default()).collect();
            let mut seen_notifications: HashSet<String> = HashSet::new();
            for chunk in ops.chunks(batch) {
                // Resolved against the state before the batch: the targets are random anyway.
                let commands: Vec<(usize, Command)> = chunk.iter().map(|op| model.resolve(op)).collect();
                let mut futures: Vec<Pending<'_>> = Vec::new();
                for (m, cmd) in &commands {
                    let (engine, id, cmd) = (&engine, &ids[*m], cmd.clone());
                    futures.push(Box::pin(async move { Reply::Executed(engine.execute(id, cmd, None).await) }));
                }
                // A read queued behind the batch must wait for all of it to be durable, and show all of it.
                for id in &ids {
                    let engine = &engine;
                    futures.push(Box::pin(async move { Reply::Balances(engine.balances(id).await) }));
                }
                let mut replies = in_order(futures).await.into_iter();

                // What the batch wrote: the journals, and the new notifications of each merchant, in order.
                let mut journals = Vec::new();
                for id in &ids {
                    journals.push(engine.journal(id, 1, usize::MAX).map_err(fail)?);
                }
                let mut fresh: Vec<std::collections::VecDeque<_>> = ids.iter().map(|_| Default::default()).collect();
                for n in engine.due_notifications(far_future(), 100_000).map_err(fail)? {
                    if seen_notifications.insert(n.id.clone()) {
                        let m = ids.iter().position(|id| *id == n.merchant).ok_or_else(|| fail(("stray", &n)))?;
                        fresh[m].push_back(n);
                    }
                }

                for (m, cmd) in &commands {
                    let m = *m;
                    let Some(Reply::Executed(result)) = replies.next() else { unreachable!() };
                    let before = seen_records[m].lookup(&cmd.target());
                    let outcome = match result {
                        Err(EngineError::Rejected(rejection)) => Outcome::Rejected(rejection),
                        Err(other) => return Err(TestCaseError::fail(format!("{cmd:?} failed: {other}"))),
                        Ok(Executed::Replayed { .. }) => {
                            return Err(TestCaseError::fail("replayed without an idempotency key"))
                        }
                        // Every accepted change moves a status or adds a refund, so an equal record is a no-op.
                        Ok(Executed::Done(record)) if Some(&record) == before.as_ref() => Outcome::Unchanged(record),
                        Ok(Executed::Done(record)) => {
                            let position = model.merchants[m].seq as usize;
                            let journal = journals[m].get(position).cloned().ok_or_else(|| {
                                TestCaseError::fail(format!(
                                    "{cmd:?} answered a change but journal has no event {}",
                                    position + 1
                                ))
                            })?;
                            // This change's notification, if any, is the next one of the merchant: same instant
                            // and the body built from this very record.
                            // (`payment.refunded` adds the refunded total to the payment's fields.)
                            let data = match &record {
                                Record::Payment(p) => {
                                    vec![WebhookData::of_payment(p), WebhookData::of_refunded_payment(p)]
                                }
                                Record::Payout(o) => vec![WebhookData::of_payout(o)],
                                Record::Link(_) => Vec::new(),
                            };
                            let mut outbox = Vec::new();
                            let ours = fresh[m].front().is_some_and(|n| {
                                n.created_at == journal.at
                                    && serde_json::from_str::<WebhookBody>(&n.body)
                                        .is_ok_and(|b| data.contains(&b.data))
                            });
                            if ours {
                                let n = fresh[m].pop_front().unwrap();
                                outbox.push(OutboxItem {
                                    id: n.id,
                                    event: n.event,
                                    reference: n.reference,
                                    body: n.body,
                                });
                            }
                            seen_records[m].remember(&record);
                            Outcome::Changed { record, journal, outbox }
                        }
                    };
                    model.step(m, cmd, before.as_ref(), &outcome, None)?;
                }
                for (m, id) in ids.iter().enumerate() {
                    prop_assert!(fresh[m].is_empty(), "notifications no change accounts for: {:?}", fresh[m]);
                    let Some(Reply::Balances(read)) = replies.next() else { unreachable!() };
                    let read = read.map_err(fail)?;
                    audit(&model.merchants[m], &read, &journals[m])?;
                    prop_assert_eq!(&read, &engine.balances(id).await.map_err(fail)?);
                    check_all_records(&engine, id, &model.merchants[m]).await?;
                }
            }
            let mut balances = Vec::new();
            for (id, mm) in ids.iter().zip(&model.merchants) {
                let (b, journal) = observe_merchant(&engine, id).await?;
                audit(mm, &b, &journal)?;
                balances.push(b);
            }
            Ok::<_, TestCaseError>((model, balances))
        }
    })?;

    // Reopen on the same directory: the startup audit must pass and nothing may have moved.
    actix::System::new().block_on(async move {
        let engine = Engine::open(config).map_err(fail)?;
        let events: u64 = model.merchants.iter().map(|mm| mm.seq).sum();
        let active = model.merchants.iter().filter(|mm| mm.seq > 0).count() as u64;
        prop_assert_eq!(engine.audit_report().events, events);
        prop_assert_eq!(engine.audit_report().merchants, active);
        let mut expected_outbox = 0;
        for ((id, mm), before) in ids.iter().zip(&model.merchants).zip(&balances_before) {
            let (b, journal) = observe_merchant(&engine, id).await?;
            // Recovery replays the journal from the last snapshot: even `updated_at` must come back the same.
            prop_assert_eq!(&b, before, "balances changed across the restart");
            audit(mm, &b, &journal)?;
            check_all_records(&engine, id, mm).await?;
            expected_outbox += mm.events.len();
        }
        let outbox = engine.due_notifications(far_future(), 100_000).map_err(fail)?;
        prop_assert_eq!(outbox.len(), expected_outbox, "every notification survives the restart");
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { max_shrink_time: 120_000, ..config(16) })]

    /// The same invariants through the real engine, sequential or pipelined, and again after a restart.
    #[test]
    fn engine_matches_the_reference_model(
        merchants in 2usize..=3,
        ops in vec(op(), 1..=40),
        batch in prop_oneof![Just(1usize), 2usize..=8],
        snapshot_every in 1u64..=8,
    ) {
        run_engine(merchants, &ops, batch, snapshot_every)?;
    }
}
