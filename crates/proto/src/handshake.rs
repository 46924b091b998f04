//! The connection handshake on the Unix socket (and later TCP).
//!
//! Frames are a little-endian u32 length followed by that many bytes of JSON; a frame may carry
//! one file descriptor (SCM_RIGHTS), which is how the host hands the memfd window to a process
//! guest. After the handshake the socket stays open: its hang-up is how each side learns that
//! the other one went away.

use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::layout::WindowLayout;
use crate::{ProtoError, Result};

/// Version of the protocol spoken after the handshake.
pub const PROTOCOL_VERSION: u32 = 1;
/// Largest handshake frame accepted.
pub const MAX_FRAME: usize = 64 * 1024;

/// First message, guest -> host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Hello {
    pub protocol: u32,
    /// Free-form guest name for logs.
    pub name: String,
    /// Requested window size in bytes (the host may clamp it).
    pub window_size: u64,
    pub sq_entries: u32,
    pub cq_entries: u32,
    /// Credential for transports that need one (remote guests).
    #[serde(default)]
    pub token: Option<String>,
    /// Coherence protocol requested for this guest's regions (`None`: the daemon's default).
    #[serde(default)]
    pub coherence: Option<String>,
}

/// A device the daemon offers, as listed in the welcome.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceDesc {
    pub id: u32,
    pub name: String,
    /// The backend serving it (library, driver, mode).
    pub backend: String,
    /// The memory domain holding its replicas.
    pub domain: String,
    /// That domain's id (as the copy ledger names it).
    #[serde(default)]
    pub domain_id: u32,
}

/// Answer, host -> guest. A `Welcome` carries the window's file descriptor.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Reply {
    Welcome {
        guest_id: u64,
        layout: WindowLayout,
        /// Name of the coherence protocol the daemon runs.
        coherence: String,
        /// The devices the daemon offers.
        #[serde(default)]
        devices: Vec<DeviceDesc>,
    },
    Refused {
        reason: String,
    },
}

/// Sends one frame, optionally with a file descriptor attached.
pub fn send_frame(sock: BorrowedFd<'_>, body: &[u8], fd: Option<BorrowedFd<'_>>) -> Result<()> {
    if body.len() > MAX_FRAME {
        return Err(ProtoError::Handshake("frame too large".into()));
    }
    let len = (body.len() as u32).to_le_bytes();
    let mut sent = 0usize;
    let total = 4 + body.len();
    let fds;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if let Some(fd) = fd {
        fds = [fd];
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(ProtoError::Handshake("cannot attach fd".into()));
        }
    }
    while sent < total {
        let (a, b): (&[u8], &[u8]) = if sent < 4 {
            (&len[sent..], body)
        } else {
            (&body[sent - 4..], &[])
        };
        let iov = [IoSlice::new(a), IoSlice::new(b)];
        let n = if sent == 0 {
            rustix::net::sendmsg(sock, &iov, &mut control, SendFlags::NOSIGNAL)
        } else {
            rustix::net::send(sock, a, SendFlags::NOSIGNAL)
        }
        .map_err(std::io::Error::from)?;
        if n == 0 {
            return Err(ProtoError::Closed);
        }
        sent += n;
    }
    Ok(())
}

/// Receives one frame and the file descriptor that came with it, if any.
pub fn recv_frame(sock: BorrowedFd<'_>) -> Result<(Vec<u8>, Option<OwnedFd>)> {
    let mut head = [0u8; 4];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut got = 0;
    let mut fd = None;
    while got < 4 {
        let mut iov = [IoSliceMut::new(&mut head[got..])];
        let r = rustix::net::recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)
            .map_err(std::io::Error::from)?;
        if r.bytes == 0 {
            return Err(ProtoError::Closed);
        }
        got += r.bytes;
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(mut it) = msg {
                if let Some(f) = it.next() {
                    fd = Some(f);
                }
            }
        }
    }
    let len = u32::from_le_bytes(head) as usize;
    if len > MAX_FRAME {
        return Err(ProtoError::Handshake(format!(
            "frame of {len} bytes too large"
        )));
    }
    let mut body = vec![0u8; len];
    let mut stream = FdReader(sock);
    stream.read_exact(&mut body)?;
    Ok((body, fd))
}

struct FdReader<'a>(BorrowedFd<'a>);

impl Read for FdReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        Ok(rustix::io::read(self.0, buf)?)
    }
}

/// Sends a JSON message.
pub fn send_json<T: Serialize>(
    sock: &impl AsFd,
    msg: &T,
    fd: Option<BorrowedFd<'_>>,
) -> Result<()> {
    let body = serde_json::to_vec(msg).map_err(|e| ProtoError::Handshake(e.to_string()))?;
    send_frame(sock.as_fd(), &body, fd)
}

/// Receives a JSON message.
pub fn recv_json<T: DeserializeOwned>(sock: &impl AsFd) -> Result<(T, Option<OwnedFd>)> {
    let (body, fd) = recv_frame(sock.as_fd())?;
    let msg = serde_json::from_slice(&body).map_err(|e| ProtoError::Handshake(e.to_string()))?;
    Ok((msg, fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn frames_carry_json_and_fds() {
        let (a, b) = UnixStream::pair().unwrap();
        let hello = Hello {
            protocol: PROTOCOL_VERSION,
            name: "g".into(),
            window_size: 1 << 20,
            sq_entries: 64,
            cq_entries: 64,
            token: None,
            coherence: None,
        };
        let file = std::fs::File::open("/dev/null").unwrap();
        send_json(&a, &hello, Some(file.as_fd())).unwrap();
        let (got, fd): (Hello, _) = recv_json(&b).unwrap();
        assert_eq!(got, hello);
        assert!(fd.is_some());
        send_json(&a, &Reply::Refused { reason: "x".into() }, None).unwrap();
        let (r, fd): (Reply, _) = recv_json(&b).unwrap();
        assert!(fd.is_none());
        assert_eq!(r, Reply::Refused { reason: "x".into() });
    }

    #[test]
    fn oversized_and_truncated_frames_fail() {
        let (a, b) = UnixStream::pair().unwrap();
        rustix::io::write(&a, &(1u32 << 30).to_le_bytes()).unwrap();
        assert!(recv_frame(b.as_fd()).is_err());
        let (a, b) = UnixStream::pair().unwrap();
        rustix::io::write(&a, &10u32.to_le_bytes()).unwrap();
        drop(a);
        assert!(recv_frame(b.as_fd()).is_err());
    }
}
