//! Decoders in worker processes ([`crate::worker`]): [`ProcessDecoder`] implements
//! [`DecoderBackend`] by sending each call to a worker process that runs an
//! [`FfmpegDecoder`] ([`serve_decoder`]), so a crash or a hang of libavcodec ends that
//! worker only: the decoder reports it as a decode error on that call and every later one
//! (the guest reopens), and the process that owns it goes on.
//!
//! libavcodec decodes each 4:2:0 picture straight into a sealed memfd the worker shares with
//! the parent ([`direct`], [`Slots`] / [`Mapped`]; other pictures are copied or converted
//! into one), which maps it read-only: the parent copies it into the guest's region, or lends
//! it as the region's contents where it lies ([`DecodedFrame::lend`]). Every picture in an
//! answer must lie within its buffer. Packets go to the worker through a packet ring
//! ([`crate::worker::ring`]) where it has room, else in the call. With frame threads
//! several packets are in flight ([`MAX_IN_FLIGHT`]): see [`ProcessDecoder`].

mod answer;
pub(crate) mod direct;
mod encode;
mod planes;

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

pub use crate::worker::sandbox;
pub(crate) use crate::worker::shared::SharedPicture;
pub use crate::worker::{WorkerPool, CALL_DEADLINE, DEFAULT_SPARE};
pub use answer::check_worker_answer;
pub use encode::{check_encoder_answer, ProcessEncoder};
pub(crate) use planes::{copy_planes, read_planes};

/// The pool decoder workers come from (any [`WorkerPool`] of a program that runs
/// [`serve_decoder`]).
pub type DecoderPool = WorkerPool;

use super::{CodecKind, DecodedFrame, DecoderBackend, FfmpegDecoder, PacketError};
use crate::error::{MediaError, Result};
use crate::frame::{FrameLayout, PixelFormat};
use crate::worker::ring::{PacketRing, RingView};
use crate::worker::shared::{self, Mapped, ReleasePage, SharedSlots};
use crate::worker::wire::{bad, In, Out, MAX_TEXT};
use crate::worker::{io_error, serve, WorkerProcess};

/// Most pictures or failures one answer may carry.
const MAX_ITEMS: u32 = 64;
/// Largest packet sent to a worker.
const MAX_PACKET: usize = 64 << 20;

const OPEN: u8 = b'O';
const DECODE: u8 = b'D';
const FLUSH: u8 = b'F';
/// A decode call whose packet lies in the [packet ring](crate::worker::ring).
const RING: u8 = b'R';

fn codec_code(k: CodecKind) -> u8 {
    CodecKind::ALL.iter().position(|c| *c == k).unwrap_or(0) as u8
}

fn format_code(f: PixelFormat) -> u8 {
    match f {
        PixelFormat::Nv12 => 0,
        _ => 1,
    }
}

fn format_of(code: u8) -> Option<PixelFormat> {
    match code {
        0 => Some(PixelFormat::Nv12),
        1 => Some(PixelFormat::Yuv420p),
        _ => None,
    }
}

/// Bytes of the largest picture a decoder delivers (4:2:0).
fn max_picture_bytes() -> usize {
    super::decoder::MAX_DECODE_PIXELS as usize * 3 / 2
}

/// Largest shared buffer the parent maps: the largest picture as libavcodec decodes it
/// (rows and lines padded to its alignment), with room.
fn max_buffer_bytes() -> usize {
    max_picture_bytes() * 2
}

/// Largest answer: `MAX_ITEMS` pictures of the largest size, with room for the rest.
fn max_answer() -> usize {
    (max_picture_bytes() + 64) * 4 + (MAX_TEXT as usize + 32) * (2 * MAX_ITEMS as usize + 2)
}

/// Packets a decoder with frame threads keeps in flight at most ([`DecoderBackend::submit`]):
/// sent to its worker, their answers not read yet. The worker reads the next packet as soon
/// as it has answered one, so its frame threads never wait for the parent's round trip.
pub const MAX_IN_FLIGHT: usize = 4;

/// A call [`start`](DecoderBackend::start)ed or
/// [`start_flush`](DecoderBackend::start_flush)ed whose answer
/// [`finish`](DecoderBackend::finish) reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Started {
    Nothing,
    /// A packet (one decoding thread: the only one in flight).
    Packet,
    /// The end of stream, sent behind the packets in flight.
    Flush,
}

