//! A guest's connection to the daemon.
//!
//! Requests are written to the submission ring and the host is woken only if it sleeps;
//! completions are reaped by whichever waiting thread gets there first (the reaper) and handed
//! to their waiters through a condition variable, so many guest threads can have requests in
//! flight at once. The library checks what the host gives it too: window offsets are bounds
//! checked before they become pointers.

use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use virtsoc_fence::page::{slot_offset, slot_status};
use virtsoc_fence::table::{FenceId, FenceStatus};
use virtsoc_fence::MimdPacer;
use virtsoc_ids::RegionId;
use virtsoc_proto::handshake::{DeviceDesc, Hello, Reply, PROTOCOL_VERSION};
use virtsoc_proto::window_layout::FENCE_PAGE_OFFSET;
use virtsoc_proto::WindowLayout;
use virtsoc_sync::{Condvar, Mutex, RwLock};

use crate::link::GuestLink;
use virtsoc_devapi::DeviceCommand;
use virtsoc_proto::wire::Format;
use virtsoc_proto::{AccessMode, Completion, DeviceId, Opcode, Request, SharedWindow, Status};

use crate::{GuestError, Result};

mod calls;
mod fence_wait;
pub(crate) mod handshake;
mod reconnect;
#[cfg(test)]
mod tests;

/// Longest compensation the library honours (the host caps it lower).
const MAX_COMPENSATION: Duration = Duration::from_millis(100);

/// Host queue depth the MIMD pacer steers toward.
const PACER_TARGET_DEPTH: u32 = 16;
/// Largest MIMD window: requests in flight never exceed it, so host queues stay bounded even
/// between two feedback rounds.
const PACER_MAX_WINDOW: u32 = 4 * PACER_TARGET_DEPTH;

/// How long a reaper sleeps before checking that the daemon is still there.
const LIVENESS_CHECK: Duration = Duration::from_millis(250);

/// Options for [`Connection::connect`].
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Name shown in the daemon's logs.
    pub name: String,
    /// Requested window size (the daemon may clamp it).
    pub window_size: u64,
    /// Entries of the submission ring (a power of two; the daemon may clamp it).
    pub sq_entries: u32,
    /// Entries of the completion ring (a power of two; the daemon may clamp it).
    pub cq_entries: u32,
    /// Coherence protocol for this guest's regions (`None`: the daemon's default).
    pub coherence: Option<String>,
    /// Credential for remote transports (default: `$VIRTSOC_TOKEN`).
    pub token: Option<String>,
    /// Spin iterations before sleeping on the doorbell.
    pub spins: u32,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            name: format!("guest-{}", std::process::id()),
            window_size: 256 << 20,
            sq_entries: 256,
            cq_entries: 256,
            coherence: None,
            token: std::env::var("VIRTSOC_TOKEN").ok(),
            spins: 4096,
        }
    }
}

/// Guest-side cached metadata of a region (the host keeps the full record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionInfo {
    /// The region's id (as the host's region table names it).
    pub id: RegionId,
    /// Bytes of the region.
    pub size: u64,
    /// Bytes from one row to the next (0 for blobs).
    pub stride: u32,
    /// Width in pixels (0 for blobs).
    pub width: u32,
    /// Height in pixels (0 for blobs).
    pub height: u32,
    /// Pixel format (`Blob` for untyped bytes).
    pub format: Format,
}

/// What begin_access returned.
#[derive(Debug, Clone, Copy)]
pub struct Access {
    /// CPU pointer to the first accessed byte (CPU accesses only).
    pub ptr: Option<NonNull<u8>>,
    /// Host time spent on coherence for this call.
    pub coherence: Duration,
    /// Copies the host made for this call.
    pub copies: u32,
    /// Time the library blocked for prefetch compensation (end_access only).
    pub compensation: Duration,
    /// Wall time of the call on the host (waiting for in-flight copies included).
    pub host_elapsed: Duration,
}

