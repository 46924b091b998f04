//! The one reader of a VM guest's virtio-serial port ([`PortHub`]), shared by everything of
//! the connection that sleeps: the session ring's reaper and every service channel's waits.
//!
//! A doorbell byte from the host is a hint ("something of yours changed"), never addressed
//! to one sleeper: the host writes one when any of the connection's sleepers announced its
//! sleep in its flag in the window (the session ring's `GUEST_SLEEPING`, a channel's). Two
//! threads reading the port would steal each other's bytes and sleep through their
//! wake-ups, so one thread per connection reads it and turns every doorbell byte into a
//! wake-up of all the sleepers ([`EventCount`]); each then checks its own ring and sleeps
//! again if it has nothing. The reply frames of the handshake come through the same reader
//! ([`PortHub::request`]).
//!
//! While the host end of the port is away (the daemon restarts; the kernel reports the port
//! hung up and every read returns at once), the reader checks every [`HUNG_UP_RECHECK`]
//! whether it came back, instead of spinning on the hang-up; nothing else polls.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use virtsoc_proto::handshake::MAX_FRAME;
use virtsoc_proto::ring::Doorbell;
use virtsoc_proto::spin::AdaptiveSpin;
use virtsoc_proto::SharedWindow;
use virtsoc_services::chan::{bells, Bells};
use virtsoc_sync::{EventCount, Mutex};

use super::{MSG_BELL, MSG_REPLY};
use crate::{GuestError, Result};

/// How often the reader looks whether the host end of a hung-up port came back.
pub const HUNG_UP_RECHECK: Duration = Duration::from_millis(20);

/// What the port's bytes are in the middle of.
#[derive(Debug, Default)]
enum Parse {
    /// Between messages.
    #[default]
    Idle,
    /// A reply's length, `got` of its 4 bytes so far.
    Len { got: usize, bytes: [u8; 4] },
    /// A reply's body, `want` bytes long.
    Body { want: usize, body: Vec<u8> },
    /// The rest of an oversized reply, skipped.
    Skip { left: usize },
}

/// What a run of the port's bytes brought.
#[derive(Debug, Default, PartialEq, Eq)]
struct Arrivals {
    /// Doorbell bytes.
    bells: usize,
    /// Reply frames (`None`: one longer than [`MAX_FRAME`], skipped).
    replies: Vec<Option<Vec<u8>>>,
}

impl Parse {
    /// Feeds `bytes` (any split of the stream) through the parser.
    fn feed(&mut self, bytes: &[u8], out: &mut Arrivals) {
        let mut rest = bytes;
        while let Some((&b, tail)) = rest.split_first() {
            match self {
                Parse::Idle => {
                    rest = tail;
                    match b {
                        MSG_BELL => out.bells += 1,
                        MSG_REPLY => {
                            *self = Parse::Len {
                                got: 0,
                                bytes: [0; 4],
                            }
                        }
                        // Nothing else comes from the host; ignored.
                        _ => {}
                    }
                }
                Parse::Len { got, bytes } => {
                    rest = tail;
                    bytes[*got] = b;
                    *got += 1;
                    if *got == 4 {
                        let want = u32::from_le_bytes(*bytes) as usize;
                        *self = if want > MAX_FRAME {
                            out.replies.push(None);
                            Parse::Skip { left: want }
                        } else {
                            Parse::Body {
                                want,
                                body: Vec::with_capacity(want),
                            }
                        };
                    }
                }
                Parse::Body { want, body } => {
                    let n = (*want - body.len()).min(rest.len());
                    body.extend_from_slice(&rest[..n]);
                    rest = &rest[n..];
                }
                Parse::Skip { left } => {
                    let n = (*left).min(rest.len());
                    *left -= n;
                    rest = &rest[n..];
                }
            }
            match self {
                Parse::Body { want, body } if body.len() == *want => {
                    out.replies.push(Some(std::mem::take(body)));
                    *self = Parse::Idle;
                }
                Parse::Skip { left: 0 } => *self = Parse::Idle,
                _ => {}
            }
        }
    }
}

/// What the reader thread and the connection's bells share.
struct Inner {
    port: Arc<File>,
    /// One writer at a time (a hello frame is never cut by a doorbell byte).
    writes: Mutex<()>,
    /// Bumped by every doorbell byte and every reply (and a hang-up): what sleepers wait on.
    events: EventCount,
    replies: Mutex<VecDeque<Option<Vec<u8>>>>,
    /// The host end of the port is away.
    hung_up: AtomicBool,
    stop: AtomicBool,
    stop_rx: UnixStream,
    stop_tx: UnixStream,
}