/// A decoder whose libavcodec runs in a worker process.
///
/// With frame threads, [`submit`](DecoderBackend::submit) sends a packet without waiting for
/// its answer (at most [`MAX_IN_FLIGHT`] in flight); answers are read in order, by
/// [`collect`](DecoderBackend::collect) or when a call needs them. Should the socket have no
/// room for a packet (a worker writing an answer nobody reads yet), the answers due are read
/// first, so neither side waits for the other forever.
pub struct ProcessDecoder {
    worker: WorkerProcess,
    layout: Option<FrameLayout>,
    failures: Vec<PacketError>,
    /// The worker's picture buffers this side has mapped.
    mapped: Mapped,
    /// Packets sent whose answers are not read yet, oldest first: (sequence number, pts).
    in_flight: VecDeque<(u64, i64)>,
    /// Packets sent so far (numbered from 1, as the worker's decoder numbers them).
    seq: u64,
    /// Most packets in flight: 0 (one decoding thread) answers each packet within its call,
    /// so a packet that fails outright fails its own call.
    max_in_flight: usize,
    /// Pictures read from answers while making room for a packet, not handed out yet.
    early: Vec<DecodedFrame>,
    /// What was sent whose answer [`finish`](DecoderBackend::finish) reads.
    started: Started,
    /// Where packets go to the worker (`None`: each in its call).
    ring: Option<PacketRing>,
}

impl ProcessDecoder {
    /// Takes a worker from `pool` and opens a decoder of `codec` writing `out` with
    /// `threads` threads in it (in a worker started now when the waiting one had died).
    pub fn open(
        pool: &Arc<DecoderPool>,
        codec: CodecKind,
        out: PixelFormat,
        threads: usize,
    ) -> Result<Self> {
        match Self::open_on(pool.take()?, codec, out, threads) {
            Err(MediaError::Decode(why)) => {
                log::info!("{why}; starting another worker");
                Self::open_on(pool.start()?, codec, out, threads)
            }
            r => r,
        }
    }

