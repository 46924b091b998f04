//! A minimal HTTP/1.1 client for the control API, over the Unix socket or TCP (with the
//! token): one request per connection, `Connection: close`, chunked or sized answers.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the control API is.
#[derive(Debug, Clone)]
pub enum Target {
    /// The daemon's control Unix socket, at this path (no token needed).
    Unix(PathBuf),
    /// `host:port` and the token.
    Tcp(String, Option<String>),
}

/// An answer: status and body.
#[derive(Debug, Clone)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The body as text (lossy).
    pub body: String,
    /// The body as sent.
    pub bytes: Vec<u8>,
}

impl Response {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

fn bad(msg: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.into())
}

/// Sends `method path` with `body` (raw bytes) and reads the answer (waiting up to 30 s).
pub fn request(
    target: &Target,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<Response> {
    request_waiting(target, method, path, body, Duration::from_secs(30))
}

/// [`request`], waiting up to `wait` for the answer.
pub fn request_waiting(
    target: &Target,
    method: &str,
    path: &str,
    body: &[u8],
    wait: Duration,
) -> std::io::Result<Response> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    let timeout = Some(wait);
    let mut raw = Vec::new();
    match target {
        Target::Unix(p) => {
            let mut s = std::os::unix::net::UnixStream::connect(p)?;
            s.set_read_timeout(timeout)?;
            head.push_str("\r\n");
            exchange(&mut s, head.as_bytes(), body, &mut raw)?;
        }
        Target::Tcp(addr, token) => {
            let mut s = std::net::TcpStream::connect(addr)?;
            s.set_read_timeout(timeout)?;
            if let Some(t) = token {
                head.push_str(&format!("Authorization: Bearer {t}\r\n"));
            }
            head.push_str("\r\n");
            exchange(&mut s, head.as_bytes(), body, &mut raw)?;
        }
    }
    parse(&raw)
}

fn exchange(
    s: &mut (impl Read + Write),
    head: &[u8],
    body: &[u8],
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    s.write_all(head)?;
    // The server may answer (413, 401) without reading the body and close: keep what it said.
    if let Err(e) = s.write_all(body) {
        log::debug!("control client: writing the body: {e}");
    }
    match s.read_to_end(out) {
        Ok(_) => Ok(()),
        Err(_) if !out.is_empty() => Ok(()),
        Err(e) => Err(e),
    }
}

fn parse(raw: &[u8]) -> std::io::Result<Response> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no HTTP header in the answer"))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad HTTP status line"))?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let mut body = raw[split + 4..].to_vec();
    if chunked {
        body = dechunk(&body)?;
    }
    Ok(Response {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        bytes: body,
    })
}

fn dechunk(mut b: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| bad("bad chunk"))?;
        let size = std::str::from_utf8(&b[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok())
            .ok_or_else(|| bad("bad chunk size"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(b.get(..size).ok_or_else(|| bad("short chunk"))?);
        b = b.get(size + 2..).unwrap_or(&[]);
    }
}

/// The control socket of the daemon whose guest socket is `socket`.
pub fn control_path(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_os_string();
    s.push(".control");
    s.into()
}
