//! libavcodec-backed [`FfmpegDecoder`].

use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::{Arc, Mutex};

use ff::ffi;
use ffmpeg_next as ff;

use super::{CodecKind, DecodedFrame, DecoderBackend, PacketError, StreamInfo};
use crate::error::{MediaError, Result};
use crate::frame::{FrameLayout, FrameMut, PixelFormat};
use crate::sws::{av_format, ScaleFilter, Scaler};
use virtsoc_sync::LockExt;

/// What a conversion scaler was made for: the picture's format, width and height.
type ScalerKey = (ffi::AVPixelFormat, u32, u32);

/// A libavcodec video decoder with frame threading and packed NV12/YUV420P output.
pub struct FfmpegDecoder {
    decoder: ff::decoder::Video,
    kind: CodecKind,
    name: String,
    out: PixelFormat,
    layout: Option<FrameLayout>,
    /// Conversion from the codec's native format, keyed by (native format, width, height).
    scaler: Option<(ScalerKey, Arc<Mutex<Scaler>>)>,
    frame: ff::frame::Video,
    /// Pictures decoded before an error, handed out by the next call.
    pending: Vec<DecodedFrame>,
    /// Buffers handed back through `recycle`, reused for pictures of the same size.
    pool: Vec<Vec<u8>>,
    /// Hand pictures out still in libavcodec's buffers ([`DecoderBackend::hold_pictures`]).
    hold: bool,
    errors: u64,
    frames_out: u64,
    /// Packets accepted so far: the last one's sequence number (also its `dts`, so a frame
    /// thread's output names the packet it came from).
    seq: u64,
    /// How many packets later a packet's result comes out: `threads - 1` with libavcodec's
    /// frame threads (each packet goes to the next thread; a thread's result is collected
    /// when the packet `threads - 1` later is submitted), else 0.
    delay: u64,
    /// (seq, pts) of the last `delay + 2` packets, oldest first, to name a failed packet.
    recent: VecDeque<(u64, i64)>,
    /// Sequence number of the last packet whose result came out.
    collected: u64,
    /// Earlier packets' failures, for `take_failures`.
    failures: Vec<PacketError>,
    /// The shared buffers libavcodec decodes 4:2:0 pictures into (a decoder worker's, see
    /// `worker::direct`); declared after `decoder`, so it outlives the codec context that
    /// points at it.
    _slots: Option<crate::worker::shared::SharedSlots>,
}

/// Errors taken from libavcodec in one call at most (each consumes a thread's result, so
/// more than `delay + 1` cannot happen; this bounds the loop should a library misbehave).
const MAX_ERRORS_PER_CALL: usize = 64;
/// Failures kept for `take_failures`; older ones are dropped.
const MAX_KEPT_FAILURES: usize = 64;

fn is_again(e: &ff::Error) -> bool {
    matches!(e, ff::Error::Other { errno } if *errno == ff::error::EAGAIN)
}

/// Most pixels a decoded picture may have: DCI 4K with room (4096 x 2304), above every size
/// the scenarios use (UHD is 3840 x 2160).
pub const MAX_DECODE_PIXELS: i64 = 4096 * 2304;

impl FfmpegDecoder {
    /// A decoder for a raw (Annex-B / IVF-less OBU / VP9 frame) stream of `codec`, writing
    /// `out` (NV12 or YUV420P). `threads > 1` enables frame threading with that many threads;
    /// 0 or 1 decodes on the calling thread.
    pub fn new(codec: CodecKind, out: PixelFormat, threads: usize) -> Result<Self> {
        Self::build(codec, out, threads, None, None, MAX_DECODE_PIXELS)
    }

    /// As [`new`](Self::new), refusing pictures of more than `max_pixels` (at most the limit
    /// of [`new`](Self::new), 4096 x 2304; a larger value is that). For a caller that knows
    /// its pictures are small: the `device_commands` fuzz target, whose packets declare
    /// pictures up to the limit that take milliseconds to allocate under ASan.
    pub fn with_max_pixels(
        codec: CodecKind,
        out: PixelFormat,
        threads: usize,
        max_pixels: u32,
    ) -> Result<Self> {
        let max = i64::from(max_pixels).clamp(1, MAX_DECODE_PIXELS);
        Self::build(codec, out, threads, None, None, max)
    }