    fn open_on(
        started: (std::process::Child, std::os::unix::net::UnixStream),
        codec: CodecKind,
        out: PixelFormat,
        threads: usize,
    ) -> Result<Self> {
        let worker = WorkerProcess::new(
            started,
            format!("worker-{}", codec.name()),
            "decoder process",
            "reopen the decoder",
            MediaError::Decode,
        )?;
        // Where this side counts the pictures it is done with; the worker maps it.
        let page = Arc::new(ReleasePage::new()?);
        let ring = PacketRing::new()?;
        let mut d = ProcessDecoder {
            worker,
            layout: None,
            failures: Vec::new(),
            mapped: Mapped::with_page(max_buffer_bytes(), page.clone()),
            in_flight: VecDeque::new(),
            seq: 0,
            max_in_flight: if threads > 1 { MAX_IN_FLIGHT } else { 0 },
            early: Vec::new(),
            started: Started::Nothing,
            ring: None,
        };
        let mut m = Out::default();
        m.u8(OPEN)
            .u8(codec_code(codec))
            .u8(format_code(out))
            .u32(threads.min(64) as u32);
        let mut answer = d.call(&m, &[page.fd(), ring.fd()])?;
        match answer.u8()? {
            0 => {
                d.ring = Some(ring);
                d.worker.name = format!("worker-{}", answer.text()?.trim_start_matches("ffmpeg-"));
                Ok(d)
            }
            _ => Err(MediaError::Unsupported(answer.text()?)),
        }
    }

    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.worker.pid()
    }

    /// Sends `m` (with `fds`) and returns the answer; on any failure the worker is ended and
    /// the decoder is dead from then on.
    fn call(&mut self, m: &Out, fds: &[BorrowedFd<'_>]) -> Result<In> {
        let r = self.worker.call(m, fds, max_answer());
        if r.is_err() {
            // The worker is gone: nothing of it stays mapped but the pictures still held.
            self.mapped.clear();
        }
        r
    }

    fn end(&mut self, what: &str) -> MediaError {
        self.mapped.clear();
        self.in_flight.clear();
        self.worker.end(what)
    }

    /// The inodes of the worker's buffers this side has mapped (for tests: after the worker
    /// is gone, none).
    #[doc(hidden)]
    pub fn mapped_inodes(&self) -> Vec<u64> {
        self.mapped.inodes()
    }

    /// Packets in the packet ring that libavcodec has not let go of yet, as far as this side
    /// knows (for tests).
    #[doc(hidden)]
    pub fn packets_in_ring(&self) -> usize {
        self.ring.as_ref().map_or(0, PacketRing::held)
    }

    /// Sends every later packet in its call, not through the packet ring (for tests of
    /// that path).
    #[doc(hidden)]
    pub fn packets_in_calls(&mut self) {
        self.ring = None;
    }

    /// The start of a decode or flush call: the picture buffers this side is done with.
    fn call_head(&mut self, call: u8) -> Out {
        let released = self.mapped.take_released();
        let mut m = Out::default();
        m.u8(call).u32(released.len() as u32);
        for id in released {
            m.u32(id);
        }
        m
    }

    /// Sends a flush call and reads its answer, checking every picture.
    fn flush_call(&mut self) -> Result<Vec<DecodedFrame>> {
        let m = self.call_head(FLUSH);
        let mut a = self.call(&m, &[])?;
        self.parse(&mut a).map_err(|e| self.end(&e.to_string()))?
    }

    /// Reads a posted flush call's answer, checking every picture.
    fn flush_answer(&mut self) -> Result<Vec<DecodedFrame>> {
        let mut a = self.worker.answer(max_answer()).map_err(|e| self.dead(e))?;
        self.parse(&mut a).map_err(|e| self.end(&e.to_string()))?
    }

    /// A failure of the worker (the decoder is dead from then on): nothing of it stays
    /// mapped but the pictures still held.
    fn dead(&mut self, e: MediaError) -> MediaError {
        self.mapped.clear();
        self.in_flight.clear();
        e
    }

    /// Sends packet `packet` of `pts` to the worker without waiting for its answer: copied
    /// into the packet ring, the call saying where; else in the call (from the caller's
    /// slice into the socket, no copy in between).
    fn post(&mut self, packet: &[u8], pts: i64) -> Result<()> {
        let at = self.ring.as_mut().and_then(|r| r.put(packet));
        let mut m = self.call_head(if at.is_some() { RING } else { DECODE });
        m.u64(pts as u64);
        match at {
            Some(at) => m.u32(at).u32(packet.len() as u32),
            None => m.u32(packet.len() as u32),
        };
        self.post_parts(&[&m.0[..], if at.is_some() { &[] } else { packet }])?;
        self.seq += 1;
        self.in_flight.push_back((self.seq, pts));
        Ok(())
    }

    /// Sends the call made of `parts` without waiting for its answer.
    fn post_parts(&mut self, parts: &[&[u8]]) -> Result<()> {
        let all = 8 + parts.iter().map(|p| p.len()).sum::<usize>();
        let sent = self.worker.post(parts, 0, true).map_err(|e| self.dead(e))?;
        if sent < all {
            // No room: the worker may be writing an answer; read every one due, then send
            // the rest (the worker reads it once it has answered).
            while !self.in_flight.is_empty() {
                let (frames, _) = self.read_one()?;
                self.early.extend(frames);
            }
            self.worker
                .post(parts, sent, false)
                .map_err(|e| self.dead(e))?;
        }
        Ok(())
    }

    /// Sends a packet whose answer [`finish`](DecoderBackend::finish) reads, once every
    /// earlier answer is read (their pictures kept for it).
    fn send_own(&mut self, packet: &[u8], pts: i64) -> Result<()> {
        self.early = self.drain()?;
        self.post(packet, pts)?;
        self.started = Started::Packet;
        Ok(())
    }

    /// Reads the answer to the oldest packet in flight: its pictures, and the packet's own
    /// failure (also kept for `take_failures`, as an earlier packet's is).
    fn read_one(&mut self) -> Result<(Vec<DecodedFrame>, Option<MediaError>)> {
        let Some((seq, pts)) = self.in_flight.pop_front() else {
            return Ok((Vec::new(), None));
        };
        let mut a = self.worker.answer(max_answer()).map_err(|e| self.dead(e))?;
        match self.parse(&mut a).map_err(|e| self.end(&e.to_string()))? {
            Ok(frames) => Ok((frames, None)),
            Err(e) => {
                let reason = match &e {
                    MediaError::Decode(m) => m.clone(),
                    e => e.to_string(),
                };
                self.failures.push(PacketError { pts, seq, reason });
                Ok((Vec::new(), Some(e)))
            }
        }
    }

    /// Reads every answer still due: their pictures (a started packet's is one of them, a
    /// started flush's too).
    fn drain(&mut self) -> Result<Vec<DecodedFrame>> {
        let flushing = std::mem::replace(&mut self.started, Started::Nothing) == Started::Flush;
        let mut out = std::mem::take(&mut self.early);
        while !self.in_flight.is_empty() {
            out.extend(self.read_one()?.0);
        }
        if flushing {
            out.extend(self.flush_answer()?);
        }
        Ok(out)
    }

    /// Reads the answers of packets in flight that have come, without waiting (their
    /// pictures kept for the next call that hands them out); a failure is left for
    /// that call (the worker is ended: it fails at once).
    fn read_arrived(&mut self) {
        while !self.in_flight.is_empty() && self.worker.answer_waiting() {
            match self.read_one() {
                Ok((frames, _)) => self.early.extend(frames),
                Err(_) => return,
            }
        }
    }

    /// The answer's pictures (or this call's own error) and failures.
    fn parse(&mut self, a: &mut In) -> Result<Result<Vec<DecodedFrame>>> {
        let ring = self.ring.as_mut();
        answer::parse_answer(
            a,
            &mut self.mapped,
            &mut self.layout,
            &mut self.failures,
            ring,
        )
    }
}

