//! The render worker process of one guest's GLES contexts, as the `gles` device sees it:
//! starting it (its socket as stdin), one batch and its answer at a time (bounded and
//! validated: the daemon trusts nothing the worker says beyond its bounds), ending it, and
//! the device time its answers report.

use std::io::{self, IoSlice, Read};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::time::Duration;

use virtsoc_proto::stream::write_all_vectored;

use super::maps::MAX_MAPPED;
use super::{ANSWER_LOST, MAX_GL_BYTES, MAX_MSG, MAX_REPLY};

/// Why a guest's render worker (and with it the guest's GL contexts) is lost.
#[derive(Debug, thiserror::Error)]
pub(super) enum WorkerError {
    /// No socket pair for the worker.
    #[error("socketpair for the render worker: {0}")]
    Socket(#[source] io::Error),
    /// The worker program could not be started.
    #[error("cannot start render worker {}: {source}", program.display())]
    Start {
        /// The program.
        program: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The socket's timeouts could not be set.
    #[error("render worker socket: {0}")]
    Timeouts(#[source] io::Error),
    /// A batch longer than the length word holds.
    #[error("batch too large")]
    BatchTooLarge,
    /// Sending the descriptors a batch maps failed.
    #[error("sending descriptors to the render worker: {0}")]
    SendFds(#[source] io::Error),
    /// Sending a batch failed.
    #[error("sending to the render worker: {0}")]
    Send(#[source] io::Error),
    /// Reading an answer failed (the worker died, or passed the deadline).
    #[error("reading the render worker's answer: {0}")]
    Read(#[source] io::Error),
    /// An answer claims more GL memory than any guest may hold.
    #[error("render worker claims {0} bytes of GL objects")]
    GlBytes(u64),
    /// An answer's head is out of bounds.
    #[error(
        "render worker sent a malformed answer (status {status}, {reply_len} + {msg_len} bytes, \
         {placed} placed, {mapped} mapped)"
    )]
    Malformed {
        /// Its status word.
        status: u32,
        /// Reply bytes it announced.
        reply_len: usize,
        /// Message bytes it announced.
        msg_len: usize,
        /// Bytes it says it placed in a replica.
        placed: usize,
        /// Replicas it says it holds mapped.
        mapped: usize,
    },
    /// A replica a batch names could not be mapped in the worker.
    #[error("a replica could not be mapped in the render worker")]
    Unmappable,
    /// The guest's GL memory after a batch passes its memory limit.
    #[error("GL objects of {bytes} bytes exceed the guest's memory limit ({source})")]
    OverLimit {
        /// The GL memory the worker reported.
        bytes: u64,
        /// The refusal.
        source: virtsoc_svm::SvmError,
    },
}

/// What a worker's answer says of its guest's use of the host.
#[derive(Clone, Copy)]
pub(super) struct WorkerUse {
    /// The guest's GL memory after the batch (at most [`MAX_GL_BYTES`]).
    pub(super) gl_bytes: u64,
}

pub(super) use crate::device::share::DeviceClock;

/// A worker's answer to one batch.
pub(super) struct Answer {
    pub(super) status: u32,
    /// The answers that came on the socket.
    pub(super) reply: Vec<u8>,
    /// Why the batch failed, if it did.
    pub(super) msg: String,
    pub(super) used: WorkerUse,
    /// Bytes of answers the worker wrote into the reply region's replica instead (at most
    /// [`MAX_REPLY`]; the reply on the socket is empty then).
    pub(super) placed: usize,
    /// The replicas the worker holds mapped (at most [`MAX_MAPPED`]).
    pub(super) mapped: usize,
}

/// Sends the first bytes of `head` with `fds` attached (`SCM_RIGHTS`); how many bytes went.
fn send_fds(sock: &UnixStream, head: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<usize> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space =
        vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other(
            "too many descriptors for one message",
        ));
    }
    loop {
        match rustix::net::sendmsg(
            sock,
            &[IoSlice::new(head)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            r => return Ok(r?),
        }
    }
}

/// Answers of at most this many bytes are read into a buffer of their own (see
/// [`Worker::call`]).
const SMALL_REPLY: usize = 64 << 10;

/// A started worker.
pub(super) struct Worker {
    pub(super) child: Child,
    pub(super) sock: UnixStream,
    /// A reply buffer given back ([`Worker::recycle`]) for the next answer: a fresh one of a
    /// frame's size (a readback) cost page faults on every answer.
    spare: Vec<u8>,
}

impl Worker {
    pub(super) fn start(program: &Path, deadline: Duration) -> Result<Worker, WorkerError> {
        let (ours, theirs) = UnixStream::pair().map_err(WorkerError::Socket)?;
        let child = Process::new(program)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            // One line: the shader precision it runs guest shaders at (`gles_precision.rs`).
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| WorkerError::Start {
                program: program.to_path_buf(),
                source,
            })?;
        ours.set_read_timeout(Some(deadline))
            .and_then(|()| ours.set_write_timeout(Some(deadline)))
            .map_err(WorkerError::Timeouts)?;
        Ok(Worker {
            child,
            sock: ours,
            spare: Vec::new(),
        })
    }

    /// Sends one batch (`fds` riding on its first byte) and reads the answer.
    pub(super) fn call(
        &mut self,
        batch: &[u8],
        flags: u32,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Answer, WorkerError> {
        let n = u32::try_from(batch.len()).map_err(|_| WorkerError::BatchTooLarge)?;
        let mut head = [0u8; 8];
        head[..4].copy_from_slice(&n.to_le_bytes());
        head[4..].copy_from_slice(&flags.to_le_bytes());
        let mut sent = 0;
        if !fds.is_empty() {
            sent = send_fds(&self.sock, &head, fds).map_err(WorkerError::SendFds)?;
        }
        write_all_vectored(
            &mut self.sock,
            &mut [IoSlice::new(&head[sent..]), IoSlice::new(batch)],
        )
        .map_err(WorkerError::Send)?;
        let mut head = [0u8; 28];
        self.sock.read_exact(&mut head).map_err(WorkerError::Read)?;
        let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let (status, reply_len, msg_len) = (word(0), word(4) as usize, word(8) as usize);
        let long = |i: usize| u64::from(word(i)) | u64::from(word(i + 4)) << 32;
        let used = WorkerUse { gl_bytes: long(12) };
        let (placed, mapped) = (word(20) as usize, word(24) as usize);
        if used.gl_bytes > MAX_GL_BYTES {
            return Err(WorkerError::GlBytes(used.gl_bytes));
        }
        if status > ANSWER_LOST
            || reply_len > MAX_REPLY
            || msg_len > MAX_MSG
            || placed > MAX_REPLY
            || (placed > 0 && reply_len > 0)
            || mapped > MAX_MAPPED
        {
            return Err(WorkerError::Malformed {
                status,
                reply_len,
                msg_len,
                placed,
                mapped,
            });
        }
        // Small answers (most batches') in a buffer of their own: the spare one is kept for
        // the large ones (readbacks), whose buffer comes back through `recycle`.
        let mut reply = if reply_len <= SMALL_REPLY {
            Vec::new()
        } else {
            std::mem::take(&mut self.spare)
        };
        reply.clear();
        reply.resize(reply_len, 0);
        let mut msg = vec![0u8; msg_len];
        self.sock
            .read_exact(&mut reply)
            .and_then(|()| self.sock.read_exact(&mut msg))
            .map_err(WorkerError::Read)?;
        Ok(Answer {
            status,
            reply,
            msg: String::from_utf8_lossy(&msg).into_owned(),
            used,
            placed,
            mapped,
        })
    }

    /// Gives a reply buffer back for the next answer (the larger one is kept).
    pub(super) fn recycle(&mut self, buf: Vec<u8>) {
        if buf.capacity() > self.spare.capacity() {
            self.spare = buf;
        }
    }

    /// The worker's CPU time so far, all its threads (the driver's too), as the kernel
    /// counts it ([`virtsoc_sandbox::cpu_ns_of`]): not as the worker would say. The worker
    /// is not reaped before [`end`](Self::end), so its pid is still its own.
    pub(super) fn cpu_ns(&self) -> Option<u64> {
        virtsoc_sandbox::cpu_ns_of(self.child.id())
    }

    /// Ends the worker: killed if still running, reaped; describes how it ended.
    pub(super) fn end(mut self) -> String {
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        match self.child.try_wait() {
            Ok(Some(s)) => format!("render worker exited ({s})"),
            _ => {
                let _ = self.child.kill();
                let s = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                format!("render worker killed ({s})")
            }
        }
    }
}
