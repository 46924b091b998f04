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
//! - `signal_at_vsync(fence)`: signals the guest's virtual fence at the first vsync after the
//!   call (an unknown fence is `BadArgument`). A vsync listener thread keeps the pending fences.
//! - `snapshot()`: writes the frame on screen as `<snapshot_dir>/virtsoc-display-<id>.png` and
//!   returns its id; `Busy` while nothing was scanned out yet.
//!
//! Sharing the screen: the first guest to present becomes the foreground owner and only its
//! frames are scanned out; other guests' frames are hidden (kept as their latest content).
//! When the foreground guest goes away, the guest that presented most recently becomes the
//! foreground and its latest frame is shown at the next vsync; with no such guest, the next
//! guest to present takes the screen.
//!
//! Per-guest statistics, from the display's scan-out records:
//! - `presented`: this guest's frames that reached the screen;
//! - `dropped`: its frames that never will: replaced by a newer frame before a vsync, or
//!   hidden because another guest has the screen. Once a vsync has passed after a guest's last
//!   `present`, `presented + dropped` equals the number of frames it presented;
//! - `vsyncs`: vsyncs since the guest first used the display;
//! - `latency_p50_ns`, `latency_p99_ns`, `samples`: motion-to-photon latency percentiles
//!   (nearest rank) over the guest's last [`LATENCY_WINDOW`] scanned-out frames that carried a
//!   capture time, and how many samples they cover (0 and 0 when there are none).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use virtsoc_devapi::display::{Command, PresentReply, SnapshotReply, StatsReply};
use virtsoc_display as vd;
use virtsoc_fence::table::{FenceId, VirtualFenceTable};
use virtsoc_proto::wire::Format;
use virtsoc_proto::Status;

use super::registry::DeviceConfig;
use super::{Device, DeviceCtx, DeviceResult};
use crate::{HostError, Result};

/// What a command answers the guest: a value or a status.
type Answer<T> = std::result::Result<T, Status>;

/// Width of the screen in pixels.
pub const WIDTH: u32 = 1920;
/// Height of the screen in pixels.
pub const HEIGHT: u32 = 1080;
/// Latency samples kept per guest for the percentiles.
pub const LATENCY_WINDOW: usize = 4096;
/// Fences one guest may have waiting for the next vsync.
pub const MAX_PENDING_FENCES: usize = 1024;

/// The display device.
pub struct Display {
    screen: Arc<Screen>,
    snapshot_dir: PathBuf,
    refresh_hz: u32,
    output: Output,
}

/// Where scanned-out frames go (`--display-backend`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Output {
    Headless,
    /// An X11 window on this `$DISPLAY`.
    Window(String),
}

impl Output {
    /// Parses a `--display-backend` value; checks that a window can be had (built in, and a
    /// `$DISPLAY` is set).
    fn parse(spec: &str) -> Result<Self> {
        match spec {
            "headless" => Ok(Output::Headless),
            "window" => {
                if !cfg!(feature = "window") {
                    return Err(HostError::Config(
                        "display: --display-backend window is not built into this virtsocd: \
                         rebuild it with the `window` cargo feature \
                         (cargo build -p virtsoc --features window)"
                            .into(),
                    ));
                }
                match std::env::var("DISPLAY") {
                    Ok(d) if !d.is_empty() => Ok(Output::Window(d)),
                    _ => Err(HostError::Config(
                        "display: --display-backend window needs an X11 display, \
                         but $DISPLAY is not set"
                            .into(),
                    )),
                }
            }
            other => Err(HostError::Config(format!(
                "display: unknown display backend {other:?} (expected headless or window)"
            ))),
        }
    }

    /// The scan-out backend.
    fn backend(&self, refresh_hz: u32) -> Result<Box<dyn vd::DisplayBackend>> {
        match self {
            Output::Headless => Ok(Box::new(vd::HeadlessBackend::new())),
            Output::Window(display) => open_window(display, refresh_hz),
        }
    }
}

