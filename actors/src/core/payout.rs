//! The payout transitions: creating a payout, which reserves its amount, and the provider's answer.

use super::{
    moved, split_fee, Ctx, Decided, Decision, IdSource, NewPayout, NewTransaction, PayoutOutcome, Record, Rejection,
};
use crate::domain::ids::IdKind;
use crate::domain::ledger::{postings, Movement};
use crate::domain::records::{sibling_transaction_id, Payout, TransactionType, WebhookData};
use crate::domain::status::{transition, PayoutStatus, Status, Trigger};

impl Ctx<'_> {
    pub(super) fn create_payout(&self, new: &NewPayout, ids: IdSource<'_>) -> Result<Decided, Rejection> {
        let (frais, montant_net) = split_fee(new.montant, &new.fee)?;
        let rule = moved(transition(None, Trigger::PayoutRequested)?)
            .ok_or(Rejection::Impossible("the rules table has no first move on PayoutRequested"))?;
        let Status::Payout(statut) = rule.to else {
            return Err(Rejection::Impossible("a payout rule leads to another kind's status"));
        };
        let entries = postings(rule.effect, Movement { devise: new.devise, montant: new.montant, frais, montant_net })
            .map_err(Rejection::Invariant)?;
        let balances = self.balances_after(&entries, new.devise, new.montant)?;
        let id = ids(IdKind::Payout);
        let payout = Payout {
            transaction_id: sibling_transaction_id(&id),
            id,
            statut,
            montant: new.montant,
            devise: new.devise,
            frais,
            montant_net,
            fournisseur: new.fournisseur.clone(),
            beneficiaire_telephone: new.beneficiaire_telephone.clone(),
            beneficiaire_nom: new.beneficiaire_nom.clone(),
            description: new.description.clone(),
            metadata: new.metadata.clone(),
            created_at: self.now,
            updated_at: self.now,
            processed_at: None,
            motif_rejet: None,
        };
        let created = NewTransaction {
            kind: TransactionType::Retrait,
            transaction_id: payout.transaction_id.clone(),
            reference: payout.id.clone(),
            owner: payout.id.clone(),
        };
        Ok(Decided::Changed(Box::new(Decision {
            journal: self.journal(rule.on, &payout.id, statut.as_str(), new.devise, entries),
            record: Record::Payout(payout),
            balances,
            created: Some(created),
            outbox: Vec::new(),
        })))
    }

    pub(super) fn payout_notice(
        &self,
        o: &Payout,
        outcome: &PayoutOutcome,
        ids: IdSource<'_>,
    ) -> Result<Decided, Rejection> {
        let trigger = match outcome {
            PayoutOutcome::Sent => Trigger::PayoutSent,
            PayoutOutcome::Refused { .. } => Trigger::PayoutRefused,
        };
        let Some(rule) = moved(transition(Some(Status::Payout(o.statut)), trigger)?) else {
            return Ok(Decided::Unchanged(Record::Payout(o.clone())));
        };
        let Status::Payout(statut) = rule.to else {
            return Err(Rejection::Impossible("a payout rule leads to another kind's status"));
        };
        let mut next = o.clone();
        next.statut = statut;
        next.updated_at = self.now;
        match outcome {
            PayoutOutcome::Sent if statut == PayoutStatus::Traite => next.processed_at = Some(self.now),
            PayoutOutcome::Refused { motif } => next.motif_rejet = Some(motif.clone()),
            PayoutOutcome::Sent => {}
        }
        let m = Movement { devise: o.devise, montant: o.montant, frais: o.frais, montant_net: o.montant_net };
        let entries = postings(rule.effect, m).map_err(Rejection::Invariant)?;
        let balances = self.balances_after(&entries, o.devise, o.montant)?;
        let outbox = self.outbox(rule.event, WebhookData::of_payout(&next), ids)?;
        Ok(Decided::Changed(Box::new(Decision {
            journal: self.journal(trigger, &next.id, statut.as_str(), o.devise, entries),
            record: Record::Payout(next),
            balances,
            created: None,
            outbox,
        })))
    }
}