impl DecoderBackend for ProcessDecoder {
    fn name(&self) -> &str {
        &self.worker.name
    }

    fn decode(&mut self, packet: &[u8], pts: i64) -> Result<Vec<DecodedFrame>> {
        if packet.len() > MAX_PACKET {
            return Err(MediaError::Decode(format!(
                "{}: packet of {} bytes",
                self.worker.name,
                packet.len()
            )));
        }
        self.send_own(packet, pts)?;
        self.finish()
    }

    fn starts(&self) -> bool {
        self.max_in_flight == 0 && !self.started()
    }

    fn start(&mut self, packet: &[u8], pts: i64) -> Result<bool> {
        if !self.starts() || packet.len() > MAX_PACKET {
            return Ok(false);
        }
        self.send_own(packet, pts)?;
        Ok(true)
    }

    fn start_flush(&mut self) -> Result<bool> {
        if self.started() {
            return Ok(false);
        }
        let m = self.call_head(FLUSH);
        self.post_parts(&[&m.0[..]])?;
        self.started = Started::Flush;
        Ok(true)
    }

    fn started(&self) -> bool {
        self.started != Started::Nothing
    }

    fn finish(&mut self) -> Result<Vec<DecodedFrame>> {
        match self.started {
            Started::Nothing => Ok(std::mem::take(&mut self.early)),
            // Every answer due, then the flush's.
            Started::Flush => self.drain(),
            Started::Packet => {
                self.started = Started::Nothing;
                let mut out = std::mem::take(&mut self.early);
                let (frames, own) = self.read_one()?;
                out.extend(frames);
                match own {
                    None => Ok(out),
                    Some(e) => {
                        // Its own failure is this call's, not a later report's.
                        self.failures.pop();
                        self.early = out;
                        Err(e)
                    }
                }
            }
        }
    }

    fn would_wait(&mut self) -> bool {
        if self.worker.is_dead() {
            return false;
        }
        match self.started {
            Started::Packet => !self.worker.answer_waiting(),
            Started::Flush => {
                // The flush's answer comes after the packets' answers.
                self.read_arrived();
                !self.in_flight.is_empty() || !self.worker.answer_waiting()
            }
            Started::Nothing => {
                self.max_in_flight > 0
                    && self.in_flight.len() >= self.max_in_flight
                    && !self.worker.answer_waiting()
            }
        }
    }

    fn submit(&mut self, packet: &[u8], pts: i64) -> Result<Vec<DecodedFrame>> {
        if self.max_in_flight == 0 || packet.len() > MAX_PACKET {
            return self.decode(packet, pts);
        }
        let mut out = std::mem::take(&mut self.early);
        while self.in_flight.len() >= self.max_in_flight {
            out.extend(self.read_one()?.0);
        }
        self.post(packet, pts)?;
        out.append(&mut self.collect(false)?);
        Ok(out)
    }

    fn in_flight(&self) -> usize {
        self.in_flight.len() + usize::from(self.started == Started::Flush)
    }

    fn answers_fd(&self) -> Option<BorrowedFd<'_>> {
        (self.in_flight() > 0).then(|| self.worker.fd())
    }

    fn collect(&mut self, wait: bool) -> Result<Vec<DecodedFrame>> {
        if self.started() {
            // The answers due are `finish`'s; a caller that waits reads them all (as any
            // other call does: a started packet's own failure then goes to take_failures).
            return match wait {
                true => self.drain(),
                false => Ok(std::mem::take(&mut self.early)),
            };
        }
        let mut out = std::mem::take(&mut self.early);
        if wait && out.is_empty() && !self.in_flight.is_empty() {
            out.extend(self.read_one()?.0);
        }
        while !self.in_flight.is_empty() && self.worker.answer_waiting() {
            out.extend(self.read_one()?.0);
        }
        Ok(out)
    }

    fn flush(&mut self) -> Result<Vec<DecodedFrame>> {
        let mut out = self.drain()?;
        out.extend(self.flush_call()?);
        Ok(out)
    }

    fn output_layout(&self) -> Option<FrameLayout> {
        self.layout
    }

    fn take_failures(&mut self) -> Vec<PacketError> {
        std::mem::take(&mut self.failures)
    }

    fn cpu_ns(&self) -> Option<u64> {
        self.worker.cpu_ns()
    }
}