    /// As [`new`](Self::new), decoding 4:2:0 pictures straight into `slots` (a decoder
    /// worker's buffers shared with its parent): see `worker::direct`.
    pub(crate) fn new_into(
        codec: CodecKind,
        out: PixelFormat,
        threads: usize,
        slots: crate::worker::shared::SharedSlots,
    ) -> Result<Self> {
        Self::build(codec, out, threads, None, Some(slots), MAX_DECODE_PIXELS)
    }

    /// As [`new`](Self::new), decoding 4:2:0 pictures straight into shared memfd buffers of
    /// its own through the `get_buffer2` a decoder worker installs (`worker::direct`): that
    /// path measured in one process, without a worker (`examples/decode_cost.rs`).
    pub fn new_shared_buffers(codec: CodecKind, out: PixelFormat, threads: usize) -> Result<Self> {
        Self::new_into(codec, out, threads, Default::default())
    }

    /// A decoder for a demuxed stream: takes the codec, size and extradata (e.g. the avcC
    /// box of an MP4) from `info`.
    pub fn for_stream(info: &StreamInfo, out: PixelFormat, threads: usize) -> Result<Self> {
        let codec = info.codec.ok_or_else(|| {
            MediaError::Unsupported(format!(
                "codec {} is not one of h264/hevc/vp9/av1",
                info.codec_name
            ))
        })?;
        Self::build(codec, out, threads, Some(info), None, MAX_DECODE_PIXELS)
    }

    fn find_codec(kind: CodecKind) -> Result<ff::Codec> {
        // dav1d is much faster than libaom and does not need hardware, unlike FFmpeg's
        // native av1 decoder in 5.x.
        let preferred: &[&str] = match kind {
            CodecKind::Av1 => &["libdav1d", "libaom-av1"],
            _ => &[],
        };
        for name in preferred {
            if let Some(c) = ff::decoder::find_by_name(name) {
                return Ok(c);
            }
        }
        ff::decoder::find(kind.av_id()).ok_or_else(|| {
            MediaError::Unsupported(format!("this FFmpeg build has no {} decoder", kind.name()))
        })
    }