struct Reaped {
    done: HashMap<u64, Completion>,
    /// Requests submitted and not completed yet: a completion for anything else (a sequence
    /// number never used, or completed already) is the host's mistake and is dropped.
    outstanding: HashSet<u64>,
    reaping: bool,
    /// Threads waiting on `reaped_cv` for the reaper's round (woken only when some are: a
    /// lone caller's round trip makes no wake-up syscall).
    waiters: usize,
    /// Requests whose completion nobody waits for (fire and forget).
    detached: HashSet<u64>,
    /// Failures of detached requests, until collected.
    async_errors: Vec<(u64, Status)>,
}

/// A virtual command fence of this guest (the host's fence id: one definition, in
/// `virtsoc-ids`; its wire word is [`Fence::to_u64`]).
pub use virtsoc_fence::FenceId as Fence;

/// The guest's SVM counters as kept by the host: one record declared once in the protocol
/// crate (its counts are monotonic: subtract two snapshots with `since`).
pub use virtsoc_proto::counters::Counters;
/// One link of the host's copy ledger for this guest (domain names in
/// [`Connection::domain_name`]).
pub use virtsoc_proto::counters::LedgerEntry as LedgerLink;

/// A connection to the daemon. Cheap to share between threads (`&Connection` is `Sync`).
pub struct Connection {
    /// The transport and the window: replaced when the connection moves to another daemon
    /// (restart, migration; see [`Connection::reconnect`]).
    link: RwLock<Arc<dyn GuestLink>>,
    window: RwLock<Arc<SharedWindow>>,
    guest_id: AtomicU64,
    /// How to reach the daemon again: the socket and the options (process guests).
    origin: Mutex<Option<(std::path::PathBuf, ConnectOptions)>>,
    /// The secret that resumes this session elsewhere (from the welcome).
    resume: Mutex<Option<String>>,
    /// A VM guest's virtio-serial port and its one reader (it stays open across
    /// reconnects: one opener at a time).
    pub(crate) vm_port: Mutex<Option<Arc<crate::vm::PortHub>>>,
    /// Reconnect by itself for this long when the daemon goes away (`None`: never).
    auto_reconnect: Mutex<Option<Duration>>,
    /// One reconnect at a time.
    reconnecting: Mutex<()>,
    /// Closed by the application (never reconnects).
    user_closed: AtomicBool,
    /// Windows of daemons this connection left (CPU pointers into them stay mapped).
    retired: Mutex<Vec<Arc<SharedWindow>>>,
    /// Requests not completed yet, kept (while auto-reconnect is on) to be sent again to the
    /// daemon the session moves to.
    replay: Mutex<reconnect::Replay>,
    /// Whether requests are kept in `replay`.
    track: AtomicBool,
    coherence: String,
    devices: Vec<DeviceDesc>,
    next_seq: AtomicU64,
    reaped: Mutex<Reaped>,
    reaped_cv: Condvar,
    /// Window offset of each region's replica, from CPU begin_access (remote guests copy
    /// their writes from there into the stream).
    cpu_offsets: Mutex<HashMap<RegionId, u64>>,
    regions: Mutex<HashMap<RegionId, RegionInfo>>,
    closed: AtomicBool,
    submitted: AtomicU64,
    completed: AtomicU64,
    /// One more than the completion count at which a full liveness period waiting at the
    /// pacing window brought no completion (0: none): pacing yields until the next one.
    window_stalled_at: AtomicU64,
    pacer: Mutex<MimdPacer>,
    max_depth: AtomicU32,
}

// SAFETY: the raw window mapping is only touched through SharedWindow's checked accessors and
// atomics; all mutable state is behind mutexes.
unsafe impl Send for Connection {}
// SAFETY: as for Send: shared use goes through checked accessors, atomics and mutexes.
unsafe impl Sync for Connection {}

impl Connection {
    /// Connects to the daemon named by `target`: `tcp:HOST:PORT` (remote guest), `vm` or
    /// `vm:PORT_NAME` (inside a VM: ivshmem window and virtio-serial doorbells), or a Unix
    /// socket path (process guest, optionally written `unix:PATH`).
    pub fn open(target: &str, opts: &ConnectOptions) -> Result<Self> {
        if let Some(addr) = target.strip_prefix("tcp:") {
            Self::connect_tcp(addr, opts)
        } else if target == "vm" || target.starts_with("vm:") {
            let port = target
                .strip_prefix("vm:")
                .unwrap_or(crate::vm::DEFAULT_PORT);
            crate::vm::connect(port, opts)
        } else {
            Self::connect(target.strip_prefix("unix:").unwrap_or(target), opts)
        }
    }

