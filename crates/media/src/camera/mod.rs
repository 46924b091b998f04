//! Camera sources: the [`CameraSource`] trait, a [`SyntheticCamera`] (moving test pattern
//! with the capture timestamp encoded in the pixels and a trackable bright square), and a
//! [`FileCamera`] that loops a video file. The pixel timestamp format lives in
//! [`timestamp`].
//!
//! A V4L2 source is behind the `v4l2` feature (`v4l2::V4l2Camera`); the machines this was built on have no
//! `/dev/video*`, so it is only compile- and unit-tested here.

mod file;
pub mod timestamp;
#[cfg(feature = "v4l2")]
pub mod v4l2;

use std::time::Duration;

pub use file::FileCamera;
pub use timestamp::{read_timestamp, read_timestamp_grid, read_timestamp_top, stamp_timestamp};
#[cfg(feature = "v4l2")]
pub use v4l2::V4l2Camera;

use crate::error::{MediaError, Result};
use crate::frame::{FrameLayout, FrameMut, FrameRef, PixelFormat};
use crate::sws::{ScaleFilter, Scaler};

/// What a capture produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureInfo {
    /// 0 for the first frame of the source, counting up (across file loops too).
    pub frame_index: u64,
    /// The capture time passed in (and, for sources that stamp, encoded in the pixels).
    pub capture_time_ns: u64,
    /// Centre of the synthetic camera's bright square, if the source has one.
    pub marker: Option<(u32, u32)>,
    /// Presentation timestamp of the source frame, for file sources (stream time base).
    pub source_pts: Option<i64>,
}

/// A source of camera frames written into caller-provided buffers.
pub trait CameraSource: Send {
    /// Short name for logs.
    fn name(&self) -> &str;
    /// Format and size of the frames (the destination stride may differ).
    fn layout(&self) -> FrameLayout;
    /// Nominal time between frames.
    fn frame_interval(&self) -> Duration;
    /// Writes the next frame into `dst`, whose format, width and height must equal
    /// [`CameraSource::layout`]'s.
    fn capture(&mut self, dst: FrameMut<'_>, capture_time_ns: u64) -> Result<CaptureInfo>;
}

pub(crate) fn check_capture_layout(want: &FrameLayout, dst: &FrameMut<'_>) -> Result<()> {
    dst.validate()?;
    let d = &dst.layout;
    if (d.format, d.width, d.height) != (want.format, want.width, want.height) {
        return Err(MediaError::InvalidLayout(format!(
            "camera produces {:?} {}x{}, destination is {d:?}",
            want.format, want.width, want.height
        )));
    }
    Ok(())
}

/// A synthetic camera: a diagonal luma ramp that scrolls every frame over a colour
/// gradient, a white square moving along a Lissajous path ([`SyntheticCamera::marker_position`]),
/// and the capture timestamp in the top strip (see [`timestamp`]).
pub struct SyntheticCamera {
    layout: FrameLayout,
    fps: u32,
    next_index: u64,
    /// For RGB output: the YUV420P drawing buffer and its converter, made on first use.
    rgb: Option<(Vec<u8>, Scaler)>,
}

impl std::fmt::Debug for SyntheticCamera {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyntheticCamera")
            .field("layout", &self.layout)
            .field("fps", &self.fps)
            .field("next_index", &self.next_index)
            .finish()
    }
}

impl SyntheticCamera {
    /// A camera of `width x height` (at least 40x32; 160x128 or more keeps the timestamp
    /// readable after a 2x downscale) at `fps` frames per second (1..=240) producing `format`.
    pub fn new(width: u32, height: u32, fps: u32, format: PixelFormat) -> Result<Self> {
        let layout = FrameLayout::packed(format, width, height)?;
        if width < timestamp::MIN_SIZE.0 || height < timestamp::MIN_SIZE.1 {
            return Err(MediaError::InvalidLayout(format!(
                "synthetic camera needs at least {}x{}, got {width}x{height}",
                timestamp::MIN_SIZE.0,
                timestamp::MIN_SIZE.1
            )));
        }
        if !(1..=240).contains(&fps) {
            return Err(MediaError::InvalidLayout(format!(
                "fps {fps} outside 1..=240"
            )));
        }
        Ok(SyntheticCamera {
            layout,
            fps,
            next_index: 0,
            rgb: None,
        })
    }

