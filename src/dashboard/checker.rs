//! Password checks on threads of their own, at the lowest CPU priority.
//!
//! argon2 is slow on purpose (tens of milliseconds and 19 MiB a check). On a small machine, two checks on the
//! shared blocking pool took the cores the API answers on, and a flood of logins moved the API's latency.
//! Here they run on [`MAX_CONCURRENT_CHECKS`] dedicated threads whose nice value is the highest, so the
//! scheduler gives the API's threads the CPU first; a login waits a little longer instead. The dashboard's
//! semaphore admits at most that many checks, so the queue never grows.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};

use argon2::password_hash::{PasswordHash, PasswordVerifier};
use argon2::Argon2;
use caisse_engine::domain::ids::random_base62;
use tokio::sync::oneshot;

use super::auth::MAX_CONCURRENT_CHECKS;
use crate::merchants;

/// The lowest priority Linux gives a thread.
const CHECK_NICE: libc::c_int = 19;

struct Check {
    password: String,
    /// `None` for an unknown e-mail: checked against a hash nobody knows, so the timing says nothing.
    hash: Option<String>,
    reply: oneshot::Sender<bool>,
}

pub struct Checker {
    jobs: SyncSender<Check>,
}

impl Checker {
    pub fn start() -> Checker {
        let (jobs, queue) = sync_channel::<Check>(MAX_CONCURRENT_CHECKS);
        let queue = Arc::new(Mutex::new(queue));
        let dummy: Arc<OnceLock<String>> = Arc::default();
        for n in 0..MAX_CONCURRENT_CHECKS {
            let (queue, dummy) = (queue.clone(), dummy.clone());
            let started = std::thread::Builder::new()
                .name(format!("caisse-password-check-{n}"))
                .spawn(move || run(&queue, &dummy));
            if let Err(e) = started {
                tracing::error!(error = %e, "could not start a password-check thread");
            }
        }
        Checker { jobs }
    }

    /// Whether `password` matches `hash`; `false` when no check thread answers.
    pub async fn verify(&self, password: String, hash: Option<String>) -> bool {
        let (reply, answer) = oneshot::channel();
        if self.jobs.try_send(Check { password, hash, reply }).is_err() {
            tracing::warn!("no password-check thread took the check");
            return false;
        }
        answer.await.unwrap_or(false)
    }
}

fn run(queue: &Mutex<Receiver<Check>>, dummy: &OnceLock<String>) {
    // SAFETY: `setpriority` takes plain integers and touches no memory of ours. On Linux, `PRIO_PROCESS` with
    // `who = 0` names the calling thread, not the whole process.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, CHECK_NICE) } != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "could not lower the password checks' priority");
    }
    loop {
        let next = match queue.lock() {
            Ok(queue) => queue.recv(),
            Err(_) => return,
        };
        let Ok(check) = next else { return };
        let hash = match check.hash {
            Some(hash) => hash,
            None => dummy.get_or_init(|| merchants::hash_password(&random_base62(32)).unwrap_or_default()).clone(),
        };
        let _ = check.reply.send(verify_password(&check.password, &hash));
    }
}

pub fn verify_password(password: &str, hash: &str) -> bool {
    match PasswordHash::new(hash) {
        Ok(parsed) => Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix_web::test]
    async fn checks_run_on_their_threads() {
        let checker = Checker::start();
        let hash = merchants::hash_password("correct horse").expect("hash");
        assert!(checker.verify("correct horse".into(), Some(hash.clone())).await);
        assert!(!checker.verify("wrong horse".into(), Some(hash)).await);
        assert!(!checker.verify("anything".into(), None).await, "an unknown e-mail never matches");
        assert!(!verify_password("correct horse", "not a hash"));
    }
}
