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

use virtsoc_proto::ring::{guest_rings, peer_sleeps, Doorbell, RingConsumer, RingProducer};
use virtsoc_proto::stream::{read_frame, write_frame, StreamFrame};
use virtsoc_proto::window_layout::{ctl, CONTROL_OFFSET};
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
        // Requests an awake host thread has not popped: it may be waiting for the core this
        // one spins on (`AdaptiveSpin::spin_behind`). A sleeping one was woken by the
        // request's doorbell, and the kernel places a woken thread by itself.
        let mut behind = || {
            !peer_sleeps(&self.window, ctl::HOST_SLEEPING)
                && self
                    .sq
                    .try_lock()
                    .is_ok_and(|sq| sq.unconsumed().is_ok_and(|n| n > 0))
        };
        let woke = self.guest_bell.wait_behind(
            &mut || self.host_closed() || cq.available().map(|n| n > 0).unwrap_or(true),
            &mut behind,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;
    use virtsoc_proto::stream::{frame_head, read_head, read_rest};
    use virtsoc_proto::{DeviceId, Opcode};

    fn pattern(seed: u8, n: usize) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    /// A guest's link and the host's end of its stream.
    fn pair() -> (StreamLink, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let guest = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (host, _) = l.accept().unwrap();
        (StreamLink::new(guest, 1 << 30).unwrap(), host)
    }

    /// Three threads of a remote guest write frames at once, the first of each far larger
    /// than the socket buffers (3 x 48 MiB against at most 36 MiB of loopback buffers
    /// here), to a host that reads part of the first frame and stops reading: the writes
    /// are held mid-frame. The host then goes on in small reads, and every frame arrives
    /// whole (no other thread's bytes inside it), each thread's in its order.
    #[test]
    fn writes_keep_every_byte_in_order_across_a_host_that_stops_reading() {
        let (link, host) = pair();
        let link = Arc::new(link);
        let sizes = [48 << 20, 0, 1, 100, 5 << 20];
        let (tx, rx) = mpsc::channel();
        let writers: Vec<_> = (0..3u64)
            .map(|t| {
                let (link, tx) = (link.clone(), tx.clone());
                std::thread::spawn(move || {
                    for (i, n) in sizes.iter().enumerate() {
                        let seq = t * 100 + i as u64;
                        let req = Request::new(seq, Opcode::EndAccess, DeviceId::CPU, [seq; 6]);
                        assert!(link.push(&req, &pattern(seq as u8, *n)).unwrap());
                        tx.send(seq).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        let mut r = BufReader::with_capacity(4096, host);
        let (first, len) = read_head::<Request>(&mut r, 1 << 30).unwrap();
        assert_eq!(len, 48 << 20);
        let mut payload = vec![0u8; len as usize];
        read_rest(&mut r, &mut payload[..8 << 20]).unwrap();
        // The host reads nothing more for now: no write can have ended (at least 100 MiB
        // of the frames is unread, more than the socket buffers hold).
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "a write ended with most of the frames unread"
        );
        // The rest of the first frame in reads of at most 1000 bytes, then the others.
        for chunk in payload[8 << 20..].chunks_mut(1000) {
            r.read_exact(chunk).unwrap();
        }
        let mut next = [0usize; 3];
        let mut check = |req: Request, payload: &[u8]| {
            let t = (req.seq / 100) as usize;
            let i = next[t];
            assert_eq!(
                req.seq,
                t as u64 * 100 + i as u64,
                "thread {t}'s frames in order"
            );
            assert_eq!(req.args, [req.seq; 6]);
            assert!(
                payload == pattern(req.seq as u8, sizes[i]),
                "frame {}",
                req.seq
            );
            next[t] += 1;
        };
        check(first, &payload);
        for _ in 1..3 * sizes.len() {
            let (req, len) = read_head::<Request>(&mut r, 1 << 30).unwrap();
            let mut payload = vec![0u8; len as usize];
            read_rest(&mut r, &mut payload).unwrap();
            check(req, &payload);
        }
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(rx.iter().count(), 3 * sizes.len());
    }

    /// Completions (a remote CPU read's bytes among them) that the host sends in small
    /// pieces, pausing mid-frame far longer than the guest's read timeout: a reap that
    /// started a frame reads it to the end, and every byte arrives in order.
    #[test]
    fn reaps_keep_every_byte_in_order_across_a_host_that_pauses_mid_frame() {
        let (link, mut host) = pair();
        let sizes = [3 << 20, 0, 7, 1 << 20];
        let mut bytes = Vec::new();
        for (i, n) in sizes.iter().enumerate() {
            bytes.extend(frame_head(&Completion::ok(i as u64, [i as u64; 6]), *n));
            bytes.extend(pattern(i as u8, *n));
        }
        let sender = std::thread::spawn(move || {
            // A few bytes of the first head, a pause, then pieces with pauses between.
            host.write_all(&bytes[..5]).unwrap();
            std::thread::sleep(Duration::from_millis(30));
            for (k, piece) in bytes[5..].chunks(512 << 10).enumerate() {
                host.write_all(piece).unwrap();
                if k % 2 == 0 {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            host
        });
        let mut got = Vec::new();
        while got.len() < sizes.len() {
            got.extend(link.reap(Duration::from_millis(1)).unwrap());
        }
        for (i, (c, payload)) in got.iter().enumerate() {
            assert_eq!((c.seq, c.values), (i as u64, [i as u64; 6]));
            assert!(*payload == pattern(i as u8, sizes[i]), "frame {i}");
        }
        drop(sender.join().unwrap());
    }
}
