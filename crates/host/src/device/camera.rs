//! The camera device: a sensor whose frames carry their capture time in the pixels. The
//! source is chosen with the daemon's `--camera-source`:
//! - `synthetic` (default): `virtsoc-media`'s [`SyntheticCamera`], a moving test pattern with
//!   a trackable white square;
//! - `file:PATH`: a video file played in a loop ([`FileCamera`]), each frame converted and
//!   scaled to the capture region's format and size with the swscale ISP. The file is opened
//!   and its first frame decoded at startup, so a missing or undecodable file (or an unknown
//!   source) stops the daemon with a configuration error naming it.
//!
//! `capture(frame)` writes the next frame into the guest's region; the region's metadata
//! (NV12, YUV420P, RGBA or BGRA; width, height, stride) sets the mode. Each guest has its own
//! camera per mode, created on first use, so frame indices (and the moving square's path, or
//! the file's position) start at 0 for every guest and mode; a guest keeps at most
//! [`MAX_MODES_PER_GUEST`] modes (the least recently used one is dropped beyond) and loses
//! them all when it goes away. Captures of different cameras run in parallel; file decoding
//! happens on the capturing thread.
//!
//! The capture time is [`crate::clock::now_ns`] (CLOCK_MONOTONIC), taken just before the
//! frame is drawn, returned as `capture_ns` and stamped into the top strip of the frame (see
//! `virtsoc_media::camera::timestamp`), so the display can measure motion-to-photon latency
//! on whatever reaches it after conversion, scaling, encoding and composition
//! ([`read_capture_time`] reads it back). The reply also gives the centre of the moving white
//! square, which AR pipelines track and draw overlays on (0, 0 for a file source).
//!
//! Captures are not paced: the camera delivers a frame per command, as fast as it is asked;
//! guests pace themselves (e.g. on the display's vsync).
//!
//! Regions in other formats (blob, YUYV) get [`Status::NotSupported`]; odd or too small sizes
//! (under 40x32, the timestamp strip's minimum) get [`Status::BadArgument`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use virtsoc_svm::GuestId;

use virtsoc_devapi::camera::{self as api, Command};
use virtsoc_media::camera::timestamp::MIN_SIZE;
use virtsoc_media::{read_timestamp, CameraSource, FrameLayout, FrameMut, FrameRef, PixelFormat};
use virtsoc_media::{
    stamp_timestamp, CaptureInfo, FileCamera, IspBackend, MediaError, SwscaleIsp, SyntheticCamera,
};
use virtsoc_proto::Status;
use virtsoc_svm::RegionMeta;
use virtsoc_sync::LockExt;

use super::codec::frame_layout;
use super::registry::{CameraSourceKind, DeviceConfig};
use super::{Device, DeviceCtx, DeviceResult};
use crate::status::status_of;
use crate::{clock, HostError, Result};

/// Frame rate the synthetic cameras report (their nominal frame interval).
pub const CAMERA_FPS: u32 = 60;
/// Camera modes (format and size) one guest keeps at once.
pub const MAX_MODES_PER_GUEST: usize = 8;

/// Reads the capture time stamped by the camera from a frame in region layout `meta`
/// (any format the camera produces, also after conversion or scaling). `None` if the bytes
/// carry no valid stamp.
pub fn read_capture_time(meta: &RegionMeta, bytes: &[u8]) -> Option<u64> {
    let layout = frame_layout(meta).ok()?;
    read_timestamp(FrameRef::new(layout, bytes).ok()?)
}

/// A camera mode: what a capture region looks like (its stride may differ).
type Mode = (PixelFormat, u32, u32);

/// Where frames come from (`--camera-source`).
#[derive(Debug, Clone, PartialEq)]
enum Source {
    Synthetic,
    File(FileSource),
    /// A V4L2 capture device (`v4l2:/dev/videoN`; needs the `v4l2` feature).
    #[cfg(feature = "v4l2")]
    V4l2(PathBuf),
}

/// A video file checked at startup.
#[derive(Debug, Clone, PartialEq)]
struct FileSource {
    path: PathBuf,
    /// Frame size the file decodes to.
    width: u32,
    height: u32,
    /// Nominal frame rate.
    fps: f64,
}

