//! [`V4l2Camera`]: a Video4Linux2 capture device as a camera (feature `v4l2`, Linux only).
//!
//! The device is opened with the `v4l` crate, set to YUYV (packed 4:2:2) or NV12 at the
//! requested size (the driver may pick a nearby size), and read with mmap streaming. Each
//! captured frame is brought to NV12 at the device's size ([`yuyv_to_nv12`] for YUYV) and then
//! converted and scaled into the destination with [`SwscaleIsp`].
//!
//! Not tested against real hardware: the machines this was written on have no `/dev/video*`.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use v4l::buffer::Type;
use v4l::capability::Flags;
use v4l::io::mmap::Stream;
use v4l::io::traits::CaptureStream;
use v4l::video::capture::Parameters;
use v4l::video::Capture;
use v4l::{Device, Format, FourCC};

use super::{check_capture_layout, stamp_timestamp, CameraSource, CaptureInfo};
use crate::error::{MediaError, Result};
use crate::frame::{FrameLayout, FrameMut, FrameRef, PixelFormat};
use crate::isp::{IspBackend, SwscaleIsp};

/// mmap buffers requested from the driver.
const BUFFER_COUNT: u32 = 4;
/// How long a capture waits for the driver before failing.
const CAPTURE_TIMEOUT: Duration = Duration::from_secs(2);

const YUYV: FourCC = FourCC { repr: *b"YUYV" };
const NV12: FourCC = FourCC { repr: *b"NV12" };

/// The capture format negotiated with the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CaptureFormat {
    /// Packed 4:2:2, `Y0 U Y1 V` per two pixels.
    Yuyv,
    /// Single-plane NV12 (UV plane right after `stride * height` luma bytes).
    Nv12,
}

/// A V4L2 capture device (`/dev/videoN`) used as a [`CameraSource`].
pub struct V4l2Camera {
    // Field order: the stream (mmap buffers, STREAMOFF) is dropped before the device.
    stream: Stream<'static>,
    _device: Device,
    path: PathBuf,
    name: String,
    capture_format: CaptureFormat,
    /// Device frame size and bytes per line, as set by the driver.
    device_width: u32,
    device_height: u32,
    device_stride: u32,
    /// NV12 frame at the device's size: YUYV is converted into it.
    scratch: Vec<u8>,
    isp: SwscaleIsp,
    layout: FrameLayout,
    interval: Duration,
    next_index: u64,
    stamp: bool,
}

impl std::fmt::Debug for V4l2Camera {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("V4l2Camera")
            .field("path", &self.path)
            .field("capture_format", &self.capture_format)
            .field(
                "device_size",
                &(self.device_width, self.device_height, self.device_stride),
            )
            .field("layout", &self.layout)
            .field("interval", &self.interval)
            .field("next_index", &self.next_index)
            .finish()
    }
}

fn device_error(path: &Path, what: &str, e: io::Error) -> MediaError {
    let reason = match e.kind() {
        io::ErrorKind::NotFound => format!("no such V4L2 device ({what}: {e})"),
        io::ErrorKind::PermissionDenied => format!("permission denied ({what}: {e})"),
        _ => format!("{what}: {e}"),
    };
    MediaError::File {
        path: path.to_path_buf(),
        reason,
    }
}

/// Checks that `dev` (at `device`) is a single-plane video capture device with streaming I/O.
fn check_caps(dev: &Device, device: &Path) -> Result<()> {
    let caps = dev
        .query_caps()
        .map_err(|e| device_error(device, "VIDIOC_QUERYCAP", e))?;
    if !caps.capabilities.contains(Flags::VIDEO_CAPTURE) {
        return Err(MediaError::Unsupported(format!(
            "{}: {} ({}) is not a single-plane video capture device",
            device.display(),
            caps.card,
            caps.driver
        )));
    }
    if !caps.capabilities.contains(Flags::STREAMING) {
        return Err(MediaError::Unsupported(format!(
            "{}: {} does not support streaming I/O",
            device.display(),
            caps.card
        )));
    }
    Ok(())
}

