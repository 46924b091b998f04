//! VM guests: the window is a memory file the daemon maps and QEMU exposes to the guest as an
//! `ivshmem-plain` BAR; doorbells travel over a `virtio-serial` port whose host end is a Unix
//! socket this endpoint listens on (QEMU connects to it with `-chardev socket,path=...`).
//!
//! Port messages: the guest sends `0x02` + u32 length + JSON hello to start a session, `0x01`
//! to ring the host and `0x04` when it leaves; the host answers `0x03` + u32 length + JSON
//! reply and rings the guest with `0x01`. A reader thread per connected VM turns the guest's
//! doorbells into wake-ups of the session thread. QEMU exiting (or being killed) closes the
//! socket, which ends the session and frees everything it held; the endpoint then waits for
//! the VM's next boot.
//!
//! **Live migration of a VM guest.** QEMU and its ivshmem memory file stay where they are;
//! what moves is the daemon serving them. At the hand-over the source stops reading the
//! VM's doorbell connection ([`take`]) and passes the connected socket and the memory file's
//! descriptor to the target over a Unix socket (SCM_RIGHTS); the target maps the same file
//! and serves the same connection ([`adopt`]), so QEMU never sees a reconnect. The source
//! then ends the guest's session (the guest sees `HOST_STATE` set, the usual end of a
//! session) and the guest library says hello again on the same port with its resume secret,
//! now answered by the target. Until the migration commits the source keeps its own
//! descriptor of the connection (and the session's image in memory, since the target
//! writes the same window): if it does not commit, it reads the connection again
//! ([`serve_again`]) and the guest's next hello resumes the session there.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use virtsoc_proto::handshake::{Hello, Reply, MAX_FRAME};
use virtsoc_proto::ring::Doorbell;
use virtsoc_proto::window_layout::{ctl, CONTROL_OFFSET, FENCE_PAGE_OFFSET, PAGE};
use virtsoc_proto::{SharedWindow, WindowLayout};
use virtsoc_sync::{EventCount, LockExt};

mod bells;
mod port;

pub use bells::GuestPort;
use bells::PortRinger;
pub use port::{adopt, send_port, serve_again, take, Handed, PortCtl, VmPort, VmPorts};
use port::{next_byte, Wake};

use crate::daemon::{AdmitError, Daemon};
use crate::link::ShmLink;
use crate::session::Session;
use crate::{HostError, Result};

/// Port message: a doorbell.
pub const MSG_BELL: u8 = 1;
/// Port message: a hello frame follows.
pub const MSG_HELLO: u8 = 2;
/// Port message: a reply frame follows.
pub const MSG_REPLY: u8 = 3;
/// Port message: the guest leaves.
pub const MSG_BYE: u8 = 4;

/// One VM the daemon serves.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// The VM's name (logs, the control API; `vm:NAME` in guest options).
    pub name: String,
    /// Memory file shared with QEMU (`memory-backend-file,mem-path=...,share=on`).
    pub shm: PathBuf,
    /// Unix socket QEMU's virtio-serial chardev connects to.
    pub doorbell: PathBuf,
    /// Window size; a power of two (an ivshmem BAR).
    pub size: u64,
}

impl VmConfig {
    /// Parses `NAME:SHM_PATH:DOORBELL_SOCKET[:SIZE_MIB]`.
    pub fn parse(s: &str) -> Result<Self> {
        let f: Vec<&str> = s.split(':').collect();
        let bad = || {
            HostError::Config(format!(
                "--vm wants NAME:SHM:DOORBELL[:SIZE_MIB], got {s:?}"
            ))
        };
        if !(3..=4).contains(&f.len()) || f[..3].iter().any(|x| x.is_empty()) {
            return Err(bad());
        }
        let mib: u64 = f
            .get(3)
            .map(|m| m.parse())
            .transpose()
            .map_err(|_| bad())?
            .unwrap_or(64);
        if !mib.is_power_of_two() || !(2..=4096).contains(&mib) {
            return Err(HostError::Config(
                "VM window size must be a power of two MiB".into(),
            ));
        }
        Ok(VmConfig {
            name: f[0].to_string(),
            shm: PathBuf::from(f[1]),
            doorbell: PathBuf::from(f[2]),
            size: mib << 20,
        })
    }
}

