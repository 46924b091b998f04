//! The HTTP side: `tiny_http` servers on a Unix socket and (optionally) TCP, each accepting on
//! a thread of its own and answering each request on a worker thread ([`Workers`]).
//!
//! On TCP every request must carry `Authorization: Bearer <token>` (the remote-guest token),
//! compared in constant time; a request without it gets 401 before its body is read. Bodies
//! over [`MAX_BODY`] get 413, also before they are read when they declare their length.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::routes::{handle, Answer};
use crate::workers::Workers;
use crate::{Backend, ControlError, MAX_BODY};

/// Requests answered at once; more get 503 until one finishes.
pub const MAX_IN_FLIGHT: usize = 16;

/// The running control servers; stopped (and the Unix socket removed) when dropped.
pub struct ControlServer {
    servers: Vec<Arc<tiny_http::Server>>,
    threads: Vec<JoinHandle<()>>,
    unix: Option<PathBuf>,
    tcp: Option<SocketAddr>,
}

impl ControlServer {
    /// The TCP address served, if any (with the port chosen when it was 0).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp
    }

    /// Stops accepting and waits for the accept threads.
    pub fn stop(&mut self) {
        for s in &self.servers {
            s.unblock();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(p) = self.unix.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn io_error(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Serves the control API for `backend` on the Unix socket `unix` (a stale file there is
/// replaced) and, if given, on TCP `tcp`, which requires `token`.
pub fn serve(
    backend: Arc<dyn Backend>,
    unix: Option<&Path>,
    tcp: Option<SocketAddr>,
    token: Option<String>,
) -> std::io::Result<ControlServer> {
    let mut cs = ControlServer {
        servers: Vec::new(),
        threads: Vec::new(),
        unix: None,
        tcp: None,
    };
    let in_flight = Arc::new(AtomicUsize::new(0));
    if let Some(path) = unix {
        if std::fs::symlink_metadata(path).is_ok() {
            use std::os::unix::fs::FileTypeExt;
            let is_socket = std::fs::symlink_metadata(path)?.file_type().is_socket();
            if !is_socket || std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(io_error(format!(
                    "{} exists and is not a stale socket; not replacing it",
                    path.display()
                )));
            }
            std::fs::remove_file(path)?;
        }
        let server = Arc::new(tiny_http::Server::http_unix(path).map_err(io_error)?);
        cs.unix = Some(path.to_path_buf());
        cs.threads.push(accept_loop(
            server.clone(),
            backend.clone(),
            None,
            in_flight.clone(),
        )?);
        cs.servers.push(server);
        log::info!("control API on {}", path.display());
    }
    if let Some(addr) = tcp {
        let Some(token) = token else {
            return Err(io_error(
                "the control API on TCP needs the remote-guest token (--token-file)",
            ));
        };
        // Answers go out at once: with Nagle's algorithm the last segment of a view frame
        // waited for the browser's delayed ACK (40 ms) once requests were paced. Linux
        // copies TCP_NODELAY from the listening socket to the accepted ones.
        let listener = std::net::TcpListener::bind(addr)?;
        rustix::net::sockopt::set_tcp_nodelay(&listener, true)?;
        let server = Arc::new(tiny_http::Server::from_listener(listener, None).map_err(io_error)?);
        cs.tcp = server.server_addr().to_ip();
        cs.threads.push(accept_loop(
            server.clone(),
            backend,
            Some(Arc::new(token)),
            in_flight,
        )?);
        cs.servers.push(server);
        log::info!(
            "control API on tcp {}",
            cs.tcp.map(|a| a.to_string()).unwrap_or_default()
        );
    }
    Ok(cs)
}

fn accept_loop(
    server: Arc<tiny_http::Server>,
    backend: Arc<dyn Backend>,
    token: Option<Arc<String>>,
    in_flight: Arc<AtomicUsize>,
) -> std::io::Result<JoinHandle<()>> {
    let workers = Arc::new(Workers::default());
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for rq in server.incoming_requests() {
                let received = Instant::now();
                if in_flight.fetch_add(1, Ordering::SeqCst) >= MAX_IN_FLIGHT {
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    respond(
                        rq,
                        Answer::error(&ControlError::Internal("busy".into())),
                        503,
                    );
                    continue;
                }
                let (b, t, n) = (backend.clone(), token.clone(), in_flight.clone());
                let job = Box::new(move || {
                    serve_one(rq, &*b, t.as_deref().map(String::as_str), received);
                    n.fetch_sub(1, Ordering::SeqCst);
                });
                if let Err((job, e)) = workers.run(job) {
                    drop(job);
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    log::warn!("control: cannot start a request thread: {e}");
                }
            }
        })
}

/// Compares two byte strings in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0
}

