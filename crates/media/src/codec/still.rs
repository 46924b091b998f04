//! Encoders for watching and keeping what a display shows: [`JpegEncoder`] (one RGBA frame in,
//! one JPEG out, scaled down to fit a box; libavcodec's MJPEG encoder) for the live view, and
//! [`Mp4Recorder`] (RGBA frames in, H.264 in an MP4 file out; libx264 and libavformat) for
//! recordings.
//!
//! Input pixels are copied into frames FFmpeg allocated (aligned as libswscale wants) before
//! they are scaled, so no caller's buffer alignment ever reaches the C libraries.

use std::path::{Path, PathBuf};

use ffmpeg_next as ff;

use crate::error::{MediaError, Result};

/// The largest picture either encoder takes (the decoders' limit too).
pub const MAX_PIXELS: u64 = 4096 * 2304;

/// The even size at most `max_w` x `max_h` (and at most the source's) that keeps `w` x `h`'s
/// aspect ratio; at least 16 x 16.
pub fn fit_within(w: u32, h: u32, max_w: u32, max_h: u32) -> (u32, u32) {
    let (w, h) = (w.max(1) as u64, h.max(1) as u64);
    let (mw, mh) = (
        max_w.max(16).min(w as u32) as u64,
        max_h.max(16).min(h as u32) as u64,
    );
    // The largest scale s <= 1 with w*s <= mw and h*s <= mh.
    let (nw, nh) = if mw * h <= mh * w {
        (mw, (h * mw / w).max(1))
    } else {
        ((w * mh / h).max(1), mh)
    };
    let even = |v: u64| ((v as u32) & !1).max(16);
    (even(nw), even(nh))
}

fn check_source(w: u32, h: u32, rgba: Option<&[u8]>) -> Result<()> {
    if w < 2 || h < 2 || w as u64 * h as u64 > MAX_PIXELS {
        return Err(MediaError::InvalidLayout(format!(
            "picture {w}x{h}: 2x2 to {MAX_PIXELS} pixels"
        )));
    }
    if let Some(px) = rgba {
        let needed = w as usize * h as usize * 4;
        if px.len() != needed {
            return Err(crate::frame::FrameError::BufferTooSmall {
                needed,
                got: px.len(),
            }
            .into());
        }
    }
    Ok(())
}

/// Tightly packed RGBA frames of one size in, scaled frames of another format out.
struct RgbaScaler {
    sws: ff::software::scaling::Context,
    src: ff::frame::Video,
    dst: ff::frame::Video,
    width: u32,
    height: u32,
}

impl RgbaScaler {
    fn new(w: u32, h: u32, format: ff::format::Pixel, dw: u32, dh: u32) -> Result<Self> {
        check_source(w, h, None)?;
        let sws = ff::software::scaling::Context::get(
            ff::format::Pixel::RGBA,
            w,
            h,
            format,
            dw,
            dh,
            ff::software::scaling::Flags::BILINEAR,
        )
        .map_err(|e| MediaError::ffmpeg("sws_getContext", e))?;
        Ok(RgbaScaler {
            sws,
            src: ff::frame::Video::new(ff::format::Pixel::RGBA, w, h),
            dst: ff::frame::Video::new(format, dw, dh),
            width: w,
            height: h,
        })
    }

    /// Scales `rgba` (exactly width x height x 4 bytes) into the output frame.
    fn run(&mut self, rgba: &[u8]) -> Result<&mut ff::frame::Video> {
        check_source(self.width, self.height, Some(rgba))?;
        let row = self.width as usize * 4;
        let stride = self.src.stride(0);
        let data = self.src.data_mut(0);
        for (y, line) in rgba.chunks_exact(row).enumerate() {
            data[y * stride..y * stride + row].copy_from_slice(line);
        }
        self.sws
            .run(&self.src, &mut self.dst)
            .map_err(|e| MediaError::ffmpeg("sws_scale", e))?;
        Ok(&mut self.dst)
    }
}

