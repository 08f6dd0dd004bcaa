//! Only a 200 acknowledges: everything else is retried on the schedule, each attempt freshly signed over the
//! same bytes, logged, and after the last one the notification is `failed` until sent again.

use std::time::Duration;

use caisse_engine::domain::records::{DeliveryState, Notification};
use caisse_engine::webhook::delivery::DeliveryError;

use crate::delivery::assert_signed;
use crate::support::*;

/// The hits carrying `n`'s body, in arrival order.
fn hits_of<'a>(hits: &'a [Hit], n: &Notification) -> Vec<&'a Hit> {
    hits.iter().filter(|h| h.body == n.body.as_bytes()).collect()
}

#[actix_web::test]
async fn a_500_then_a_200_is_retried_once_then_never_again() {
    let app = spawn_app_with(|s| s.webhook_retry_schedule_ms = vec![1_500, 400, 400]).await;
    let receiver = Receiver::start(script(|_, earlier| Reply::Status(if earlier == 0 { 500 } else { 200 })));
    let merchant = app.create_merchant("Flaky", Some(&receiver.base)).await.merchant;
    let reference = reference_of(&app.with_key(&merchant.secret_key).fund(10_000).await);

    let delivered = app.wait_notifications(&merchant.id, 3, DEADLINE, |n| n.state == DeliveryState::Delivered).await;
    // Longer than a further attempt would take (400 ms + 20 % jitter + the 500 ms scan): none comes.
    sleep_ms(1_500).await;
    let hits = receiver.hits();
    assert_eq!(hits.len(), 6, "two requests per notification, none after the 200");
    for n in &delivered {
        assert_eq!(n.reference, reference);
        let mine = hits_of(&hits, n);
        assert_eq!(mine.len(), 2, "{}", n.event.as_str());
        for hit in &mine {
            assert_signed(hit, &merchant.secret_key);
        }
        // Same bytes, a fresh timestamp each time, and the schedule's first wait between the two.
        assert!(mine[1].timestamp() > mine[0].timestamp(), "a fresh X-Service-Timestamp per attempt");
        // The Standard Webhooks id is the notification's, the same on every attempt: what receivers dedupe on.
        assert!(mine.iter().all(|h| h.webhook_id() == n.id), "webhook-id of {}", n.id);
        assert_ne!(mine[0].header("x-service-signature"), mine[1].header("x-service-signature"));
        let gap = mine[1].at.duration_since(mine[0].at);
        assert!(gap >= Duration::from_millis(1_100), "waited {gap:?} (1.5 s +/- 20 %)");

        let now = app.notification_by_id(&n.merchant, &n.id);
        assert_eq!(now.state, DeliveryState::Delivered);
        assert_eq!((now.total_attempts, now.chain_attempts, now.next_attempt_at), (2, 2, None));
        let statuses: Vec<_> = now.attempts.iter().map(|a| (a.http_status, a.error.clone())).collect();
        assert_eq!(statuses, vec![(Some(500), None), (Some(200), None)]);
        assert!(now.attempts[1].at.unix_ms() >= now.attempts[0].at.unix_ms() + 1_200, "{:?}", now.attempts);
        assert!(now.attempts.iter().all(|a| a.latency_ms < 5_000), "{:?}", now.attempts);
    }
}

#[actix_web::test]
async fn a_204_or_a_302_is_a_failure_the_redirect_is_not_followed_and_a_failed_one_can_be_resent() {
    let app = spawn_app_with(|s| s.webhook_retry_schedule_ms = vec![200, 400]).await;
    let target = Receiver::start(always(200));
    let landing = format!("{}/landing", target.base);
    let receiver = Receiver::start(script(move |hit, _| match hit.path.as_str() {
        "/moved" => Reply::Redirect(landing.clone()),
        _ => Reply::Status(204),
    }));
    let quiet = app.create_merchant("No Content", Some(&format!("{}/no-content", receiver.base))).await.merchant;
    let moved = app.create_merchant("Moved", Some(&format!("{}/moved", receiver.base))).await.merchant;
    app.with_key(&quiet.secret_key).pay(10_000, "99").await;
    app.with_key(&moved.secret_key).pay(10_000, "99").await;

    let failed = |n: &Notification| n.state == DeliveryState::Failed;
    let quiet_log = app.wait_notifications(&quiet.id, 3, DEADLINE, failed).await;
    let moved_log = app.wait_notifications(&moved.id, 3, DEADLINE, failed).await;
    let hits = receiver.hits();
    for (log, key, status) in [(&quiet_log, &quiet.secret_key, 204), (&moved_log, &moved.secret_key, 302)] {
        for n in log.iter() {
            // Three attempts (the first and two retries), each logged with its status, then `failed`.
            assert_eq!((n.total_attempts, n.next_attempt_at), (3, None), "{}", describe(std::slice::from_ref(n)));
            assert!(n.attempts.iter().all(|a| a.http_status == Some(status) && a.error.is_none()), "{:?}", n.attempts);
            let mine = hits_of(&hits, n);
            assert_eq!(mine.len(), 3);
            mine.iter().for_each(|h| assert_signed(h, key));
        }
    }
    assert!(target.hits().is_empty(), "the redirect is never followed: {:?}", target.hits());

    // Sent again on demand: a new chain, and a 200 makes it delivered; the others stay as they were.
    receiver.set_script(always(200));
    let chosen = &quiet_log[2];
    // The dispatcher hears that the last attempt is settled just after it is durable; until then a resend
    // is refused as in flight, so the dashboard's button would say "try again".
    let resent = eventually("the resend accepted", DEADLINE, || async {
        match app.state.engine.resend_notification(&chosen.merchant, &chosen.id).await {
            Err(DeliveryError::InFlight) => Err("in flight".to_owned()),
            other => Ok(other.expect("resend")),
        }
    })
    .await;
    assert_eq!((resent.state, resent.chain_attempts), (DeliveryState::Pending, 0));
    let done = eventually("the resent notification is delivered", DEADLINE, || {
        let n = app.notification_by_id(&chosen.merchant, &chosen.id);
        std::future::ready(if n.state == DeliveryState::Delivered { Ok(n) } else { Err(describe(&[n])) })
    })
    .await;
    assert_eq!((done.total_attempts, done.chain_attempts), (4, 1));
    assert_eq!(done.attempts.last().map(|a| a.http_status), Some(Some(200)));
    let last = receiver.hits().into_iter().filter(|h| h.body == done.body.as_bytes()).collect::<Vec<_>>();
    assert_eq!(last.len(), 4);
    assert_signed(&last[3], &quiet.secret_key);
    assert!(last.iter().all(|h| h.webhook_id() == chosen.id), "a resend keeps the webhook-id");
    sleep_ms(300).await;
    let others: Vec<Notification> = app.notifications(&quiet.id).into_iter().filter(|n| n.id != chosen.id).collect();
    assert!(others.iter().all(|n| n.state == DeliveryState::Failed && n.total_attempts == 3), "{}", describe(&others));
}

