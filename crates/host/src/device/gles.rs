//! The `gles` device: OpenGL ES for guests (`docs/gles.md`). Each guest's GLES command
//! streams run in a render worker process of its own (`virtsoc-render`, crates/gles-render),
//! started at the guest's first `exec`, so a crash or a hang of the host's GL driver ends
//! that guest's GLES contexts only.
//!
//! - **Worker messages**: the worker's stdin is one end of a socket pair. The daemon sends a
//!   batch as `u32 len | len bytes`; the worker answers `u32 status | u32 reply_len |
//!   u32 msg_len | reply bytes | msg bytes` (status: [`ANSWER_OK`], [`ANSWER_BAD_STREAM`],
//!   [`ANSWER_LOST`]). Nothing the worker sends is trusted: the reply is at most
//!   [`MAX_REPLY`] bytes, the message [`MAX_MSG`], and an answer later than the deadline
//!   (`--render-deadline-ms`, default [`WORKER_DEADLINE`]: a hang) or a malformed one ends
//!   the worker as if it had crashed.
//! - **Shared replicas** (`gles_maps.rs`): the device's domain keeps its host replicas in
//!   memfds the guest's worker maps ([`Device::shares_memory`]); a batch, an image's pixels
//!   and a frame are read and written there by the worker, not copied through the daemon.
//! - **Never blocking the device thread**: `exec` checks the batch and hands it (its stream
//!   region's shared replica, or the bytes copied out of the region when the replica is not
//!   shared), with the [`Reply`], to the guest's own forwarding thread (`gles_forward.rs`),
//!   which talks to the worker and answers the guest (large answers in its reply region). The guest's queue on this device waits for that answer (so its reply region
//!   stays accessed), the other guests' queues go on.
//! - **Loss**: a worker that dies, hangs or talks nonsense is killed; that guest's exec
//!   fails with `DeviceError` and a reason starting "context lost", and so does every later
//!   one (its contexts are gone; the guest's EGL reports `EGL_CONTEXT_LOST`).
//! - **Departure**: when the guest goes away its worker is killed.
//! - **Shader precision**: the backend line says at which precision the workers run guest
//!   shaders (the first worker's line on its stdout: `gles_precision.rs`).
//! - **GL memory**: each answer carries the guest's GL memory after the batch (its share
//!   groups' buffers, textures and renderbuffers, and its surfaces), at most
//!   [`MAX_GL_BYTES`]. The forwarding thread holds a
//!   [`MemoryCharge`](virtsoc_svm::MemoryCharge) of that many bytes against the guest's
//!   memory limit (`--guest-mem-limit`, shared with its regions),
//!   adjusted after every batch. When the limit refuses the new total the worker is ended
//!   and the guest's contexts are lost (the exec fails with "context lost: GL objects of N
//!   bytes exceed the guest's memory limit"; the guest's EGL reports `EGL_CONTEXT_LOST`):
//!   the objects are already made on the host by then, and ending the worker is what gives
//!   their memory back. The charge goes with the worker, and with the guest.
//! - **Device time**: the render workers of several guests run at once, so the time from a
//!   batch's dispatch to its answer, chained behind the previous answer on this device, says
//!   little. Each answer carries the worker's CPU time so far (all its threads: the driver's
//!   rasterizer threads too, and what they ran between batches); the batch's device time
//!   ([`Reply::busy_for`]) is the CPU time since the worker's previous answer, at most the
//!   wall time since then times the host's CPUs, and at least the batch's own round trip to
//!   the worker (a worker that claims less is charged its wall time).

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use virtsoc_devapi::gles::{Command, ExecReply, ImportReply, ReadReplyReply};
use virtsoc_fence::VirtualFenceTable;
use virtsoc_proto::Status;
use virtsoc_svm::{DomainId, GuestId, RegionId, SvmManager};

use super::registry::DeviceConfig;
use super::{Device, DeviceCtx, DeviceResult, Reply};
use crate::cgroup::CpuCgroups;
use virtsoc_sync::LockExt;

