//! A child process of a webhook test (an example receiver, the real `caisse` binary): killed when dropped,
//! its stdout lines collected.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{eventually, DEADLINE};

/// A child process killed when dropped, with its stdout lines collected.
pub struct ChildProcess {
    pub child: std::process::Child,
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ChildProcess {
    pub fn spawn(mut command: std::process::Command) -> std::io::Result<ChildProcess> {
        let mut child = command.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped()).spawn()?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        if let Some(stdout) = child.stdout.take() {
            let sink = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    sink.lock().expect("lines").push(line);
                }
            });
        }
        Ok(ChildProcess { child, lines })
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    /// Waits until something accepts connections on `port`, failing if the process exits first.
    pub async fn wait_listening(&mut self, port: u16, what: &str) {
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        eventually(&format!("{what} listening on {port}"), DEADLINE, || {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{what} exited before listening: {status}");
            }
            let listening = TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok();
            std::future::ready(if listening { Ok(()) } else { Err("connection refused".to_owned()) })
        })
        .await
    }
}