/// One full-range YUV 4:2:0 picture in, one JPEG of the same size out (libavcodec's MJPEG
/// encoder): what the live view encodes its pictures with, no conversion or scaling. A
/// picture equal to the last one given gets the last JPEG again, not encoded anew (a guest
/// that presents the same screen over and over).
pub struct YuvJpegEncoder {
    /// The encoder's input frame (FFmpeg-allocated, aligned): the last picture given.
    picture: ff::frame::Video,
    /// The JPEG of `picture`, when it came through [`YuvJpegEncoder::encode`].
    last: Option<Vec<u8>>,
    /// Pictures encoded (not answered with the last JPEG).
    encoded: u64,
    encoder: ff::encoder::video::Encoder,
    /// MJPEG quantizer scale (2 best .. 31 worst), as FFmpeg's lambda.
    lambda: i32,
    size: (u32, u32),
    pts: i64,
}

impl YuvJpegEncoder {
    /// An encoder of `width` x `height` pictures (even sizes) at quantizer `q` (2 best .. 31
    /// worst; 5 is good for viewing).
    pub fn new(width: u32, height: u32, q: u8) -> Result<Self> {
        check_source(width, height, None)?;
        if width % 2 != 0 || height % 2 != 0 {
            return Err(MediaError::InvalidLayout(format!(
                "YUV 4:2:0 picture {width}x{height}: sizes must be even"
            )));
        }
        super::init_ffmpeg();
        let codec = ff::encoder::find(ff::codec::Id::MJPEG)
            .ok_or_else(|| MediaError::Unsupported("this FFmpeg has no MJPEG encoder".into()))?;
        let mut enc = ff::codec::Context::new_with_codec(codec)
            .encoder()
            .video()
            .map_err(|e| MediaError::ffmpeg("encoder context", e))?;
        enc.set_width(width);
        enc.set_height(height);
        enc.set_format(ff::format::Pixel::YUVJ420P);
        enc.set_time_base(ff::Rational::new(1, 30));
        let lambda = i32::from(q.clamp(2, 31)) * ff::ffi::FF_QP2LAMBDA;
        enc.set_flags(ff::codec::Flags::QSCALE);
        enc.set_global_quality(lambda);
        // One pass with the standard Huffman tables: a little larger, noticeably cheaper.
        let mut opts = ff::Dictionary::new();
        opts.set("huffman", "default");
        let encoder = enc
            .open_as_with(codec, opts)
            .map_err(|e| MediaError::ffmpeg("avcodec_open2 (mjpeg)", e))?;
        Ok(YuvJpegEncoder {
            picture: ff::frame::Video::new(ff::format::Pixel::YUVJ420P, width, height),
            encoder,
            lambda,
            size: (width, height),
            pts: 0,
            last: None,
            encoded: 0,
        })
    }

    /// The size of the pictures and JPEGs.
    pub fn size(&self) -> (u32, u32) {
        self.size
    }

    /// Pictures encoded so far (pictures answered with the last JPEG not counted).
    pub fn encoded(&self) -> u64 {
        self.encoded
    }

    /// Encodes a picture of the encoder's size: Y, then U, then V, each tightly packed.
    pub fn encode(&mut self, yuv: &[u8]) -> Result<Vec<u8>> {
        let (w, h) = (self.size.0 as usize, self.size.1 as usize);
        let needed = w * h * 3 / 2;
        if yuv.len() != needed {
            return Err(crate::frame::FrameError::BufferTooSmall {
                needed,
                got: yuv.len(),
            }
            .into());
        }
        let (luma, chroma) = yuv.split_at(w * h);
        let (u, v) = chroma.split_at(w * h / 4);
        let planes = [(luma, w), (u, w / 2), (v, w / 2)];
        // The same picture as last time (compared where it was copied to; the first row
        // that differs ends the comparison): the same JPEG.
        if let Some(last) = &self.last {
            let same = planes.iter().enumerate().all(|(k, &(src, width))| {
                let (stride, dst) = (self.picture.stride(k), self.picture.data(k));
                src.chunks_exact(width)
                    .enumerate()
                    .all(|(y, line)| dst.get(y * stride..y * stride + width) == Some(line))
            });
            if same {
                return Ok(last.clone());
            }
        }
        self.last = None;
        for (k, (src, width)) in planes.into_iter().enumerate() {
            let stride = self.picture.stride(k);
            let dst = self.picture.data_mut(k);
            for (y, line) in src.chunks_exact(width).enumerate() {
                dst[y * stride..y * stride + width].copy_from_slice(line);
            }
        }
        let jpeg = Self::encode_frame(
            &mut self.encoder,
            &mut self.picture,
            self.lambda,
            &mut self.pts,
        )?;
        self.encoded += 1;
        self.last = Some(jpeg.clone());
        Ok(jpeg)
    }

