//! The messages between a parent (a decoder, the ISP) and its worker process: length-prefixed little-endian
//! records on a Unix stream socket, file descriptors (shared picture buffers) riding with a
//! message's length prefix as `SCM_RIGHTS`. Every read is bounds-checked: the parent parses
//! what a possibly compromised worker sent.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use ff::packet::Mut as _;
use ffmpeg_next as ff;

use crate::error::{MediaError, Result};
use crate::frame::{FrameLayout, PixelFormat};

/// Longest message text (reasons, names).
pub(crate) const MAX_TEXT: u32 = 4096;
/// Most file descriptors one message may carry.
pub(crate) const MAX_FDS: usize = 64;

/// Little-endian writer into a message buffer.
#[derive(Default)]
pub(crate) struct Out(pub(crate) Vec<u8>);

impl Out {
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
    pub(crate) fn text(&mut self, s: &str) -> &mut Self {
        let s = &s.as_bytes()[..s.len().min(MAX_TEXT as usize)];
        self.bytes(s)
    }
    /// A frame layout: format (its place in [`PixelFormat::ALL`]), width, height, stride.
    pub(crate) fn layout(&mut self, l: &FrameLayout) -> &mut Self {
        let format = PixelFormat::ALL.iter().position(|p| *p == l.format);
        self.u8(format.unwrap_or(0) as u8)
            .u32(l.width)
            .u32(l.height)
            .u32(l.stride)
    }
    /// Sends the message: its length (with `fds` attached, when there are any), then its
    /// bytes, in one write where the socket takes them.
    pub(crate) fn send(
        &self,
        sock: &mut UnixStream,
        fds: &[BorrowedFd<'_>],
    ) -> std::io::Result<()> {
        // Prefix and body in one write where the socket takes it: a reader woken by the
        // prefix alone would sleep again on the body (a second wake-up per message).
        let mut sent = 0;
        if !fds.is_empty() {
            let len = (self.0.len() as u64).to_le_bytes();
            let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !control.push(SendAncillaryMessage::ScmRights(fds)) {
                return Err(std::io::Error::other(
                    "too many descriptors for one message",
                ));
            }
            // A signal caught before anything was sent: send again. The descriptors go
            // with the first byte; the rest follows plainly.
            sent = loop {
                match rustix::net::sendmsg(
                    &*sock,
                    &[IoSlice::new(&len), IoSlice::new(&self.0)],
                    &mut control,
                    SendFlags::NOSIGNAL,
                ) {
                    Err(rustix::io::Errno::INTR) => continue,
                    r => break r?,
                }
            };
        }
        send_parts(sock, &[&self.0], sent, false).map(|_| ())
    }
}

/// Sends the message made of `parts` (its length prefix first, then the parts, in one
/// vectored write where the socket takes it), from byte `from` of prefix and parts together:
/// all of it (waiting within the socket's timeout), or with `now_only` what the socket
/// takes without waiting. Returns how many bytes of it are sent.
pub(crate) fn send_parts(
    sock: &UnixStream,
    parts: &[&[u8]],
    from: usize,
    now_only: bool,
) -> std::io::Result<usize> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let len = (total as u64).to_le_bytes();
    let all = len.len() + total;
    let flags = match now_only {
        true => SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        false => SendFlags::NOSIGNAL,
    };
    let mut at = from;
    while at < all {
        let mut skip = at;
        let mut iov = Vec::with_capacity(parts.len() + 1);
        for p in std::iter::once(&len[..]).chain(parts.iter().copied()) {
            if skip >= p.len() {
                skip -= p.len();
                continue;
            }
            iov.push(IoSlice::new(&p[skip..]));
            skip = 0;
        }
        let mut control = SendAncillaryBuffer::default();
        match rustix::net::sendmsg(sock, &iov, &mut control, flags) {
            Ok(n) => at += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::AGAIN) if now_only => break,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(at)
}

/// Whether bytes wait to be read on `sock` (or it was hung up), without waiting.
pub(crate) fn readable(sock: &UnixStream) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        sock,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
}

