//! The camera device: a synthetic sensor (`virtsoc-media`'s [`SyntheticCamera`]) whose
//! frames carry their capture time in the pixels.
//!
//! `capture(frame)` renders the next frame straight into the guest's region; the region's
//! metadata (NV12, YUV420P, RGBA or BGRA; width, height, stride) sets the mode. Each guest has
//! its own camera per mode, created on first use, so frame indices and the moving square's
//! path start at 0 for every guest and mode; a guest keeps at most [`MAX_MODES_PER_GUEST`]
//! modes (the least recently used one is dropped beyond) and loses them all when it goes
//! away.
//!
//! The capture time is [`crate::clock::now_ns`] (CLOCK_MONOTONIC), taken just before the
//! frame is drawn, returned as `capture_ns` and stamped into the top strip of the frame (see
//! `virtsoc_media::camera::timestamp`), so the display can measure motion-to-photon latency
//! on whatever reaches it after conversion, scaling, encoding and composition
//! ([`read_capture_time`] reads it back). The reply also gives the centre of the moving white
//! square, which AR pipelines track and draw overlays on.
//!
//! Captures are not paced: the camera delivers a frame per command, as fast as it is asked;
//! guests pace themselves (e.g. on the display's vsync).
//!
//! Regions in other formats (blob, YUYV) get [`Status::NotSupported`]; odd or too small sizes
//! (under 40x32, the timestamp strip's minimum) get [`Status::BadArgument`].

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use virtsoc_devapi::camera::{self as api, Command};
use virtsoc_media::camera::timestamp::MIN_SIZE;
use virtsoc_media::{read_timestamp, CameraSource, FrameLayout, FrameMut, FrameRef, PixelFormat};
use virtsoc_media::{MediaError, SyntheticCamera};
use virtsoc_proto::Status;
use virtsoc_svm::RegionMeta;

use super::codec::{frame_layout, media_status, pixel_format};
use super::registry::DeviceConfig;
use super::{Device, DeviceCtx, DeviceResult};
use crate::{clock, Result};

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

struct GuestCamera {
    camera: SyntheticCamera,
    /// Value of the device's use counter at the last capture, for LRU eviction.
    last_used: u64,
}

#[derive(Default)]
struct State {
    cameras: HashMap<(u64, Mode), GuestCamera>,
    uses: u64,
}

/// The camera device.
pub struct Camera {
    state: Mutex<State>,
}

impl Camera {
    /// Builds the device from the daemon's configuration.
    pub fn new(_cfg: &DeviceConfig) -> Result<Self> {
        Ok(Camera {
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The layout a capture into a region of `meta` uses.
    fn capture_layout(meta: &RegionMeta) -> std::result::Result<FrameLayout, Status> {
        if pixel_format(meta.format).is_none() {
            return Err(Status::NotSupported);
        }
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

    fn capture(&self, cx: &DeviceCtx<'_>, c: api::Capture) -> DeviceResult {
        let meta = cx.meta(c.frame)?;
        let layout = Self::capture_layout(&meta)?;
        let mode = (layout.format, layout.width, layout.height);
        let mut st = self.state();
        st.uses += 1;
        let now = st.uses;
        let key = (cx.guest, mode);
        if !st.cameras.contains_key(&key) {
            let camera =
                SyntheticCamera::new(layout.width, layout.height, CAMERA_FPS, layout.format)
                    .map_err(|e| media_status(&e))?;
            let held: Vec<_> = st
                .cameras
                .iter()
                .filter(|((g, _), _)| *g == cx.guest)
                .map(|(k, v)| (v.last_used, *k))
                .collect();
            if held.len() >= MAX_MODES_PER_GUEST {
                if let Some((_, oldest)) = held.iter().min_by_key(|(used, _)| *used) {
                    st.cameras.remove(oldest);
                }
            }
            log::debug!(
                "camera: guest {} captures {:?} {}x{}",
                cx.guest,
                layout.format,
                layout.width,
                layout.height
            );
            st.cameras.insert(
                key,
                GuestCamera {
                    camera,
                    last_used: now,
                },
            );
        }
        let cam = st.cameras.get_mut(&key).ok_or(Status::Internal)?;
        cam.last_used = now;
        let camera = &mut cam.camera;
        let info = cx
            .with_region(c.frame, |bytes| {
                FrameMut::new(layout, bytes).and_then(|dst| camera.capture(dst, clock::now_ns()))
            })?
            .map_err(|e: MediaError| {
                log::debug!("camera: guest {}: {e}", cx.guest);
                media_status(&e)
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
        format!(
            "synthetic scrolling ramp with a moving square, {CAMERA_FPS} fps \
             (timestamps stamped in pixels)"
        )
    }

    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult {
        match Command::decode(args)? {
            Command::Capture(c) => self.capture(cx, c),
        }
    }

    fn guest_gone(&self, guest: u64) {
        self.state().cameras.retain(|(g, _), _| *g != guest);
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
