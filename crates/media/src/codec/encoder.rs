//! libavcodec-backed H.264 [`FfmpegEncoder`], and [`EncoderBackend`], what an encoder in
//! this process and one in a worker process ([`ProcessEncoder`](super::ProcessEncoder))
//! both are.

use ff::ffi;
use ffmpeg_next as ff;

use crate::error::{MediaError, Result};
use crate::frame::{FrameRef, PixelFormat};

/// One encoded access unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedPacket {
    /// Annex-B byte stream (start codes); keyframes carry SPS and PPS in band.
    pub data: Vec<u8>,
    /// Presentation timestamp in units of 1/fps (the `pts` passed to `encode`).
    pub pts: i64,
    /// Decoding timestamp in the same units.
    pub dts: i64,
    /// True for IDR pictures.
    pub keyframe: bool,
}

/// An H.264 encoder: [`FfmpegEncoder`] in this process, or
/// [`ProcessEncoder`](super::ProcessEncoder) in a sandboxed worker.
pub trait EncoderBackend: Send {
    /// The FFmpeg encoder in use (e.g. `libx264`).
    fn name(&self) -> &str;
    /// Encodes one frame (NV12 or YUV420P of the configured size) with presentation time
    /// `pts` in units of 1/fps; returns the packets that became ready.
    fn encode(&mut self, frame: FrameRef<'_>, pts: i64) -> Result<Vec<EncodedPacket>>;
    /// Ends the stream and returns the remaining packets; the encoder cannot be used after.
    fn flush(&mut self) -> Result<Vec<EncodedPacket>>;
    /// Starts encoding `frame` as [`encode`](Self::encode) does, without waiting for its
    /// packets (an encoder in another process takes the frame and returns): `Ok(true)` when
    /// started, then [`finish`](Self::finish) gives the packets; `Ok(false)` when this
    /// encoder cannot (call `encode`).
    fn start(&mut self, _frame: FrameRef<'_>, _pts: i64) -> Result<bool> {
        Ok(false)
    }
    /// Whether a frame [`start`](Self::start) began is waiting for its packets.
    fn started(&self) -> bool {
        false
    }
    /// The packets of the frame [`start`](Self::start) began, waiting for them (within the
    /// encoder's deadline); nothing when no frame was started.
    fn finish(&mut self) -> Result<Vec<EncodedPacket>> {
        Ok(Vec::new())
    }
    /// A descriptor that becomes readable when the started frame's packets begin to arrive
    /// (or the encoder's process ends); `None` when nothing is started or the encoder runs
    /// in this process.
    fn answers_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
}

impl EncoderBackend for FfmpegEncoder {
    fn name(&self) -> &str {
        FfmpegEncoder::name(self)
    }
    fn encode(&mut self, frame: FrameRef<'_>, pts: i64) -> Result<Vec<EncodedPacket>> {
        FfmpegEncoder::encode(self, frame, pts)
    }
    fn flush(&mut self) -> Result<Vec<EncodedPacket>> {
        FfmpegEncoder::flush(self)
    }
}

/// Checks that `frame` is a valid NV12 or YUV420P frame of `width x height`.
pub(crate) fn check_frame(frame: &FrameRef<'_>, width: u32, height: u32) -> Result<()> {
    frame.validate()?;
    let l = frame.layout;
    if !l.format.is_yuv() || l.width != width || l.height != height {
        return Err(MediaError::InvalidLayout(format!(
            "encoder takes NV12/YUV420P {width}x{height}, got {l:?}"
        )));
    }
    Ok(())
}

/// H.264 encoders tried in order: software x264 first, then hardware wrappers.
const H264_ENCODERS: [&str; 7] = [
    "libx264",
    "libopenh264",
    "h264_v4l2m2m",
    "h264_nvenc",
    "h264_qsv",
    "h264_vaapi",
    "h264_omx",
];

/// How hard libx264 works on each frame (its `preset`): a faster preset spends less CPU time
/// and latency per frame for more bits at the same quality. Hardware encoders ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EncoderPreset {
    /// x264 `ultrafast`.
    Ultrafast,
    /// x264 `superfast`.
    Superfast,
    /// x264 `veryfast`.
    #[default]
    Veryfast,
    /// x264 `faster`.
    Faster,
    /// x264 `medium`.
    Medium,
}