/// Whether `rq` carries the token, in an `Authorization: Bearer <token>` header: never in
/// the URL (a query string ends up in logs and histories; the live view's page reads the
/// token from its URL's fragment, which browsers never send, and puts it in headers).
fn authorized(rq: &tiny_http::Request, token: &str) -> bool {
    rq.headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .and_then(|h| h.value.as_str().strip_prefix("Bearer "))
        .map(|t| t.trim().to_string())
        .is_some_and(|got| constant_time_eq(got.as_bytes(), token.as_bytes()))
}

/// Whether `rq` asks for the live view's page itself: static HTML with nothing of the
/// daemon's in it, served without the token (a browser cannot add a header to the address it
/// opens); everything the page then asks for needs the token.
fn is_view_page(rq: &tiny_http::Request) -> bool {
    let url = rq.url();
    let path = url.split_once('?').map_or(url, |(p, _)| p);
    rq.method() == &tiny_http::Method::Get && path == "/view"
}

fn serve_one(
    mut rq: tiny_http::Request,
    backend: &dyn Backend,
    token: Option<&str>,
    received: Instant,
) {
    if let Some(token) = token {
        if !authorized(&rq, token) && !is_view_page(&rq) {
            return respond(rq, Answer::error(&ControlError::Unauthorized), 401);
        }
    }
    let too_large = || Answer::error(&ControlError::TooLarge(MAX_BODY));
    if rq.body_length().is_some_and(|n| n > MAX_BODY) {
        return respond(rq, too_large(), 413);
    }
    let mut body = Vec::new();
    if let Err(e) = rq
        .as_reader()
        .take(MAX_BODY as u64 + 1)
        .read_to_end(&mut body)
    {
        let a = Answer::error(&ControlError::BadRequest(format!("reading the body: {e}")));
        return respond(rq, a, 400);
    }
    if body.len() > MAX_BODY {
        return respond(rq, too_large(), 413);
    }
    let method = rq.method().as_str().to_string();
    let url = rq.url().to_string();
    // A view frame waits for the view's CPU budget; every request of the view (its frames,
    // the page, its reports) is charged to it, whole.
    let budget = backend
        .view_budget()
        .filter(|_| crate::live_view::is_view_request(&method, &url));
    if let Some(b) = budget.filter(|_| crate::live_view::is_frame_request(&method, &url)) {
        std::thread::sleep(b.delay());
    }
    let cpu0 = crate::budget::thread_cpu();
    let answer = handle(backend, &method, &url, &body, received);
    log::debug!("control: {method} {url} -> {}", answer.status);
    let status = answer.status;
    respond(rq, answer, status);
    if let Some(b) = budget {
        b.charge(crate::budget::thread_cpu().saturating_sub(cpu0));
    }
}

/// Answers `rq` with `a` (its body moves into the response: a view frame is not copied).
fn respond(rq: tiny_http::Request, a: Answer, status: u16) {
    let mut r = tiny_http::Response::from_data(a.body).with_status_code(status);
    if let Ok(h) = tiny_http::Header::from_bytes("Content-Type", a.content_type) {
        r = r.with_header(h);
    }
    for (k, v) in &a.headers {
        if let Ok(h) = tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()) {
            r = r.with_header(h);
        }
    }
    if let Err(e) = rq.respond(r) {
        log::debug!("control: answering: {e}");
    }
}
