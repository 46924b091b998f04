//! The target side of a live migration: the listener, one receiving thread per incoming
//! migration, and the [`Confirm`] exchange (`RESUMED`, `COMMIT`) that the guest's arrival
//! runs before the guest is welcomed (see the parent module for the protocol).

use std::collections::{BTreeMap, HashSet};
use std::io::{BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use super::{
    expect, send, ACK, ARRIVAL_TIMEOUT, COMMIT, END, ERROR, HELLO, IO_TIMEOUT, MAGIC, MAX_INCOMING,
    READY, RESUMED, STOP,
};
use crate::snapshot::format::{err, read_section_from, Buf, Cursor, Section};
use crate::snapshot::image;
use crate::{Daemon, Result};
use virtsoc_sync::LockExt;

/// Where a target exits on purpose (`virtsocd --migrate-fault PHASE`, for tests of a target
/// that dies mid-migration: the source must resume its guest with nothing lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `precopy`: after the first pre-copied region arrived.
    Precopy,
    /// `stop`: after `STOP`, while the dirty regions and records arrive.
    Stop,
    /// `ready`: right after answering `READY` (the source hands the guest over).
    Ready,
    /// `resume`: when the guest arrives, after restoring it, before `RESUMED`.
    Resume,
}

impl std::str::FromStr for Fault {
    // A `String`: this parses a command-line value (virtsocd's hidden `--migrate-fault`),
    // whose error clap prints as it is after its own words; nothing matches on it.
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "precopy" => Ok(Fault::Precopy),
            "stop" => Ok(Fault::Stop),
            "ready" => Ok(Fault::Ready),
            "resume" => Ok(Fault::Resume),
            _ => Err(format!(
                "unknown migration fault {s:?} (precopy, stop, ready, resume)"
            )),
        }
    }
}

/// Exits the process at fault `at` if it is the one asked for.
fn die_at(fault: Option<Fault>, at: Fault) {
    if fault == Some(at) {
        log::error!("--migrate-fault {at:?}: exiting now, mid-migration");
        std::process::exit(86);
    }
}

/// The pending confirmation of an incoming migration: the connection to its source, kept
/// with the candidate session until the guest arrives.
pub struct Confirm {
    stream: Mutex<Option<TcpStream>>,
    fault: Option<Fault>,
    /// A VM guest's port adopted for this migration, let go if it does not commit.
    vm: Mutex<Option<Arc<crate::vm::PortCtl>>>,
}

impl Confirm {
    /// A confirmation with no connection behind it (unit tests of the bookkeeping).
    #[cfg(test)]
    pub(crate) fn detached() -> Confirm {
        Confirm {
            stream: Mutex::new(None),
            fault: None,
            vm: Mutex::new(None),
        }
    }

    /// The migration did not commit: lets go of the VM port adopted for it, if any (its
    /// source serves it again).
    pub fn abandon(&self) {
        if let Some(ctl) = self.vm.lock_or_recover().take() {
            ctl.abandon();
        }
    }

    /// The guest arrived and its session is restored here: tells the source (`RESUMED`) and
    /// waits for its `COMMIT`. `Err`: not committed (the source resumes the guest itself);
    /// the caller undoes the restore and refuses the guest.
    pub fn confirm(&self) -> Result<()> {
        die_at(self.fault, Fault::Resume);
        // A target told to die right after `READY` that is still exiting when the guest
        // arrives must not confirm either.
        die_at(self.fault, Fault::Ready);
        let s = self
            .stream
            .lock_or_recover()
            .take()
            .ok_or_else(|| err("the migration was already confirmed"))?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        let mut w = BufWriter::new(&s);
        send(&mut w, RESUMED, &[])?;
        w.flush()?;
        drop(w);
        expect(&mut &s, COMMIT)?;
        Ok(())
    }
}

/// Accepts migrations on `addr` (each needs the daemon's token); returns the bound address.
/// With `fault`, the daemon exits at that phase of an incoming migration (tests only).
pub fn listen(daemon: &Arc<Daemon>, addr: SocketAddr, fault: Option<Fault>) -> Result<SocketAddr> {
    let token = daemon
        .config()
        .token
        .clone()
        .ok_or_else(|| crate::HostError::Config("--migrate-listen needs a token".into()))?;
    let l = TcpListener::bind(addr)?;
    let local = l.local_addr()?;
    listen_ports(daemon, &token)?;
    let weak = Arc::downgrade(daemon);
    let busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("migrate-accept".into())
        .spawn(move || {
            use std::sync::atomic::Ordering;
            for conn in l.incoming() {
                let Some(daemon) = weak.upgrade() else { break };
                let Ok(stream) = conn else { continue };
                if busy.fetch_add(1, Ordering::SeqCst) >= MAX_INCOMING {
                    busy.fetch_sub(1, Ordering::SeqCst);
                    let mut w = BufWriter::new(stream);
                    refuse(&mut w, "too many migrations under way");
                    continue;
                }
                let (token, done) = (token.clone(), busy.clone());
                let spawned =
                    std::thread::Builder::new()
                        .name("migrate-in".into())
                        .spawn(move || {
                            let peer = stream.peer_addr().ok();
                            if let Err(e) = receive(&daemon, stream, &token, fault) {
                                log::warn!("incoming migration from {peer:?} failed: {e}");
                            }
                            done.fetch_sub(1, Ordering::SeqCst);
                        });
                if spawned.is_err() {
                    busy.fetch_sub(1, Ordering::SeqCst);
                    log::warn!("cannot start a thread for an incoming migration");
                }
            }
        })?;
    log::info!("virtsocd accepting migrations on {local}");
    Ok(local)
}

