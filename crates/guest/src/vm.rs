//! The VM guest transport: the window is QEMU's `ivshmem-plain` BAR (mapped from sysfs
//! `resource2`, no kernel driver needed) and doorbells go over a `virtio-serial` port.
//!
//! On the port, the guest sends `0x02` + a length-prefixed JSON hello to start a session,
//! `0x01` to ring the host's doorbell and `0x04` when it leaves; the host answers the hello
//! with `0x03` + a length-prefixed JSON reply and rings the guest with `0x01`. Doorbells are
//! spin-then-sleep: a byte is written only when the other side announced that it sleeps.
//! One thread per connection reads the port (`vm/hub.rs`) and wakes every sleeper of the
//! connection on each doorbell byte: the session ring's and those of its host service
//! channels, which ring over the same port.
//!
//! Reconnecting (auto-reconnect, or [`Connection::reconnect`]): when the daemon ends the
//! session (a daemon restart, or a live migration that moved the VM's port to another
//! daemon) the library says hello again on the same port with its resume secret and maps
//! the BAR again; the VM and its QEMU never notice.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtsoc_proto::handshake::Reply;
use virtsoc_proto::window_layout::{ctl, CONTROL_OFFSET};
use virtsoc_proto::SharedWindow;

use crate::conn::handshake::Handshake;
use crate::conn::{ConnectOptions, Connection};
use crate::link::ShmLink;
use crate::{GuestError, Result};

pub(crate) mod hub;
pub(crate) use hub::PortHub;

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
    let port = PortHub::start(port)?;
    let h = handshake(&port, opts, None, None)?;
    let mut c = Connection::with_link(h.link, h.window, h.guest_id, h.coherence, h.devices)?;
    c.set_vm_origin(format!("vm:{port_name}"), opts, port, h.resume);
    Ok(c)
}

/// The handshake of a VM guest on its open `port` (resuming a session with `resume`), the
/// answer awaited until `timeout` if given: maps the ivshmem BAR and makes the link.
pub(crate) fn handshake(
    port: &Arc<PortHub>,
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
    // Stray doorbells of an earlier session before the reply are only wake-ups.
    let body = port.request(&msg, deadline)?;
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
        port.host_bell(&window, CONTROL_OFFSET + ctl::HOST_SLEEPING)?,
        port.own_bell(&window, CONTROL_OFFSET + ctl::GUEST_SLEEPING, opts.spins)?,
        Box::new(|| false),
        Box::new(move || {
            let _ = bye.write(&[MSG_BYE]);
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
