//! Native libraries in worker processes, the containment `docs/ARCHITECTURE.md` ("Containing
//! native libraries") decides for libavcodec and libswscale: a parent object in the daemon
//! (a [`ProcessDecoder`](crate::ProcessDecoder), a [`ProcessIsp`](crate::isp::ProcessIsp))
//! sends each call to a worker process that runs the library, so a crash or a hang in it
//! ends that worker only, and the daemon goes on.
//!
//! What every kind of worker shares lives here:
//! - **Messages** ([`wire`]): the worker's stdin is one end of a socket pair; calls and
//!   answers are length-prefixed little-endian messages on it, descriptors riding along. The
//!   parent trusts nothing the worker sends: every read is bounds-checked and anything
//!   malformed ends the worker as if it had crashed. An answer that does not arrive within
//!   [`CALL_DEADLINE`] ends it too (a hang). [`WorkerProcess`] is the parent's end.
//! - **Pictures** ([`shared`]): sealed memfds mapped by both sides, so pictures do not
//!   travel through the socket; a decoder's buffers come back to it through a page of
//!   counters the parent writes ([`release`]); a decoder's packets reach it through a ring
//!   the parent writes ([`ring`]).
//! - **The sandbox** ([`sandbox`]): the worker drops root and enters a seccomp filter before
//!   it reads its first message ([`serve`]).
//! - **Start-up** ([`WorkerPool`]): workers are started ahead (a process start costs
//!   milliseconds).

mod pool;
pub(crate) mod release;
pub(crate) mod ring;
pub mod sandbox;
pub(crate) mod shared;
pub(crate) mod wire;