pub(crate) fn bad(what: &str) -> MediaError {
    MediaError::Decode(format!("worker: malformed message ({what})"))
}

/// Where a received message's bytes are.
enum Storage {
    Bytes(Vec<u8>),
    /// In a packet's buffer of libavcodec (zeroed padding after the message), so that the
    /// message's tail can go to a decoder without a copy ([`In::packet_tail`]).
    Packet(ff::Packet),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Bytes(v) => v,
            Storage::Packet(p) => p.data().unwrap_or_default(),
        }
    }
}

/// Reader of one received message; every read is bounds-checked.
pub(crate) struct In {
    buf: Storage,
    at: usize,
    /// Descriptors that came with the message, in order.
    pub(crate) fds: Vec<OwnedFd>,
}

/// Fills `buf` from the socket, as `read_exact` does, without initialising it first.
fn read_uninit(sock: &UnixStream, mut buf: &mut [MaybeUninit<u8>]) -> std::io::Result<()> {
    while !buf.is_empty() {
        let n = match rustix::io::read(sock, &mut *buf) {
            Ok((filled, _)) => filled.len(),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf = &mut std::mem::take(&mut buf)[n..];
    }
    Ok(())
}

impl In {
    /// Receives one message of at most `max` bytes, with the descriptors that came with its
    /// length prefix (at most [`MAX_FDS`]; a message that brought more is refused).
    pub(crate) fn recv(sock: &mut UnixStream, max: usize) -> std::io::Result<In> {
        let (len, fds) = Self::prefix(sock, max)?;
        let mut buf = Vec::with_capacity(len);
        read_uninit(sock, &mut buf.spare_capacity_mut()[..len])?;
        // SAFETY: `read_uninit` initialised the first `len` bytes.
        unsafe { buf.set_len(len) };
        Ok(In {
            buf: Storage::Bytes(buf),
            at: 0,
            fds,
        })
    }

    /// [`recv`](Self::recv) into a libavcodec packet's buffer: a decoder worker's calls,
    /// whose packet (the message's tail) then goes to libavcodec as it came
    /// ([`packet_tail`](Self::packet_tail)) - no copy of it in the worker but the socket's.
    pub(crate) fn recv_packet(sock: &mut UnixStream, max: usize) -> std::io::Result<In> {
        let (len, fds) = Self::prefix(sock, max)?;
        let mut packet = ff::Packet::new(len);
        if packet.data().is_none() {
            return Err(std::io::Error::other(format!("no memory for {len} bytes")));
        }
        if len > 0 {
            // SAFETY: `av_new_packet` allocated `len` bytes (and zeroed padding after them)
            // at `data`; they are only written here, then read once initialised.
            let data = unsafe {
                let p = packet.as_mut_ptr();
                std::slice::from_raw_parts_mut((*p).data.cast::<MaybeUninit<u8>>(), len)
            };
            read_uninit(sock, data)?;
        }
        Ok(In {
            buf: Storage::Packet(packet),
            at: 0,
            fds,
        })
    }

    /// A message's length prefix and the descriptors that came with it.
    fn prefix(sock: &mut UnixStream, max: usize) -> std::io::Result<(usize, Vec<OwnedFd>)> {
        let mut len = [0u8; 8];
        let mut got = 0;
        let mut fds = Vec::new();
        let mut truncated = false;
        while got < len.len() {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let r = match rustix::net::recvmsg(
                &*sock,
                &mut [IoSliceMut::new(&mut len[got..])],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                // A signal caught before anything arrived: nothing was received, wait again.
                Err(rustix::io::Errno::INTR) => continue,
                r => r?,
            };
            for m in control.drain() {
                if let RecvAncillaryMessage::ScmRights(received) = m {
                    fds.extend(received);
                }
            }
            truncated |= r.flags.contains(rustix::net::ReturnFlags::CTRUNC);
            if r.bytes == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            got += r.bytes;
        }
        if truncated || fds.len() > MAX_FDS {
            return Err(std::io::Error::other("a message with too many descriptors"));
        }
        let len = u64::from_le_bytes(len);
        if len > max as u64 {
            return Err(std::io::Error::other(format!("message of {len} bytes")));
        }
        Ok((len as usize, fds))
    }

    /// The rest of the message as [`bytes`](Self::bytes) wrote it (its length, then
    /// exactly the bytes left) as a libavcodec packet: the message's own buffer when it was
    /// received into one ([`recv_packet`](Self::recv_packet)), else a copy.
    pub(crate) fn packet_tail(&mut self) -> Result<ff::Packet> {
        let n = self.u32()? as usize;
        if n != self.remaining() {
            return Err(bad("packet not at the end"));
        }
        let at = self.at;
        self.at += n;
        match std::mem::replace(&mut self.buf, Storage::Bytes(Vec::new())) {
            Storage::Packet(mut p) => {
                // SAFETY: the packet's data stays in its own reference-counted buffer, from
                // `at` to its end (`at + n` is the message's length), and the padding
                // libavcodec reads past a packet's end follows the message's end.
                unsafe {
                    let raw = p.as_mut_ptr();
                    (*raw).data = (*raw).data.add(at);
                    (*raw).size = n as i32;
                }
                Ok(p)
            }
            Storage::Bytes(v) => Ok(ff::Packet::copy(&v[at..at + n])),
        }
    }
    /// A message already received, without descriptors.
    pub(crate) fn from_bytes(buf: Vec<u8>) -> In {
        In {
            buf: Storage::Bytes(buf),
            at: 0,
            fds: Vec::new(),
        }
    }
    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.bytes().len().saturating_sub(self.at)
    }
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let s = self
            .buf
            .bytes()
            .get(self.at..self.at.saturating_add(n))
            .ok_or_else(|| bad("short"))?;
        self.at += n;
        Ok(s)
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| bad("u32"))?,
        ))
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| bad("u64"))?,
        ))
    }
    pub(crate) fn bytes(&mut self) -> Result<&[u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    /// A frame layout as [`Out::layout`] writes it (not validated: the caller does).
    pub(crate) fn layout(&mut self) -> Result<FrameLayout> {
        let format = *PixelFormat::ALL
            .get(self.u8()? as usize)
            .ok_or_else(|| bad("format"))?;
        Ok(FrameLayout {
            format,
            width: self.u32()?,
            height: self.u32()?,
            stride: self.u32()?,
        })
    }
    pub(crate) fn text(&mut self) -> Result<String> {
        let n = self.u32()?;
        if n > MAX_TEXT {
            return Err(bad("text too long"));
        }
        Ok(String::from_utf8_lossy(self.take(n as usize)?).into_owned())
    }
}