    fn build(
        kind: CodecKind,
        out: PixelFormat,
        threads: usize,
        info: Option<&StreamInfo>,
        slots: Option<crate::worker::shared::SharedSlots>,
        max_pixels: i64,
    ) -> Result<Self> {
        if !out.is_yuv() {
            return Err(MediaError::Unsupported(format!(
                "decoder output must be NV12 or YUV420P, not {out:?}"
            )));
        }
        super::init_ffmpeg();
        let codec = Self::find_codec(kind)?;
        let mut ctx = ff::codec::Context::new_with_codec(codec);
        if let Some(info) = info {
            // SAFETY: the context is freshly allocated and not opened; extradata is allocated
            // with av_mallocz (zeroed padding) and freed by avcodec_free_context.
            unsafe {
                let p = ctx.as_mut_ptr();
                (*p).width = info.width as c_int;
                (*p).height = info.height as c_int;
                if !info.extradata.is_empty() {
                    let len = info.extradata.len();
                    let buf = ffi::av_mallocz(len + ffi::AV_INPUT_BUFFER_PADDING_SIZE as usize)
                        as *mut u8;
                    if buf.is_null() {
                        return Err(MediaError::ffmpeg(
                            "av_mallocz",
                            ff::Error::Other {
                                errno: ff::error::ENOMEM,
                            },
                        ));
                    }
                    std::ptr::copy_nonoverlapping(info.extradata.as_ptr(), buf, len);
                    (*p).extradata = buf;
                    (*p).extradata_size = len as c_int;
                }
            }
        }
        // A stream's headers say how large its pictures are, and libavcodec allocates them
        // (and their reference frames) before any picture comes out: a hostile bitstream
        // declaring 16384x16384 4:4:4 made it allocate gigabytes (found by the
        // `device_commands` fuzz target). libavcodec (and libdav1d) refuse larger pictures.
        // SAFETY: a plain field of the context, not yet opened.
        unsafe {
            (*ctx.as_mut_ptr()).max_pixels = max_pixels;
        }
        let threads = threads.max(1);
        ctx.set_threading(ff::threading::Config {
            kind: if threads > 1 {
                ff::threading::Type::Frame
            } else {
                ff::threading::Type::None
            },
            count: threads,
            ..Default::default()
        });
        if codec.name() == "libdav1d" {
            // dav1d's own frame threads hand back a picture (or its error) several packets
            // later with no way to tell which packet it was; FFmpeg's wrapper asks dav1d for
            // one frame in flight under LOW_DELAY, which keeps a packet's result in its own
            // call (tile and row threads still run in parallel). Not for the other decoders:
            // there LOW_DELAY would turn off reordering.
            // SAFETY: a plain field of the context, not yet opened.
            unsafe {
                (*ctx.as_mut_ptr()).flags |= ffi::AV_CODEC_FLAG_LOW_DELAY as c_int;
            }
        }
        if let Some(slots) = &slots {
            // SAFETY: the context is not opened yet; `slots` is kept in the decoder's last
            // field, dropped after the context.
            unsafe { super::worker::direct::install(ctx.as_mut_ptr(), slots) };
        }
        let decoder = ctx
            .decoder()
            .open_as(codec)
            .and_then(|o| o.video())
            .map_err(|e| MediaError::ffmpeg("avcodec_open2 (decoder)", e))?;
        // SAFETY: plain fields of the opened context, set by avcodec_open2.
        let delay = unsafe {
            let p = decoder.as_ptr();
            if (*p).active_thread_type & ffi::FF_THREAD_FRAME != 0 && (*p).thread_count > 1 {
                (*p).thread_count as u64 - 1
            } else {
                0
            }
        };
        Ok(FfmpegDecoder {
            decoder,
            kind,
            name: format!("ffmpeg-{}", codec.name()),
            out,
            layout: None,
            scaler: None,
            frame: ff::frame::Video::empty(),
            pending: Vec::new(),
            pool: Vec::new(),
            hold: false,
            errors: 0,
            frames_out: 0,
            seq: 0,
            delay,
            recent: VecDeque::new(),
            collected: 0,
            failures: Vec::new(),
            _slots: slots,
        })
    }

    /// The codec being decoded.
    pub fn codec(&self) -> CodecKind {
        self.kind
    }

    /// Packets or pictures rejected as corrupt so far.
    pub fn error_count(&self) -> u64 {
        self.errors
    }

    /// How many packets later a packet's result (picture or error) comes out: `threads - 1`
    /// with frame threads, else 0.
    pub fn result_delay(&self) -> u64 {
        self.delay
    }

    /// Which packet an error that came out now belongs to: while packets are fed, the one
    /// `delay` packets before the last one fed (frame threads collect results in submission
    /// order); at the end of a stream (`eof`), the oldest whose result has not come out.
    fn failed_packet(&mut self, eof: bool) -> (u64, i64) {
        let oldest = self.collected + 1;
        let seq = if eof {
            oldest
        } else {
            self.seq
                .saturating_sub(self.delay)
                .clamp(oldest, self.seq.max(oldest))
        };
        self.collected = self.collected.max(seq);
        let pts = self
            .recent
            .iter()
            .find(|(s, _)| *s == seq)
            .map_or(i64::MIN, |(_, p)| *p);
        (seq, pts)
    }

    /// Receives every picture the decoder has ready. An error belonging to the packet `own`
    /// (the one this call fed) is returned; earlier packets' errors go to `failures` and the
    /// pictures keep coming.
    fn drain(&mut self, out: &mut Vec<DecodedFrame>, own: Option<u64>, eof: bool) -> Result<()> {
        let mut mine = None;
        let mut errors = 0;
        loop {
            let reason = match self.decoder.receive_frame(&mut self.frame) {
                Ok(()) => match self.convert_current(eof) {
                    Ok(f) => {
                        out.push(f);
                        continue;
                    }
                    Err(MediaError::Decode(e)) => e,
                    // E.g. a picture size beyond MAX_DIMENSION from a hostile stream.
                    Err(e) => format!("{}: cannot output picture: {e}", self.name),
                },
                Err(ff::Error::Eof) => break,
                Err(e) if is_again(&e) => break,
                Err(e) => format!("{}: {e}", self.name),
            };
            self.note_error(reason, own, eof, &mut mine);
            errors += 1;
            if errors >= MAX_ERRORS_PER_CALL {
                break;
            }
        }
        mine.map_or(Ok(()), Err)
    }