/// Creates the VM's memory file and doorbell socket and serves the VM from a thread.
pub fn start(daemon: Arc<Daemon>, cfg: VmConfig) -> Result<()> {
    let layout = WindowLayout::new(cfg.size, 256, 256)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&cfg.shm)?;
    file.set_len(cfg.size)?;
    let window = Arc::new(SharedWindow::map_file(file, layout)?);
    let _ = std::fs::remove_file(&cfg.doorbell);
    let listener = UnixListener::bind(&cfg.doorbell)?;
    log::info!(
        "VM {} served on {} (window {} MiB in {})",
        cfg.name,
        cfg.doorbell.display(),
        cfg.size >> 20,
        cfg.shm.display()
    );
    std::thread::Builder::new()
        .name(format!("vm-{}", cfg.name))
        .spawn(move || {
            for conn in listener.incoming() {
                match conn.and_then(|stream| PortCtl::new().map(|ctl| (stream, ctl))) {
                    Ok((stream, ctl)) => serve_vm(&daemon, &cfg, &window, stream, &ctl, None),
                    Err(e) => log::warn!("VM {}: accept: {e}", cfg.name),
                }
            }
        })?;
    Ok(())
}

/// Removes the files a VM endpoint created.
pub fn cleanup(cfg: &VmConfig) {
    for p in [&cfg.shm, &cfg.doorbell] {
        let _ = std::fs::remove_file(p);
    }
}

/// The session a VM's port serves now.
pub struct Current {
    session: Arc<Session>,
    runner: std::thread::JoinHandle<()>,
    bell: Arc<EventCount>,
    /// The port as the guest's service channels use it.
    port: Arc<GuestPort>,
    /// Its welcome and resume secret (a hello repeated with that secret is answered again).
    welcome: Reply,
    secret: Option<String>,
}

impl Current {
    /// Waits for the session thread (after the session was closed) and unregisters it.
    pub fn finish(self, daemon: &Daemon) {
        let _ = self.runner.join();
        daemon.config().sharing.detach_cpu(self.session.guest_id());
        daemon.unregister(self.session.guest_id());
    }
}

fn end(daemon: &Daemon, cur: &mut Option<Current>) {
    if let Some(c) = cur.take() {
        c.session.close();
        c.finish(daemon);
    }
}

fn read_frame(stream: &mut UnixStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "oversized frame",
        ));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body)?;
    Ok(body)
}

fn send_reply(stream: &Mutex<UnixStream>, reply: &Reply) -> std::io::Result<()> {
    let body = serde_json::to_vec(reply).map_err(std::io::Error::other)?;
    let mut msg = vec![MSG_REPLY];
    msg.extend_from_slice(&(body.len() as u32).to_le_bytes());
    msg.extend_from_slice(&body);
    stream.lock_or_recover().write_all(&msg)
}

