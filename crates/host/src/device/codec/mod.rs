//! The codec device: video decoding and H.264 encoding with libavcodec (through
//! `virtsoc-media`), on SVM regions.
//!
//! A guest opens decoders and encoders and names them by small integer handles. Handles live
//! in a per-guest namespace: they count up from 1 for each guest and are never reused, so a
//! stale handle (closed) or another guest's handle is simply unknown and gets
//! [`Status::BadArgument`]. A guest holds at most [`Limits::codec_sessions_per_guest`] open
//! sessions (default [`MAX_SESSIONS_PER_GUEST`], [`Status::OutOfMemory`] beyond); all guests
//! together hold at most [`Limits::codec_sessions`] sessions and [`Limits::codec_threads`]
//! codec threads (a decoder counts its threads, an encoder [`ENCODER_THREADS`]):
//! [`Status::Busy`] for a session past either. When a guest goes away its sessions are
//! dropped.
//!
//! Decoding: `decode` feeds one packet (a complete access unit of a raw Annex-B / elementary
//! stream, as a demuxer produces it) read from a region; the pictures it yields wait in the
//! session's queue, in presentation order, until `receive_frame` moves them into image regions
//! (NV12 or YUV420P, the format chosen at `open_decoder`, of exactly the picture's size; the
//! copy honours the region's stride). A picture a decoder worker decoded into its shared
//! buffer, received into a region that holds exactly its packed frame, is not copied: the
//! buffer becomes the region's replica in the codec's domain ([`lend`]). At most
//! [`MAX_QUEUED_FRAMES`] pictures wait (counting the packets still in the decoder): `decode`
//! answers [`Status::Busy`] while the queue is full, so a guest that stops receiving cannot
//! make the daemon hoard frames. `stream_info` tells the size of the picture `receive_frame`
//! delivers next (and how many times the size changed up to it), so a guest sizes its frame region
//! before receiving, and again on a resolution change. `flush` drains the pictures the
//! decoder still holds (reordering, frame threads) at the end of a stream, after which a new
//! stream may follow.
//!
//! Several packets in flight: a decoder in a worker process with frame threads takes a
//! packet without waiting for its pictures (`virtsoc_media::DecoderBackend::submit`, at
//! most [`virtsoc_media::MAX_IN_FLIGHT`] in the worker), so its threads go on decoding while
//! the guest writes the next packet and receives earlier pictures. `decode`'s
//! `frames_ready` counts the pictures back so far; `receive_frame` and `stream_info` wait
//! for the packets in flight when no picture is ready yet (`got` 0 means the packets fed so
//! far yield no more until more come, or `flush`).
//!
//! Device time: a decoder in a worker process decodes on its frame threads between the
//! guest's commands while this device's thread serves other guests, so the wall time of a
//! command says little of what it cost. Each command is charged the worker's CPU time since
//! the previous charge, as the kernel counts it, plus the command's own CPU time on the
//! device's thread (`share::DeviceClock::measured`): what the schedulers weigh guests by.
//!
//! Damage is reported per packet and per picture, never as success and never on the wrong
//! packet (`virtsoc_media::codec` tells how libavcodec's results are attributed):
//! - a packet that fails outright fails the `decode` that fed it with
//!   [`Status::DeviceError`] and the decoder's message as the reason, when that is known at
//!   once (one decoding thread); with frame threads a packet's result comes out `threads - 1`
//!   packets later, so the later `decode` (or the `flush`) succeeds - its own packet was
//!   taken - and reports `failed` (failures since the last report) with the last failed
//!   packet's `failed_pts` and `failed_seq` (packets are numbered from 1 per decoder). The
//!   decoder stays usable and later packets decode;
//! - a picture libavcodec decoded with errors concealed (a damaged slice, a missing
//!   reference, a stream joined before its recovery point) is delivered with
//!   `codec_frame_flag::CORRUPT` in `receive_frame`'s `flags`;
//! - a stream of odd width or height is delivered cropped to even (4:2:0): `stream_info`
//!   gives both the delivered size and the coded `picture_width` x `picture_height`, and
//!   `receive_frame` sets `codec_frame_flag::CROPPED`.
//!
//! Encoding: `encode` takes an NV12 or YUV420P region of the encoder's size and writes the
//! Annex-B packet(s) it produces into the `out` region (SPS and PPS in band on keyframes). If
//! they do not fit, the call fails with [`Status::OutOfRange`] and those packets are dropped
//! (the next keyframe resynchronises a decoder); size `out` generously (a raw frame's size is
//! always enough). With decoders in worker processes (`DeviceConfig::codec_worker`), each
//! encoder's libx264 runs in a worker of the same pool too (`virtsoc_media::ProcessEncoder`):
//! a crash or hang fails that encoder's calls with `DeviceError` and a reason (the guest
//! reopens), at one more copy of each frame (into memory shared with the worker).
//!
//! A guest served keeps the codec for turns of `state::TURN` (see there).
//! Every failure is a status for the guest; nothing here panics on guest input.

