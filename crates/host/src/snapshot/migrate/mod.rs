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
//!    it as a *candidate* under the guest's resume secret and answers `READY`;
//! 5. **hand-over**: the source hangs the guest up but keeps its session's state (regions,
//!    fence table, device objects: [`Session::close_keeping_state`]) and answers the guest's
//!    reconnect with `Moved` to the target's socket;
//! 6. the guest presents its secret to the target, which restores the candidate into the
//!    guest's new connection and, before welcoming it, sends `RESUMED` to the source;
//! 7. **commit**: the source answers `COMMIT` and only then releases its copy; the target
//!    welcomes the guest only once it has read `COMMIT`.
//!
//! **The commit point is the source sending `COMMIT`.** Until then the source owns the
//! session and the target's copy is only a candidate: whatever fails before it (the target
//! dies or drops the connection during the pre-copy, the stop-and-copy, after `READY`, or
//! after restoring the guest but before `COMMIT`; the guest does not arrive within
//! [`ARRIVAL_TIMEOUT`]; a section is bad) the source resumes the guest with nothing lost:
//! before the hand-over it simply takes requests again (the guest never noticed); after it,
//! it parks the session it kept under the same resume secret and stops sending the guest
//! away, and the guest library, finding the target gone or refusing, comes back to the
//! source and resumes there (requests it kept are sent again and run exactly once). The
//! target drops its candidate as soon as the migration's connection goes away without
//! `COMMIT`, and refuses a guest whose resume it could not confirm, so the guest never runs
//! in two daemons. After the commit point the target alone holds the session: if it dies
//! then, the session is lost like any session of a daemon that dies.
//!
//! [`migrate`] returns after the hand-over; the commit (or the return of the guest) follows
//! on a thread of the source when the guest has arrived at the target, which an idle guest
//! does at its next call. Downtime is the stop phase plus the guest's reconnect and the `RESUMED`/`COMMIT` round
//! trip; the stop phase's size is the dirty part.
//!
//! A VM guest migrates the same way, its QEMU and ivshmem memory file staying where they
//! are: at the hand-over the source passes the VM's doorbell connection and memory file to
//! the target over a Unix socket the target names in its `ACK` (see [`crate::vm`]), and
//! keeps its own descriptor of the connection and the session's image (the target writes
//! the same window) until the commit.
//!
//! Fault injection for tests: `virtsocd --migrate-fault PHASE` makes a *target* exit at
//! [`Fault`] `PHASE` of its next incoming migration (nothing else reads it).

mod target;
mod vm;

pub use target::{listen, Confirm, Fault};