/// Serves one connected VM until QEMU hangs up, or until asked to stop (its port moves to
/// another daemon) or to let go of the port.
pub(super) fn serve_vm(
    daemon: &Arc<Daemon>,
    cfg: &VmConfig,
    window: &Arc<SharedWindow>,
    mut stream: UnixStream,
    ctl: &Arc<PortCtl>,
    current: Option<Current>,
) {
    log::info!("VM {} connected", cfg.name);
    let writer = match stream.try_clone() {
        Ok(w) => Arc::new(Mutex::new(w)),
        Err(e) => return log::warn!("VM {}: {e}", cfg.name),
    };
    let mut cur: Option<Current> = current;
    if let Some(c) = &cur {
        daemon
            .restart()
            .vm_ports
            .set(c.session.guest_id(), ctl, &c.port);
    }
    loop {
        let byte = match next_byte(&mut stream, ctl) {
            Wake::Byte(b) => b,
            Wake::Gone => break,
            Wake::Stop if ctl.is_abandoned() => {
                if let Some(c) = cur.take() {
                    daemon.restart().vm_ports.unset(c.session.guest_id());
                    c.session.close();
                    c.finish(daemon);
                }
                return log::info!("VM {}: port let go (its source serves it)", cfg.name);
            }
            Wake::Stop => {
                let mut handed = ctl.handed.lock_or_recover();
                if !ctl.stop.load(Ordering::SeqCst) {
                    continue; // the request was withdrawn (it waited too long)
                }
                if let Some(c) = &cur {
                    daemon.restart().vm_ports.unset(c.session.guest_id());
                }
                let port = VmPort {
                    cfg: cfg.clone(),
                    window: window.clone(),
                    stream,
                };
                *handed = Some(Handed {
                    port,
                    current: cur.take(),
                });
                drop(handed);
                ctl.handed_cv.notify_all();
                return log::info!("VM {}: port handed over", cfg.name);
            }
        };
        match byte {
            MSG_BELL => {
                if let Some(c) = &cur {
                    c.bell.notify();
                    c.port.wake_channels();
                }
            }
            MSG_BYE => {
                if let Some(c) = &cur {
                    daemon.restart().vm_ports.unset(c.session.guest_id());
                }
                end(daemon, &mut cur)
            }
            MSG_HELLO => {
                let hello: Option<Hello> = read_frame(&mut stream)
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok());
                // The same guest saying hello again with its session's secret (its answer
                // was late, it gave up waiting): answer again, the session stays.
                if let (Some(c), Some(h)) = (&cur, &hello) {
                    if h.resume.is_some() && h.resume == c.secret {
                        let _ = send_reply(&writer, &c.welcome);
                        continue;
                    }
                }
                if let Some(c) = &cur {
                    daemon.restart().vm_ports.unset(c.session.guest_id());
                }
                end(daemon, &mut cur);
                let Some(hello) = hello else {
                    let _ = send_reply(
                        &writer,
                        &Reply::Refused {
                            reason: "bad hello".into(),
                        },
                    );
                    continue;
                };
                match start_session(daemon, cfg, window, &writer, hello) {
                    Ok(c) => {
                        daemon
                            .restart()
                            .vm_ports
                            .set(c.session.guest_id(), ctl, &c.port);
                        cur = Some(c);
                    }
                    // A migration that did not commit: no answer, the source answers.
                    Err(_) if ctl.is_abandoned() => {}
                    Err(reason) => {
                        log::warn!("VM {}: refusing guest: {reason}", cfg.name);
                        let reason = reason.to_string();
                        let _ = send_reply(&writer, &Reply::Refused { reason });
                    }
                }
            }
            other => log::debug!("VM {}: ignoring port byte {other:#x}", cfg.name),
        }
    }
    if let Some(c) = &cur {
        daemon.restart().vm_ports.unset(c.session.guest_id());
    }
    end(daemon, &mut cur);
    log::info!("VM {} disconnected", cfg.name);
}