    /// Encodes `frame` (YUVJ420P of the encoder's size).
    fn encode_frame_of(&mut self, frame: &mut ff::frame::Video) -> Result<Vec<u8>> {
        self.encoded += 1;
        Self::encode_frame(&mut self.encoder, frame, self.lambda, &mut self.pts)
    }

    fn encode_frame(
        encoder: &mut ff::encoder::video::Encoder,
        frame: &mut ff::frame::Video,
        lambda: i32,
        pts: &mut i64,
    ) -> Result<Vec<u8>> {
        frame.set_pts(Some(*pts));
        // SAFETY: a plain field of the frame FFmpeg allocated; the encoder reads it as the
        // picture's quantizer with QSCALE set.
        unsafe { (*frame.as_mut_ptr()).quality = lambda };
        *pts += 1;
        encoder
            .send_frame(frame)
            .map_err(|e| MediaError::Encode(format!("mjpeg: {e}")))?;
        let mut packet = ff::Packet::empty();
        encoder
            .receive_packet(&mut packet)
            .map_err(|e| MediaError::Encode(format!("mjpeg: {e}")))?;
        Ok(packet.data().map(<[u8]>::to_vec).unwrap_or_default())
    }
}

/// One RGBA frame in, one JPEG out (libavcodec's MJPEG encoder, full-range 4:2:0), scaled
/// down to fit the box given at construction.
pub struct JpegEncoder {
    scaler: RgbaScaler,
    inner: YuvJpegEncoder,
}

impl JpegEncoder {
    /// An encoder of `width` x `height` RGBA frames into JPEGs that fit `max_w` x `max_h`, at
    /// quantizer `q` (2 best .. 31 worst; 5 is good for viewing).
    pub fn new(width: u32, height: u32, max_w: u32, max_h: u32, q: u8) -> Result<Self> {
        check_source(width, height, None)?;
        let (dw, dh) = fit_within(width, height, max_w, max_h);
        Ok(JpegEncoder {
            scaler: RgbaScaler::new(width, height, ff::format::Pixel::YUVJ420P, dw, dh)?,
            inner: YuvJpegEncoder::new(dw, dh, q)?,
        })
    }

    /// The size of the JPEGs.
    pub fn size(&self) -> (u32, u32) {
        self.inner.size()
    }

    /// Encodes `rgba` (tightly packed, the size given at construction).
    pub fn encode(&mut self, rgba: &[u8]) -> Result<Vec<u8>> {
        let frame = self.scaler.run(rgba)?;
        self.inner.encode_frame_of(frame)
    }
}

/// RGBA frames in, an H.264 MP4 file out (libx264 `veryfast`, no B-frames, a key frame every
/// second), frames scaled to fit the box given at construction.
pub struct Mp4Recorder {
    output: ff::format::context::Output,
    encoder: ff::encoder::video::Encoder,
    scaler: RgbaScaler,
    encoder_tb: ff::Rational,
    frames: i64,
    path: PathBuf,
}

