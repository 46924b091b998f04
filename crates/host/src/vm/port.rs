//! A VM's port as something that moves between daemons (live migration): the control of
//! the thread reading it (stop and hand it over, or let go of it), passing it to another
//! daemon (SCM_RIGHTS) and serving one passed here. See the parent module.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use virtsoc_svm::GuestId;

use virtsoc_proto::{SharedWindow, WindowLayout};
use virtsoc_sync::{CondvarExt, LockExt};

use super::{serve_vm, Current, GuestPort, VmConfig};
use crate::daemon::Daemon;
use crate::{HostError, Result};

/// A VM's doorbell connection with its window: what moves between daemons.
pub struct VmPort {
    pub(super) cfg: VmConfig,
    pub(super) window: Arc<SharedWindow>,
    pub(super) stream: UnixStream,
}

impl VmPort {
    /// The VM's name.
    pub fn name(&self) -> &str {
        &self.cfg.name
    }
}

/// What the thread reading a VM's port handed back when asked to stop.
pub struct Handed {
    /// The VM's port (its doorbell connection), no longer read by the thread.
    pub port: VmPort,
    /// The session it was serving.
    pub current: Option<Current>,
}

/// Control of the thread reading one VM's port: stop it and take the port back ([`take`]),
/// or make it let go of the port ([`PortCtl::abandon`]).
pub struct PortCtl {
    wake_tx: UnixStream,
    wake_rx: UnixStream,
    pub(super) stop: AtomicBool,
    abandoned: AtomicBool,
    pub(super) handed: Mutex<Option<Handed>>,
    pub(super) handed_cv: Condvar,
}

impl PortCtl {
    pub(super) fn new() -> std::io::Result<Arc<Self>> {
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        Ok(Arc::new(PortCtl {
            wake_tx,
            wake_rx,
            stop: AtomicBool::new(false),
            abandoned: AtomicBool::new(false),
            handed: Mutex::new(None),
            handed_cv: Condvar::new(),
        }))
    }

    fn wake(&self) {
        let _ = (&self.wake_tx).write_all(&[1]);
    }

    /// The reading thread drops the port without answering or ending anything (an adopted
    /// port whose migration did not commit: its source serves it again).
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
        self.wake();
    }

    pub(super) fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }
}

/// The port reading thread of each VM guest being served, and its port as the guest's
/// service channels use it, by guest id.
#[derive(Default)]
pub struct VmPorts(Mutex<HashMap<GuestId, Served>>);

/// A served VM guest's port reader and its port as its channels use it.
type Served = (Arc<PortCtl>, Arc<GuestPort>);

impl VmPorts {
    pub(super) fn set(&self, guest: GuestId, ctl: &Arc<PortCtl>, port: &Arc<GuestPort>) {
        self.0
            .lock_or_recover()
            .insert(guest, (ctl.clone(), port.clone()));
    }

    pub(super) fn unset(&self, guest: GuestId) {
        self.0.lock_or_recover().remove(&guest);
    }

    fn get(&self, guest: GuestId) -> Option<Arc<PortCtl>> {
        self.0.lock_or_recover().get(&guest).map(|(c, _)| c.clone())
    }

    /// VM guest `guest`'s port, for its service channels (`None`: not a VM guest served
    /// here now).
    pub fn guest_port(&self, guest: GuestId) -> Option<Arc<GuestPort>> {
        self.0.lock_or_recover().get(&guest).map(|(_, p)| p.clone())
    }
}

/// Stops the thread reading VM guest `guest`'s port (its session stays open, paused by the
/// caller) and takes the port and the session back.
pub fn take(daemon: &Daemon, guest: GuestId) -> Result<Handed> {
    let ctl = daemon
        .restart()
        .vm_ports
        .get(guest)
        .ok_or_else(|| HostError::Config(format!("guest {guest} is not a served VM guest")))?;
    ctl.stop.store(true, Ordering::SeqCst);
    ctl.wake();
    let g = ctl.handed.lock_or_recover();
    let (mut g, _) = ctl
        .handed_cv
        .wait_timeout_while_or_recover(g, Duration::from_secs(10), |h| h.is_none());
    g.take().ok_or_else(|| {
        // Withdrawn under the same lock the reader hands over under: it goes on serving.
        ctl.stop.store(false, Ordering::SeqCst);
        HostError::Config(format!("VM guest {guest}: its port did not stop in time"))
    })
}

