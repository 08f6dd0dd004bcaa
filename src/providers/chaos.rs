//! Sandbox chaos: the simulator misbehaving the way real providers do, so merchants (and our tests) can see
//! that a payment still ends in the right status and is credited exactly once.
//!
//! A simulated story is a list of [`Step`]s: at `at_ms` after the request, the provider's own status (what a
//! status query answers) becomes `status`, and `notices` copies of a notice saying so are sent. [`plan`] turns
//! a story into a [`Plan`] of timed events, changing only the *notices*, never the provider's status:
//!
//! - `duplicate`: every notice is sent three times, the first two at the same moment (concurrent requests);
//! - `late`: every notice leaves [`late_ms`] after the status it reports changed;
//! - `reorder`: the notices are held until the last one is due and then sent last-first, so the final answer
//!   comes before "processing"; a story without a "processing" notice (refunds, payouts) gets a stale one after
//!   its final notice;
//! - `flap`: while the status is still "processing", a notice claiming the opposite of the final answer
//!   ("failed" before a success, "succeeded" before a decline) arrives first;
//! - `lost`: no notice arrives at all; the provider's status still changes on time, and the simulator keeps
//!   answering status queries for a while after ([`sandbox`](super::sandbox) says how long). Only Caisse's own
//!   status queries settle such a story: the TTL sweep for a payment, the reconciliation for a refund or a
//!   payout. `lost` is not part of `all`, which keeps every story's notices: it must be named.
//!
//! Why the outcome cannot change: Caisse never acts on what a notice says. It asks the provider's status for
//! every notice and applies that, and the engine treats a status it is already past as a no-op
//! answered 200 (so the simulator does not retry it). A notice that contradicts the provider is therefore
//! harmless, a duplicate or stale one changes nothing, and a late one finds its work already done or does it.
//! What a merchant sees is what real providers cause: a payment that skips `en_cours`, or stays `initie` a
//! while longer; never a double credit, never a wrong final status.
//!
//! The server-wide modes come from the `sandbox.chaos` setting (`CAISSE_SANDBOX_CHAOS`); a payment or payout
//! may choose its own with the metadata key [`METADATA_KEY`] (a refund follows its payment's), which wins over
//! the setting, `off` included. Only the simulator reads that key, so it is plain metadata to a real provider.

use super::ProviderStatus;
pub use crate::sandbox_modes::{Chaos, Mode, METADATA_KEY};

/// Every notice is sent this many times under `duplicate`.
const DUPLICATE_COPIES: u32 = 3;
/// Of which this many leave at the same moment.
const DUPLICATE_BURST: u32 = 2;
/// The shortest hold under `late`, so that a very fast sandbox (`delay_ms` near 0) still shows it.
const LATE_MS_MIN: u64 = 1_000;
/// The failure code a `flap` notice claims; never applied, since the provider's status disagrees.
pub const FLAP_FAILURE_CODE: &str = "sandbox_flap";

/// How long `late` holds every notice: five times the sandbox delay, at least [`LATE_MS_MIN`].
pub fn late_ms(delay_ms: u64) -> u64 {
    delay_ms.saturating_mul(5).max(LATE_MS_MIN)
}

/// One step of a simulated story, `at_ms` after the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub at_ms: u64,
    pub status: ProviderStatus,
    /// Notices reporting this status (0: the status changes silently, as when a provider never answers).
    pub notices: u32,
}

impl Step {
    pub fn new(at_ms: u64, status: ProviderStatus, notices: u32) -> Step {
        Step { at_ms, status, notices }
    }
}

/// Copies of one notice: the first `burst` leave together, the rest one after the other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub status: ProviderStatus,
    pub copies: u32,
    pub burst: u32,
}

/// What happens at one moment of a story.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The provider's own status (what a status query answers) becomes this.
    Status(ProviderStatus),
    /// These notices are sent, batch after batch, in this order.
    Send(Vec<Batch>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub at_ms: u64,
    pub action: Action,
}

/// A story's timed events, in the order to run them: by time, a status change before a send of the same
/// moment, so a notice never reports a status the provider would not confirm yet (unless chaos means it to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub events: Vec<Event>,
}

