//! Waiting without fixed sleeps: poll a condition until it holds, failing after a bounded deadline with what
//! was last seen. Also the loopback port and clock helpers the suites share.

use std::future::Future;
use std::net::TcpListener;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a test waits for something asynchronous (a sandbox outcome, a webhook) before failing.
pub const DEADLINE: Duration = Duration::from_secs(15);
/// Pause between two looks at a condition.
const POLL_MS: u64 = 25;

pub async fn sleep_ms(ms: u64) {
    actix_web::rt::time::sleep(Duration::from_millis(ms)).await;
}

/// Now, in Unix seconds.
pub fn unix_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// Polls `check` until it returns `Ok`, for at most `deadline`, and returns its value; its `Err` says what
/// it saw, for the failure message.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(seen) => assert!(started.elapsed() < deadline, "{what}: still not so after {deadline:?}; {seen}"),
        }
        sleep_ms(POLL_MS).await;
    }
}

/// Polls `check` until it holds, for at most [`DEADLINE`].
pub async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let checked = || {
        let done = check();
        async move {
            if done.await {
                Ok(())
            } else {
                Err("the condition does not hold".to_owned())
            }
        }
    };
    eventually(what, DEADLINE, checked).await
}