impl Inner {
    fn write(&self, bytes: &[u8]) -> std::io::Result<()> {
        let _one = self.writes.lock();
        (&*self.port).write_all(bytes)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Waits up to `limit` for the stop request; true if it came.
    fn stop_within(&self, limit: Option<Duration>) -> bool {
        let ts = limit.map(|l| rustix::time::Timespec {
            tv_sec: l.as_secs() as i64,
            tv_nsec: l.subsec_nanos() as i64,
        });
        let mut fds = [PollFd::new(&self.stop_rx, PollFlags::IN)];
        let _ = poll(&mut fds, ts.as_ref());
        self.stopped()
    }

    /// The port's revents now (no wait).
    fn port_now(&self) -> PollFlags {
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let mut fds = [PollFd::new(&*self.port, PollFlags::IN)];
        match poll(&mut fds, Some(&zero)) {
            Ok(_) => fds[0].revents(),
            Err(_) => PollFlags::empty(),
        }
    }

    /// The reader: every byte of the port until the hub stops.
    fn run(&self) {
        let mut parse = Parse::default();
        let mut buf = [0u8; 4096];
        while !self.stopped() {
            if self.hung_up.load(Ordering::SeqCst) {
                if self.stop_within(Some(HUNG_UP_RECHECK)) {
                    return;
                }
                let r = self.port_now();
                if r.is_empty() {
                    // Back, with nothing to read yet: wait for bytes again.
                    self.hung_up.store(false, Ordering::SeqCst);
                    continue;
                }
                if !r.contains(PollFlags::IN) {
                    continue; // still away
                }
            } else {
                let mut fds = [
                    PollFd::new(&*self.port, PollFlags::IN),
                    PollFd::new(&self.stop_rx, PollFlags::IN),
                ];
                if poll(&mut fds, None).is_err() {
                    continue; // EINTR
                }
                let r = fds[0].revents();
                if !r.contains(PollFlags::IN) {
                    if !r.is_empty() {
                        self.hang_up();
                    }
                    continue; // the stop request (checked above), or a hang-up
                }
            }
            // The port is readable (data, or the hang-up's end of file): this read does not
            // block.
            match (&*self.port).read(&mut buf) {
                Ok(0) | Err(_) => self.hang_up(),
                Ok(n) => {
                    self.hung_up.store(false, Ordering::SeqCst);
                    let mut got = Arrivals::default();
                    parse.feed(&buf[..n], &mut got);
                    let woke = got.bells > 0 || !got.replies.is_empty();
                    self.replies.lock().extend(got.replies);
                    if woke {
                        self.events.notify();
                    }
                }
            }
        }
    }

    /// The host end of the port went away.
    fn hang_up(&self) {
        if !self.hung_up.swap(true, Ordering::SeqCst) {
            // Sleepers look again (their rings may say the session ended).
            self.events.notify();
        }
    }
}

/// The reader of a VM guest's port and what the connection's sleepers share with it; the
/// thread stops when the hub is dropped (with its connection).
pub(crate) struct PortHub {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl PortHub {
    /// Starts reading `port`.
    pub(crate) fn start(port: File) -> Result<Arc<Self>> {
        let (stop_tx, stop_rx) = UnixStream::pair().map_err(GuestError::Io)?;
        let inner = Arc::new(Inner {
            port: Arc::new(port),
            writes: Mutex::new(()),
            events: EventCount::default(),
            replies: Mutex::new(VecDeque::new()),
            hung_up: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            stop_rx,
            stop_tx,
        });
        let reader = inner.clone();
        let thread = std::thread::Builder::new()
            .name("virtsoc-vm-port".into())
            .spawn(move || reader.run())
            .map_err(GuestError::Io)?;
        Ok(Arc::new(PortHub {
            inner,
            thread: Some(thread),
        }))
    }

    /// Writes `bytes` on the port (whole, between other writers' messages).
    pub(crate) fn write(&self, bytes: &[u8]) -> Result<()> {
        self.inner.write(bytes).map_err(GuestError::Io)
    }