impl Mp4Recorder {
    /// A recording of `width` x `height` RGBA frames at `fps` frames per second into `path`
    /// (an `.mp4`), at most `max_w` x `max_h`.
    pub fn create(
        path: &Path,
        (width, height): (u32, u32),
        (max_w, max_h): (u32, u32),
        fps: u32,
    ) -> Result<Self> {
        check_source(width, height, None)?;
        if fps == 0 || fps > 240 {
            return Err(MediaError::Encode(format!("bad rate: {fps} fps")));
        }
        super::init_ffmpeg();
        let (dw, dh) = fit_within(width, height, max_w, max_h);
        let codec = ff::encoder::find_by_name("libx264")
            .or_else(|| ff::encoder::find(ff::codec::Id::H264))
            .ok_or_else(|| MediaError::Unsupported("this FFmpeg has no H.264 encoder".into()))?;
        let file_err = |e: ff::Error| MediaError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let mut output = ff::format::output(path).map_err(file_err)?;
        let global = output
            .format()
            .flags()
            .contains(ff::format::Flags::GLOBAL_HEADER);
        let mut enc = ff::codec::Context::new_with_codec(codec)
            .encoder()
            .video()
            .map_err(|e| MediaError::ffmpeg("encoder context", e))?;
        let encoder_tb = ff::Rational::new(1, fps as i32);
        enc.set_width(dw);
        enc.set_height(dh);
        enc.set_format(ff::format::Pixel::YUV420P);
        enc.set_time_base(encoder_tb);
        enc.set_frame_rate(Some(ff::Rational::new(fps as i32, 1)));
        enc.set_gop(fps);
        enc.set_max_b_frames(0);
        if global {
            enc.set_flags(ff::codec::Flags::GLOBAL_HEADER);
        }
        let mut opts = ff::Dictionary::new();
        if codec.name() == "libx264" {
            opts.set("preset", "veryfast");
        }
        let encoder = enc
            .open_as_with(codec, opts)
            .map_err(|e| MediaError::ffmpeg("avcodec_open2 (h264)", e))?;
        {
            let mut stream = output
                .add_stream(codec)
                .map_err(|e| MediaError::ffmpeg("avformat_new_stream", e))?;
            stream.set_parameters(&encoder);
            stream.set_time_base(encoder_tb);
        }
        output.write_header().map_err(file_err)?;
        Ok(Mp4Recorder {
            output,
            encoder,
            scaler: RgbaScaler::new(width, height, ff::format::Pixel::YUV420P, dw, dh)?,
            encoder_tb,
            frames: 0,
            path: path.to_path_buf(),
        })
    }

    /// Frames pushed so far.
    pub fn frames(&self) -> i64 {
        self.frames
    }

    /// Adds one frame (tightly packed RGBA of the size given at construction).
    pub fn push(&mut self, rgba: &[u8]) -> Result<()> {
        let pts = self.frames;
        let frame = self.scaler.run(rgba)?;
        frame.set_pts(Some(pts));
        self.encoder
            .send_frame(frame)
            .map_err(|e| MediaError::Encode(format!("h264: {e}")))?;
        self.frames += 1;
        self.write_ready()
    }

    fn write_ready(&mut self) -> Result<()> {
        let stream_tb = self
            .output
            .stream(0)
            .map(|s| s.time_base())
            .unwrap_or(self.encoder_tb);
        let mut packet = ff::Packet::empty();
        while self.encoder.receive_packet(&mut packet).is_ok() {
            packet.set_stream(0);
            // One frame long (the muxer's edit list ends after the last frame's duration).
            packet.set_duration(1);
            packet.rescale_ts(self.encoder_tb, stream_tb);
            packet
                .write_interleaved(&mut self.output)
                .map_err(|e| MediaError::File {
                    path: self.path.clone(),
                    reason: e.to_string(),
                })?;
        }
        Ok(())
    }

