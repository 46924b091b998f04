//! Video codec backends: the [`DecoderBackend`] trait with its libavcodec implementation
//! ([`FfmpegDecoder`]) and a [`NullDecoder`] for plumbing tests, a libavformat [`Demuxer`]
//! that feeds a file packet by packet, the H.264 [`FfmpegEncoder`] used by camera recording
//! and livestreaming, the [`JpegEncoder`] and [`Mp4Recorder`] of the live view and
//! recordings, [`measure_decode_fps`] for the project's bench, and [`ProcessDecoder`], a
//! decoder whose libavcodec runs in a sandboxed worker process ([`serve_decoder`]).
//!
//! Decoded frames always come out as tightly packed NV12 or YUV420P (chosen at
//! construction), converted with libswscale inside the backend when the codec's native
//! format differs (10-bit, full-range "yuvj", 4:2:2, ...). Streams with odd dimensions are
//! cropped to the next even size below (4:2:0 needs even sizes); each [`DecodedFrame`] tells
//! the picture's own size next to the delivered one, so the crop is never silent.
//!
//! Errors are told apart per packet: a picture libavcodec decoded with errors (concealed
//! slices, missing references, a stream joined before its recovery point) comes out marked
//! [`DecodedFrame::corrupt`]; a packet that fails outright fails the `decode` call that fed
//! it when that is known at once, and is otherwise (frame threads return a packet's result
//! `threads - 1` packets later) reported by [`DecoderBackend::take_failures`] with the
//! packet's `pts` and sequence number, never blamed on a later, good packet.

mod decoder;
mod demux;
mod encoder;
mod still;
mod worker;

use std::path::Path;
use std::time::Instant;

pub use decoder::FfmpegDecoder;
pub use demux::{DemuxedPacket, Demuxer, StreamInfo};
pub use encoder::{EncodedPacket, EncoderBackend, EncoderPreset, FfmpegEncoder};
pub use still::{fit_within, JpegEncoder, Mp4Recorder, YuvJpegEncoder};
pub use worker::{
    check_encoder_answer, check_worker_answer, sandbox, serve_decoder, DecoderPool, ProcessDecoder,
    ProcessEncoder, CALL_DEADLINE, DEFAULT_SPARE, MAX_IN_FLIGHT,
};

use crate::error::{MediaError, Result};
use crate::frame::{FrameLayout, FrameMut, FrameRef, PixelFormat};
use virtsoc_sync::LockExt;

/// The FFmpeg log level the crate runs at: only messages about to abort the process.
pub const FFMPEG_LOG_LEVEL: ffmpeg_next::util::log::Level = ffmpeg_next::util::log::Level::Fatal;

/// Initializes FFmpeg and sets its log level, once per process, before any codec, demuxer
/// or scaler is opened through this crate.
pub(crate) fn init_ffmpeg() {
    static INIT: std::sync::Once = std::sync::Once::new();
    INIT.call_once(|| {
        if let Err(e) = ffmpeg_next::init() {
            log::warn!("FFmpeg initialization failed: {e}");
        }
        ffmpeg_next::util::log::set_level(FFMPEG_LOG_LEVEL);
    });
}

/// Compressed video formats the decoder knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodecKind {
    /// H.264 / AVC.
    H264,
    /// H.265 / HEVC.
    Hevc,
    /// VP9.
    Vp9,
    /// AV1.
    Av1,
}

impl CodecKind {
    /// All kinds.
    pub const ALL: [CodecKind; 4] = [
        CodecKind::H264,
        CodecKind::Hevc,
        CodecKind::Vp9,
        CodecKind::Av1,
    ];

    /// Short lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            CodecKind::H264 => "h264",
            CodecKind::Hevc => "hevc",
            CodecKind::Vp9 => "vp9",
            CodecKind::Av1 => "av1",
        }
    }

    pub(crate) fn av_id(self) -> ffmpeg_next::codec::Id {
        use ffmpeg_next::codec::Id;
        match self {
            CodecKind::H264 => Id::H264,
            CodecKind::Hevc => Id::HEVC,
            CodecKind::Vp9 => Id::VP9,
            CodecKind::Av1 => Id::AV1,
        }
    }

    pub(crate) fn from_av_id(id: ffmpeg_next::codec::Id) -> Option<Self> {
        CodecKind::ALL.into_iter().find(|k| k.av_id() == id)
    }
}