    pub(crate) fn hello_for(opts: &ConnectOptions) -> Hello {
        Hello {
            protocol: PROTOCOL_VERSION,
            name: opts.name.clone(),
            window_size: opts.window_size,
            sq_entries: opts.sq_entries,
            cq_entries: opts.cq_entries,
            token: opts.token.clone(),
            coherence: opts.coherence.clone(),
            resume: None,
        }
    }

    pub(crate) fn welcome_of(reply: Reply) -> Result<(u64, WindowLayout, String, Vec<DeviceDesc>)> {
        match reply {
            Reply::Welcome {
                guest_id,
                layout,
                coherence,
                devices,
                ..
            } => Ok((guest_id, layout, coherence, devices)),
            Reply::Refused { reason } => Err(GuestError::Refused(reason)),
            Reply::Moved { socket } => Err(GuestError::Moved(socket)),
        }
    }

    /// Connects to the daemon listening on the Unix socket `path` (process guest).
    pub fn connect(path: impl AsRef<Path>, opts: &ConnectOptions) -> Result<Self> {
        let path = path.as_ref();
        let sock = UnixStream::connect(path).map_err(|source| GuestError::Connect {
            path: path.display().to_string(),
            source,
        })?;
        let h = Self::handshake_unix(sock, opts, None)?;
        let mut c = Self::with_link(h.link, h.window, h.guest_id, h.coherence, h.devices)?;
        c.origin = Mutex::new(Some((path.to_path_buf(), opts.clone())));
        *c.resume.lock() = h.resume;
        Ok(c)
    }

    /// Connects to a daemon listening on TCP (remote guest). Bulk data goes in the stream;
    /// `opts.token` must match the operator's token.
    pub fn connect_tcp(addr: &str, opts: &ConnectOptions) -> Result<Self> {
        let h = Self::handshake_tcp(addr, opts, None, None)?;
        let mut c = Self::with_link(h.link, h.window, h.guest_id, h.coherence, h.devices)?;
        // Reconnects go to the same address (`tcp:` marks it as one).
        c.origin = Mutex::new(Some((format!("tcp:{addr}").into(), opts.clone())));
        *c.resume.lock() = h.resume;
        Ok(c)
    }

    /// Sets how a VM guest reconnects: over `port`, named `origin` (`vm:NAME`), resuming
    /// with the secret of its welcome.
    pub(crate) fn set_vm_origin(
        &mut self,
        origin: String,
        opts: &ConnectOptions,
        port: Arc<crate::vm::PortHub>,
        resume: Option<String>,
    ) {
        self.origin = Mutex::new(Some((origin.into(), opts.clone())));
        self.vm_port = Mutex::new(Some(port));
        self.resume = Mutex::new(resume);
    }

    pub(crate) fn with_link(
        link: Box<dyn GuestLink>,
        window: Arc<SharedWindow>,
        guest_id: u64,
        coherence: String,
        devices: Vec<DeviceDesc>,
    ) -> Result<Self> {
        let cq_entries = window.layout().cq_entries;
        Ok(Connection {
            link: RwLock::new(Arc::from(link)),
            window: RwLock::new(window),
            guest_id: AtomicU64::new(guest_id),
            origin: Mutex::new(None),
            resume: Mutex::new(None),
            vm_port: Mutex::new(None),
            auto_reconnect: Mutex::new(None),
            reconnecting: Mutex::new(()),
            user_closed: AtomicBool::new(false),
            retired: Mutex::new(Vec::new()),
            replay: Mutex::new(reconnect::Replay::default()),
            track: AtomicBool::new(false),
            coherence,
            devices,
            next_seq: AtomicU64::new(1),
            reaped: Mutex::new(Reaped {
                done: HashMap::new(),
                outstanding: HashSet::new(),
                reaping: false,
                waiters: 0,
                detached: HashSet::new(),
                async_errors: Vec::new(),
            }),
            reaped_cv: Condvar::new(),
            cpu_offsets: Mutex::new(HashMap::new()),
            regions: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            submitted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            window_stalled_at: AtomicU64::new(0),
            pacer: Mutex::new(
                MimdPacer::new(
                    4,
                    PACER_MAX_WINDOW.min(cq_entries).max(4),
                    PACER_TARGET_DEPTH,
                )
                .map_err(GuestError::Pacing)?,
            ),
            max_depth: AtomicU32::new(0),
        })
    }