/// `n` deterministic corruptions of `good` (one byte changed each), with the changed
/// byte's place: for the tests of a parent's parsing.
#[cfg(test)]
pub(crate) fn corruptions(good: &[u8], n: usize) -> impl Iterator<Item = (usize, Vec<u8>)> + '_ {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..n).map(move |_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut bad = good.to_vec();
        let i = (x as usize) % bad.len().max(1);
        if let Some(b) = bad.get_mut(i) {
            *b = (x >> 32) as u8;
        }
        (i, bad)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn descriptors_travel_with_their_message() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let f = tempfile::tempfile().unwrap();
        let mut m = Out::default();
        m.u32(7).text("hello");
        m.send(&mut a, &[f.as_fd(), f.as_fd()]).unwrap();
        Out::default().u8(1).send(&mut a, &[]).unwrap();
        let mut got = In::recv(&mut b, 1024).unwrap();
        assert_eq!(got.fds.len(), 2);
        assert_eq!(got.u32().unwrap(), 7);
        assert_eq!(got.text().unwrap(), "hello");
        assert!(got.u8().is_err(), "read past the message");
        let mut next = In::recv(&mut b, 1024).unwrap();
        assert!(next.fds.is_empty());
        assert_eq!(next.u8().unwrap(), 1);
    }

    /// A message sent in pieces (what the socket took at once, then the rest) arrives
    /// whole, after the messages sent before it.
    #[test]
    fn a_message_sent_in_parts_arrives_whole() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let big = vec![7u8; 4 << 20];
        let head = [1u8, 2, 3];
        assert!(!readable(&a), "nothing to read yet");
        let sent = send_parts(&a, &[&head, &big], 0, true).unwrap();
        assert!(
            sent < 8 + head.len() + big.len(),
            "the socket took it all at once"
        );
        let reader = std::thread::spawn(move || In::recv(&mut b, 8 << 20).unwrap());
        let done = send_parts(&a, &[&head, &big], sent, false).unwrap();
        assert_eq!(done, 8 + head.len() + big.len());
        let mut m = reader.join().unwrap();
        assert_eq!(m.remaining(), head.len() + big.len());
        assert_eq!([m.u8().unwrap(), m.u8().unwrap(), m.u8().unwrap()], head);
        assert!(m.take(big.len()).unwrap().iter().all(|b| *b == 7));
        assert!(readable(&a), "the other end hung up");
    }

    /// A decoder worker's call received into a libavcodec packet: its tail goes to the
    /// decoder as it came (the same bytes, libavcodec's zeroed padding after them); a tail
    /// that is not the whole rest of the message is refused.
    #[test]
    fn a_packet_at_a_message_s_end_is_handed_over_in_place() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let packet: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8 + 1).collect();
        let mut m = Out::default();
        m.u8(3).u64(42).bytes(&packet);
        m.send(&mut a, &[]).unwrap();
        let mut got = In::recv_packet(&mut b, 1 << 20).unwrap();
        assert_eq!((got.u8().unwrap(), got.u64().unwrap()), (3, 42));
        let base = got.buf.bytes().as_ptr();
        let p = got.packet_tail().unwrap();
        let data = p.data().unwrap();
        assert_eq!(data, &packet[..]);
        assert_eq!(data.as_ptr(), base.wrapping_add(1 + 8 + 4), "copied");
        // SAFETY: av_new_packet allocated AV_INPUT_BUFFER_PADDING_SIZE bytes after the
        // message, which ends where the packet does.
        let padding = unsafe {
            std::slice::from_raw_parts(
                data.as_ptr().add(data.len()),
                ff::ffi::AV_INPUT_BUFFER_PADDING_SIZE as usize,
            )
        };
        assert!(padding.iter().all(|b| *b == 0));
        assert!(got.u8().is_err(), "read past the packet");

        // Something after the packet: not a tail.
        let mut m = Out::default();
        m.bytes(&packet).u8(9);
        m.send(&mut a, &[]).unwrap();
        assert!(In::recv_packet(&mut b, 1 << 20)
            .unwrap()
            .packet_tail()
            .is_err());
        // A message received plainly hands over a copy.
        let mut m = Out::default();
        m.bytes(b"abc");
        m.send(&mut a, &[]).unwrap();
        let p = In::recv(&mut b, 64).unwrap().packet_tail().unwrap();
        assert_eq!(p.data().unwrap(), b"abc");
        // The peer hung up mid-message: an error, not a short packet.
        let mut m = Out::default();
        m.bytes(&packet);
        let len = (m.0.len() as u64).to_le_bytes();
        std::io::Write::write_all(&mut a, &len).unwrap();
        std::io::Write::write_all(&mut a, &m.0[..1000]).unwrap();
        drop(a);
        assert!(In::recv_packet(&mut b, 1 << 20).is_err());
    }

    #[test]
    fn an_oversized_message_is_refused() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        Out(vec![0; 100]).send(&mut a, &[]).unwrap();
        assert!(In::recv(&mut b, 99).is_err());
    }
}