/// Largest batch one `exec` runs.
pub const MAX_BATCH: u64 = 64 << 20;
/// Largest reply a worker may send for one batch.
pub const MAX_REPLY: usize = 64 << 20;
/// Largest message (a reason) a worker may send with an answer.
pub const MAX_MSG: usize = 4096;
/// Longest a worker may take to answer one batch (it is ended as hung after that).
pub const WORKER_DEADLINE: Duration = Duration::from_secs(30);

/// Worker answer: the batch ran.
pub const ANSWER_OK: u32 = 0;
/// Worker answer: the batch was malformed and stopped at the bad packet (the message says
/// why); the contexts go on.
pub const ANSWER_BAD_STREAM: u32 = 1;
/// Worker answer: the worker cannot go on (its host EGL failed); it exits.
pub const ANSWER_LOST: u32 = 2;

/// Most GL memory a worker may claim for its guest (more is a malformed answer).
pub const MAX_GL_BYTES: u64 = 1 << 48;

/// Answers of at most this many bytes travel in the exec's result words.
pub const INLINE_REPLY: usize = 32;

/// The exec result carrying `reply` (at most [`INLINE_REPLY`] bytes) in its words.
fn inline_reply(reply: &[u8]) -> [u64; 6] {
    let mut w = [0u64; 4];
    for (i, b) in reply.iter().take(INLINE_REPLY).enumerate() {
        w[i / 8] |= u64::from(*b) << (8 * (i % 8));
    }
    ExecReply {
        reply_len: reply.len() as u64,
        held: if reply.is_empty() { 0 } else { 2 },
        inline0: w[0],
        inline1: w[1],
        inline2: w[2],
        inline3: w[3],
    }
    .to_values()
}

/// The program name of the render worker, looked for beside the daemon's executable.
pub const WORKER_PROGRAM: &str = "virtsoc-render";

/// What a job's answer is for.
#[derive(Clone, Copy)]
enum Kind {
    /// A guest's batch: the answers go to this reply region, if any.
    Exec { reply: Option<RegionId> },
    /// The daemon's readback of a surface: the pixels go to this RGBA8 image region.
    Readback { frame: RegionId },
    /// An import of `bytes` of `region` at write generation `gen` into guest image `image`
    /// (`gles_image`).
    Import {
        image: u32,
        region: RegionId,
        gen: u64,
        bytes: u64,
    },
}

#[path = "gles_forward.rs"]
mod forward;
#[path = "gles_frame.rs"]
mod frame;
#[path = "gles_image.rs"]
mod image;
#[path = "gles_maps.rs"]
mod maps;
#[path = "gles_precision.rs"]
mod precision;
#[path = "gles_stats.rs"]
mod stats;
#[path = "gles_worker.rs"]
mod worker;

/// The READBACK opcode of the GLES stream (`virtsoc_gles_stream::egl::READBACK`; the
/// daemon does not link the stream crate).
const READBACK: u32 = 0x1_0009;

/// Batch flag for the worker: the daemon's own batch (`virtsoc_render::worker::FROM_DAEMON`).
const FROM_DAEMON: u32 = 1;

/// One batch handed to a guest's forwarding thread.
struct Job {
    batch: Batch,
    /// What the worker does in the guest's shared replicas instead of running `batch`.
    mapped: Option<maps::Mapped>,
    kind: Kind,
    reply: Reply,
    svm: Arc<SvmManager>,
    fences: Arc<VirtualFenceTable>,
    domain: DomainId,
    guest: GuestId,
}

/// What a guest's forwarding thread shares with the device.
#[derive(Default)]
struct Shared {
    /// Why the guest's contexts are gone, once they are.
    lost: Option<String>,
    /// Answers too large for the reply region, for `read_reply`.
    held: Vec<u8>,
    /// The daemon's end of the worker's socket (shut down when the guest goes away).
    sock: Option<UnixStream>,
    /// `(region, write generation)` of each guest image's last successful import.
    imported: HashMap<u32, (RegionId, u64)>,
    /// The guest's counters (`gles_stats.rs`).
    stats: stats::GlesStats,
}

/// One guest's render worker, as the device holds it.
struct GuestGles {
    jobs: mpsc::Sender<Job>,
    shared: Arc<Mutex<Shared>>,
}

fn lock(s: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    s.lock_or_recover()
}

