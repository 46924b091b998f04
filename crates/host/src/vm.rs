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

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use virtsoc_proto::handshake::{Hello, Reply, MAX_FRAME};
use virtsoc_proto::layout::{ctl, CONTROL_OFFSET, FENCE_PAGE_OFFSET, PAGE};
use virtsoc_proto::ring::Doorbell;
use virtsoc_proto::{SharedWindow, WindowLayout};

use crate::daemon::Daemon;
use crate::link::ShmLink;
use crate::session::Session;
use crate::sync::EventCount;
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
}

impl Current {
    /// Waits for the session thread (after the session was closed) and unregisters it.
    pub fn finish(self, daemon: &Daemon) {
        let _ = self.runner.join();
        daemon.unregister(self.session.guest_id());
    }
}

fn end(daemon: &Daemon, cur: &mut Option<Current>) {
    if let Some(c) = cur.take() {
        c.session.close();
        c.finish(daemon);
    }
}

/// A VM's doorbell connection with its window: what moves between daemons.
pub struct VmPort {
    cfg: VmConfig,
    window: Arc<SharedWindow>,
    stream: UnixStream,
}

impl VmPort {
    /// The VM's name.
    pub fn name(&self) -> &str {
        &self.cfg.name
    }
}

/// What the thread reading a VM's port handed back when asked to stop.
pub struct Handed {
    pub port: VmPort,
    /// The session it was serving.
    pub current: Option<Current>,
}

/// Control of the thread reading one VM's port: stop it and take the port back ([`take`]),
/// or make it let go of the port ([`PortCtl::abandon`]).
pub struct PortCtl {
    wake_tx: UnixStream,
    wake_rx: UnixStream,
    stop: AtomicBool,
    abandoned: AtomicBool,
    handed: Mutex<Option<Handed>>,
    handed_cv: Condvar,
}

impl PortCtl {
    fn new() -> std::io::Result<Arc<Self>> {
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

    fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }
}

/// The port reading thread of each VM guest being served, by guest id.
#[derive(Default)]
pub struct VmPorts(Mutex<HashMap<u64, Arc<PortCtl>>>);

impl VmPorts {
    fn set(&self, guest: u64, ctl: &Arc<PortCtl>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(guest, ctl.clone());
    }

    fn unset(&self, guest: u64) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&guest);
    }

    fn get(&self, guest: u64) -> Option<Arc<PortCtl>> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&guest)
            .cloned()
    }
}

/// Stops the thread reading VM guest `guest`'s port (its session stays open, paused by the
/// caller) and takes the port and the session back.
pub fn take(daemon: &Daemon, guest: u64) -> Result<Handed> {
    let ctl = daemon
        .restart()
        .vm_ports
        .get(guest)
        .ok_or_else(|| HostError::Config(format!("guest {guest} is not a served VM guest")))?;
    ctl.stop.store(true, Ordering::SeqCst);
    ctl.wake();
    let g = ctl.handed.lock().unwrap_or_else(|p| p.into_inner());
    let (mut g, _) = ctl
        .handed_cv
        .wait_timeout_while(g, Duration::from_secs(10), |h| h.is_none())
        .unwrap_or_else(|p| p.into_inner());
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
    stream
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .write_all(&msg)
}

/// Why the port reader woke.
enum Wake {
    Byte(u8),
    Gone,
    Stop,
}

/// The next byte on the port, or a stop request.
fn next_byte(stream: &mut UnixStream, ctl: &PortCtl) -> Wake {
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

/// Serves one connected VM until QEMU hangs up, or until asked to stop (its port moves to
/// another daemon) or to let go of the port.
fn serve_vm(
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
        daemon.restart().vm_ports.set(c.session.guest_id(), ctl);
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
                let mut handed = ctl.handed.lock().unwrap_or_else(|p| p.into_inner());
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
                }
            }
            MSG_BYE => {
                if let Some(c) = &cur {
                    daemon.restart().vm_ports.unset(c.session.guest_id());
                }
                end(daemon, &mut cur)
            }
            MSG_HELLO => {
                if let Some(c) = &cur {
                    daemon.restart().vm_ports.unset(c.session.guest_id());
                }
                end(daemon, &mut cur);
                let hello: Hello = match read_frame(&mut stream)
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok())
                {
                    Some(h) => h,
                    None => {
                        let _ = send_reply(
                            &writer,
                            &Reply::Refused {
                                reason: "bad hello".into(),
                            },
                        );
                        continue;
                    }
                };
                match start_session(daemon, cfg, window, &writer, hello) {
                    Ok(c) => {
                        daemon.restart().vm_ports.set(c.session.guest_id(), ctl);
                        cur = Some(c);
                    }
                    // A migration that did not commit: no answer, the source answers.
                    Err(_) if ctl.is_abandoned() => {}
                    Err(reason) => {
                        log::warn!("VM {}: refusing guest: {reason}", cfg.name);
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
) -> std::result::Result<Current, String> {
    let kind = daemon.check_hello(&hello)?;
    // A new guest instance starts from empty rings and an empty fence page.
    window
        .zero(FENCE_PAGE_OFFSET, 2 * PAGE)
        .map_err(|e| e.to_string())?;
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
    let refused = |reason: String| {
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
        Err(crate::snapshot::restart::Refusal::Refused(reason)) => return Err(refused(reason)),
        Err(crate::snapshot::restart::Refusal::Moved(_)) => {
            return Err(refused(
                "this session moved to another daemon with the VM's port".into(),
            ))
        }
    }
    if let Err(e) = send_reply(writer, &welcome) {
        return Err(refused(e.to_string()));
    }
    log::info!(
        "VM {} guest {guest_id} ({name}) connected, coherence {kind}",
        cfg.name
    );
    let (s, svm, dev) = (
        session.clone(),
        daemon.svm().clone(),
        daemon.devices().clone(),
    );
    let runner = std::thread::Builder::new()
        .name(format!("vm-guest-{guest_id}"))
        .spawn(move || s.run(svm, dev))
        .map_err(|e| e.to_string())?;
    Ok(Current {
        session,
        runner,
        bell,
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

/// The guest's bell seen from the host: a byte on the port when the guest sleeps.
struct PortRinger {
    window: Arc<SharedWindow>,
    port: Arc<Mutex<UnixStream>>,
}

impl PortRinger {
    fn ring(&self) {
        let _ = self
            .port
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .write_all(&[MSG_BELL]);
    }
}

impl Doorbell for PortRinger {
    fn notify(&self) {
        fence(Ordering::SeqCst);
        let sleeping = self
            .window
            .atomic_u32(CONTROL_OFFSET + ctl::GUEST_SLEEPING)
            .map(|f| f.load(Ordering::SeqCst) != 0)
            .unwrap_or(true);
        if sleeping {
            self.ring();
        }
    }

    fn force_wake(&self) {
        self.ring();
    }

    fn wait(&self, ready: &mut dyn FnMut() -> bool, _timeout: Option<Duration>) -> bool {
        // The host never sleeps on the guest's bell.
        ready()
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
