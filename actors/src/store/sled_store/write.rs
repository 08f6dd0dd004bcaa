//! What the store writes: each write ([`Change`], merchant, notification state) turned into the sled
//! operations the group-commit writer applies as one batch.

use super::SledStore;
use crate::core::Record;
use crate::domain::records::{DeliveryState, Merchant, Notification, TransactionType};
use crate::store::op::Op;
use crate::store::{Change, StoreError, Ticket};

// The layout's trees, keys and encodings are this file's vocabulary.
use crate::store::layout::*;

impl SledStore {
    pub(super) fn change_ops(change: &Change) -> Result<(Vec<Op>, Vec<Notification>), StoreError> {
        let m = &change.merchant;
        let mut ops = Vec::with_capacity(8 + 3 * change.outbox.len());
        let mut created = Vec::with_capacity(change.outbox.len());
        let event = encode(&change.journal)?;
        ops.push(Op::Insert(JOURNAL, journal_key(m, change.journal.seq), journal_run([event.as_slice()])?));
        match &change.record {
            Record::Payment(p) => ops.push(Op::Insert(PAYMENTS, mkey(m, p.reference.as_str().as_bytes()), encode(p)?)),
            Record::Payout(o) => ops.push(Op::Insert(PAYOUTS, mkey(m, o.id.as_bytes()), encode(o)?)),
        }
        if let Some(created) = &change.created {
            let ulid = created.transaction_id.strip_prefix("tx_").unwrap_or(&created.transaction_id);
            let ptr = pointer(created.kind, &created.owner, &created.reference);
            ops.push(Op::Insert(TX_INDEX, mkey(m, ulid.as_bytes()), ptr.clone()));
            // A payment is found by its record's key (see `locate`), so `refs` only says where refunds and
            // payouts are: one insert fewer on the path every payment takes.
            if created.kind != TransactionType::Payment {
                ops.push(Op::Insert(REFS, mkey(m, created.reference.as_bytes()), ptr.clone()));
            }
            let mut owner = m.as_bytes().to_vec();
            owner.extend_from_slice(&ptr);
            ops.push(Op::Insert(TX_OWNER, created.transaction_id.as_bytes().to_vec(), owner));
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
            // The body is kept inline: most notifications are delivered before their overlay layer reaches
            // sled, so the record is written there once, body and final state together (see `layout`).
            ops.push(Op::Insert(NOTIFICATIONS, mkey(m, item.id.as_bytes()), encode(&notification)?));
            ops.push(Op::Insert(OUTBOX_DUE, due_key(change.journal.at, &item.id), m.as_bytes().to_vec()));
            created.push(notification);
        }
        pending_ops(m, &change.record, &mut ops);
        if let Some((key, record)) = &change.idempotency {
            ops.push(Op::Insert(IDEMPOTENCY, mkey(m, key.as_str().as_bytes()), encode(record)?));
        }
        if let Some(snapshot) = &change.snapshot {
            ops.push(Op::Insert(SNAPSHOTS, m.as_bytes().to_vec(), encode(snapshot)?));
        }
        Ok((ops, created))
    }

    /// [`Accounts::put_merchant`](crate::store::Accounts::put_merchant): the merchant and its two lookup keys,
    /// dropping the key it replaces.
    pub(super) fn submit_merchant(
        &self,
        merchant: Merchant,
        previous_key: Option<String>,
    ) -> Result<Ticket, StoreError> {
        let email = merchant.email.to_lowercase();
        if let Some(owner) = self.raw(MERCHANT_EMAILS, email.as_bytes())? {
            if owner.as_ref() != merchant.id.as_bytes() {
                return Err(StoreError::Conflict(format!("a merchant with e-mail {email} already exists")));
            }
        }
        let mut ops = vec![
            Op::Insert(MERCHANTS, merchant.id.as_bytes().to_vec(), encode(&merchant)?),
            Op::Insert(MERCHANT_KEYS, key_hash(&merchant.secret_key), merchant.id.as_bytes().to_vec()),
            Op::Insert(MERCHANT_EMAILS, email.into_bytes(), merchant.id.as_bytes().to_vec()),
        ];
        if let Some(old) = previous_key.filter(|old| *old != merchant.secret_key) {
            ops.push(Op::Remove(MERCHANT_KEYS, key_hash(&old)));
        }
        self.writer.submit(ops, None, Vec::new())
    }

    /// [`Outbox::save_notification`](crate::store::Outbox::save_notification): the delivery state, and its entry
    /// in the due index moved.
    pub(super) fn submit_notification(
        &self,
        before: &Notification,
        after: &Notification,
    ) -> Result<Ticket, StoreError> {
        let key = mkey(&after.merchant, after.id.as_bytes());
        let mut ops = vec![Op::Insert(NOTIFICATIONS, key, encode(after)?)];
        if let Some(at) = before.next_attempt_at {
            ops.push(Op::Remove(OUTBOX_DUE, due_key(at, &before.id)));
        }
        if let Some(at) = after.next_attempt_at {
            ops.push(Op::Insert(OUTBOX_DUE, due_key(at, &after.id), after.merchant.as_bytes().to_vec()));
        }
        self.writer.submit(ops, None, Vec::new())
    }
}