impl Plan {
    /// Notices the plan sends, all copies counted.
    pub fn notice_count(&self) -> u64 {
        self.events
            .iter()
            .map(|e| match &e.action {
                Action::Send(batches) => batches.iter().map(|b| u64::from(b.copies)).sum(),
                Action::Status(_) => 0,
            })
            .sum()
    }
}

/// The opposite of a final answer, for `flap`; `None` for a status that is not final.
fn opposite(status: &ProviderStatus) -> Option<ProviderStatus> {
    match status {
        ProviderStatus::Succeeded => Some(ProviderStatus::Failed { code: FLAP_FAILURE_CODE.into() }),
        ProviderStatus::Failed { .. } | ProviderStatus::Expired => Some(ProviderStatus::Succeeded),
        ProviderStatus::Pending | ProviderStatus::Processing => None,
    }
}

/// Turns a story into its timed events under `chaos`. Status changes keep their times whatever the chaos;
/// only the notices move, multiply or lie (see the module documentation).
pub fn plan(steps: &[Step], chaos: Chaos, late_ms: u64) -> Plan {
    let mut sends: Vec<(u64, Vec<Batch>)> = steps
        .iter()
        .filter(|s| s.notices > 0)
        .map(|s| (s.at_ms, vec![Batch { status: s.status.clone(), copies: s.notices, burst: 1 }]))
        .collect();
    if chaos.has(Mode::Flap) {
        // The last final answer that is notified gets a contradicting notice halfway since the previous step,
        // while the provider still says "processing" (or has not started).
        let last_final = steps.iter().rposition(|s| s.notices > 0 && opposite(&s.status).is_some());
        if let Some((i, step)) = last_final.and_then(|i| steps.get(i).map(|s| (i, s))) {
            let from = i.checked_sub(1).and_then(|p| steps.get(p)).map_or(0, |s| s.at_ms);
            let at = from + step.at_ms.saturating_sub(from) / 2;
            if let Some(lie) = opposite(&step.status) {
                sends.push((at, vec![Batch { status: lie, copies: 1, burst: 1 }]));
                sends.sort_by_key(|(at, _)| *at);
            }
        }
    }
    if chaos.has(Mode::Reorder) && !sends.is_empty() {
        let last = sends.iter().map(|(at, _)| *at).max().unwrap_or(0);
        let mut batches: Vec<Batch> = sends.drain(..).flat_map(|(_, b)| b).collect();
        if !batches.iter().any(|b| b.status == ProviderStatus::Processing) {
            batches.insert(0, Batch { status: ProviderStatus::Processing, copies: 1, burst: 1 });
        }
        batches.reverse();
        sends.push((last, batches));
    }
    if chaos.has(Mode::Late) {
        for (at, _) in &mut sends {
            *at = at.saturating_add(late_ms);
        }
    }
    if chaos.has(Mode::Duplicate) {
        for batch in sends.iter_mut().flat_map(|(_, b)| b.iter_mut()) {
            batch.copies = batch.copies.saturating_mul(DUPLICATE_COPIES);
            batch.burst = DUPLICATE_BURST;
        }
    }
    if chaos.has(Mode::Lost) {
        sends.clear();
    }
    let mut events: Vec<Event> =
        steps.iter().map(|s| Event { at_ms: s.at_ms, action: Action::Status(s.status.clone()) }).collect();
    events.extend(sends.into_iter().map(|(at_ms, batches)| Event { at_ms, action: Action::Send(batches) }));
    // Stable: among events of one moment, status changes (pushed first) stay before sends.
    events.sort_by_key(|e| (e.at_ms, matches!(e.action, Action::Send(_))));
    Plan { events }
}

#[cfg(test)]
mod tests {
    use caisse_engine::domain::Metadata;

    use super::*;

    fn failed() -> ProviderStatus {
        ProviderStatus::Failed { code: "insufficient_funds".into() }
    }

