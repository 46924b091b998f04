//! Snapshots of guest sessions: save one guest's session to a file, restore it into a
//! session of this or another daemon with the same region ids, fence ids and bytes.
//!
//! - [`format`](mod@format): the versioned container (magic, version, sections with CRC-32s, trailer),
//!   written atomically and read back with every length and checksum checked;
//! - [`image`]: what a session image holds (guest record, fence table, regions, device
//!   records) and its encoding;
//! - [`devices`]: device objects as records of the commands that made them;
//! - [`restart`]: sessions kept across a daemon restart (`--state-dir`);
//! - [`migrate`]: live migration of a session to another daemon over TCP.
//!
//! Saving quiesces the guest first ([`quiesce`]): its session stops taking requests, and
//! every command it queued on a device (copies and GPU submissions included) completes;
//! then each region's current bytes are read (back from device memory where that is the
//! only valid copy) and streamed to the file one region at a time; then the guest resumes.
//! Restoring reads and validates the whole file before touching anything, then imports into
//! a session that has not allocated or created anything yet, and undoes what it imported if
//! any step fails: nothing is ever restored partially, and other guests are never affected.

pub mod devices;
pub mod format;
pub mod image;
pub mod migrate;
pub mod restart;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use virtsoc_svm::{GuestId, RegionId};

use crate::session::Session;
use crate::{Daemon, Result};
pub use format::{read_sections, SnapshotWriter};
pub use image::{GuestRecord, SessionImage};

/// How long a quiesce waits for the guest's device queues to drain.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// What a save or load did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// Regions saved or restored.
    pub regions: u64,
    /// Bytes of region contents.
    pub region_bytes: u64,
    /// Size of the file.
    pub file_bytes: u64,
    /// Wall time, quiesce included.
    pub ms: u64,
}

/// The live session of guest `id`.
pub fn session_of(daemon: &Daemon, id: GuestId) -> Result<Arc<Session>> {
    daemon
        .sessions()
        .into_iter()
        .find(|s| s.guest_id() == id && !s.is_closed())
        .ok_or_else(|| format::err(format!("no guest {id}")))
}

/// A paused session (and its host service channels); resumes when dropped (unless
/// [`kept`](Self::kept)).
pub struct Quiesced(Option<(Arc<Session>, Arc<crate::services::ServiceDevice>)>);

impl Quiesced {
    /// Leaves the session paused for good (the daemon is stopping, or it moved away).
    pub fn kept(mut self) {
        self.0 = None;
    }
}

impl Drop for Quiesced {
    fn drop(&mut self) {
        if let Some((s, services)) = self.0.take() {
            services.resume_guest(s.guest_id());
            s.resume();
        }
    }
}

/// Stops `session` taking requests and waits for its device queues to drain, and for its
/// host service channels to answer what they are running and take no more. On a queue or
/// a channel that does not drain in time the session resumes and this fails.
pub fn quiesce(daemon: &Daemon, session: &Arc<Session>) -> Result<Quiesced> {
    session.pause();
    let q = Quiesced(Some((session.clone(), daemon.services().clone())));
    let id = session.guest_id();
    let failed = |e: &dyn std::fmt::Display| format::err(format!("quiesce of guest {id}: {e}"));
    session
        .drain_queues(DRAIN_TIMEOUT)
        .map_err(|e| failed(&e))?;
    daemon
        .services()
        .pause_guest(id, DRAIN_TIMEOUT)
        .map_err(|e| failed(&e))?;
    Ok(q)
}

fn record_of(daemon: &Daemon, s: &Session, resume: &str) -> Result<GuestRecord> {
    let id = s.guest_id();
    let protocol = daemon
        .guest_meta(id)
        .map(|(_, p)| p)
        .unwrap_or(daemon.config().protocol);
    Ok(GuestRecord {
        name: s.name().chars().take(256).collect(),
        protocol: protocol.name().to_string(),
        source_guest: id.0,
        next_region_id: daemon.svm().next_region_id(id)?.0,
        resume: resume.to_string(),
    })
}

/// Captures guest `id`'s session in memory (the caller quiesced it).
pub fn capture(daemon: &Daemon, s: &Session) -> Result<SessionImage> {
    let id = s.guest_id();
    let svm = daemon.svm();
    let regions = svm
        .region_ids(id)?
        .into_iter()
        .map(|r| svm.export_region(id, r))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(SessionImage {
        guest: record_of(daemon, s, "")?,
        fences: s.fences().export(),
        regions,
        devices: devices::capture(daemon.devices(), id),
    })
}

