//! The codec device's sessions: open decoders (with the pictures waiting for
//! `receive_frame` and the failures waiting to be reported) and encoders, by guest and
//! handle, and the quotas checked when one opens.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};
use virtsoc_ids::HandleId;
use virtsoc_svm::GuestId;

use virtsoc_devapi::codec as api;
use virtsoc_media::{DecodedFrame, DecoderBackend, EncoderBackend, PacketError};
use virtsoc_proto::wire::Format;
use virtsoc_proto::Status;

use super::replay;
use crate::device::share::DeviceClock;
use crate::device::DeviceCtx;
use crate::Limits;

/// How much of its decoders' time a guest served may use in a row before the codec's
/// scheduler chooses again ([`crate::device::Device::turn`]). A decoder decodes slower after
/// other guests' decoders ran (its reference pictures and tables evicted from the caches:
/// with 8 decoders taking turns one picture each, 20-50% longer per picture than alone,
/// `decode_probe`), so a guest's queued commands are served several in a row: up to about
/// ten 640x360 pictures (a decode and a receive each), two 1080p ones. A guest is about a
/// turn ahead of its fair share at most, and another guest's command may wait a turn. A
/// command that goes to the codec's waiter (a one-thread decoder's `decode` with other
/// guests on the codec, at once since stop 53: `wait::DEFAULT_GRACE`) ends its guest's
/// turn: its queue waits for the answer, and the next guest's decode starts beside it on
/// another core.
pub(super) const TURN: Duration = Duration::from_millis(4);

/// An open decoder and the pictures waiting for `receive_frame`.
pub(super) struct DecoderSession {
    pub(super) decoder: Box<dyn DecoderBackend>,
    pub(super) ready: VecDeque<DecodedFrame>,
    /// The output format chosen at `open_decoder` (for `stream_info`).
    pub(super) format: Format,
    /// Size of the last decoded picture (delivered, as coded), `None` before the first.
    pub(super) last_size: Option<((u32, u32), (u32, u32))>,
    /// Size changes between consecutive decoded pictures.
    pub(super) changes: u64,
    /// For each picture in `ready`, the size changes up to and including it (what
    /// `stream_info` tells while it is the next one).
    changes_at: VecDeque<u64>,
    /// Packet failures not yet reported to the guest: the count and the last one.
    pub(super) unreported: Option<(u64, PacketError)>,
    /// The pictures lent as regions' replicas.
    pub(super) lent: super::lend::Lent,
    /// The device time of this decoder's commands, from its worker's CPU time.
    clock: DeviceClock,
    /// What reading the answers that had arrived met ([`gather`](Self::gather)), for the
    /// next [`settle`](Self::settle) to report.
    gathered_error: Option<Box<virtsoc_media::MediaError>>,
}

impl DecoderSession {
    /// A session around a freshly opened decoder writing `format`.
    pub(super) fn new(mut decoder: Box<dyn DecoderBackend>, format: Format) -> Self {
        // `receive_frame` copies each picture into a region: straight out of libavcodec's
        // buffers, once.
        decoder.hold_pictures(true);
        let clock = DeviceClock::since(decoder.cpu_ns().unwrap_or(0));
        DecoderSession {
            decoder,
            ready: VecDeque::new(),
            format,
            last_size: None,
            changes: 0,
            changes_at: VecDeque::new(),
            unreported: None,
            lent: Default::default(),
            clock,
            gathered_error: None,
        }
    }

    /// `flush`: drains the decoder; the pictures it still held join the queue. A flush the
    /// codec's waiter path sent (`wait.rs`): its answer.
    pub(super) fn flush(&mut self) -> virtsoc_media::Result<api::FlushReply> {
        let r = match self.decoder.started() {
            true => self.decoder.finish(),
            false => self.decoder.flush(),
        };
        self.note_failures();
        let [frames_ready, failed, failed_pts, failed_seq] = self.report(r?);
        Ok(api::FlushReply {
            frames_ready,
            failed,
            failed_pts,
            failed_seq,
        })
    }

