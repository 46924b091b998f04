//! The display device: the host's one screen, shared by every guest.
//!
//! A 1920x1080 display (the `virtsoc-display` state machine) scanned out by a vsync thread at
//! the daemon's `--refresh-hz`, on the daemon's media clock ([`crate::clock`],
//! `CLOCK_MONOTONIC`), so a frame's motion-to-photon latency is its scan-out time minus the
//! capture time the camera or codec reported.
//!
//! Where scanned-out frames go is the daemon's `--display-backend`:
//! - `headless` (default): nowhere but memory (the last frame, for snapshots);
//! - `window`: an X11 window on `$DISPLAY` (the display crate's `WindowBackend`, built only
//!   with this crate's `window` cargo feature). Without the feature, without `$DISPLAY`, or
//!   when the window cannot be opened, the daemon refuses to start with a configuration
//!   error saying why. Closing the window does not stop the display: scan-outs then count as
//!   backend errors and snapshots keep working.
//!
//! Commands (declared in `virtsoc_devapi::display`):
//! - `present(frame, capture_ns)`: copies the frame region (Rgba8 or Bgra8; other formats
//!   answer `NotSupported`) into a frame owned by the guest and queues it for the next vsync.
//!   `capture_ns` 0 means "not given": the pixels are then searched for a capture time stamped
//!   by the camera ([`virtsoc_media::read_timestamp`]), which is how a camera pipeline measures
//!   motion-to-photon latency from the frame it finally shows. Returns the frame's id.
//! - `stats()`: this guest's counters (see below).
//! - `sink()`: with `--display-sink crc`, what the consuming sink (`virtsoc_display::
//!   ConsumingSink`, on its own thread) read of this guest's scanned-out frames: every byte
//!   of every plane once per frame, host-memory planes in place, GPU planes read back.
//! - `signal_at_vsync(fence)`: signals the guest's virtual fence at the first vsync after the
//!   call (an unknown fence is `BadArgument`). A vsync listener thread keeps the pending fences.
//! - `snapshot()`: writes the frame on screen as `<snapshot_dir>/virtsoc-display-<id>.png` and
//!   returns its id once the file is written; `Busy` while nothing was scanned out yet, when
//!   the guest's last snapshot is more recent than [`Limits::snapshot_interval`], or when
//!   [`SNAPSHOT_QUEUE`] snapshots already wait. The PNG is encoded and written on the
//!   display's snapshot thread, never on the device worker: other guests' presents go on
//!   meanwhile.
//!
//! Sharing the screen: the first guest to present becomes the foreground owner and only its
//! frames are scanned out; other guests' frames are hidden (kept as their latest content).
//! When the foreground guest goes away, the guest that presented most recently becomes the
//! foreground and its latest frame is shown at the next vsync; with no such guest, the next
//! guest to present takes the screen.
//!
//! Per-guest statistics, from the display's scan-out records:
//! - `presented`: this guest's frames that reached the screen;
//! - `dropped`: its frames that never will: replaced by a newer frame while two already
//!   waited for vsyncs (the display queues two frames, as Android's BufferQueue does), passed
//!   over when the queue catches up (the older of two waiting frames that already waited at
//!   the vsync before: a queue that stays two deep would show every later frame a vsync
//!   late), or hidden because another guest has the screen. Once a vsync has passed after a guest's last
//!   `present`, `presented + dropped` equals the number of frames it presented;
//! - `vsyncs`: vsyncs since the guest first used the display;
//! - `latency_p50_ns`, `latency_p99_ns`, `samples`: motion-to-photon latency percentiles
//!   (nearest rank) over the guest's last [`LATENCY_WINDOW`] scanned-out frames that carried a
//!   capture time, and how many samples they cover (0 and 0 when there are none).

mod control;
mod format;
#[cfg(feature = "window")]
mod gpu_painter;
mod output;
mod planes;
mod screen;
#[cfg(test)]
mod tests;
mod thumb;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use virtsoc_svm::{GuestId, RegionId};

use virtsoc_devapi::display::{
    ChecksumReply, Command, ModeReply, PresentReply, SinkReply, SnapshotReply,
};
use virtsoc_display as vd;
use virtsoc_fence::FenceId;
use virtsoc_proto::Status;

use super::layers::{layout_of, read_layers, LayerSpec};
use super::registry::DeviceConfig;
use super::{Device, DeviceCtx, DeviceResult, Reply};
use crate::{HostError, Limits, Result};
use format::ScanoutFormat;
use output::Output;
use planes::{Ledger, Plane, PlaneSet, MAX_PLANES};
use screen::{listen, Screen, State};
use virtsoc_sync::LockExt;

