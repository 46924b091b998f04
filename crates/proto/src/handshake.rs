//! The connection handshake on the Unix socket (and later TCP).
//!
//! Frames are a little-endian u32 length followed by that many bytes of JSON; a frame may carry
//! one file descriptor (SCM_RIGHTS), which is how the host hands the memfd window to a process
//! guest. After the handshake the socket stays open: its hang-up is how each side learns that
//! the other one went away.

use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::window_layout::WindowLayout;
use crate::{ProtoError, Result};

/// Version of the protocol spoken after the handshake. 2: the control page's
/// `FENCE_WAITERS` word (guests sleep on fence slots, the host wakes them) and the display's
/// `timing` reply with `ready_max_ns`; a version-1 guest or daemon is refused by name instead
/// of waiting on fences nobody wakes.
pub const PROTOCOL_VERSION: u32 = 2;
/// Largest handshake frame accepted.
pub const MAX_FRAME: usize = 64 * 1024;

/// First message, guest -> host.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Hello {
    /// The guest's handshake version ([`PROTOCOL_VERSION`]); another version is refused.
    pub protocol: u32,
    /// Free-form guest name for logs.
    pub name: String,
    /// Requested window size in bytes (the host may clamp it).
    pub window_size: u64,
    /// Entries of the submission ring asked for (a power of two; the host may clamp it).
    pub sq_entries: u32,
    /// Entries of the completion ring asked for (a power of two; the host may clamp it).
    pub cq_entries: u32,
    /// Credential for transports that need one (remote guests).
    #[serde(default)]
    pub token: Option<String>,
    /// Coherence protocol requested for this guest's regions (`None`: the daemon's default).
    #[serde(default)]
    pub coherence: Option<String>,
    /// Resume a saved session (daemon restart): the secret its welcome carried. The daemon
    /// restores that session's regions and fences into this connection, or refuses.
    #[serde(default)]
    pub resume: Option<String>,
}

/// A device the daemon offers, as listed in the welcome.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceDesc {
    /// The device id device commands name (`virtsoc_proto::DeviceId`).
    pub id: u32,
    /// The device's name (`gpu`, `display`, `codec`, ...).
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
    /// The guest is admitted; the window's file descriptor comes with this frame.
    Welcome {
        /// The guest's id in this daemon (in logs, the control API and region keys).
        guest_id: u64,
        /// Where the rings, fence page and data area sit in the window.
        layout: WindowLayout,
        /// Name of the coherence protocol the daemon runs.
        coherence: String,
        /// The devices the daemon offers.
        #[serde(default)]
        devices: Vec<DeviceDesc>,
        /// The secret that resumes this session after a daemon restart (`Hello::resume`),
        /// when the daemon keeps sessions across restarts.
        #[serde(default)]
        resume: Option<String>,
    },
    /// The guest is not admitted (bad version or token, limits, unknown resume secret).
    Refused {
        /// Why, for the guest's error message.
        reason: String,
    },
    /// The session a guest asked to resume lives in the daemon on this Unix socket now (it
    /// migrated): the guest resumes it there.
    Moved {
        /// The daemon's Unix socket path.
        socket: String,
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
    recv_frame_inner(sock, None)
}

/// Like [`recv_frame`], but the whole frame must have arrived by `deadline`: a peer that
/// sends it a byte at a time cannot hold the reader past it.
pub fn recv_frame_until(
    sock: BorrowedFd<'_>,
    deadline: Instant,
) -> Result<(Vec<u8>, Option<OwnedFd>)> {
    recv_frame_inner(sock, Some(deadline))
}

/// Waits until `sock` is readable (data or hang-up), or fails once `deadline` has passed.
fn wait_readable(sock: BorrowedFd<'_>, deadline: Option<Instant>) -> Result<()> {
    let Some(deadline) = deadline else {
        return Ok(());
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ProtoError::Handshake("timed out".into()));
        }
        let timeout = rustix::time::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: left.subsec_nanos() as _,
        };
        let mut fds = [rustix::event::PollFd::new(
            &sock,
            rustix::event::PollFlags::IN,
        )];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(n) if n > 0 => return Ok(()),
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
    }
}

fn recv_frame_inner(
    sock: BorrowedFd<'_>,
    deadline: Option<Instant>,
) -> Result<(Vec<u8>, Option<OwnedFd>)> {
    let mut head = [0u8; 4];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut got = 0;
    let mut fd = None;
    while got < 4 {
        wait_readable(sock, deadline)?;
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
    let mut stream = FdReader(sock, deadline);
    stream.read_exact(&mut body).map_err(|e| {
        if e.kind() == std::io::ErrorKind::TimedOut {
            ProtoError::Handshake("timed out".into())
        } else {
            e.into()
        }
    })?;
    Ok((body, fd))
}

struct FdReader<'a>(BorrowedFd<'a>, Option<Instant>);

impl Read for FdReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if wait_readable(self.0, self.1).is_err() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        Ok(rustix::io::read(self.0, buf)?)
    }
}

/// Sends a JSON message.
pub fn send_json<T: Serialize>(
    sock: &impl AsFd,
    msg: &T,
    fd: Option<BorrowedFd<'_>>,
) -> Result<()> {
    let body = serde_json::to_vec(msg)?;
    send_frame(sock.as_fd(), &body, fd)
}

/// Receives a JSON message.
pub fn recv_json<T: DeserializeOwned>(sock: &impl AsFd) -> Result<(T, Option<OwnedFd>)> {
    let (body, fd) = recv_frame(sock.as_fd())?;
    let msg = serde_json::from_slice(&body)?;
    Ok((msg, fd))
}

/// Receives a JSON message that must have arrived completely by `deadline`.
pub fn recv_json_until<T: DeserializeOwned>(
    sock: &impl AsFd,
    deadline: Instant,
) -> Result<(T, Option<OwnedFd>)> {
    let (body, fd) = recv_frame_until(sock.as_fd(), deadline)?;
    let msg = serde_json::from_slice(&body)?;
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
            resume: None,
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

    #[test]
    fn a_trickled_frame_misses_the_deadline() {
        use std::time::Duration;
        let (a, b) = UnixStream::pair().unwrap();
        let body = br#"{"x":1}"#;
        let trickler = std::thread::spawn(move || {
            // A byte every 100 ms: each read is quick, the whole frame takes over 1 s.
            let frame = [&(body.len() as u32).to_le_bytes()[..], &body[..]].concat();
            for byte in frame {
                if rustix::io::write(&a, &[byte]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let start = Instant::now();
        let r = recv_frame_until(b.as_fd(), start + Duration::from_millis(300));
        assert!(
            matches!(&r, Err(ProtoError::Handshake(m)) if m.contains("timed out")),
            "{r:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
        drop(b);
        trickler.join().unwrap();
        // A frame sent at once is read well within its deadline.
        let (a, b) = UnixStream::pair().unwrap();
        send_frame(a.as_fd(), body, None).unwrap();
        let (got, _) =
            recv_frame_until(b.as_fd(), Instant::now() + Duration::from_secs(30)).unwrap();
        assert_eq!(got, body);
    }
}
