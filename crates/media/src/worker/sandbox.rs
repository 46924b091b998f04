//! The sandbox of the media workers (decoders, the ISP's swscale, encoders), entered before
//! a worker reads anything from its parent: [`virtsoc_sandbox`], the one every virtsoc
//! worker enters (no new privileges, root dropped to a user of its own per daemon,
//! [`WORKER_UID_BASE`] + the daemon's pid, seccomp filters on every thread), with the
//! calls decoding and converting need: reading and writing the descriptors the worker has
//! (its socket), memory (mapping, protecting, advising), threads (libavcodec's frame and
//! slice threads: futexes, scheduling, signal masks), time, and memfds for the shared
//! picture buffers. Opening files answers `EACCES` (libraries that probe `/proc` or `/sys`
//! then fall back); everything else - `fork`, sockets, exec, `ptrace`, `kill` - kills the
//! worker, which its parent sees as a crashed worker.

use crate::error::{MediaError, Result};

/// System calls a worker may make.
const ALLOWED: &[i64] = &[
    // Its descriptors: the socket to the parent, memfds, stderr.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_close,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_lseek,
    libc::SYS_fcntl,
    libc::SYS_ftruncate,
    libc::SYS_memfd_create,
    libc::SYS_ppoll,
    // Memory.
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    // Threads (clone and tgkill with their arguments checked: `checked_rules`).
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_prctl,
    // More filters (they can only narrow what is allowed): the second filter below.
    libc::SYS_seccomp,
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_exit,
    libc::SYS_exit_group,
    // Time and randomness.
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettimeofday,
    libc::SYS_getrandom,
    libc::SYS_sysinfo,
];

/// System calls that answer `EACCES` instead of killing the worker (with their older forms).
const REFUSED: &[i64] = &[libc::SYS_openat, libc::SYS_readlinkat];

/// The first user id of media workers of a root daemon: a worker runs as this plus its
/// daemon's pid.
pub const WORKER_UID_BASE: u32 = 0x4000_0000;

/// Enters the sandbox, for every thread of the process.
pub fn enter() -> Result<()> {
    virtsoc_sandbox::enter(&virtsoc_sandbox::Policy {
        allowed: ALLOWED,
        refused: REFUSED,
        uid_base: WORKER_UID_BASE,
    })
    .map_err(|e| MediaError::Unsupported(format!("worker sandbox: {e}")))
}

/// The user a worker of the daemon with pid `daemon` runs as when started by root.
pub fn worker_uid(daemon: u32) -> u32 {
    virtsoc_sandbox::worker_uid(WORKER_UID_BASE, daemon)
}
