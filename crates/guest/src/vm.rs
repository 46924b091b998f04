//! The VM guest transport: the window is QEMU's `ivshmem-plain` BAR (mapped from sysfs
//! `resource2`, no kernel driver needed) and doorbells go over a `virtio-serial` port.
//!
//! On the port, the guest sends `0x02` + a length-prefixed JSON hello to start a session,
//! `0x01` to ring the host's doorbell and `0x04` when it leaves; the host answers the hello
//! with `0x03` + a length-prefixed JSON reply and rings the guest with `0x01`. Doorbells are
//! spin-then-sleep: a byte is written only when the other side announced that it sleeps.
//!
//! Reconnecting (auto-reconnect, or [`Connection::reconnect`]): when the daemon ends the
//! session (a daemon restart, or a live migration that moved the VM's port to another
//! daemon) the library says hello again on the same port with its resume secret and maps
//! the BAR again; the VM and its QEMU never notice.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtsoc_proto::handshake::{Reply, MAX_FRAME};
use virtsoc_proto::layout::{ctl, CONTROL_OFFSET};
use virtsoc_proto::ring::Doorbell;
use virtsoc_proto::spin::AdaptiveSpin;
use virtsoc_proto::SharedWindow;

use crate::conn::handshake::Handshake;
use crate::conn::{ConnectOptions, Connection};
use crate::link::ShmLink;
use crate::{GuestError, Result};

/// The virtio-serial port name the daemon's VM endpoint is attached to by default.
pub const DEFAULT_PORT: &str = "virtsoc.0";
/// Port message: a doorbell.
pub const MSG_BELL: u8 = 1;
/// Port message: a hello frame follows.
pub const MSG_HELLO: u8 = 2;
/// Port message: a reply frame follows.
pub const MSG_REPLY: u8 = 3;
/// Port message: the guest leaves.
pub const MSG_BYE: u8 = 4;

fn find_port(name: &str) -> Result<PathBuf> {
    let dir = Path::new("/sys/class/virtio-ports");
    let entries = std::fs::read_dir(dir).map_err(|source| GuestError::Connect {
        path: format!("{} (is virtio_console loaded?)", dir.display()),
        source,
    })?;
    for e in entries.flatten() {
        if std::fs::read_to_string(e.path().join("name")).is_ok_and(|n| n.trim() == name) {
            return Ok(Path::new("/dev").join(e.file_name()));
        }
    }
    Err(GuestError::BadArgument(format!(
        "no virtio-serial port named {name:?}"
    )))
}

/// Whether this machine is a VM guest whose daemon's virtio-serial port `name` is present
/// (programs told no daemon pick the VM transport then: the GLES vendor library).
pub fn port_present(name: &str) -> bool {
    find_port(name).is_ok()
}

fn find_ivshmem() -> Result<PathBuf> {
    for e in std::fs::read_dir("/sys/bus/pci/devices")
        .map_err(GuestError::Io)?
        .flatten()
    {
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).unwrap_or_default();
        if read("vendor").trim() == "0x1af4" && read("device").trim() == "0x1110" {
            return Ok(e.path().join("resource2"));
        }
    }
    Err(GuestError::BadArgument(
        "no ivshmem device (PCI 1af4:1110)".into(),
    ))
}

/// Reads exactly `buf` from the port, by `deadline` if given.
fn read_exact_port(port: &File, buf: &mut [u8], deadline: Option<Instant>) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(GuestError::Refused(
                    "no answer on the VM port in time".into(),
                ));
            }
            let ts = rustix::time::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: left.subsec_nanos() as i64,
            };
            let mut fds = [rustix::event::PollFd::new(
                port,
                rustix::event::PollFlags::IN,
            )];
            if !matches!(rustix::event::poll(&mut fds, Some(&ts)), Ok(n) if n > 0) {
                continue;
            }
        }
        match (&*port).read(&mut buf[got..]) {
            Ok(0) | Err(_) => return Err(GuestError::Closed),
            Ok(n) => got += n,
        }
    }
    Ok(())
}

/// Connects from inside a VM.
pub fn connect(port_name: &str, opts: &ConnectOptions) -> Result<Connection> {
    let port_path = find_port(port_name)?;
    let port = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&port_path)
        .map_err(|source| GuestError::Connect {
            path: port_path.display().to_string(),
            source,
        })?;
    let port = Arc::new(port);
    let h = handshake(&port, opts, None, None)?;
    let mut c = Connection::with_link(h.link, h.window, h.guest_id, h.coherence, h.devices)?;
    c.set_vm_origin(format!("vm:{port_name}"), opts, port, h.resume);
    Ok(c)
}