/// The Unix socket where a source passes a VM guest's port (next to the daemon's socket).
fn port_socket(daemon: &Daemon) -> std::path::PathBuf {
    let mut p = daemon.config().socket.clone().into_os_string();
    p.push(".migrate");
    p.into()
}

/// Accepts VM ports of incoming migrations (each needs the token and the resume secret of
/// a session parked here as a candidate).
fn listen_ports(daemon: &Arc<Daemon>, token: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let path = port_socket(daemon);
    let _ = std::fs::remove_file(&path);
    let l = std::os::unix::net::UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let weak = Arc::downgrade(daemon);
    let token = token.to_string();
    std::thread::Builder::new()
        .name("migrate-ports".into())
        .spawn(move || {
            for conn in l.incoming() {
                let Some(daemon) = weak.upgrade() else { break };
                let Ok(conn) = conn else { continue };
                let token = token.clone();
                let spawned = std::thread::Builder::new()
                    .name("migrate-port".into())
                    .spawn(move || {
                        let answer = match take_port(&daemon, &conn, &token) {
                            Ok(()) => serde_json::json!({ "ok": true }),
                            Err(e) => {
                                log::warn!("VM port of an incoming migration refused: {e}");
                                serde_json::json!({ "ok": false, "error": e.to_string() })
                            }
                        };
                        let _ = virtsoc_proto::handshake::send_json(&conn, &answer, None);
                    });
                if spawned.is_err() {
                    log::warn!("cannot start a thread for a VM port");
                }
            }
        })?;
    Ok(())
}

/// Receives a VM guest's port (its doorbell connection, then its memory file) and serves it.
fn take_port(
    daemon: &Arc<Daemon>,
    conn: &std::os::unix::net::UnixStream,
    token: &str,
) -> Result<()> {
    use virtsoc_proto::handshake::recv_json;
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    let (header, stream): (serde_json::Value, _) = recv_json(conn)?;
    let (sizes, shm): (serde_json::Value, _) = recv_json(conn)?;
    let given = header["token"].as_str().unwrap_or("");
    if !crate::daemon::constant_time_eq(given.as_bytes(), token.as_bytes()) {
        return Err(err("bad token"));
    }
    let secret = header["secret"].as_str().unwrap_or("");
    let confirm = daemon
        .restart()
        .candidate(secret)
        .ok_or_else(|| err("no incoming migration waits for this port"))?;
    let (Some(stream), Some(shm), Some(size)) = (stream, shm, sizes["size"].as_u64()) else {
        return Err(err("the port or the memory file is missing"));
    };
    let name = header["name"].as_str().unwrap_or("vm");
    let ctl = crate::vm::adopt(
        daemon.clone(),
        name,
        size,
        std::fs::File::from(shm),
        std::os::unix::net::UnixStream::from(stream),
    )?;
    *confirm.vm.lock_or_recover() = Some(ctl);
    Ok(())
}

fn refuse(w: &mut impl Write, msg: &str) {
    let mut b = Buf::default();
    b.string(msg);
    let _ = send(w, ERROR, &[&b.0]);
    let _ = w.flush();
}

