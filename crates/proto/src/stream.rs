//! Ring entries as frames on a byte stream, for remote guests (TCP).
//!
//! A frame is one 64-byte ring entry, a little-endian u32 payload length, and the payload:
//! the bytes of a CPU write going to the host, or of a CPU read coming back. Lengths are
//! checked against a maximum before anything is allocated.
//!
//! A frame is written with vectored writes (head and payload in one system call, as many
//! as partial writes need: [`write_frame`]) and read as its head ([`read_head`]) then its
//! payload, into a buffer of the reader's ([`read_rest`]): a reader that knows where the
//! bytes go (the host's copy of a remote guest's window) reads them there, with no
//! intermediate buffer.

use std::io::{self, IoSlice, Read, Write};

use vm_memory::ByteValued;

/// One frame read off a stream.
#[derive(Debug)]
pub struct StreamFrame<T> {
    /// The ring entry that heads the frame.
    pub entry: T,
    /// The bytes after it (a CPU write's data, a CPU read's answer); empty when there are none.
    pub payload: Vec<u8>,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StreamFrameError {
    /// Reading the stream failed (including timeouts and EOF).
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// A frame announced a payload larger than the reader accepts (nothing was allocated).
    #[error("payload of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Payload length the frame announced, in bytes.
        len: u64,
        /// Largest payload the reader accepts, in bytes.
        max: u64,
    },
    /// The reader would not hold a payload of this size now (it would pass the sender's
    /// memory limit); nothing was allocated.
    #[error("payload of {len} bytes refused: {why}")]
    Refused {
        /// Payload length the frame announced, in bytes.
        len: u64,
        /// Why: the admitting side's own error.
        #[source]
        why: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl StreamFrameError {
    /// Whether the read timed out before a frame started (nothing consumed).
    pub fn is_timeout(&self) -> bool {
        matches!(self, StreamFrameError::Io(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }
}

/// Writes one frame: head and payload together (one vectored write when the stream takes
/// it all, more after partial writes).
pub fn write_frame<T: ByteValued>(w: &mut impl Write, entry: &T, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "payload too large"))?;
    let len = len.to_le_bytes();
    let mut bufs = [
        IoSlice::new(entry.as_slice()),
        IoSlice::new(&len),
        IoSlice::new(payload),
    ];
    write_all_vectored(w, &mut bufs)?;
    w.flush()
}

/// A frame's head for `entry` and a payload of `len` bytes (which must fit a u32; larger is
/// refused by [`write_frame`] and by every reader).
pub fn frame_head<T: ByteValued>(entry: &T, len: usize) -> Vec<u8> {
    let mut head = Vec::with_capacity(std::mem::size_of::<T>() + 4);
    head.extend_from_slice(entry.as_slice());
    head.extend_from_slice(&(len.min(u32::MAX as usize) as u32).to_le_bytes());
    head
}

/// Writes every byte of `bufs`, in order, through partial writes and interruptions.
pub fn write_all_vectored(w: &mut impl Write, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads one frame; payloads over `max` bytes are refused before allocation.
pub fn read_frame<T: ByteValued + Default>(
    r: &mut impl Read,
    max: u64,
) -> Result<StreamFrame<T>, StreamFrameError> {
    read_frame_admitted(r, max, |_| Ok::<_, StreamFrameError>(())).map(|(f, ())| f)
}

/// [`read_frame`], asking `admit` about the payload's length before its buffer is allocated
/// (a charge against the sender's memory limit, say, held as long as the returned guard):
/// its error ends the read with nothing allocated.
pub fn read_frame_admitted<T: ByteValued + Default, G, E>(
    r: &mut impl Read,
    max: u64,
    admit: impl FnOnce(u64) -> Result<G, E>,
) -> Result<(StreamFrame<T>, G), StreamFrameError>
where
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (entry, len) = read_head::<T>(r, max)?;
    let guard = admit(len).map_err(|why| StreamFrameError::Refused {
        len,
        why: why.into(),
    })?;
    let mut payload = vec![0u8; len as usize];
    read_rest(r, &mut payload)?;
    Ok((StreamFrame { entry, payload }, guard))
}

/// Reads a frame's head: its entry and its payload's length (at most `max`; the payload
/// is the next `len` bytes on the stream, for the caller to read with [`read_rest`]).
pub fn read_head<T: ByteValued + Default>(
    r: &mut impl Read,
    max: u64,
) -> Result<(T, u64), StreamFrameError> {
    let mut entry = T::default();
    let size = std::mem::size_of::<T>();
    let buf = entry.as_mut_slice();
    // The first byte may time out (nothing consumed); after it, a frame is read to the end.
    // A signal before anything arrived is no answer: read again.
    let n = loop {
        match r.read(&mut buf[..size]) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => break r?,
        }
    };
    if n == 0 {
        return Err(StreamFrameError::Io(io::ErrorKind::UnexpectedEof.into()));
    }
    read_rest(r, &mut buf[n..size])?;
    let mut len = [0u8; 4];
    read_rest(r, &mut len)?;
    let len = u32::from_le_bytes(len) as u64;
    if len > max {
        return Err(StreamFrameError::TooLarge { len, max });
    }
    Ok((entry, len))
}

/// `read_exact` that keeps going through read timeouts once a frame has started.
pub fn read_rest(r: &mut impl Read, mut buf: &mut [u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match r.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Completion, DeviceId, Opcode, Request};

    #[test]
    fn frames_round_trip_and_limits_hold() {
        let mut buf = Vec::new();
        let req = Request::new(7, Opcode::EndAccess, DeviceId::CPU, [1, 2, 3, 4, 5, 6]);
        write_frame(&mut buf, &req, b"hello").unwrap();
        write_frame(&mut buf, &Completion::ok(9, [0; 6]), &[]).unwrap();
        let mut r = &buf[..];
        let f: StreamFrame<Request> = read_frame(&mut r, 16).unwrap();
        assert_eq!((f.entry, f.payload.as_slice()), (req, &b"hello"[..]));
        let c: StreamFrame<Completion> = read_frame(&mut r, 16).unwrap();
        assert_eq!(c.entry.seq, 9);
        assert!(read_frame::<Request>(&mut r, 16).is_err(), "EOF");
        let mut big = Vec::new();
        write_frame(&mut big, &req, &[0u8; 100]).unwrap();
        assert!(matches!(
            read_frame::<Request>(&mut &big[..], 99),
            Err(StreamFrameError::TooLarge { len: 100, max: 99 })
        ));
        assert!(
            read_frame::<Request>(&mut &big[..70], 1000).is_err(),
            "truncated"
        );
    }

    #[test]
    fn a_refused_payload_keeps_the_admitting_sides_error() {
        let mut buf = Vec::new();
        let req = Request::new(7, Opcode::EndAccess, DeviceId::CPU, [0; 6]);
        write_frame(&mut buf, &req, &[0u8; 40]).unwrap();
        let limit = io::Error::new(io::ErrorKind::OutOfMemory, "over the guest's limit");
        let r = read_frame_admitted::<Request, (), _>(&mut &buf[..], 64, |len| {
            assert_eq!(len, 40);
            Err(limit)
        });
        let Err(e @ StreamFrameError::Refused { len: 40, .. }) = r else {
            panic!("not refused: {r:?}");
        };
        assert_eq!(
            e.to_string(),
            "payload of 40 bytes refused: over the guest's limit"
        );
        let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<io::Error>());
        assert_eq!(
            source.map(io::Error::kind),
            Some(io::ErrorKind::OutOfMemory)
        );
    }