use std::sync::{Arc, Mutex, MutexGuard};
use virtsoc_ids::HandleId;

use virtsoc_devapi::codec::{self as api, Command};
use virtsoc_devapi::{codec_frame_flag, codec_kind};
use virtsoc_media::frame::MAX_DIMENSION;
use virtsoc_media::{
    CodecKind, DecoderBackend, DecoderPool, FfmpegDecoder, FfmpegEncoder, FrameError, FrameLayout,
    FrameMut, MediaError, PixelFormat,
};

/// The worker side of decoders in worker processes: enters the sandbox and serves one
/// decoder on stdin (see [`virtsoc_media::ProcessDecoder`]).
pub use virtsoc_media::codec::serve_decoder as serve_worker;
use virtsoc_proto::{wire::Format, Status};
use virtsoc_svm::{GuestId, RegionMeta};
pub use wait::DEFAULT_GRACE;

use super::{registry::DeviceConfig, Device, DeviceCtx, DeviceResult};
use crate::status::status_of;
use crate::{Limits, Result};
use state::{DecoderSession, Session, State};
use virtsoc_sync::LockExt;

/// Open decoders and encoders one guest may hold.
pub const MAX_SESSIONS_PER_GUEST: usize = 16;
/// Codec threads an encoder counts for against the daemon's thread limit.
pub const ENCODER_THREADS: usize = 1;
/// Decoded pictures a decoder keeps waiting for `receive_frame`; `decode` is Busy beyond.
pub const MAX_QUEUED_FRAMES: usize = 16;
/// Memory a decoder's or an encoder's worker process is charged against its guest's memory
/// limit (the media workers' one figure, [`virtsoc_media::WORKER_RESIDENT`]).
pub const WORKER_MEMORY: u64 = virtsoc_media::WORKER_RESIDENT;
/// Largest `threads` accepted by `open_decoder`.
pub const MAX_DECODE_THREADS: u64 = 16;
/// Largest frame rate accepted by `open_encoder`.
pub const MAX_ENCODE_FPS: u64 = 240;
/// Largest bit rate accepted by `open_encoder` (bits per second).
pub const MAX_ENCODE_BITRATE: u64 = 1 << 32;

/// The frame layout of an image region: [`Status::NotSupported`] for formats the media
/// backends do not handle, [`Status::BadArgument`] when the metadata does not describe a
/// valid frame that fits the region.
pub fn frame_layout(meta: &RegionMeta) -> std::result::Result<FrameLayout, Status> {
    let format = PixelFormat::try_from(meta.format)?;
    let layout = FrameLayout::with_stride(format, meta.width, meta.height, meta.stride)
        .map_err(|_| Status::BadArgument)?;
    if layout.size() as u64 > meta.size {
        return Err(Status::BadArgument);
    }
    Ok(layout)
}

/// The reason a guest sees for a media backend error (as short as the completion's room
/// allows: the decoder's own message without the generic prefixes).
fn media_reason(e: &MediaError) -> String {
    match e {
        MediaError::Decode(m) | MediaError::Encode(m) => m.trim_start_matches("ffmpeg-").into(),
        e => e.to_string(),
    }
}

/// The codec kind of a `codec_kind` number.
fn codec_of(kind: u64) -> Option<CodecKind> {
    match kind {
        codec_kind::H264 => Some(CodecKind::H264),
        codec_kind::HEVC => Some(CodecKind::Hevc),
        codec_kind::VP9 => Some(CodecKind::Vp9),
        codec_kind::AV1 => Some(CodecKind::Av1),
        _ => None,
    }
}

