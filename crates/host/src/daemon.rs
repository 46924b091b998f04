//! The daemon: accepts guests on the Unix socket, runs the handshake, and owns the SVM
//! manager, the devices and the table of live sessions.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags};
use virtsoc_proto::handshake::{recv_json, send_json, Hello, Reply, PROTOCOL_VERSION};
use virtsoc_proto::layout::PAGE;
use virtsoc_proto::{DeviceId, SharedWindow, WindowLayout};
use virtsoc_svm::{DomainId, ProtocolKind, SvmManager, Topology};

use crate::device::testdev::{Consumer, Producer};
use crate::device::{Device, DeviceSet};
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
        let devices: Vec<(DeviceId, Arc<dyn Device>)> = vec![
            (DeviceId::PRODUCER, Arc::new(Producer)),
            (DeviceId::CONSUMER, Arc::new(Consumer::new("consumer"))),
            (DeviceId::CONSUMER2, Arc::new(Consumer::new("consumer2"))),
        ];
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

    /// Accepts guests until `stop` becomes readable, then closes every session.
    pub fn serve(self: &Arc<Self>, listener: UnixListener, stop: OwnedFd) -> Result<()> {
        listener.set_nonblocking(true)?;
        log::info!(
            "virtsocd listening on {} (default coherence {})",
            self.cfg.socket.display(),
            self.cfg.protocol
        );
        loop {
            let mut fds = [
                PollFd::new(&listener, PollFlags::IN),
                PollFd::new(&stop, PollFlags::IN),
            ];
            match poll(&mut fds, None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(HostError::Io(e.into())),
            }
            if !fds[1].revents().is_empty() {
                break;
            }
            loop {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let me = self.clone();
                        std::thread::Builder::new()
                            .name("guest-conn".into())
                            .spawn(move || me.connection(stream))?;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        log::warn!("accept: {e}");
                        break;
                    }
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

    fn refuse(stream: &UnixStream, reason: String) {
        log::warn!("refusing guest: {reason}");
        let _ = send_json(stream, &Reply::Refused { reason }, None);
    }

    /// Handshake, then watch the socket until the guest hangs up.
    fn connection(self: Arc<Self>, mut stream: UnixStream) {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(10)));
        let hello: Hello = match recv_json(&stream) {
            Ok((h, _)) => h,
            Err(e) => return Self::refuse(&stream, format!("bad hello: {e}")),
        };
        let _ = stream.set_read_timeout(None);
        if hello.protocol != PROTOCOL_VERSION {
            return Self::refuse(
                &stream,
                format!(
                    "protocol {} not supported (daemon speaks {PROTOCOL_VERSION})",
                    hello.protocol
                ),
            );
        }
        let kind = match hello.coherence.as_deref().map(str::parse::<ProtocolKind>) {
            None => self.cfg.protocol,
            Some(Ok(k)) => k,
            Some(Err(e)) => return Self::refuse(&stream, e.to_string()),
        };
        let protocol = self.svm.protocol(kind);
        let entries = |n: u32| n.clamp(8, 4096).next_power_of_two();
        let size = hello
            .window_size
            .clamp(1 << 20, self.cfg.max_window)
            .div_ceil(PAGE)
            * PAGE;
        let layout =
            match WindowLayout::new(size, entries(hello.sq_entries), entries(hello.cq_entries)) {
                Ok(l) => l,
                Err(e) => return Self::refuse(&stream, e.to_string()),
            };
        let guest_id = self.next_guest.fetch_add(1, Ordering::Relaxed);
        let window = match SharedWindow::create_memfd(&format!("virtsoc-guest-{guest_id}"), layout)
        {
            Ok(w) => Arc::new(w),
            Err(e) => return Self::refuse(&stream, format!("cannot create window: {e}")),
        };
        if let Err(e) =
            self.svm
                .attach_guest(guest_id, window.clone(), protocol, self.cfg.guest_mem_limit)
        {
            return Self::refuse(&stream, e.to_string());
        }
        let reply = Reply::Welcome {
            guest_id,
            layout,
            coherence: kind.name().to_string(),
        };
        if let Err(e) = send_json(&stream, &reply, Some(window.fd())) {
            log::warn!("guest {guest_id}: handshake failed: {e}");
            self.svm.detach_guest(guest_id);
            return;
        }
        let sock = match stream.try_clone() {
            Ok(s) => s,
            Err(e) => {
                log::warn!("guest {guest_id}: {e}");
                self.svm.detach_guest(guest_id);
                return;
            }
        };
        let (session, sq) =
            Session::new(guest_id, hello.name.clone(), window, sock, self.cfg.spins);
        log::info!(
            "guest {guest_id} ({}) connected: window {} MiB, coherence {kind}",
            hello.name,
            layout.size >> 20
        );
        let runner = {
            let (s, svm, dev) = (session.clone(), self.svm.clone(), self.devices.clone());
            std::thread::Builder::new()
                .name(format!("guest-{guest_id}"))
                .spawn(move || s.run(sq, svm, dev))
        };
        let runner = match runner {
            Ok(h) => h,
            Err(e) => {
                log::warn!("guest {guest_id}: cannot start session: {e}");
                self.svm.detach_guest(guest_id);
                return;
            }
        };
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(guest_id, session.clone());
        // Watch for the hang-up: a crashed guest's socket reads EOF.
        let mut buf = [0u8; 64];
        loop {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        session.close();
        let _ = runner.join();
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        sessions.remove(&guest_id);
        self.sessions_gone.notify_all();
    }
}
