//! The daemon: accepts guests on the Unix socket, runs the handshake, and owns the SVM
//! manager, the devices and the table of live sessions.

use std::collections::HashMap;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};
use virtsoc_proto::handshake::{
    recv_json_until, send_json, DeviceDesc, Hello, Reply, PROTOCOL_VERSION,
};
use virtsoc_proto::layout::PAGE;
use virtsoc_proto::ring::FutexDoorbell;
use virtsoc_proto::{DeviceId, SharedWindow, WindowLayout};
use virtsoc_svm::{DomainId, ProtocolKind, SvmManager, Topology};

use crate::device::{Device, DeviceSet};
use crate::link::{ShmLink, StreamLink};
use crate::session::Session;
use crate::{HostError, Result};

/// How the daemon is set up.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Unix socket guests connect to.
    pub socket: PathBuf,
    /// Coherence protocol for guests that do not ask for one.
    pub protocol: ProtocolKind,
    /// Largest window a guest may ask for.
    pub max_window: u64,
    /// Host and device memory a guest's replicas may hold.
    pub guest_mem_limit: u64,
    /// Spin iterations before sleeping on a doorbell.
    pub spins: u32,
    /// Tuning of the prefetch engine.
    pub prefetch: virtsoc_prefetch::Config,
    /// Token remote (TCP) guests must present; TCP is refused without one.
    pub token: Option<String>,
    /// Device backends and settings.
    pub devices: crate::device::registry::DeviceConfig,
    /// Time a new connection has to deliver its complete hello (and, on TCP, its token).
    pub handshake_timeout: Duration,
    /// Most connections (handshaking and admitted, Unix and TCP) served at once; more are
    /// refused.
    pub max_connections: usize,
    /// Fault injection for tests: every asynchronous SVM copy waits this long first.
    pub test_dma_delay: Duration,
    /// What one guest may hold and ask for (regions, fences, queues, device objects...).
    pub limits: crate::Limits,
    /// Where sessions are saved on SIGTERM and restored from for reconnecting guests.
    pub state_dir: Option<PathBuf>,
    /// How devices are shared between guests: scheduler and policy (`--scheduler`,
    /// `--policy`).
    pub sharing: crate::device::share::Sharing,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            socket: PathBuf::from("/tmp/virtsoc.sock"),
            protocol: ProtocolKind::WriteInvalidate,
            max_window: 1 << 30,
            guest_mem_limit: 4 << 30,
            spins: 4096,
            prefetch: virtsoc_prefetch::Config::default(),
            token: None,
            devices: Default::default(),
            handshake_timeout: Duration::from_secs(5),
            max_connections: 64,
            test_dma_delay: Duration::ZERO,
            limits: crate::Limits::default(),
            state_dir: None,
            sharing: Default::default(),
        }
    }
}

/// Longest guest name kept (in characters); longer names are cut.
pub const MAX_NAME_CHARS: usize = 64;