/// The `gles` device.
pub struct Gles {
    /// Stream buffers given back by the forwarding threads, for the next batches.
    spare: Arc<Spare>,
    program: PathBuf,
    deadline: Duration,
    guests: Mutex<HashMap<GuestId, GuestGles>>,
    /// The guests' CPU groups, when the daemon steers CPU weights: each render worker joins
    /// its guest's.
    cgroups: std::sync::OnceLock<Arc<CpuCgroups>>,
    /// The shader precision the workers run guest shaders at, for the backend line.
    precision: precision::PrecisionLine,
}

impl Gles {
    /// The device, running guests' streams in `cfg.render_worker` (default: the
    /// [`WORKER_PROGRAM`] beside the daemon's executable; `$VIRTSOC_RENDER_WORKER`
    /// overrides that default).
    pub fn new(cfg: &DeviceConfig) -> Self {
        let program = cfg.render_worker.clone().unwrap_or_else(default_worker);
        Gles {
            precision: precision::PrecisionLine::default(),
            program,
            deadline: cfg.render_deadline,
            guests: Mutex::new(HashMap::new()),
            spare: Arc::default(),
            cgroups: std::sync::OnceLock::new(),
        }
    }

    fn guests(&self) -> MutexGuard<'_, HashMap<GuestId, GuestGles>> {
        self.guests.lock_or_recover()
    }

    /// The guest's forwarding thread (started now at its first command).
    fn guest(&self, guest: GuestId) -> Result<(mpsc::Sender<Job>, Arc<Mutex<Shared>>), Status> {
        let mut guests = self.guests();
        if let Some(g) = guests.get(&guest) {
            return Ok((g.jobs.clone(), g.shared.clone()));
        }
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (program, sh, deadline) = (self.program.clone(), shared.clone(), self.deadline);
        let place = forward::Placement {
            guest,
            cgroups: self.cgroups.get().cloned(),
            precision: self.precision.clone(),
        };
        std::thread::Builder::new()
            .name(format!("gles-{guest}"))
            .spawn(move || forward::forward(&program, deadline, rx, &sh, &place))
            .map_err(|_| Status::Busy)?;
        guests.insert(
            guest,
            GuestGles {
                jobs: tx.clone(),
                shared: shared.clone(),
            },
        );
        Ok((tx, shared))
    }

    fn exec(&self, cx: &DeviceCtx<'_>, args: &[u64; 6], reply: Reply) {
        let mut mapped = None;
        let (batch, kind) = match Command::decode(args) {
            Ok(Command::Exec(c)) => {
                // `reply` is a region id, 0 for none.
                let reply_region = (c.reply != 0).then_some(RegionId(c.reply));
                if let Some(r) = reply_region {
                    if let Err(st) = cx.meta(r) {
                        return reply.send_because(
                            Err(st),
                            Some("reply: not a region of this guest".into()),
                        );
                    }
                }
                if let Err(st) = check_stream(cx, c.stream, c.len) {
                    return reply.send_because(Err(st), cx.take_reason());
                }
                let kind = Kind::Exec {
                    reply: reply_region,
                };
                match maps::shared_replica(cx, c.stream) {
                    // Read in place by the worker: nothing copied here.
                    Some(stream) => {
                        mapped = Some(maps::Mapped::Exec {
                            stream,
                            len: c.len as u32,
                            reply: reply_region.and_then(|r| maps::shared_replica(cx, r)),
                        });
                        (Vec::new(), kind)
                    }
                    None => match read_stream(cx, c.stream, c.len, self.spare.take()) {
                        Ok(b) => (b, kind),
                        Err(st) => return reply.send_because(Err(st), cx.take_reason()),
                    },
                }
            }
            Ok(Command::ReadReply(r)) => {
                let result = self.read_reply(cx, r.reply);
                return reply.send_because(result, cx.take_reason());
            }
            Ok(Command::Import(c)) => {
                let last = self.guests().get(&cx.guest).and_then(|g| {
                    lock(&g.shared)
                        .imported
                        .get(&((c.image & 0xFFFF_FFFF) as u32))
                        .copied()
                });
                match image::prepare(cx, &c, last) {
                    Ok(image::Prepared::Batch(b, kind)) => (b, kind),
                    Ok(image::Prepared::Mapped(m, kind)) => {
                        mapped = Some(m);
                        (Vec::new(), kind)
                    }
                    Ok(image::Prepared::Current) => {
                        let current = ImportReply {
                            imported: 0,
                            bytes: 0,
                        };
                        return reply.send(Ok(current.to_values()));
                    }
                    Err(st) => return reply.send_because(Err(st), cx.take_reason()),
                }
            }
            Ok(Command::Readback(r)) => {
                let Ok(surf) = u32::try_from(r.surface) else {
                    return reply.send(Err(Status::BadArgument));
                };
                match frame::mapped_present(cx, surf, r.frame) {
                    Ok(Some(m)) => {
                        mapped = Some(m);
                        (Vec::new(), Kind::Readback { frame: r.frame })
                    }
                    Ok(None) => (readback_packet(surf), Kind::Readback { frame: r.frame }),
                    Err(st) => return reply.send_because(Err(st), cx.take_reason()),
                }
            }
            Err(st) => return reply.send(Err(st)),
        };
        let (jobs, shared) = match self.guest(cx.guest) {
            Ok(g) => g,
            Err(st) => return reply.send(Err(st)),
        };
        if let Some(why) = &lock(&shared).lost {
            let why = why.clone();
            return reply.send_because(Err(Status::DeviceError), Some(why));
        }
        if let Kind::Exec { reply: r } = kind {
            let mut sh = lock(&shared);
            match &mapped {
                Some(maps::Mapped::Exec { stream, len, .. }) => {
                    // The packet headers, where the worker will read them.
                    let bytes = stream.read();
                    sh.stats
                        .batch(bytes.get(..*len as usize).unwrap_or_default(), r.is_some());
                }
                _ => sh.stats.batch(&batch, r.is_some()),
            }
        }
        let job = Job {
            batch: Batch::new(batch, &self.spare),
            mapped,
            kind,
            reply,
            svm: cx.svm.clone(),
            fences: cx.fences.clone(),
            domain: cx.domain,
            guest: cx.guest,
        };
        if let Err(mpsc::SendError(job)) = jobs.send(job) {
            job.reply.send_because(
                Err(Status::DeviceError),
                Some("context lost: worker gone".into()),
            );
        }
    }

    fn read_reply(&self, cx: &DeviceCtx<'_>, region: RegionId) -> DeviceResult {
        let shared = match self.guests().get(&cx.guest) {
            Some(g) => g.shared.clone(),
            None => return Err(Status::BadArgument),
        };
        let held = std::mem::take(&mut lock(&shared).held);
        let size = cx.meta(region)?.size;
        if held.len() as u64 > size {
            let n = held.len();
            lock(&shared).held = held;
            return Err(cx.fail(
                Status::OutOfRange,
                format!("the answers take {n} bytes, the region {size}"),
            ));
        }
        cx.write_bytes(region, &held)?;
        Ok(ReadReplyReply {
            reply_len: held.len() as u64,
        }
        .to_values())
    }
}