impl EncoderPreset {
    /// Every preset, fastest first.
    pub const ALL: [EncoderPreset; 5] = [
        EncoderPreset::Ultrafast,
        EncoderPreset::Superfast,
        EncoderPreset::Veryfast,
        EncoderPreset::Faster,
        EncoderPreset::Medium,
    ];

    /// The preset named `name` (an x264 preset name of [`ALL`](Self::ALL)).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The x264 preset's name.
    pub fn name(self) -> &'static str {
        match self {
            EncoderPreset::Ultrafast => "ultrafast",
            EncoderPreset::Superfast => "superfast",
            EncoderPreset::Veryfast => "veryfast",
            EncoderPreset::Faster => "faster",
            EncoderPreset::Medium => "medium",
        }
    }
}

/// An H.264 encoder taking NV12 or YUV420P frames of a fixed size and producing Annex-B
/// packets. With libx264 it runs an [`EncoderPreset`] (`veryfast` unless told) with tune
/// `zerolatency` (no B-frames, no lookahead: one packet out per frame in, pts == dts), a
/// keyframe every 2 seconds.
pub struct FfmpegEncoder {
    encoder: ff::encoder::video::Encoder,
    frame: ff::frame::Video,
    width: u32,
    height: u32,
    name: String,
}

fn is_again(e: &ff::Error) -> bool {
    matches!(e, ff::Error::Other { errno } if *errno == ff::error::EAGAIN)
}

impl FfmpegEncoder {
    /// An H.264 encoder for `width x height` (even, at least 16x16) frames at `fps` frames
    /// per second and `bitrate` bits per second.
    pub fn new_h264(width: u32, height: u32, fps: u32, bitrate: u64) -> Result<Self> {
        Self::new_h264_with(width, height, fps, bitrate, EncoderPreset::default())
    }

    /// [`new_h264`](Self::new_h264) with libx264 running `preset`.
    pub fn new_h264_with(
        width: u32,
        height: u32,
        fps: u32,
        bitrate: u64,
        preset: EncoderPreset,
    ) -> Result<Self> {
        crate::frame::FrameLayout::packed(PixelFormat::Yuv420p, width, height)?;
        if width < 16 || height < 16 {
            return Err(MediaError::InvalidLayout(format!(
                "H.264 encoder needs at least 16x16, got {width}x{height}"
            )));
        }
        if fps == 0 || fps > 1000 || bitrate == 0 {
            return Err(MediaError::Encode(format!(
                "bad rate: {fps} fps, {bitrate} bit/s"
            )));
        }
        super::init_ffmpeg();
        let mut tried = Vec::new();
        for name in H264_ENCODERS {
            let Some(codec) = ff::encoder::find_by_name(name) else {
                continue;
            };
            match Self::open(codec, width, height, fps, bitrate, preset) {
                Ok(enc) => return Ok(enc),
                Err(e) => {
                    log::debug!("H.264 encoder {name} failed to open: {e}");
                    tried.push(format!("{name}: {e}"));
                }
            }
        }
        Err(MediaError::Unsupported(if tried.is_empty() {
            "this FFmpeg build has no H.264 encoder (libx264 or a hardware one)".into()
        } else {
            format!("no H.264 encoder could be opened ({})", tried.join("; "))
        }))
    }

    fn open(
        codec: ff::Codec,
        width: u32,
        height: u32,
        fps: u32,
        bitrate: u64,
        preset: EncoderPreset,
    ) -> Result<Self> {
        let ctx = ff::codec::Context::new_with_codec(codec);
        let mut enc = ctx
            .encoder()
            .video()
            .map_err(|e| MediaError::ffmpeg("encoder context", e))?;
        enc.set_width(width);
        enc.set_height(height);
        enc.set_format(ff::format::Pixel::YUV420P);
        enc.set_time_base(ff::Rational::new(1, fps as i32));
        enc.set_frame_rate(Some(ff::Rational::new(fps as i32, 1)));
        enc.set_bit_rate(usize::try_from(bitrate).unwrap_or(usize::MAX));
        enc.set_gop(fps * 2);
        enc.set_max_b_frames(0);
        let mut opts = ff::Dictionary::new();
        if codec.name() == "libx264" {
            opts.set("preset", preset.name());
            opts.set("tune", "zerolatency");
        }
        let encoder = enc
            .open_as_with(codec, opts)
            .map_err(|e| MediaError::ffmpeg("avcodec_open2 (encoder)", e))?;
        Ok(FfmpegEncoder {
            encoder,
            frame: ff::frame::Video::new(ff::format::Pixel::YUV420P, width, height),
            width,
            height,
            name: codec.name().to_string(),
        })
    }

