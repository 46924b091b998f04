//! H.264 encoders in worker processes: [`ProcessEncoder`] sends each frame to a codec
//! worker (the same program and pool as the decoders: [`serve_decoder`](super::serve_decoder)
//! serves an encoder when its first call opens one) that runs an [`FfmpegEncoder`], so a
//! crash or a hang of libx264 ends that encoder only (an encode error on that call and
//! every later one; the guest reopens).
//!
//! Frames travel as the ISP's do: the parent copies each frame into a sealed memfd of its
//! own ([`Buffer`]), handed to the worker once, which reads it in place: one copy of a
//! frame's bytes more than in process. Packets come back in the answer; the parent checks
//! their count, their sizes (together at most twice the raw frame, plus a MiB), and that
//! nothing trails them.

use std::sync::Arc;

use super::DecoderPool;
use crate::codec::encoder::check_frame;
use crate::codec::{EncodedPacket, EncoderBackend, EncoderPreset, FfmpegEncoder};
use crate::error::{MediaError, Result};
use crate::frame::{FrameLayout, FrameRef};
use crate::worker::shared::Buffer;
use crate::worker::wire::{bad, In, Out};
use crate::worker::{deadline_for, read_answer, write_error, WorkerProcess};

/// Calls of an encoder's worker.
pub(super) const OPEN_ENCODER: u8 = b'e';
pub(super) const ENCODE: u8 = b'E';
pub(super) const FLUSH_ENCODER: u8 = b'f';

/// Most packets one answer may carry.
const MAX_PACKETS: u32 = 64;

/// Bytes the packets of one answer may hold together for `width x height` frames.
fn max_packet_bytes(width: u32, height: u32) -> usize {
    (width as usize * height as usize * 3 / 2) * 2 + (1 << 20)
}

/// An H.264 encoder whose libavcodec runs in a worker process.
pub struct ProcessEncoder {
    worker: WorkerProcess,
    /// The frame buffer shared with the worker.
    frame: Option<Buffer>,
    width: u32,
    height: u32,
    /// A frame [`start`](EncoderBackend::start) sent, and when its worker's time is up.
    started: Option<std::time::Instant>,
}

impl ProcessEncoder {
    /// Takes a worker from `pool` and opens an H.264 encoder in it, as
    /// [`FfmpegEncoder::new_h264_with`] does.
    /// `width x height` frames at `fps` frames per second and `bitrate` bits per second.
    pub fn open(
        pool: &Arc<DecoderPool>,
        (width, height): (u32, u32),
        (fps, bitrate): (u32, u64),
        preset: EncoderPreset,
    ) -> Result<Self> {
        let worker = WorkerProcess::new(
            pool.take()?,
            "worker-h264-encoder".into(),
            "encoder process",
            "reopen the encoder",
            MediaError::Encode,
        )?;
        let mut e = ProcessEncoder {
            worker,
            frame: None,
            width,
            height,
            started: None,
        };
        let preset_code = EncoderPreset::ALL
            .iter()
            .position(|p| *p == preset)
            .unwrap_or(0);
        let mut m = Out::default();
        m.u8(OPEN_ENCODER)
            .u32(width)
            .u32(height)
            .u32(fps)
            .u64(bitrate)
            .u8(preset_code as u8);
        let mut a = e.worker.call(&m, &[], 64 + 4096)?;
        match read_answer(&mut a, |a| a.text(), MediaError::Encode) {
            Ok(Ok(name)) => {
                e.worker.name = format!("worker-{name}");
                Ok(e)
            }
            Ok(Err(refused)) => Err(refused),
            Err(bad) => Err(e.worker.end(&bad.to_string())),
        }
    }

    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.worker.pid()
    }

    /// Sends `m` (with the frame buffer's descriptor when `new`) and reads the packets.
    fn packets(&mut self, m: &Out, new: bool) -> Result<Vec<EncodedPacket>> {
        self.finish()?;
        self.send(m, new)?;
        self.read_packets()
    }

    /// Sends `m` (with the frame buffer's descriptor when `new`), the worker's deadline set
    /// for this frame size.
    fn send(&mut self, m: &Out, new: bool) -> Result<()> {
        let fds: Vec<_> = match (&self.frame, new) {
            (Some(b), true) => vec![b.fd()],
            _ => Vec::new(),
        };
        self.worker
            .set_deadline(deadline_for(u64::from(self.width) * u64::from(self.height)));
        self.worker.send(m, &fds)
    }

    /// Reads the answer to the call sent, as packets.
    fn read_packets(&mut self) -> Result<Vec<EncodedPacket>> {
        let max = max_packet_bytes(self.width, self.height);
        let mut a = self.worker.answer(max + 64 * MAX_PACKETS as usize + 4096)?;
        parse_packets(&mut a, max).map_err(|e| self.worker.end(&e.to_string()))?
    }

    /// Copies `frame` into the buffer the worker reads: the encode call for it.
    fn encode_call(&mut self, frame: &FrameRef<'_>, pts: i64) -> Result<(Out, bool)> {
        check_frame(frame, self.width, self.height)?;
        let l = frame.layout;
        let n = l.size();
        let new = Buffer::fit(&mut self.frame, n)?;
        let buf = self
            .frame
            .as_mut()
            .ok_or_else(|| MediaError::Resources("encoder: no frame buffer".into()))?;
        // The one copy more than in process: the frame into the buffer the worker reads.
        buf.bytes_mut()
            .get_mut(..n)
            .ok_or_else(|| bad("frame buffer"))?
            .copy_from_slice(frame.data.get(..n).ok_or_else(|| bad("frame"))?);
        let mut m = Out::default();
        m.u8(ENCODE).u8(u8::from(new)).layout(&l).u64(pts as u64);
        Ok((m, new))
    }
}