    /// Queues the pictures a `decode` or `flush` got back; what its answer reports: the
    /// pictures ready, and the failures not reported yet (count, last pts and sequence).
    pub(super) fn report(&mut self, frames: Vec<DecodedFrame>) -> [u64; 4] {
        self.queue(frames);
        let (failed, failed_pts, failed_seq) = self.take_unreported();
        [self.ready.len() as u64, failed, failed_pts, failed_seq]
    }

    /// Whether `decode` must answer Busy: the pictures waiting for `receive_frame` and
    /// the packets still in the decoder's worker reach [`MAX_QUEUED_FRAMES`](super::MAX_QUEUED_FRAMES).
    pub(super) fn full(&self) -> bool {
        self.ready.len() + self.decoder.in_flight() >= super::MAX_QUEUED_FRAMES
    }

    /// Waits for the packets in flight while no picture is ready and some are (so the
    /// next picture's size and the picture itself are known), queueing what comes back.
    pub(super) fn settle(&mut self) -> virtsoc_media::Result<()> {
        if let Some(e) = self.gathered_error.take() {
            return Err(*e);
        }
        while self.ready.is_empty() && self.decoder.in_flight() > 0 {
            let frames = self.decoder.collect(true);
            self.note_failures();
            self.queue(frames?);
        }
        Ok(())
    }

    /// Queues the pictures of the answers that have arrived, without waiting for others (an
    /// error is kept for `settle`); true when `settle` would still wait for the decoder: no
    /// picture ready, packets in flight.
    pub(super) fn gather(&mut self) -> bool {
        if self.gathered_error.is_none() && self.ready.is_empty() {
            let frames = self.decoder.collect(false);
            self.note_failures();
            match frames {
                Ok(f) => self.queue(f),
                Err(e) => self.gathered_error = Some(Box::new(e)),
            }
        }
        self.gathered_error.is_none() && self.ready.is_empty() && self.decoder.in_flight() > 0
    }

    /// Queues decoded pictures for `receive_frame`, noting size changes for `stream_info`.
    pub(super) fn queue(&mut self, frames: Vec<DecodedFrame>) {
        for f in frames {
            let size = ((f.layout.width, f.layout.height), f.picture_size);
            if self.last_size.is_some_and(|s| s != size) {
                self.changes += 1;
            }
            self.last_size = Some(size);
            self.ready.push_back(f);
            self.changes_at.push_back(self.changes);
        }
    }

    /// Takes the next picture for `receive_frame`.
    pub(super) fn pop_ready(&mut self) -> Option<DecodedFrame> {
        self.changes_at.pop_front();
        self.ready.pop_front()
    }

    /// Collects the failures the decoder reported for earlier packets.
    pub(super) fn note_failures(&mut self) {
        for f in self.decoder.take_failures() {
            let n = self.unreported.as_ref().map_or(0, |(n, _)| *n);
            self.unreported = Some((n + 1, f));
        }
    }

    /// The failures to report with a successful `decode` or `flush`, as (count, pts, seq)
    /// of the last one; none reported: zeros.
    pub(super) fn take_unreported(&mut self) -> (u64, u64, u64) {
        match self.unreported.take() {
            Some((n, f)) => (n, f.pts as u64, f.seq),
            None => (0, 0, 0),
        }
    }

    /// `stream_info`'s answer: the next picture's size (else the last's), format, the size
    /// changes up to it (else all of them), and its size as the stream codes it. (Counted up
    /// to the next picture, not over every picture decoded: with packets in flight the
    /// decoder may already have pictures of a new size waiting behind it.)
    pub(super) fn stream_info(&self) -> api::StreamInfoReply {
        let ((width, height), (pw, ph)) = match self.ready.front() {
            Some(f) => ((f.layout.width, f.layout.height), f.picture_size),
            None => self.last_size.unwrap_or(((0, 0), (0, 0))),
        };
        api::StreamInfoReply {
            width: u64::from(width),
            height: u64::from(height),
            format: self.format as u64,
            changes: self.changes_at.front().copied().unwrap_or(self.changes),
            picture_width: u64::from(pw),
            picture_height: u64::from(ph),
        }
    }
}

