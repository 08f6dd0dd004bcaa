//! Property test of payment links against a reference model, driving the pure core ([`decide`]) as the merchant
//! actor does: the record a command is about, the link it also reads, one decision at a time.
//!
//! Random sequences create `unique` and `multiple` links (some expiring), deactivate them, start payments through
//! them (open, closed, unknown or another merchant's links) and send every provider notice about those payments,
//! duplicated and late ones included, while a virtual clock moves. After every step the test checks, against a
//! model of plain integers:
//!
//! - each command is accepted or refused as the model says (`LinkClosed` with the link's status, `NotFound`,
//!   `invalid_state` for a deactivation of a closed link);
//! - a link's `nombre_paiements` and `montant_encaisse` count exactly the payments through it that reached
//!   `succes`, each once, whatever the link's status by then, and move only in the decision of that success;
//! - a `unique` link becomes `paye` at its first success and never moves again; `expire` is never stored and is
//!   read from `expire_at`;
//! - a link's own changes move no money and send no webhook, and every payment through a link names it in
//!   `metadata.lien_id`.

use std::collections::BTreeMap;

use caisse_engine::core::{decide, Command, Decided, NewLink, NewPayment, PaymentNotice, Record, Rejection, Target};
use caisse_engine::domain::ids::IdKind;
use caisse_engine::domain::ledger::Balances;
use caisse_engine::domain::links::{link_of, Link, LinkUsage};
use caisse_engine::domain::money::{Amount, Currency, FeeRule};
use caisse_engine::domain::phone::Phone;
use caisse_engine::domain::records::{Payment, ProviderCode};
use caisse_engine::domain::status::{LinkStatus, PaymentStatus};
use caisse_engine::domain::text::{Description, Metadata};
use caisse_engine::domain::time::Timestamp;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const T0_MS: u64 = 1_800_000_000_000;

#[derive(Debug, Clone, Copy)]
enum Op {
    /// A link of `amount`, `multiple` or not, expiring `expires_in_s` seconds after now when given.
    Create {
        amount: i64,
        multiple: bool,
        expires_in_s: Option<u64>,
    },
    Deactivate(usize),
    /// A payment through the link picked (or through a link id that exists nowhere).
    Pay {
        link: usize,
        ghost: bool,
    },
    Notice {
        payment: usize,
        kind: u8,
    },
    /// The clock moves this many seconds.
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (1i64..=50_000, any::<bool>(), proptest::option::of(1u64..=30))
            .prop_map(|(amount, multiple, expires_in_s)| Op::Create { amount, multiple, expires_in_s }),
        1 => (0usize..8).prop_map(Op::Deactivate),
        4 => (0usize..8, proptest::bool::weighted(0.05)).prop_map(|(link, ghost)| Op::Pay { link, ghost }),
        5 => (0usize..16, 0u8..4).prop_map(|(payment, kind)| Op::Notice { payment, kind }),
        1 => (1u64..=20).prop_map(Op::Wait),
    ]
}

/// What the model knows of a link.
#[derive(Debug, Clone, Default)]
struct MLink {
    amount: i64,
    multiple: bool,
    expires_at_ms: Option<u64>,
    /// `actif`, `paye` or `desactive`, as stored.
    stored: &'static str,
    payments: u64,
    collected: i64,
}

impl MLink {
    fn status(&self, now_ms: u64) -> &'static str {
        match (self.stored, self.expires_at_ms) {
            ("actif", Some(end)) if now_ms >= end => "expire",
            (stored, _) => stored,
        }
    }
}

/// The state a merchant actor holds, and the model beside it.
struct Shop {
    balances: Balances,
    seq: u64,
    links: Vec<Link>,
    payments: Vec<Payment>,
    model: Vec<MLink>,
    /// Per payment: the link index it went through, and whether it was counted.
    counted: Vec<(usize, bool)>,
    now_ms: u64,
    next_id: u64,
}

fn fail(what: impl std::fmt::Debug) -> TestCaseError {
    TestCaseError::fail(format!("{what:?}"))
}

impl Shop {
    fn new() -> Shop {
        Shop {
            balances: Balances::default(),
            seq: 0,
            links: Vec::new(),
            payments: Vec::new(),
            model: Vec::new(),
            counted: Vec::new(),
            now_ms: T0_MS,
            next_id: 0,
        }
    }