/// The default render worker: `$VIRTSOC_RENDER_WORKER`, else [`WORKER_PROGRAM`] beside the
/// running executable.
pub fn default_worker() -> PathBuf {
    if let Some(p) = std::env::var_os("VIRTSOC_RENDER_WORKER") {
        return PathBuf::from(p);
    }
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(WORKER_PROGRAM)))
        .unwrap_or_else(|| PathBuf::from(WORKER_PROGRAM))
}

/// Stream buffers of earlier batches: a batch's bytes go into one of these rather than a
/// fresh allocation (which, at a few hundred KiB, the C library maps and unmaps each time:
/// page faults on every byte of every batch).
#[derive(Default)]
struct Spare(Mutex<Vec<Vec<u8>>>);

impl Spare {
    /// Buffers kept at most.
    const KEEP: usize = 4;
    /// Largest buffer kept (a rare huge batch's memory is given back).
    const KEEP_BYTES: usize = 4 << 20;

    fn take(&self) -> Vec<u8> {
        self.0.lock_or_recover().pop().unwrap_or_default()
    }

    fn give(&self, mut buf: Vec<u8>) {
        if buf.capacity() > Self::KEEP_BYTES {
            return;
        }
        buf.clear();
        let mut spare = self.0.lock_or_recover();
        if spare.len() < Self::KEEP {
            spare.push(buf);
        }
    }
}