/// The capture format: NV12 when `dev` offers it, else YUYV.
fn choose_format(dev: &Device, device: &Path) -> Result<(FourCC, CaptureFormat)> {
    let offered: Vec<FourCC> = dev
        .enum_formats()
        .map_err(|e| device_error(device, "VIDIOC_ENUM_FMT", e))?
        .into_iter()
        .map(|d| d.fourcc)
        .collect();
    if offered.contains(&NV12) {
        Ok((NV12, CaptureFormat::Nv12))
    } else if offered.contains(&YUYV) {
        Ok((YUYV, CaptureFormat::Yuyv))
    } else {
        let names: Vec<String> = offered.iter().map(|f| f.to_string()).collect();
        Err(MediaError::Unsupported(format!(
            "{}: device offers neither YUYV nor NV12 (offers: {})",
            device.display(),
            names.join(", ")
        )))
    }
}

/// The interval between frames: `fps`'s, or the driver's rate when it chose another (or
/// refused to set one, said in the log).
fn frame_interval(dev: &Device, device: &Path, fps: u32) -> Duration {
    let mut interval = Duration::from_nanos(1_000_000_000 / fps as u64);
    match dev.set_params(&Parameters::with_fps(fps)) {
        Ok(p) if p.interval.numerator > 0 && p.interval.denominator > 0 => {
            interval = Duration::from_nanos(
                1_000_000_000 * p.interval.numerator as u64 / p.interval.denominator as u64,
            );
        }
        Ok(_) => {}
        Err(e) => log::warn!(
            "{}: cannot set {fps} fps ({e}); using the driver's rate",
            device.display()
        ),
    }
    interval
}

impl V4l2Camera {
    /// Opens the capture device at `device`, asks for `width x height` at `fps` in NV12 (if
    /// offered) or YUYV, and starts mmap streaming on the first capture. Frames come out as
    /// `out_format` at `width x height` (scaled if the driver chose another size).
    ///
    /// Errors: [`MediaError::File`] if the device cannot be opened or queried (missing,
    /// permissions) or streaming buffers cannot be set up; [`MediaError::Unsupported`] if it
    /// is not a streaming video capture device or offers neither YUYV nor NV12;
    /// [`MediaError::Frame`] for a bad size, [`MediaError::InvalidLayout`] for `fps` outside
    /// 1..=240.
    pub fn open(
        device: &Path,
        width: u32,
        height: u32,
        fps: u32,
        out_format: PixelFormat,
    ) -> Result<Self> {
        let layout = FrameLayout::packed(out_format, width, height)?;
        if !(1..=240).contains(&fps) {
            return Err(MediaError::InvalidLayout(format!(
                "fps {fps} outside 1..=240"
            )));
        }
        let dev = Device::with_path(device).map_err(|e| device_error(device, "open", e))?;
        check_caps(&dev, device)?;
        let (fourcc, capture_format) = choose_format(&dev, device)?;
        let got = dev
            .set_format(&Format::new(width, height, fourcc))
            .map_err(|e| device_error(device, "VIDIOC_S_FMT", e))?;
        if got.fourcc != fourcc {
            return Err(MediaError::Unsupported(format!(
                "{}: asked for {fourcc}, driver set {}",
                device.display(),
                got.fourcc
            )));
        }
        let (dw, dh) = (got.width, got.height);
        let min_stride = match capture_format {
            CaptureFormat::Yuyv => dw.checked_mul(2),
            CaptureFormat::Nv12 => Some(dw),
        };
        let stride = match min_stride {
            Some(m) if got.stride >= m && got.stride % 2 == 0 => got.stride,
            Some(m) if got.stride == 0 => m,
            _ => {
                return Err(MediaError::Unsupported(format!(
                    "{}: driver set {fourcc} {dw}x{dh} with unusable bytes per line {}",
                    device.display(),
                    got.stride
                )))
            }
        };
        // The NV12 intermediate needs even sizes; also validates against MAX_DIMENSION.
        let scratch_layout = FrameLayout::packed(PixelFormat::Nv12, dw, dh).map_err(|_| {
            MediaError::Unsupported(format!(
                "{}: driver set {fourcc} {dw}x{dh}, which is not an even size",
                device.display()
            ))
        })?;
        if (dw, dh) != (width, height) {
            log::info!(
                "{}: asked for {width}x{height}, driver set {dw}x{dh}; frames will be scaled",
                device.display()
            );
        }
        let interval = frame_interval(&dev, device, fps);
        let mut stream = Stream::with_buffers(&dev, Type::VideoCapture, BUFFER_COUNT)
            .map_err(|e| device_error(device, "mmap buffers (VIDIOC_REQBUFS)", e))?;
        stream.set_timeout(CAPTURE_TIMEOUT);
        let scratch = match capture_format {
            CaptureFormat::Yuyv => vec![0u8; scratch_layout.size()],
            CaptureFormat::Nv12 => Vec::new(),
        };
        Ok(V4l2Camera {
            stream,
            _device: dev,
            path: device.to_path_buf(),
            name: format!("v4l2:{}", device.display()),
            capture_format,
            device_width: dw,
            device_height: dh,
            device_stride: stride,
            scratch,
            isp: SwscaleIsp::new(),
            layout,
            interval,
            next_index: 0,
            stamp: false,
        })
    }

