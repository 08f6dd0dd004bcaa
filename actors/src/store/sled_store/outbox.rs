//! Reading webhook notifications: a notification with its body, a merchant's notification list, and the scan
//! of the due index that feeds the dispatcher.

use std::ops::Bound;

use super::{SledStore, MAX_SCAN};
use crate::domain::ids::{MerchantId, MERCHANT_ID_LEN};
use crate::domain::records::{DeliveryState, Notification};
use crate::domain::time::Timestamp;
use crate::store::writer::Op;
use crate::store::{Page, StoreError};

// The layout's trees, keys and encodings are this file's vocabulary.
use crate::store::layout::*;

impl SledStore {
    /// A notification with its body: inline in its record, or, for one stored while bodies lived apart, in
    /// `outbox_body`.
    pub(super) fn load_notification(
        &self,
        merchant: &MerchantId,
        id: &[u8],
    ) -> Result<Option<Notification>, StoreError> {
        match self.stored_notification(merchant, id)? {
            Some(n) => self.with_body(n).map(Some),
            None => Ok(None),
        }
    }

    /// The notification's record as stored, its body possibly apart: in the current layout, or in `outbox` when
    /// the merchant's entry is empty (written by an earlier version, see `layout`).
    pub(super) fn stored_notification(
        &self,
        merchant: &MerchantId,
        id: &[u8],
    ) -> Result<Option<Notification>, StoreError> {
        match self.raw(OUTBOX_BY_MERCHANT, &mkey(merchant, id))? {
            None => Ok(None),
            Some(value) => self.entry_notification(id, &value),
        }
    }

    /// Decodes an entry of `outbox_by_merchant`: the record itself, or empty for one kept in `outbox`.
    fn entry_notification(&self, id: &[u8], value: &[u8]) -> Result<Option<Notification>, StoreError> {
        if value.is_empty() {
            self.get::<Notification>(OUTBOX, id)
        } else {
            decode(TREE_NAMES[OUTBOX_BY_MERCHANT], value).map(Some)
        }
    }

    fn with_body(&self, mut n: Notification) -> Result<Notification, StoreError> {
        if n.body.is_empty() {
            let bytes = self
                .raw(OUTBOX_BODY, n.id.as_bytes())?
                .ok_or_else(|| StoreError::Corrupt(format!("notification {} has no body", n.id)))?;
            n.body = String::from_utf8(bytes.to_vec())
                .map_err(|_| StoreError::Corrupt(format!("notification {} body is not UTF-8", n.id)))?;
        }
        Ok(n)
    }

    /// [`Store::notifications`](crate::store::Store::notifications): the merchant's outbox index, newest first.
    pub(super) fn notifications_page(
        &self,
        merchant: &MerchantId,
        cursor: Option<&str>,
        limit: usize,
        keep: &mut dyn FnMut(&Notification) -> bool,
    ) -> Result<Page<Notification>, StoreError> {
        let start = mkey(merchant, b"");
        let end = match cursor {
            Some(c) => mkey(merchant, c.as_bytes()),
            None => mkey(merchant, &[0xff]),
        };
        let mut data = Vec::new();
        let mut has_more = false;
        let mut last = None;
        let range = self.scan(OUTBOX_BY_MERCHANT, Bound::Included(&start), Bound::Excluded(&end), true)?;
        for (scanned, item) in range.enumerate() {
            let (key, value) = item?;
            if data.len() == limit || scanned == MAX_SCAN {
                has_more = true;
                break;
            }
            let id = &key[MERCHANT_ID_LEN..];
            last = Some(String::from_utf8_lossy(id).into_owned());
            if let Some(n) = self.entry_notification(id, &value)? {
                let n = self.with_body(n)?;
                if keep(&n) {
                    data.push(n);
                }
            }
        }
        Ok(Page { data, has_more, next_cursor: if has_more { last } else { None } })
    }