/// The answer is the status: a 200 whose body is still coming when the attempt's time is up was delivered, and
/// sending it again would make a second delivery for no reason.
#[actix_web::test]
async fn a_200_whose_body_is_slow_is_delivered_once() {
    let app = spawn_app_with(|s| s.webhook_retry_schedule_ms = vec![200, 400]).await;
    let receiver = Receiver::start_raw(script(|hit, earlier| {
        if hit.event() == "payment.initiated" && earlier == 0 {
            Reply::SlowBody(Duration::from_secs(12))
        } else {
            Reply::Status(200)
        }
    }));
    let merchant = app.create_merchant("Slow body", Some(&receiver.base)).await.merchant;
    app.with_key(&merchant.secret_key).fund(10_000).await;

    let log =
        app.wait_notifications(&merchant.id, 3, Duration::from_secs(25), |n| n.state == DeliveryState::Delivered).await;
    let slow = log.iter().find(|n| n.event.as_str() == "payment.initiated").expect("initiated");
    assert_eq!(slow.total_attempts, 1, "{}", describe(&log));
    assert_eq!((slow.attempts[0].http_status, &slow.attempts[0].error), (Some(200), &None));
    assert_eq!(hits_of(&receiver.hits(), slow).len(), 1, "delivered once");
}

#[actix_web::test]
async fn a_receiver_that_does_not_answer_is_cut_at_10_s_and_retried_while_others_go_through() {
    let app = spawn_app_with(|s| s.webhook_retry_schedule_ms = vec![200, 400]).await;
    let receiver = Receiver::start_raw(script(|hit, earlier| {
        if hit.event() == "payment.initiated" && earlier == 0 {
            Reply::Hang(Duration::from_secs(12))
        } else {
            Reply::Status(200)
        }
    }));
    let merchant = app.create_merchant("Sleepy", Some(&receiver.base)).await.merchant;
    app.with_key(&merchant.secret_key).fund(10_000).await;

    let log =
        app.wait_notifications(&merchant.id, 3, Duration::from_secs(25), |n| n.state == DeliveryState::Delivered).await;
    let hung = log.iter().find(|n| n.event.as_str() == "payment.initiated").expect("initiated");
    assert_eq!(hung.total_attempts, 2, "{}", describe(&log));
    let (cut, retry) = (&hung.attempts[0], &hung.attempts[1]);
    assert_eq!(cut.http_status, None);
    assert!(cut.error.as_deref().is_some_and(|e| !e.is_empty()), "the time-out is logged: {cut:?}");
    assert!((9_900..=11_000).contains(&cut.latency_ms), "cut at 10 s, took {} ms", cut.latency_ms);
    assert_eq!((retry.http_status, &retry.error), (Some(200), &None));
    // The other notifications of the same receiver were delivered meanwhile, at their first attempt.
    for n in log.iter().filter(|n| n.id != hung.id) {
        assert_eq!(n.total_attempts, 1, "{}", describe(&log));
        assert!(n.attempts[0].at.unix_ms() < retry.at.unix_ms(), "not held up by the hanging one");
    }
    let hits = receiver.hits();
    let mine = hits_of(&hits, hung);
    assert_eq!(mine.len(), 2);
    mine.iter().for_each(|h| assert_signed(h, &merchant.secret_key));
    assert!(mine[1].timestamp() >= mine[0].timestamp() + 10, "the retry is signed with a fresh timestamp");
}
