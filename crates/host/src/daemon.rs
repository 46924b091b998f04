//! The daemon: accepts guests on the Unix socket, runs the handshake, and owns the SVM
//! manager, the devices and the table of live sessions.

use std::collections::HashMap;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags};
use virtsoc_proto::handshake::{recv_json, send_json, DeviceDesc, Hello, Reply, PROTOCOL_VERSION};
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
        }
    }
}

/// The host daemon.
pub struct Daemon {
    cfg: DaemonConfig,
    svm: Arc<SvmManager>,
    devices: Arc<DeviceSet>,
    sessions: Mutex<HashMap<u64, Arc<Session>>>,
    sessions_gone: Condvar,
    next_guest: AtomicU64,
}

impl Daemon {
    /// Builds the memory domains and devices and starts the device workers.
    pub fn new(cfg: DaemonConfig) -> Result<Arc<Self>> {
        let mut topo = Topology::new();
        let devices = crate::device::registry::build(&cfg.devices)?;
        let with_domains: Vec<(DeviceId, DomainId, Arc<dyn Device>)> = devices
            .into_iter()
            .map(|(id, d)| (id, topo.add_device_domain(d.name()), d))
            .collect();
        let svm = Arc::new(SvmManager::with_prefetch_config(topo, cfg.prefetch));
        let devices = Arc::new(DeviceSet::start(svm.clone(), with_domains));
        Ok(Arc::new(Daemon {
            cfg,
            svm,
            devices,
            sessions: Mutex::new(HashMap::new()),
            sessions_gone: Condvar::new(),
            next_guest: AtomicU64::new(1),
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
        loop {
            let mut fds = vec![
                PollFd::new(&stop, PollFlags::IN),
                PollFd::new(&listener, PollFlags::IN),
            ];
            if let Some(t) = &tcp {
                fds.push(PollFd::new(t, PollFlags::IN));
            }
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(HostError::Io(e.into())),
            }
            if !fds[0].revents().is_empty() {
                break;
            }
            drop(fds);
            while let Ok((stream, _)) = listener.accept() {
                let me = self.clone();
                std::thread::Builder::new()
                    .name("guest-conn".into())
                    .spawn(move || me.unix_connection(stream))?;
            }
            if let Some(t) = &tcp {
                while let Ok((stream, peer)) = t.accept() {
                    let me = self.clone();
                    std::thread::Builder::new()
                        .name("remote-conn".into())
                        .spawn(move || me.tcp_connection(stream, peer))?;
                }
            }
        }
        self.shutdown();
        Ok(())
    }

    /// Closes every session, waits (bounded) for their cleanup, and stops the devices.
    pub fn shutdown(&self) {
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
        self.devices.stop();
        log::info!("virtsocd stopped");
    }

    fn refuse(stream: &impl AsFd, reason: String) {
        log::warn!("refusing guest: {reason}");
        let _ = send_json(stream, &Reply::Refused { reason }, None);
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
        self.admit_with(guest_id, kind, Arc::new(window))
    }

    /// Sets up a guest whose window already exists (a VM's ivshmem memory).
    pub(crate) fn admit_with(
        &self,
        guest_id: u64,
        kind: ProtocolKind,
        window: Arc<SharedWindow>,
    ) -> std::result::Result<Admitted, String> {
        self.svm
            .attach_guest(
                guest_id,
                window.clone(),
                self.svm.protocol(kind),
                self.cfg.guest_mem_limit,
            )
            .map_err(|e| e.to_string())?;
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
        sessions.remove(&guest_id);
        self.sessions_gone.notify_all();
    }

    /// A process guest: handshake, the window passed as a memfd, futex doorbells; then the
    /// connection thread watches the socket for the hang-up.
    fn unix_connection(self: Arc<Self>, mut stream: UnixStream) {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let hello: Hello = match recv_json(&stream) {
            Ok((h, _)) => h,
            Err(e) => return Self::refuse(&stream, format!("bad hello: {e}")),
        };
        let _ = stream.set_read_timeout(None);
        let a = match self.admit(&hello) {
            Ok(a) => a,
            Err(reason) => return Self::refuse(&stream, reason),
        };
        let guest_id = a.guest_id;
        if let Err(e) = send_json(&stream, &self.welcome(&a), Some(a.window.fd())) {
            log::warn!("guest {guest_id}: handshake failed: {e}");
            self.svm.detach_guest(guest_id);
            return;
        }
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
        let session = Session::new(
            guest_id,
            hello.name.clone(),
            a.window.clone(),
            Arc::new(link),
        );
        log::info!(
            "guest {guest_id} ({}) connected: window {} MiB, coherence {}",
            hello.name,
            a.layout.size >> 20,
            a.kind
        );
        self.register(&session);
        let runner = {
            let (s, svm, dev) = (session.clone(), self.svm.clone(), self.devices.clone());
            std::thread::Builder::new()
                .name(format!("guest-{guest_id}"))
                .spawn(move || s.run(svm, dev))
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
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let hello: Hello = match recv_json(&stream) {
            Ok((h, _)) => h,
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
        let _ = stream.set_read_timeout(None);
        let a = match self.admit(&hello) {
            Ok(a) => a,
            Err(reason) => return Self::refuse(&stream, reason),
        };
        let guest_id = a.guest_id;
        let link = match send_json(&stream, &self.welcome(&a), None)
            .map_err(|e| e.to_string())
            .and_then(|_| StreamLink::new(stream, a.layout.size).map_err(|e| e.to_string()))
        {
            Ok(l) => l,
            Err(e) => {
                log::warn!("guest {guest_id}: handshake failed: {e}");
                self.svm.detach_guest(guest_id);
                return;
            }
        };
        log::info!(
            "remote guest {guest_id} ({}) connected from {peer}, coherence {}",
            hello.name,
            a.kind
        );
        let session = Session::new(guest_id, hello.name, a.window, Arc::new(link));
        self.register(&session);
        session.run(self.svm.clone(), self.devices.clone());
        self.unregister(guest_id);
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
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
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
}
