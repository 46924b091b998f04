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
use virtsoc_svm::GuestId;

use rustix::event::{poll, PollFd, PollFlags};
use virtsoc_proto::handshake::{
    recv_json_until, send_json, DeviceDesc, Hello, Reply, PROTOCOL_VERSION,
};
use virtsoc_proto::ring::FutexDoorbell;
use virtsoc_proto::window_layout::PAGE;
use virtsoc_proto::{SharedWindow, WindowLayout};
use virtsoc_svm::{ProtocolKind, SvmManager, Topology};
use virtsoc_sync::{CondvarExt, LockExt};

use crate::device::DeviceSet;
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
    /// Most guests (Unix and TCP) served at once; more are refused. Connections still in
    /// their handshake do not count: they are held to budgets of their own
    /// ([`admission`]).
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
    /// The live view's CPU budget: percent of the daemon's other CPU its viewers may use
    /// (`--view-budget`; 0: unpaced). See [`virtsoc_control::budget`].
    pub view_budget_pct: f64,
    /// Which guest may use which host service (`--services-policy`, JSON); every guest may
    /// use every service without one.
    pub services_policy: Option<PathBuf>,
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
            view_budget_pct: virtsoc_control::budget::DEFAULT_PCT,
            services_policy: None,
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

#[cfg(test)]
static FAIL_SPAWNS: AtomicUsize = AtomicUsize::new(0);
/// The same for the next few session threads (`guest-N`) only.
#[cfg(test)]
static FAIL_SESSION_SPAWNS: AtomicUsize = AtomicUsize::new(0);