#[cfg(feature = "window")]
fn open_window(display: &str, refresh_hz: u32) -> Result<Box<dyn vd::DisplayBackend>> {
    let w = vd::WindowBackend::new("virtsoc display", WIDTH, HEIGHT, refresh_hz).map_err(|e| {
        HostError::Config(format!(
            "display: cannot open a window on X11 display {display:?}: {e}"
        ))
    })?;
    log::info!("display: window {WIDTH}x{HEIGHT} open on X11 display {display}");
    Ok(Box::new(w))
}

#[cfg(not(feature = "window"))]
fn open_window(_display: &str, _refresh_hz: u32) -> Result<Box<dyn vd::DisplayBackend>> {
    Err(HostError::Config(
        "display: the window backend is not built in".into(),
    ))
}

impl Display {
    /// Builds the device from the daemon's configuration and starts its vsync thread.
    pub fn new(cfg: &DeviceConfig) -> Result<Self> {
        let output = Output::parse(&cfg.display_backend)?;
        let mut config = vd::DisplayConfig::new(WIDTH, HEIGHT).with_refresh_hz(cfg.refresh_hz);
        config.backend = output.backend(cfg.refresh_hz)?;
        let display = vd::Display::new(config).map_err(config_error)?;
        let vsync = vd::VsyncThread::spawn_with_clock(display, Arc::new(HostClock))
            .map_err(config_error)?;
        let (_, events) = vsync.subscribe();
        let screen = Arc::new(Screen {
            vsync,
            state: Mutex::new(State::default()),
        });
        let weak = Arc::downgrade(&screen);
        std::thread::Builder::new()
            .name("display-vsync-listener".into())
            .spawn(move || listen(weak, events))?;
        Ok(Display {
            screen,
            snapshot_dir: cfg.snapshot_dir.clone(),
            refresh_hz: cfg.refresh_hz,
            output,
        })
    }

    /// Copies region `region` of the calling guest into a frame and presents it.
    fn present(&self, cx: &DeviceCtx<'_>, region: u64, capture_ns: u64) -> Answer<u64> {
        let meta = cx.meta(region)?;
        let format = FrameFormat::of(meta.format)?;
        let need = format.required_len(meta.width, meta.height, meta.stride, meta.size)?;
        let bytes: Arc<[u8]> = cx
            .with_region(region, |b| b.get(..need).map(Arc::from))?
            .ok_or(Status::BadArgument)?;
        let frame = format.frame(
            bytes,
            meta.width,
            meta.height,
            meta.stride,
            (capture_ns != 0).then_some(capture_ns),
        );
        self.screen.present(cx.guest, frame)
    }