    /// A payment that succeeds: "processing" at 25 ms, "succeeded" at 100 ms, one notice each.
    fn success() -> Vec<Step> {
        vec![Step::new(25, ProviderStatus::Processing, 1), Step::new(100, ProviderStatus::Succeeded, 1)]
    }

    /// The notices of a plan, in sending order, with their times.
    fn sends(plan: &Plan) -> Vec<(u64, ProviderStatus, u32, u32)> {
        plan.events
            .iter()
            .flat_map(|e| match &e.action {
                Action::Send(batches) => {
                    batches.iter().map(|b| (e.at_ms, b.status.clone(), b.copies, b.burst)).collect::<Vec<_>>()
                }
                Action::Status(_) => Vec::new(),
            })
            .collect()
    }

    fn statuses(plan: &Plan) -> Vec<(u64, ProviderStatus)> {
        plan.events
            .iter()
            .filter_map(|e| match &e.action {
                Action::Status(s) => Some((e.at_ms, s.clone())),
                Action::Send(_) => None,
            })
            .collect()
    }

    #[test]
    fn parse_accepts_off_all_and_lists_and_names_what_is_allowed() {
        assert_eq!(Chaos::parse("").unwrap(), Chaos::OFF);
        assert_eq!(Chaos::parse("off").unwrap(), Chaos::OFF);
        assert_eq!(Chaos::parse("all").unwrap(), Chaos::ALL);
        let two = Chaos::parse(" late , duplicate ").unwrap();
        assert!(two.has(Mode::Late) && two.has(Mode::Duplicate) && !two.has(Mode::Reorder));
        assert_eq!(two.to_string(), "duplicate,late");
        assert_eq!(Chaos::parse("duplicate,late,reorder,flap").unwrap(), Chaos::ALL);
        let err = Chaos::parse("late,sometimes").unwrap_err();
        assert!(err.contains("sometimes") && err.contains("reorder"), "{err}");
        assert!(Chaos::parse("LATE").is_err(), "names are lower case, like every other setting value");
    }

    #[test]
    fn lost_is_named_not_part_of_all_and_sends_nothing_while_the_status_still_moves() {
        let lost = Chaos::parse("lost").unwrap();
        assert_eq!(lost, Chaos::only(Mode::Lost));
        assert!(!Chaos::ALL.has(Mode::Lost), "`all` keeps every notice");
        assert_eq!(Chaos::parse("all,lost").unwrap().to_string(), "duplicate,late,reorder,flap,lost");
        for chaos in [lost, Chaos::parse("all,lost").unwrap()] {
            let plan = plan(&success(), chaos, 1000);
            assert_eq!(plan.notice_count(), 0, "{chaos}");
            assert_eq!(statuses(&plan), statuses(&super::plan(&success(), Chaos::OFF, 1000)), "{chaos}");
        }
    }

    #[test]
    fn metadata_wins_over_the_server_setting_and_a_bad_value_falls_back() {
        let meta = |v: &str| Metadata::new([(METADATA_KEY.to_owned(), v.to_owned())].into()).unwrap();
        assert_eq!(Chaos::ALL.for_metadata(&Metadata::empty(), "tx"), Chaos::ALL);
        assert_eq!(Chaos::ALL.for_metadata(&meta("off"), "tx"), Chaos::OFF);
        assert_eq!(Chaos::OFF.for_metadata(&meta("flap"), "tx"), Chaos::only(Mode::Flap));
        assert_eq!(Chaos::only(Mode::Late).for_metadata(&meta("bogus"), "tx"), Chaos::only(Mode::Late));
    }

    #[test]
    fn off_sends_each_notice_when_its_status_changes() {
        let plan = plan(&success(), Chaos::OFF, 1000);
        assert_eq!(
            plan.events,
            vec![
                Event { at_ms: 25, action: Action::Status(ProviderStatus::Processing) },
                Event {
                    at_ms: 25,
                    action: Action::Send(vec![Batch { status: ProviderStatus::Processing, copies: 1, burst: 1 }])
                },
                Event { at_ms: 100, action: Action::Status(ProviderStatus::Succeeded) },
                Event {
                    at_ms: 100,
                    action: Action::Send(vec![Batch { status: ProviderStatus::Succeeded, copies: 1, burst: 1 }])
                },
            ]
        );
        assert_eq!(plan.notice_count(), 2);
    }