/// A batch's bytes, in a buffer that goes back to the device's [`Spare`] when dropped.
struct Batch {
    bytes: Vec<u8>,
    spare: Arc<Spare>,
}

impl Batch {
    fn new(bytes: Vec<u8>, spare: &Arc<Spare>) -> Self {
        Batch {
            bytes,
            spare: spare.clone(),
        }
    }
}

impl std::ops::Deref for Batch {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        self.spare.give(std::mem::take(&mut self.bytes));
    }
}

/// Checks a batch of `len` bytes of the stream region against its size and [`MAX_BATCH`].
fn check_stream(cx: &DeviceCtx<'_>, region: RegionId, len: u64) -> Result<(), Status> {
    let size = cx.meta(region)?.size;
    if len > size || len > MAX_BATCH || len & 3 != 0 {
        return Err(cx.fail(
            Status::BadArgument,
            format!(
                "stream length {len} (region of {size} bytes, at most {MAX_BATCH}, whole words)"
            ),
        ));
    }
    Ok(())
}

/// The first `len` bytes of the stream region (into `buf`; checked by [`check_stream`]).
fn read_stream(
    cx: &DeviceCtx<'_>,
    region: RegionId,
    len: u64,
    mut buf: Vec<u8>,
) -> Result<Vec<u8>, Status> {
    let t0 = std::time::Instant::now();
    let n = len as usize;
    buf.clear();
    let copied = cx.with_source(region, |b| {
        b.get(..n).map(|s| buf.extend_from_slice(s)).is_some()
    });
    match copied {
        Ok(true) => {
            cx.count_copy(n, t0);
            Ok(buf)
        }
        Ok(false) => Err(Status::OutOfRange),
        // Not in host memory: read back.
        Err(_) => cx.read_bytes(region, n),
    }
}

impl Device for Gles {
    fn name(&self) -> &str {
        "gles"
    }

    fn backend(&self) -> String {
        format!(
            "OpenGL ES 2.0 in a render worker per guest ({}, host EGL surfaceless); shader \
             precision: {}",
            self.program.display(),
            self.precision.line()
        )
    }

    fn shares_memory(&self) -> bool {
        // The render worker maps the guest's replicas (`gles_maps.rs`).
        true
    }

    fn execute(&self, _cx: &DeviceCtx<'_>, _args: &[u64; 6]) -> DeviceResult {
        // Every command goes through execute_async.
        Err(Status::Internal)
    }

    fn execute_async(&self, cx: &DeviceCtx<'_>, args: &[u64; 6], reply: Reply) {
        self.exec(cx, args, reply);
    }

    fn control(
        &self,
        op: &str,
        _args: &serde_json::Value,
    ) -> Result<serde_json::Value, virtsoc_control::ControlError> {
        if op != "stats" {
            return Err(virtsoc_control::ControlError::Unsupported(format!(
                "gles control operation {op:?}"
            )));
        }
        let guests: serde_json::Map<String, serde_json::Value> = self
            .guests()
            .iter()
            .map(|(id, g)| {
                let s = lock(&g.shared).stats.clone();
                (
                    id.0.to_string(),
                    serde_json::to_value(s).unwrap_or_default(),
                )
            })
            .collect();
        Ok(serde_json::json!({ "guests": guests }))
    }

    fn use_cgroups(&self, cgroups: Arc<CpuCgroups>) {
        let _ = self.cgroups.set(cgroups);
    }

    fn guest_gone(&self, guest: GuestId) {
        if let Some(g) = self.guests().remove(&guest) {
            let mut sh = lock(&g.shared);
            if let Some(s) = sh.sock.take() {
                // The forwarding thread's call fails at once and it ends the worker; dropping
                // `g.jobs` then ends the thread.
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// The packet that asks the render worker to read surface `surf` back (into the frame region
/// the job names).
fn readback_packet(surf: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(12);
    b.extend_from_slice(&READBACK.to_le_bytes());
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend_from_slice(&surf.to_le_bytes());
    b
}

#[cfg(test)]
#[path = "gles_tests.rs"]
mod tests;
