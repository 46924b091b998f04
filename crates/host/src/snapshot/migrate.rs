//! Live migration of a guest session between two daemons over TCP (`virtsocd
//! --migrate-listen ADDR`, the daemon's token required).
//!
//! The source streams sections in the snapshot format (each with its CRC-32):
//!
//! 1. `HELLO` (magic and the target's token) -> the target answers `ACK` with its Unix
//!    socket, or `ERROR`;
//! 2. **pre-copy**: every region while the guest keeps running, with the write version it
//!    was read at; then, for a few rounds while it shrinks, the regions written meanwhile;
//! 3. **stop**: the guest is quiesced (no request taken, its device queues drained: copies
//!    and GPU submissions in flight complete); the source sends `STOP` with the live region
//!    ids, the regions whose version moved since they were sent (the dirty part), the guest
//!    record (with its resume secret), the fence table and the device records, then `END`;
//! 4. the target assembles and validates the whole image exactly as it reads a file, parks
//!    it under the guest's resume secret and answers `READY`;
//! 5. the source closes the guest's session and remembers where it went: the guest library,
//!    reconnecting to its socket, is told `Moved` to the target's socket, where its session
//!    is restored with the same region ids, fence ids and bytes.
//!
//! If anything fails before `READY` (the target dies, refuses, or a section is bad) the source
//! resumes the guest where it was: it never noticed. Downtime is the stop phase only (plus the
//! guest's reconnect), whose size is the dirty part.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::format::{err, read_section_from, write_section_to, Buf, Cursor, Section};
use super::image::{self, GuestRecord};
use crate::{Daemon, Result};

const HELLO: u32 = 100;
const ACK: u32 = 101;
const ERROR: u32 = 102;
const STOP: u32 = 103;
const END: u32 = 104;
const READY: u32 = 105;
const MAGIC: &[u8; 8] = b"VSOCMIG1";

/// Most rounds of pre-copy after the first (each resends what was written during the last).
const PRECOPY_ROUNDS: usize = 4;
/// How long either side waits for the other.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// Most incoming migrations served at once (more are refused at once).
const MAX_INCOMING: usize = 4;
/// Largest control section (hello, stop, guest, fences, devices).
const MAX_CONTROL: u64 = 2 << 20;

/// What a migration did, as the source saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MigrationReport {
    pub regions: u64,
    /// Bytes sent while the guest ran.
    pub precopy_bytes: u64,
    pub precopy_ms: u64,
    /// Regions and bytes resent after the stop (written during the pre-copy).
    pub dirty_regions: u64,
    pub dirty_bytes: u64,
    /// From the quiesce to the target's `READY` (the guest's requests wait meanwhile).
    pub stop_ms: u64,
    pub total_ms: u64,
}

fn send(w: &mut impl Write, kind: u32, parts: &[&[u8]]) -> Result<()> {
    write_section_to(w, kind, parts)
}

fn expect(r: &mut impl std::io::Read, kind: u32) -> Result<Section> {
    let s = read_section_from(r, MAX_CONTROL)?;
    if s.kind == ERROR {
        let msg = Cursor::new(&s.payload, "error").string(4096)?;
        return Err(err(format!("the target refused: {msg}")));
    }
    if s.kind != kind {
        return Err(err(format!("expected section {kind}, got {}", s.kind)));
    }
    Ok(s)
}