/// The handshake of a VM guest on its open `port` (resuming a session with `resume`), the
/// answer awaited until `timeout` if given: maps the ivshmem BAR and makes the link.
pub(crate) fn handshake(
    port: &Arc<File>,
    opts: &ConnectOptions,
    resume: Option<String>,
    timeout: Option<Duration>,
) -> Result<Handshake> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut h = Connection::hello_for(opts);
    h.resume = resume;
    let hello = serde_json::to_vec(&h).map_err(virtsoc_proto::ProtoError::from)?;
    let mut msg = vec![MSG_HELLO];
    msg.extend_from_slice(&(hello.len() as u32).to_le_bytes());
    msg.extend_from_slice(&hello);
    (&**port).write_all(&msg).map_err(GuestError::Io)?;
    // Skip stray doorbells of an earlier session until the reply.
    let mut b = [0u8; 1];
    loop {
        read_exact_port(port, &mut b, deadline)?;
        if b[0] == MSG_REPLY {
            break;
        }
    }
    let mut len = [0u8; 4];
    read_exact_port(port, &mut len, deadline)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(GuestError::Refused("oversized reply".into()));
    }
    let mut body = vec![0u8; len];
    read_exact_port(port, &mut body, deadline)?;
    let reply: Reply = serde_json::from_slice(&body).map_err(virtsoc_proto::ProtoError::from)?;
    let resume = match &reply {
        Reply::Welcome { resume, .. } => resume.clone(),
        _ => None,
    };
    let (guest_id, layout, coherence, devices) = Connection::welcome_of(reply)?;
    let bar = find_ivshmem()?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&bar)
        .map_err(|source| GuestError::Connect {
            path: bar.display().to_string(),
            source,
        })?;
    let window = Arc::new(SharedWindow::map_file(file, layout)?);
    let bye = port.clone();
    let link = ShmLink::new(
        window.clone(),
        Box::new(PortBell::new(
            &window,
            port.clone(),
            ctl::HOST_SLEEPING,
            opts.spins,
        )),
        Box::new(PortBell::new(
            &window,
            port.clone(),
            ctl::GUEST_SLEEPING,
            opts.spins,
        )),
        Box::new(|| false),
        Box::new(move || {
            let _ = (&*bye).write_all(&[MSG_BYE]);
        }),
    );
    Ok(Handshake {
        link: Box::new(link),
        window,
        guest_id,
        coherence,
        devices,
        resume,
    })
}

/// A doorbell over the virtio-serial port. As the host's bell (`sleeping` =
/// `HOST_SLEEPING`) it writes a byte when the host sleeps; as the guest's own bell
/// (`GUEST_SLEEPING`) it sleeps in poll(2) on the port.
struct PortBell {
    window: Arc<SharedWindow>,
    port: Arc<File>,
    sleeping: u64,
    spin: AdaptiveSpin,
}

impl PortBell {
    fn new(window: &Arc<SharedWindow>, port: Arc<File>, sleeping: u64, spins: u32) -> Self {
        PortBell {
            window: window.clone(),
            port,
            sleeping: CONTROL_OFFSET + sleeping,
            spin: AdaptiveSpin::new(spins),
        }
    }

    fn flag(&self) -> Option<&std::sync::atomic::AtomicU32> {
        self.window.atomic_u32(self.sleeping).ok()
    }

    /// The sleeping half of [`Doorbell::wait`].
    fn sleep(&self, ready: &mut dyn FnMut() -> bool, timeout: Option<Duration>) -> bool {
        let Some(flag) = self.flag() else {
            return ready();
        };
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
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
            let ts = left.map(|l| rustix::time::Timespec {
                tv_sec: l.as_secs() as i64,
                tv_nsec: l.subsec_nanos() as i64,
            });
            let mut fds = [rustix::event::PollFd::new(
                &*self.port,
                rustix::event::PollFlags::IN,
            )];
            if let Ok(n) = rustix::event::poll(&mut fds, ts.as_ref()) {
                if n > 0 {
                    let mut buf = [0u8; 64];
                    let _ = (&*self.port).read(&mut buf);
                }
            }
            flag.store(0, Ordering::SeqCst);
            if ready() {
                return true;
            }
        }
    }
}

impl Doorbell for PortBell {
    fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.flag().is_some_and(|f| f.load(Ordering::SeqCst) != 0) {
            let _ = (&*self.port).write_all(&[MSG_BELL]);
        }
    }

    fn force_wake(&self) {
        let _ = (&*self.port).write_all(&[MSG_BELL]);
    }

    fn wait(&self, ready: &mut dyn FnMut() -> bool, timeout: Option<Duration>) -> bool {
        self.spin.wait(ready, |ready| self.sleep(ready, timeout))
    }
}
