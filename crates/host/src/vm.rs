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

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex};
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
                match conn {
                    Ok(stream) => serve_vm(&daemon, &cfg, &window, stream),
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

struct Current {
    session: Arc<Session>,
    runner: std::thread::JoinHandle<()>,
    bell: Arc<EventCount>,
}

fn end(daemon: &Daemon, cur: &mut Option<Current>) {
    if let Some(c) = cur.take() {
        c.session.close();
        let _ = c.runner.join();
        daemon.config().sharing.detach_cpu(c.session.guest_id());
        daemon.unregister(c.session.guest_id());
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
    stream
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .write_all(&msg)
}

/// Serves one connected VM until QEMU hangs up.
fn serve_vm(
    daemon: &Arc<Daemon>,
    cfg: &VmConfig,
    window: &Arc<SharedWindow>,
    mut stream: UnixStream,
) {
    log::info!("VM {} connected", cfg.name);
    let writer = match stream.try_clone() {
        Ok(w) => Arc::new(Mutex::new(w)),
        Err(e) => return log::warn!("VM {}: {e}", cfg.name),
    };
    let mut cur: Option<Current> = None;
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        match byte[0] {
            MSG_BELL => {
                if let Some(c) = &cur {
                    c.bell.notify();
                }
            }
            MSG_BYE => end(daemon, &mut cur),
            MSG_HELLO => {
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
                    Ok(c) => cur = Some(c),
                    Err(reason) => {
                        log::warn!("VM {}: refusing guest: {reason}", cfg.name);
                        let _ = send_reply(&writer, &Reply::Refused { reason });
                    }
                }
            }
            other => log::debug!("VM {}: ignoring port byte {other:#x}", cfg.name),
        }
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
    send_reply(writer, &daemon.welcome(&a)).map_err(|e| e.to_string())?;
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
    log::info!(
        "VM {} guest {guest_id} ({name}) connected, coherence {kind}",
        cfg.name
    );
    daemon.register(&session);
    // The VM's process is QEMU, the peer of its virtio-serial socket.
    let qemu = writer.lock().ok().and_then(|w| crate::cgroup::peer_pid(&w));
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
