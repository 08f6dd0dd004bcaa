//! Storage faults (issue 7): a full disk or a read-only data directory makes writes fail with 503
//! `unavailable` and `GET /v1/ping` report it, corrupts nothing that is stored, and the service recovers once
//! the fault is gone.
//!
//! The tests run the real `caisse` binary with its data directory on a small filesystem they mount
//! themselves, so each failure is the kernel's own, on the file descriptors the store really writes through:
//! - [`disk_full`]: a 64 MiB tmpfs filled to ENOSPC by a filler file under the running server. Deleting the
//!   filler ends the fault, and the running server must notice by itself: ping 200 again and writes accepted
//!   within a few seconds, with no restart.
//! - [`read_only`]: a loop-mounted ext4 image sent into the kernel's emergency read-only state (what
//!   `errors=remount-ro` does after a filesystem error) under the running server; writes then fail with
//!   EROFS, open files included. An ordinary `mount -o remount,ro` cannot make this fault: the kernel refuses
//!   it (EBUSY) while any file is open for writing, and the store always has one. The kernel keeps such a
//!   filesystem read-only until it is unmounted, so this fault ends the way an operator ends it: stop the
//!   server, which must then refuse to start on the read-only directory, unmount, mount again, start.
//!
//! - [`webhooks`]: under a full disk, a webhook delivery whose outcome cannot be stored must not be repeated
//!   in a loop: the merchant's receiver gets no more attempts than the retry schedule allows.
//!
//! While the fault lasts, the first write refused must be answered 503 `unavailable`, reads of what existed
//! before must keep working, and `GET /v1/ping` must tell the truth: 503 `unavailable`, or 200 only when a
//! payment offered right after it is accepted. The fault is held for eight seconds, so that the store's own
//! background work (flushes, log rotations, checkpoints) meets it too.
//!
//! Each ends with a restart on the same directory, whose startup audit refuses any ledger disagreement. Every
//! payment answered with a 2xx before, during or after the fault (idempotent replays included) and every
//! payment a read showed must then be there, and the balance must be what the successful payments add up to.
//! Expectations after the fault begins are collected ([`rig::Findings`]) rather than asserted one by one,
//! so that a store that does not recover in place is still checked for durability, and one run reports
//! everything that is wrong.
//!
//! Mounting needs root with CAP_SYS_ADMIN (and loop devices for the ext4 image). As root, a refused mount
//! fails the test loudly and says so. Not as root, the disk-full test is skipped with a message, as there is
//! no unprivileged way to fill a filesystem of one's own, and the read-only test falls back to
//! `chmod -R a-w` on the stopped server's data directory, which unprivileged processes respect: that checks
//! the start on a read-only directory and the restart after it, not a fault under a running server (file
//! permissions do not apply to files already open).

#[path = "../support/mod.rs"]
mod support;

mod disk_full;
mod read_only;
mod rig;
mod scenario;
mod volume;
mod webhooks;