/// What a control operation answers.
type ControlResult = std::result::Result<serde_json::Value, virtsoc_control::ControlError>;

/// What a command answers the guest: a value or a status.
type Answer<T> = std::result::Result<T, Status>;

/// Width of the screen in pixels, unless configured (`--display-size`).
pub const WIDTH: u32 = 1920;
/// Height of the screen in pixels, unless configured.
pub const HEIGHT: u32 = 1080;
/// Latency samples kept per guest for the percentiles.
pub const LATENCY_WINDOW: usize = 4096;
/// Fences one guest may have waiting for the next vsync.
pub const MAX_PENDING_FENCES: usize = 1024;
/// Snapshots waiting for the snapshot thread, all guests together (`Busy` beyond).
pub const SNAPSHOT_QUEUE: usize = 4;

/// A snapshot for the snapshot thread to write, and whom to answer.
struct SnapshotJob {
    frame: vd::PresentedFrame,
    dir: PathBuf,
    reply: Reply,
}

/// The display device.
pub struct Display {
    screen: Arc<Screen>,
    snapshot_dir: PathBuf,
    output: Output,
    width: u32,
    height: u32,
    /// `--display-verify`: every presented frame is composed and checksummed, per guest the
    /// last one (frame id, CRC-32 of its RGBA pixels).
    verify: Option<Mutex<std::collections::HashMap<GuestId, (u64, u32)>>>,
    /// Shortest time between two snapshots of one guest.
    snapshot_interval: Duration,
    /// When each guest's last snapshot was accepted.
    last_snapshot: Mutex<HashMap<GuestId, Instant>>,
    /// The snapshot thread's queue.
    snapshots: SyncSender<SnapshotJob>,
    /// The GPU whose memory the display scans out of, when it is a wgpu device: frames of
    /// resident planes are recorded at a small size composed there, and only that is read back.
    gpu: Option<Arc<virtsoc_gpu::WgpuBackend>>,
    /// Per guest, view pictures of its planes that do not change (see [`thumb`]).
    view_statics: Mutex<HashMap<GuestId, Arc<thumb::StaticPlanes>>>,
    /// `--display-sink crc`: what the consuming sink read.
    sink: Option<vd::SinkStats>,
}

impl Display {
    /// Builds the device from the daemon's configuration and starts its vsync thread. `gpu`:
    /// the wgpu device whose memory the display scans out of, when the GPU is one (a window
    /// then presents on it, and recorded frames of its resident planes are composed there).
    pub fn new(cfg: &DeviceConfig, gpu: Option<Arc<virtsoc_gpu::WgpuBackend>>) -> Result<Self> {
        let output = Output::new(cfg.display_backend)?;
        let (width, height) = cfg.display_size;
        if !(16..=virtsoc_gpu::MAX_DIMENSION).contains(&width)
            || !(16..=virtsoc_gpu::MAX_DIMENSION).contains(&height)
        {
            return Err(HostError::Config(format!(
                "display: size {width}x{height} out of range"
            )));
        }
        // Two frames may wait for vsyncs, as in a BufferQueue: a burst is shown, not replaced,
        // and a standing queue catches up (see `DisplayConfig::queue_depth`).
        let mut config = vd::DisplayConfig::new(width, height)
            .with_refresh_hz(cfg.refresh_hz)
            .with_queue_depth(2);
        let backend = output.backend(width, height, cfg.refresh_hz, gpu.clone())?;
        let mut sink = None;
        config.backend = if cfg.display_sink {
            let (b, stats) = vd::ConsumingSink::new(backend).map_err(config_error)?;
            sink = Some(stats);
            Box::new(b)
        } else {
            backend
        };
        let display = vd::Display::new(config).map_err(config_error)?;
        let vsync = vd::VsyncThread::spawn_with_clock(display, Arc::new(HostClock))
            .map_err(config_error)?;
        let (_, events) = vsync.subscribe();
        let screen = Arc::new(Screen {
            vsync,
            state: Mutex::new(State::default()),
            presented: std::sync::Condvar::new(),
        });
        let weak = Arc::downgrade(&screen);
        std::thread::Builder::new()
            .name("display-vsync-listener".into())
            .spawn(move || listen(weak, events))?;
        let (snapshots, jobs) = sync_channel::<SnapshotJob>(SNAPSHOT_QUEUE);
        std::thread::Builder::new()
            .name("display-snapshot".into())
            .spawn(move || {
                for job in jobs {
                    let r = write_snapshot(&job.frame, &job.dir);
                    job.reply
                        .send(r.map(|frame_id| SnapshotReply { frame_id }.to_values()));
                }
            })?;
        Ok(Display {
            screen,
            snapshot_dir: cfg.snapshot_dir.clone(),
            output,
            width,
            height,
            verify: cfg.display_verify.then(Default::default),
            snapshot_interval: Limits::default().snapshot_interval,
            last_snapshot: Mutex::new(HashMap::new()),
            view_statics: Mutex::new(HashMap::new()),
            snapshots,
            gpu,
            sink,
        })
    }