use std::collections::BTreeMap;
use std::io::{BufReader, BufWriter, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtsoc_svm::{GuestId, RegionId, SvmManager};

use super::format::{err, read_section_from, write_section_to, Buf, Cursor, Section};
use super::image::{self, GuestRecord, SessionImage};
use crate::session::Session;
use crate::{Daemon, Result};

const HELLO: u32 = 100;
const ACK: u32 = 101;
const ERROR: u32 = 102;
const STOP: u32 = 103;
const END: u32 = 104;
const READY: u32 = 105;
const RESUMED: u32 = 106;
const COMMIT: u32 = 107;
const MAGIC: &[u8; 8] = b"VSOCMIG1";

/// Most rounds of pre-copy after the first (each resends what was written during the last).
const PRECOPY_ROUNDS: usize = 4;
/// How long either side waits for the other.
const IO_TIMEOUT: Duration = Duration::from_secs(60);
/// Most incoming migrations served at once (more are refused at once).
const MAX_INCOMING: usize = 4;
/// Largest control section (hello, stop, guest, fences, devices).
const MAX_CONTROL: u64 = 2 << 20;
/// How long a target keeps an incoming migration's candidate for its guest to arrive; then
/// it drops it (closing the migration's connection) and the source resumes the guest.
pub const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(30);

/// What a migration did, as the source saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MigrationReport {
    /// Regions the guest held.
    pub regions: u64,
    /// Bytes sent while the guest ran.
    pub precopy_bytes: u64,
    /// Time of the pre-copy rounds, in milliseconds.
    pub precopy_ms: u64,
    /// Regions and bytes resent after the stop (written during the pre-copy).
    pub dirty_regions: u64,
    /// Bytes resent after the stop (of `dirty_regions`).
    pub dirty_bytes: u64,
    /// From the quiesce to the target's `READY` (the guest's requests wait meanwhile).
    pub stop_ms: u64,
    /// From the request to the hand-over, in milliseconds.
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
/// Returns once the guest is handed over (step 5); the commit follows on a thread of its
/// own when the guest arrived at the target, and if it does not, the guest resumes here.
pub fn migrate(
    daemon: &Arc<Daemon>,
    id: GuestId,
    to: &str,
    token: &str,
) -> Result<MigrationReport> {
    let t0 = Instant::now();
    let s = super::session_of(daemon, id)?;
    let is_vm = match daemon.guest_meta(id).map(|(t, _)| t) {
        Some("unix") => false,
        Some("vm") => true,
        _ => {
            return Err(err(format!(
                "guest {id} is a remote guest: only process and VM guests migrate"
            )))
        }
    };
    let secret = daemon.restart().secret_of(id).ok_or_else(|| {
        err(format!(
            "guest {id} has no resume secret (not a process guest)"
        ))
    })?;
    let mut t = Target::connect(to, token)?;
    if is_vm && t.port_socket.is_none() {
        return Err(err("the target cannot take a VM guest's port"));
    }

    // Pre-copy while the guest runs.
    let mut report = MigrationReport::default();
    let sent = precopy(daemon.svm(), id, &mut t.w, &mut report)?;
    report.precopy_ms = t0.elapsed().as_millis() as u64;

    // Stop and copy the dirty part. Dropping `q` on an error resumes the guest here.
    let t_stop = Instant::now();
    let q = super::quiesce(daemon, &s)?;
    let (kept, ids) = stop_and_copy(daemon, &s, &mut t.w, &sent, &secret, &mut report)?;
    expect(&mut t.r, READY)?;
    report.regions = ids.len() as u64;
    report.stop_ms = t_stop.elapsed().as_millis() as u64;

    // Hand-over: the guest goes to the target; its state stays here until the commit,
    // which comes when the guest arrived there (at its next call, for an idle guest).
    let vm = match (is_vm, &t.port_socket) {
        // A failure here serves the port again; dropping `q` resumes the session.
        (true, Some(to)) => Some(vm::hand_over(daemon, &s, to, token, &secret)?),
        _ => {
            daemon.restart().moved(&secret, &t.socket);
            None
        }
    };
    q.kept();
    s.close_keeping_state();
    // The guest's service channels resume where its session lands (after the session's
    // hang-up, so the guest finds its connection moving when its channels tell it).
    daemon.services().moved(id);
    let vm = vm.map(|mut v| {
        if let Some(c) = v.current.take() {
            c.finish(daemon);
        }
        v
    });
    report.total_ms = t0.elapsed().as_millis() as u64;
    log::info!(
        "guest {id} handed over to {to}: {} regions, pre-copy {} bytes in {} ms, {} dirty \
         bytes, stopped {} ms; waiting for the target to confirm its resume",
        report.regions,
        report.precopy_bytes,
        report.precopy_ms,
        report.dirty_bytes,
        report.stop_ms
    );
    let pending = Pending {
        daemon: daemon.clone(),
        session: s,
        kept,
        ids,
        r: t.r,
        w: t.w,
        since: Instant::now(),
        vm,
    };
    let spawned = std::thread::Builder::new()
        .name(format!("migrate-commit-{id}"))
        .spawn(move || pending.commit());
    if let Err(e) = spawned {
        // Without a thread nothing can wait for the target: the guest resumes here (the
        // target drops its candidate when this connection closes).
        log::warn!("guest {id}: cannot wait for the commit: {e}");
        return Err(err(format!("cannot wait for the commit: {e}")));
    }
    Ok(report)
}

/// The source's connection to the target's migration listener, past the hello.
struct Target {
    r: BufReader<TcpStream>,
    w: BufWriter<TcpStream>,
    /// The target daemon's guest socket (where a process guest reconnects).
    socket: String,
    /// Where a VM guest's port goes (an older target names none).
    port_socket: Option<String>,
}

impl Target {
    /// Connects to `to`, says hello with `token` and reads the target's acknowledgement.
    fn connect(to: &str, token: &str) -> Result<Target> {
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
        let mut ack = Cursor::new(&ack.payload, "ack");
        let socket = ack.string(4096)?;
        let port_socket = ack.string(4096).ok();
        Ok(Target {
            r,
            w,
            socket,
            port_socket,
        })
    }
}

/// Sends one region's image; its bytes' length.
fn send_region(w: &mut impl Write, img: &virtsoc_svm::RegionImage) -> Result<u64> {
    let bytes = img.bytes.as_deref().unwrap_or(&[]);
    send(
        w,
        image::REGION,
        &[&image::encode_region_header(img), bytes],
    )?;
    Ok(bytes.len() as u64)
}

/// Pre-copy while the guest runs: every region, then further rounds resending what the
/// guest wrote meanwhile, as long as that shrinks (what is left for the stop is what it
/// writes during the last round). The version of each region sent.
fn precopy(
    svm: &SvmManager,
    id: GuestId,
    w: &mut impl Write,
    report: &mut MigrationReport,
) -> Result<BTreeMap<RegionId, u64>> {
    let mut sent: BTreeMap<RegionId, u64> = BTreeMap::new();
    for rid in svm.region_ids(id)? {
        let Ok((img, version)) = svm.export_region_versioned(id, rid) else {
            continue; // freed meanwhile
        };
        report.precopy_bytes += send_region(w, &img)?;
        sent.insert(rid, version);
    }
    w.flush()?;
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
            let n = send_region(w, &img)?;
            report.precopy_bytes += n;
            resent += n;
            sent.insert(rid, version);
        }
        w.flush()?;
        if resent == 0 || resent >= last {
            break;
        }
        last = resent;
    }
    Ok(sent)
}