/// The guest name as logged and stored: control characters (and invisible formatting
/// characters that could disguise a log line) escaped, at most [`MAX_NAME_CHARS`] characters
/// of the original kept.
pub fn sanitize_name(name: &str) -> String {
    let mut out = String::new();
    let mut chars = name.chars();
    for c in chars.by_ref().take(MAX_NAME_CHARS) {
        let invisible = matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
            | '\u{2028}' | '\u{2029}' | '\u{2066}'..='\u{2069}' | '\u{feff}');
        if c.is_control() || invisible {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if chars.next().is_some() {
        out.push_str("...");
    }
    out
}

/// Refused connections kept open at most this long for the peer's hello to arrive, so the
/// refusal is read instead of the guest's write failing on a closed socket.
const LINGER: Duration = Duration::from_secs(1);
/// Most refused connections lingering at once; beyond that they are closed at once.
const MAX_LINGERING: usize = 256;
/// How long a listener is left alone after an accept error (EMFILE, ENOMEM, ...).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A refused connection waiting for the peer's hello (or a hang-up) before it is closed.
struct Lingering {
    fd: OwnedFd,
    until: Instant,
}

/// State of one listener in the accept loop.
#[derive(Default)]
struct ListenerState {
    /// Not polled again before this instant (after an accept error).
    paused_until: Option<Instant>,
    /// An accept error was logged and no connection was accepted since.
    failing: bool,
}

/// One connection counted against `max_connections`; released when dropped.
struct ConnSlot(Arc<Daemon>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
static FAIL_SPAWNS: AtomicUsize = AtomicUsize::new(0);

/// Starts a named thread (tests can make the next few starts fail).
fn spawn_thread(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    #[cfg(test)]
    if FAIL_SPAWNS
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        drop(f);
        return Err(std::io::Error::from_raw_os_error(
            rustix::io::Errno::AGAIN.raw_os_error(),
        ));
    }
    std::thread::Builder::new().name(name.into()).spawn(f)
}

/// A session that ended and is still referenced.
#[derive(Debug, Clone)]
pub struct LingeringSession {
    pub guest: u64,
    /// References to it besides the daemon's list.
    pub references: usize,
    /// Devices whose worker still lists one of its queues.
    pub device_queues: Vec<String>,
    /// When it left.
    pub ended: Instant,
}

/// The host daemon.
pub struct Daemon {
    cfg: DaemonConfig,
    svm: Arc<SvmManager>,
    devices: Arc<DeviceSet>,
    sessions: Mutex<HashMap<u64, Arc<Session>>>,
    /// Sessions that left, weakly: one still alive here is a leak (something kept it).
    departed: Mutex<Vec<(Weak<Session>, Instant)>>,
    sessions_gone: Condvar,
    next_guest: AtomicU64,
    /// Connections being served (handshaking or admitted).
    connections: AtomicUsize,
    /// Each admitted guest's transport and coherence protocol (for the control API).
    guest_meta: Mutex<HashMap<u64, (&'static str, ProtocolKind)>>,
    /// Resume secrets and sessions saved by a previous run (`--state-dir`).
    restart: crate::snapshot::restart::Restart,
}

impl Daemon {
    /// Builds the memory domains and devices and starts the device workers.
    pub fn new(cfg: DaemonConfig) -> Result<Arc<Self>> {
        crate::set_memory_policy();
        // FFmpeg's init and log level, before any device opens a codec or scaler.
        virtsoc_media::quiet_ffmpeg_logs();
        let mut topo = Topology::new();
        let devices = crate::device::registry::build(&cfg.devices, &cfg.limits)?;
        // One domain per physical device's memory: devices naming the same domain share it.
        let mut domains: Vec<(String, DomainId)> = Vec::new();
        let with_domains: Vec<(DeviceId, DomainId, Arc<dyn Device>)> = devices
            .into_iter()
            .map(|(id, d)| {
                let name = d.memory_domain().to_string();
                let dom = match domains.iter().find(|(n, _)| *n == name) {
                    Some((_, dom)) => *dom,
                    None => {
                        let dom = topo.add_device_domain(&name);
                        domains.push((name, dom));
                        dom
                    }
                };
                (id, dom, d)
            })
            .collect();
        let svm = Arc::new(SvmManager::with_prefetch_config(topo, cfg.prefetch));
        svm.set_dma_delay(cfg.test_dma_delay);
        for (_, dom, d) in &with_domains {
            if let Some(a) = d.allocator() {
                svm.set_allocator(*dom, a);
            }
        }
        let restart = match &cfg.state_dir {
            Some(dir) => crate::snapshot::restart::Restart::load(dir)?,
            None => Default::default(),
        };
        let devices = Arc::new(DeviceSet::start_shared(
            svm.clone(),
            with_domains,
            cfg.sharing.clone(),
        ));
        Ok(Arc::new(Daemon {
            restart,
            cfg,
            svm,
            devices,
            sessions: Mutex::new(HashMap::new()),
            departed: Mutex::new(Vec::new()),
            sessions_gone: Condvar::new(),
            next_guest: AtomicU64::new(1),
            connections: AtomicUsize::new(0),
            guest_meta: Mutex::new(HashMap::new()),
        }))
    }

    /// The SVM manager.
    pub fn svm(&self) -> &Arc<SvmManager> {
        &self.svm
    }

    /// The devices.
    pub fn devices(&self) -> &Arc<DeviceSet> {
        &self.devices
    }

    /// Number of connections being served (handshaking or admitted).
    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Resume secrets and saved sessions.
    pub fn restart(&self) -> &crate::snapshot::restart::Restart {
        &self.restart
    }

    /// The configuration.
    pub fn config(&self) -> &DaemonConfig {
        &self.cfg
    }

    /// The live sessions.
    pub fn sessions(&self) -> Vec<Arc<Session>> {
        let s = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        s.values().cloned().collect()
    }

    /// The transport (`unix`, `tcp`, `vm`) and coherence protocol of guest `id`.
    pub fn guest_meta(&self, id: u64) -> Option<(&'static str, ProtocolKind)> {
        let m = self.guest_meta.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&id).copied()
    }

    fn note_transport(&self, id: u64, transport: &'static str) {
        let mut m = self.guest_meta.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = m.get_mut(&id) {
            e.0 = transport;
        }
    }

    /// Closes guest `id`'s session (its connection then cleans up as on a hang-up); `false`
    /// if there is no such guest.
    pub fn kill(&self, id: u64) -> bool {
        let s = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let session = s.get(&id).cloned();
        drop(s);
        match session {
            Some(session) => {
                log::info!("guest {id} ({}) killed by the control API", session.name());
                session.close();
                true
            }
            None => false,
        }
    }

    /// Number of live sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// Accepts guests on the Unix socket (and on `tcp`, for remote guests) until `stop`
    /// becomes readable, then closes every session.
    pub fn serve(
        self: &Arc<Self>,
        listener: UnixListener,
        tcp: Option<TcpListener>,
        stop: OwnedFd,
    ) -> Result<()> {
        listener.set_nonblocking(true)?;
        if let Some(t) = &tcp {
            if self.cfg.token.is_none() {
                return Err(HostError::Config(
                    "remote guests need a token: give --token-file".into(),
                ));
            }
            t.set_nonblocking(true)?;
            log::info!("virtsocd accepting remote guests on {}", t.local_addr()?);
        }
        log::info!(
            "virtsocd listening on {} (default coherence {})",
            self.cfg.socket.display(),
            self.cfg.protocol
        );
        let mut lingering: Vec<Lingering> = Vec::new();
        let (mut unix_state, mut tcp_state) = (ListenerState::default(), ListenerState::default());
        loop {
            let now = Instant::now();
            // Close refused connections whose time is up.
            lingering.retain(|l| l.until > now);
            let unix_on = unix_state.resume(now);
            let tcp_on = tcp.is_some() && tcp_state.resume(now);
            let wake = lingering
                .iter()
                .map(|l| l.until)
                .chain(unix_state.paused_until)
                .chain(tcp_state.paused_until.filter(|_| tcp.is_some()))
                .min();
            let mut fds = vec![PollFd::new(&stop, PollFlags::IN)];
            if unix_on {
                fds.push(PollFd::new(&listener, PollFlags::IN));
            }
            if let (Some(t), true) = (&tcp, tcp_on) {
                fds.push(PollFd::new(t, PollFlags::IN));
            }
            let first_lingering = fds.len();
            fds.extend(lingering.iter().map(|l| PollFd::new(&l.fd, PollFlags::IN)));
            let timeout = wake.map(|w| {
                let left = w.saturating_duration_since(now) + Duration::from_millis(1);
                rustix::time::Timespec {
                    tv_sec: left.as_secs() as i64,
                    tv_nsec: left.subsec_nanos() as _,
                }
            });
            match poll(&mut fds, timeout.as_ref()) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    // ENOMEM: nothing to do but wait for memory; never exit over it.
                    log::warn!("poll failed: {e}; retrying");
                    drop(fds);
                    std::thread::sleep(ACCEPT_BACKOFF);
                    continue;
                }
            }
            if !fds[0].revents().is_empty() {
                break;
            }
            // A refused peer's hello (or hang-up) arrived: it has the refusal, close.
            let answered: Vec<bool> = fds[first_lingering..]
                .iter()
                .map(|f| !f.revents().is_empty())
                .collect();
            drop(fds);
            let mut i = 0;
            lingering.retain(|_| {
                i += 1;
                !answered.get(i - 1).copied().unwrap_or(false)
            });
            if unix_on {
                unix_state.accept_all(
                    "guest",
                    || listener.accept().map(|(s, _)| s),
                    |stream| {
                        self.start_connection(stream, "guest-conn", &mut lingering, |me, s| {
                            me.unix_connection(s)
                        })
                    },
                );
            }
            if let (Some(t), true) = (&tcp, tcp_on) {
                tcp_state.accept_all(
                    "remote guest",
                    || t.accept(),
                    |(stream, peer)| {
                        self.start_connection(
                            stream,
                            "remote-conn",
                            &mut lingering,
                            move |me, s| me.tcp_connection(s, peer),
                        )
                    },
                );
            }
        }
        self.shutdown();
        Ok(())
    }

    /// Sessions that left but are still referenced. A session is released once its last
    /// device reply is sent, so one listed here for long is a leak.
    pub fn lingering_sessions(&self) -> Vec<LingeringSession> {
        let departed: Vec<(Arc<Session>, Instant)> = self
            .departed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(w, t)| Some((w.upgrade()?, *t)))
            .collect();
        departed
            .iter()
            .map(|(s, ended)| LingeringSession {
                guest: s.guest_id(),
                // Minus the reference taken here.
                references: Arc::strong_count(s) - 1,
                device_queues: self.devices.holders(s),
                ended: *ended,
            })
            .collect()
    }

    /// Closes every session, waits (bounded) for their cleanup, and stops the devices.
    pub fn shutdown(&self) {
        if let Some(dir) = &self.cfg.state_dir {
            let n = self.restart.save_all(self, dir);
            log::info!("{n} sessions saved to {}", dir.display());
        }
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        for s in sessions.values() {
            s.close();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !sessions.is_empty() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                log::warn!("{} sessions did not finish cleanup", sessions.len());
                break;
            }
            sessions = self
                .sessions_gone
                .wait_timeout(sessions, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        drop(sessions);
        let old = Duration::from_secs(1);
        for l in self.lingering_sessions() {
            if l.ended.elapsed() < old {
                continue; // still finishing its last reply
            }
            log::warn!(
                "guest {} left {:?} ago and its session is still referenced {} times \
                 (device queues holding it: {:?})",
                l.guest,
                l.ended.elapsed(),
                l.references,
                l.device_queues
            );
        }
        self.devices.stop();
        log::info!("virtsocd stopped");
    }

    fn refuse(stream: &impl AsFd, reason: String) {
        log::warn!("refusing guest: {reason}");
        let _ = send_json(stream, &Reply::Refused { reason }, None);
    }

    /// Serves a new connection on its own thread, unless the daemon is at its connection
    /// limit or cannot start a thread: then the connection alone is refused.
    fn start_connection<S>(
        self: &Arc<Self>,
        stream: S,
        thread: &str,
        lingering: &mut Vec<Lingering>,
        serve: impl FnOnce(Arc<Self>, S) + Send + 'static,
    ) where
        S: Into<OwnedFd> + Send + 'static,
    {
        let max = self.cfg.max_connections;
        if self.connections.fetch_add(1, Ordering::SeqCst) >= max {
            self.connections.fetch_sub(1, Ordering::SeqCst);
            return Self::refuse_at_once(
                stream.into(),
                format!("too many connections: the daemon serves at most {max} at once"),
                lingering,
            );
        }
        let slot = ConnSlot(self.clone());
        // The stream goes to the thread once it runs, so a failed start leaves it here.
        let (tx, rx) = std::sync::mpsc::sync_channel::<S>(1);
        let started = spawn_thread(thread, move || {
            if let Ok(stream) = rx.recv() {
                let me = slot.0.clone();
                serve(me, stream);
            }
            drop(slot);
        });
        match started {
            Ok(_) => {
                let _ = tx.send(stream);
            }
            Err(e) => {
                log::warn!("cannot start a thread for a connection: {e}");
                Self::refuse_at_once(
                    stream.into(),
                    format!("daemon overloaded: cannot start a connection thread ({e})"),
                    lingering,
                );
            }
        }
    }

    /// Refuses a connection from the accept loop without blocking it: the refusal is queued
    /// on the fresh socket, which is closed once the peer's hello arrives (or after a second).
    fn refuse_at_once(fd: OwnedFd, reason: String, lingering: &mut Vec<Lingering>) {
        static LAST_LOG: Mutex<Option<(Instant, u64)>> = Mutex::new(None);
        {
            // One log line a second at most: a flood must not flood the log too.
            let mut last = LAST_LOG.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            match &mut *last {
                Some((at, skipped)) if now.duration_since(*at) < Duration::from_secs(1) => {
                    *skipped += 1
                }
                other => {
                    let skipped = other.map(|(_, n)| n).unwrap_or(0);
                    if skipped > 0 {
                        log::warn!("refusing connection: {reason} (and {skipped} more before)");
                    } else {
                        log::warn!("refusing connection: {reason}");
                    }
                    *other = Some((now, 0));
                }
            }
        }
        let _ = rustix::io::ioctl_fionbio(&fd, true);
        let _ = send_json(&fd, &Reply::Refused { reason }, None);
        if lingering.len() < MAX_LINGERING {
            lingering.push(Lingering {
                fd,
                until: Instant::now() + LINGER,
            });
        }
    }

    /// Checks a hello and sets up the guest: its window and its SVM state. Nothing is
    /// allocated for a hello that fails the checks.
    fn admit(&self, hello: &Hello) -> std::result::Result<Admitted, String> {
        let kind = self.check_hello(hello)?;
        let entries = |n: u32| n.clamp(8, 4096).next_power_of_two();
        let size = hello
            .window_size
            .clamp(1 << 20, self.cfg.max_window)
            .div_ceil(PAGE)
            * PAGE;
        let layout = WindowLayout::new(size, entries(hello.sq_entries), entries(hello.cq_entries))
            .map_err(|e| e.to_string())?;
        let guest_id = self.next_guest.fetch_add(1, Ordering::Relaxed);
        let window = SharedWindow::create_memfd(&format!("virtsoc-guest-{guest_id}"), layout)
            .map_err(|e| format!("cannot create window: {e}"))?;
        self.admit_with(guest_id, kind, Arc::new(window), &hello.name)
    }

    /// Sets up a guest whose window already exists (a VM's ivshmem memory).
    /// `name` (as the guest gave it) picks its policy's memory limit, if lower than the
    /// daemon's.
    pub(crate) fn admit_with(
        &self,
        guest_id: u64,
        kind: ProtocolKind,
        window: Arc<SharedWindow>,
        name: &str,
    ) -> std::result::Result<Admitted, String> {
        let policy = self.cfg.sharing.policy.current();
        let limit = policy
            .for_guest(&sanitize_name(name))
            .memory_limit
            .map_or(self.cfg.guest_mem_limit, |m| {
                m.min(self.cfg.guest_mem_limit)
            });
        self.svm
            .attach_guest_limited(
                guest_id,
                window.clone(),
                self.svm.protocol(kind),
                limit,
                self.cfg.limits.regions,
            )
            .map_err(|e| e.to_string())?;
        self.guest_meta
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(guest_id, ("vm", kind));
        Ok(Admitted {
            guest_id,
            layout: window.layout(),
            window,
            kind,
        })
    }

    /// A fresh guest id.
    pub(crate) fn next_guest_id(&self) -> u64 {
        self.next_guest.fetch_add(1, Ordering::Relaxed)
    }

    /// Checks the protocol version and the coherence protocol a guest asks for.
    pub(crate) fn check_hello(&self, hello: &Hello) -> std::result::Result<ProtocolKind, String> {
        if hello.protocol != PROTOCOL_VERSION {
            return Err(format!(
                "protocol {} not supported (daemon speaks {PROTOCOL_VERSION})",
                hello.protocol
            ));
        }
        match hello.coherence.as_deref().map(str::parse::<ProtocolKind>) {
            None => Ok(self.cfg.protocol),
            Some(Ok(k)) => Ok(k),
            Some(Err(e)) => Err(e.to_string()),
        }
    }

    pub(crate) fn welcome(&self, a: &Admitted) -> Reply {
        let topo = self.svm.engine().topology();
        Reply::Welcome {
            guest_id: a.guest_id,
            layout: a.layout,
            coherence: a.kind.name().to_string(),
            devices: self
                .devices
                .iter()
                .map(|s| DeviceDesc {
                    id: s.id.0,
                    name: s.device.name().to_string(),
                    backend: s.device.backend(),
                    domain: topo
                        .info(s.domain)
                        .map(|i| i.name.clone())
                        .unwrap_or_default(),
                    domain_id: s.domain.0,
                })
                .collect(),
            resume: None,
        }
    }

    pub(crate) fn register(&self, session: &Arc<Session>) {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session.guest_id(), session.clone());
    }

    pub(crate) fn unregister(&self, guest_id: u64) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = sessions.remove(&guest_id) {
            let mut departed = self.departed.lock().unwrap_or_else(|p| p.into_inner());
            departed.retain(|(w, _)| w.strong_count() > 0);
            departed.push((Arc::downgrade(&s), Instant::now()));
        }
        self.restart.forget(guest_id);
        self.guest_meta
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&guest_id);
        self.sessions_gone.notify_all();
    }

    /// A process guest: handshake, the window passed as a memfd, futex doorbells; then the
    /// connection thread watches the socket for the hang-up.
    fn unix_connection(self: Arc<Self>, mut stream: UnixStream) {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_write_timeout(Some(self.cfg.handshake_timeout));
        let deadline = Instant::now() + self.cfg.handshake_timeout;
        let hello: Hello = match recv_json_until(&stream, deadline) {
            Ok((h, _)) => h,
            Err(virtsoc_proto::ProtoError::Closed) => {
                return log::debug!("connection closed before its hello")
            }
            Err(e) => return Self::refuse(&stream, format!("bad hello: {e}")),
        };
        let name = sanitize_name(&hello.name);
        let a = match self.admit(&hello) {
            Ok(a) => a,
            Err(reason) => return Self::refuse(&stream, reason),
        };
        let guest_id = a.guest_id;
        self.note_transport(guest_id, "unix");
        let hangup = match stream.try_clone() {
            Ok(s) => s,
            Err(e) => {
                log::warn!("guest {guest_id}: {e}");
                self.svm.detach_guest(guest_id);
                return;
            }
        };
        let link = ShmLink::new(
            a.window.clone(),
            Box::new(FutexDoorbell::host_bell(&a.window, self.cfg.spins)),
            Box::new(FutexDoorbell::guest_bell(&a.window, self.cfg.spins)),
            Box::new(move || {
                let _ = hangup.shutdown(std::net::Shutdown::Both);
            }),
        );
        log::info!(
            "guest {guest_id} ({name}) connected: window {} MiB, coherence {}",
            a.layout.size >> 20,
            a.kind
        );
        let session = Session::new(
            guest_id,
            name,
            a.window.clone(),
            Arc::new(link),
            &self.cfg.limits,
        );
        // Registered before the guest hears it was admitted, so that anything it does next
        // (or a control request about it) finds its session.
        self.register(&session);
        let mut welcome = self.welcome(&a);
        match self.restart.admit(&self, &session, hello.resume.as_deref()) {
            Ok(secret) => {
                if let Reply::Welcome { resume, .. } = &mut welcome {
                    *resume = Some(secret);
                }
            }
            Err(refusal) => {
                // Answered before the session's close hangs the socket up.
                match refusal {
                    crate::snapshot::restart::Refusal::Refused(reason) => {
                        Self::refuse(&stream, reason)
                    }
                    crate::snapshot::restart::Refusal::Moved(socket) => {
                        let _ = send_json(&stream, &Reply::Moved { socket }, None);
                    }
                }
                self.unregister(guest_id);
                session.close();
                self.svm.detach_guest(guest_id);
                return;
            }
        }
        if let Err(e) = send_json(&stream, &welcome, Some(a.window.fd())) {
            log::warn!("guest {guest_id}: handshake failed: {e}");
            self.unregister(guest_id);
            session.close();
            self.svm.detach_guest(guest_id);
            return;
        }
        let _ = stream.set_write_timeout(None);
        let runner = {
            let (s, svm, dev) = (session.clone(), self.svm.clone(), self.devices.clone());
            spawn_thread(&format!("guest-{guest_id}"), move || s.run(svm, dev))
        };
        match runner {
            Ok(runner) => {
                // Watch for the hang-up: a crashed guest's socket reads EOF.
                let mut buf = [0u8; 64];
                while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                session.close();
                let _ = runner.join();
            }
            Err(e) => {
                log::warn!("guest {guest_id}: cannot start session: {e}");
                session.close();
                self.svm.detach_guest(guest_id);
            }
        }
        self.unregister(guest_id);
    }

    /// A remote guest: the token is checked before anything is allocated; then requests,
    /// completions and CPU-access bytes travel as frames on the stream.
    fn tcp_connection(self: Arc<Self>, stream: TcpStream, peer: std::net::SocketAddr) {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_write_timeout(Some(self.cfg.handshake_timeout));
        // The hello, token included, must be complete by the deadline.
        let deadline = Instant::now() + self.cfg.handshake_timeout;
        let hello: Hello = match recv_json_until(&stream, deadline) {
            Ok((h, _)) => h,
            Err(virtsoc_proto::ProtoError::Closed) => {
                return log::debug!("remote connection from {peer} closed before its hello")
            }
            Err(e) => return Self::refuse(&stream, format!("bad hello from {peer}: {e}")),
        };
        let authorized = match (&self.cfg.token, &hello.token) {
            (Some(want), Some(got)) => constant_time_eq(want.as_bytes(), got.as_bytes()),
            _ => false,
        };
        if !authorized {
            return Self::refuse(
                &stream,
                format!("remote guest {peer}: bad or missing token"),
            );
        }
        let name = sanitize_name(&hello.name);
        let a = match self.admit(&hello) {
            Ok(a) => a,
            Err(reason) => return Self::refuse(&stream, reason),
        };
        let guest_id = a.guest_id;
        self.note_transport(guest_id, "tcp");
        let link = match send_json(&stream, &self.welcome(&a), None)
            .map_err(|e| e.to_string())
            .and_then(|_| stream.set_write_timeout(None).map_err(|e| e.to_string()))
            .and_then(|_| {
                StreamLink::new(
                    stream,
                    a.layout.size,
                    self.cfg.limits.remote_bytes_in_flight,
                )
                .map_err(|e| e.to_string())
            }) {
            Ok(l) => l,
            Err(e) => {
                log::warn!("guest {guest_id}: handshake failed: {e}");
                self.svm.detach_guest(guest_id);
                return;
            }
        };
        log::info!(
            "remote guest {guest_id} ({name}) connected from {peer}, coherence {}",
            a.kind
        );
        let session = Session::new(guest_id, name, a.window, Arc::new(link), &self.cfg.limits);
        self.register(&session);
        session.run(self.svm.clone(), self.devices.clone());
        self.unregister(guest_id);
    }
}