    fn ids(&mut self) -> impl FnMut(IdKind) -> String + '_ {
        move |kind| {
            self.next_id += 1;
            format!("{}_01JD{:022}", kind.prefix(), self.next_id)
        }
    }

    fn now(&self) -> Timestamp {
        Timestamp::from_unix_ms(self.now_ms)
    }

    fn decide(&mut self, current: Option<Record>, link: Option<Link>, cmd: &Command) -> Result<Decided, Rejection> {
        let (balances, seq, now) = (self.balances.clone(), self.seq + 1, self.now());
        let mut ids = self.ids();
        decide(&balances, seq, current.as_ref(), link.as_ref(), cmd, now, &mut ids)
    }

    fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Wait(s) => self.now_ms += s * 1000,
            Op::Create { amount, multiple, expires_in_s } => {
                let expires_at_ms = expires_in_s.map(|s| self.now_ms + s * 1000);
                let new = NewLink {
                    reference: None,
                    amount: Amount::positive(amount).map_err(fail)?,
                    currency: Currency::XOF,
                    description: Description::parse("Lien").map_err(fail)?,
                    providers: vec![ProviderCode::parse("mtn_momo").map_err(fail)?],
                    usage: if multiple { LinkUsage::Many } else { LinkUsage::Once },
                    expires_at: expires_at_ms.map(Timestamp::from_unix_ms),
                    return_url: None,
                    metadata: Metadata::empty(),
                    page_base: "https://pay.example.com/payer/".into(),
                };
                let decided = self.decide(None, None, &Command::CreateLink(new)).map_err(fail)?;
                let Record::Link(link) = self.commit(decided)? else { return Err(fail("a link was expected")) };
                prop_assert_eq!(link.status, LinkStatus::Active);
                prop_assert_eq!(&link.url, &format!("https://pay.example.com/payer/{}", link.id));
                self.links.push(link);
                self.model.push(MLink { amount, multiple, expires_at_ms, stored: "actif", ..MLink::default() });
            }
            Op::Deactivate(pick) => {
                let Some(index) = self.pick_link(pick) else { return Ok(()) };
                let link = self.links[index].clone();
                let cmd = Command::DeactivateLink { id: link.id.clone() };
                let expected_open = self.model[index].status(self.now_ms) == "actif";
                match self.decide(Some(Record::Link(link)), None, &cmd) {
                    Ok(decided) => {
                        prop_assert!(expected_open, "a closed link was deactivated");
                        let Record::Link(after) = self.commit(decided)? else { return Err(fail("a link")) };
                        prop_assert_eq!(after.status, LinkStatus::Deactivated);
                        self.links[index] = after;
                        self.model[index].stored = "desactive";
                    }
                    Err(Rejection::InvalidState(_)) => prop_assert!(!expected_open, "an open link was not deactivated"),
                    Err(other) => return Err(fail(other)),
                }
            }
            Op::Pay { link: pick, ghost } => {
                let Some(index) = self.pick_link(pick) else { return Ok(()) };
                let named =
                    if ghost { "lnk_01JD0000000000000000000000".to_owned() } else { self.links[index].id.clone() };
                let new = NewPayment {
                    reference: None,
                    amount: self.links[index].amount,
                    currency: Currency::XOF,
                    provider: ProviderCode::parse("mtn_momo").map_err(fail)?,
                    fee: FeeRule::new(100, Amount::ZERO).map_err(fail)?,
                    customer_phone: Phone::parse("+22997000055").map_err(fail)?,
                    customer_email: None,
                    customer_name: None,
                    description: None,
                    metadata: Metadata::empty(),
                    link: Some(named.clone()),
                };
                // The actor passes the link only when it finds one of that id.
                let found = (!ghost).then(|| self.links[index].clone());
                let cmd = Command::InitiatePayment(new);
                prop_assert!(matches!(cmd.target(), Target::NewPayment(None)));
                let status = self.model[index].status(self.now_ms);
                match self.decide(None, found, &cmd) {
                    Ok(decided) => {
                        prop_assert!(!ghost && status == "actif", "a payment through a {} link", status);
                        let Decided::Changed(decision) = &decided else { return Err(fail("a change")) };
                        prop_assert!(decision.linked.is_none(), "a start counts nothing");
                        let Record::Payment(p) = self.commit(decided)? else { return Err(fail("a payment")) };
                        prop_assert_eq!(link_of(&p.metadata), Some(named.as_str()));
                        self.payments.push(p);
                        self.counted.push((index, false));
                    }
                    Err(Rejection::NotFound) => prop_assert!(ghost, "an existing link was not found"),
                    Err(Rejection::LinkClosed(s)) => {
                        prop_assert!(!ghost && status != "actif");
                        prop_assert_eq!(s.as_str(), status);
                    }
                    Err(other) => return Err(fail(other)),
                }
            }
            Op::Notice { payment, kind } => {
                if self.payments.is_empty() {
                    return Ok(());
                }
                let n = payment % self.payments.len();
                let p = self.payments[n].clone();
                let notice = match kind {
                    0 => PaymentNotice::Processing,
                    1 => PaymentNotice::Confirmed,
                    2 => PaymentNotice::Declined { failure_code: "insufficient_funds".into() },
                    _ => PaymentNotice::Expired,
                };
                let (index, already) = self.counted[n];
                let link = self.links[index].clone();
                let cmd = Command::PaymentNotice { reference: p.reference.clone(), notice };
                let decided = self.decide(Some(Record::Payment(p.clone())), Some(link), &cmd).map_err(fail)?;
                let succeeded = matches!(&decided, Decided::Changed(d)
                    if matches!(&d.record, Record::Payment(after) if after.status == PaymentStatus::Succeeded));
                if let Decided::Changed(d) = &decided {
                    prop_assert_eq!(d.linked.is_some(), succeeded, "the link moves with its payment's success only");
                }
                if succeeded {
                    prop_assert!(!already, "a payment succeeded twice");
                    let m = &mut self.model[index];
                    m.payments += 1;
                    m.collected += m.amount;
                    if !m.multiple && m.stored == "actif" {
                        m.stored = "paye";
                    }
                    self.counted[n].1 = true;
                }
                if let Record::Payment(after) = self.commit(decided)? {
                    self.payments[n] = after;
                }
            }
        }
        self.check()
    }

    /// Applies a decision as the actor and the store would; answers the record.
    fn commit(&mut self, decided: Decided) -> Result<Record, TestCaseError> {
        match decided {
            Decided::Unchanged(record) => Ok(record),
            Decided::Changed(d) => {
                prop_assert_eq!(d.journal.seq, self.seq + 1);
                if matches!(d.record, Record::Link(_)) {
                    prop_assert!(d.journal.entries.is_empty() && d.outbox.is_empty(), "a link moves no money");
                    prop_assert_eq!(&d.balances, &self.balances);
                }
                self.seq = d.journal.seq;
                self.balances = d.balances.clone();
                if let Some(linked) = &d.linked {
                    let slot = self.links.iter_mut().find(|l| l.id == linked.id).ok_or_else(|| fail("unknown link"))?;
                    *slot = linked.clone();
                }
                Ok(d.record)
            }
        }
    }

    fn pick_link(&self, pick: usize) -> Option<usize> {
        (!self.links.is_empty()).then(|| pick % self.links.len())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        for (link, model) in self.links.iter().zip(&self.model) {
            prop_assert_eq!(link.payments, model.payments, "nombre_paiements of {}", link.id);
            prop_assert_eq!(link.collected.minor(), model.collected, "montant_encaisse of {}", link.id);
            prop_assert_eq!(link.status.as_str(), model.stored, "stored status of {}", link.id);
            prop_assert_eq!(link.status_at(self.now()).as_str(), model.status(self.now_ms));
            prop_assert!(link.status != LinkStatus::Expired, "expire is never stored");
        }
        let counted: BTreeMap<usize, u64> =
            self.counted.iter().filter(|(_, c)| *c).fold(BTreeMap::new(), |mut m, (i, _)| {
                *m.entry(*i).or_insert(0) += 1;
                m
            });
        for (index, model) in self.model.iter().enumerate() {
            prop_assert_eq!(counted.get(&index).copied().unwrap_or(0), model.payments);
        }
        Ok(())
    }
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut shop = Shop::new();
    for op in ops {
        shop.step(*op)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn links_match_the_reference_model(ops in vec(op(), 1..=120)) {
        run(&ops)?;
    }
}