/// Serves `port` again from a thread (a migration that did not commit), with the session
/// it was serving, if any.
pub fn serve_again(daemon: Arc<Daemon>, port: VmPort, current: Option<Current>) {
    let name = port.cfg.name.clone();
    let spawned = PortCtl::new().and_then(|ctl| {
        std::thread::Builder::new()
            .name(format!("vm-{name}"))
            .spawn(move || {
                serve_vm(&daemon, &port.cfg, &port.window, port.stream, &ctl, current);
            })
    });
    if let Err(e) = spawned {
        log::error!("VM {name}: cannot serve its port again: {e}");
    }
}

/// Sends `port` (its connection and its memory file's descriptor) over `to`, a Unix
/// socket to the target daemon, with `header` first.
pub fn send_port(to: &UnixStream, header: &serde_json::Value, port: &VmPort) -> Result<()> {
    use virtsoc_proto::handshake::send_json;
    send_json(to, header, Some(port.stream.as_fd()))?;
    send_json(
        to,
        &serde_json::json!({ "size": port.cfg.size }),
        Some(port.window.fd()),
    )?;
    Ok(())
}

/// Serves a VM port handed over by another daemon: `shm` is the VM's memory file (mapped
/// as it is, never truncated), `stream` the connection QEMU's chardev holds. Returns the
/// control of the thread reading it.
pub fn adopt(
    daemon: Arc<Daemon>,
    name: &str,
    size: u64,
    shm: std::fs::File,
    stream: UnixStream,
) -> Result<Arc<PortCtl>> {
    if !size.is_power_of_two() || !(2 << 20..=4 << 30).contains(&size) {
        return Err(HostError::Config(format!("bad VM window size {size}")));
    }
    if shm.metadata()?.len() < size {
        return Err(HostError::Config(
            "the VM's memory file is smaller than its window".into(),
        ));
    }
    let layout = WindowLayout::new(size, 256, 256)?;
    let window = Arc::new(SharedWindow::map_file(shm, layout)?);
    let cfg = VmConfig {
        name: name.chars().take(64).collect(),
        shm: PathBuf::new(),
        doorbell: PathBuf::new(),
        size,
    };
    let ctl = PortCtl::new()?;
    let c = ctl.clone();
    std::thread::Builder::new()
        .name(format!("vm-{}", cfg.name))
        .spawn(move || serve_vm(&daemon, &cfg, &window, stream, &c, None))?;
    log::info!("VM {name}: its port moved here");
    Ok(ctl)
}

/// Why the port reader woke.
pub(super) enum Wake {
    Byte(u8),
    Gone,
    Stop,
}

/// The next byte on the port, or a stop request.
pub(super) fn next_byte(stream: &mut UnixStream, ctl: &PortCtl) -> Wake {
    use rustix::event::{poll, PollFd, PollFlags};
    loop {
        if ctl.stop.load(Ordering::SeqCst) || ctl.is_abandoned() {
            return Wake::Stop;
        }
        let mut fds = [
            PollFd::new(&*stream, PollFlags::IN),
            PollFd::new(&ctl.wake_rx, PollFlags::IN),
        ];
        if poll(&mut fds, None).is_err() {
            continue; // EINTR
        }
        if !fds[1].revents().is_empty() {
            let mut b = [0u8; 16];
            let _ = (&ctl.wake_rx).read(&mut b);
            continue;
        }
        if fds[0].revents().is_empty() {
            continue;
        }
        let mut byte = [0u8; 1];
        return match stream.read(&mut byte) {
            Ok(1) => Wake::Byte(byte[0]),
            _ => Wake::Gone,
        };
    }
}
