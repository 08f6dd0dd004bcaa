//! The HTTP/1 server under the API, the dashboard, the payment page and the admin API: actix-web's `App`
//! served by actix-http over connections that give the protocol layer's own rejections the API's error shape.
//!
//! actix-http answers by itself, before any route runs, a request it cannot parse (400), a request head over
//! its bounds (431) and a head that does not arrive in time (408). It writes those answers bare: no body, no
//! `Request-Id`, and it offers no hook to shape them. So each connection is wrapped in [`Shaped`], which sees
//! what the server writes and replaces such an answer, at the moment it is written, with the same status
//! carrying `{"error": {"code": "invalid_request", ...}}` and a `Request-Id`.
//!
//! The wrapper recognises a rejection by its exact form, as the whole of one write: a response head with one of
//! those three statuses, `content-length: 0`, and no header but `connection` and `date`. Every answer of a
//! route carries a `Request-Id` (the request log middleware adds it), so no route's answer matches, and a
//! rejection is the last thing actix-http writes on a connection before it closes it, so it has a write of
//! its own unless an earlier pipelined answer is still being written: then it stays bare. Matching only whole
//! writes, never the end of one, keeps a body that happens to end with such bytes (a forwarded answer between
//! nodes carries merchants' text) from ever being rewritten.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_http::HttpService;
use actix_service::{map_config, IntoServiceFactory, ServiceFactoryExt};
use actix_web::body::MessageBody;
use actix_web::dev::{fn_service, AppConfig, Server, ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::rt::net::TcpStream;
use actix_web::{App, Error};
use caisse_engine::domain::ids::{new_id, IdKind};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How long a request head may take to arrive, from the connection's first byte: slower is 408.
pub const REQUEST_HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// How the server is run: worker threads (0: one per core) and how long a stop waits for requests in flight.
pub struct ServerOptions {
    pub name: &'static str,
    pub workers: usize,
    pub shutdown_grace_s: u64,
}

/// Serves the `App` that `factory` builds (once per worker) on `listener`, and starts the server. The settings
/// are actix-web's defaults (keep-alive 5 s, a head within [`REQUEST_HEAD_TIMEOUT`], 1 s for a client to
/// close), except that Nagle's algorithm is off, which actix-web leaves on.
pub fn serve<F, T, B>(listener: TcpListener, options: ServerOptions, factory: F) -> io::Result<Server>
where
    F: Fn() -> App<T> + Send + Clone + 'static,
    T: ServiceFactory<ServiceRequest, Config = (), Response = ServiceResponse<B>, Error = Error, InitError = ()>
        + 'static,
    B: MessageBody + 'static,
{
    let local = listener.local_addr()?;
    let mut builder = Server::build().shutdown_timeout(options.shutdown_grace_s);
    if options.workers > 0 {
        builder = builder.workers(options.workers);
    }
    // Keep-alive connections are closed when a graceful stop begins, as actix-web's own server does, so
    // clients move to another node instead of waiting out the grace period.
    let shutdown = builder.graceful_shutdown_signal();
    builder = builder.listen(options.name, listener, move || {
        let shutdown = shutdown.clone();
        let app = factory().into_factory().map_err(|error| error.error_response());
        let http = HttpService::build()
            .client_request_timeout(REQUEST_HEAD_TIMEOUT)
            .client_disconnect_timeout(Duration::from_secs(1))
            .local_addr(local)
            .graceful_shutdown_signal(move || {
                let shutdown = shutdown.clone();
                async move { shutdown.notified().await }
            })
            // No route reads the host or scheme from the application's configuration: the default will do.
            .h1(map_config(app, |_| AppConfig::default()));
        fn_service(|io: TcpStream| async move {
            // A small answer must not wait for Nagle's algorithm; a socket that refuses the option still serves.
            let _ = io.set_nodelay(true);
            let peer = io.peer_addr().ok();
            Ok::<_, actix_http::error::DispatchError>((Shaped::new(io, peer), peer))
        })
        .and_then(http)
    })?;
    Ok(builder.run())
}

/// A connection whose protocol-level rejections are rewritten in the API's error shape (see the module's
/// documentation). Reads pass through untouched.
pub struct Shaped<T> {
    io: T,
    peer: Option<SocketAddr>,
    replacing: Option<Replacing>,
}

/// A rejection being written in its new shape.
struct Replacing {
    bytes: Vec<u8>,
    written: usize,
    /// How many bytes of the server's bare answer it stands for.
    stands_for: usize,
}

impl<T> Shaped<T> {
    pub fn new(io: T, peer: Option<SocketAddr>) -> Shaped<T> {
        Shaped { io, peer, replacing: None }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Shaped<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Shaped<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let mut replacing = match this.replacing.take() {
            Some(replacing) => replacing,
            None => match shape_rejection(buf) {
                Some(shaped) => {
                    log_rejection(&shaped, this.peer);
                    Replacing { bytes: shaped.bytes, written: 0, stands_for: buf.len() }
                }
                None => return Pin::new(&mut this.io).poll_write(cx, buf),
            },
        };
        while replacing.written < replacing.bytes.len() {
            match Pin::new(&mut this.io).poll_write(cx, &replacing.bytes[replacing.written..]) {
                Poll::Pending => {
                    this.replacing = Some(replacing);
                    return Poll::Pending;
                }
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => replacing.written += n,
            }
        }
        // The server retries a pending write with the same bytes; it is told the bare answer went out whole.
        Poll::Ready(Ok(replacing.stands_for.min(buf.len())))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A protocol-level rejection in the API's shape: the bytes to write instead, and what the log line says.
struct ShapedRejection {
    bytes: Vec<u8>,
    status: u16,
    request_id: String,
}

/// The longest bare answer recognised: a status line and three short headers are far below it.
const MAX_BARE_HEAD: usize = 256;

/// The status of the server's bare rejection, when `head` is exactly one: a status line with 400, 408 or 431,
/// then only `content-length: 0`, `connection` and `date`, as actix-http writes it, and the blank line. A
/// route's answer always carries a `request-id`, so it never matches.
fn bare_rejection(head: &[u8]) -> Option<u16> {
    if head.len() > MAX_BARE_HEAD {
        return None;
    }
    let head = std::str::from_utf8(head.strip_suffix(b"\r\n\r\n")?).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let rest = status_line.strip_prefix("HTTP/1.1 ").or_else(|| status_line.strip_prefix("HTTP/1.0 "))?;
    let status = match rest.get(..4)? {
        "400 " => 400,
        "408 " => 408,
        "431 " => 431,
        _ => return None,
    };
    let mut bodiless = false;
    for line in lines {
        let (name, value) = line.split_once(": ")?;
        match name.to_ascii_lowercase().as_str() {
            "content-length" if value == "0" => bodiless = true,
            "connection" | "date" => {}
            _ => return None,
        }
    }
    bodiless.then_some(status)
}

/// Recognises the server's bare rejection in `written` (one write's bytes) and answers its replacement.
fn shape_rejection(written: &[u8]) -> Option<ShapedRejection> {
    let status = bare_rejection(written)?;
    let message = match status {
        400 => "the request is not valid HTTP/1.1: a malformed request line or header, or a target over 64 KiB",
        408 => "the request's line and headers did not arrive within 5 s",
        _ => "the request's line and headers are too large: at most 96 headers and 128 KiB in all",
    };
    let head = String::from_utf8_lossy(&written[..written.len() - 4]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let request_id = new_id(IdKind::Event).replacen("evt_", "req_", 1);
    let body = serde_json::json!({ "error": { "code": "invalid_request", "message": message } }).to_string();
    let mut bytes = format!(
        "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nrequest-id: {request_id}\r\n",
        body.len()
    );
    // The server closes the connection after a rejection, and says so even when its bare answer did not.
    let mut says_close = false;
    for line in lines.filter(|line| !line.to_ascii_lowercase().starts_with("content-length:")) {
        says_close |= line.to_ascii_lowercase().starts_with("connection:");
        bytes.push_str(line);
        bytes.push_str("\r\n");
    }
    if !says_close {
        bytes.push_str("connection: close\r\n");
    }
    bytes.push_str("\r\n");
    bytes.push_str(&body);
    Some(ShapedRejection { bytes: bytes.into_bytes(), status, request_id })
}

/// The log line the request log would have written, for a request that never reached it.
fn log_rejection(shaped: &ShapedRejection, peer: Option<SocketAddr>) {
    let client = peer.map_or_else(|| "unknown".to_owned(), |peer| peer.ip().to_string());
    crate::metrics::METRICS.request("unparsed", shaped.status, Duration::ZERO);
    tracing::info!(
        target: "caisse::http",
        status = shaped.status,
        %client,
        request_id = %shaped.request_id,
        "request refused by the HTTP layer"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const BARE_431: &[u8] =
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\ndate: Fri, 27 Nov 2026 10:00:00 GMT\r\n\r\n";

    fn text(shaped: &ShapedRejection) -> &str {
        std::str::from_utf8(&shaped.bytes).unwrap()
    }

    #[test]
    fn a_bare_rejection_gets_a_json_body_and_a_request_id() {
        let shaped = shape_rejection(BARE_431).expect("recognised");
        assert_eq!(shaped.status, 431);
        let (head, body) = text(&shaped).split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"), "{head}");
        assert!(head.contains("\r\ncontent-type: application/json\r\n"), "{head}");
        assert!(head.contains(&format!("\r\ncontent-length: {}\r\n", body.len())), "{head}");
        assert!(head.contains(&format!("\r\nrequest-id: {}", shaped.request_id)), "{head}");
        assert!(head.contains("\r\nconnection: close\r\ndate: Fri, 27 Nov 2026 10:00:00 GMT"), "{head}");
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["error"]["code"], "invalid_request");
        assert!(body["error"]["message"].as_str().unwrap().contains("96 headers"));
        assert!(shape_rejection(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").is_some());
        assert!(shape_rejection(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n\r\n").is_some());
    }

    #[test]
    fn a_routes_answer_or_anything_beside_a_head_passes_untouched() {
        // A route's answer carries a request id; other statuses, bodies and shared writes are not rejections.
        let routed = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nrequest-id: req_1\r\n\r\n";
        assert!(shape_rejection(routed).is_none());
        assert!(shape_rejection(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(shape_rejection(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n").is_none());
        assert!(shape_rejection(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}").is_none());
        let routed_close =
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\nrequest-id: r\r\n\r\n";
        assert!(shape_rejection(routed_close).is_none());
        assert!(shape_rejection(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nx-other: 1\r\n\r\n").is_none());
        let two = [BARE_431, BARE_431].concat();
        assert!(shape_rejection(&two).is_none());
        // A body that ends like a rejection is a body.
        assert!(shape_rejection(&[b"{\"a\":1}".as_slice(), BARE_431].concat()).is_none());
        assert!(shape_rejection(&BARE_431[..BARE_431.len() - 2]).is_none());
        assert!(shape_rejection(b"{\"a\":1}\r\n\r\n").is_none());
    }

    /// A writer that takes at most `step` bytes per write, and is pending every other call.
    struct Trickle {
        out: Vec<u8>,
        step: usize,
        pending: bool,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            self.pending = !self.pending;
            if self.pending {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let n = buf.len().min(self.step);
            self.out.extend_from_slice(&buf[..n]);
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[actix_web::test]
    async fn a_rejection_written_in_pieces_is_whole_and_counted_as_the_bare_answer() {
        use tokio::io::AsyncWriteExt;
        let mut shaped = Shaped::new(Trickle { out: Vec::new(), step: 7, pending: false }, None);
        let routed = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nrequest-id: req_1\r\n\r\n{}";
        // An answer, then the bare one in a write of its own.
        shaped.write_all(routed).await.unwrap();
        shaped.write_all(BARE_431).await.unwrap();
        let out = String::from_utf8(std::mem::take(&mut shaped.io.out)).unwrap();
        let rejection = out.strip_prefix(std::str::from_utf8(routed).unwrap()).expect("the routed answer first");
        assert!(rejection.starts_with("HTTP/1.1 431 "), "{rejection}");
        assert!(rejection.ends_with("\"}}"), "{rejection}");
        assert!(rejection.contains("\"invalid_request\""), "{rejection}");
        assert!(rejection.contains("\r\nconnection: close\r\n"), "{rejection}");
        // `write` reports how much of the caller's bytes went out: all of the bare answer, in one piece.
        assert_eq!(shaped.write(BARE_431).await.unwrap(), BARE_431.len());
        assert!(String::from_utf8(shaped.io.out).unwrap().starts_with("HTTP/1.1 431 "));
    }
}
