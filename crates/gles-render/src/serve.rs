//! The render worker's loop ([`serve_confined`]): reads the daemon's messages with the
//! descriptors riding on them, runs each on the [`Renderer`] and answers (the message
//! format is in [`crate::worker`]).

use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};
use virtsoc_gles_stream::Encoder;
use virtsoc_proto::stream::write_all_vectored;

use crate::egl::EglError;
use crate::sandbox::SandboxError;
use crate::worker::{Renderer, WorkerError, BAD_STREAM, FROM_DAEMON, LOST, MAX_BATCH, OK};

/// Most descriptors one message may bring (the daemon sends one per MAP).
pub const MAX_FDS: usize = 16;
/// Answers of at most this many bytes travel on the socket even with a reply mapping: the
/// daemon hands them to the guest in the exec's result words (`INLINE_REPLY` there).
pub const INLINE_REPLY: usize = 32;

/// Why the worker has no renderer and answers every batch `LOST` (the text goes to the
/// daemon with each answer, and to the worker's log).
#[derive(Debug, thiserror::Error)]
enum Unavailable {
    /// The host's EGL or GL could not be opened.
    #[error(transparent)]
    Egl(EglError),
    /// The sandbox could not be entered.
    #[error("render worker sandbox: {0}")]
    Sandbox(SandboxError),
}

/// Reads a message header (`u32 len | u32 flags`) into `hdr` with the descriptors that
/// came with it; `None` when the daemon hung up.
fn recv_header(
    sock: &UnixStream,
    hdr: &mut [u8; 8],
    fds: &mut VecDeque<OwnedFd>,
) -> std::io::Result<Option<()>> {
    let mut got = 0;
    while got < hdr.len() {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let r = match rustix::net::recvmsg(
            sock,
            &mut [IoSliceMut::new(&mut hdr[got..])],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            r => r?,
        };
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = m {
                fds.extend(received);
            }
        }
        if r.flags.contains(ReturnFlags::CTRUNC) || fds.len() > MAX_FDS {
            return Err(std::io::Error::other("a message with too many descriptors"));
        }
        if r.bytes == 0 {
            return match got {
                0 => Ok(None),
                _ => Err(std::io::ErrorKind::UnexpectedEof.into()),
            };
        }
        got += r.bytes;
    }
    Ok(Some(()))
}

/// Serves the daemon on `sock` until it hangs up.
pub fn serve(sock: UnixStream) -> Result<(), WorkerError> {
    serve_confined(sock, || Ok(()))
}

/// Serves the daemon on `sock` until it hangs up, calling `confine` once the host's EGL is
/// open (its driver loaded) and before the first batch is read: the sandbox
/// ([`crate::sandbox::enter`]). A sandbox that cannot be entered leaves the worker lost.
pub fn serve_confined(
    mut sock: UnixStream,
    confine: impl FnOnce() -> Result<(), SandboxError>,
) -> Result<(), WorkerError> {
    let mut renderer: Result<Renderer, Unavailable> = Renderer::new().map_err(Unavailable::Egl);
    if let Ok(r) = &mut renderer {
        r.warm_up();
    }
    if let Err(e) = confine() {
        renderer = Err(Unavailable::Sandbox(e));
    }
    if let Err(e) = &renderer {
        log::warn!("render worker: {e}");
    }
    let mut batch = Vec::new();
    // One reply buffer for every batch (a readback's answer is a frame's size: a fresh one
    // per batch cost page faults each time).
    let mut reply = Encoder::new();
    let mut fds = VecDeque::new();
    loop {
        let mut hdr = [0u8; 8];
        fds.clear();
        if recv_header(&sock, &mut hdr, &mut fds)?.is_none() {
            return Ok(());
        }
        let [l0, l1, l2, l3, f0, f1, f2, f3] = hdr;
        let trusted = u32::from_le_bytes([f0, f1, f2, f3]) & FROM_DAEMON != 0;
        let n = u32::from_le_bytes([l0, l1, l2, l3]) as usize;
        if n > MAX_BATCH {
            return Err(WorkerError::TooLarge(n));
        }
        // The buffer only grows (zero-filled once): batches of different sizes take turns
        // (a 256 KiB flush, then a small glFinish batch), and filling each one's bytes
        // before reading over them cost more than the copy.
        if batch.len() < n {
            batch.resize(n, 0);
        }
        sock.read_exact(&mut batch[..n])?;
        let body = &batch[..n];
        reply.clear();
        let (status, msg) = match &mut renderer {
            Err(e) => (LOST, e.to_string()),
            Ok(r) => {
                r.incoming = std::mem::take(&mut fds);
                r.reply_to = 0;
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    r.run(body, &mut reply, trusted)
                }));
                // Descriptors no MAP took are closed.
                r.incoming.clear();
                match ran {
                    Ok(Ok(())) => (OK, String::new()),
                    Ok(Err(e)) => (BAD_STREAM, e.to_string()),
                    Err(_) => (LOST, "the render worker panicked".into()),
                }
            }
        };
        let mut placed = 0u32;
        let mut answers: &[u8] = if status == OK { reply.as_bytes() } else { &[] };
        if let Ok(r) = &mut renderer {
            if answers.len() > INLINE_REPLY && r.reply_to != 0 {
                if let Some(m) = r.mappings.get_mut(r.reply_to) {
                    if let Some(dst) = m.bytes_mut().get_mut(..answers.len()) {
                        dst.copy_from_slice(answers);
                        placed = answers.len() as u32;
                        answers = &[];
                    }
                }
            }
        }
        let mut head = Vec::with_capacity(28);
        head.extend_from_slice(&status.to_le_bytes());
        head.extend_from_slice(&(answers.len() as u32).to_le_bytes());
        let msg = &msg.as_bytes()[..msg.len().min(4096)];
        head.extend_from_slice(&(msg.len() as u32).to_le_bytes());
        let gl_bytes = renderer.as_ref().map_or(0, Renderer::gl_bytes);
        head.extend_from_slice(&gl_bytes.to_le_bytes());
        head.extend_from_slice(&placed.to_le_bytes());
        let mapped = renderer.as_ref().map_or(0, |r| r.mappings.len() as u32);
        head.extend_from_slice(&mapped.to_le_bytes());
        // One sendmsg: the daemon's thread wakes once for the whole answer.
        write_all_vectored(
            &mut sock,
            &mut [
                IoSlice::new(&head),
                IoSlice::new(answers),
                IoSlice::new(msg),
            ],
        )?;
        sock.flush()?;
        if status == LOST {
            return Ok(());
        }
    }
}
