//! The render worker's sandbox ([`virtsoc_sandbox`], the one every virtsoc worker enters),
//! entered once the host's EGL is open (its driver loaded, its device opened) and before
//! the first batch is read: no new privileges, root dropped to a user of its own per daemon
//! ([`WORKER_UID_BASE`] + the daemon's pid), seccomp filters on every thread the worker has
//! (the driver's threads started at initialisation too) and will have.
//!
//! The filter allows what rendering with Mesa's llvmpipe needs, found by running
//! glmark2-es2 --off-screen (every default scene), es2gears_x11 and es2_info through the
//! sandboxed worker under `strace -f` (the list `ALLOWED` says what each call is for):
//! its socket to the daemon (`recvmsg`: the daemon's messages, with the memfds of the
//! guest's shared replicas riding on them; `writev`; `read`, `write`, `recvfrom`,
//! `sendmsg`), the descriptors it has (`fstat` sizes a received memfd, `mmap` maps it; Mesa's
//! import of a frame's memfd reads its header with `lseek` and `read`), memfds, memory
//! (`mmap`, `mprotect` with `PROT_EXEC`: LLVM's JIT
//! writes the shaders' machine code and makes it executable; `munmap`, `mremap`, `madvise`,
//! `brk`), threads (the rasterizer threads: `futex`, `set_robust_list`, `rseq`, signal
//! masks, `sched_yield` and affinity, `exit`), time (`clock_gettime`: the worker's CPU time
//! for the daemon's device time) and `getrandom`. Some calls are allowed only with the
//! arguments threads need:
//! - `clone` only with `CLONE_THREAD | CLONE_VM` (a thread, never a new process);
//!   `clone3`, whose flags sit behind a pointer the filter cannot read, answers `ENOSYS`
//!   (the C library then uses `clone`);
//! - `tgkill` only to a thread of the worker's own thread group (`kill` and `tkill` are
//!   not allowed at all);
//! - `prctl` only `PR_SET_NAME`, `PR_GET_NAME` and `PR_SET_NO_NEW_PRIVS`; every other
//!   option answers `EPERM`.
//!
//! Opening files and making directories answer `EACCES` (Mesa's shader disk cache and
//! drirc, LLVM's look at `/proc/cpuinfo`, then fail or fall back; the worker also turns the
//! disk cache off, `MESA_SHADER_CACHE_DISABLE`, and makes one context before the sandbox so
//! the driver's one-time set-up - its threads, a name-service lookup of the user's home -
//! is done by then), and every other system call - `fork`, sockets, exec, `kill`,
//! `ptrace`, mounting, namespaces, other calls on files by name - kills the worker, which
//! the daemon sees as a crashed worker (its guest's contexts are lost).
//!
//! `VIRTSOC_RENDER_SANDBOX=off` in the daemon's environment (the worker inherits it) leaves
//! the worker unconfined, for debugging a driver under `strace` or `gdb`.

pub use virtsoc_sandbox::SandboxError;

/// System calls a render worker may make. Those marked "seen" are what the worker made in
/// the sandbox under `strace -f` running glmark2-es2 --off-screen (every default scene, the
/// validation run), es2gears_x11 and es2_info, and the end-to-end tests; the others are what
/// a thread of the driver's (a context made later, on a driver that starts threads per
/// context) or an error path needs.
const ALLOWED: &[i64] = &[
    // The socket to the daemon: batches in (seen: recvfrom), answers out in one writev (seen);
    // read/write/recvmsg/sendmsg for the same socket by other paths, write for stderr.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    // Descriptors it has: close and fcntl (seen, the C library), fstat/newfstatat and lseek
    // (seen: stderr's type when logging), memfds for a driver's shared memory.
    libc::SYS_close,
    libc::SYS_fcntl,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_lseek,
    libc::SYS_ftruncate,
    libc::SYS_memfd_create,
    libc::SYS_ppoll,
    // Memory (seen: mmap, munmap, mprotect with PROT_EXEC for LLVM's JIT'd shaders, brk,
    // madvise when a thread's stack is freed; mremap by the allocator for large buffers).
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    // Threads (clone and tgkill with their arguments checked: `checked_rules`): futex (seen:
    // llvmpipe's rasterizer threads), the per-thread set-up of a new thread (robust list,
    // rseq, signal masks, alternate signal stack: seen at a thread's start and end),
    // scheduling and affinity (Mesa pins and yields its queue threads), naming them (prctl).
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_setaffinity,
    libc::SYS_prctl,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_exit,
    libc::SYS_exit_group,
    // More filters (they can only narrow what is allowed): the later filters below.
    libc::SYS_seccomp,
    // Its own identity (seen: getpid, Mesa's and the C library's checks).
    libc::SYS_gettid,
    libc::SYS_getpid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    // Time and randomness (seen: clock_gettime, the worker's CPU time for the daemon's
    // device time on every answer; sysinfo, the memory Mesa sizes its caches by).
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettimeofday,
    libc::SYS_getrandom,
    libc::SYS_sysinfo,
];

/// System calls that answer `EACCES` instead of killing the worker (with their older forms).
const REFUSED: &[i64] = &[libc::SYS_openat, libc::SYS_readlinkat, libc::SYS_mkdirat];

/// The first user id of render workers of a root daemon: a worker runs as this plus its
/// daemon's pid (decoder workers use a range of their own below it).
pub const WORKER_UID_BASE: u32 = 0x5000_0000;

/// Whether the sandbox is on: unless `VIRTSOC_RENDER_SANDBOX` is `off` (or `0`).
pub fn wanted() -> bool {
    !matches!(
        std::env::var("VIRTSOC_RENDER_SANDBOX").as_deref(),
        Ok("off" | "0")
    )
}

/// Enters the sandbox, for every thread of the process.
pub fn enter() -> Result<(), SandboxError> {
    virtsoc_sandbox::enter(&virtsoc_sandbox::Policy {
        allowed: ALLOWED,
        refused: REFUSED,
        uid_base: WORKER_UID_BASE,
    })
}

/// The user a render worker of the daemon with pid `daemon` runs as when started by root.
pub fn worker_uid(daemon: u32) -> u32 {
    virtsoc_sandbox::worker_uid(WORKER_UID_BASE, daemon)
}