/// Reads an encode or flush answer: `Err` when it is malformed (the caller ends the worker),
/// else the call's own result.
fn parse_packets(a: &mut In, max_bytes: usize) -> Result<Result<Vec<EncodedPacket>>> {
    let packets = |a: &mut In| {
        let n = a.u32()?;
        if n > MAX_PACKETS {
            return Err(bad("too many packets"));
        }
        let (mut out, mut total) = (Vec::with_capacity(n as usize), 0usize);
        for _ in 0..n {
            let data = a.bytes()?.to_vec();
            total = total.saturating_add(data.len());
            if total > max_bytes {
                return Err(bad("packets larger than the frames"));
            }
            let (pts, dts) = (a.u64()? as i64, a.u64()? as i64);
            let keyframe = match a.u8()? {
                0 => false,
                1 => true,
                _ => return Err(bad("keyframe flag")),
            };
            out.push(EncodedPacket {
                data,
                pts,
                dts,
                keyframe,
            });
        }
        Ok(out)
    };
    read_answer(a, packets, MediaError::Encode)
}

/// Parses `bytes` as an encoder worker's answer for `width x height` frames (no
/// descriptors), as [`ProcessEncoder`] does: for the fuzzer and the tests. Returns whether
/// it was accepted (a well-formed error answer is accepted).
#[doc(hidden)]
pub fn check_encoder_answer(bytes: &[u8], width: u32, height: u32) -> bool {
    let mut a = In::from_bytes(bytes.to_vec());
    parse_packets(&mut a, max_packet_bytes(width, height)).is_ok()
}

impl EncoderBackend for ProcessEncoder {
    fn name(&self) -> &str {
        &self.worker.name
    }

    fn encode(&mut self, frame: FrameRef<'_>, pts: i64) -> Result<Vec<EncodedPacket>> {
        // A frame started before is finished (its packets dropped) before this one overwrites
        // the buffer its worker may still be reading; the codec device never leaves one.
        self.finish()?;
        let (m, new) = self.encode_call(&frame, pts)?;
        self.packets(&m, new)
    }

    fn flush(&mut self) -> Result<Vec<EncodedPacket>> {
        let mut m = Out::default();
        m.u8(FLUSH_ENCODER);
        self.packets(&m, false)
    }

    fn start(&mut self, frame: FrameRef<'_>, pts: i64) -> Result<bool> {
        if self.started.is_some() {
            return Err(bad("a frame is being encoded already"));
        }
        let (m, new) = self.encode_call(&frame, pts)?;
        self.send(&m, new)?;
        let pixels = u64::from(self.width) * u64::from(self.height);
        self.started = Some(std::time::Instant::now() + deadline_for(pixels));
        Ok(true)
    }

    fn started(&self) -> bool {
        self.started.is_some()
    }