/// The sequences reach what the property is about: links paid, closed links refusing payments, successes
/// counted on links already closed. A fixed sequence, so the property above is not vacuous by construction.
#[test]
fn a_late_success_on_a_closed_link_still_counts() {
    let ops = [
        Op::Create { amount: 1_000, multiple: false, expires_in_s: Some(10) },
        Op::Pay { link: 0, ghost: false },
        Op::Pay { link: 0, ghost: false },
        Op::Notice { payment: 0, kind: 1 },
        Op::Pay { link: 0, ghost: false },
        Op::Notice { payment: 1, kind: 1 },
        Op::Wait(20),
        Op::Pay { link: 0, ghost: false },
        Op::Deactivate(0),
    ];
    let mut shop = Shop::new();
    for op in ops {
        shop.step(op).unwrap_or_else(|e| panic!("{op:?}: {e}"));
    }
    assert_eq!(shop.payments.len(), 2, "the third payment was refused: the link was paid");
    assert_eq!((shop.links[0].payments, shop.links[0].collected.minor()), (2, 2_000), "both successes counted");
    assert_eq!(shop.links[0].status, LinkStatus::Paid);
}

/// A success on a payment that names a link of another currency (which no payment through the link can be) is
/// credited, and the link is not counted.
#[test]
fn a_payment_of_another_currency_than_its_link_is_credited_and_not_counted() {
    let mut shop = Shop::new();
    shop.step(Op::Create { amount: 1_000, multiple: true, expires_in_s: None }).unwrap();
    shop.step(Op::Pay { link: 0, ghost: false }).unwrap();
    let link = shop.links[0].clone();
    let mut payment = shop.payments[0].clone();
    payment.currency = Currency::EUR;
    let cmd = Command::PaymentNotice { reference: payment.reference.clone(), notice: PaymentNotice::Confirmed };
    let decided = shop.decide(Some(Record::Payment(payment)), Some(link), &cmd).unwrap();
    let Decided::Changed(d) = decided else { panic!("the success is a change") };
    assert!(matches!(&d.record, Record::Payment(p) if p.status == PaymentStatus::Succeeded));
    assert!(d.linked.is_none(), "a link of another currency is not counted");
    assert!(d.balances.get(Currency::EUR).available > 0, "the merchant is credited");
}