    /// Writes the frame on screen as a PNG file; returns its id.
    fn snapshot(&self) -> Answer<u64> {
        let frame = self
            .screen
            .vsync
            .with_display(|d| d.last_frame().cloned())
            .ok_or(Status::Busy)?;
        std::fs::create_dir_all(&self.snapshot_dir).map_err(|e| {
            log::warn!(
                "display: snapshot directory {}: {e}",
                self.snapshot_dir.display()
            );
            Status::DeviceError
        })?;
        let path = self
            .snapshot_dir
            .join(format!("virtsoc-display-{}.png", frame.id));
        vd::write_png(&frame, &path).map_err(|e| {
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
}

impl Device for Display {
    fn name(&self) -> &str {
        "display"
    }

    fn backend(&self) -> String {
        let output = match &self.output {
            Output::Headless => "headless".to_string(),
            Output::Window(d) => format!("window on X11 display {d},"),
        };
        format!(
            "{output} {WIDTH}x{HEIGHT}@{}Hz (vsync thread), PNG snapshots to {}",
            self.refresh_hz,
            self.snapshot_dir.display()
        )
    }

    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult {
        match Command::decode(args)? {
            Command::Present(p) => {
                let frame_id = self.present(cx, p.frame, p.capture_ns)?;
                Ok(PresentReply { frame_id }.to_values())
            }
            Command::Stats(_) => Ok(self.screen.stats(cx.guest).to_values()),
            Command::SignalAtVsync(s) => {
                self.screen.signal_at_vsync(cx.guest, cx.fences, s.fence)?;
                Ok([0; 6])
            }
            Command::Snapshot(_) => {
                let frame_id = self.snapshot()?;
                Ok(SnapshotReply { frame_id }.to_values())
            }
        }
    }

    fn guest_gone(&self, guest: u64) {
        self.screen.guest_gone(guest);
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

/// A pixel format the display scans out, in the display's and the media crate's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FrameFormat {
    display: vd::PixelFormat,
    media: virtsoc_media::PixelFormat,
}

impl FrameFormat {
    /// The format of a region of format `f`: Rgba8 and Bgra8 only.
    fn of(f: Format) -> Answer<Self> {
        match f {
            Format::Rgba8 => Ok(FrameFormat {
                display: vd::PixelFormat::Rgba8,
                media: virtsoc_media::PixelFormat::Rgba8,
            }),
            Format::Bgra8 => Ok(FrameFormat {
                display: vd::PixelFormat::Bgra8,
                media: virtsoc_media::PixelFormat::Bgra8,
            }),
            _ => Err(Status::NotSupported),
        }
    }

    /// Bytes of a `width` x `height` image with rows `stride` bytes apart, checked against
    /// the region's `size`.
    fn required_len(&self, width: u32, height: u32, stride: u32, size: u64) -> Answer<usize> {
        let row = u64::from(width) * 4;
        if width == 0 || height == 0 || u64::from(stride) < row {
            return Err(Status::BadArgument);
        }
        let need = u64::from(stride) * u64::from(height - 1) + row;
        if need > size {
            return Err(Status::BadArgument);
        }
        usize::try_from(need).map_err(|_| Status::BadArgument)
    }

    /// A frame of these pixels (owner, id and submission time are set when presenting). With
    /// no `capture_ns`, a capture time stamped into the pixels is used, if there is one.
    fn frame(
        &self,
        bytes: Arc<[u8]>,
        width: u32,
        height: u32,
        stride: u32,
        capture_ns: Option<u64>,
    ) -> vd::PresentedFrame {
        let capture_ns = capture_ns.or_else(|| self.stamped_time(&bytes, width, height, stride));
        vd::PresentedFrame {
            id: 0,
            owner: 0,
            data: vd::FrameData::Bytes(bytes),
            format: self.display,
            width,
            height,
            stride,
            capture_ns,
            submitted_ns: 0,
        }
    }

    /// The capture time the camera stamped into the pixels, if any.
    fn stamped_time(&self, bytes: &[u8], width: u32, height: u32, stride: u32) -> Option<u64> {
        let layout =
            virtsoc_media::FrameLayout::with_stride(self.media, width, height, stride).ok()?;
        let frame = virtsoc_media::FrameRef::new(layout, bytes).ok()?;
        virtsoc_media::read_timestamp(frame)
    }
}

/// Nearest-rank percentile `p` of sorted samples (0 when there are none).
fn percentile(sorted: &[u64], p: u64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (sorted.len() as u64 * p).div_ceil(100).max(1);
    sorted[(rank - 1).min(sorted.len() as u64 - 1) as usize]
}

/// One guest's view of the display.
#[derive(Debug)]
struct GuestScreen {
    /// Its owner id on the display.
    owner: vd::OwnerId,
    /// Frames it presented.
    submitted: u64,
    /// Its frames scanned out.
    presented: u64,
    /// Its frames replaced or hidden.
    dropped: u64,
    /// Display vsync count when it first used the display.
    first_vsync: u64,
    /// Latency samples of its last scanned-out frames.
    latencies: VecDeque<u64>,
    /// Order of its latest `present` among all guests' (0: never presented).
    last_present: u64,
}

/// A fence to signal at the first vsync after `after_vsync`.
struct PendingFence {
    guest: u64,
    table: Arc<VirtualFenceTable>,
    fence: FenceId,
    after_vsync: u64,
}

impl PendingFence {
    fn signal(&self) {
        if let Err(e) = self.table.signal(self.fence) {
            // The guest released or recycled it meanwhile, or is going away.
            log::debug!(
                "display: guest {}: vsync fence {:?}: {e}",
                self.guest,
                self.fence
            );
        }
    }
}

/// Per-guest bookkeeping, behind the screen's lock (always taken inside the display's lock).
#[derive(Default)]
struct State {
    guests: HashMap<u64, GuestScreen>,
    owners: HashMap<vd::OwnerId, u64>,
    next_owner: vd::OwnerId,
    next_frame_id: u64,
    present_seq: u64,
    foreground: Option<u64>,
    fences: Vec<PendingFence>,
}

impl State {
    /// The guest's record, created at its first use of the display (`vsyncs`: the display's
    /// vsync count now).
    fn guest(&mut self, guest: u64, vsyncs: u64) -> &mut GuestScreen {
        if !self.guests.contains_key(&guest) {
            let owner = loop {
                self.next_owner = self.next_owner.wrapping_add(1);
                if !self.owners.contains_key(&self.next_owner) {
                    break self.next_owner;
                }
            };
            self.owners.insert(owner, guest);
            self.guests.insert(
                guest,
                GuestScreen {
                    owner,
                    submitted: 0,
                    presented: 0,
                    dropped: 0,
                    first_vsync: vsyncs,
                    latencies: VecDeque::new(),
                    last_present: 0,
                },
            );
        }
        self.guests.get_mut(&guest).expect("inserted above")
    }

    /// Counts scan-outs into their owners' records.
    fn absorb(&mut self, records: Vec<vd::ScanoutRecord>) {
        for r in records.into_iter().filter(|r| !r.revealed) {
            let Some(g) = self
                .owners
                .get(&r.owner)
                .and_then(|guest| self.guests.get_mut(guest))
            else {
                continue; // its guest has gone
            };
            g.presented += 1;
            if let Some(l) = r.latency_ns {
                if g.latencies.len() == LATENCY_WINDOW {
                    g.latencies.pop_front();
                }
                g.latencies.push_back(l);
            }
        }
    }

    /// Gives the screen to `guest`. Frames of owners that have gone, which the display keeps
    /// as background content when switching, are forgotten.
    fn switch_foreground(&mut self, d: &mut vd::Display, guest: u64, owner: vd::OwnerId) {
        let previous = d.foreground();
        let shown = d.last_frame().map(|f| f.owner);
        d.set_foreground(owner);
        self.foreground = Some(guest);
        for o in [previous, shown].into_iter().flatten() {
            if o != owner && !self.owners.contains_key(&o) {
                d.remove_owner(o);
            }
        }
    }
}

/// The display with its vsync thread and the guests' bookkeeping.
struct Screen {
    vsync: vd::VsyncThread,
    state: Mutex<State>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Screen {
    /// Runs `f` with the display and the bookkeeping locked (in that order). Keep it short:
    /// vsync waits for it.
    fn with<R>(&self, f: impl FnOnce(&mut vd::Display, &mut State) -> R) -> R {
        self.vsync.with_display(|d| f(d, &mut lock(&self.state)))
    }

    /// Presents `frame` as `guest`'s; returns its id.
    fn present(&self, guest: u64, mut frame: vd::PresentedFrame) -> Answer<u64> {
        // Checked before touching any state, so a refused frame changes nothing.
        frame.validate().map_err(|e| {
            log::debug!("display: guest {guest}: {e}");
            Status::BadArgument
        })?;
        frame.submitted_ns = crate::clock::now_ns();
        self.with(|d, st| {
            let vsyncs = d.stats().vsyncs;
            let owner = st.guest(guest, vsyncs).owner;
            st.next_frame_id += 1;
            let id = st.next_frame_id;
            frame.id = id;
            frame.owner = owner;
            if st.foreground.is_none() {
                st.switch_foreground(d, guest, owner);
            }
            // The display queues only the foreground's frames, so a frame it replaces (and
            // counts as dropped) is always the presenting guest's own.
            let dropped_before = d.stats().dropped;
            let outcome = d.present(frame).map_err(|e| {
                log::debug!("display: guest {guest}: {e}");
                Status::BadArgument
            })?;
            let dropped =
                outcome == vd::PresentOutcome::Hidden || d.stats().dropped > dropped_before;
            st.present_seq += 1;
            let seq = st.present_seq;
            let g = st.guest(guest, vsyncs);
            g.submitted += 1;
            g.dropped += u64::from(dropped);
            g.last_present = seq;
            Ok(id)
        })
    }

    /// `guest`'s counters.
    fn stats(&self, guest: u64) -> StatsReply {
        let (mut samples, mut reply) = self.with(|d, st| {
            st.absorb(d.drain_scanouts());
            let vsyncs = d.stats().vsyncs;
            let g = st.guest(guest, vsyncs);
            let reply = StatsReply {
                presented: g.presented,
                dropped: g.dropped,
                vsyncs: vsyncs - g.first_vsync,
                samples: g.latencies.len() as u64,
                ..StatsReply::default()
            };
            (g.latencies.iter().copied().collect::<Vec<_>>(), reply)
        });
        samples.sort_unstable();
        reply.latency_p50_ns = percentile(&samples, 50);
        reply.latency_p99_ns = percentile(&samples, 99);
        reply
    }

    /// Arranges for `guest`'s fence `raw` to be signaled at the next vsync.
    fn signal_at_vsync(&self, guest: u64, fences: &Arc<VirtualFenceTable>, raw: u64) -> Answer<()> {
        let fence = FenceId::from_u64(raw);
        fences.status(fence).map_err(|_| Status::BadArgument)?;
        self.with(|d, st| {
            let vsyncs = d.stats().vsyncs;
            st.guest(guest, vsyncs);
            if st.fences.iter().filter(|f| f.guest == guest).count() >= MAX_PENDING_FENCES {
                return Err(Status::Busy);
            }
            st.fences.push(PendingFence {
                guest,
                table: fences.clone(),
                fence,
                after_vsync: vsyncs,
            });
            Ok(())
        })
    }

    /// After a vsync: counts the scan-outs and returns the fences now due.
    fn after_vsync(&self) -> Vec<PendingFence> {
        self.with(|d, st| {
            st.absorb(d.drain_scanouts());
            let vsyncs = d.stats().vsyncs;
            let (due, waiting) = std::mem::take(&mut st.fences)
                .into_iter()
                .partition(|f| f.after_vsync < vsyncs);
            st.fences = waiting;
            due
        })
    }

    /// Forgets `guest`: its frames, counters, pending fences, and the screen if it had it.
    fn guest_gone(&self, guest: u64) {
        self.with(|d, st| {
            st.fences.retain(|f| f.guest != guest);
            let Some(g) = st.guests.remove(&guest) else {
                return;
            };
            st.owners.remove(&g.owner);
            d.remove_owner(g.owner);
            if st.foreground == Some(guest) {
                st.foreground = None;
                let next = st
                    .guests
                    .iter()
                    .filter(|(_, g)| g.last_present > 0)
                    .max_by_key(|(_, g)| g.last_present)
                    .map(|(id, g)| (*id, g.owner));
                if let Some((next, owner)) = next {
                    st.switch_foreground(d, next, owner);
                }
            }
        });
    }
}

/// The vsync listener: counts scan-outs and signals due fences after every vsync. Ends when
/// the display goes away (its vsync thread stops and the channel closes).
fn listen(screen: Weak<Screen>, events: Receiver<vd::VsyncEvent>) {
    while events.recv().is_ok() {
        let Some(screen) = screen.upgrade() else {
            return;
        };
        for f in screen.after_vsync() {
            f.signal();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use virtsoc_fence::{FenceStatus, MemPage};

    fn display(hz: u32) -> (Display, PathBuf) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir =
            std::env::temp_dir().join(format!("virtsoc-display-unit-{}-{n}", std::process::id()));
        let cfg = DeviceConfig {
            refresh_hz: hz,
            snapshot_dir: dir.clone(),
            ..DeviceConfig::default()
        };
        (Display::new(&cfg).unwrap(), dir)
    }

    fn table() -> Arc<VirtualFenceTable> {
        Arc::new(VirtualFenceTable::new(Arc::new(MemPage::new())))
    }

    /// Waits (bounded) for the next vsync after now, through a vsync fence.
    fn next_vsync(d: &Display, guest: u64, t: &Arc<VirtualFenceTable>) {
        let f = t.create().unwrap();
        d.screen.signal_at_vsync(guest, t, f.to_u64()).unwrap();
        assert_eq!(
            t.wait(f, Some(Duration::from_secs(10))).unwrap(),
            FenceStatus::Signaled,
            "no vsync within 10 s"
        );
    }

    fn rgba_frame(
        w: u32,
        h: u32,
        seed: u8,
        capture_ns: Option<u64>,
    ) -> (Vec<u8>, vd::PresentedFrame) {
        let bytes: Vec<u8> = (0..w * h * 4)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect();
        let f = FrameFormat::of(Format::Rgba8).unwrap();
        let frame = f.frame(bytes.clone().into(), w, h, w * 4, capture_ns);
        (bytes, frame)
    }

    #[test]
    fn formats_and_geometry_are_checked() {
        assert_eq!(FrameFormat::of(Format::Nv12), Err(Status::NotSupported));
        assert_eq!(FrameFormat::of(Format::Blob), Err(Status::NotSupported));
        assert_eq!(FrameFormat::of(Format::Yuyv), Err(Status::NotSupported));
        let f = FrameFormat::of(Format::Bgra8).unwrap();
        assert_eq!(f.required_len(4, 2, 16, 32), Ok(32));
        assert_eq!(
            f.required_len(4, 2, 20, 36),
            Ok(36),
            "no padding after the last row"
        );
        assert_eq!(
            f.required_len(4, 2, 12, 32),
            Err(Status::BadArgument),
            "stride"
        );
        assert_eq!(
            f.required_len(4, 2, 16, 31),
            Err(Status::BadArgument),
            "size"
        );
        assert_eq!(f.required_len(0, 2, 16, 32), Err(Status::BadArgument));
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        assert_eq!(percentile(&[], 50), 0);
        assert_eq!(percentile(&[7], 99), 7);
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50), 50);
        assert_eq!(percentile(&v, 99), 99);
        assert_eq!(percentile(&[1, 2, 3], 50), 2);
    }

    #[test]
    fn stats_count_every_frame_once_and_measure_latency() {
        let (d, _) = display(200);
        let t = table();
        let g = 1;
        assert_eq!(d.screen.stats(g), StatsReply::default());
        let now = crate::clock::now_ns();
        for i in 0..5u8 {
            let (_, frame) = rgba_frame(8, 4, i, Some(now));
            d.screen.present(g, frame).unwrap();
        }
        next_vsync(&d, g, &t);
        next_vsync(&d, g, &t);
        let s = d.screen.stats(g);
        assert_eq!(s.presented + s.dropped, 5, "{s:?}");
        assert!(s.presented >= 1, "{s:?}");
        assert!(s.vsyncs >= 2, "{s:?}");
        assert_eq!(s.samples, s.presented, "every frame carried a capture time");
        assert!(
            s.latency_p50_ns > 0 && s.latency_p50_ns <= s.latency_p99_ns,
            "{s:?}"
        );
        // Frame ids are distinct and increasing.
        let a = d.screen.present(g, rgba_frame(8, 4, 9, None).1).unwrap();
        let b = d.screen.present(g, rgba_frame(8, 4, 9, None).1).unwrap();
        assert!(b > a);
    }

    #[test]
    fn a_stamped_capture_time_is_read_from_the_pixels() {
        let (d, _) = display(200);
        let t = table();
        let (w, h) = (160, 64);
        let mut bytes = vec![0u8; (w * h * 4) as usize];
        let stamped = crate::clock::now_ns();
        let layout =
            virtsoc_media::FrameLayout::packed(virtsoc_media::PixelFormat::Rgba8, w, h).unwrap();
        virtsoc_media::stamp_timestamp(
            virtsoc_media::FrameMut::new(layout, &mut bytes).unwrap(),
            stamped,
        )
        .unwrap();
        let f = FrameFormat::of(Format::Rgba8).unwrap();
        let frame = f.frame(bytes.clone().into(), w, h, w * 4, None);
        assert_eq!(frame.capture_ns, Some(stamped));
        // An explicit capture time wins over the stamp.
        assert_eq!(
            f.frame(bytes.into(), w, h, w * 4, Some(5)).capture_ns,
            Some(5)
        );
        // Unstamped pixels carry none.
        assert_eq!(rgba_frame(64, 64, 3, None).1.capture_ns, None);

        d.screen.present(7, frame).unwrap();
        next_vsync(&d, 7, &t);
        let s = d.screen.stats(7);
        assert_eq!((s.presented, s.samples), (1, 1), "{s:?}");
        let elapsed = crate::clock::now_ns() - stamped;
        assert!(s.latency_p50_ns > 0 && s.latency_p50_ns <= elapsed, "{s:?}");
    }

    #[test]
    fn snapshot_writes_the_presented_pixels() {
        let (d, dir) = display(200);
        let t = table();
        assert_eq!(d.snapshot(), Err(Status::Busy), "nothing on screen yet");
        // A BGRA frame with padded rows: the PNG holds its pixels as RGBA.
        let (w, h, stride) = (5u32, 3u32, 24u32);
        let bgra: Vec<u8> = (0..stride * h).map(|i| (i * 7 + 1) as u8).collect();
        let f = FrameFormat::of(Format::Bgra8).unwrap();
        let id = d
            .screen
            .present(3, f.frame(bgra.clone().into(), w, h, stride, None))
            .unwrap();
        next_vsync(&d, 3, &t);
        assert_eq!(d.snapshot(), Ok(id));
        let png = std::fs::read(dir.join(format!("virtsoc-display-{id}.png"))).unwrap();

        let mut rgba = Vec::new();
        for y in 0..h {
            for x in 0..w {
                let p = (y * stride + x * 4) as usize;
                rgba.extend_from_slice(&[bgra[p + 2], bgra[p + 1], bgra[p], bgra[p + 3]]);
            }
        }
        let expected = vd::PresentedFrame::new(0, w, h, vd::PixelFormat::Rgba8, rgba);
        let mut want = Vec::new();
        vd::encode_png(&expected, &mut want).unwrap();
        assert_eq!(png, want, "the PNG encodes exactly the presented pixels");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn unknown_fences_are_refused_and_gone_guests_forgotten() {
        let (d, _) = display(200);
        let t = table();
        assert_eq!(
            d.screen
                .signal_at_vsync(1, &t, FenceId::from_u64(0x5_0000_0003).to_u64()),
            Err(Status::BadArgument)
        );
        // A gone guest's pending fence is never signaled.
        let other = table();
        let f = other.create().unwrap();
        d.screen.signal_at_vsync(2, &other, f.to_u64()).unwrap();
        d.guest_gone(2);
        next_vsync(&d, 1, &t);
        next_vsync(&d, 1, &t);
        assert_eq!(other.status(f).unwrap(), FenceStatus::Pending);
    }

    #[test]
    fn the_first_presenter_owns_the_screen_until_it_goes() {
        let (d, dir) = display(200);
        let t = table();
        let (a, b) = (10, 20);
        d.screen.present(a, rgba_frame(8, 4, 1, None).1).unwrap();
        let hidden = d.screen.present(b, rgba_frame(8, 4, 2, None).1).unwrap();
        next_vsync(&d, a, &t);
        next_vsync(&d, a, &t);
        let (sa, sb) = (d.screen.stats(a), d.screen.stats(b));
        assert_eq!((sa.presented, sa.dropped), (1, 0), "{sa:?}");
        assert_eq!((sb.presented, sb.dropped), (0, 1), "background: {sb:?}");
        assert_ne!(d.snapshot(), Ok(hidden));

        // A goes: B, the latest presenter, gets the screen and its hidden frame shows.
        d.guest_gone(a);
        next_vsync(&d, b, &t);
        next_vsync(&d, b, &t);
        assert_eq!(d.snapshot(), Ok(hidden));
        d.screen.present(b, rgba_frame(8, 4, 3, None).1).unwrap();
        next_vsync(&d, b, &t);
        next_vsync(&d, b, &t);
        let sb = d.screen.stats(b);
        assert_eq!((sb.presented, sb.dropped), (1, 1), "{sb:?}");

        // B goes too: the next guest to present takes the screen.
        d.guest_gone(b);
        let c = 30;
        let shown = d.screen.present(c, rgba_frame(8, 4, 4, None).1).unwrap();
        next_vsync(&d, c, &t);
        next_vsync(&d, c, &t);
        assert_eq!(d.snapshot(), Ok(shown));
        let sc = d.screen.stats(c);
        assert_eq!((sc.presented, sc.dropped), (1, 0), "{sc:?}");
        {
            let st = lock(&d.screen.state);
            assert_eq!(st.guests.len(), 1);
            assert_eq!(st.owners.len(), 1);
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn refused_frames_change_nothing() {
        let (d, _) = display(200);
        let f = FrameFormat::of(Format::Rgba8).unwrap();
        let huge = f.frame(vec![0u8; 4 * 20_000].into(), 20_000, 1, 80_000, None);
        assert_eq!(d.screen.present(4, huge), Err(Status::BadArgument));
        let st = lock(&d.screen.state);
        assert!(st.guests.is_empty() && st.foreground.is_none());
    }

    #[test]
    fn bad_refresh_rates_are_configuration_errors() {
        let cfg = DeviceConfig {
            refresh_hz: 0,
            ..DeviceConfig::default()
        };
        assert!(matches!(Display::new(&cfg), Err(HostError::Config(_))));
    }

    #[test]
    fn backend_describes_the_screen() {
        let (d, dir) = display(60);
        let b = d.backend();
        assert!(b.starts_with("headless 1920x1080@60Hz (vsync thread), PNG snapshots to "));
        assert!(b.ends_with(&dir.display().to_string()));
    }

    fn backend_error(spec: &str) -> String {
        match Output::parse(spec) {
            Err(HostError::Config(m)) => m,
            other => panic!("{spec}: expected a configuration error, got {other:?}"),
        }
    }

    #[test]
    fn display_backends_are_checked() {
        assert_eq!(Output::parse("headless").unwrap(), Output::Headless);
        let m = backend_error("wayland");
        assert!(
            m.contains("unknown display backend") && m.contains("wayland"),
            "{m}"
        );
        match Output::parse("window") {
            Ok(Output::Window(d)) if cfg!(feature = "window") => {
                assert_eq!(std::env::var("DISPLAY").unwrap(), d);
            }
            Ok(o) => panic!("{o:?}"),
            Err(HostError::Config(m)) if cfg!(feature = "window") => {
                assert!(m.contains("$DISPLAY"), "{m}")
            }
            Err(HostError::Config(m)) => {
                assert!(m.contains("not built") && m.contains("window"), "{m}")
            }
            Err(e) => panic!("{e}"),
        }
    }
}
