//! A guest's forwarding thread ([`forward`]): runs its jobs on its render worker (started at
//! the first one), one at a time, and answers the guest from the worker's answers; and the
//! guest's GL memory charge ([`GlCharge`]).
//!
//! A job whose bytes are in shared replicas ([`Mapped`]) goes as the daemon's own message
//! (the maps it needs first, `gles_maps.rs`); a batch the daemon copied (a replica that is
//! not shared) goes as it is.

use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use virtsoc_devapi::gles::ExecReply;
use virtsoc_proto::Status;
use virtsoc_svm::{GuestId, MemoryCharge, RegionId, SvmManager};

use super::maps::{Mapped, Maps};
use super::worker::{Answer, DeviceClock, Worker, WorkerError};
use super::{
    frame, image, inline_reply, lock, Job, Kind, Shared, ANSWER_BAD_STREAM, ANSWER_OK, FROM_DAEMON,
    INLINE_REPLY,
};
use crate::cgroup::CpuCgroups;
use crate::device::{DeviceCtx, DeviceResult};

/// The guest's GL memory as charged against its memory limit: a charge per growth, merged
/// into one when the total shrinks or the pieces pile up.
#[derive(Default)]
pub(super) struct GlCharge {
    parts: Vec<MemoryCharge>,
    bytes: u64,
}

impl GlCharge {
    /// Most pieces held before they are merged into one charge.
    const MAX_PARTS: usize = 16;

    /// Charges `bytes` in all; `Err` (nothing charged then) when the limit refuses it.
    pub(super) fn set(
        &mut self,
        svm: &SvmManager,
        guest: GuestId,
        bytes: u64,
    ) -> Result<(), WorkerError> {
        if bytes == self.bytes {
            return Ok(());
        }
        let refused = |source| WorkerError::OverLimit { bytes, source };
        if bytes > self.bytes && self.parts.len() < Self::MAX_PARTS {
            let part = svm.charge(guest, bytes - self.bytes).map_err(|e| {
                self.clear();
                refused(e)
            })?;
            self.parts.push(part);
        } else {
            self.clear();
            if bytes > 0 {
                self.parts.push(svm.charge(guest, bytes).map_err(refused)?);
            }
        }
        self.bytes = bytes;
        Ok(())
    }

    /// Gives everything back.
    pub(super) fn clear(&mut self) {
        self.parts.clear();
        self.bytes = 0;
    }
}

/// Where a guest's render worker goes: its guest's CPU group, when the daemon steers CPU
/// weights (so the GL's CPU time, the device on a CPU driver, weighs the guest's share);
/// and who hears the line it starts with (the shader precision, for the backend line).
pub(super) struct Placement {
    pub(super) guest: GuestId,
    pub(super) cgroups: Option<Arc<CpuCgroups>>,
    pub(super) precision: super::precision::PrecisionLine,
}

impl Placement {
    fn place(&self, child: &mut std::process::Child) {
        if let Some(cg) = &self.cgroups {
            if let Err(e) = cg.attach_worker(self.guest, child.id()) {
                log::warn!("gles: guest {}: {e}", self.guest);
            }
        }
        if let Some(out) = child.stdout.take() {
            self.precision.listen(out);
        }
    }
}

/// A guest's forwarding thread: runs its batches on its worker (started at the first one)
/// until the device drops the guest.
pub(super) fn forward(
    program: &Path,
    deadline: Duration,
    jobs: mpsc::Receiver<Job>,
    shared: &Mutex<Shared>,
    place: &Placement,
) {
    let mut worker: Option<Worker> = None;
    let mut maps = Maps::default();
    let mut charge = GlCharge::default();
    let mut clock = DeviceClock::new();
    while let Ok(job) = jobs.recv() {
        let lost = lock(shared).lost.clone();
        if let Some(why) = lost {
            job.reply.send_because(Err(Status::DeviceError), Some(why));
            continue;
        }
        if worker.is_none() {
            match Worker::start(program, deadline) {
                Ok(mut w) => {
                    place.place(&mut w.child);
                    lock(shared).sock = w.sock.try_clone().ok();
                    clock = DeviceClock::since(w.cpu_ns().unwrap_or(0));
                    worker = Some(w);
                    maps = Maps::default();
                }
                Err(e) => {
                    log::warn!("gles: guest {}: {e}", job.guest);
                    let why = format!("context lost: {e}");
                    lock(shared).lost = Some(why.clone());
                    job.reply.send_because(Err(Status::DeviceError), Some(why));
                    continue;
                }
            }
        }
        let Some(w) = worker.as_mut() else { continue };
        let answer = call(w, &mut maps, &job);
        let cpu = w.cpu_ns().unwrap_or(0);
        let mut job = job;
        let answer = answer.and_then(|(a, sent)| {
            job.reply.busy_for(clock.batch(sent, cpu));
            charge.set(&job.svm, job.guest, a.used.gl_bytes)?;
            Ok(a)
        });
        let a = match answer {
            Ok(a) if a.status == ANSWER_OK || a.status == ANSWER_BAD_STREAM => a,
            failed => {
                charge.clear();
                let ended = worker.take().map(Worker::end).unwrap_or_default();
                let why = match failed {
                    Err(e) => format!("context lost: {e}; {ended}"),
                    Ok(a) => format!("context lost: {}; {ended}", a.msg),
                };
                log::warn!("gles: guest {}: {why}", job.guest);
                let mut sh = lock(shared);
                sh.lost = Some(why.clone());
                sh.sock = None;
                drop(sh);
                job.reply.send_because(Err(Status::DeviceError), Some(why));
                continue;
            }
        };
        lock(shared).stats.worker_mappings = a.mapped as u64;
        if a.status == ANSWER_BAD_STREAM {
            job.reply
                .send_because(Err(Status::BadArgument), Some(a.msg));
            continue;
        }
        let cx = DeviceCtx::new(job.guest, &job.svm, job.domain, &job.fences);
        let result = answer_job(&cx, &job, a, shared, worker.as_mut());
        job.reply.send_because(result, cx.take_reason());
    }
    if let Some(w) = worker {
        w.end();
    }
}