    #[test]
    fn chaos_never_moves_the_providers_own_status() {
        let steps = success();
        let honest = statuses(&plan(&steps, Chaos::OFF, 1000));
        for text in ["duplicate", "late", "reorder", "flap", "all"] {
            let chaos = Chaos::parse(text).unwrap();
            assert_eq!(statuses(&plan(&steps, chaos, 1000)), honest, "{text}");
        }
    }

    #[test]
    fn duplicate_triples_every_notice_two_at_once() {
        let mut steps = success();
        steps[1].notices = 3; // the `03` ending already repeats its final notice
        let plan = plan(&steps, Chaos::only(Mode::Duplicate), 1000);
        assert_eq!(sends(&plan), vec![(25, ProviderStatus::Processing, 3, 2), (100, ProviderStatus::Succeeded, 9, 2)]);
    }

    #[test]
    fn late_holds_every_notice_after_its_status_changed() {
        let plan = plan(&success(), Chaos::only(Mode::Late), 1000);
        assert_eq!(
            sends(&plan),
            vec![(1025, ProviderStatus::Processing, 1, 1), (1100, ProviderStatus::Succeeded, 1, 1)]
        );
        assert_eq!(late_ms(100), 1000);
        assert_eq!(late_ms(2000), 10_000);
    }

    #[test]
    fn reorder_sends_the_final_answer_first() {
        let plan = plan(&success(), Chaos::only(Mode::Reorder), 1000);
        assert_eq!(sends(&plan), vec![(100, ProviderStatus::Succeeded, 1, 1), (100, ProviderStatus::Processing, 1, 1)]);
        // A payout has no "processing" notice of its own: a stale one follows the final answer.
        let payout = vec![Step::new(100, failed(), 1)];
        let plan = super::plan(&payout, Chaos::only(Mode::Reorder), 1000);
        assert_eq!(sends(&plan), vec![(100, failed(), 1, 1), (100, ProviderStatus::Processing, 1, 1)]);
    }

    #[test]
    fn flap_contradicts_the_final_answer_while_the_provider_still_says_processing() {
        let plan = plan(&success(), Chaos::only(Mode::Flap), 1000);
        let lie = ProviderStatus::Failed { code: FLAP_FAILURE_CODE.into() };
        assert_eq!(
            sends(&plan),
            vec![(25, ProviderStatus::Processing, 1, 1), (62, lie, 1, 1), (100, ProviderStatus::Succeeded, 1, 1)]
        );
        // Before a decline, the lie is a success; before any status, a payout's lie is sent at half its delay.
        let declined = vec![Step::new(25, ProviderStatus::Processing, 1), Step::new(100, failed(), 1)];
        assert!(sends(&super::plan(&declined, Chaos::only(Mode::Flap), 1000)).contains(&(
            62,
            ProviderStatus::Succeeded,
            1,
            1
        )));
        let payout = vec![Step::new(100, ProviderStatus::Succeeded, 1)];
        assert_eq!(sends(&super::plan(&payout, Chaos::only(Mode::Flap), 1000))[0].0, 50);
        // A story with no final notice (the `02` ending) has nothing to contradict.
        let silent = vec![Step::new(25, ProviderStatus::Processing, 1), Step::new(5000, ProviderStatus::Processing, 0)];
        assert_eq!(super::plan(&silent, Chaos::only(Mode::Flap), 1000).notice_count(), 1);
    }

    #[test]
    fn all_modes_together() {
        let plan = plan(&success(), Chaos::ALL, 1000);
        let lie = ProviderStatus::Failed { code: FLAP_FAILURE_CODE.into() };
        assert_eq!(
            sends(&plan),
            vec![(1100, ProviderStatus::Succeeded, 3, 2), (1100, lie, 3, 2), (1100, ProviderStatus::Processing, 3, 2)]
        );
        assert_eq!(plan.notice_count(), 9);
    }
}
