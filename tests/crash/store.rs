//! The end of the test, on the store itself: after the last kill it is opened directly, must pass its audit,
//! and its webhook outbox must match what the receivers got, body for body.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use caisse_engine::domain::ids::MerchantId;
use caisse_engine::domain::records::DeliveryState;
use caisse_engine::store::Store;
use caisse_engine::store::{fjall_store, open_embedded};

use crate::load::{Merchant, Run};
use crate::support::sleep_ms;

/// How long the store may take to open once the killed server is reaped.
const OPEN_DEADLINE: Duration = Duration::from_secs(30);

/// The (event, reference) pairs a merchant's receiver acknowledged (answered 200 after verifying).
pub fn acknowledged_notifications(merchant: &Merchant) -> BTreeSet<(String, String)> {
    merchant
        .receiver
        .deliveries_from(0)
        .into_iter()
        .filter(|d| d.answered == 200)
        .map(|d| (d.event, d.reference))
        .collect()
}

/// After the last kill: the store passes its audit, and every notification in it is delivered, was
/// acknowledged by the receiver with exactly the stored body, and every body the receiver got is a stored one
/// (a notification of a change the crash lost would not be). Returns the number of stored notifications.
pub async fn check_store(data_dir: &Path, run: &Run) -> Result<usize, Vec<String>> {
    let started = Instant::now();
    let store = loop {
        match open_embedded(data_dir, fjall_store::DEFAULT_CACHE_BYTES, None) {
            Ok(store) => break store,
            Err(e) => assert!(started.elapsed() < OPEN_DEADLINE, "the store does not open: {e}"),
        }
        sleep_ms(50).await;
    };
    check_opened_store(store.as_ref(), run)
}

/// [`check_store`] on a store already open (a cluster's database, read by a client of it).
pub fn check_opened_store(store: &dyn Store, run: &Run) -> Result<usize, Vec<String>> {
    let mut wrong = Vec::new();
    if let Err(e) = store.audit() {
        wrong.push(format!("the store's audit fails: {e}"));
    }
    let mut stored_count = 0;
    for merchant in &run.merchants {
        let id = MerchantId::parse(&merchant.id).expect("a merchant id");
        let mut stored: BTreeMap<(String, String), Vec<Vec<u8>>> = BTreeMap::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = store.notifications(&id, cursor.as_deref(), 100, &mut |_| true).expect("notifications");
            for n in &page.data {
                if n.state != DeliveryState::Delivered {
                    wrong.push(format!(
                        "{}: notification {} {} {} is {:?}",
                        merchant.name,
                        n.id,
                        n.event.as_str(),
                        n.reference,
                        n.state
                    ));
                }
                stored
                    .entry((n.event.as_str().to_owned(), n.reference.clone()))
                    .or_default()
                    .push(n.body.as_bytes().to_vec());
                stored_count += 1;
            }
            match page.next_cursor {
                Some(next) if page.has_more => cursor = Some(next),
                _ => break,
            }
        }
        let deliveries = merchant.receiver.deliveries_from(0);
        for ((event, reference), bodies) in &stored {
            if bodies.len() > 1 {
                wrong.push(format!("{}: {event} {reference} is stored {} times", merchant.name, bodies.len()));
            }
            let acknowledged = deliveries.iter().any(|d| {
                d.answered == 200 && d.event == *event && d.reference == *reference && bodies.contains(&d.body)
            });
            if !acknowledged {
                wrong.push(format!(
                    "{}: {event} {reference} was never acknowledged with its stored body",
                    merchant.name
                ));
            }
        }
        for d in &deliveries {
            let known =
                stored.get(&(d.event.clone(), d.reference.clone())).is_some_and(|bodies| bodies.contains(&d.body));
            if !known {
                wrong.push(format!(
                    "{}: the receiver got {} {} whose body is not in the store: {}",
                    merchant.name,
                    d.event,
                    d.reference,
                    String::from_utf8_lossy(&d.body)
                ));
            }
        }
    }
    if wrong.is_empty() {
        Ok(stored_count)
    } else {
        Err(wrong)
    }
}