    /// [`Store::due_notifications_skipping`](crate::store::Store::due_notifications_skipping): the due index
    /// up to `now`, dropping the entries it finds stale.
    pub(super) fn scan_due(
        &self,
        now: Timestamp,
        limit: usize,
        skip: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Vec<Notification>, StoreError> {
        let end = (now.unix_ms().saturating_add(1)).to_be_bytes();
        let mut due = Vec::new();
        let mut stale = Vec::new();
        for item in self.scan(OUTBOX_DUE, Bound::Unbounded, Bound::Excluded(end.as_slice()), false)? {
            if due.len() >= limit {
                break;
            }
            let (key, value) = item?;
            let id = key.get(8..).ok_or_else(|| StoreError::Corrupt("bad outbox_due key".into()))?;
            if skip(std::str::from_utf8(id).unwrap_or_default()) {
                continue;
            }
            let key_ms = key.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_be_bytes);
            // The entry names the merchant; one written by an earlier version does not, and its record in
            // `outbox` does. Either way the current record is read, which a save may have moved since.
            let merchant = if value.is_empty() {
                self.get::<Notification>(OUTBOX, id)?.map(|old| old.merchant)
            } else {
                match MerchantId::from_bytes(&value) {
                    Ok(m) => Some(m),
                    // As with an unreadable notification below: reported, passed over, never blocking the rest.
                    Err(e) => {
                        tracing::error!(error = %e, "a due entry names no valid merchant; passed over");
                        continue;
                    }
                }
            };
            let current = match merchant {
                Some(m) => self.stored_notification(&m, id)?,
                None => None,
            };
            match current {
                // An entry is current only if the notification still waits for exactly that time; any other
                // is left over from a save made on a stale read, and is removed so scans stop reading it.
                Some(n) if n.state == DeliveryState::Pending && n.next_attempt_at.map(|t| t.unix_ms()) == key_ms => {
                    // One unreadable notification must not stop every delivery: it is reported and passed over.
                    match self.with_body(n) {
                        Ok(n) => due.push(n),
                        Err(e) => tracing::error!(error = %e, "a due notification cannot be read; passed over"),
                    }
                }
                _ => stale.push(Op::Remove(OUTBOX_DUE, key.to_vec())),
            }
        }
        if !stale.is_empty() {
            // Best effort: if it fails, the next scan finds the same entries again.
            let _ = self.writer.submit(stale, None, Vec::new());
        }
        Ok(due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::MerchantId;
    use crate::domain::status::EventKind;
    use crate::store::Store;

    fn notification(body: &str) -> Notification {
        Notification {
            id: "evt_old".into(),
            merchant: MerchantId::new(),
            event: EventKind::PaymentSucceeded,
            reference: "pay_1".into(),
            body: body.into(),
            created_at: Timestamp::from_unix_ms(1_000),
            state: DeliveryState::Pending,
            next_attempt_at: Some(Timestamp::from_unix_ms(1_000)),
            attempts: Vec::new(),
            chain_attempts: 0,
            total_attempts: 0,
        }
    }

    #[test]
    fn a_notification_stored_with_its_body_apart_still_reads_whole_and_saves_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        // How versions before inline bodies stored a notification: the record (JSON then) without its body, the
        // body apart.
        let body = r#"{"event":"payment.succeeded"}"#;
        let stored = notification("");
        let ops = vec![
            Op::Insert(OUTBOX, stored.id.as_bytes().to_vec(), serde_json::to_vec(&stored).unwrap()),
            Op::Insert(OUTBOX_BY_MERCHANT, mkey(&stored.merchant, stored.id.as_bytes()), Vec::new()),
            Op::Insert(OUTBOX_BODY, stored.id.as_bytes().to_vec(), body.as_bytes().to_vec()),
            Op::Insert(OUTBOX_DUE, due_key(Timestamp::from_unix_ms(1_000), &stored.id), Vec::new()),
        ];
        store.writer.submit(ops, None, Vec::new()).unwrap().blocking_recv().unwrap().unwrap();
        let before = store.notification(&stored.merchant, &stored.id).unwrap().unwrap();
        assert_eq!(before.body, body);
        let due = store.due_notifications_skipping(Timestamp::from_unix_ms(2_000), 10, &mut |_| false).unwrap();
        assert_eq!(due.iter().map(|n| n.body.as_str()).collect::<Vec<_>>(), [body]);
        // A save from a copy that carries the body keeps it inline; one without keeps finding it apart.
        let mut delivered = before.clone();
        delivered.state = DeliveryState::Delivered;
        delivered.next_attempt_at = None;
        store.save_notification(&before, &delivered).unwrap().blocking_recv().unwrap().unwrap();
        assert_eq!(store.notification(&stored.merchant, &stored.id).unwrap().unwrap().body, body);
        let mut without_body = delivered.clone();
        without_body.body = String::new();
        store.save_notification(&delivered, &without_body).unwrap().blocking_recv().unwrap().unwrap();
        let after = store.notification(&stored.merchant, &stored.id).unwrap().unwrap();
        assert_eq!((after.body.as_str(), after.state), (body, DeliveryState::Delivered));
        assert!(store
            .due_notifications_skipping(Timestamp::from_unix_ms(2_000), 10, &mut |_| false)
            .unwrap()
            .is_empty());
        // Only its merchant finds it.
        assert_eq!(store.notification(&MerchantId::new(), &stored.id).unwrap(), None);
    }

    #[test]
    fn notifications_of_both_layouts_list_together_and_come_due_together() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        let mut old = notification(r#"{"old":true}"#);
        old.id = "evt_01JD0000000000000000000001".into();
        let ops = vec![
            Op::Insert(OUTBOX, old.id.as_bytes().to_vec(), serde_json::to_vec(&old).unwrap()),
            Op::Insert(OUTBOX_BY_MERCHANT, mkey(&old.merchant, old.id.as_bytes()), Vec::new()),
            Op::Insert(OUTBOX_DUE, due_key(Timestamp::from_unix_ms(1_000), &old.id), Vec::new()),
        ];
        store.writer.submit(ops, None, Vec::new()).unwrap().blocking_recv().unwrap().unwrap();
        // A notification in the current layout, written the way an attempt saves one.
        let mut new = notification(r#"{"new":true}"#);
        new.id = "evt_01JD0000000000000000000002".into();
        new.merchant = old.merchant.clone();
        let mut unsaved = new.clone();
        unsaved.next_attempt_at = None;
        store.save_notification(&unsaved, &new).unwrap().blocking_recv().unwrap().unwrap();

        let page = store.notifications(&old.merchant, None, 10, &mut |_| true).unwrap();
        assert_eq!(page.data, [new.clone(), old.clone()], "newest first, each whole");
        let due = store.due_notifications_skipping(Timestamp::from_unix_ms(2_000), 10, &mut |_| false).unwrap();
        assert_eq!(due, [old.clone(), new.clone()]);
        assert_eq!(store.notification(&old.merchant, &new.id).unwrap(), Some(new.clone()));
        assert_eq!(store.notification(&old.merchant, &old.id).unwrap(), Some(old));

        // A due entry whose merchant cannot be read is passed over; the others still come due.
        let garbage =
            vec![Op::Insert(OUTBOX_DUE, due_key(Timestamp::from_unix_ms(500), "evt_x"), b"not an id".to_vec())];
        store.writer.submit(garbage, None, Vec::new()).unwrap().blocking_recv().unwrap().unwrap();
        let due = store.due_notifications_skipping(Timestamp::from_unix_ms(2_000), 10, &mut |_| false).unwrap();
        assert_eq!(due.len(), 2);
        assert_eq!(due[1], new);
    }
}