    /// The id the daemon gave this guest.
    pub fn guest_id(&self) -> u64 {
        self.guest_id.load(Ordering::SeqCst)
    }

    /// The devices the daemon offers (from the welcome).
    pub fn devices(&self) -> &[DeviceDesc] {
        &self.devices
    }

    /// The coherence protocol the daemon runs for this guest.
    pub fn coherence(&self) -> &str {
        &self.coherence
    }

    /// The mapped window (for tests and tools that need raw access). After a reconnect it
    /// is the new daemon's window.
    pub fn window(&self) -> Arc<SharedWindow> {
        self.window.read().clone()
    }

    fn link(&self) -> Arc<dyn GuestLink> {
        self.link.read().clone()
    }

    /// The daemon behind `link` is gone: the connection is closed, unless `link` was already
    /// replaced by a reconnect (another thread's).
    fn mark_closed(&self, link: &Arc<dyn GuestLink>) {
        let current = self.link.read();
        if Arc::ptr_eq(&*current, link) {
            self.closed.store(true, Ordering::SeqCst);
        }
    }

    /// Puts a request on the submission ring; returns its sequence number. Blocks (reaping
    /// completions) while the MIMD window of requests in flight is full.
    pub fn submit(&self, opcode: Opcode, device: DeviceId, args: [u64; 6]) -> Result<u64> {
        self.submit_inner(opcode, device, args, false)
    }

    /// Like [`submit`](Self::submit), but nobody will wait for the completion; a failure is
    /// kept for [`take_async_errors`](Self::take_async_errors).
    pub fn submit_detached(&self, opcode: Opcode, device: DeviceId, args: [u64; 6]) -> Result<u64> {
        self.submit_inner(opcode, device, args, true)
    }

    /// Failures of detached requests since the last call.
    pub fn take_async_errors(&self) -> Vec<(u64, Status)> {
        std::mem::take(&mut self.reaped.lock().async_errors)
    }

    /// The oldest failure of a detached request not taken yet (one at a time, for the C
    /// ABI's `virtsoc_take_async_error`).
    pub fn take_async_error(&self) -> Option<(u64, Status)> {
        let mut r = self.reaped.lock();
        (!r.async_errors.is_empty()).then(|| r.async_errors.remove(0))
    }

    /// Requests submitted and not yet completed.
    pub fn in_flight(&self) -> u64 {
        self.submitted
            .load(Ordering::SeqCst)
            .saturating_sub(self.completed.load(Ordering::SeqCst))
    }

    /// Waits until every submitted request has completed (detached ones included), e.g.
    /// before freeing regions that queued device work still names.
    pub fn drain(&self) -> Result<()> {
        while self.in_flight() > 0 {
            self.reap_once(Some(LIVENESS_CHECK))?;
        }
        Ok(())
    }

    /// Largest host queue depth reported in a completion so far.
    pub fn max_queue_depth(&self) -> u32 {
        self.max_depth.load(Ordering::Relaxed)
    }

    /// The MIMD window right now.
    pub fn pacing_window(&self) -> u32 {
        self.pacer.lock().allowed_in_flight()
    }