    /// The same device within `limits` (the snapshot rate).
    pub fn with_limits(mut self, limits: &Limits) -> Self {
        self.snapshot_interval = limits.snapshot_interval;
        self
    }

    /// Guest `guest`'s view pictures of planes that do not change.
    fn view_statics(&self, guest: GuestId) -> Arc<thumb::StaticPlanes> {
        self.view_statics
            .lock_or_recover()
            .entry(guest)
            .or_default()
            .clone()
    }

    /// A plane scanning out region `src` of the calling guest where the display's read
    /// access found it: a host-memory replica holding the current contents, else the
    /// replica in the display's (the GPU's) memory. The guest must have begun a read access
    /// to it from the display.
    fn plane(&self, cx: &DeviceCtx<'_>, spec: &LayerSpec) -> Answer<Plane> {
        let layout = layout_of(cx, spec.src)?;
        let backing = cx
            .svm
            .read_replica(cx.guest, spec.src, cx.domain)
            .map_err(|e| crate::dispatch::status_of(&e))?;
        let generation = cx
            .svm
            .generation(cx.guest, spec.src)
            .map_err(|e| crate::dispatch::status_of(&e))?;
        Plane::new(spec, layout, backing).map(|p| p.at_generation(generation))
    }

    /// Presents `planes` on a `width` x `height` screen; with no `capture_ns`, the capture
    /// time stamped into the planes' pixels is used.
    fn present_planes(
        &self,
        cx: &DeviceCtx<'_>,
        (width, height): (u32, u32),
        planes: Vec<Plane>,
        capture_ns: u64,
    ) -> Answer<u64> {
        let ledger = Ledger {
            svm: cx.svm.clone(),
            guest: cx.guest,
            domain: cx.domain,
        };
        let statics = self.view_statics(cx.guest);
        let set = PlaneSet::new(width, height, planes, ledger)
            .with_gpu(self.gpu.clone())
            .with_statics(statics);
        let capture_ns = (capture_ns != 0)
            .then_some(capture_ns)
            .or_else(|| set.stamped_time());
        // Verify mode: the screen composed from the planes as presented, checksummed now
        // (the composition is kept for the scan-out).
        let crc = self.verify.as_ref().map(|_| {
            use virtsoc_display::FrameHandle;
            set.pixels().map(crc32fast::hash).unwrap_or(0)
        });
        let frame = vd::PresentedFrame {
            id: 0,
            owner: GuestId(0),
            data: vd::FrameData::Handle(Arc::new(set)),
            format: vd::PixelFormat::Rgba8,
            width,
            height,
            stride: width * 4,
            capture_ns,
            submitted_ns: 0,
        };
        let id = self.screen.present(cx.guest, frame)?;
        if let (Some(v), Some(crc)) = (&self.verify, crc) {
            v.lock_or_recover().insert(cx.guest, (id, crc));
        }
        Ok(id)
    }

    /// Presents region `region` (RGBA8 or BGRA8) of the calling guest as it is: one plane
    /// of its own size, scanned out of the display's memory without a copy.
    fn present(&self, cx: &DeviceCtx<'_>, region: RegionId, capture_ns: u64) -> Answer<u64> {
        let meta = cx.meta(region)?;
        let format = ScanoutFormat::of(meta.format)?;
        format.required_len(meta.width, meta.height, meta.stride, meta.size)?;
        let full = virtsoc_gpu::Rect::full(meta.width, meta.height);
        let spec = LayerSpec {
            src: region,
            crop: full,
            dst: full,
            rotation: virtsoc_gpu::Rotation::R0,
            alpha: 1.0,
            blend: false,
        };
        let plane = self.plane(cx, &spec)?;
        self.present_planes(cx, (meta.width, meta.height), vec![plane], capture_ns)
    }