/// The codec device (a clone shares its sessions).
#[derive(Clone)]
pub struct Codec {
    /// Decoding threads when `open_decoder` asks for 0.
    default_threads: usize,
    /// libx264's preset for every encoder.
    preset: virtsoc_media::EncoderPreset,
    state: Arc<Mutex<State>>,
    backend: String,
    limits: Limits,
    /// Decoders run in worker processes of this pool (see `DeviceConfig::codec_worker`);
    /// `None`: in the daemon's process.
    workers: Option<std::sync::Arc<DecoderPool>>,
    /// Where commands that would wait for a decoder's worker wait ([`wait`]).
    waits: Arc<wait::Waits>,
    /// How long such a command waits on the codec's thread first
    /// (`DeviceConfig::codec_grace`).
    grace: std::time::Duration,
    /// Where opens and closes of sessions run ([`sessions`]).
    sessions: Arc<sessions::Sessions>,
}

impl Codec {
    /// Builds the device from the daemon's configuration, probing which decoders and which
    /// H.264 encoder the linked FFmpeg provides (for the backend description).
    pub fn new(cfg: &DeviceConfig) -> Result<Self> {
        virtsoc_media::quiet_ffmpeg_logs();
        let decoders: Vec<String> = CodecKind::ALL
            .into_iter()
            .filter_map(|k| {
                let d = FfmpegDecoder::new(k, PixelFormat::Yuv420p, 1).ok()?;
                let imp = d.name().trim_start_matches("ffmpeg-");
                Some(if imp == k.name() {
                    k.name().to_string()
                } else {
                    format!("{} ({imp})", k.name())
                })
            })
            .collect();
        let encoder = FfmpegEncoder::new_h264(64, 64, 30, 500_000)
            .map(|e| match e.name() {
                "libx264" => format!("h264 (libx264 {})", cfg.encoder_preset.name()),
                name => format!("h264 ({name})"),
            })
            .unwrap_or_else(|_| "none".into());
        let backend = format!(
            "libavcodec: decode {} / encode {encoder}",
            if decoders.is_empty() {
                "none".to_string()
            } else {
                decoders.join(", ")
            }
        );
        log::info!("codec: {backend}");
        Ok(Codec {
            default_threads: cfg.codec_threads.max(1),
            preset: cfg.encoder_preset,
            state: Arc::default(),
            waits: Arc::default(),
            grace: cfg.codec_grace,
            sessions: Arc::default(),
            backend: match &cfg.codec_worker {
                Some(_) => {
                    format!("{backend} (decoders and encoders in sandboxed worker processes)")
                }
                None => backend,
            },
            limits: Limits::default(),
            workers: cfg.codec_worker.as_ref().map(|program| {
                DecoderPool::new(
                    program,
                    &["--codec-worker".to_string()],
                    cfg.codec_worker_spares,
                )
            }),
        })
    }

    /// The same device within `limits` (codec sessions per guest and in all, codec threads).
    pub fn with_limits(mut self, limits: &Limits) -> Self {
        self.limits = limits.clone();
        self
    }

    /// The limits for `cx`'s guest: the daemon's, with the guest's policy's `codec_threads`
    /// and `codec_sessions` in place of `--limit-codec-threads-per-guest` and
    /// `--limit-codec-sessions` where it names them (a restore, with no command context,
    /// gets the daemon's).
    fn limits_for(&self, cx: Option<&DeviceCtx<'_>>) -> Limits {
        let mut limits = self.limits.clone();
        let policy = cx.and_then(|c| c.policy);
        if let Some(n) = policy.and_then(|p| p.codec_threads) {
            limits.codec_threads_per_guest = n as usize;
        }
        if let Some(n) = policy.and_then(|p| p.codec_sessions) {
            limits.codec_sessions_per_guest = n as usize;
        }
        limits
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock_or_recover()
    }

    /// `open_decoder` for a guest's command: refusals carry their reason, and a decoder in
    /// a worker process charges [`WORKER_MEMORY`] to the guest's memory limit while open.
    fn open_decoder_for(&self, cx: &DeviceCtx<'_>, c: api::OpenDecoder) -> DeviceResult {
        // Before the quotas: they add the threads asked for to those held.
        let threads = self.decoder_threads(c.threads).ok_or_else(|| {
            let why = format!(
                "{} decoder threads asked for, at most {MAX_DECODE_THREADS}",
                c.threads
            );
            cx.fail(Status::BadArgument, why)
        })?;
        let charge = self.worker_charge(cx, "a decoder")?;
        let limits = self.limits_for(Some(cx));
        if let Some((status, why)) = self.state().refusal(&limits, cx.guest, threads) {
            return Err(cx.fail(status, why));
        }
        let handle = self.open_decoder_at(cx.guest, c, None, Some(cx))?;
        if let Some(charge) = charge {
            self.state().attach_charge(&(cx.guest, handle), charge);
        }
        Ok(api::OpenDecoderReply { handle }.to_values())
    }