    /// Writes `msg` (a hello) and waits, until `deadline` if given, for the next reply
    /// frame (replies that came before, of an earlier hello, are dropped).
    pub(crate) fn request(&self, msg: &[u8], deadline: Option<Instant>) -> Result<Vec<u8>> {
        self.inner.replies.lock().clear();
        self.write(msg)?;
        loop {
            let seen = self.inner.events.current();
            if let Some(r) = self.inner.replies.lock().pop_front() {
                return r.ok_or_else(|| GuestError::Refused("oversized reply".into()));
            }
            if self.inner.hung_up.load(Ordering::SeqCst) {
                return Err(GuestError::Closed);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(GuestError::Refused(
                    "no answer on the VM port in time".into(),
                ));
            }
            self.inner.events.wait_past_for(seen, left);
        }
    }

    /// The connection's own bell for its flag at window offset `sleeping` (the session
    /// ring's `GUEST_SLEEPING`, a channel's): sleeps until the reader sees a doorbell byte.
    pub(crate) fn own_bell(
        &self,
        window: &Arc<SharedWindow>,
        sleeping: u64,
        spins: u32,
    ) -> Result<Box<dyn Doorbell>> {
        window.atomic_u32(sleeping)?;
        Ok(Box::new(HubBell {
            inner: self.inner.clone(),
            window: window.clone(),
            sleeping,
            spin: AdaptiveSpin::new(spins),
        }))
    }

    /// The host's bell whose flag is at window offset `sleeping`: a doorbell byte on the
    /// port when the host sleeps.
    pub(crate) fn host_bell(
        &self,
        window: &Arc<SharedWindow>,
        sleeping: u64,
    ) -> Result<Box<dyn Doorbell>> {
        window.atomic_u32(sleeping)?;
        Ok(Box::new(PortRinger {
            inner: self.inner.clone(),
            window: window.clone(),
            sleeping,
        }))
    }

    /// The guest end's bells of the service channel at window offset `base`.
    pub(crate) fn channel_bells(
        &self,
        window: &Arc<SharedWindow>,
        base: u64,
        spins: u32,
    ) -> Result<Bells> {
        Ok(Bells {
            own: self.own_bell(window, bells::guest_bell(base).sleeping, spins)?,
            peer: self.host_bell(window, bells::host_bell(base).sleeping)?,
        })
    }
}

impl Drop for PortHub {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        let _ = (&self.inner.stop_tx).write_all(&[1]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A sleeper of the connection: announces its sleep in its flag, then waits for the
/// reader's next doorbell byte.
struct HubBell {
    inner: Arc<Inner>,
    window: Arc<SharedWindow>,
    sleeping: u64,
    spin: AdaptiveSpin,
}

impl HubBell {
    fn flag(&self) -> Option<&AtomicU32> {
        self.window.atomic_u32(self.sleeping).ok()
    }

    /// The sleeping half of [`Doorbell::wait`].
    fn sleep(&self, ready: &mut dyn FnMut() -> bool, timeout: Option<Duration>) -> bool {
        let Some(flag) = self.flag() else {
            return ready();
        };
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let seen = self.inner.events.current();
            flag.store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if ready() {
                flag.store(0, Ordering::SeqCst);
                return true;
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                flag.store(0, Ordering::SeqCst);
                return false;
            }
            // A byte read after `seen` was taken ends the wait at once: none is lost.
            self.inner.events.wait_past_for(seen, left);
            flag.store(0, Ordering::SeqCst);
            if ready() {
                return true;
            }
        }
    }
}

impl Doorbell for HubBell {
    fn notify(&self) {
        self.inner.events.notify();
    }

    fn force_wake(&self) {
        self.inner.events.notify();
    }

    fn wait(&self, ready: &mut dyn FnMut() -> bool, timeout: Option<Duration>) -> bool {
        self.spin.wait(ready, |ready| self.sleep(ready, timeout))
    }
}

/// The host's bell seen from the guest: a doorbell byte when the host announced its sleep.
struct PortRinger {
    inner: Arc<Inner>,
    window: Arc<SharedWindow>,
    sleeping: u64,
}

impl Doorbell for PortRinger {
    fn notify(&self) {
        fence(Ordering::SeqCst);
        let asleep = self
            .window
            .atomic_u32(self.sleeping)
            .is_ok_and(|f| f.load(Ordering::SeqCst) != 0);
        if asleep {
            let _ = self.inner.write(&[MSG_BELL]);
        }
    }

    fn force_wake(&self) {
        let _ = self.inner.write(&[MSG_BELL]);
    }

    fn wait(&self, ready: &mut dyn FnMut() -> bool, _timeout: Option<Duration>) -> bool {
        // The guest never sleeps on the host's bell.
        ready()
    }
}

#[cfg(test)]
mod tests;