    /// Side of the bright square in pixels (an eighth of the smaller dimension, at least 4).
    pub fn marker_size(&self) -> u32 {
        (self.layout.width.min(self.layout.height) / 8).max(4)
    }

    /// Centre (x, y) of the bright square in frame `frame_index`. The square moves on a
    /// Lissajous path (x period 90 frames, y period 60 frames) below the timestamp strip.
    pub fn marker_position(&self, frame_index: u64) -> (u32, u32) {
        let s = self.marker_size() as f64;
        let (w, h) = (self.layout.width as f64, self.layout.height as f64);
        let top = timestamp::strip_height(self.layout.height) as f64;
        let (x_lo, x_hi) = (s / 2.0, w - s / 2.0);
        let (y_lo, y_hi) = (top + s / 2.0, (h - s / 2.0).max(top + s / 2.0));
        let t = (frame_index % 180) as f64;
        let tau = std::f64::consts::TAU;
        let fx = 0.5 + 0.5 * (tau * t / 90.0).sin();
        let fy = 0.5 + 0.5 * (tau * t / 60.0).cos();
        (
            (x_lo + fx * (x_hi - x_lo)).round() as u32,
            (y_lo + fy * (y_hi - y_lo)).round() as u32,
        )
    }

    /// Index of the frame the next capture produces.
    pub fn next_frame_index(&self) -> u64 {
        self.next_index
    }

    /// The square's pixel rectangle (x0, y0, x1, y1), end-exclusive, in frame `i`.
    fn square(&self, i: u64) -> (usize, usize, usize, usize) {
        let (cx, cy) = self.marker_position(i);
        let half = self.marker_size() / 2;
        let (w, h) = (self.layout.width, self.layout.height);
        (
            cx.saturating_sub(half) as usize,
            cy.saturating_sub(half) as usize,
            (cx + half).min(w) as usize,
            (cy + half).min(h) as usize,
        )
    }

    /// Draws frame `i` as YUV 4:2:0 into a luma plane and a chroma writer.
    ///
    /// Luma: a triangle wave 32..224 along x + y that scrolls 4 steps per frame; rows repeat
    /// every 192 lines, so only the first 192 are computed. Chroma: U rises with x, V falls
    /// with y. The square is white with neutral chroma.
    fn render_yuv(&self, luma: &mut [u8], luma_stride: usize, chroma: ChromaPlanes<'_>, i: u64) {
        let (w, h) = (self.layout.width as usize, self.layout.height as usize);
        const PERIOD: usize = 384;
        const REPEAT_ROWS: usize = 192;
        for y in 0..h {
            let o = y * luma_stride;
            if y >= REPEAT_ROWS {
                let src = (y - REPEAT_ROWS) * luma_stride;
                luma.copy_within(src..src + w, o);
                continue;
            }
            let mut r = ((2 * y) as u64 + 4 * i) as usize % PERIOD;
            for px in &mut luma[o..o + w] {
                *px = 32 + if r < 192 { r } else { 383 - r } as u8;
                r += 3;
                if r >= PERIOD {
                    r -= PERIOD;
                }
            }
        }
        let (x0, y0, x1, y1) = self.square(i);
        for y in y0..y1 {
            luma[y * luma_stride + x0..y * luma_stride + x1].fill(235);
        }
        let (cw, ch) = (w / 2, h / 2);
        let u_of = |cx: usize| (80 + 2 * cx * 96 / w) as u8;
        let v_of = |cy: usize| (176 - 2 * cy * 96 / h) as u8;
        // Chroma block (cx, cy) is neutral when its top-left luma pixel is in the square.
        let in_sq_x = |cx: usize| (x0..x1).contains(&(2 * cx));
        let in_sq_y = |cy: usize| (y0..y1).contains(&(2 * cy));
        match chroma {
            ChromaPlanes::Interleaved(uv, stride) => {
                let mut line = vec![0u8; 2 * cw];
                for (cx, pair) in line.chunks_exact_mut(2).enumerate() {
                    pair[0] = u_of(cx);
                }
                for cy in 0..ch {
                    let v = v_of(cy);
                    for pair in line.chunks_exact_mut(2) {
                        pair[1] = v;
                    }
                    let row = &mut uv[cy * stride..cy * stride + 2 * cw];
                    row.copy_from_slice(&line);
                    if in_sq_y(cy) {
                        for (cx, pair) in row.chunks_exact_mut(2).enumerate() {
                            if in_sq_x(cx) {
                                pair.copy_from_slice(&[128, 128]);
                            }
                        }
                    }
                }
            }
            ChromaPlanes::Planar(u, v, stride) => {
                let line: Vec<u8> = (0..cw).map(u_of).collect();
                for cy in 0..ch {
                    let (urow, vrow) = (
                        &mut u[cy * stride..cy * stride + cw],
                        &mut v[cy * stride..cy * stride + cw],
                    );
                    urow.copy_from_slice(&line);
                    vrow.fill(v_of(cy));
                    if in_sq_y(cy) {
                        for cx in (0..cw).filter(|&cx| in_sq_x(cx)) {
                            urow[cx] = 128;
                            vrow[cx] = 128;
                        }
                    }
                }
            }
        }
    }