/// One decoded picture, tightly packed in the decoder's configured output format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedFrame {
    /// Format and size (`stride == width`).
    pub layout: FrameLayout,
    /// Presentation timestamp: the `pts` given with the packet that produced this picture,
    /// after the decoder's reordering; the decoder's best guess if it lost track.
    pub pts: i64,
    /// `layout.size()` bytes.
    pub data: Vec<u8>,
    /// Decoded with errors: libavcodec flagged the picture corrupt (`AV_FRAME_FLAG_CORRUPT`:
    /// e.g. decoded before the stream's recovery point, with references missing) or
    /// reported damage it concealed (`decode_error_flags`: invalid bitstream, missing
    /// reference, concealment). Its pixels are a best effort.
    pub corrupt: bool,
    /// The picture's size as the stream codes it (its display size); `layout` is this
    /// cropped to even, so they differ only for odd sizes.
    pub picture_size: (u32, u32),
    /// Set when the decoder was asked to hold pictures
    /// ([`DecoderBackend::hold_pictures`]): the pixels are still in libavcodec's buffers and
    /// `data` is empty; [`copy_into`](Self::copy_into) copies them out once.
    pub(crate) held: Option<HeldPicture>,
}

/// A decoded picture's pixels outside `data`: still in libavcodec's buffers (a counted
/// reference to its frame, and the decoder's scaler when the picture must be converted to the
/// format asked for), or in a picture buffer a decoder worker process shares with this one.
pub(crate) enum HeldPicture {
    /// In libavcodec's buffers (not copied yet).
    Frame {
        frame: ffmpeg_next::frame::Video,
        scaler: Option<std::sync::Arc<std::sync::Mutex<crate::sws::Scaler>>>,
    },
    /// In a worker's shared picture buffer (copied there once by the worker).
    Shared(worker::SharedPicture),
    /// Where a worker's libavcodec decoded it, in a shared buffer: the 4:2:0 planes'
    /// (offset, stride), checked to lie in the buffer for the picture's size; `packed` is
    /// a packed copy made on first [`DecodedFrame::as_frame`].
    Planes {
        pic: worker::SharedPicture,
        planes: [(usize, usize); 3],
        packed: std::sync::OnceLock<Vec<u8>>,
    },
}

impl HeldPicture {
    pub(crate) fn new(
        frame: ffmpeg_next::frame::Video,
        scaler: Option<std::sync::Arc<std::sync::Mutex<crate::sws::Scaler>>>,
    ) -> Self {
        HeldPicture::Frame { frame, scaler }
    }

    /// Copies the planes of `layout` (the picture's packed layout, the frame's own format)
    /// into `dst`, dropping FFmpeg's row padding.
    fn copy_into(&self, layout: FrameLayout, dst: FrameMut<'_>) -> Result<()> {
        dst.validate()?;
        if (dst.layout.format, dst.layout.width, dst.layout.height)
            != (layout.format, layout.width, layout.height)
        {
            return Err(crate::MediaError::InvalidLayout(format!(
                "a {:?} {}x{} picture into a {:?} {}x{} frame",
                layout.format,
                layout.width,
                layout.height,
                dst.layout.format,
                dst.layout.width,
                dst.layout.height
            )));
        }
        let (frame, scaler) = match self {
            HeldPicture::Frame { frame, scaler } => (frame, scaler),
            HeldPicture::Shared(p) => return crate::frame::copy_frame(p.frame(layout)?, dst),
            HeldPicture::Planes { pic, planes, .. } => {
                return worker::copy_planes(pic.bytes(), planes, dst)
            }
        };
        if let Some(scaler) = scaler {
            // SAFETY: plain fields of a frame we hold a reference to: its planes, in the
            // format and size the scaler was made for.
            let (ptrs, strides) = unsafe {
                let f = frame.as_ptr();
                (
                    std::array::from_fn(|i| (*f).data[i] as *const u8),
                    std::array::from_fn(|i| (*f).linesize[i]),
                )
            };
            let mut s = scaler.lock_or_recover();
            // SAFETY: as above; `dst` was checked to be the picture's layout.
            return unsafe { s.scale_raw_into(&ptrs, &strides, dst) };
        }
        let dl = dst.layout;
        let data = dst.data;
        for (i, p) in dl.planes().iter().enumerate() {
            // SAFETY: plain fields of a frame we hold a reference to.
            let (ptr, stride) = unsafe {
                let f = frame.as_ptr();
                ((*f).data[i] as *const u8, (*f).linesize[i])
            };
            let stride = usize::try_from(stride)
                .ok()
                .filter(|s| *s >= p.row_bytes() && !ptr.is_null())
                .ok_or_else(|| crate::MediaError::Decode("a held picture lost a plane".into()))?;
            for row in 0..p.rows() {
                // SAFETY: the decoder's plane `i` holds `rows` rows of `stride` bytes, each at
                // least `row_bytes` long (checked above; the layout is the frame's, cropped to
                // even).
                let src =
                    unsafe { std::slice::from_raw_parts(ptr.add(row * stride), p.row_bytes()) };
                let o = p.offset + row * p.stride;
                data[o..o + p.row_bytes()].copy_from_slice(src);
            }
        }
        Ok(())
    }
}