    fn finish(&mut self) -> Result<Vec<EncodedPacket>> {
        let Some(due) = self.started.take() else {
            return Ok(Vec::new());
        };
        // What is left of the frame's deadline (the socket's timeout counts from each read).
        let left = due.saturating_duration_since(std::time::Instant::now());
        self.worker
            .set_deadline(left.max(std::time::Duration::from_millis(1)));
        self.read_packets()
    }

    fn answers_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.started.map(|_| self.worker.fd())
    }
}

/// The worker's side of an encoder: its [`FfmpegEncoder`] (once opened) and the frame
/// buffer its parent shares.
#[derive(Default)]
pub(super) struct Served {
    encoder: Option<FfmpegEncoder>,
    frame: Option<Buffer>,
}

impl Served {
    /// Answers one of the encoder's calls (`call`, the rest of it in `m`) into `a`.
    pub(super) fn answer(&mut self, call: u8, m: &mut In, a: &mut Out) -> Result<()> {
        let packets = match (call, self.encoder.as_mut()) {
            (OPEN_ENCODER, None) => {
                let (w, h, fps, bitrate) = (m.u32()?, m.u32()?, m.u32()?, m.u64()?);
                let preset = *EncoderPreset::ALL
                    .get(m.u8()? as usize)
                    .ok_or_else(|| bad("preset"))?;
                match FfmpegEncoder::new_h264_with(w, h, fps, bitrate, preset) {
                    Ok(e) => {
                        a.u8(0).text(e.name());
                        self.encoder = Some(e);
                    }
                    Err(e) => write_error(a.u8(1), &e),
                }
                return Ok(());
            }
            (ENCODE, Some(enc)) => {
                if m.u8()? != 0 {
                    let fd = m.fds.pop().ok_or_else(|| bad("descriptor"))?;
                    self.frame = Some(Buffer::open(fd, isize::MAX as usize, false)?);
                }
                let (layout, pts): (FrameLayout, i64) = (m.layout()?, m.u64()? as i64);
                match &self.frame {
                    Some(b) => FrameRef::new(layout, b.bytes())
                        .map_err(MediaError::from)
                        .and_then(|f| enc.encode(f, pts)),
                    None => Err(MediaError::Encode("no frame buffer".into())),
                }
            }
            (FLUSH_ENCODER, Some(enc)) => enc.flush(),
            _ => return Err(bad("unexpected call")),
        };
        match packets {
            Ok(p) => {
                a.u8(0).u32(p.len() as u32);
                for p in p {
                    a.bytes(&p.data)
                        .u64(p.pts as u64)
                        .u64(p.dts as u64)
                        .u8(u8::from(p.keyframe));
                }
            }
            Err(e) => write_error(a.u8(1), &e),
        }
        Ok(())
    }
}

/// Whether `call` is one of an encoder's.
pub(super) fn is_encoder_call(call: u8) -> bool {
    matches!(call, OPEN_ENCODER | ENCODE | FLUSH_ENCODER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::wire::corruptions;

    fn answer(packets: &[&[u8]]) -> Vec<u8> {
        let mut a = Out::default();
        a.u8(0).u32(packets.len() as u32);
        for (i, p) in packets.iter().enumerate() {
            a.bytes(p).u64(i as u64).u64(i as u64).u8(u8::from(i == 0));
        }
        a.0
    }

    #[test]
    fn hostile_encoder_answers_are_refused_without_panicking() {
        let good = answer(&[b"\0\0\0\x01idr", b"\0\0\0\x01p"]);
        assert!(check_encoder_answer(&good, 16, 16));
        for n in 0..good.len() {
            assert!(
                !check_encoder_answer(&good[..n], 16, 16),
                "truncated to {n}"
            );
        }
        let mut long = good.clone();
        long.push(0);
        assert!(!check_encoder_answer(&long, 16, 16), "trailing bytes");
        // Packets larger than the frames could make, too many packets.
        let big = vec![0u8; max_packet_bytes(16, 16) + 1];
        assert!(!check_encoder_answer(&answer(&[&big]), 16, 16));
        let many: Vec<&[u8]> = vec![b"x"; MAX_PACKETS as usize + 1];
        assert!(!check_encoder_answer(&answer(&many), 16, 16));
        for (_, bad) in corruptions(&good, 20_000) {
            check_encoder_answer(&bad, 16, 16);
        }
    }
}