    fn render(&mut self, dst: &mut FrameMut<'_>, i: u64) -> Result<()> {
        let l = dst.layout;
        match l.format {
            PixelFormat::Nv12 | PixelFormat::Yuv420p => {
                let planes = l.planes();
                let nv12 = l.format == PixelFormat::Nv12;
                let mut bufs = dst.planes_mut().into_iter();
                let luma = bufs.next().unwrap_or_default();
                let chroma = if nv12 {
                    ChromaPlanes::Interleaved(bufs.next().unwrap_or_default(), planes[1].stride)
                } else {
                    let u = bufs.next().unwrap_or_default();
                    let v = bufs.next().unwrap_or_default();
                    ChromaPlanes::Planar(u, v, planes[1].stride)
                };
                self.render_yuv(luma, planes[0].stride, chroma, i);
            }
            PixelFormat::Rgba8 | PixelFormat::Bgra8 => {
                // Draw in YUV420P and let swscale's fast path convert (BT.601 limited range),
                // several times faster than per-pixel conversion.
                let yl = FrameLayout::packed(PixelFormat::Yuv420p, l.width, l.height)?;
                let (mut buf, mut scaler) = match self.rgb.take() {
                    Some(cached) => cached,
                    None => (
                        vec![0u8; yl.size()],
                        Scaler::for_layouts(yl, l, ScaleFilter::Bilinear)?,
                    ),
                };
                {
                    let planes = yl.planes();
                    let (luma, rest) = buf.split_at_mut(planes[1].offset);
                    let (u, v) = rest.split_at_mut(planes[2].offset - planes[1].offset);
                    self.render_yuv(
                        luma,
                        planes[0].stride,
                        ChromaPlanes::Planar(u, v, planes[1].stride),
                        i,
                    );
                }
                let r = FrameRef::new(yl, &buf)
                    .map_err(MediaError::from)
                    .and_then(|src| scaler.scale(src, dst.reborrow()));
                self.rgb = Some((buf, scaler));
                r?;
            }
        }
        Ok(())
    }
}

/// Where [`SyntheticCamera::render_yuv`] writes chroma.
enum ChromaPlanes<'a> {
    /// NV12 UV plane and its stride.
    Interleaved(&'a mut [u8], usize),
    /// YUV420P U and V planes and their stride.
    Planar(&'a mut [u8], &'a mut [u8], usize),
}

impl CameraSource for SyntheticCamera {
    fn name(&self) -> &str {
        "synthetic"
    }

    fn layout(&self) -> FrameLayout {
        self.layout
    }

    fn frame_interval(&self) -> Duration {
        Duration::from_nanos(1_000_000_000 / self.fps as u64)
    }

    fn capture(&mut self, mut dst: FrameMut<'_>, capture_time_ns: u64) -> Result<CaptureInfo> {
        check_capture_layout(&self.layout, &dst)?;
        let i = self.next_index;
        self.render(&mut dst, i)?;
        stamp_timestamp(dst, capture_time_ns)?;
        self.next_index += 1;
        Ok(CaptureInfo {
            frame_index: i,
            capture_time_ns,
            marker: Some(self.marker_position(i)),
            source_pts: None,
        })
    }
}
