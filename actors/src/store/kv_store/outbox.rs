//! Webhook notifications in the store: the feed of new ones, a notification with its body, a merchant's list, the
//! scan of the due index that feeds the dispatcher, and saving a delivery's state.

use std::ops::Bound;

use super::{KvStore, MAX_SCAN};
use crate::domain::ids::{first_id_at, IdKind, MerchantId, MERCHANT_ID_LEN};
use crate::domain::records::{DeliveryState, Notification};
use crate::domain::time::Timestamp;
use crate::store::kv::Kv;
use crate::store::op::Op;
use crate::store::{DueScan, Fence, Outbox, Page, Placement, StoreError, Ticket};

// The layout's trees, keys and encodings are this file's vocabulary.
use crate::store::layout::*;

impl<K: Kv> Outbox for KvStore<K> {
    fn delivers_for(&self, merchant: &MerchantId) -> bool {
        self.kv.placement(merchant) == Placement::Here
    }

    fn delivery_fence(&self, merchant: &MerchantId) -> Option<Fence> {
        self.kv.fence_of(merchant)
    }

    fn outbox_feed(&self) -> Option<tokio::sync::mpsc::Receiver<Notification>> {
        self.feed.lock().ok().and_then(|mut feed| feed.take())
    }

    fn save_notification(
        &self,
        before: &Notification,
        after: &Notification,
        fence: Option<Fence>,
    ) -> Result<Ticket, StoreError> {
        let key = mkey(&after.merchant, after.id.as_bytes());
        let mut ops = vec![Op::Insert(NOTIFICATIONS, key, encode(after)?)];
        if let Some(at) = before.next_attempt_at {
            ops.push(Op::Remove(OUTBOX_DUE, due_key(at, &before.id)));
        }
        if let Some(at) = after.next_attempt_at {
            ops.push(Op::Insert(OUTBOX_DUE, due_key(at, &after.id), after.merchant.as_bytes().to_vec()));
        }
        self.kv.submit(ops, None, Vec::new(), fence)
    }

    fn notifications(
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
        let range = self.scan(NOTIFICATIONS, Bound::Included(&start), Bound::Excluded(&end), true)?;
        for (scanned, item) in range.enumerate() {
            let (key, value) = item?;
            if data.len() == limit || scanned == MAX_SCAN {
                has_more = true;
                break;
            }
            let id = &key[MERCHANT_ID_LEN..];
            last = Some(String::from_utf8_lossy(id).into_owned());
            let n: Notification = decode(TREE_NAMES[NOTIFICATIONS], &value)?;
            if keep(&n) {
                data.push(n);
            }
        }
        Ok(Page { data, has_more, next_cursor: if has_more { last } else { None } })
    }

    fn notification(&self, merchant: &MerchantId, id: &str) -> Result<Option<Notification>, StoreError> {
        self.get(NOTIFICATIONS, &mkey(merchant, id.as_bytes()))
    }