/// The worker's side: enters the [`sandbox`], then serves one decoder (or one encoder, a
/// [`ProcessEncoder`]'s) on stdin (a socket the parent passed) until the parent hangs up. Call it from the worker program's `main`
/// and exit.
pub fn serve_decoder() -> Result<()> {
    let io = io_error("decoder worker");
    let mut dec: Option<FfmpegDecoder> = None;
    let slots = SharedSlots::default();
    let mut ring: Option<RingView> = None;
    let mut encoder = encode::Served::default();
    let max_call = MAX_PACKET + 64 + 4 * (shared::MAX_SLOTS + 2);
    serve(
        "decoder worker",
        max_call,
        In::recv_packet,
        |mut m, sock| {
            let mut a = Out::default();
            let call = m.u8()?;
            if encode::is_encoder_call(call) {
                encoder.answer(call, &mut m, &mut a)?;
                return a.send(sock, &[]).map_err(&io);
            }
            if call != OPEN {
                let n = m.u32()?.min(shared::MAX_SLOTS as u32 + 1);
                let released: Vec<u32> = (0..n).map(|_| m.u32()).collect::<Result<_>>()?;
                shared::lock(&slots).release(&released);
            }
            let pictures = match (call, dec.as_mut()) {
                (OPEN, None) => {
                    // The page where the parent counts the pictures it is done with, and
                    // the ring it puts packets in.
                    let mut fds = std::mem::take(&mut m.fds).into_iter();
                    if let Some(fd) = fds.next() {
                        shared::lock(&slots).use_page(Arc::new(ReleasePage::open(fd)?));
                    }
                    if let Some(fd) = fds.next() {
                        ring = Some(RingView::open(fd)?);
                    }
                    let kind = *CodecKind::ALL
                        .get(m.u8()? as usize)
                        .ok_or_else(|| bad("codec"))?;
                    let out = format_of(m.u8()?).ok_or_else(|| bad("format"))?;
                    let threads = m.u32()? as usize;
                    match FfmpegDecoder::new_into(kind, out, threads, slots.clone()) {
                        Ok(mut d) => {
                            d.hold_pictures(true);
                            a.u8(0).text(d.name());
                            dec = Some(d);
                        }
                        Err(e) => {
                            a.u8(1).text(&e.to_string());
                        }
                    }
                    return a.send(sock, &[]).map_err(&io);
                }
                (DECODE, Some(d)) => {
                    let pts = m.u64()? as i64;
                    let r = d.decode_packet(m.packet_tail()?, pts);
                    answer::placed(&slots, r)
                }
                (RING, Some(d)) => {
                    let pts = m.u64()? as i64;
                    let view = ring.as_ref().ok_or_else(|| bad("no packet ring"))?;
                    let packet = view.packet(m.u32()?, m.u32()?)?;
                    let r = d.decode_packet(packet, pts);
                    answer::placed(&slots, r)
                }
                (FLUSH, Some(d)) => {
                    let r = d.flush();
                    answer::placed(&slots, r)
                }
                _ => return Err(bad("unexpected call")),
            };
            let failures = dec.as_mut().map(|d| d.take_failures()).unwrap_or_default();
            let freed = ring.as_ref().map(RingView::take_freed).unwrap_or_default();
            let mut body = Out::default();
            answer::answer(&mut body, &pictures, failures, &freed);
            // The buffers' news after the pictures were placed (libavcodec made them while
            // decoding); the pictures' references to libavcodec's buffers go after the lock (a
            // last reference going locks the buffers too).
            let sent = {
                let mut held = shared::lock(&slots);
                let (dropped, new) = held.take_news();
                a.u32(dropped.len() as u32);
                for id in dropped {
                    a.u32(id);
                }
                a.u32(new.len() as u32);
                for (id, cell, _) in &new {
                    a.u32(*id).u32(*cell);
                }
                a.0.extend_from_slice(&body.0);
                let fds: Vec<_> = new.iter().map(|(_, _, fd)| fd.as_fd()).collect();
                a.send(sock, &fds).map_err(&io)
            };
            drop(pictures);
            sent
        },
    )
}