/// Receives one migration: everything is validated and parked (as a candidate) before
/// `READY`; then watches the source's connection until the guest's arrival confirms it,
/// dropping the candidate if the source goes away first.
fn receive(daemon: &Daemon, stream: TcpStream, token: &str, fault: Option<Fault>) -> Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut r = BufReader::with_capacity(1 << 20, stream.try_clone()?);
    let mut w = BufWriter::new(stream.try_clone()?);
    let hello = read_section_from(&mut r, 4096)?;
    let mut c = Cursor::new(&hello.payload, "hello");
    let ok = hello.kind == HELLO
        && c.string(16).ok().as_deref() == std::str::from_utf8(MAGIC).ok()
        && c.string(1024)
            .is_ok_and(|t| crate::daemon::constant_time_eq(t.as_bytes(), token.as_bytes()));
    if !ok {
        refuse(&mut w, "bad hello or token");
        return Err(err("bad hello or token"));
    }
    let mut ack = Buf::default();
    ack.string(&daemon.config().socket.to_string_lossy())
        .string(&port_socket(daemon).to_string_lossy());
    send(&mut w, ACK, &[&ack.0])?;
    w.flush()?;
    let img = match assemble(daemon, &mut r, fault) {
        Ok(img) => img,
        Err(e) => {
            refuse(&mut w, &e.to_string());
            return Err(e);
        }
    };
    let n = img.regions.len();
    let secret = img.guest.resume.clone();
    let confirm = Arc::new(Confirm {
        stream: Mutex::new(Some(stream.try_clone()?)),
        fault,
        vm: Mutex::new(None),
    });
    daemon
        .restart()
        .park_candidate(secret.clone(), img, confirm.clone());
    if let Err(e) = send(&mut w, READY, &[]).and_then(|_| w.flush().map_err(Into::into)) {
        daemon.restart().drop_candidate(&secret, &confirm);
        return Err(e);
    }
    log::info!("incoming migration parked: {n} regions, waiting for the guest");
    die_at(fault, Fault::Ready);
    // The source sends nothing more until the guest arrived here (`RESUMED` asks for its
    // `COMMIT`): an end of stream or an error first means it gave up and resumes the guest;
    // a guest that does not come within ARRIVAL_TIMEOUT resumes there too (dropping the
    // candidate closes this connection, which the source takes as a refusal).
    stream.set_read_timeout(Some(ARRIVAL_TIMEOUT))?;
    let mut b = [0u8; 1];
    match stream.peek(&mut b) {
        Ok(n) if n > 0 => Ok(()),
        _ => {
            if daemon.restart().drop_candidate(&secret, &confirm) {
                log::warn!(
                    "incoming migration abandoned by its source before the guest arrived; \
                     candidate session dropped"
                );
            }
            Ok(())
        }
    }
}

/// Reads pre-copy, stop and dirty sections into a validated session image.
fn assemble(
    daemon: &Daemon,
    r: &mut impl std::io::Read,
    fault: Option<Fault>,
) -> Result<image::SessionImage> {
    let max_bytes = daemon.config().guest_mem_limit;
    let max_regions = daemon.config().limits.regions.min(1 << 20);
    let mut regions: BTreeMap<u64, Section> = BTreeMap::new();
    let mut bytes = 0u64;
    let region_id = |s: &Section| -> Result<u64> { Cursor::new(&s.payload, "region").u64() };
    let mut take = |s: Section, regions: &mut BTreeMap<u64, Section>| -> Result<()> {
        let id = region_id(&s)?;
        bytes = bytes.saturating_add(s.payload.len() as u64);
        if bytes > max_bytes.saturating_mul(2) {
            return Err(err(
                "the migration sends more bytes than the guest may hold",
            ));
        }
        regions.insert(id, s);
        if regions.len() as u64 > max_regions {
            return Err(err(
                "the migration sends more regions than a guest may hold",
            ));
        }
        Ok(())
    };
    // Pre-copy, up to STOP.
    let live: HashSet<u64> = loop {
        let s = read_section_from(r, max_bytes.saturating_add(64))?;
        match s.kind {
            image::REGION => {
                take(s, &mut regions)?;
                die_at(fault, Fault::Precopy);
            }
            STOP => {
                die_at(fault, Fault::Stop);
                let mut c = Cursor::new(&s.payload, "stop");
                let n = c.u64()?;
                if n > max_regions || n as usize > c.left() / 8 {
                    return Err(err("stop: bad region count"));
                }
                let ids = (0..n).map(|_| c.u64()).collect::<Result<HashSet<_>>>()?;
                c.end()?;
                break ids;
            }
            k => return Err(err(format!("unexpected section {k} in the pre-copy"))),
        }
    };
    // Dirty regions, then the session's records.
    let guest = loop {
        let s = read_section_from(r, max_bytes.saturating_add(64))?;
        match s.kind {
            image::REGION => take(s, &mut regions)?,
            image::GUEST => break s,
            k => return Err(err(format!("unexpected section {k} after the stop"))),
        }
    };
    let fences = expect(r, image::FENCES)?;
    let devices = expect(r, image::DEVICES)?;
    expect(r, END)?;
    regions.retain(|id, _| live.contains(id));
    if regions.len() != live.len() {
        return Err(err("a live region was never sent"));
    }
    let mut sections = vec![guest, fences];
    sections.extend(regions.into_values());
    sections.push(devices);
    let img = image::decode(sections)?;
    if img.guest.resume.len() < 32 {
        return Err(err("the session has no resume secret"));
    }
    crate::snapshot::devices::check(daemon.devices(), &img.devices)?;
    Ok(img)
}