    /// Also encode each capture time into the frame's top strip (see
    /// [`super::timestamp`]), like [`super::FileCamera::set_stamp_timestamps`]. Off by
    /// default: it overwrites real image content.
    pub fn set_stamp_timestamps(&mut self, on: bool) {
        self.stamp = on;
    }

    /// The device's frame size `(width, height)` as set by the driver (before scaling).
    pub fn device_size(&self) -> (u32, u32) {
        (self.device_width, self.device_height)
    }
}

/// Converts a packed YUYV (4:2:2, `Y0 U Y1 V`) frame with rows `src_stride` bytes apart into
/// the NV12 frame `dst` of the same width and height. Chroma is vertically averaged over each
/// pair of rows (rounding half up).
pub fn yuyv_to_nv12(src: &[u8], src_stride: usize, mut dst: FrameMut<'_>) -> Result<()> {
    dst.validate()?;
    let l = dst.layout;
    if l.format != PixelFormat::Nv12 {
        return Err(MediaError::Unsupported(format!(
            "yuyv_to_nv12 writes NV12, destination is {:?}",
            l.format
        )));
    }
    let (w, h) = (l.width as usize, l.height as usize);
    if src_stride < 2 * w {
        return Err(MediaError::InvalidLayout(format!(
            "YUYV stride {src_stride} below {}",
            2 * w
        )));
    }
    let needed = src_stride * (h - 1) + 2 * w;
    if src.len() < needed {
        return Err(crate::frame::FrameError::BufferTooSmall {
            needed,
            got: src.len(),
        }
        .into());
    }
    let planes = l.planes();
    let (ys, uvs) = (planes[0].stride, planes[1].stride);
    let mut bufs = dst.planes_mut().into_iter();
    let (Some(luma), Some(uv)) = (bufs.next(), bufs.next()) else {
        return Err(MediaError::InvalidLayout("NV12 needs two planes".into()));
    };
    for y in 0..h {
        let s = &src[y * src_stride..y * src_stride + 2 * w];
        for (d, px) in luma[y * ys..y * ys + w].iter_mut().zip(s.chunks_exact(2)) {
            *d = px[0];
        }
    }
    for cy in 0..h / 2 {
        let r0 = &src[2 * cy * src_stride..2 * cy * src_stride + 2 * w];
        let r1 = &src[(2 * cy + 1) * src_stride..(2 * cy + 1) * src_stride + 2 * w];
        let out = &mut uv[cy * uvs..cy * uvs + w];
        for ((d, a), b) in out
            .chunks_exact_mut(2)
            .zip(r0.chunks_exact(4))
            .zip(r1.chunks_exact(4))
        {
            d[0] = (a[1] as u16 + b[1] as u16).div_ceil(2) as u8;
            d[1] = (a[3] as u16 + b[3] as u16).div_ceil(2) as u8;
        }
    }
    Ok(())
}

impl CameraSource for V4l2Camera {
    fn name(&self) -> &str {
        &self.name
    }

    fn layout(&self) -> FrameLayout {
        self.layout
    }

    fn frame_interval(&self) -> Duration {
        self.interval
    }

