//! [`FileCamera`]: a video file played in a loop as a camera.

use std::collections::VecDeque;
use std::path::Path;
use std::time::Duration;

use super::{check_capture_layout, stamp_timestamp, CameraSource, CaptureInfo};
use crate::codec::{DecodedFrame, DecoderBackend, Demuxer, FfmpegDecoder};
use crate::error::{MediaError, Result};
use crate::frame::{FrameLayout, FrameMut, PixelFormat};
use crate::isp::{IspBackend, SwscaleIsp};

/// Plays the best video stream of a file as a camera, starting over at the end. Frames are
/// decoded on the capturing thread (one decoder thread, so a capture costs one frame's decode
/// and does not add frame-threading delay) and converted to the requested format with
/// swscale. Optionally stamps the capture time into the pixels like the synthetic camera.
pub struct FileCamera {
    demux: Demuxer,
    decoder: FfmpegDecoder,
    isp: SwscaleIsp,
    layout: FrameLayout,
    interval: Duration,
    queue: VecDeque<DecodedFrame>,
    eof: bool,
    frames_since_rewind: u64,
    next_index: u64,
    loops: u64,
    decode_errors: u64,
    stamp: bool,
    name: String,
}

impl FileCamera {
    /// Opens `path` and decodes its first frame (so a file that does not decode fails here).
    /// Frames come out as `out_format` at the stream's size (cropped to even for YUV).
    pub fn open(path: impl AsRef<Path>, out_format: PixelFormat) -> Result<Self> {
        let demux = Demuxer::open(path.as_ref())?;
        let decoder = demux.decoder(PixelFormat::Yuv420p, 1)?;
        let interval = demux
            .info()
            .fps()
            .filter(|f| *f > 0.0 && *f <= 1000.0)
            .map(|f| Duration::from_secs_f64(1.0 / f))
            .unwrap_or(Duration::from_nanos(33_333_333));
        let name = format!("file:{}", path.as_ref().display());
        let mut cam = FileCamera {
            demux,
            decoder,
            isp: SwscaleIsp::new(),
            // Placeholder until the first frame tells the real size.
            layout: FrameLayout::packed(out_format, 2, 2)?,
            interval,
            queue: VecDeque::new(),
            eof: false,
            frames_since_rewind: 0,
            next_index: 0,
            loops: 0,
            decode_errors: 0,
            stamp: false,
            name,
        };
        let first = cam.next_decoded()?;
        let (w, h) = (first.layout.width, first.layout.height);
        cam.layout = FrameLayout::packed(out_format, w, h)?;
        cam.queue.push_front(first);
        Ok(cam)
    }

    /// Also encode each capture time into the frame's top strip (see
    /// [`super::timestamp`]).
    pub fn set_stamp_timestamps(&mut self, on: bool) {
        self.stamp = on;
    }

    /// How many times the file has been started over.
    pub fn loops(&self) -> u64 {
        self.loops
    }

    /// Packets the decoder rejected so far (they are skipped).
    pub fn decode_errors(&self) -> u64 {
        self.decode_errors
    }

    fn next_decoded(&mut self) -> Result<DecodedFrame> {
        loop {
            if let Some(f) = self.queue.pop_front() {
                self.frames_since_rewind += 1;
                return Ok(f);
            }
            if self.eof {
                if self.frames_since_rewind == 0 {
                    return Err(MediaError::NoFrames(format!(
                        "{} decodes to no frames",
                        self.demux.path().display()
                    )));
                }
                self.demux.rewind()?;
                self.eof = false;
                self.frames_since_rewind = 0;
                self.loops += 1;
                continue;
            }
            match self.demux.read_packet() {
                Ok(Some(p)) => match self.decoder.decode(&p.data, p.pts) {
                    Ok(frames) => self.queue.extend(frames),
                    Err(MediaError::Decode(e)) => {
                        self.decode_errors += 1;
                        log::debug!("{}: skipping packet: {e}", self.name);
                    }
                    Err(e) => return Err(e),
                },
                Ok(None) | Err(MediaError::File { .. }) => {
                    self.eof = true;
                    match self.decoder.flush() {
                        Ok(frames) => self.queue.extend(frames),
                        Err(e) => {
                            self.decode_errors += 1;
                            log::debug!("{}: flush: {e}", self.name);
                        }
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl CameraSource for FileCamera {
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
        let f = self.next_decoded()?;
        self.isp.convert(f.as_frame(), dst.reborrow())?;
        if self.stamp {
            stamp_timestamp(dst, capture_time_ns)?;
        }
        let i = self.next_index;
        self.next_index += 1;
        Ok(CaptureInfo {
            frame_index: i,
            capture_time_ns,
            marker: None,
            source_pts: Some(f.pts),
        })
    }
}