    /// The threads of a decoder for which a guest asked `asked` (0: the daemon's default);
    /// `None` past [`MAX_DECODE_THREADS`].
    fn decoder_threads(&self, asked: u64) -> Option<usize> {
        match asked {
            0 => Some(self.default_threads),
            n if n <= MAX_DECODE_THREADS => Some(n as usize),
            _ => None,
        }
    }

    /// What a new session's worker process (`what`'s) charges to `cx`'s guest's memory limit
    /// while open: [`WORKER_MEMORY`] with workers, nothing in process; `OutOfMemory` with the
    /// reason when the guest would pass its limit.
    fn worker_charge(
        &self,
        cx: &DeviceCtx<'_>,
        what: &str,
    ) -> std::result::Result<Option<virtsoc_svm::MemoryCharge>, Status> {
        if self.workers.is_none() {
            return Ok(None);
        }
        let charge = cx.svm.charge(cx.guest, WORKER_MEMORY).map_err(|_| {
            cx.fail(
                Status::OutOfMemory,
                format!(
                    "{what}'s worker process counts {} MiB against the guest's memory limit, \
                     which it would pass",
                    WORKER_MEMORY >> 20
                ),
            )
        })?;
        Ok(Some(charge))
    }

    /// `open_encoder` for a guest's command: an encoder in a worker process charges
    /// [`WORKER_MEMORY`] to the guest's memory limit while open, as a decoder does.
    fn open_encoder_for(&self, cx: &DeviceCtx<'_>, c: api::OpenEncoder) -> DeviceResult {
        let charge = self.worker_charge(cx, "an encoder")?;
        let handle = self.open_encoder_at(cx.guest, c, None, Some(cx))?;
        if let Some(charge) = charge {
            self.state().attach_charge(&(cx.guest, handle), charge);
        }
        Ok(api::OpenEncoderReply { handle }.to_values())
    }

    /// Opens a decoder for `guest` (under handle `at`: a restore); a failure to open one
    /// gives its reason to `cx`'s guest when there is one.
    fn open_decoder_at(
        &self,
        guest: GuestId,
        c: api::OpenDecoder,
        at: Option<HandleId>,
        cx: Option<&DeviceCtx<'_>>,
    ) -> std::result::Result<HandleId, Status> {
        let kind = codec_of(c.kind).ok_or(Status::BadArgument)?;
        let (out, format) = match u32::try_from(c.format).ok().and_then(Format::from_u32) {
            Some(Format::Nv12) => (PixelFormat::Nv12, Format::Nv12),
            Some(Format::Yuv420p) => (PixelFormat::Yuv420p, Format::Yuv420p),
            Some(_) => return Err(Status::NotSupported),
            None => return Err(Status::BadArgument),
        };
        let threads = self.decoder_threads(c.threads).ok_or(Status::BadArgument)?;
        // Check the quotas before paying for a decoder (and again when adding it: the lock
        // is not held while its worker starts, `sessions.rs`).
        self.state().admit(&self.limits_for(cx), guest, threads)?;
        let decoder = self.new_decoder(kind, out, threads).map_err(|e| {
            log::info!(
                "codec: guest {guest}: cannot open {} decoder: {e}",
                kind.name()
            );
            let st = status_of(&e);
            match cx {
                Some(cx) => cx.fail(st, format!("cannot open the {} decoder: {e}", kind.name())),
                None => st,
            }
        })?;
        let mut st = self.state();
        let handle = st.open(
            &self.limits_for(cx),
            guest,
            (
                Session::Decoder(DecoderSession::new(decoder, format)),
                replay::Opened::Decoder {
                    kind: c.kind,
                    format: c.format,
                    threads: c.threads,
                },
            ),
            threads,
            at,
        )?;
        self.ensure_reaper(&mut st);
        log::info!(
            "codec: guest {guest} opened {} decoder {handle} ({out:?}, {threads} threads)",
            kind.name()
        );
        Ok(handle)
    }