/// Migrates guest `id` to the daemon whose migration listener is `to`, presenting `token`.
pub fn migrate(daemon: &Daemon, id: u64, to: &str, token: &str) -> Result<MigrationReport> {
    let t0 = Instant::now();
    let s = super::session_of(daemon, id)?;
    let secret = daemon.restart().secret_of(id).ok_or_else(|| {
        err(format!(
            "guest {id} has no resume secret (not a process guest)"
        ))
    })?;
    let stream = TcpStream::connect(to)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let _ = stream.set_nodelay(true);
    let mut r = BufReader::new(stream.try_clone()?);
    let mut w = BufWriter::with_capacity(1 << 20, stream);
    let mut hello = Buf::default();
    hello
        .string(std::str::from_utf8(MAGIC).unwrap_or(""))
        .string(token);
    send(&mut w, HELLO, &[&hello.0])?;
    w.flush()?;
    let ack = expect(&mut r, ACK)?;
    let target_socket = Cursor::new(&ack.payload, "ack").string(4096)?;

    // Pre-copy while the guest runs.
    let svm = daemon.svm();
    let mut report = MigrationReport::default();
    let mut sent: BTreeMap<u64, u64> = BTreeMap::new();
    for rid in svm.region_ids(id)? {
        let Ok((img, version)) = svm.export_region_versioned(id, rid) else {
            continue; // freed meanwhile
        };
        let bytes = img.bytes.as_deref().unwrap_or(&[]);
        send(
            &mut w,
            image::REGION,
            &[&image::encode_region_header(&img), bytes],
        )?;
        report.precopy_bytes += bytes.len() as u64;
        sent.insert(rid, version);
    }
    w.flush()?;
    // Further rounds resend what the guest wrote meanwhile, while it keeps running, as long
    // as that shrinks: what is left for the stop is what it writes during the last round.
    let mut last = u64::MAX;
    for _ in 0..PRECOPY_ROUNDS {
        let mut resent = 0u64;
        for rid in svm.region_ids(id)? {
            let Ok(v) = svm.region_version(id, rid) else {
                continue;
            };
            if sent.get(&rid) == Some(&v) {
                continue;
            }
            let Ok((img, version)) = svm.export_region_versioned(id, rid) else {
                continue;
            };
            let bytes = img.bytes.as_deref().unwrap_or(&[]);
            send(
                &mut w,
                image::REGION,
                &[&image::encode_region_header(&img), bytes],
            )?;
            report.precopy_bytes += bytes.len() as u64;
            resent += bytes.len() as u64;
            sent.insert(rid, version);
        }
        w.flush()?;
        if resent == 0 || resent >= last {
            break;
        }
        last = resent;
    }
    report.precopy_ms = t0.elapsed().as_millis() as u64;

    // Stop and copy the dirty part. Dropping `q` on an error resumes the guest here.
    let t_stop = Instant::now();
    let q = super::quiesce(&s)?;
    let ids = svm.region_ids(id)?;
    let mut stop = Buf::default();
    stop.u64(ids.len() as u64);
    for rid in &ids {
        stop.u64(*rid);
    }
    send(&mut w, STOP, &[&stop.0])?;
    for rid in &ids {
        if sent.get(rid) == Some(&svm.region_version(id, *rid)?) {
            continue;
        }
        let (img, _) = svm.export_region_versioned(id, *rid)?;
        let bytes = img.bytes.as_deref().unwrap_or(&[]);
        send(
            &mut w,
            image::REGION,
            &[&image::encode_region_header(&img), bytes],
        )?;
        report.dirty_regions += 1;
        report.dirty_bytes += bytes.len() as u64;
    }
    let rec = GuestRecord {
        name: s.name().chars().take(256).collect(),
        protocol: daemon
            .guest_meta(id)
            .map(|(_, p)| p)
            .unwrap_or(daemon.config().protocol)
            .name()
            .to_string(),
        source_guest: id,
        next_region_id: svm.next_region_id(id)?,
        resume: secret.clone(),
    };
    send(
        &mut w,
        image::GUEST,
        &[&image::encode_guest(&rec, ids.len() as u64)],
    )?;
    send(
        &mut w,
        image::FENCES,
        &[&image::encode_fences(&s.fences().export())],
    )?;
    let recs = super::devices::capture(daemon.devices(), id);
    send(&mut w, image::DEVICES, &[&image::encode_devices(&recs)?])?;
    send(&mut w, END, &[])?;
    w.flush()?;
    expect(&mut r, READY)?;
    // The target holds the session now: send the guest there.
    daemon.restart().moved(&secret, &target_socket);
    q.kept();
    s.close();
    report.regions = ids.len() as u64;
    report.stop_ms = t_stop.elapsed().as_millis() as u64;
    report.total_ms = t0.elapsed().as_millis() as u64;
    log::info!(
        "guest {id} migrated to {to}: {} regions, pre-copy {} bytes in {} ms, {} dirty bytes, \
         stopped {} ms",
        report.regions,
        report.precopy_bytes,
        report.precopy_ms,
        report.dirty_bytes,
        report.stop_ms
    );
    Ok(report)
}

/// Accepts migrations on `addr` (each needs the daemon's token); returns the bound address.
pub fn listen(daemon: &Arc<Daemon>, addr: SocketAddr) -> Result<SocketAddr> {
    let token = daemon
        .config()
        .token
        .clone()
        .ok_or_else(|| crate::HostError::Config("--migrate-listen needs a token".into()))?;
    let l = TcpListener::bind(addr)?;
    let local = l.local_addr()?;
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
                            if let Err(e) = receive(&daemon, stream, &token) {
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

fn refuse(w: &mut impl Write, msg: &str) {
    let mut b = Buf::default();
    b.string(msg);
    let _ = send(w, ERROR, &[&b.0]);
    let _ = w.flush();
}

/// Receives one migration: everything is validated and parked before `READY`.
fn receive(daemon: &Daemon, stream: TcpStream, token: &str) -> Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut r = BufReader::with_capacity(1 << 20, stream.try_clone()?);
    let mut w = BufWriter::new(stream);
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
    ack.string(&daemon.config().socket.to_string_lossy());
    send(&mut w, ACK, &[&ack.0])?;
    w.flush()?;
    match assemble(daemon, &mut r) {
        Ok(img) => {
            let n = img.regions.len();
            let secret = img.guest.resume.clone();
            daemon.restart().park(secret, img);
            send(&mut w, READY, &[])?;
            w.flush()?;
            log::info!("incoming migration parked: {n} regions, waiting for the guest");
            Ok(())
        }
        Err(e) => {
            refuse(&mut w, &e.to_string());
            Err(e)
        }
    }
}

/// Reads pre-copy, stop and dirty sections into a validated session image.
fn assemble(daemon: &Daemon, r: &mut impl std::io::Read) -> Result<image::SessionImage> {
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
            image::REGION => take(s, &mut regions)?,
            STOP => {
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
    super::devices::check(daemon.devices(), &img.devices)?;
    Ok(img)
}