use std::os::fd::{BorrowedFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::time::Duration;

pub use pool::{WorkerPool, DEFAULT_SPARE};

use crate::error::{MediaError, Result};
use wire::{In, Out};

/// Longest a worker may take to answer one call before it is ended as hung.
pub const CALL_DEADLINE: Duration = Duration::from_secs(3);

/// Memory one worker process is charged against its guest's memory limit, besides the
/// buffers it shares with the daemon: what an idle worker holds resident (64 of them
/// measured 2.1 GiB of RSS, issue 30).
pub const WORKER_RESIDENT: u64 = 32 << 20;

/// The parent's end of one worker: its process and socket. The first failure (a crash, a
/// hang, a malformed answer) ends the worker; every later call fails with the same reason.
pub(crate) struct WorkerProcess {
    child: Child,
    sock: UnixStream,
    /// Who the worker serves, first in every reason ("worker-h264").
    pub(crate) name: String,
    /// What the worker is, in reasons ("decoder process").
    what: &'static str,
    /// What the caller should do once it is gone ("reopen the decoder").
    then: &'static str,
    /// The error its failures are.
    error: fn(String) -> MediaError,
    /// Why the worker is gone, once it is.
    dead: Option<String>,
}

impl WorkerProcess {
    /// Takes over a started worker (from [`WorkerPool::take`]), its socket bounded by
    /// [`CALL_DEADLINE`] each way.
    pub(crate) fn new(
        (child, sock): (Child, UnixStream),
        name: String,
        what: &'static str,
        then: &'static str,
        error: fn(String) -> MediaError,
    ) -> Result<Self> {
        sock.set_read_timeout(Some(CALL_DEADLINE))
            .and_then(|()| sock.set_write_timeout(Some(CALL_DEADLINE)))
            .map_err(|e| MediaError::Unsupported(format!("worker socket: {e}")))?;
        Ok(WorkerProcess {
            child,
            sock,
            name,
            what,
            then,
            error,
            dead: None,
        })
    }

    /// The worker's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the worker has neither failed nor exited (one that exited is reaped, and
    /// ended as a failed one is).
    pub(crate) fn running(&mut self) -> bool {
        if self.dead.is_none() {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.dead = Some(format!(
                    "{}: {} exited ({s}); {}",
                    self.name, self.what, self.then
                ));
            }
        }
        self.dead.is_none()
    }

    /// The worker's CPU time so far, all its threads, in nanoseconds, as the kernel counts
    /// it ([`virtsoc_sandbox::cpu_ns_of`]), not as the worker would say; `None` once it is
    /// gone (reaped, its pid may name another process) or where the clock cannot be read.
    pub(crate) fn cpu_ns(&self) -> Option<u64> {
        if self.dead.is_some() {
            return None;
        }
        virtsoc_sandbox::cpu_ns_of(self.pid())
    }

    /// Bounds the next calls' sending and answer by `deadline` each (instead of
    /// [`CALL_DEADLINE`]).
    pub(crate) fn set_deadline(&self, deadline: Duration) {
        let _ = self
            .sock
            .set_read_timeout(Some(deadline))
            .and_then(|()| self.sock.set_write_timeout(Some(deadline)));
    }

    /// Sends `m` with `fds` and returns the answer (at most `max_answer` bytes); on any
    /// failure the worker is ended.
    pub(crate) fn call(
        &mut self,
        m: &Out,
        fds: &[BorrowedFd<'_>],
        max_answer: usize,
    ) -> Result<In> {
        if let Some(why) = &self.dead {
            return Err((self.error)(why.clone()));
        }
        let r = m
            .send(&mut self.sock, fds)
            .and_then(|()| In::recv(&mut self.sock, max_answer));
        r.map_err(|e| self.end(&e.to_string()))
    }

    /// Sends `m` with `fds` without reading its answer ([`answer`](Self::answer) does); on a
    /// failure the worker is ended.
    pub(crate) fn send(&mut self, m: &Out, fds: &[BorrowedFd<'_>]) -> Result<()> {
        if let Some(why) = &self.dead {
            return Err((self.error)(why.clone()));
        }
        m.send(&mut self.sock, fds)
            .map_err(|e| self.end(&e.to_string()))
    }

    /// Sends the message made of `parts` without waiting for its answer (the worker reads
    /// it once it has answered the calls before it), from byte `from` on: all of it, or
    /// with `now_only` what the socket takes at once (a worker busy writing an answer
    /// nobody reads yet may leave no room: read the answers due, then send the rest).
    /// Returns the bytes of it sent; on a failure the worker is ended.
    pub(crate) fn post(&mut self, parts: &[&[u8]], from: usize, now_only: bool) -> Result<usize> {
        if let Some(why) = &self.dead {
            return Err((self.error)(why.clone()));
        }
        wire::send_parts(&self.sock, parts, from, now_only).map_err(|e| self.end(&e.to_string()))
    }

    /// Reads the answer to the oldest call not answered yet (at most `max_answer` bytes,
    /// waiting within the deadline); on a failure the worker is ended.
    pub(crate) fn answer(&mut self, max_answer: usize) -> Result<In> {
        if let Some(why) = &self.dead {
            return Err((self.error)(why.clone()));
        }
        In::recv(&mut self.sock, max_answer).map_err(|e| self.end(&e.to_string()))
    }

    /// Its socket, which becomes readable when an answer begins to arrive (or the worker
    /// hangs up).
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.sock)
    }

    /// Whether an answer has begun to arrive (or the worker hung up), without waiting.
    pub(crate) fn answer_waiting(&self) -> bool {
        self.dead.is_none() && wire::readable(&self.sock)
    }

    /// Whether the worker was ended after a failure (every call now fails at once).
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.is_some()
    }

    /// Ends the worker after a failure: killed if still running, reaped, and the reason
    /// kept for every later call.
    pub(crate) fn end(&mut self, what: &str) -> MediaError {
        let status = match self.child.try_wait() {
            Ok(Some(s)) => format!("exited ({s})"),
            _ => {
                let _ = self.child.kill();
                let s = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                format!("ended after {what} ({s})")
            }
        };
        let why = format!("{}: {} {status}; {}", self.name, self.what, self.then);
        log::warn!("{why}");
        self.dead = Some(why.clone());
        (self.error)(why)
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        // Closing the socket ends the worker's loop; make sure it is gone and reaped.
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The worker's side: takes stdin as its socket to the parent, enters the [`sandbox`], then
/// hands every call (of at most `max_call` bytes) to `handle`, which answers on the socket,
/// until the parent hangs up. `what` names the worker in errors.
pub(crate) fn serve(
    what: &str,
    max_call: usize,
    receive: fn(&mut UnixStream, usize) -> std::io::Result<In>,
    mut handle: impl FnMut(In, &mut UnixStream) -> Result<()>,
) -> Result<()> {
    // SAFETY: the parent made this process's stdin one end of a socket pair; nothing else in
    // the worker uses fd 0 (no `std::io::stdin()`), so this is its only owner.
    let mut sock = unsafe { UnixStream::from_raw_fd(0) };
    crate::codec::init_ffmpeg();
    sandbox::enter()?;
    loop {
        let m = match receive(&mut sock, max_call) {
            Ok(m) => m,
            // The parent hung up: done.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(MediaError::Resources(format!("{what}: {e}"))),
        };
        handle(m, &mut sock)?;
    }
}

/// Kinds of errors an answer carries (see [`write_error`]).
const ERR_UNSUPPORTED: u8 = 0;
const ERR_LAYOUT: u8 = 1;
const ERR_OTHER: u8 = 2;

/// Writes a call's error as a worker answers it: its kind (unsupported, a bad layout, any
/// other) and its words.
pub(crate) fn write_error(a: &mut Out, e: &MediaError) {
    let (kind, why) = match e {
        MediaError::Unsupported(m) => (ERR_UNSUPPORTED, m.clone()),
        MediaError::InvalidLayout(m) => (ERR_LAYOUT, m.clone()),
        MediaError::Frame(f) => (ERR_LAYOUT, f.to_string()),
        // The library's own words, as an in-process error carries them.
        MediaError::Decode(m) | MediaError::Encode(m) => (ERR_OTHER, m.clone()),
        e => (ERR_OTHER, e.to_string()),
    };
    a.u8(kind).text(&why);
}

/// Reads an error [`write_error`] wrote; `other` makes the error of any other kind.
fn read_error(a: &mut In, other: fn(String) -> MediaError) -> Result<MediaError> {
    let kind = a.u8()?;
    let why = a.text()?;
    Ok(match kind {
        ERR_UNSUPPORTED => MediaError::Unsupported(why),
        ERR_LAYOUT => MediaError::InvalidLayout(why),
        ERR_OTHER => other(why),
        _ => return Err(wire::bad("error kind")),
    })
}

/// Reads an answer that is a result: `0` and what `ok` reads, or `1` and an error
/// ([`read_error`], `other` for any other kind); no descriptors and nothing after it.
/// `Err` when it is malformed (the caller ends the worker), else the call's own result.
pub(crate) fn read_answer<T>(
    a: &mut In,
    ok: impl FnOnce(&mut In) -> Result<T>,
    other: fn(String) -> MediaError,
) -> Result<Result<T>> {
    if !a.fds.is_empty() {
        return Err(wire::bad("descriptors in an answer"));
    }
    let r = match a.u8()? {
        0 => Ok(ok(a)?),
        1 => Err(read_error(a, other)?),
        _ => return Err(wire::bad("answer kind")),
    };
    if a.remaining() != 0 {
        return Err(wire::bad("trailing bytes"));
    }
    Ok(r)
}

/// How long a worker may take for a call on `pixels` pixels: [`CALL_DEADLINE`] and 1 ms
/// more per 10,000 pixels (a 1080p frame adds 0.2 s; the largest frames, tens of seconds).
pub fn deadline_for(pixels: u64) -> Duration {
    CALL_DEADLINE + Duration::from_millis(pixels / 10_000)
}

/// The children of process `parent` (started by any of its threads) with `arg` among their
/// arguments: its workers of one kind (`--codec-worker`, `--isp-worker`), for tests and
/// diagnostics. Read from `/proc`; empty where that cannot be read.
pub fn worker_processes(parent: u32, arg: &str) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
        return Vec::new();
    };
    let has_arg = |pid: &u32| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
            .unwrap_or(false)
    };
    let mut out: Vec<u32> = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .filter(has_arg)
        .collect();
    out.sort_unstable();
    out
}

/// An I/O error of a worker's socket, as `what`'s error.
pub(crate) fn io_error(what: &'static str) -> impl Fn(std::io::Error) -> MediaError {
    move |e| MediaError::Resources(format!("{what}: {e}"))
}