    fn decode(&self, cx: &DeviceCtx<'_>, c: api::Decode) -> DeviceResult {
        // A packet the codec's waiter path sent (`wait.rs`), checked then: its answer.
        let started = (self.state().decoder(cx.guest, c.handle)).is_ok_and(|s| s.decoder.started());
        let len = if started { 0 } else { Self::packet_len(cx, c)? };
        if !started {
            self.revive(cx, c.handle)?;
        }
        let mut st = self.state();
        let s = st.decoder(cx.guest, c.handle)?;
        let r = if started {
            s.decoder.finish()
        } else {
            if s.full() {
                return Err(Status::Busy);
            }
            let decoder = &mut s.decoder;
            cx.with_source(c.bitstream, |bytes| match bytes.get(..len) {
                Some(packet) => decoder.submit(packet, c.pts as i64),
                None => Err(MediaError::Frame(FrameError::BufferTooSmall {
                    needed: len,
                    got: bytes.len(),
                })),
            })?
        };
        s.note_failures();
        match r {
            Ok(frames) => {
                let [frames_ready, failed, failed_pts, failed_seq] = s.report(frames);
                Ok(api::DecodeReply {
                    frames_ready,
                    failed,
                    failed_pts,
                    failed_seq,
                }
                .to_values())
            }
            Err(MediaError::Frame(FrameError::BufferTooSmall { .. })) => Err(Status::OutOfRange),
            Err(e) => {
                log::debug!("codec: guest {}: decoder {}: {e}", cx.guest, c.handle);
                Err(cx.fail(status_of(&e), media_reason(&e)))
            }
        }
    }

    /// The length of `decode`'s packet, checked against its bitstream region.
    fn packet_len(cx: &DeviceCtx<'_>, c: api::Decode) -> std::result::Result<usize, Status> {
        let meta = cx.meta(c.bitstream)?;
        if c.len > meta.size {
            let why = format!("len {} > bitstream's {} bytes", c.len, meta.size);
            return Err(cx.fail(Status::OutOfRange, why));
        }
        usize::try_from(c.len).map_err(|_| Status::OutOfRange)
    }

    fn receive_frame(&self, cx: &DeviceCtx<'_>, c: api::ReceiveFrame) -> DeviceResult {
        let meta = cx.meta(c.frame)?;
        let mut st = self.state();
        let s = st.decoder(cx.guest, c.handle)?;
        let layout = frame_layout(&meta)?;
        if !layout.format.is_yuv() {
            // Decoders only produce NV12 and YUV420P (the ISP converts).
            return Err(Status::NotSupported);
        }
        if let Err(e) = s.settle() {
            return Err(cx.fail(status_of(&e), media_reason(&e)));
        }
        let Some(front) = s.ready.front() else {
            return Ok(api::ReceiveFrameReply::default().to_values());
        };
        let fl = front.layout;
        if (fl.format, fl.width, fl.height) != (layout.format, layout.width, layout.height) {
            log::debug!(
                "codec: guest {}: decoder {} has a {:?} {}x{} picture, region {} is {:?} {}x{}",
                cx.guest,
                c.handle,
                fl.format,
                fl.width,
                fl.height,
                c.frame,
                layout.format,
                layout.width,
                layout.height
            );
            let why = format!(
                "picture {:?} {}x{}, region {:?} {}x{}",
                fl.format, fl.width, fl.height, layout.format, layout.width, layout.height
            );
            return Err(cx.fail(Status::BadArgument, why));
        }
        // In the worker's buffer: lent as the region's replica, no copy.
        if !s.lent.lend(cx, c.frame, (layout, &meta), front)? {
            let t0 = std::time::Instant::now();
            cx.with_region(c.frame, |bytes| {
                FrameMut::new(layout, bytes)
                    .map_err(MediaError::from)
                    .and_then(|dst| front.copy_into(dst))
            })?
            .map_err(|e| status_of(&e))?;
            // On the ledger: this copy into the region (out of libavcodec's buffers for a
            // held picture, or out of the worker's buffer libavcodec decoded it into), and
            // for a picture the decoder had already copied out of its frame pool, that copy
            // too (both in the codec's memory).
            let n = layout.size();
            cx.count_copy(n, t0);
            if !front.uncopied() {
                cx.count_copy(n, std::time::Instant::now());
            }
        }
        let f = s.pop_ready().ok_or(Status::Internal)?;
        let flags = if f.corrupt {
            codec_frame_flag::CORRUPT
        } else {
            0
        } | if f.cropped() {
            codec_frame_flag::CROPPED
        } else {
            0
        };
        let reply = api::ReceiveFrameReply {
            got: 1,
            pts: f.pts as u64,
            width: f.layout.width as u64,
            height: f.layout.height as u64,
            flags,
        };
        s.decoder.recycle(f);
        Ok(reply.to_values())
    }