impl Clone for HeldPicture {
    fn clone(&self) -> Self {
        match self {
            HeldPicture::Frame { frame, scaler } => {
                let mut copy = ffmpeg_next::frame::Video::empty();
                // SAFETY: both frames are valid; this adds a reference to the same buffers.
                unsafe { ffmpeg_next::ffi::av_frame_ref(copy.as_mut_ptr(), frame.as_ptr()) };
                HeldPicture::Frame {
                    frame: copy,
                    scaler: scaler.clone(),
                }
            }
            HeldPicture::Shared(p) => HeldPicture::Shared(p.clone()),
            HeldPicture::Planes { pic, planes, .. } => HeldPicture::Planes {
                pic: pic.clone(),
                planes: *planes,
                packed: std::sync::OnceLock::new(),
            },
        }
    }
}

impl PartialEq for HeldPicture {
    fn eq(&self, other: &Self) -> bool {
        // The same buffers.
        match (self, other) {
            (HeldPicture::Frame { frame: a, .. }, HeldPicture::Frame { frame: b, .. }) => {
                // SAFETY: plain fields of frames we hold references to.
                unsafe { (*a.as_ptr()).data[0] == (*b.as_ptr()).data[0] }
            }
            (HeldPicture::Shared(a), HeldPicture::Shared(b)) => a.same_buffer(b),
            (
                HeldPicture::Planes {
                    pic: a, planes: pa, ..
                },
                HeldPicture::Planes {
                    pic: b, planes: pb, ..
                },
            ) => a.same_buffer(b) && pa == pb,
            _ => false,
        }
    }
}

impl Eq for HeldPicture {}

impl std::fmt::Debug for HeldPicture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HeldPicture::Frame { .. } => "HeldPicture::Frame",
            HeldPicture::Shared(_) => "HeldPicture::Shared",
            HeldPicture::Planes { .. } => "HeldPicture::Planes",
        })
    }
}

impl DecodedFrame {
    /// Whether the delivered picture is smaller than the coded one (odd width or height
    /// cropped to even).
    pub fn cropped(&self) -> bool {
        self.picture_size != (self.layout.width, self.layout.height)
    }

    /// A picture of `layout` whose packed pixels are `data` (its coded size the layout's,
    /// not corrupt).
    pub fn packed(layout: FrameLayout, pts: i64, data: Vec<u8>) -> Self {
        DecodedFrame {
            layout,
            pts,
            data,
            corrupt: false,
            picture_size: (layout.width, layout.height),
            held: None,
        }
    }

    /// Whether the pixels are still in the decoder's buffers, not copied yet (see
    /// [`copy_into`](Self::copy_into)); a picture a worker process copied into a shared
    /// buffer is not.
    pub fn is_held(&self) -> bool {
        matches!(self.held, Some(HeldPicture::Frame { .. }))
    }

    /// Whether nobody has copied the picture's pixels since the decoder wrote them: still in
    /// libavcodec's buffers, or in the worker's shared buffer libavcodec decoded it into.
    /// [`copy_into`](Self::copy_into) is then its first and only copy.
    pub fn uncopied(&self) -> bool {
        matches!(
            self.held,
            Some(HeldPicture::Frame { .. } | HeldPicture::Planes { .. })
        )
    }

    /// The planes of a picture held in libavcodec's buffers, when they are 4:2:0 (a worker
    /// finds them in its shared buffers).
    pub(crate) fn held_yuv420(&self) -> Option<([*const u8; 3], [std::ffi::c_int; 3])> {
        let Some(HeldPicture::Frame { frame, .. }) = &self.held else {
            return None;
        };
        if frame.format() != ffmpeg_next::format::Pixel::YUV420P {
            return None;
        }
        // SAFETY: plain fields of a frame we hold a reference to.
        unsafe {
            let f = frame.as_ptr();
            Some((
                std::array::from_fn(|i| (*f).data[i] as *const u8),
                std::array::from_fn(|i| (*f).linesize[i]),
            ))
        }
    }