/// Writes an image to `path` atomically; returns the file's size.
pub fn write_image(path: &Path, img: &SessionImage) -> Result<u64> {
    let mut w = SnapshotWriter::create(path, 3 + img.regions.len() as u32)?;
    w.section(
        image::GUEST,
        &[&image::encode_guest(&img.guest, img.regions.len() as u64)],
    )?;
    w.section(image::FENCES, &[&image::encode_fences(&img.fences)])?;
    for r in &img.regions {
        let h = image::encode_region_header(r);
        w.section(image::REGION, &[&h, r.bytes.as_deref().unwrap_or(&[])])?;
    }
    w.section(image::DEVICES, &[&image::encode_devices(&img.devices)?])?;
    w.finish()
}

/// Reads and validates a snapshot file into an image (nothing is restored).
pub fn read_image(path: &Path) -> Result<SessionImage> {
    image::decode(read_sections(path)?)
}

/// Saves guest `id`'s session to `path`: quiesces it, streams its regions to the file one at
/// a time, resumes it.
pub fn save(daemon: &Daemon, id: GuestId, path: &Path) -> Result<Report> {
    save_session(daemon, &session_of(daemon, id)?, path, "", true)
}

/// Saves `s` to `path` with resume secret `resume` (empty: none); resumes it afterwards only
/// if `resume_after`.
pub fn save_session(
    daemon: &Daemon,
    s: &Arc<Session>,
    path: &Path,
    resume: &str,
    resume_after: bool,
) -> Result<Report> {
    let t0 = Instant::now();
    let id = s.guest_id();
    let q = quiesce(daemon, s)?;
    let svm = daemon.svm();
    let ids = svm.region_ids(id)?;
    let count = u32::try_from(ids.len() + 3).map_err(|_| format::err("too many regions"))?;
    let mut w = SnapshotWriter::create(path, count)?;
    w.section(
        image::GUEST,
        &[&image::encode_guest(
            &record_of(daemon, s, resume)?,
            ids.len() as u64,
        )],
    )?;
    w.section(
        image::FENCES,
        &[&image::encode_fences(&s.fences().export())],
    )?;
    let mut report = Report::default();
    for r in ids {
        let img = svm.export_region(id, r)?;
        let h = image::encode_region_header(&img);
        let bytes = img.bytes.as_deref().unwrap_or(&[]);
        w.section(image::REGION, &[&h, bytes])?;
        report.regions += 1;
        report.region_bytes += bytes.len() as u64;
    }
    let recs = devices::capture(daemon.devices(), id);
    w.section(image::DEVICES, &[&image::encode_devices(&recs)?])?;
    report.file_bytes = w.finish()?;
    if !resume_after {
        // The session is saved for the next daemon: its channels resume there.
        daemon.services().moved(id);
        q.kept();
    }
    report.ms = t0.elapsed().as_millis() as u64;
    log::info!(
        "guest {id}: saved {} regions ({} bytes) to {}",
        report.regions,
        report.region_bytes,
        path.display()
    );
    Ok(report)
}

/// Restores `img` into guest `id`'s session, which must not have allocated a region or
/// created a fence yet. All or nothing: on any failure what was imported is freed again.
pub fn restore(daemon: &Daemon, id: GuestId, img: &SessionImage) -> Result<Report> {
    let s = session_of(daemon, id)?;
    devices::check(daemon.devices(), &img.devices)?;
    img.fences
        .validate()
        .map_err(|e| format::err(e.to_string()))?;
    let _q = quiesce(daemon, &s)?;
    let svm = daemon.svm();
    if !svm.region_ids(id)?.is_empty() || !s.is_fresh() {
        return Err(format::err(format!(
            "guest {id} already holds regions or fences: a snapshot is restored only into a \
             fresh session"
        )));
    }
    let undo = |done: &[u64]| {
        for r in done {
            let _ = svm.free(id, RegionId(*r));
        }
    };
    let mut done = Vec::with_capacity(img.regions.len());
    for r in &img.regions {
        if let Err(e) = svm.import_region(id, r) {
            undo(&done);
            return Err(format::err(format!("region {}: {e}", r.id)));
        }
        done.push(r.id);
    }
    if let Err(e) = s.fences().import(&img.fences) {
        undo(&done);
        return Err(format::err(format!("fence table: {e}")));
    }
    svm.reserve_ids(id, RegionId(img.guest.next_region_id))?;
    let refused = devices::restore(daemon.devices(), id, &img.devices);
    if !refused.is_empty() {
        log::warn!("guest {id}: device objects of {refused:?} not restored");
    }
    Ok(Report {
        regions: img.regions.len() as u64,
        region_bytes: img.region_bytes(),
        ..Report::default()
    })
}

/// Loads the snapshot at `path` into guest `id`'s (fresh) session.
pub fn load(daemon: &Daemon, path: &Path, id: GuestId) -> Result<Report> {
    let t0 = Instant::now();
    let img = read_image(path)?;
    let mut report = restore(daemon, id, &img)?;
    report.file_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    report.ms = t0.elapsed().as_millis() as u64;
    log::info!(
        "guest {id}: restored {} regions from {}",
        report.regions,
        path.display()
    );
    Ok(report)
}

#[cfg(test)]
mod tests;