    fn capture(&mut self, mut dst: FrameMut<'_>, capture_time_ns: u64) -> Result<CaptureInfo> {
        check_capture_layout(&self.layout, &dst)?;
        let (dw, dh, stride) = (self.device_width, self.device_height, self.device_stride);
        let (buf, meta) = self
            .stream
            .next()
            .map_err(|e| device_error(&self.path, "capture (VIDIOC_DQBUF)", e))?;
        let used = (meta.bytesused as usize).min(buf.len());
        let data = &buf[..used];
        match self.capture_format {
            CaptureFormat::Yuyv => {
                let nv12 = FrameLayout::packed(PixelFormat::Nv12, dw, dh)?;
                yuyv_to_nv12(
                    data,
                    stride as usize,
                    FrameMut::new(nv12, &mut self.scratch)?,
                )?;
                self.isp
                    .convert(FrameRef::new(nv12, &self.scratch)?, dst.reborrow())?;
            }
            CaptureFormat::Nv12 => {
                let nv12 = FrameLayout::with_stride(PixelFormat::Nv12, dw, dh, stride)?;
                // FrameRef::new reports a short (truncated) buffer as BufferTooSmall.
                self.isp
                    .convert(FrameRef::new(nv12, data)?, dst.reborrow())?;
            }
        }
        if self.stamp {
            stamp_timestamp(dst, capture_time_ns)?;
        }
        let i = self.next_index;
        self.next_index += 1;
        Ok(CaptureInfo {
            frame_index: i,
            capture_time_ns,
            marker: None,
            source_pts: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_a_missing_device_is_an_error() {
        let path = Path::new("/dev/video-virtsoc-does-not-exist");
        let err = V4l2Camera::open(path, 64, 48, 30, PixelFormat::Nv12).unwrap_err();
        match &err {
            MediaError::File { path: p, reason } => {
                assert_eq!(p, path);
                assert!(reason.contains("no such V4L2 device"), "{reason}");
            }
            other => panic!("unexpected error {other:?}"),
        }
    }

    #[test]
    fn open_rejects_bad_parameters_before_touching_the_device() {
        let path = Path::new("/dev/video-virtsoc-does-not-exist");
        assert!(matches!(
            V4l2Camera::open(path, 64, 48, 0, PixelFormat::Nv12),
            Err(MediaError::InvalidLayout(_))
        ));
        assert!(matches!(
            V4l2Camera::open(path, 63, 48, 30, PixelFormat::Nv12),
            Err(MediaError::Frame(_))
        ));
    }

    #[test]
    fn yuyv_to_nv12_on_a_tiny_frame() {
        // 4x2 pixels, stride 10 (2 bytes padding per row).
        #[rustfmt::skip]
        let src = [
            10, 100, 11, 200, 12, 50, 13, 60, 0xEE, 0xEE,
            20, 101, 21, 203, 22, 51, 23, 70, 0xEE, 0xEE,
        ];
        // Destination stride 6 (2 bytes padding) to check strides on both sides.
        let layout = FrameLayout::with_stride(PixelFormat::Nv12, 4, 2, 6).unwrap();
        let mut out = vec![0xAAu8; layout.size()];
        yuyv_to_nv12(&src, 10, FrameMut::new(layout, &mut out).unwrap()).unwrap();
        assert_eq!(&out[0..4], &[10, 11, 12, 13]);
        assert_eq!(&out[6..10], &[20, 21, 22, 23]);
        // U = (100+101+1)/2 = 101, V = (200+203+1)/2 = 202, U = 51 (50.5 up), V = 65.
        assert_eq!(&out[12..16], &[101, 202, 51, 65]);
        // Padding untouched.
        assert_eq!(&out[4..6], &[0xAA, 0xAA]);
        assert_eq!(&out[16..18], &[0xAA, 0xAA]);
    }

    #[test]
    fn yuyv_to_nv12_rejects_short_input_and_wrong_format() {
        let layout = FrameLayout::packed(PixelFormat::Nv12, 4, 2).unwrap();
        let mut out = vec![0u8; layout.size()];
        let short = [0u8; 15];
        assert!(matches!(
            yuyv_to_nv12(&short, 8, FrameMut::new(layout, &mut out).unwrap()),
            Err(MediaError::Frame(
                crate::frame::FrameError::BufferTooSmall {
                    needed: 16,
                    got: 15
                }
            ))
        ));
        assert!(matches!(
            yuyv_to_nv12(&[0u8; 16], 6, FrameMut::new(layout, &mut out).unwrap()),
            Err(MediaError::InvalidLayout(_))
        ));
        let rgba = FrameLayout::packed(PixelFormat::Rgba8, 4, 2).unwrap();
        let mut out = vec![0u8; rgba.size()];
        assert!(matches!(
            yuyv_to_nv12(&[0u8; 16], 8, FrameMut::new(rgba, &mut out).unwrap()),
            Err(MediaError::Unsupported(_))
        ));
    }

    #[test]
    fn camera_is_send() {
        fn send<T: Send>() {}
        send::<V4l2Camera>();
    }
}