/// An open encoder.
pub(super) struct EncoderSession {
    pub(super) encoder: Box<dyn EncoderBackend>,
    pub(super) width: u32,
    pub(super) height: u32,
}

/// An open session. A decoder's is the larger by some 200 bytes; sessions are few (bounded
/// by the limits) and live in one map, so neither is boxed.
#[allow(clippy::large_enum_variant)]
pub(super) enum Session {
    Decoder(DecoderSession),
    Encoder(EncoderSession),
}

/// An open session and the codec threads it counts for.
pub(super) struct Open {
    pub(super) session: Session,
    pub(super) threads: usize,
    /// The memory of its worker process, charged to the guest (none in process).
    pub(super) charge: Option<virtsoc_svm::MemoryCharge>,
    /// The command that opened it (replayed by a restore, see [`replay`]).
    pub(super) record: replay::Opened,
    /// When a command last used it.
    pub(super) last_used: Instant,
    /// Its backend was closed idle ([`super::reap`]): its threads are not counted until a
    /// `decode` reopens it.
    pub(super) reaped: bool,
}

#[derive(Default)]
pub(super) struct State {
    /// Sessions by (guest, handle).
    pub(super) sessions: HashMap<(GuestId, HandleId), Open>,
    /// Codec threads of all open sessions.
    pub(super) threads: usize,
    /// Last handle given to each guest.
    pub(super) last_handle: HashMap<GuestId, u64>,
    /// The reaper thread runs ([`super::reap`]).
    pub(super) reaper: bool,
}

impl State {
    /// Whether a guest other than `guest` has opened a session on the codec (else a command
    /// of `guest`'s holds nobody while it waits on the codec's thread: `wait.rs`).
    pub(super) fn others_than(&self, guest: GuestId) -> bool {
        self.last_handle.keys().any(|g| *g != guest)
    }

    /// Codec threads of `guest`'s open sessions.
    pub(super) fn guest_threads(&self, guest: GuestId) -> usize {
        self.sessions
            .iter()
            .filter(|((g, _), _)| *g == guest)
            .map(|(_, o)| if o.reaped { 0 } else { o.threads })
            .sum()
    }

    /// Whether `guest` may open one more session of `threads` threads: `OutOfMemory` past its
    /// own session quota, `Busy` past its share of the codec threads (so no guest takes
    /// every guest's) or past the daemon's capacity (every guest's sessions and threads
    /// together).
    pub(super) fn admit(
        &self,
        limits: &Limits,
        guest: GuestId,
        threads: usize,
    ) -> std::result::Result<(), Status> {
        self.refusal(limits, guest, threads)
            .map_or(Ok(()), |(status, _)| Err(status))
    }

    /// Why [`admit`](Self::admit) refuses, if it does.
    pub(super) fn refusal(
        &self,
        limits: &Limits,
        guest: GuestId,
        threads: usize,
    ) -> Option<(Status, String)> {
        let held = self.sessions.keys().filter(|(g, _)| *g == guest).count();
        if held >= limits.codec_sessions_per_guest {
            return Some((
                Status::OutOfMemory,
                format!(
                    "the guest holds {held} codec sessions, its most ({})",
                    limits.codec_sessions_per_guest
                ),
            ));
        }
        let mine = self.guest_threads(guest);
        if mine.saturating_add(threads) > limits.codec_threads_per_guest {
            return Some((
                Status::Busy,
                format!(
                    "{threads} more codec threads would pass the guest's share of {} (it \
                     holds {mine}): close a session or ask for fewer threads",
                    limits.codec_threads_per_guest
                ),
            ));
        }
        if self.sessions.len() >= limits.codec_sessions
            || self.threads.saturating_add(threads) > limits.codec_threads
        {
            return Some((
                Status::Busy,
                format!(
                    "the codec is at capacity ({} sessions, {} of {} threads): retry later",
                    self.sessions.len(),
                    self.threads,
                    limits.codec_threads
                ),
            ));
        }
        None
    }

