//! A decoder in a child process (prototype of the containment in `docs/ARCHITECTURE.md`,
//! "Containing native libraries"): [`ProcessDecoder`] implements [`DecoderBackend`] by
//! sending each call to a worker process that runs an [`FfmpegDecoder`]
//! ([`serve_decoder`]), so a crash or a hang of libavcodec ends that worker only: the
//! decoder reports it as a decode error on that call and every later one (the guest reopens),
//! and the process that owns it goes on.
//!
//! The worker's stdin is one end of a socket pair; calls and answers are length-prefixed
//! little-endian messages on it. The parent trusts nothing the worker sends: sizes and counts
//! are bounded, every picture must be a valid packed layout of exactly its bytes, and
//! anything else ends the worker as if it had crashed. An answer that does not arrive within
//! [`CALL_DEADLINE`] ends it too (a hang).
//!
//! Not built yet: a seccomp filter and dropped privileges in the worker, sharing the
//! pictures through memfds instead of copying them through the socket, a pool of workers.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{CodecKind, DecodedFrame, DecoderBackend, FfmpegDecoder, PacketError};
use crate::error::{MediaError, Result};
use crate::frame::{FrameLayout, PixelFormat};

/// Longest a worker may take to answer one call before it is ended as hung.
pub const CALL_DEADLINE: Duration = Duration::from_secs(10);
/// Most pictures or failures one answer may carry.
const MAX_ITEMS: u32 = 64;
/// Longest message text (reasons, names).
const MAX_TEXT: u32 = 4096;
/// Largest packet sent to a worker.
const MAX_PACKET: usize = 64 << 20;

const OPEN: u8 = b'O';
const DECODE: u8 = b'D';
const FLUSH: u8 = b'F';

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

/// Little-endian writer into a message buffer.
#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
    fn text(&mut self, s: &str) -> &mut Self {
        let s = &s.as_bytes()[..s.len().min(MAX_TEXT as usize)];
        self.bytes(s)
    }
    /// Sends the message: its length, then its bytes.
    fn send(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&(self.0.len() as u64).to_le_bytes())?;
        w.write_all(&self.0)?;
        w.flush()
    }
}

/// Reader of one received message; every read is bounds-checked.
struct In {
    buf: Vec<u8>,
    at: usize,
}

fn bad(what: &str) -> MediaError {
    MediaError::Decode(format!("decoder worker: malformed message ({what})"))
}

impl In {
    fn recv(r: &mut impl Read, max: usize) -> std::io::Result<In> {
        let mut len = [0u8; 8];
        r.read_exact(&mut len)?;
        let len = u64::from_le_bytes(len);
        if len > max as u64 {
            return Err(std::io::Error::other(format!("message of {len} bytes")));
        }
        let mut buf = vec![0u8; len as usize];
        r.read_exact(&mut buf)?;
        Ok(In { buf, at: 0 })
    }
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let s = self
            .buf
            .get(self.at..self.at.saturating_add(n))
            .ok_or_else(|| bad("short"))?;
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| bad("u32"))?,
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| bad("u64"))?,
        ))
    }
    fn bytes(&mut self) -> Result<Vec<u8>> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn text(&mut self) -> Result<String> {
        let n = self.u32()?;
        if n > MAX_TEXT {
            return Err(bad("text too long"));
        }
        Ok(String::from_utf8_lossy(self.take(n as usize)?).into_owned())
    }
}

/// Largest answer: `MAX_ITEMS` pictures of the largest size, with room for the rest.
fn max_answer() -> usize {
    let picture = super::decoder::MAX_DECODE_PIXELS as usize * 3 / 2;
    (picture + 64) * 4 + (MAX_TEXT as usize + 32) * (2 * MAX_ITEMS as usize + 2)
}

/// A decoder whose libavcodec runs in a worker process.
pub struct ProcessDecoder {
    child: Child,
    sock: UnixStream,
    name: String,
    layout: Option<FrameLayout>,
    failures: Vec<PacketError>,
    /// Why the worker is gone, once it is.
    dead: Option<String>,
}