fn start_session(
    daemon: &Arc<Daemon>,
    cfg: &VmConfig,
    window: &Arc<SharedWindow>,
    writer: &Arc<Mutex<UnixStream>>,
    hello: Hello,
) -> std::result::Result<Current, AdmitError> {
    let kind = daemon.check_hello(&hello)?;
    // A new guest instance starts from empty rings and an empty fence page.
    window
        .zero(FENCE_PAGE_OFFSET, 2 * PAGE)
        .map_err(AdmitError::VmWindow)?;
    let guest_id = daemon.next_guest_id();
    let a = daemon.admit_with(guest_id, kind, window.clone(), &hello.name)?;
    let bell = Arc::new(EventCount::default());
    let spins = 2048;
    let link = ShmLink::new(
        window.clone(),
        Box::new(EventBell {
            window: window.clone(),
            events: bell.clone(),
            spins,
        }),
        Box::new(PortRinger {
            window: window.clone(),
            port: writer.clone(),
            sleeping: CONTROL_OFFSET + ctl::GUEST_SLEEPING,
        }),
        Box::new(|| {}),
    );
    // The name comes from the guest: never log it raw.
    let name = crate::daemon::sanitize_name(&hello.name);
    let session = Session::new(
        guest_id,
        format!("{}/{name}", cfg.name),
        window.clone(),
        Arc::new(link),
        &daemon.config().limits,
    );
    daemon.register(&session);
    // Like a process guest: a resume secret in the welcome, and a hello presenting one
    // resumes that saved (or migrated) session.
    let mut welcome = daemon.welcome(&a);
    let refused = |reason: AdmitError| {
        daemon.unregister(guest_id);
        session.close();
        daemon.svm().detach_guest(guest_id);
        reason
    };
    match daemon
        .restart()
        .admit(daemon, &session, hello.resume.as_deref())
    {
        Ok(secret) => {
            if let Reply::Welcome { resume, .. } = &mut welcome {
                *resume = Some(secret);
            }
        }
        Err(crate::snapshot::restart::Refusal::Refused(reason)) => {
            return Err(refused(AdmitError::Resume(reason)))
        }
        Err(crate::snapshot::restart::Refusal::Moved(_)) => return Err(refused(AdmitError::Moved)),
    }
    if let Err(e) = send_reply(writer, &welcome) {
        return Err(refused(AdmitError::Welcome(e)));
    }
    log::info!(
        "VM {} guest {guest_id} ({name}) connected, coherence {kind}",
        cfg.name
    );
    // The VM's process is QEMU, the peer of its virtio-serial socket.
    let qemu = crate::cgroup::peer_pid(&writer.lock_or_recover());
    daemon
        .config()
        .sharing
        .attach_cpu(guest_id, session.name(), qemu);
    let (s, svm, dev) = (
        session.clone(),
        daemon.svm().clone(),
        daemon.devices().clone(),
    );
    let runner = std::thread::Builder::new()
        .name(format!("vm-guest-{guest_id}"))
        .spawn(move || s.run(svm, dev))
        .map_err(AdmitError::Thread)?;
    let secret = match &welcome {
        Reply::Welcome { resume, .. } => resume.clone(),
        _ => None,
    };
    Ok(Current {
        session,
        runner,
        bell,
        port: GuestPort::new(writer.clone(), window.clone()),
        welcome,
        secret,
    })
}

/// The host's bell for a VM guest: the port reader bumps an event counter.
struct EventBell {
    window: Arc<SharedWindow>,
    events: Arc<EventCount>,
    spins: u32,
}

impl Doorbell for EventBell {
    fn notify(&self) {
        self.events.notify();
    }

    fn force_wake(&self) {
        self.events.notify();
    }

    fn wait(&self, ready: &mut dyn FnMut() -> bool, timeout: Option<Duration>) -> bool {
        for _ in 0..self.spins {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        let Ok(flag) = self.window.atomic_u32(CONTROL_OFFSET + ctl::HOST_SLEEPING) else {
            return ready();
        };
        loop {
            let seen = self.events.current();
            flag.store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if ready() {
                flag.store(0, Ordering::SeqCst);
                return true;
            }
            let woke = self.events.wait_past_for(seen, timeout);
            flag.store(0, Ordering::SeqCst);
            if ready() {
                return true;
            }
            if !woke {
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vm_specs() {
        let c = VmConfig::parse("a:/dev/shm/x:/tmp/y.sock").unwrap();
        assert_eq!((c.name.as_str(), c.size), ("a", 64 << 20));
        assert_eq!(VmConfig::parse("a:/s:/d:16").unwrap().size, 16 << 20);
        for bad in ["a:/s", "a:/s:/d:3", ":/s:/d", "a:/s:/d:x", "a:/s:/d:16:9"] {
            assert!(VmConfig::parse(bad).is_err(), "{bad}");
        }
    }
}