    /// Presents the `count` layer records in region `layers` as display planes on the
    /// screen: `NotSupported` for what planes cannot show (the guest composes those layers
    /// on the GPU instead).
    fn present_layers(
        &self,
        cx: &DeviceCtx<'_>,
        layers: RegionId,
        count: u64,
        capture_ns: u64,
    ) -> Answer<u64> {
        if count == 0 {
            return Err(Status::BadArgument);
        }
        let specs = read_layers(cx, layers, count, MAX_PLANES).map_err(|s| {
            if s == Status::BadArgument && count as usize > MAX_PLANES {
                Status::NotSupported
            } else {
                s
            }
        })?;
        let planes = specs
            .iter()
            .map(|s| self.plane(cx, s))
            .collect::<Answer<Vec<_>>>()?;
        self.present_planes(cx, (self.width, self.height), planes, capture_ns)
    }

    /// The frame on screen (`Busy` while there is none).
    fn screen_frame(&self) -> Answer<vd::PresentedFrame> {
        self.screen
            .vsync
            .with_display(|d| d.last_frame().cloned())
            .ok_or(Status::Busy)
    }

    /// Writes the frame on screen as a PNG file on this thread; returns its id.
    #[cfg(test)]
    fn snapshot(&self) -> Answer<u64> {
        write_snapshot(&self.screen_frame()?, &self.snapshot_dir)
    }

    /// A guest's snapshot: at most one per interval per guest, written on the snapshot
    /// thread, which answers `reply` once the file is written.
    fn snapshot_async(&self, guest: GuestId, reply: Reply) {
        let now = Instant::now();
        {
            let mut last = self.last_snapshot.lock_or_recover();
            if last
                .get(&guest)
                .is_some_and(|t| now.duration_since(*t) < self.snapshot_interval)
            {
                return reply.send(Err(Status::Busy));
            }
            let frame = match self.screen_frame() {
                Ok(f) => f,
                Err(st) => return reply.send(Err(st)),
            };
            let job = SnapshotJob {
                frame,
                dir: self.snapshot_dir.clone(),
                reply,
            };
            match self.snapshots.try_send(job) {
                Ok(()) => {
                    last.insert(guest, now);
                }
                Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => {
                    job.reply.send(Err(Status::Busy))
                }
            }
        }
    }
}

impl Display {
    /// What the consuming sink read of `guest`'s frames (all zero without the sink).
    fn sink_reply(&self, guest: GuestId) -> SinkReply {
        let Some(stats) = &self.sink else {
            return SinkReply::default();
        };
        let c = self
            .screen
            .owner_of(guest)
            .map(|o| stats.of(o))
            .unwrap_or_default();
        SinkReply {
            enabled: 1,
            frames: c.frames,
            bytes: c.bytes,
            missed: c.missed,
            crc: u64::from(c.last_crc),
        }
    }
}

/// Writes `frame` as a PNG file in `dir`; returns its id.
fn write_snapshot(frame: &vd::PresentedFrame, dir: &Path) -> Answer<u64> {
    std::fs::create_dir_all(dir).map_err(|e| {
        log::warn!("display: snapshot directory {}: {e}", dir.display());
        Status::DeviceError
    })?;
    let path = dir.join(format!("virtsoc-display-{}.png", frame.id));
    vd::write_png(frame, &path).map_err(|e| {
        log::warn!("display: snapshot {}: {e}", path.display());
        Status::DeviceError
    })?;
    log::info!(
        "display: snapshot of frame {} in {}",
        frame.id,
        path.display()
    );
    Ok(frame.id)
}

impl Device for Display {
    fn name(&self) -> &str {
        "display"
    }

    fn backend(&self) -> String {
        let output = match &self.output {
            Output::Headless => "headless".to_string(),
            Output::Window { display, .. } => format!("window on X11 display {display},"),
        };
        format!(
            "{output} {}x{}@{}Hz (vsync thread), {MAX_PLANES} planes, PNG snapshots to {}",
            self.width,
            self.height,
            self.refresh_hz(),
            self.snapshot_dir.display()
        )
    }

    fn memory_domain(&self) -> &str {
        // A display controller scans out of the GPU's memory...
        "gpu"
    }