    fn notifications_made_before(
        &self,
        merchant: &MerchantId,
        before: Timestamp,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Notification>, StoreError> {
        let (first, after) = (mkey(merchant, b""), after.map(|id| mkey(merchant, id.as_bytes())));
        let start = match &after {
            Some(key) => Bound::Excluded(key.as_slice()),
            None => Bound::Included(first.as_slice()),
        };
        // Ids are `evt_` and a ULID, which begins with the time it was made: the first id of `before` bounds them.
        let end = mkey(merchant, first_id_at(IdKind::Event, before.unix_ms()).as_bytes());
        let mut found = Vec::new();
        for item in self.scan(NOTIFICATIONS, start, Bound::Excluded(end.as_slice()), false)?.take(limit) {
            let (_, value) = item?;
            found.push(decode(TREE_NAMES[NOTIFICATIONS], &value)?);
        }
        Ok(found)
    }

    fn next_merchant_with_notifications(&self, after: Option<&MerchantId>) -> Result<Option<MerchantId>, StoreError> {
        self.next_merchant(NOTIFICATIONS, after)
    }

    fn forget_notifications(&self, notifications: &[Notification]) -> Result<Ticket, StoreError> {
        let mut ops = Vec::with_capacity(notifications.len());
        for n in notifications {
            ops.push(Op::Remove(NOTIFICATIONS, mkey(&n.merchant, n.id.as_bytes())));
            if let Some(at) = n.next_attempt_at {
                ops.push(Op::Remove(OUTBOX_DUE, due_key(at, &n.id)));
            }
        }
        self.submit(ops, None, Vec::new())
    }

    fn due_notifications_skipping(
        &self,
        from: Timestamp,
        now: Timestamp,
        limit: usize,
        skip: &mut dyn FnMut(&str) -> bool,
    ) -> Result<DueScan, StoreError> {
        let start = from.unix_ms().to_be_bytes();
        let end = (now.unix_ms().saturating_add(1)).to_be_bytes();
        let mut due = Vec::new();
        let mut first_kept = None;
        let mut cut_at = None;
        let mut stale = Vec::new();
        // In a cluster most due entries may be other nodes' to deliver: passing over those is bounded too.
        let mut others = 0;
        let range = self.scan(OUTBOX_DUE, Bound::Included(start.as_slice()), Bound::Excluded(end.as_slice()), false)?;
        for item in range {
            let (key, value) = item?;
            let key_ms = key.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_be_bytes);
            if due.len() >= limit {
                first_kept = first_kept.or(key_ms.map(Timestamp::from_unix_ms));
                break;
            }
            if others >= MAX_SCAN {
                cut_at = key_ms.map(Timestamp::from_unix_ms);
                break;
            }
            let id = key.get(8..).ok_or_else(|| StoreError::Corrupt("bad outbox_due key".into()))?;
            if skip(std::str::from_utf8(id).unwrap_or_default()) {
                continue;
            }
            // The entry names the merchant, which finds the record; the current record is read, since a save
            // may have moved it since.
            let merchant = match MerchantId::from_bytes(&value) {
                Ok(m) => m,
                // One unreadable entry or notification must not stop every delivery: it is reported and
                // passed over.
                Err(e) => {
                    tracing::error!(error = %e, "a due entry names no valid merchant; passed over");
                    continue;
                }
            };
            // In a cluster, the node that holds the merchant delivers its notifications (one node at a time, in
            // the merchant's order); the next holder finds them here after a failover.
            if self.kv.placement(&merchant) != Placement::Here {
                others += 1;
                continue;
            }
            let current = match self.get::<Notification>(NOTIFICATIONS, &mkey(&merchant, id)) {
                Ok(current) => current,
                Err(e) => {
                    tracing::error!(error = %e, "a due notification cannot be read; passed over");
                    continue;
                }
            };
            match current {
                // An entry is current only if the notification still waits for exactly that time; any other
                // is left over from a save made on a stale read, and is removed so scans stop reading it.
                Some(n) if n.state == DeliveryState::Pending && n.next_attempt_at.map(|t| t.unix_ms()) == key_ms => {
                    first_kept = first_kept.or(key_ms.map(Timestamp::from_unix_ms));
                    due.push(n)
                }
                _ => stale.push(Op::Remove(OUTBOX_DUE, key.to_vec())),
            }
        }
        if !stale.is_empty() {
            // Best effort: if it fails, the next scan finds the same entries again.
            let _ = self.submit(stale, None, Vec::new());
        }
        Ok(DueScan { due, first_kept, cut_at })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::MerchantId;
    use crate::domain::status::EventKind;
    use crate::store::{wait_polling, FjallStore, Outbox};

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
    fn notifications_list_newest_first_come_due_in_time_order_and_bad_due_entries_are_passed_over() {
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStore::open(dir.path()).unwrap();
        let mut first = notification(r#"{"first":true}"#);
        first.id = "evt_01JD0000000000000000000001".into();
        let mut second = notification(r#"{"second":true}"#);
        second.id = "evt_01JD0000000000000000000002".into();
        second.merchant = first.merchant.clone();
        second.next_attempt_at = Some(Timestamp::from_unix_ms(1_500));
        for n in [&first, &second] {
            let mut unsaved = n.clone();
            unsaved.next_attempt_at = None;
            store.save_notification(&unsaved, n, None).unwrap().blocking_recv().unwrap().unwrap();
        }

        let page = store.notifications(&first.merchant, None, 10, &mut |_| true).unwrap();
        assert_eq!(page.data, [second.clone(), first.clone()], "newest first, each whole");
        let (zero, at) = (Timestamp::from_unix_ms(0), Timestamp::from_unix_ms);
        let scan = store.due_notifications_skipping(zero, at(2_000), 10, &mut |_| false).unwrap();
        assert_eq!(scan.due, [first.clone(), second.clone()]);
        assert_eq!(scan.first_kept, Some(at(1_000)));
        // A scan covers its range only, and says where this node's first entry lies, dispatched or not.
        let scan = store.due_notifications_skipping(at(1_001), at(2_000), 10, &mut |_| false).unwrap();
        assert_eq!((scan.due, scan.first_kept), (vec![second.clone()], Some(at(1_500))));
        // A skipped entry is the dispatcher's to remember (it is being delivered), not the scan's.
        let scan = store.due_notifications_skipping(zero, at(2_000), 10, &mut |id| id == first.id).unwrap();
        assert_eq!((scan.due, scan.first_kept), (vec![second.clone()], Some(at(1_500))));
        let scan = store.due_notifications_skipping(zero, at(2_000), 1, &mut |_| false).unwrap();
        assert_eq!((scan.due, scan.first_kept), (vec![first.clone()], Some(at(1_000))), "beyond the limit");
        let scan = store.due_notifications_skipping(zero, at(2_000), 10, &mut |_| true).unwrap();
        assert_eq!((scan.due, scan.first_kept), (vec![], None), "all skipped");
        let scan = store.due_notifications_skipping(at(1_600), at(2_000), 10, &mut |_| false).unwrap();
        assert_eq!((scan.due, scan.first_kept), (vec![], None), "an empty range");
        assert_eq!(store.notification(&first.merchant, &second.id).unwrap(), Some(second.clone()));
        // Only its merchant finds it.
        assert_eq!(store.notification(&MerchantId::new(), &first.id).unwrap(), None);

        // A due entry whose merchant cannot be read is passed over; the others still come due.
        let garbage =
            vec![Op::Insert(OUTBOX_DUE, due_key(Timestamp::from_unix_ms(500), "evt_x"), b"not an id".to_vec())];
        wait_polling(store.kv.submit(garbage, None, Vec::new(), None).unwrap(), None).unwrap();
        let due = store.due_notifications_skipping(zero, at(2_000), 10, &mut |_| false).unwrap().due;
        assert_eq!(due, [first, second]);
    }

    #[test]
    fn notifications_made_before_a_time_are_found_oldest_first_and_forgotten() {
        use crate::domain::ids::new_id_at;
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStore::open(dir.path()).unwrap();
        let (m, other) = (MerchantId::new(), MerchantId::new());
        let made = |merchant: &MerchantId, at: u64, due: Option<u64>| {
            let mut n = notification("{}");
            n.id = new_id_at(IdKind::Event, at);
            n.merchant = merchant.clone();
            n.next_attempt_at = due.map(Timestamp::from_unix_ms);
            let mut unsaved = n.clone();
            unsaved.next_attempt_at = None;
            store.save_notification(&unsaved, &n, None).unwrap().blocking_recv().unwrap().unwrap();
            n
        };
        let old: Vec<Notification> = (1..=3).map(|i| made(&m, 1_000 * i, None)).collect();
        let pending = made(&m, 4_000, Some(9_000));
        let recent = made(&m, 50_000, None);
        made(&other, 1_000, None);

        let before = Timestamp::from_unix_ms(10_000);
        let all = store.notifications_made_before(&m, before, None, 10).unwrap();
        assert_eq!(all.iter().map(|n| &n.id).collect::<Vec<_>>(), [&old[0].id, &old[1].id, &old[2].id, &pending.id]);
        let page = store.notifications_made_before(&m, before, Some(&old[0].id), 2).unwrap();
        assert_eq!(page, [old[1].clone(), old[2].clone()]);

        let first = store.next_merchant_with_notifications(None).unwrap().unwrap();
        let second = store.next_merchant_with_notifications(Some(&first)).unwrap().unwrap();
        assert_ne!(first, second);
        assert!([&m, &other].contains(&&first) && [&m, &other].contains(&&second));
        assert_eq!(store.next_merchant_with_notifications(Some(&second)).unwrap(), None);

        store.forget_notifications(&[old[0].clone(), pending.clone()]).unwrap().blocking_recv().unwrap().unwrap();
        assert_eq!(store.notification(&m, &old[0].id).unwrap(), None);
        let left = store.notifications_made_before(&m, Timestamp::from_unix_ms(60_000), None, 10).unwrap();
        assert_eq!(left, [old[1].clone(), old[2].clone(), recent]);
        // The forgotten pending notification's due entry went with it.
        assert!(store.due_notifications(Timestamp::from_unix_ms(20_000), 10).unwrap().is_empty());
    }
}