    /// Ends the stream and writes the file's index; returns the frames recorded.
    pub fn finish(mut self) -> Result<i64> {
        self.encoder
            .send_eof()
            .map_err(|e| MediaError::Encode(format!("h264: {e}")))?;
        self.write_ready()?;
        self.output.write_trailer().map_err(|e| MediaError::File {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        Ok(self.frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(w: u32, h: u32, t: u32) -> Vec<u8> {
        let mut px = Vec::with_capacity((w * h * 4) as usize);
        for y in 0..h {
            for x in 0..w {
                px.extend_from_slice(&[(x + t) as u8, y as u8, (x ^ y) as u8, 255]);
            }
        }
        px
    }

    #[test]
    fn fit_keeps_the_aspect_ratio_and_even_sizes() {
        assert_eq!(fit_within(1920, 1080, 640, 640), (640, 360));
        assert_eq!(fit_within(1080, 1920, 640, 640), (360, 640));
        assert_eq!(fit_within(320, 240, 640, 640), (320, 240));
        assert_eq!(fit_within(3840, 2160, 960, 540), (960, 540));
        let (w, h) = fit_within(1001, 777, 500, 500);
        assert!(w % 2 == 0 && h % 2 == 0 && w <= 500 && h <= 500);
    }

    #[test]
    fn jpeg_of_a_frame_decodes_to_its_size() {
        let mut enc = JpegEncoder::new(320, 240, 160, 160, 5).unwrap();
        assert_eq!(enc.size(), (160, 120));
        let jpeg = enc.encode(&gradient(320, 240, 0)).unwrap();
        // SOI, then EOI at the end.
        assert_eq!(&jpeg[..2], &[0xff, 0xd8]);
        assert_eq!(&jpeg[jpeg.len() - 2..], &[0xff, 0xd9]);
        // A different frame makes different bytes.
        assert_ne!(enc.encode(&gradient(320, 240, 40)).unwrap(), jpeg);
    }

    #[test]
    fn yuv_pictures_are_encoded_as_they_are() {
        let mut enc = YuvJpegEncoder::new(64, 48, 5).unwrap();
        assert_eq!(enc.size(), (64, 48));
        let mut yuv = vec![128u8; 64 * 48 * 3 / 2];
        yuv[..64 * 48].fill(200);
        let jpeg = enc.encode(&yuv).unwrap();
        assert_eq!(&jpeg[..2], &[0xff, 0xd8]);
        assert_eq!(enc.encoded(), 1);
        // The same picture again: the same JPEG, not encoded again.
        assert_eq!(enc.encode(&yuv).unwrap(), jpeg);
        assert_eq!(enc.encoded(), 1);
        yuv[..64 * 48].fill(20);
        let other = enc.encode(&yuv).unwrap();
        assert_ne!(other, jpeg);
        assert_eq!(enc.encoded(), 2);
        // One byte different in the last row of V: encoded anew.
        let last = yuv.len() - 1;
        yuv[last] = 90;
        enc.encode(&yuv).unwrap();
        assert_eq!(enc.encoded(), 3);
        // Wrong sizes are refused.
        assert!(enc.encode(&yuv[1..]).is_err());
        assert!(YuvJpegEncoder::new(63, 48, 5).is_err());
    }

    #[test]
    fn wrong_buffers_and_sizes_are_errors() {
        let mut enc = JpegEncoder::new(64, 48, 64, 48, 5).unwrap();
        assert!(enc.encode(&[0u8; 100]).is_err());
        assert!(JpegEncoder::new(0, 48, 64, 48, 5).is_err());
        assert!(JpegEncoder::new(100_000, 100_000, 64, 48, 5).is_err());
    }

    #[test]
    fn recording_writes_an_mp4_with_every_frame() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rec.mp4");
        let mut rec = Mp4Recorder::create(&path, (320, 240), (320, 240), 30).unwrap();
        for t in 0..45 {
            rec.push(&gradient(320, 240, t * 3)).unwrap();
        }
        assert_eq!(rec.finish().unwrap(), 45);
        // Read back with libavformat + libavcodec: 45 frames of 320x240.
        let mut demux = crate::codec::Demuxer::open(&path).unwrap();
        assert_eq!(demux.info().width, 320);
        assert_eq!(demux.info().height, 240);
        let mut packets = 0;
        while demux.read_packet().unwrap().is_some() {
            packets += 1;
        }
        assert_eq!(packets, 45);
    }
}