    /// Counts an error and attributes it: to the packet `own` (into `mine`, for the call to
    /// return) or to an earlier one (`failures`).
    fn note_error(
        &mut self,
        reason: String,
        own: Option<u64>,
        eof: bool,
        mine: &mut Option<MediaError>,
    ) {
        self.errors += 1;
        let (seq, pts) = self.failed_packet(eof);
        if Some(seq) == own && mine.is_none() {
            *mine = Some(MediaError::Decode(reason));
        } else {
            log::debug!("{}: packet {seq} (pts {pts}) failed: {reason}", self.name);
            if self.failures.len() >= MAX_KEPT_FAILURES {
                // Nobody is asking (a file camera): keep the newest.
                self.failures.remove(0);
            }
            self.failures.push(PacketError { pts, seq, reason });
        }
    }

    /// The scaler from `native` at `w` x `h` into `layout`, made on first use (and again when
    /// the picture's format or size changes).
    fn scaler_for(
        &mut self,
        native: ffi::AVPixelFormat,
        w: u32,
        h: u32,
        layout: FrameLayout,
    ) -> Result<Arc<Mutex<Scaler>>> {
        let key = (native, w, h);
        if let Some((k, s)) = &self.scaler {
            if *k == key {
                return Ok(s.clone());
            }
        }
        log::debug!(
            "{}: converting {native:?} {w}x{h} to {:?}",
            self.name,
            self.out
        );
        let s = Arc::new(Mutex::new(Scaler::new(
            native,
            w,
            h,
            layout,
            ScaleFilter::Bilinear,
        )?));
        self.scaler = Some((key, s.clone()));
        Ok(s)
    }

