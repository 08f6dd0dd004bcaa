//! A TCP proxy on loopback that a test can cut, as a network partition cuts a node off its database: once cut,
//! every byte sent either way is swallowed and new connections are accepted but go nowhere, so the node sees
//! silence (no reset, no error) and must notice by its own time-outs. Healed, new connections pass again while
//! those that lived through the cut stay silent for good, as connections do whose state a firewall or a NAT
//! dropped meanwhile: only a client that gives up on a silent connection and opens another gets through.
//!
//! It can also lose one PostgreSQL `COMMIT` the way a partition would, on whichever connection sends it next:
//! hold it back (the connection then silent both ways) and deliver it late, or deliver it and lose the
//! answer (the client's side closed), so a test can tell what a client makes of a commit whose outcome it
//! never heard.
//!
//! Plain threads, each bounded: a pump wakes every [`TICK`] to look at the flags, and everything ends when the
//! proxy is dropped.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TICK: Duration = Duration::from_millis(50);

/// The simple query a PostgreSQL client sends to commit (tokio-postgres's `Transaction::commit`).
const COMMIT: &[u8] = b"COMMIT\0";

/// What the proxy does with the next `COMMIT`.
const PASS: u8 = 0;
const HOLD: u8 = 1;
const LOSE_ANSWER: u8 = 2;

#[derive(Default)]
struct Flags {
    cut: AtomicBool,
    /// Raised at each cut: a connection born before it never carries bytes again.
    epoch: AtomicU64,
    stop: AtomicBool,
    /// Bytes carried, both ways together.
    carried: AtomicU64,
    /// What to do with the next `COMMIT` a client sends.
    commit: AtomicU8,
    /// A `COMMIT` held back, with the server side of its connection.
    held: Mutex<Option<(TcpStream, Vec<u8>)>>,
    /// `COMMIT`s held back or whose answer was lost.
    caught: AtomicU64,
}