/// Sends `job` to the worker and reads its answer, with the time the round trip took.
fn call(w: &mut Worker, maps: &mut Maps, job: &Job) -> Result<(Answer, Duration), WorkerError> {
    let sent = std::time::Instant::now();
    let a = match &job.mapped {
        Some(m) => {
            let msg = maps.message(m).ok_or(WorkerError::Unmappable)?;
            // The worker writes a frame alone: the display's readers of the replica (its
            // scan-out, the consuming sink, snapshots) wait for the present, as they waited
            // for the daemon's own write into it.
            let _frame = match m {
                Mapped::Present { frame, .. } => Some(frame.lock()),
                _ => None,
            };
            w.call(&msg.bytes, FROM_DAEMON, &msg.borrowed_fds())?
        }
        None => {
            let flags = match job.kind {
                Kind::Exec { .. } => 0,
                Kind::Readback { .. } | Kind::Import { .. } => FROM_DAEMON,
            };
            w.call(&job.batch, flags, &[])?
        }
    };
    Ok((a, sent.elapsed()))
}

/// The guest's answer to a job the worker ran.
fn answer_job(
    cx: &DeviceCtx<'_>,
    job: &Job,
    a: Answer,
    shared: &Mutex<Shared>,
    worker: Option<&mut Worker>,
) -> DeviceResult {
    match job.kind {
        Kind::Exec { reply } => exec_answer(cx, reply, a, shared),
        Kind::Readback { frame } => {
            let result = match &job.mapped {
                Some(Mapped::Present { size, .. }) => frame::present_answer(cx, &a.reply, *size)
                    .map(|(v, copies, bytes)| {
                        lock(shared).stats.present(copies, bytes);
                        v
                    }),
                _ => {
                    let result = frame::write_frame(cx, frame, &a.reply);
                    if let Ok(v) = &result {
                        let bytes = frame::count_readback(cx, v);
                        lock(shared).stats.present(frame::READBACK_COPIES, bytes);
                    }
                    result
                }
            };
            if let Some(w) = worker {
                w.recycle(a.reply);
            }
            result
        }
        Kind::Import {
            image,
            region,
            gen,
            bytes,
        } => {
            let result = image::answer(cx, &a.reply, image, bytes);
            let mut sh = lock(shared);
            match result {
                Ok(_) => image::record(&mut sh.imported, image, (region, gen)),
                Err(_) => sh.imported.remove(&image),
            };
            result
        }
    }
}

/// The guest's answer to its batch: answers of at most [`INLINE_REPLY`] bytes in the result
/// words; larger ones in its reply region (written there by the worker, or by the daemon
/// here), or held for `read_reply` when they do not fit.
fn exec_answer(
    cx: &DeviceCtx<'_>,
    reply_region: Option<RegionId>,
    a: Answer,
    shared: &Mutex<Shared>,
) -> DeviceResult {
    let size = reply_region.and_then(|r| cx.meta(r).ok().map(|m| m.size));
    let words = |reply_len: usize, held: u64| {
        ExecReply {
            reply_len: reply_len as u64,
            held,
            inline0: 0,
            inline1: 0,
            inline2: 0,
            inline3: 0,
        }
        .to_values()
    };
    if a.placed > 0 {
        // The worker wrote the answers into the reply region's replica (the guest's write
        // access is begun): one copy, as the daemon's write would have been.
        if size.is_none_or(|s| a.placed as u64 > s) {
            return Err(cx.fail(
                Status::DeviceError,
                "render worker: answers placed past the reply region",
            ));
        }
        cx.count_copy(a.placed, std::time::Instant::now());
        return Ok(words(a.placed, 0));
    }
    let reply = a.reply;
    if reply.len() <= INLINE_REPLY {
        Ok(inline_reply(&reply))
    } else if let Some(r) = reply_region.filter(|_| size.is_some_and(|s| s >= reply.len() as u64)) {
        cx.write_bytes(r, &reply).map(|()| words(reply.len(), 0))
    } else {
        let n = reply.len();
        lock(shared).held = reply;
        Ok(words(n, 1))
    }
}