    /// The picture lent out where it lies, when that is a decoder worker's shared buffer (no
    /// copy; the buffer stays held while the lent picture lives).
    pub fn lend(&self) -> Option<LentPicture> {
        let layout = self.layout;
        match &self.held {
            Some(HeldPicture::Planes { pic, planes, .. }) => Some(LentPicture {
                layout,
                pic: pic.clone(),
                planes: Some(*planes),
            }),
            Some(HeldPicture::Shared(pic)) if pic.frame(layout).is_ok() => Some(LentPicture {
                layout,
                pic: pic.clone(),
                planes: None,
            }),
            _ => None,
        }
    }

    /// Copies the picture into `dst` (its format and size): out of the decoder's buffers for
    /// a held picture, else from `data`.
    pub fn copy_into(&self, dst: FrameMut<'_>) -> Result<()> {
        match &self.held {
            Some(h) => h.copy_into(self.layout, dst),
            None => crate::frame::copy_frame(self.as_frame(), dst),
        }
    }

    /// A read-only frame view of the picture's `data`, or of a worker's shared buffer
    /// (empty for a picture in libavcodec's buffers: use [`copy_into`](Self::copy_into)).
    pub fn as_frame(&self) -> FrameRef<'_> {
        match &self.held {
            Some(HeldPicture::Shared(p)) => {
                if let Ok(f) = p.frame(self.layout) {
                    return f;
                }
            }
            Some(HeldPicture::Planes {
                pic,
                planes,
                packed,
            }) => {
                let data = packed.get_or_init(|| {
                    let mut data = vec![0u8; self.layout.size()];
                    let copied = FrameMut::new(self.layout, &mut data)
                        .map_err(MediaError::from)
                        .and_then(|dst| worker::copy_planes(pic.bytes(), planes, dst));
                    if copied.is_err() {
                        data.fill(0);
                    }
                    data
                });
                return FrameRef {
                    layout: self.layout,
                    data,
                };
            }
            _ => {}
        }
        FrameRef {
            layout: self.layout,
            data: &self.data,
        }
    }
}

/// A decoded picture lent out where it lies, in a decoder worker's shared buffer
/// ([`DecodedFrame::lend`]), so that it can serve as a region's contents without being
/// copied: its bytes read range by range as the packed frame of its format and size holds
/// them ([`read`](Self::read)). The buffer stays the parent's (the worker decodes nothing
/// into it) until this is dropped.
pub struct LentPicture {
    layout: FrameLayout,
    pic: worker::SharedPicture,
    /// The 4:2:0 planes where libavcodec decoded them; `None`: packed as `layout`.
    planes: Option<[(usize, usize); 3]>,
}

impl LentPicture {
    /// The packed layout its bytes read as.
    pub fn layout(&self) -> FrameLayout {
        self.layout
    }

    /// Reads bytes `[offset, offset + dst.len())` of the packed picture into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        match &self.planes {
            Some(planes) => worker::read_planes(self.pic.bytes(), planes, self.layout, offset, dst),
            None => {
                let f = self.pic.frame(self.layout)?;
                let src = offset
                    .checked_add(dst.len())
                    .and_then(|end| f.data.get(offset..end))
                    .ok_or_else(|| MediaError::InvalidLayout("a range past the picture".into()))?;
                dst.copy_from_slice(src);
                Ok(())
            }
        }
    }
}

impl std::fmt::Debug for LentPicture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LentPicture({:?})", self.layout)
    }
}

/// A packet the decoder failed, reported after the call that fed it (see
/// [`DecoderBackend::take_failures`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketError {
    /// The `pts` given with the packet.
    pub pts: i64,
    /// The packet's sequence number: 1 for the decoder's first packet, counting every packet
    /// `decode` accepted.
    pub seq: u64,
    /// libavcodec's reason.
    pub reason: String,
}