    /// Opens a session under the next handle, or under handle `at` (a restore).
    pub(super) fn open(
        &mut self,
        limits: &Limits,
        guest: GuestId,
        (s, record): (Session, replay::Opened),
        threads: usize,
        at: Option<HandleId>,
    ) -> std::result::Result<HandleId, Status> {
        self.admit(limits, guest, threads)?;
        let last = self.last_handle.entry(guest).or_insert(0);
        let handle = match at {
            Some(h) if h.0 == 0 || self.sessions.contains_key(&(guest, h)) => {
                return Err(Status::BadArgument)
            }
            Some(h) => {
                *last = (*last).max(h.0);
                h
            }
            None => {
                *last += 1;
                HandleId(*last)
            }
        };
        self.threads += threads;
        self.sessions.insert(
            (guest, handle),
            Open {
                session: s,
                threads,
                charge: None,
                record,
                last_used: Instant::now(),
                reaped: false,
            },
        );
        Ok(handle)
    }

    /// Charges session `key`'s worker memory to its guest for as long as it is open.
    pub(super) fn attach_charge(
        &mut self,
        key: &(GuestId, HandleId),
        charge: virtsoc_svm::MemoryCharge,
    ) {
        if let Some(o) = self.sessions.get_mut(key) {
            o.charge = Some(charge);
        }
    }

    pub(super) fn remove(&mut self, key: &(GuestId, HandleId)) -> Option<Session> {
        let o = self.sessions.remove(key)?;
        if !o.reaped {
            self.threads -= o.threads;
        }
        Some(o.session)
    }

    /// `guest`'s decoder `handle`, marked used now.
    pub(super) fn decoder(
        &mut self,
        guest: GuestId,
        handle: HandleId,
    ) -> std::result::Result<&mut DecoderSession, Status> {
        match self.sessions.get_mut(&(guest, handle)) {
            Some(Open {
                session: Session::Decoder(d),
                last_used,
                ..
            }) => {
                *last_used = Instant::now();
                Ok(d)
            }
            _ => Err(Status::BadArgument),
        }
    }

    /// Charges the command of `guest` on its decoder `handle`, which took `own` CPU time on
    /// the device thread, with that and what the decoder's worker used since its previous
    /// charge (its frame threads go on decoding between the guest's commands, on the host's
    /// CPUs, while the device thread serves other guests; [`DeviceClock::measured`]): the
    /// device time `cx` passes on with the answer. A decoder on the device's own threads, or
    /// a handle that is gone, is charged the wall time as every command is.
    pub(super) fn charge(&mut self, cx: &DeviceCtx<'_>, handle: HandleId, own: Duration) {
        if let Some(Open {
            session: Session::Decoder(d),
            ..
        }) = self.sessions.get_mut(&(cx.guest, handle))
        {
            if let Some(cpu) = d.decoder.cpu_ns() {
                cx.busy_for(d.clock.measured(cpu, own));
            }
        }
    }

    pub(super) fn encoder(
        &mut self,
        guest: GuestId,
        handle: HandleId,
    ) -> std::result::Result<&mut EncoderSession, Status> {
        match self
            .sessions
            .get_mut(&(guest, handle))
            .map(|o| &mut o.session)
        {
            Some(Session::Encoder(e)) => Ok(e),
            _ => Err(Status::BadArgument),
        }
    }
}