    /// Whether a request goes out past the pacing window: a fence signal always does (it
    /// may be what releases the requests in flight: commands parked behind a wait on the
    /// fence), and so does everything while the requests in flight brought no completion for
    /// a whole liveness period (they may be waiting for what this guest sends next), until
    /// the next completion. The daemon takes requests beyond its completion ring (they hold
    /// no slot), so flow control yields instead of deadlocking the session.
    fn window_yields(&self, opcode: Opcode) -> bool {
        opcode == Opcode::FenceSignal
            || self.window_stalled_at.load(Ordering::SeqCst)
                == self.completed.load(Ordering::SeqCst) + 1
    }

    fn submit_inner(
        &self,
        opcode: Opcode,
        device: DeviceId,
        args: [u64; 6],
        detached: bool,
    ) -> Result<u64> {
        self.submit_with(opcode, device, args, detached, &[])
    }

    fn submit_with(
        &self,
        opcode: Opcode,
        device: DeviceId,
        args: [u64; 6],
        detached: bool,
        payload: &[u8],
    ) -> Result<u64> {
        loop {
            if self.closed.load(Ordering::SeqCst) && !self.reconnect_if_allowed()? {
                return Err(GuestError::Closed);
            }
            if self.in_flight() >= self.pacing_window() as u64 && !self.window_yields(opcode) {
                let before = self.completed.load(Ordering::SeqCst);
                self.reap_or_reconnect(Some(LIVENESS_CHECK))?;
                if self.completed.load(Ordering::SeqCst) == before {
                    self.window_stalled_at.store(before + 1, Ordering::SeqCst);
                }
                continue;
            }
            let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
            {
                let mut r = self.reaped.lock();
                r.outstanding.insert(seq);
                if detached {
                    r.detached.insert(seq);
                }
            }
            self.submitted.fetch_add(1, Ordering::SeqCst);
            let req = Request::new(seq, opcode, device, args);
            let (link, epoch) = self.keep_for_replay(&req, payload);
            let pushed = link.push(&req, payload);
            if matches!(pushed, Ok(true)) || !self.unkeep(seq, epoch) {
                // Pushed, or sent again by a reconnect meanwhile.
                return Ok(seq);
            }
            self.submitted.fetch_sub(1, Ordering::SeqCst);
            {
                let mut r = self.reaped.lock();
                r.outstanding.remove(&seq);
                r.detached.remove(&seq);
            }
            if let Err(e) = pushed {
                if matches!(e, GuestError::Closed) {
                    // The daemon went away: the loop reconnects if allowed, else fails.
                    self.mark_closed(&link);
                    continue;
                }
                return Err(e);
            }
            // Ring full: the host is behind. Help by reaping completions, then retry.
            self.reap_or_reconnect(Some(LIVENESS_CHECK))?;
        }
    }

    /// Waits for one reaping round: takes every available completion off the ring.
    fn reap_once(&self, timeout: Option<Duration>) -> Result<()> {
        {
            let mut r = self.reaped.lock();
            if r.reaping {
                r.waiters += 1;
                let mut r = self
                    .reaped_cv
                    .wait_timeout(r, timeout.unwrap_or(LIVENESS_CHECK))
                    .0;
                r.waiters -= 1;
                return Ok(());
            }
            r.reaping = true;
        }
        let result = self.reap_as_reaper(timeout);
        let mut r = self.reaped.lock();
        r.reaping = false;
        if let Ok(batch) = &result {
            self.absorb(&mut r, batch);
        }
        let waiters = r.waiters;
        drop(r);
        if waiters > 0 {
            self.reaped_cv.notify_all();
        }
        result.map(|_| ())
    }

    /// Books a batch of completions: counters, pacing, detached failures, waiters' results.
    fn absorb(&self, r: &mut Reaped, batch: &[Completion]) {
        let known: Vec<Completion> = batch
            .iter()
            .filter(|c| {
                let ours = r.outstanding.remove(&c.seq);
                if !ours {
                    log::warn!("dropped a completion for unknown request {}", c.seq);
                }
                ours
            })
            .copied()
            .collect();
        let batch = &known[..];
        self.forget_replayed(batch);
        self.completed
            .fetch_add(batch.len() as u64, Ordering::SeqCst);
        // One MIMD step per reaping round, driven by the deepest queue it reported.
        if let Some(depth) = batch.iter().map(|c| c.queue_depth).max() {
            self.pacer.lock().on_feedback(depth);
            self.max_depth.fetch_max(depth, Ordering::Relaxed);
        }
        for c in batch {
            if r.detached.remove(&c.seq) {
                if c.status != Status::Ok as u32 {
                    let st = Status::from_u32(c.status).unwrap_or(Status::Internal);
                    r.async_errors.push((c.seq, st));
                }
            } else {
                r.done.insert(c.seq, *c);
            }
        }
    }