    fn flush(&self, guest: GuestId, c: api::Flush) -> DeviceResult {
        let r = self.state().decoder(guest, c.handle)?.flush();
        r.map(|r| r.to_values()).map_err(|e| {
            log::debug!("codec: guest {guest}: decoder {}: flush: {e}", c.handle);
            status_of(&e)
        })
    }

    fn stream_info(&self, guest: GuestId, c: api::StreamInfo) -> DeviceResult {
        let mut st = self.state();
        let s = st.decoder(guest, c.handle)?;
        // The next picture's size: wait for it when it is still in the decoder.
        s.settle().map_err(|e| status_of(&e))?;
        Ok(s.stream_info().to_values())
    }

    fn close(&self, guest: GuestId, c: api::Close) -> DeviceResult {
        let removed = self.state().remove(&(guest, c.handle));
        match removed {
            Some(s) => {
                // Drop outside the lock: a frame-threaded decoder joins its threads.
                drop(s);
                log::debug!("codec: guest {guest} closed {}", c.handle);
                Ok([0; 6])
            }
            None => Err(Status::BadArgument),
        }
    }
}

impl Device for Codec {
    fn name(&self) -> &str {
        "codec"
    }

    fn backend(&self) -> String {
        self.backend.clone()
    }

    fn answers_apart(&self) -> bool {
        // The waiter and the session thread (`wait.rs`, `sessions.rs`).
        true
    }

    fn reads_host_memory(&self) -> bool {
        // libavcodec runs on the CPU: it reads bitstreams and frames where they are current.
        true
    }

    fn turn(&self) -> std::time::Duration {
        state::TURN
    }

    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult {
        let cpu0 = virtsoc_control::budget::thread_cpu();
        let (r, decoder) = match Command::decode(args)? {
            Command::OpenDecoder(c) => (self.open_decoder_for(cx, c), None),
            Command::Decode(c) => (self.decode(cx, c), Some(c.handle)),
            Command::ReceiveFrame(c) => (self.receive_frame(cx, c), Some(c.handle)),
            Command::Flush(c) => (self.flush(cx.guest, c), Some(c.handle)),
            Command::OpenEncoder(c) => (self.open_encoder_for(cx, c), None),
            Command::Encode(c) => (self.encode(cx, c), None),
            Command::Close(c) => (self.close(cx.guest, c), None),
            Command::StreamInfo(c) => (self.stream_info(cx.guest, c), Some(c.handle)),
        };
        if let Some(h) = decoder {
            let own = virtsoc_control::budget::thread_cpu().saturating_sub(cpu0);
            self.state().charge(cx, h, own);
        }
        r
    }

    fn execute_async(&self, cx: &DeviceCtx<'_>, args: &[u64; 6], reply: super::Reply) {
        wait::execute_async(self, cx, args, reply);
    }

    fn export_guest(&self, guest: GuestId) -> Option<serde_json::Value> {
        self.export(guest)
    }

    fn import_guest(
        &self,
        guest: GuestId,
        record: &serde_json::Value,
    ) -> std::result::Result<(), super::RecordError> {
        self.import(guest, record)
    }

    fn guest_gone(&self, guest: GuestId) {
        let gone: Vec<Session> = {
            let mut st = self.state();
            st.last_handle.remove(&guest);
            let keys: Vec<_> = st
                .sessions
                .keys()
                .filter(|(g, _)| *g == guest)
                .copied()
                .collect();
            keys.iter().filter_map(|k| st.remove(k)).collect()
        };
        if !gone.is_empty() {
            log::debug!("codec: guest {guest} gone, {} sessions closed", gone.len());
        }
    }
}

mod encoding;
pub mod lend;
mod reap;
mod replay;
mod sessions;
mod state;
#[cfg(test)]
mod tests;
mod wait;