/// Starts a named thread (tests can make the next few starts fail).
fn spawn_thread(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    #[cfg(test)]
    if FAIL_SPAWNS
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
        || (name
            .strip_prefix("guest-")
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            && FAIL_SESSION_SPAWNS
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok())
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
    /// The ended session's guest id.
    pub guest: GuestId,
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
    sessions: Mutex<HashMap<GuestId, Arc<Session>>>,
    /// Sessions that left, weakly: one still alive here is a leak (something kept it).
    departed: Mutex<Vec<(Weak<Session>, Instant)>>,
    sessions_gone: Condvar,
    next_guest: AtomicU64,
    /// Guests admitted (their handshake read) and being served.
    connections: AtomicUsize,
    /// Connections waiting for their handshake, with their budgets.
    pending: Arc<admission::Pending>,
    /// Each admitted guest's transport and coherence protocol (for the control API).
    guest_meta: Mutex<HashMap<GuestId, (&'static str, ProtocolKind)>>,
    /// Resume secrets and sessions saved by a previous run (`--state-dir`).
    restart: crate::snapshot::restart::Restart,
    /// The host services' device (also in `devices`): its hypervisor takes host programs'
    /// registrations, and migrations quiesce and hand over its channels.
    services: Arc<crate::services::ServiceDevice>,
}

impl Daemon {
    /// Builds the memory domains and devices and starts the device workers.
    pub fn new(cfg: DaemonConfig) -> Result<Arc<Self>> {
        crate::set_memory_policy();
        // FFmpeg's init and log level, before any device opens a codec or scaler.
        virtsoc_media::quiet_ffmpeg_logs();
        let mut topo = Topology::new();
        let mut devices = crate::device::registry::build(&cfg.devices, &cfg.limits)?;
        let services = Arc::new(crate::services::ServiceDevice::new(
            cfg.services_policy.as_deref(),
        )?);
        devices.push((virtsoc_devapi::service::ID, services.clone()));
        let with_domains = crate::device::registry::with_domains(devices, &mut topo);
        let svm = Arc::new(SvmManager::with_prefetch_config(topo, cfg.prefetch));
        svm.set_dma_delay(cfg.test_dma_delay);
        for (_, dom, d) in &with_domains {
            if let Some(a) = d.allocator() {
                svm.set_allocator(*dom, a);
            }
            if d.shares_memory() {
                svm.set_shared_memory(*dom);
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
        let daemon = Arc::new(Daemon {
            restart,
            cfg,
            svm,
            devices,
            sessions: Mutex::new(HashMap::new()),
            departed: Mutex::new(Vec::new()),
            sessions_gone: Condvar::new(),
            next_guest: AtomicU64::new(1),
            connections: AtomicUsize::new(0),
            pending: Arc::new(admission::Pending::default()),
            guest_meta: Mutex::new(HashMap::new()),
            services: services.clone(),
        });
        services.attach_daemon(&daemon);
        Ok(daemon)
    }

    /// The host services' device.
    pub fn services(&self) -> &Arc<crate::services::ServiceDevice> {
        &self.services
    }

    /// The service hypervisor (host programs register their services with it).
    pub fn service_hypervisor(&self) -> Arc<virtsoc_services::hypervisor::Hypervisor> {
        self.services.hypervisor().clone()
    }

    /// The SVM manager.
    pub fn svm(&self) -> &Arc<SvmManager> {
        &self.svm
    }

    /// The devices.
    pub fn devices(&self) -> &Arc<DeviceSet> {
        &self.devices
    }

    /// Number of guests admitted and being served (connections still in their handshake
    /// are not counted: see [`pending_count`](Self::pending_count)).
    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Number of connections waiting for their handshake.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
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
        let s = self.sessions.lock_or_recover();
        s.values().cloned().collect()
    }

    /// The transport (`unix`, `tcp`, `vm`) and coherence protocol of guest `id`.
    pub fn guest_meta(&self, id: GuestId) -> Option<(&'static str, ProtocolKind)> {
        let m = self.guest_meta.lock_or_recover();
        m.get(&id).copied()
    }

    fn note_transport(&self, id: GuestId, transport: &'static str) {
        let mut m = self.guest_meta.lock_or_recover();
        if let Some(e) = m.get_mut(&id) {
            e.0 = transport;
        }
    }

    /// Closes guest `id`'s session (its connection then cleans up as on a hang-up); `false`
    /// if there is no such guest.
    pub fn kill(&self, id: GuestId) -> bool {
        let s = self.sessions.lock_or_recover();
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
        self.sessions.lock_or_recover().len()
    }

    /// Sessions that left but are still referenced. A session is released once its last
    /// device reply is sent, so one listed here for long is a leak.
    pub fn lingering_sessions(&self) -> Vec<LingeringSession> {
        let departed: Vec<(Arc<Session>, Instant)> = self
            .departed
            .lock_or_recover()
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
        let mut sessions = self.sessions.lock_or_recover();
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
            sessions = self.sessions_gone.wait_timeout_or_recover(sessions, left).0;
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

    /// Checks a hello and sets up the guest: its window and its SVM state. Nothing is
    /// allocated for a hello that fails the checks.
    fn admit(&self, hello: &Hello) -> std::result::Result<Admitted, AdmitError> {
        let kind = self.check_hello(hello)?;
        let entries = |n: u32| n.clamp(8, 4096).next_power_of_two();
        let size = hello
            .window_size
            .clamp(1 << 20, self.cfg.max_window)
            .div_ceil(PAGE)
            * PAGE;
        let layout = WindowLayout::new(size, entries(hello.sq_entries), entries(hello.cq_entries))
            .map_err(AdmitError::Layout)?;
        let guest_id = GuestId(self.next_guest.fetch_add(1, Ordering::Relaxed));
        let window = SharedWindow::create_memfd(&format!("virtsoc-guest-{guest_id}"), layout)
            .map_err(AdmitError::Window)?;
        self.admit_with(guest_id, kind, Arc::new(window), &hello.name)
    }

    /// Sets up a guest whose window already exists (a VM's ivshmem memory).
    /// `name` (as the guest gave it) picks its policy's memory limit, if lower than the
    /// daemon's.
    pub(crate) fn admit_with(
        &self,
        guest_id: GuestId,
        kind: ProtocolKind,
        window: Arc<SharedWindow>,
        name: &str,
    ) -> std::result::Result<Admitted, AdmitError> {
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
            .map_err(AdmitError::Attach)?;
        self.guest_meta
            .lock_or_recover()
            .insert(guest_id, ("vm", kind));
        Ok(Admitted {
            guest_id,
            layout: window.layout(),
            window,
            kind,
        })
    }

    /// A fresh guest id.
    pub(crate) fn next_guest_id(&self) -> GuestId {
        GuestId(self.next_guest.fetch_add(1, Ordering::Relaxed))
    }

    /// Checks the protocol version and the coherence protocol a guest asks for.
    pub(crate) fn check_hello(
        &self,
        hello: &Hello,
    ) -> std::result::Result<ProtocolKind, AdmitError> {
        if hello.protocol != PROTOCOL_VERSION {
            return Err(AdmitError::Protocol {
                asked: hello.protocol,
            });
        }
        match hello.coherence.as_deref().map(str::parse::<ProtocolKind>) {
            None => Ok(self.cfg.protocol),
            Some(Ok(k)) => Ok(k),
            Some(Err(e)) => Err(AdmitError::Coherence(e)),
        }
    }

    pub(crate) fn welcome(&self, a: &Admitted) -> Reply {
        let topo = self.svm.engine().topology();
        Reply::Welcome {
            guest_id: a.guest_id.0,
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
            .lock_or_recover()
            .insert(session.guest_id(), session.clone());
    }

    pub(crate) fn unregister(&self, guest_id: GuestId) {
        let mut sessions = self.sessions.lock_or_recover();
        if let Some(s) = sessions.remove(&guest_id) {
            let mut departed = self.departed.lock_or_recover();
            departed.retain(|(w, _)| w.strong_count() > 0);
            departed.push((Arc::downgrade(&s), Instant::now()));
        }
        self.restart.forget(guest_id);
        self.guest_meta.lock_or_recover().remove(&guest_id);
        self.sessions_gone.notify_all();
    }
}

/// What `admit` set up for a guest.
pub(crate) struct Admitted {
    pub(crate) guest_id: GuestId,
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

mod accept;
pub mod admission;
mod connection;
mod refusal;

pub use refusal::AdmitError;
#[cfg(test)]
mod tests;