    /// The FFmpeg encoder in use (e.g. `libx264`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bitstream framing of the packets.
    pub fn bitstream_format(&self) -> &'static str {
        "annex-b"
    }

    /// Encodes one frame (NV12 or YUV420P of the configured size) with presentation time
    /// `pts` in units of 1/fps; returns the packets that became ready.
    pub fn encode(&mut self, frame: FrameRef<'_>, pts: i64) -> Result<Vec<EncodedPacket>> {
        check_frame(&frame, self.width, self.height)?;
        let l = frame.layout;
        // SAFETY: the encoder may still hold a reference to the previous frame's buffers;
        // make them ours before writing.
        let r = unsafe { ffi::av_frame_make_writable(self.frame.as_mut_ptr()) };
        if r < 0 {
            return Err(MediaError::ffmpeg(
                "av_frame_make_writable",
                ff::Error::from(r),
            ));
        }
        let (w, h) = (l.width as usize, l.height as usize);
        let planes = l.planes();
        let yp = planes[0];
        let ys = self.frame.stride(0);
        {
            let dst = self.frame.data_mut(0);
            for row in 0..h {
                let s = yp.offset + row * yp.stride;
                dst[row * ys..row * ys + w].copy_from_slice(&frame.data[s..s + w]);
            }
        }
        let (us, vs) = (self.frame.stride(1), self.frame.stride(2));
        for row in 0..h / 2 {
            match l.format {
                PixelFormat::Nv12 => {
                    let p = planes[1];
                    let src = &frame.data[p.offset + row * p.stride..][..w];
                    // De-interleave straight into the two chroma rows.
                    let u = &mut self.frame.data_mut(1)[row * us..][..w / 2];
                    for (d, s) in u.iter_mut().zip(src.chunks_exact(2)) {
                        *d = s[0];
                    }
                    let v = &mut self.frame.data_mut(2)[row * vs..][..w / 2];
                    for (d, s) in v.iter_mut().zip(src.chunks_exact(2)) {
                        *d = s[1];
                    }
                }
                _ => {
                    let (pu, pv) = (planes[1], planes[2]);
                    let u = &frame.data[pu.offset + row * pu.stride..][..w / 2];
                    let v = &frame.data[pv.offset + row * pv.stride..][..w / 2];
                    self.frame.data_mut(1)[row * us..row * us + w / 2].copy_from_slice(u);
                    self.frame.data_mut(2)[row * vs..row * vs + w / 2].copy_from_slice(v);
                }
            }
        }
        self.frame.set_pts(Some(pts));
        let mut out = Vec::new();
        let mut sent = self.encoder.send_frame(&self.frame);
        if matches!(&sent, Err(e) if is_again(e)) {
            self.drain(&mut out)?;
            sent = self.encoder.send_frame(&self.frame);
        }
        sent.map_err(|e| MediaError::Encode(format!("{}: {e}", self.name)))?;
        self.drain(&mut out)?;
        Ok(out)
    }

    /// Ends the stream and returns the remaining packets; the encoder cannot be used after.
    pub fn flush(&mut self) -> Result<Vec<EncodedPacket>> {
        let mut out = Vec::new();
        match self.encoder.send_eof() {
            Ok(()) | Err(ff::Error::Eof) => {}
            Err(e) => return Err(MediaError::Encode(format!("{}: {e}", self.name))),
        }
        self.drain(&mut out)?;
        Ok(out)
    }

    fn drain(&mut self, out: &mut Vec<EncodedPacket>) -> Result<()> {
        loop {
            let mut pkt = ff::Packet::empty();
            match self.encoder.receive_packet(&mut pkt) {
                Ok(()) => {
                    let pts = pkt.pts().unwrap_or(0);
                    out.push(EncodedPacket {
                        data: pkt.data().map(<[u8]>::to_vec).unwrap_or_default(),
                        pts,
                        dts: pkt.dts().unwrap_or(pts),
                        keyframe: pkt.is_key(),
                    });
                }
                Err(ff::Error::Eof) => return Ok(()),
                Err(e) if is_again(&e) => return Ok(()),
                Err(e) => return Err(MediaError::Encode(format!("{}: {e}", self.name))),
            }
        }
    }
}