impl ListenerState {
    /// Whether the listener is polled now (its back-off, if any, is over).
    fn resume(&mut self, now: Instant) -> bool {
        match self.paused_until {
            Some(t) if t > now => false,
            _ => {
                self.paused_until = None;
                true
            }
        }
    }

    /// Accepts every pending connection. Errors other than "none left", EINTR and
    /// ECONNABORTED (fd or memory exhaustion) are logged once and pause the listener briefly
    /// instead of making the loop spin on a listener that stays readable.
    fn accept_all<S>(
        &mut self,
        what: &str,
        mut accept: impl FnMut() -> std::io::Result<S>,
        mut start: impl FnMut(S),
    ) {
        use std::io::ErrorKind;
        loop {
            match accept() {
                Ok(s) => {
                    if std::mem::take(&mut self.failing) {
                        log::info!("accepting {what} connections again");
                    }
                    start(s);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    if !std::mem::replace(&mut self.failing, true) {
                        log::warn!(
                            "cannot accept {what} connections: {e}; retrying every {} ms",
                            ACCEPT_BACKOFF.as_millis()
                        );
                    }
                    self.paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }
}

/// What `admit` set up for a guest.
pub(crate) struct Admitted {
    pub(crate) guest_id: u64,
    pub(crate) layout: WindowLayout,
    pub(crate) window: Arc<SharedWindow>,
    pub(crate) kind: ProtocolKind,
}

/// Compares two byte strings in time independent of where they differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn guest_names_are_sanitized() {
        assert_eq!(sanitize_name("camera-app"), "camera-app");
        assert_eq!(
            sanitize_name("x\r\nFAKE LOG LINE\u{1b}[31m"),
            "x\\r\\nFAKE LOG LINE\\u{1b}[31m"
        );
        assert!(!sanitize_name("a\u{202e}b").contains('\u{202e}'));
        let long = sanitize_name(&"é".repeat(1000));
        assert_eq!(long, format!("{}...", "é".repeat(MAX_NAME_CHARS)));
    }

    fn hello(name: &str) -> Hello {
        Hello {
            protocol: PROTOCOL_VERSION,
            name: name.into(),
            window_size: 1 << 20,
            sq_entries: 8,
            cq_entries: 8,
            token: None,
            coherence: None,
            resume: None,
        }
    }

    /// A connection whose thread cannot start is refused; the daemon keeps serving.
    #[test]
    fn a_failed_thread_start_refuses_only_that_connection() {
        let dir = std::env::temp_dir().join(format!("virtsoc-daemon-ut-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("d.sock");
        let _ = std::fs::remove_file(&socket);
        let daemon = Daemon::new(DaemonConfig {
            socket: socket.clone(),
            devices: crate::device::registry::DeviceConfig {
                gpu: "null".into(),
                isp: "null".into(),
                ..Default::default()
            },
            ..DaemonConfig::default()
        })
        .unwrap();
        let listener = UnixListener::bind(&socket).unwrap();
        let (stop_rx, stop_tx) = UnixStream::pair().unwrap();
        let server = {
            let d = daemon.clone();
            std::thread::spawn(move || d.serve(listener, None, OwnedFd::from(stop_rx)))
        };
        FAIL_SPAWNS.store(1, Ordering::SeqCst);
        let s = UnixStream::connect(&socket).unwrap();
        send_json(&s, &hello("first"), None).unwrap();
        let (reply, _): (Reply, _) = virtsoc_proto::handshake::recv_json(&s).unwrap();
        assert!(
            matches!(&reply, Reply::Refused { reason } if reason.contains("thread")),
            "{reply:?}"
        );
        let s = UnixStream::connect(&socket).unwrap();
        send_json(&s, &hello("second"), None).unwrap();
        let (reply, fd): (Reply, _) = virtsoc_proto::handshake::recv_json(&s).unwrap();
        assert!(matches!(reply, Reply::Welcome { .. }), "{reply:?}");
        assert!(fd.is_some());
        drop((s, fd));
        rustix::io::write(&stop_tx, b"x").unwrap();
        server.join().unwrap().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while daemon.connection_count() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(daemon.connection_count(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
