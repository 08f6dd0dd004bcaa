//! What a [`Change`] writes: the operations the engine's group-commit writer applies as one batch.

use super::KvStore;
use crate::core::Record;
use crate::domain::ids::MerchantId;
use crate::domain::links::{link_of, Link};
use crate::domain::records::{DeliveryState, Notification, TransactionType};
use crate::store::kv::Kv;
use crate::store::op::Op;
use crate::store::{Change, StoreError};

// The layout's trees, keys and encodings are this file's vocabulary.
use crate::store::layout::*;

/// A link and what finds it. Its owner and reference entries are rewritten with each change of the link: links
/// change a few times in their life, and an absolute write keeps the log's replay free of conditions.
fn link_ops(m: &MerchantId, link: &Link, ops: &mut Vec<Op>) -> Result<(), StoreError> {
    ops.push(Op::Insert(LINKS, mkey(m, link.id.as_bytes()), encode(link)?));
    ops.push(Op::Insert(LINK_OWNERS, link.id.as_bytes().to_vec(), m.as_bytes().to_vec()));
    if let Some(reference) = &link.reference {
        ops.push(Op::Insert(LINK_REFS, mkey(m, reference.as_str().as_bytes()), link.id.as_bytes().to_vec()));
    }
    Ok(())
}

impl<K: Kv> KvStore<K> {
    pub(super) fn change_ops(change: &Change) -> Result<(Vec<Op>, Vec<Notification>), StoreError> {
        let m = &change.merchant;
        let mut ops = Vec::with_capacity(8 + 3 * change.outbox.len());
        let mut created = Vec::with_capacity(change.outbox.len());
        let event = encode(&change.journal)?;
        // The keys a change makes are written as `Op::Create`, which an engine may write without looking for a
        // value there: its event's sequence number; a new transaction's record, index entry, owner, references,
        // route, pending entry and place in its link's list; a new notification and its due entry.
        ops.push(Op::Create(JOURNAL, journal_key(m, change.journal.seq), journal_run([event.as_slice()])?));
        let made = change.created.as_ref().map(|c| c.kind);
        match &change.record {
            Record::Payment(p) => {
                let key = mkey(m, p.reference.as_str().as_bytes());
                let value = encode(p)?;
                ops.push(match made {
                    Some(TransactionType::Payment) => Op::Create(PAYMENTS, key, value),
                    _ => Op::Insert(PAYMENTS, key, value),
                });
            }
            Record::Payout(o) => {
                let (key, value) = (mkey(m, o.id.as_bytes()), encode(o)?);
                ops.push(match made {
                    Some(TransactionType::Payout) => Op::Create(PAYOUTS, key, value),
                    _ => Op::Insert(PAYOUTS, key, value),
                });
            }
            Record::Link(l) => link_ops(m, l, &mut ops)?,
        }
        if let Some(link) = &change.linked {
            link_ops(m, link, &mut ops)?;
        }
        // A payment made through a link joins the link's list when it is created.
        if let (Record::Payment(p), Some(created)) = (&change.record, &change.created) {
            if let Some(link) = link_of(&p.metadata).filter(|_| created.kind == TransactionType::Payment) {
                let key = link_payment_key(m, link, &created.transaction_id);
                ops.push(Op::Create(LINK_PAYMENTS, key, p.reference.as_str().as_bytes().to_vec()));
            }
        }
        if let Some(created) = &change.created {
            let ulid = created.transaction_id.strip_prefix("tx_").unwrap_or(&created.transaction_id);
            let ptr = pointer(created.kind, &created.owner, &created.reference);
            ops.push(Op::Create(TX_INDEX, mkey(m, ulid.as_bytes()), ptr.clone()));
            // A payment is found by its record's key (see `locate`), so `refs` only says where refunds and
            // payouts are: one insert fewer on the path every payment takes.
            if created.kind != TransactionType::Payment {
                ops.push(Op::Create(REFS, mkey(m, created.reference.as_bytes()), ptr.clone()));
            }
            // The merchant's own reference for a payout finds it too, and keeps the reference taken (a
            // payout naming a reference taken is refused, so the key is new).
            if let Some(alias) = &created.alias {
                ops.push(Op::Create(REFS, mkey(m, alias.as_bytes()), pointer(created.kind, &created.owner, alias)));
            }
            let mut owner = m.as_bytes().to_vec();
            owner.extend_from_slice(&ptr);
            ops.push(Op::Create(TX_OWNER, created.transaction_id.as_bytes().to_vec(), owner));
        }
        for item in &change.outbox {
            let notification = Notification {
                id: item.id.clone(),
                merchant: m.clone(),
                event: item.event,
                reference: item.reference.clone(),
                body: item.body.clone(),
                created_at: change.journal.at,
                state: DeliveryState::Pending,
                next_attempt_at: Some(change.journal.at),
                attempts: Vec::new(),
                chain_attempts: 0,
                total_attempts: 0,
            };
            // The body is kept inline, so a notification is one key (see `layout`).
            ops.push(Op::Create(NOTIFICATIONS, mkey(m, item.id.as_bytes()), encode(&notification)?));
            ops.push(Op::Create(OUTBOX_DUE, due_key(change.journal.at, &item.id), m.as_bytes().to_vec()));
            created.push(notification);
        }
        pending_ops(m, &change.record, made, &mut ops);
        if let Some((key, record)) = &change.idempotency {
            ops.push(Op::Insert(IDEMPOTENCY, mkey(m, key.as_str().as_bytes()), encode(record)?));
            ops.push(Op::Insert(
                IDEMPOTENCY_TIMES,
                idempotency_time_key(m, record.created_at, key.as_str()),
                Vec::new(),
            ));
        }
        if let Some((transaction_id, route)) = &change.route {
            // Only a created transaction has a route to fix (keyed by its new id).
            ops.push(Op::Create(ROUTES, transaction_id.as_bytes().to_vec(), encode(route)?));
        }
        if let Some((transaction_id, reference)) = &change.provider_reference {
            ops.push(Op::Insert(PROVIDER_REFERENCES, transaction_id.as_bytes().to_vec(), encode(reference)?));
        }
        if let Some(snapshot) = &change.snapshot {
            ops.push(Op::Insert(SNAPSHOTS, m.as_bytes().to_vec(), encode(snapshot)?));
        }
        Ok((ops, created))
    }
}