impl Source {
    /// Checks a `--camera-source` choice: a file is opened and its first frame decoded, a
    /// V4L2 device opened once.
    fn open(kind: &CameraSourceKind) -> Result<Self> {
        let path = match kind {
            CameraSourceKind::Synthetic => return Ok(Source::Synthetic),
            CameraSourceKind::V4l2(dev) => return Self::v4l2(dev),
            CameraSourceKind::File(path) => path.clone(),
        };
        let cam = FileCamera::open(&path, PixelFormat::Yuv420p).map_err(|e| {
            HostError::Config(format!(
                "camera: cannot use {} as the camera source: {e}",
                path.display()
            ))
        })?;
        let layout = cam.layout();
        if layout.width < MIN_SIZE.0 || layout.height < MIN_SIZE.1 {
            return Err(HostError::Config(format!(
                "camera: {}: frames of {}x{} are too small (at least {}x{})",
                path.display(),
                layout.width,
                layout.height,
                MIN_SIZE.0,
                MIN_SIZE.1
            )));
        }
        Ok(Source::File(FileSource {
            path,
            width: layout.width,
            height: layout.height,
            fps: 1.0 / cam.frame_interval().as_secs_f64(),
        }))
    }
}

impl Source {
    /// A V4L2 device, checked by opening it once at startup.
    #[cfg(feature = "v4l2")]
    fn v4l2(dev: &Path) -> Result<Self> {
        virtsoc_media::camera::V4l2Camera::open(dev, 640, 480, CAMERA_FPS, PixelFormat::Nv12)
            .map_err(|e| {
                HostError::Config(format!(
                    "camera: cannot capture from {}: {e}",
                    dev.display()
                ))
            })?;
        Ok(Source::V4l2(dev.to_path_buf()))
    }

    #[cfg(not(feature = "v4l2"))]
    fn v4l2(dev: &Path) -> Result<Self> {
        Err(HostError::Config(format!(
            "camera: v4l2:{} needs a daemon built with the `v4l2` cargo feature \
             (cargo build -p virtsocd --features v4l2)",
            dev.display()
        )))
    }
}

/// A video file's frames for one mode.
struct FileMode {
    camera: FileCamera,
    /// For a mode whose size differs from the file's: a frame at the file's size (YUV420P)
    /// that the ISP scales into the region. `None`: the camera writes the region directly.
    scratch: Option<(FrameLayout, Vec<u8>)>,
}

impl FileMode {
    fn open(src: &FileSource, mode: Mode) -> std::result::Result<Self, MediaError> {
        let (format, width, height) = mode;
        if (width, height) == (src.width, src.height) {
            let mut camera = FileCamera::open(&src.path, format)?;
            let l = camera.layout();
            if (l.format, l.width, l.height) == mode {
                camera.set_stamp_timestamps(true);
                return Ok(FileMode {
                    camera,
                    scratch: None,
                });
            }
        }
        let camera = FileCamera::open(&src.path, PixelFormat::Yuv420p)?;
        let layout = camera.layout();
        Ok(FileMode {
            camera,
            scratch: Some((layout, vec![0; layout.size()])),
        })
    }

    fn capture(
        &mut self,
        isp: &SwscaleIsp,
        mut dst: FrameMut<'_>,
        now: u64,
    ) -> std::result::Result<CaptureInfo, MediaError> {
        let Some((layout, buf)) = &mut self.scratch else {
            return self.camera.capture(dst, now);
        };
        let info = self.camera.capture(FrameMut::new(*layout, buf)?, now)?;
        isp.convert(FrameRef::new(*layout, buf)?, dst.reborrow())?;
        stamp_timestamp(dst, now)?;
        Ok(info)
    }
}

/// One guest's camera in one mode.
enum ModeCamera {
    Synthetic(SyntheticCamera),
    File(Box<FileMode>),
    #[cfg(feature = "v4l2")]
    V4l2(Box<virtsoc_media::camera::V4l2Camera>),
}

impl ModeCamera {
    fn open(source: &Source, mode: Mode) -> std::result::Result<Self, MediaError> {
        let (format, width, height) = mode;
        Ok(match source {
            Source::Synthetic => {
                ModeCamera::Synthetic(SyntheticCamera::new(width, height, CAMERA_FPS, format)?)
            }
            Source::File(f) => ModeCamera::File(Box::new(FileMode::open(f, mode)?)),
            #[cfg(feature = "v4l2")]
            Source::V4l2(path) => {
                let mut c = virtsoc_media::camera::V4l2Camera::open(
                    path, width, height, CAMERA_FPS, format,
                )?;
                c.set_stamp_timestamps(true);
                ModeCamera::V4l2(Box::new(c))
            }
        })
    }

