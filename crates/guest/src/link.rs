//! How the guest library reaches the daemon: the transports behind one small trait.
//!
//! - [`ShmLink`]: rings in a shared window plus doorbells — a memfd and futexes for process
//!   guests, an ivshmem BAR and a virtio-serial port for VM guests;
//! - [`StreamLink`]: remote guests over TCP; every request and completion is a frame on the
//!   stream, and the bytes of CPU accesses travel with them (there is no shared memory).

use std::io::BufReader;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use virtsoc_proto::layout::{ctl, CONTROL_OFFSET};
use virtsoc_proto::ring::{guest_rings, Doorbell, RingConsumer, RingProducer};
use virtsoc_proto::stream::{read_frame, write_frame, StreamFrame};
use virtsoc_proto::{Completion, Request, SharedWindow};
use virtsoc_sync::LockExt;

use crate::{GuestError, Result};

/// A completion and the bytes that came with it (remote CPU reads).
pub(crate) type Arrived = (Completion, Vec<u8>);

/// A transport to the daemon.
pub(crate) trait GuestLink: Send + Sync {
    /// Sends a request (with the bytes of a remote CPU write); `Ok(false)` when the transport
    /// is full for now.
    fn push(&self, req: &Request, payload: &[u8]) -> Result<bool>;
    /// Waits up to `timeout` for completions and returns those that arrived;
    /// `Err(Closed)` once the daemon is gone.
    fn reap(&self, timeout: Duration) -> Result<Vec<Arrived>>;
    /// Hangs up.
    fn close(&self);
    /// Whether the window is shared with the host (false: CPU bytes travel in the stream).
    fn shares_window(&self) -> bool;
    /// Whether the host's futex wakes on the window reach this guest's futex waits (the
    /// same kernel: a process guest; not a VM guest, whose window is a PCI BAR).
    fn host_futex(&self) -> bool {
        false
    }
}

/// Rings in a shared window.
pub(crate) struct ShmLink {
    window: Arc<SharedWindow>,
    sq: Mutex<RingProducer<Request>>,
    cq: Mutex<RingConsumer<Completion>>,
    host_bell: Box<dyn Doorbell>,
    guest_bell: Box<dyn Doorbell>,
    /// Tells whether the daemon went away without saying so (socket hang-up, port EOF).
    hung_up: Box<dyn Fn() -> bool + Send + Sync>,
    on_close: Box<dyn Fn() + Send + Sync>,
    closed: AtomicBool,
    /// See [`GuestLink::host_futex`].
    host_futex: bool,
}

impl ShmLink {
    /// This link's host runs on the guest's kernel: its futex wakes on the window reach the
    /// guest (see [`GuestLink::host_futex`]).
    pub(crate) fn with_host_futex(mut self) -> Self {
        self.host_futex = true;
        self
    }

    pub(crate) fn new(
        window: Arc<SharedWindow>,
        host_bell: Box<dyn Doorbell>,
        guest_bell: Box<dyn Doorbell>,
        hung_up: Box<dyn Fn() -> bool + Send + Sync>,
        on_close: Box<dyn Fn() + Send + Sync>,
    ) -> Self {
        let (sq, cq) = guest_rings(&window);
        ShmLink {
            window,
            sq: Mutex::new(sq),
            cq: Mutex::new(cq),
            host_bell,
            guest_bell,
            hung_up,
            on_close,
            closed: AtomicBool::new(false),
            host_futex: false,
        }
    }

    fn host_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
            || self
                .window
                .atomic_u32(CONTROL_OFFSET + ctl::HOST_STATE)
                .map(|w| w.load(Ordering::SeqCst) != 0)
                .unwrap_or(true)
    }
}

impl GuestLink for ShmLink {
    fn push(&self, req: &Request, _payload: &[u8]) -> Result<bool> {
        if self.host_closed() {
            return Err(GuestError::Closed);
        }
        let pushed = self.sq.lock_or_recover().push(*req)?;
        if pushed {
            self.host_bell.notify();
        }
        Ok(pushed)
    }

    fn reap(&self, timeout: Duration) -> Result<Vec<Arrived>> {
        let mut cq = self.cq.lock_or_recover();
        let woke = self.guest_bell.wait(
            &mut || self.host_closed() || cq.available().map(|n| n > 0).unwrap_or(true),
            Some(timeout),
        );
        let mut batch = Vec::new();
        while let Some(c) = cq.pop()? {
            batch.push((c, Vec::new()));
        }
        if !batch.is_empty() {
            // Completion slots were freed: the host may be waiting for them.
            self.host_bell.notify();
        } else if self.host_closed() || (!woke && (self.hung_up)()) {
            self.closed.store(true, Ordering::SeqCst);
            return Err(GuestError::Closed);
        }
        Ok(batch)
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        (self.on_close)();
    }

    fn shares_window(&self) -> bool {
        true
    }

    fn host_futex(&self) -> bool {
        self.host_futex
    }
}

/// Frames on a TCP stream: a request's head and payload go out in one vectored write
/// (`write_frame`); completions are read through a buffer, whose read timeout is set only
/// when it changes (not once per reap).
pub(crate) struct StreamLink {
    writer: Mutex<TcpStream>,
    /// The reader and the read timeout its socket has now.
    reader: Mutex<(BufReader<TcpStream>, Option<Duration>)>,
    max_payload: u64,
    closed: AtomicBool,
}

impl StreamLink {
    pub(crate) fn new(stream: TcpStream, max_payload: u64) -> Result<Self> {
        stream.set_nodelay(true).map_err(GuestError::Io)?;
        let r = stream.try_clone().map_err(GuestError::Io)?;
        Ok(StreamLink {
            writer: Mutex::new(stream),
            reader: Mutex::new((BufReader::with_capacity(1 << 20, r), None)),
            max_payload,
            closed: AtomicBool::new(false),
        })
    }
}

impl GuestLink for StreamLink {
    fn push(&self, req: &Request, payload: &[u8]) -> Result<bool> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(GuestError::Closed);
        }
        let mut w = self.writer.lock_or_recover();
        write_frame(&mut *w, req, payload).map_err(|_| GuestError::Closed)?;
        Ok(true)
    }

    fn reap(&self, timeout: Duration) -> Result<Vec<Arrived>> {
        let mut guard = self.reader.lock_or_recover();
        let (r, set) = &mut *guard;
        let mut batch = Vec::new();
        let timeout = Some(timeout.max(Duration::from_millis(1)));
        if *set != timeout {
            r.get_ref()
                .set_read_timeout(timeout)
                .map_err(GuestError::Io)?;
            *set = timeout;
        }
        loop {
            match read_frame::<Completion>(r, self.max_payload) {
                Ok(StreamFrame { entry, payload }) => batch.push((entry, payload)),
                Err(e) if e.is_timeout() && batch.is_empty() => return Ok(batch),
                Err(e) if e.is_timeout() => break,
                Err(_) => {
                    self.closed.store(true, Ordering::SeqCst);
                    return Err(GuestError::Closed);
                }
            }
            if r.buffer().is_empty() {
                break;
            }
        }
        Ok(batch)
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let w = self.writer.lock_or_recover();
        let _ = w.shutdown(std::net::Shutdown::Both);
    }

    fn shares_window(&self) -> bool {
        false
    }
}