    fn reads_host_memory(&self) -> bool {
        // ... and out of system RAM: a plane whose source is current in host memory (a CPU
        // device's output) is scanned out where it is, not uploaded first.
        true
    }

    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult {
        match Command::decode(args)? {
            Command::Present(p) => {
                let frame_id = self.present(cx, p.frame, p.capture_ns)?;
                Ok(PresentReply { frame_id }.to_values())
            }
            Command::Stats(_) => Ok(self.screen.stats(cx.guest).to_values()),
            Command::SignalAtVsync(s) => {
                self.screen
                    .signal_at_vsync(cx.guest, cx.fences, FenceId::from_u64(s.fence))?;
                Ok([0; 6])
            }
            // Answered by `execute_async`, off the device worker.
            Command::Snapshot(_) => Err(Status::Internal),
            Command::PresentLayers(p) => {
                let frame_id = self.present_layers(cx, p.layers, p.count, p.capture_ns)?;
                Ok(PresentReply { frame_id }.to_values())
            }
            Command::Checksum(_) => {
                let v = self.verify.as_ref().ok_or(Status::NotSupported)?;
                let (frame_id, crc) = v
                    .lock_or_recover()
                    .get(&cx.guest)
                    .copied()
                    .ok_or(Status::Busy)?;
                Ok(ChecksumReply {
                    frame_id,
                    crc: crc as u64,
                }
                .to_values())
            }
            Command::Sink(_) => Ok(self.sink_reply(cx.guest).to_values()),
            Command::Timing(_) => {
                let period_ns = 1_000_000_000 / u64::from(self.refresh_hz().max(1));
                Ok(self.screen.timing(cx.guest, period_ns).to_values())
            }
            Command::Mode(_) => Ok(ModeReply {
                width: self.width as u64,
                height: self.height as u64,
                refresh_hz: self.refresh_hz() as u64,
                planes: MAX_PLANES as u64,
            }
            .to_values()),
        }
    }

    fn execute_async(&self, cx: &DeviceCtx<'_>, args: &[u64; 6], reply: Reply) {
        match Command::decode(args) {
            Ok(Command::Snapshot(_)) => self.snapshot_async(cx.guest, reply),
            _ => reply.send(self.execute(cx, args)),
        }
    }

    fn latest_frame(
        &self,
        guest: GuestId,
        after: u64,
        wait: Duration,
    ) -> Option<vd::PresentedFrame> {
        self.screen.latest_after(guest, after, wait)
    }

    fn guest_gone(&self, guest: GuestId) {
        self.last_snapshot.lock_or_recover().remove(&guest);
        if let (Some(stats), Some(owner)) = (&self.sink, self.screen.owner_of(guest)) {
            stats.forget(owner);
        }
        self.screen.guest_gone(guest);
        self.view_statics.lock_or_recover().remove(&guest);
        if let Some(v) = &self.verify {
            v.lock_or_recover().remove(&guest);
        }
    }

    fn control(&self, op: &str, args: &serde_json::Value) -> ControlResult {
        self.control_op(op, args)
    }

    /// Snapshots keep whether the guest had the screen (its frames it presents again) and
    /// its frame counters (so `presented` and `dropped` go on across a migration).
    fn export_guest(&self, guest: GuestId) -> Option<serde_json::Value> {
        let foreground = self.screen.foreground() == Some(guest);
        let counters = self.screen.counters(guest);
        if !foreground && counters.is_none() {
            return None;
        }
        let (submitted, presented, dropped) = counters.unwrap_or_default();
        Some(serde_json::json!({
            "foreground": foreground,
            "submitted": submitted,
            "presented": presented,
            "dropped": dropped,
        }))
    }

    fn import_guest(
        &self,
        guest: GuestId,
        record: &serde_json::Value,
    ) -> std::result::Result<(), super::RecordError> {
        let invalid = |why: &str| super::RecordError::Invalid(format!("display record: {why}"));
        let foreground = record
            .get("foreground")
            .and_then(|v| v.as_bool())
            .ok_or_else(|| invalid("no `foreground`"))?;
        // Counters are optional (older records have none); each is a plain count.
        let count = |k: &str| record.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        let (submitted, presented, dropped) =
            (count("submitted"), count("presented"), count("dropped"));
        if presented > submitted || dropped > submitted {
            return Err(invalid("more frames presented or dropped than submitted"));
        }
        if submitted > 0 {
            self.screen
                .carry_counters(guest, submitted, presented, dropped);
        }
        if foreground {
            self.screen.set_foreground(guest);
        }
        Ok(())
    }
}

fn config_error(e: vd::DisplayError) -> HostError {
    HostError::Config(format!("display: {e}"))
}

/// The display crate's vsync clock reading the daemon's media clock.
struct HostClock;

impl vd::Clock for HostClock {
    fn now_ns(&self) -> u64 {
        crate::clock::now_ns()
    }
}