impl ProcessDecoder {
    /// Starts `program args...` as the worker (it must call [`serve_decoder`] on its stdin)
    /// and opens a decoder of `codec` writing `out` with `threads` threads in it.
    pub fn spawn(
        program: &Path,
        args: &[String],
        codec: CodecKind,
        out: PixelFormat,
        threads: usize,
    ) -> Result<Self> {
        let (ours, theirs) = UnixStream::pair().map_err(|e| {
            MediaError::Unsupported(format!("socketpair for a decoder worker: {e}"))
        })?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                MediaError::Unsupported(format!(
                    "cannot start decoder worker {}: {e}",
                    program.display()
                ))
            })?;
        ours.set_read_timeout(Some(CALL_DEADLINE))
            .and_then(|()| ours.set_write_timeout(Some(CALL_DEADLINE)))
            .map_err(|e| MediaError::Unsupported(format!("decoder worker socket: {e}")))?;
        let mut d = ProcessDecoder {
            child,
            sock: ours,
            name: format!("worker-{}", codec.name()),
            layout: None,
            failures: Vec::new(),
            dead: None,
        };
        let mut m = Out::default();
        m.u8(OPEN)
            .u8(codec_code(codec))
            .u8(format_code(out))
            .u32(threads.min(64) as u32);
        let mut answer = d.call(&m)?;
        match answer.u8()? {
            0 => {
                d.name = format!("worker-{}", answer.text()?.trim_start_matches("ffmpeg-"));
                Ok(d)
            }
            _ => Err(MediaError::Unsupported(answer.text()?)),
        }
    }

    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `m` and returns the answer; on any failure the worker is ended and the decoder
    /// is dead from then on.
    fn call(&mut self, m: &Out) -> Result<In> {
        if let Some(why) = &self.dead {
            return Err(MediaError::Decode(why.clone()));
        }
        let r = m
            .send(&mut self.sock)
            .and_then(|()| In::recv(&mut self.sock, max_answer()));
        r.map_err(|e| self.end(&e.to_string()))
    }

    /// Ends the worker after a failure: killed if still running, reaped, and the reason
    /// kept for every later call.
    fn end(&mut self, what: &str) -> MediaError {
        let status = match self.child.try_wait() {
            Ok(Some(s)) => format!("exited ({s})"),
            _ => {
                let _ = self.child.kill();
                let s = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                format!("ended after {what} ({s})")
            }
        };
        let why = format!(
            "{}: decoder process {status}; reopen the decoder",
            self.name
        );
        log::warn!("{why}");
        self.dead = Some(why.clone());
        MediaError::Decode(why)
    }

    /// Reads a decode or flush answer, checking every picture.
    fn frames(&mut self, m: &Out) -> Result<Vec<DecodedFrame>> {
        let mut a = self.call(m)?;
        self.parse(&mut a).map_err(|e| self.end(&e.to_string()))?
    }

    /// The answer's pictures (or this call's own error) and failures.
    fn parse(&mut self, a: &mut In) -> Result<Result<Vec<DecodedFrame>>> {
        let own = match a.u8()? {
            0 => None,
            _ => Some(a.text()?),
        };
        let n = a.u32()?;
        if n > MAX_ITEMS {
            return Err(bad("too many pictures"));
        }
        let mut frames = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let format = format_of(a.u8()?).ok_or_else(|| bad("format"))?;
            let (w, h, pw, ph) = (a.u32()?, a.u32()?, a.u32()?, a.u32()?);
            let corrupt = a.u8()? != 0;
            let pts = a.u64()? as i64;
            let layout = FrameLayout::packed(format, w, h).map_err(|_| bad("layout"))?;
            let data = a.bytes()?;
            if data.len() != layout.size() || pw < w || ph < h || pw > w + 1 || ph > h + 1 {
                return Err(bad("picture size"));
            }
            self.layout = Some(layout);
            frames.push(DecodedFrame {
                layout,
                pts,
                data,
                corrupt,
                picture_size: (pw, ph),
                held: None,
            });
        }
        let n = a.u32()?;
        if n > MAX_ITEMS {
            return Err(bad("too many failures"));
        }
        for _ in 0..n {
            let (pts, seq, reason) = (a.u64()? as i64, a.u64()?, a.text()?);
            self.failures.push(PacketError { pts, seq, reason });
        }
        Ok(match own {
            None => Ok(frames),
            Some(e) => Err(MediaError::Decode(e)),
        })
    }
}