    fn capture(
        &mut self,
        isp: &SwscaleIsp,
        dst: FrameMut<'_>,
    ) -> std::result::Result<CaptureInfo, MediaError> {
        let now = clock::now_ns();
        match self {
            ModeCamera::Synthetic(c) => c.capture(dst, now),
            ModeCamera::File(f) => f.capture(isp, dst, now),
            #[cfg(feature = "v4l2")]
            ModeCamera::V4l2(c) => {
                use virtsoc_media::camera::CameraSource;
                c.capture(dst, now)
            }
        }
    }
}

struct GuestCamera {
    camera: Arc<Mutex<ModeCamera>>,
    /// Value of the device's use counter at the last capture, for LRU eviction.
    last_used: u64,
}

#[derive(Default)]
struct State {
    cameras: HashMap<(GuestId, Mode), GuestCamera>,
    uses: u64,
}

/// The camera device.
pub struct Camera {
    /// Switched at runtime by the control API (see [`Camera::set_source`]).
    source: Mutex<Source>,
    isp: SwscaleIsp,
    state: Mutex<State>,
}

impl Camera {
    /// Builds the device from the daemon's configuration: checks the camera source (an
    /// unknown one, or a file that cannot be opened and decoded, is a configuration error).
    pub fn new(cfg: &DeviceConfig) -> Result<Self> {
        let source = Source::open(&cfg.camera_source)?;
        if let Source::File(f) = &source {
            log::info!(
                "camera: playing {} ({}x{}, {:.2} fps) in a loop",
                f.path.display(),
                f.width,
                f.height,
                f.fps
            );
        }
        Ok(Camera {
            source: Mutex::new(source),
            isp: SwscaleIsp::new(),
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock_or_recover()
    }

    /// The layout a capture into a region of `meta` uses.
    fn capture_layout(meta: &RegionMeta) -> std::result::Result<FrameLayout, Status> {
        let layout = frame_layout(meta)?;
        // RGB frames are drawn in YUV 4:2:0 and converted, so every format needs even sizes.
        if layout.width % 2 != 0
            || layout.height % 2 != 0
            || layout.width < MIN_SIZE.0
            || layout.height < MIN_SIZE.1
        {
            return Err(Status::BadArgument);
        }
        Ok(layout)
    }

    /// `guest`'s camera for `mode`, opened on first use (outside the device's lock: opening a
    /// file decodes a frame).
    fn camera_for(
        &self,
        guest: GuestId,
        mode: Mode,
    ) -> std::result::Result<Arc<Mutex<ModeCamera>>, Status> {
        let key = (guest, mode);
        {
            let mut st = self.state();
            st.uses += 1;
            let now = st.uses;
            if let Some(c) = st.cameras.get_mut(&key) {
                c.last_used = now;
                return Ok(c.camera.clone());
            }
        }
        let camera = ModeCamera::open(&self.source(), mode).map_err(|e| {
            log::warn!("camera: guest {guest}: cannot open {mode:?}: {e}");
            status_of(&e)
        })?;
        let mut st = self.state();
        st.uses += 1;
        let now = st.uses;
        if let Some(c) = st.cameras.get_mut(&key) {
            // Another capture of this guest opened it meanwhile.
            c.last_used = now;
            return Ok(c.camera.clone());
        }
        let held: Vec<_> = st
            .cameras
            .iter()
            .filter(|((g, _), _)| *g == guest)
            .map(|(k, v)| (v.last_used, *k))
            .collect();
        if held.len() >= MAX_MODES_PER_GUEST {
            if let Some((_, oldest)) = held.iter().min_by_key(|(used, _)| *used) {
                st.cameras.remove(oldest);
            }
        }
        log::debug!(
            "camera: guest {guest} captures {:?} {}x{}",
            mode.0,
            mode.1,
            mode.2
        );
        let camera = Arc::new(Mutex::new(camera));
        st.cameras.insert(
            key,
            GuestCamera {
                camera: camera.clone(),
                last_used: now,
            },
        );
        Ok(camera)
    }

    fn capture(&self, cx: &DeviceCtx<'_>, c: api::Capture) -> DeviceResult {
        let meta = cx.meta(c.frame)?;
        let layout = Self::capture_layout(&meta)?;
        let mode = (layout.format, layout.width, layout.height);
        let camera = self.camera_for(cx.guest, mode)?;
        let mut camera = camera.lock_or_recover();
        let info = cx
            .with_region(c.frame, |bytes| {
                FrameMut::new(layout, bytes)
                    .map_err(MediaError::from)
                    .and_then(|dst| camera.capture(&self.isp, dst))
            })?
            .map_err(|e: MediaError| {
                log::debug!("camera: guest {}: {e}", cx.guest);
                status_of(&e)
            })?;
        let (marker_x, marker_y) = info.marker.unwrap_or((0, 0));
        Ok(api::CaptureReply {
            index: info.frame_index,
            capture_ns: info.capture_time_ns,
            marker_x: marker_x as u64,
            marker_y: marker_y as u64,
        }
        .to_values())
    }
}

impl Device for Camera {
    fn name(&self) -> &str {
        "camera"
    }

    fn backend(&self) -> String {
        match &self.source() {
            Source::Synthetic => format!(
                "synthetic scrolling ramp with a moving square, {CAMERA_FPS} fps \
                 (timestamps stamped in pixels)"
            ),
            Source::File(f) => format!(
                "file {} ({}x{}, {:.2} fps, looped; swscale to the region's format and size; \
                 timestamps stamped in pixels)",
                f.path.display(),
                f.width,
                f.height,
                f.fps
            ),
            #[cfg(feature = "v4l2")]
            Source::V4l2(p) => format!(
                "V4L2 {} (NV12 or YUYV capture; timestamps stamped in pixels)",
                p.display()
            ),
        }
    }

    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult {
        match Command::decode(args)? {
            Command::Capture(c) => self.capture(cx, c),
        }
    }

    fn guest_gone(&self, guest: GuestId) {
        self.state().cameras.retain(|(g, _), _| *g != guest);
    }

    /// Snapshots keep the guest's camera modes (format and size), reopened by a restore;
    /// their frame counters start again at 0 (a file source from its start).
    fn export_guest(&self, guest: GuestId) -> Option<serde_json::Value> {
        let modes: Vec<[u32; 3]> = self
            .state()
            .cameras
            .keys()
            .filter(|(g, _)| *g == guest)
            .map(|(_, (f, w, h))| {
                let code = PixelFormat::ALL.iter().position(|x| x == f).unwrap_or(0) as u32;
                [code, *w, *h]
            })
            .collect();
        (!modes.is_empty()).then(|| serde_json::json!({ "modes": modes }))
    }

    fn import_guest(
        &self,
        guest: GuestId,
        record: &serde_json::Value,
    ) -> std::result::Result<(), super::RecordError> {
        use super::RecordError;
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Record {
            modes: Vec<[u32; 3]>,
        }
        let r: Record = serde_json::from_value(record.clone())?;
        if r.modes.len() > MAX_MODES_PER_GUEST {
            let why = format!("{} camera modes", r.modes.len());
            return Err(RecordError::Invalid(why));
        }
        for [code, w, h] in r.modes {
            let f = *PixelFormat::ALL
                .get(code as usize)
                .ok_or_else(|| RecordError::Invalid(format!("camera format {code}")))?;
            if !(2..=virtsoc_media::frame::MAX_DIMENSION).contains(&w)
                || !(2..=virtsoc_media::frame::MAX_DIMENSION).contains(&h)
            {
                return Err(RecordError::Invalid(format!("camera mode {w}x{h}")));
            }
            self.camera_for(guest, (f, w, h))
                .map_err(|status| RecordError::Refused {
                    what: format!("camera mode {w}x{h}"),
                    status,
                })?;
        }
        Ok(())
    }

    fn control(
        &self,
        op: &str,
        args: &serde_json::Value,
    ) -> std::result::Result<serde_json::Value, virtsoc_control::ControlError> {
        use virtsoc_control::ControlError;
        if op != "source" {
            return Err(ControlError::Unsupported(format!(
                "camera operation {op:?}"
            )));
        }
        let r: virtsoc_control::CameraSourceRequest = serde_json::from_value(args.clone())
            .map_err(|e| ControlError::BadRequest(e.to_string()))?;
        self.set_source(&r.source)
            .map_err(|e| ControlError::BadRequest(format!("field `source`: {e}")))?;
        Ok(serde_json::json!({ "source": r.source, "backend": self.backend() }))
    }
}

impl Camera {
    /// The source now.
    fn source(&self) -> Source {
        self.source.lock_or_recover().clone()
    }

    /// Switches the source (checked as at startup: a file is opened and a frame decoded,
    /// outside the device's locks). Takes effect at once: every guest's cameras are closed,
    /// so the next capture of every guest and mode opens the new source (frame indices start
    /// again at 0); a capture running now finishes on the old one.
    pub fn set_source(&self, spec: &str) -> Result<()> {
        let kind: CameraSourceKind = spec.parse().map_err(HostError::Config)?;
        let source = Source::open(&kind)?;
        *self.source.lock_or_recover() = source;
        self.state().cameras.clear();
        log::info!("camera: source now {spec}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtsoc_proto::wire::Format;

    fn meta(format: Format, width: u32, height: u32) -> RegionMeta {
        let (size, stride) = format.image_size(width, height).unwrap_or((64, 0));
        RegionMeta {
            size,
            width,
            height,
            stride,
            format,
            usage: 0,
        }
    }

    #[test]
    fn stamped_time_reads_back_in_every_format() {
        for format in [Format::Nv12, Format::Yuv420p, Format::Rgba8, Format::Bgra8] {
            let m = meta(format, 320, 240);
            let layout = Camera::capture_layout(&m).unwrap();
            let mut cam = SyntheticCamera::new(320, 240, CAMERA_FPS, layout.format).unwrap();
            let mut buf = vec![0u8; m.size as usize];
            let t = clock::now_ns();
            let info = cam
                .capture(FrameMut::new(layout, &mut buf).unwrap(), t)
                .unwrap();
            assert_eq!(info.capture_time_ns, t);
            assert_eq!(read_capture_time(&m, &buf), Some(t), "{format:?}");
        }
        assert_eq!(
            read_capture_time(&meta(Format::Nv12, 320, 240), &[0u8; 320 * 240 * 3 / 2]),
            None
        );
    }

    fn parse(spec: &str) -> Result<Source> {
        Source::open(&spec.parse().map_err(HostError::Config)?)
    }

    fn source_error(spec: &str) -> String {
        match parse(spec) {
            Err(HostError::Config(m)) => m,
            other => panic!("{spec}: expected a configuration error, got {other:?}"),
        }
    }

    #[test]
    fn camera_sources_are_checked_at_startup() {
        assert_eq!(parse("synthetic").unwrap(), Source::Synthetic);
        let m = source_error("rtsp://cam/1");
        assert!(
            m.contains("unknown camera source") && m.contains("rtsp"),
            "{m}"
        );
        let m = source_error("v4l2:/dev/video-virtsoc-none");
        assert!(m.contains("/dev/video-virtsoc-none"), "{m}");
        assert!(source_error("file:").contains("needs a path"));
        let missing = "/nonexistent/virtsoc-camera-clip.mp4";
        let m = source_error(&format!("file:{missing}"));
        assert!(m.contains(missing), "{m}");
        // A file that is not a video.
        let junk = std::env::temp_dir().join(format!("virtsoc-junk-{}.mp4", std::process::id()));
        std::fs::write(&junk, b"not a video at all").unwrap();
        let m = source_error(&format!("file:{}", junk.display()));
        assert!(m.contains(&junk.display().to_string()), "{m}");
        let _ = std::fs::remove_file(junk);
        let cfg = DeviceConfig {
            camera_source: CameraSourceKind::File(missing.into()),
            ..DeviceConfig::default()
        };
        assert!(matches!(Camera::new(&cfg), Err(HostError::Config(_))));
        let cam = Camera::new(&DeviceConfig::default()).unwrap();
        assert!(cam.backend().starts_with("synthetic"));
    }

    #[test]
    fn capture_layouts() {
        assert!(Camera::capture_layout(&meta(Format::Nv12, 1280, 720)).is_ok());
        assert_eq!(
            Camera::capture_layout(&meta(Format::Blob, 0, 0)),
            Err(Status::NotSupported)
        );
        assert_eq!(
            Camera::capture_layout(&meta(Format::Yuyv, 320, 240)),
            Err(Status::NotSupported)
        );
        assert_eq!(
            Camera::capture_layout(&meta(Format::Rgba8, 321, 240)),
            Err(Status::BadArgument)
        );
        assert_eq!(
            Camera::capture_layout(&meta(Format::Nv12, 32, 32)),
            Err(Status::BadArgument)
        );
    }
}