    fn reap_as_reaper(&self, timeout: Option<Duration>) -> Result<Vec<Completion>> {
        let link = self.link();
        let arrived = link.reap(timeout.unwrap_or(LIVENESS_CHECK));
        if arrived.is_err() {
            self.mark_closed(&link);
        }
        let mut batch = Vec::new();
        for (c, payload) in arrived? {
            if !payload.is_empty() {
                // A remote CPU read: the bytes of the range, for the mirror window.
                self.window().copy_in(c.values[0], &payload)?;
            }
            batch.push(c);
        }
        Ok(batch)
    }

    /// Waits for the completion of request `seq`.
    pub fn wait(&self, seq: u64) -> Result<Completion> {
        loop {
            {
                let mut r = self.reaped.lock();
                if let Some(c) = r.done.remove(&seq) {
                    return Ok(c);
                }
            }
            self.reap_or_reconnect(None)?;
        }
    }

    /// One reaping round; a daemon found gone is reconnected to when allowed (the requests
    /// in flight are sent again there).
    fn reap_or_reconnect(&self, timeout: Option<Duration>) -> Result<()> {
        match self.reap_once(timeout) {
            Err(GuestError::Closed) if self.reconnect_if_allowed()? => Ok(()),
            r => r,
        }
    }

    /// Submits a request, waits for it, and turns an error status into an error.
    pub fn call(&self, opcode: Opcode, device: DeviceId, args: [u64; 6]) -> Result<[u64; 6]> {
        let seq = self.submit(opcode, device, args)?;
        self.finish(opcode, seq)
    }

    fn finish(&self, opcode: Opcode, seq: u64) -> Result<[u64; 6]> {
        let c = self.wait(seq)?;
        match Status::from_u32(c.status) {
            Some(Status::Ok) => Ok(c.values),
            Some(status) => Err(GuestError::Status {
                op: opcode,
                status,
                reason: c.reason(),
            }),
            None => Err(GuestError::Status {
                op: opcode,
                status: Status::Internal,
                reason: None,
            }),
        }
    }

    /// Hangs up. The daemon releases everything this guest held.
    pub fn close(&self) {
        self.user_closed.store(true, Ordering::SeqCst);
        self.closed.store(true, Ordering::SeqCst);
        self.link().close();
    }

    /// Submits a raw request without waiting (for protocol tests).
    pub fn submit_raw(&self, req: Request) -> Result<()> {
        self.submitted.fetch_add(1, Ordering::SeqCst);
        self.reaped.lock().outstanding.insert(req.seq);
        let pushed = self.link().push(&req, &[]);
        if !matches!(pushed, Ok(true)) {
            self.submitted.fetch_sub(1, Ordering::SeqCst);
            self.reaped.lock().outstanding.remove(&req.seq);
            pushed?;
            return Err(GuestError::Status {
                op: Opcode::Nop,
                status: Status::Busy,
                reason: None,
            });
        }
        Ok(())
    }
}

/// Whether the daemon hung up (non-blocking check of the socket).
fn socket_hung_up(sock: &UnixStream) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        sock,
        rustix::event::PollFlags::IN | rustix::event::PollFlags::HUP,
    )];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match rustix::event::poll(&mut fds, Some(&zero)) {
        Ok(0) => false,
        Ok(_) => {
            // The daemon sends nothing after the handshake: readable means EOF.
            let mut b = [0u8; 1];
            !matches!(rustix::io::read(sock.as_fd(), &mut b), Ok(n) if n > 0)
        }
        Err(_) => true,
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
}