pub struct Proxy {
    pub port: u16,
    flags: Arc<Flags>,
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`) on a free loopback port.
    pub fn start(upstream: &str) -> Proxy {
        let upstream = upstream.to_socket_addrs().expect("the upstream resolves").next().expect("an upstream address");
        let listener = TcpListener::bind("127.0.0.1:0").expect("the proxy binds");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let port = listener.local_addr().expect("the proxy's address").port();
        let flags = Arc::new(Flags::default());
        let accepting = flags.clone();
        std::thread::spawn(move || {
            while !accepting.stop.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((client, _)) => connect(client, upstream, &accepting),
                    Err(_) => std::thread::sleep(TICK),
                }
            }
        });
        Proxy { port, flags }
    }

    /// Swallows everything from now on, on every connection.
    pub fn cut(&self) {
        self.flags.epoch.fetch_add(1, Ordering::AcqRel);
        self.flags.cut.store(true, Ordering::Release);
    }

    /// Lets new connections through again; the ones that lived through the cut stay silent.
    pub fn heal(&self) {
        self.flags.cut.store(false, Ordering::Release);
    }

    pub fn carried(&self) -> u64 {
        self.flags.carried.load(Ordering::Acquire)
    }

    /// Holds back the next `COMMIT` any client sends, until [`Proxy::release`]; its connection is silent both
    /// ways from then on, as if cut.
    pub fn hold_next_commit(&self) {
        self.flags.commit.store(HOLD, Ordering::Release);
    }

    /// Delivers the next `COMMIT` any client sends, then swallows the server's answer and closes the client's
    /// side as that answer arrives (so the client hears nothing, and only once the server has committed).
    pub fn lose_next_commit_answer(&self) {
        self.flags.commit.store(LOSE_ANSWER, Ordering::Release);
    }

    /// How many `COMMIT`s were held back or had their answer lost.
    pub fn commits_caught(&self) -> u64 {
        self.flags.caught.load(Ordering::Acquire)
    }

    /// Whether a `COMMIT` is held back.
    pub fn holds_commit(&self) -> bool {
        self.flags.held.lock().is_ok_and(|held| held.is_some())
    }

    /// Delivers the `COMMIT` held back, late, to the server side of its connection (which may have closed).
    pub fn release(&self) {
        let held = self.flags.held.lock().ok().and_then(|mut held| held.take());
        if let Some((mut server, bytes)) = held {
            let _ = server.write_all(&bytes);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.flags.stop.store(true, Ordering::Release);
    }
}

fn connect(client: TcpStream, upstream: std::net::SocketAddr, flags: &Arc<Flags>) {
    let born = flags.epoch.load(Ordering::Acquire);
    let _ = client.set_nonblocking(false);
    let server = if flags.cut.load(Ordering::Acquire) {
        None
    } else {
        TcpStream::connect_timeout(&upstream, Duration::from_secs(5)).ok()
    };
    let Some(server) = server else {
        // Accepted and left unanswered: the connecting side waits for the start-up exchange until it gives up.
        let flags = flags.clone();
        let link = Link { upward: true, muted: Arc::default(), answering: Arc::default() };
        std::thread::spawn(move || pump(client, None, u64::MAX, &flags, &link));
        return;
    };
    let (Ok(client_back), Ok(server_back)) = (client.try_clone(), server.try_clone()) else { return };
    let (up, down) = (flags.clone(), flags.clone());
    let (muted, answering): (Arc<AtomicBool>, Arc<AtomicBool>) = (Arc::default(), Arc::default());
    let up_link = Link { upward: true, muted: muted.clone(), answering: answering.clone() };
    let down_link = Link { upward: false, muted, answering };
    std::thread::spawn(move || pump(client, Some(server), born, &up, &up_link));
    std::thread::spawn(move || pump(server_back, Some(client_back), born, &down, &down_link));
}

/// One direction of one connection.
struct Link {
    /// From the client to the server.
    upward: bool,
    /// Set once the connection lost a `COMMIT` or its answer: silent both ways from then on.
    muted: Arc<AtomicBool>,
    /// Set once a `COMMIT` went up whose answer is to be lost: the client's side closes when it comes.
    answering: Arc<AtomicBool>,
}

/// Copies `from` to `to` while the connection's epoch is the proxy's and it is not cut; swallows otherwise;
/// closes both when either side closes (only its own once the connection lost a `COMMIT`), or when the proxy
/// stops.
fn pump(mut from: TcpStream, mut to: Option<TcpStream>, born: u64, flags: &Flags, link: &Link) {
    let _ = from.set_read_timeout(Some(TICK));
    // A peer that stops reading must not hold this thread past the proxy's life.
    if let Some(to) = &to {
        let _ = to.set_write_timeout(Some(std::time::Duration::from_secs(5)));
    }
    let mut buffer = [0u8; 16 * 1024];
    loop {
        if flags.stop.load(Ordering::Acquire) {
            break;
        }
        let silent = flags.cut.load(Ordering::Acquire)
            || flags.epoch.load(Ordering::Acquire) != born
            || link.muted.load(Ordering::Acquire);
        match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                if !link.upward && link.answering.load(Ordering::Acquire) {
                    // The answer to the lost `COMMIT`: swallowed, and the client's side closed.
                    if let Some(client) = &to {
                        let _ = client.shutdown(Shutdown::Both);
                    }
                    break;
                }
                if silent {
                    continue;
                }
                let commits = link.upward && buffer[..n].windows(COMMIT.len()).any(|w| w == COMMIT);
                let caught = if commits { flags.commit.swap(PASS, Ordering::AcqRel) } else { PASS };
                if caught != PASS {
                    flags.caught.fetch_add(1, Ordering::AcqRel);
                }
                match caught {
                    HOLD => {
                        link.muted.store(true, Ordering::Release);
                        let server = to.as_ref().and_then(|to| to.try_clone().ok());
                        if let (Some(server), Ok(mut held)) = (server, flags.held.lock()) {
                            *held = Some((server, buffer[..n].to_vec()));
                        }
                        continue;
                    }
                    LOSE_ANSWER => {
                        // Marked first, so the answer the server is about to send is swallowed.
                        link.muted.store(true, Ordering::Release);
                        link.answering.store(true, Ordering::Release);
                        if let Some(to) = to.as_mut() {
                            let _ = to.write_all(&buffer[..n]);
                        }
                        continue;
                    }
                    _ => {}
                }
                flags.carried.fetch_add(n as u64, Ordering::Relaxed);
                let written = to.as_mut().is_some_and(|to| to.write_all(&buffer[..n]).is_ok());
                if !written {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    // A connection that lost a `COMMIT` is partitioned: the other side never hears that this one closed.
    if let Some(to) = to.filter(|_| !link.muted.load(Ordering::Acquire)) {
        let _ = to.shutdown(Shutdown::Both);
    }
}