    /// Copies or converts `self.frame` into a packed picture, and notes which packet's
    /// result it is.
    fn convert_current(&mut self, eof: bool) -> Result<DecodedFrame> {
        // SAFETY: plain fields of the frame the decoder just returned.
        let (pkt_dts, corrupt) = unsafe {
            let p = self.frame.as_ptr();
            (
                (*p).pkt_dts,
                (*p).flags & ffi::AV_FRAME_FLAG_CORRUPT != 0 || (*p).decode_error_flags != 0,
            )
        };
        if eof {
            // Frame threads stamp a picture with the dts (our sequence number) of the
            // packet whose thread returned it.
            if let Ok(s) = u64::try_from(pkt_dts) {
                if s > self.collected && s <= self.seq {
                    self.collected = s;
                }
            }
        }
        let f = &self.frame;
        let picture_size = (f.width(), f.height());
        let frame_pts = f.pts().or_else(|| f.timestamp());
        let (w, h) = (f.width() & !1, f.height() & !1);
        let layout = FrameLayout::packed(self.out, w, h)?;
        let pixel = f.format();
        if pixel == ff::format::Pixel::None || w == 0 || h == 0 {
            self.errors += 1;
            return Err(MediaError::Decode(format!(
                "{}: decoder returned an empty {pixel:?} {}x{} picture",
                self.name,
                f.width(),
                f.height()
            )));
        }
        let native = ffi::AVPixelFormat::from(pixel);
        // SAFETY: reading plain fields of a frame the decoder just returned.
        let (ptrs, strides) = unsafe {
            let p = f.as_ptr();
            let ptrs: [*const u8; 4] = std::array::from_fn(|i| (*p).data[i] as *const u8);
            let strides: [c_int; 4] = std::array::from_fn(|i| (*p).linesize[i]);
            (ptrs, strides)
        };
        let same_format = native == av_format(self.out)
            && strides.iter().take(layout.planes().len()).all(|&s| s > 0);
        // A picture in another format than asked is converted by this decoder's scaler.
        let scaler = match same_format {
            true => None,
            false => Some(self.scaler_for(native, w, h, layout)?),
        };
        if self.hold {
            // Kept as it is (a counted reference to libavcodec's buffers), copied (or
            // converted) once later, straight into its destination.
            let mut held = ff::frame::Video::empty();
            // SAFETY: both frames are valid; the reference moves, leaving `self.frame` empty
            // for the next picture.
            unsafe { ffi::av_frame_move_ref(held.as_mut_ptr(), self.frame.as_mut_ptr()) };
            self.layout = Some(layout);
            self.frames_out += 1;
            return Ok(DecodedFrame {
                layout,
                pts: frame_pts.unwrap_or(self.frames_out as i64 - 1),
                data: Vec::new(),
                corrupt,
                picture_size,
                held: Some(super::HeldPicture::new(held, scaler)),
            });
        }
        // Every byte of a packed layout is overwritten below, so a recycled buffer needs
        // no clearing.
        let mut data = match self.pool.iter().position(|b| b.len() == layout.size()) {
            Some(i) => self.pool.swap_remove(i),
            None => vec![0u8; layout.size()],
        };
        if same_format {
            // Same format: copy the planes, dropping FFmpeg's row padding.
            for (i, p) in layout.planes().iter().enumerate() {
                let src_stride = strides[i] as usize;
                for row in 0..p.rows() {
                    // SAFETY: FFmpeg planes hold `rows` rows of `linesize` bytes, and
                    // `row_bytes` never exceeds the (cropped) visible width.
                    let src = unsafe {
                        std::slice::from_raw_parts(ptrs[i].add(row * src_stride), p.row_bytes())
                    };
                    let o = p.offset + row * p.stride;
                    data[o..o + p.row_bytes()].copy_from_slice(src);
                }
            }
        } else if let Some(scaler) = scaler {
            // SAFETY: the pointers and strides are the decoder's own padded frame of format
            // `native`, at least w x h.
            unsafe {
                scaler.lock_or_recover().scale_raw_into(
                    &ptrs,
                    &strides,
                    FrameMut::new(layout, &mut data)?,
                )?
            };
        }
        self.layout = Some(layout);
        self.frames_out += 1;
        let pts = frame_pts.unwrap_or(self.frames_out as i64 - 1);
        Ok(DecodedFrame {
            layout,
            pts,
            data,
            corrupt,
            picture_size,
            held: None,
        })
    }
}

impl FfmpegDecoder {
    /// [`DecoderBackend::decode`] of a packet already in libavcodec's memory (a worker's
    /// received message, [`crate::worker`]): no copy of its bytes.
    pub(crate) fn decode_packet(
        &mut self,
        mut pkt: ff::Packet,
        pts: i64,
    ) -> Result<Vec<DecodedFrame>> {
        let mut out = std::mem::take(&mut self.pending);
        if pkt.size() == 0 {
            // An empty packet would mean end of stream to libavcodec; use flush() for that.
            return Ok(out);
        }
        let seq = self.seq + 1;
        pkt.set_pts(Some(pts));
        // The sequence number as dts: frame threads stamp each picture with the dts of the
        // packet whose thread returned it (used at the end of a stream).
        pkt.set_dts(Some(seq as i64));
        let mut sent = self.decoder.send_packet(&pkt);
        if matches!(&sent, Err(e) if is_again(e)) {
            // The decoder holds a picture: take it (errors there are earlier packets'),
            // then the packet goes in.
            let _ = self.drain(&mut out, None, false);
            sent = self.decoder.send_packet(&pkt);
        }
        if matches!(&sent, Err(e) if is_again(e)) {
            self.pending = out;
            return Err(MediaError::Decode(format!(
                "{}: the decoder accepts no packet",
                self.name
            )));
        }
        // Any other answer means libavcodec took the packet; an error is then one of
        // decoding (with frame threads, an earlier packet's), as from receive_frame.
        self.seq = seq;
        self.recent.push_back((seq, pts));
        while self.recent.len() as u64 > self.delay + 2 {
            self.recent.pop_front();
        }
        let mut mine = None;
        if let Err(e) = sent {
            self.note_error(format!("{}: {e}", self.name), Some(seq), false, &mut mine);
        }
        if let Err(e) = self.drain(&mut out, Some(seq), false) {
            mine.get_or_insert(e);
        }
        // The packet `delay` before this one has had its result.
        self.collected = self.collected.max(seq.saturating_sub(self.delay));
        match mine {
            None => Ok(out),
            Some(e) => {
                self.pending = out;
                Err(e)
            }
        }
    }
}