impl Drop for ProcessDecoder {
    fn drop(&mut self) {
        // Closing the socket ends the worker's loop; make sure it is gone and reaped.
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl DecoderBackend for ProcessDecoder {
    fn name(&self) -> &str {
        &self.name
    }

    fn decode(&mut self, packet: &[u8], pts: i64) -> Result<Vec<DecodedFrame>> {
        if packet.len() > MAX_PACKET {
            return Err(MediaError::Decode(format!(
                "{}: packet of {} bytes",
                self.name,
                packet.len()
            )));
        }
        let mut m = Out::default();
        m.u8(DECODE).u64(pts as u64).bytes(packet);
        self.frames(&m)
    }

    fn flush(&mut self) -> Result<Vec<DecodedFrame>> {
        let mut m = Out::default();
        m.u8(FLUSH);
        self.frames(&m)
    }

    fn output_layout(&self) -> Option<FrameLayout> {
        self.layout
    }

    fn take_failures(&mut self) -> Vec<PacketError> {
        std::mem::take(&mut self.failures)
    }
}

/// The worker's side: serves one decoder on stdin (a socket the parent passed) until the
/// parent hangs up. Call it from the worker program's `main` and exit.
pub fn serve_decoder() -> Result<()> {
    // SAFETY: the parent made this process's stdin one end of a socket pair; nothing else in
    // the worker uses fd 0 (no `std::io::stdin()`), so this is its only owner.
    let mut sock = unsafe { UnixStream::from_raw_fd(0) };
    let io = |e: std::io::Error| MediaError::Decode(format!("decoder worker: {e}"));
    let mut dec: Option<FfmpegDecoder> = None;
    loop {
        let mut m = match In::recv(&mut sock, MAX_PACKET + 64) {
            Ok(m) => m,
            // The parent hung up: done.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(io(e)),
        };
        let mut a = Out::default();
        match (m.u8()?, dec.as_mut()) {
            (OPEN, None) => {
                let kind = *CodecKind::ALL
                    .get(m.u8()? as usize)
                    .ok_or_else(|| bad("codec"))?;
                let out = format_of(m.u8()?).ok_or_else(|| bad("format"))?;
                let threads = m.u32()? as usize;
                match FfmpegDecoder::new(kind, out, threads) {
                    Ok(d) => {
                        a.u8(0).text(d.name());
                        dec = Some(d);
                    }
                    Err(e) => {
                        a.u8(1).text(&e.to_string());
                    }
                }
            }
            (DECODE, Some(d)) => {
                let pts = m.u64()? as i64;
                let packet = m.bytes()?;
                let r = d.decode(&packet, pts);
                answer(&mut a, d, r);
            }
            (FLUSH, Some(d)) => {
                let r = d.flush();
                answer(&mut a, d, r);
            }
            _ => return Err(bad("unexpected call")),
        }
        a.send(&mut sock).map_err(io)?;
    }
}

fn answer(a: &mut Out, d: &mut FfmpegDecoder, r: Result<Vec<DecodedFrame>>) {
    let frames = match r {
        Ok(f) => {
            a.u8(0);
            f
        }
        Err(e) => {
            a.u8(1).text(&e.to_string());
            Vec::new()
        }
    };
    a.u32(frames.len() as u32);
    for f in frames {
        a.u8(format_code(f.layout.format))
            .u32(f.layout.width)
            .u32(f.layout.height)
            .u32(f.picture_size.0)
            .u32(f.picture_size.1)
            .u8(u8::from(f.corrupt))
            .u64(f.pts as u64)
            .bytes(&f.data);
        d.recycle(f);
    }
    let failures = d.take_failures();
    a.u32(failures.len() as u32);
    for f in failures {
        a.u64(f.pts as u64).u64(f.seq).text(&f.reason);
    }
}