/// With the guest stopped: the list of its regions, those written since their pre-copy,
/// its record, fences and device records, and the end. What the source keeps until the
/// commit (the records; its regions are read only if needed) and the region ids.
fn stop_and_copy(
    daemon: &Daemon,
    s: &Session,
    w: &mut impl Write,
    sent: &BTreeMap<RegionId, u64>,
    secret: &str,
    report: &mut MigrationReport,
) -> Result<(SessionImage, Vec<RegionId>)> {
    let id = s.guest_id();
    let svm = daemon.svm();
    let ids = svm.region_ids(id)?;
    let mut stop = Buf::default();
    stop.u64(ids.len() as u64);
    for rid in &ids {
        stop.u64(rid.0);
    }
    send(w, STOP, &[&stop.0])?;
    for rid in &ids {
        if sent.get(rid) == Some(&svm.region_version(id, *rid)?) {
            continue;
        }
        let (img, _) = svm.export_region_versioned(id, *rid)?;
        report.dirty_regions += 1;
        report.dirty_bytes += send_region(w, &img)?;
    }
    let rec = GuestRecord {
        name: s.name().chars().take(256).collect(),
        protocol: daemon
            .guest_meta(id)
            .map(|(_, p)| p)
            .unwrap_or(daemon.config().protocol)
            .name()
            .to_string(),
        source_guest: id.0,
        next_region_id: svm.next_region_id(id)?.0,
        resume: secret.to_string(),
    };
    send(
        w,
        image::GUEST,
        &[&image::encode_guest(&rec, ids.len() as u64)],
    )?;
    let fences = s.fences().export();
    send(w, image::FENCES, &[&image::encode_fences(&fences)])?;
    let recs = super::devices::capture(daemon.devices(), id);
    send(w, image::DEVICES, &[&image::encode_devices(&recs)?])?;
    send(w, END, &[])?;
    w.flush()?;
    let kept = SessionImage {
        guest: rec,
        fences,
        regions: Vec::new(),
        devices: recs,
    };
    Ok((kept, ids))
}

/// A migration handed over and not committed yet: the source's side of steps 6 and 7.
struct Pending {
    daemon: Arc<Daemon>,
    session: Arc<Session>,
    /// The records taken before the session closed (its regions are read only if needed).
    kept: SessionImage,
    ids: Vec<RegionId>,
    r: BufReader<TcpStream>,
    w: BufWriter<TcpStream>,
    since: Instant,
    /// A VM guest's port (this daemon's descriptor of it) and its session's image.
    vm: Option<vm::Moving>,
}

impl Pending {
    /// Waits for the target's `RESUMED`, answers `COMMIT` (the commit point) and releases
    /// the session kept here; on anything else resumes the guest here.
    fn commit(mut self) {
        let id = self.session.guest_id();
        let confirmed = self
            .r
            .get_ref()
            .set_read_timeout(Some(ARRIVAL_TIMEOUT + IO_TIMEOUT))
            .map_err(crate::HostError::from)
            .and_then(|_| expect(&mut self.r, RESUMED))
            .and_then(|_| send(&mut self.w, COMMIT, &[]))
            .and_then(|_| self.w.flush().map_err(crate::HostError::from));
        match confirmed {
            Ok(()) => {
                // Committed: the target holds the session now (and a VM guest's window:
                // releasing the regions here must not zero what the target keeps there).
                if self.vm.is_some() {
                    let _ = self.daemon.svm().disown_window(id);
                }
                self.session
                    .release(self.daemon.svm(), self.daemon.devices());
                log::info!(
                    "guest {id}: migration committed, {} ms after the hand-over",
                    self.since.elapsed().as_millis()
                );
            }
            Err(e) => {
                log::warn!("guest {id}: the target did not confirm the guest's resume: {e}");
                match self.vm {
                    Some(v) => v.resume_here(&self.daemon, &self.session),
                    None => resume_here(&self.daemon, &self.session, self.kept, &self.ids),
                }
            }
        }
    }
}

/// The migration did not commit after the hand-over: parks the session `s` kept (its
/// regions `ids` read now, the records in `kept` taken before it closed) under its resume
/// secret here, so the guest, coming back, resumes it; then releases the old session.
fn resume_here(daemon: &Daemon, s: &Session, mut kept: SessionImage, ids: &[RegionId]) {
    let id = s.guest_id();
    let svm = daemon.svm();
    let regions: Result<Vec<_>> = ids
        .iter()
        .map(|r| svm.export_region(id, *r).map_err(crate::HostError::from))
        .collect();
    match regions {
        Ok(regions) => {
            kept.regions = regions;
            let secret = kept.guest.resume.clone();
            daemon.restart().park_returned(secret, kept);
            log::warn!("guest {id}: migration not committed; the guest resumes here");
        }
        // Cannot happen short of a bug (the regions were kept); say so loudly.
        Err(e) => log::error!("guest {id}: migration not committed and its session lost: {e}"),
    }
    s.release(svm, daemon.devices());
}