impl DecoderBackend for FfmpegDecoder {
    fn name(&self) -> &str {
        &self.name
    }

    fn decode(&mut self, packet: &[u8], pts: i64) -> Result<Vec<DecodedFrame>> {
        self.decode_packet(ff::Packet::copy(packet), pts)
    }

    fn flush(&mut self) -> Result<Vec<DecodedFrame>> {
        let mut out = std::mem::take(&mut self.pending);
        match self.decoder.send_eof() {
            Ok(()) | Err(ff::Error::Eof) => {}
            // libavcodec took the end of stream and failed decoding a packet still in it.
            Err(e) if !is_again(&e) => {
                self.note_error(format!("{}: {e}", self.name), None, true, &mut None)
            }
            Err(e) => return Err(MediaError::ffmpeg("avcodec_send_packet (eof)", e)),
        }
        let r = self.drain(&mut out, None, true);
        // Reset so that a new stream can follow; every packet's result is out.
        self.decoder.flush();
        self.collected = self.seq;
        r.map(|()| out)
    }

    fn take_failures(&mut self) -> Vec<PacketError> {
        std::mem::take(&mut self.failures)
    }

    fn output_layout(&self) -> Option<FrameLayout> {
        self.layout
    }

    fn hold_pictures(&mut self, yes: bool) {
        self.hold = yes;
    }

    fn recycle(&mut self, frame: DecodedFrame) {
        const MAX_POOLED: usize = 4;
        if self.layout.is_some_and(|l| l.size() == frame.data.len()) && self.pool.len() < MAX_POOLED
        {
            self.pool.push(frame.data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decoder writing into shared buffers tells libavcodec that its `get_buffer2` is
    /// thread-safe where libavcodec still asks (before 60): else every frame thread hands
    /// its allocation to the thread in `avcodec_send_packet` and waits for it.
    #[test]
    fn a_decoder_into_shared_buffers_has_thread_safe_callbacks() {
        let dec = FfmpegDecoder::new_shared_buffers(CodecKind::H264, PixelFormat::Nv12, 2).unwrap();
        // SAFETY: a plain field of the opened context.
        let ctx = unsafe { &*dec.decoder.as_ptr() };
        assert!(ctx.get_buffer2.is_some());
        #[cfg(virtsoc_thread_safe_callbacks)]
        assert_eq!(ctx.thread_safe_callbacks, 1);
    }

    /// The `device_commands` fuzz input that made libavcodec allocate over 6 GiB: an H.264
    /// stream whose SPS declares a huge 4:4:4 picture (fuzz/artifacts-regressions). Now the
    /// decoder refuses it; nothing comes out larger than the limit.
    #[test]
    fn a_stream_declaring_huge_pictures_is_refused() {
        let input = include_bytes!(
            "../../../../fuzz/artifacts-regressions/device_commands-oom-h264-huge-sps"
        );
        // The fuzz target's format: selector, codec kind, output format, then packets of
        // u16 length + bytes.
        let mut rest = &input[3..];
        let mut dec = FfmpegDecoder::new(CodecKind::H264, PixelFormat::Nv12, 1).unwrap();
        let mut frames = Vec::new();
        for pts in 0..8 {
            if rest.len() < 2 {
                break;
            }
            let n = (u16::from_le_bytes([rest[0], rest[1]]) as usize).min(rest.len() - 2);
            if let Ok(f) = dec.decode(&rest[2..2 + n], pts) {
                frames.extend(f);
            }
            rest = &rest[2 + n..];
        }
        if let Ok(f) = dec.flush() {
            frames.extend(f);
        }
        for f in frames {
            let px = i64::from(f.layout.width) * i64::from(f.layout.height);
            assert!(px <= MAX_DECODE_PIXELS, "{:?}", f.layout);
        }
    }
}