    /// A stream that takes or gives at most a few bytes per call, with interruptions and
    /// timeouts in between (a slow, congested peer).
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        calls: usize,
    }

    impl Trickle {
        fn hiccup(&mut self) -> Option<io::Error> {
            self.calls += 1;
            match self.calls % 5 {
                1 => Some(io::ErrorKind::Interrupted.into()),
                3 => Some(io::ErrorKind::WouldBlock.into()),
                _ => None,
            }
        }
    }

    impl Write for Trickle {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            if let Some(e) = self
                .hiccup()
                .filter(|e| e.kind() == io::ErrorKind::Interrupted)
            {
                return Err(e);
            }
            let n = b.len().min(1 + self.calls % 7);
            self.data.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Read for Trickle {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            if let Some(e) = self.hiccup() {
                return Err(e);
            }
            let n = b
                .len()
                .min(1 + self.calls % 3)
                .min(self.data.len() - self.at);
            b[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    /// Partial writes, interrupted writes and reads, and reads that time out mid-frame keep
    /// every byte of every frame, in order.
    #[test]
    fn partial_and_interrupted_transfers_keep_every_byte_in_order() {
        let mut t = Trickle {
            data: Vec::new(),
            at: 0,
            calls: 0,
        };
        let payloads: Vec<Vec<u8>> = (0..20u32)
            .map(|i| (0..i * 37).map(|b| (b ^ i) as u8).collect())
            .collect();
        for (i, p) in payloads.iter().enumerate() {
            let req = Request::new(i as u64, Opcode::EndAccess, DeviceId::CPU, [0; 6]);
            write_frame(&mut t, &req, p).unwrap();
        }
        t.calls = 0;
        for (i, p) in payloads.iter().enumerate() {
            // A timeout before a frame's first byte is "no frame yet": nothing was consumed.
            let f: StreamFrame<Request> = loop {
                match read_frame(&mut t, 1 << 20) {
                    Err(e) if e.is_timeout() => continue,
                    r => break r.unwrap(),
                }
            };
            assert_eq!(f.entry.seq, i as u64);
            assert_eq!(&f.payload, p, "frame {i}");
        }
    }
}