/// A video decoder fed one compressed packet at a time.
pub trait DecoderBackend: Send {
    /// Short backend name for logs (e.g. `ffmpeg-h264`).
    fn name(&self) -> &str;
    /// Decodes one packet (a complete access unit, Annex-B or as the container gives it with
    /// the matching extradata). Returns the pictures that became ready, in presentation
    /// order. A corrupt packet whose failure is known at once gives
    /// `Err(MediaError::Decode)` and leaves the decoder usable (the pictures that became
    /// ready come with the next call); an earlier packet's failure that surfaces during this
    /// call is not this packet's error: the call succeeds and the failure waits in
    /// [`take_failures`](Self::take_failures).
    fn decode(&mut self, packet: &[u8], pts: i64) -> Result<Vec<DecodedFrame>>;
    /// Signals end of stream and returns the pictures still buffered; afterwards the decoder
    /// accepts a new stream (e.g. after a seek or when looping). Failures of the packets
    /// still in the decoder go to [`take_failures`](Self::take_failures).
    fn flush(&mut self) -> Result<Vec<DecodedFrame>>;
    /// Feeds one packet without waiting for its pictures where the decoder can (one in a
    /// worker process with frame threads: the worker goes on decoding while the caller goes
    /// on): returns the pictures ready now, which may be earlier packets'; the others come
    /// from [`collect`](Self::collect) and [`flush`](Self::flush). The packet's own failure
    /// is then reported by [`take_failures`](Self::take_failures), as an earlier packet's
    /// is. By default, and with one decoding thread, the same as [`decode`](Self::decode).
    fn submit(&mut self, packet: &[u8], pts: i64) -> Result<Vec<DecodedFrame>> {
        self.decode(packet, pts)
    }
    /// Packets fed by [`submit`](Self::submit) whose answers have not come back yet.
    fn in_flight(&self) -> usize {
        0
    }
    /// Sends a packet whose [`submit`](Self::submit) would wait for the packet's own answer
    /// (a decoder in a worker process with one decoding thread) without waiting: true when
    /// sent. Its pictures, or its own failure, then come from [`finish`](Self::finish), what
    /// `decode` would have returned; any other call reads its answer first (a failure then
    /// goes to [`take_failures`](Self::take_failures)). By default, and with frame threads,
    /// false: nothing sent.
    fn start(&mut self, _packet: &[u8], _pts: i64) -> Result<bool> {
        Ok(false)
    }
    /// Whether [`start`](Self::start) would send a packet now (one decoding thread in a
    /// worker, nothing started): a caller checks this before it fetches the packet's bytes.
    fn starts(&self) -> bool {
        false
    }
    /// Sends the end of stream to a decoder in a worker process, behind the packets in
    /// flight, without waiting: true when sent. [`finish`](Self::finish) then gives what
    /// [`flush`](Self::flush) gives. By default false: nothing sent.
    fn start_flush(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// Whether a packet [`start`](Self::start)ed, or a flush, is not finished yet.
    fn started(&self) -> bool {
        false
    }
    /// The started call's result, as [`decode`](Self::decode) or [`flush`](Self::flush)
    /// gives it (waiting for its answers if they have not come yet); nothing when none was
    /// started.
    fn finish(&mut self) -> Result<Vec<DecodedFrame>> {
        Ok(Vec::new())
    }
    /// Whether [`finish`](Self::finish) (a call started) or [`submit`](Self::submit) (frame
    /// threads, the most packets in flight) would wait now for answers that have not
    /// arrived ([`answers_fd`](Self::answers_fd) becomes readable as they do); reads those
    /// that have.
    fn would_wait(&mut self) -> bool {
        false
    }
    /// The pictures of packets in flight that came back since; with `wait`, waits for the
    /// oldest packet in flight first when none has.
    fn collect(&mut self, _wait: bool) -> Result<Vec<DecodedFrame>> {
        Ok(Vec::new())
    }
    /// A descriptor that becomes readable when the answer to a packet in flight arrives (a
    /// worker's socket): a caller may wait on it without holding the decoder, then
    /// [`collect`](Self::collect) without waiting. `None` while nothing is in flight, and
    /// for a decoder without one (`collect(true)` then waits itself).
    fn answers_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
    /// Failures of packets fed by earlier calls that surfaced since the last call of this
    /// method, oldest first (with frame threads a packet's result comes out `threads - 1`
    /// packets later, so its error arrives during a later call).
    fn take_failures(&mut self) -> Vec<PacketError> {
        Vec::new()
    }
    /// Layout of the output pictures, once known (after the first picture for real codecs).
    fn output_layout(&self) -> Option<FrameLayout>;
    /// CPU time the decoder has used so far, all its threads, in nanoseconds, where it runs
    /// apart (a worker process: as the kernel counts it, read by this process, not reported
    /// by the worker); `None` for a decoder that runs on the caller's threads, whose time the
    /// caller sees itself, and for a worker that is gone.
    fn cpu_ns(&self) -> Option<u64> {
        None
    }
    /// Asks for pictures left in the decoder's own buffers until copied out with
    /// [`DecodedFrame::copy_into`] (one copy instead of two, for a caller that copies each
    /// picture into a buffer of its own anyway). Decoders that cannot ignore it.
    fn hold_pictures(&mut self, _yes: bool) {}
    /// Hands a picture's buffer back for reuse by later pictures (saves allocating and
    /// faulting in a fresh buffer per frame, ~12 MiB at 3840x2160). Optional.
    fn recycle(&mut self, frame: DecodedFrame) {
        drop(frame);
    }
}

/// A decoder that decodes nothing: either drops every packet, or answers each non-empty
/// packet with one synthetic picture of a fixed layout (a diagonal luma ramp shifted by the
/// packet count, neutral chroma) carrying the packet's pts.
#[derive(Debug, Clone)]
pub struct NullDecoder {
    layout: Option<FrameLayout>,
    count: u64,
}

impl NullDecoder {
    /// Drops every packet and never outputs a picture.
    pub fn discarding() -> Self {
        NullDecoder {
            layout: None,
            count: 0,
        }
    }

