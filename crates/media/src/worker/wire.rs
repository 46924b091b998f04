//! The messages between a parent (a decoder, the ISP) and its worker process: length-prefixed little-endian
//! records on a Unix stream socket, file descriptors (shared picture buffers) riding with a
//! message's length prefix as `SCM_RIGHTS`. Every read is bounds-checked: the parent parses
//! what a possibly compromised worker sent.

use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

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

/// Reader of one received message; every read is bounds-checked.
pub(crate) struct In {
    buf: Vec<u8>,
    at: usize,
    /// Descriptors that came with the message, in order.
    pub(crate) fds: Vec<OwnedFd>,
}

impl In {
    /// Receives one message of at most `max` bytes, with the descriptors that came with its
    /// length prefix (at most [`MAX_FDS`]; a message that brought more is refused).
    pub(crate) fn recv(sock: &mut UnixStream, max: usize) -> std::io::Result<In> {
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
        let mut buf = vec![0u8; len as usize];
        sock.read_exact(&mut buf)?;
        Ok(In { buf, at: 0, fds })
    }
    /// A message already received, without descriptors.
    pub(crate) fn from_bytes(buf: Vec<u8>) -> In {
        In {
            buf,
            at: 0,
            fds: Vec::new(),
        }
    }
    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.at)
    }
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let s = self
            .buf
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

    #[test]
    fn an_oversized_message_is_refused() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        Out(vec![0; 100]).send(&mut a, &[]).unwrap();
        assert!(In::recv(&mut b, 99).is_err());
    }
}