    /// Outputs one test-pattern picture of `layout` (NV12 or YUV420P; made packed) per packet.
    pub fn pattern(layout: FrameLayout) -> Result<Self> {
        layout.validate()?;
        if !layout.format.is_yuv() {
            return Err(MediaError::Unsupported(format!(
                "decoders output NV12 or YUV420P, not {:?}",
                layout.format
            )));
        }
        Ok(NullDecoder {
            layout: Some(FrameLayout::packed(
                layout.format,
                layout.width,
                layout.height,
            )?),
            count: 0,
        })
    }

    fn picture(layout: FrameLayout, count: u64, pts: i64) -> DecodedFrame {
        let mut data = vec![128u8; layout.size()];
        let w = layout.width as usize;
        for (y, row) in data[..w * layout.height as usize]
            .chunks_exact_mut(w)
            .enumerate()
        {
            for (x, px) in row.iter_mut().enumerate() {
                *px = (x + y + count as usize) as u8;
            }
        }
        DecodedFrame::packed(layout, pts, data)
    }
}

impl DecoderBackend for NullDecoder {
    fn name(&self) -> &str {
        "null"
    }

    fn decode(&mut self, packet: &[u8], pts: i64) -> Result<Vec<DecodedFrame>> {
        if packet.is_empty() {
            return Ok(Vec::new());
        }
        self.count += 1;
        Ok(self
            .layout
            .map(|l| vec![Self::picture(l, self.count, pts)])
            .unwrap_or_default())
    }

    fn flush(&mut self) -> Result<Vec<DecodedFrame>> {
        Ok(Vec::new())
    }

    fn output_layout(&self) -> Option<FrameLayout> {
        self.layout
    }
}

/// Decodes the best video stream of the file at `path` with [`FfmpegDecoder`] (YUV420P
/// output, `threads` frame threads) and returns the decoded frames per second of wall time.
/// Packets are read into memory first, so file I/O is not measured; output conversion into
/// packed buffers is, since every consumer pays it.
pub fn measure_decode_fps(path: impl AsRef<Path>, threads: usize) -> Result<f64> {
    let mut demux = Demuxer::open(path.as_ref())?;
    let mut packets = Vec::new();
    while let Some(p) = demux.read_packet()? {
        packets.push(p);
    }
    let mut dec = FfmpegDecoder::for_stream(demux.info(), PixelFormat::Yuv420p, threads)?;
    let start = Instant::now();
    let mut frames = 0usize;
    for p in &packets {
        match dec.decode(&p.data, p.pts) {
            Ok(out) => {
                frames += out.len();
                out.into_iter().for_each(|f| dec.recycle(f));
            }
            Err(MediaError::Decode(e)) => log::warn!("measure_decode_fps: {e}"),
            Err(e) => return Err(e),
        }
    }
    frames += dec.flush()?.len();
    let secs = start.elapsed().as_secs_f64();
    if frames == 0 {
        return Err(MediaError::NoFrames(format!(
            "{} decoded to no frames",
            path.as_ref().display()
        )));
    }
    Ok(frames as f64 / secs.max(1e-9))
}
