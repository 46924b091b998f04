//! The render worker's sandbox, entered once the host's EGL is open (its driver loaded,
//! its device opened) and before the first batch is read: no new privileges, root's user
//! and groups dropped when it runs as root (to a user of its own per daemon,
//! [`WORKER_UID_BASE`] + the daemon's pid), and a seccomp filter (rust-vmm's
//! `seccompiler`, as the decoder worker's sandbox in `virtsoc-media`) on every thread the
//! worker has (the driver's threads started at initialisation too: the filter is
//! synchronised to all of them) and will have.
//!
//! The filter allows what rendering with Mesa's llvmpipe needs, found by running
//! glmark2-es2 --off-screen (every default scene), es2gears_x11 and es2_info through the
//! sandboxed worker under `strace -f` (the list `ALLOWED` says what each call is for):
//! its socket to the daemon (`recvfrom`, `writev`; `read`, `write`, `recvmsg`, `sendmsg`),
//! the descriptors it has, memfds, memory (`mmap`, `mprotect` with `PROT_EXEC`: LLVM's JIT
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

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// Why the sandbox could not be entered.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The filter could not be built for this machine.
    #[error("seccomp filter: {0}")]
    Filter(String),
    /// The kernel refused the filter.
    #[error("seccomp: {0}")]
    Apply(String),
    /// Root's user or groups could not be dropped.
    #[error("dropping root ({what}): {err}")]
    Root {
        /// Which step failed.
        what: &'static str,
        /// The system's error.
        err: std::io::Error,
    },
}

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

/// System calls that answer `EACCES` instead of killing the worker.
const REFUSED: &[i64] = &[libc::SYS_openat, libc::SYS_readlinkat, libc::SYS_mkdirat];

/// The same for the older calls only some architectures have.
#[cfg(target_arch = "x86_64")]
const LEGACY_ALLOWED: &[i64] = &[libc::SYS_poll];
#[cfg(target_arch = "x86_64")]
const LEGACY_REFUSED: &[i64] = &[libc::SYS_open, libc::SYS_readlink, libc::SYS_mkdir];
#[cfg(not(target_arch = "x86_64"))]
const LEGACY_ALLOWED: &[i64] = &[];
#[cfg(not(target_arch = "x86_64"))]
const LEGACY_REFUSED: &[i64] = &[];

/// The first user id of render workers of a root daemon: a worker runs as this plus its
/// daemon's pid (decoder workers use a range of their own below it).
pub const WORKER_UID_BASE: u32 = 0x5000_0000;

/// `prctl` options a worker may use: naming threads, and the filter's own set-up.
const PRCTL_ALLOWED: &[u64] = &[
    libc::PR_SET_NAME as u64,
    libc::PR_GET_NAME as u64,
    libc::PR_SET_NO_NEW_PRIVS as u64,
];

fn filter_err<E: std::fmt::Display>(e: E) -> SandboxError {
    SandboxError::Filter(e.to_string())
}

fn arch() -> Result<seccompiler::TargetArch, SandboxError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e| filter_err(format!("on {}: {e}", std::env::consts::ARCH)))
}

fn condition(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SandboxError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value).map_err(filter_err)
}

/// The calls allowed only with some arguments: `clone` for threads, `tgkill` within the
/// worker's own thread group `tgid`.
fn checked_rules(tgid: u32) -> Result<Vec<(i64, Vec<SeccompRule>)>, SandboxError> {
    let thread = (libc::CLONE_THREAD | libc::CLONE_VM) as u64;
    Ok(vec![
        (
            libc::SYS_clone,
            vec![
                SeccompRule::new(vec![condition(0, SeccompCmpOp::MaskedEq(thread), thread)?])
                    .map_err(filter_err)?,
            ],
        ),
        (
            libc::SYS_tgkill,
            vec![
                SeccompRule::new(vec![condition(0, SeccompCmpOp::Eq, u64::from(tgid))?])
                    .map_err(filter_err)?,
            ],
        ),
    ])
}

fn program(
    rules: Vec<(i64, Vec<SeccompRule>)>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram, SandboxError> {
    let rules: BTreeMap<i64, Vec<SeccompRule>> = rules.into_iter().collect();
    let filter = SeccompFilter::new(rules, mismatch, matched, arch()?).map_err(filter_err)?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| filter_err(e))
}

/// Every call of `calls`, whatever its arguments.
fn any_args(calls: &[i64]) -> Vec<(i64, Vec<SeccompRule>)> {
    calls.iter().map(|c| (*c, Vec::new())).collect()
}

/// Whether the sandbox is on: unless `VIRTSOC_RENDER_SANDBOX` is `off` (or `0`).
pub fn wanted() -> bool {
    !matches!(
        std::env::var("VIRTSOC_RENDER_SANDBOX").as_deref(),
        Ok("off" | "0")
    )
}

/// Enters the sandbox, for every thread of the process.
pub fn enter() -> Result<(), SandboxError> {
    drop_root()?;
    let refused: Vec<i64> = REFUSED.iter().chain(LEGACY_REFUSED).copied().collect();
    let mut allowed = any_args(
        &ALLOWED
            .iter()
            .chain(LEGACY_ALLOWED)
            .chain(&refused)
            .chain(&[libc::SYS_clone3])
            .copied()
            .collect::<Vec<_>>(),
    );
    allowed.extend(checked_rules(std::process::id())?);
    // The filters all apply; the strictest answer wins: a refused call gets its errno from
    // one of the later filters, anything outside the first's lists kills the worker.
    let kill = program(allowed, SeccompAction::KillProcess, SeccompAction::Allow)?;
    let refuse = program(
        any_args(&refused),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
    )?;
    let no_clone3 = program(
        any_args(&[libc::SYS_clone3]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
    )?;
    // prctl with any option but the allowed ones: one rule, every condition must hold.
    let other_prctl = PRCTL_ALLOWED
        .iter()
        .map(|o| condition(0, SeccompCmpOp::Ne, *o))
        .collect::<Result<Vec<_>, _>>()?;
    let prctl = program(
        vec![(
            libc::SYS_prctl,
            vec![SeccompRule::new(other_prctl).map_err(filter_err)?],
        )],
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
    )?;
    for p in [&kill, &refuse, &no_clone3, &prctl] {
        // Sets no_new_privs first, so no exec can regain privileges either; TSYNC: the
        // driver's threads started before this are confined too.
        seccompiler::apply_filter_all_threads(p).map_err(|e| SandboxError::Apply(e.to_string()))?;
    }
    Ok(())
}

/// The user a render worker of the daemon with pid `daemon` runs as when started by root.
pub fn worker_uid(daemon: u32) -> u32 {
    WORKER_UID_BASE.saturating_add(daemon)
}

/// Gives up root: no supplementary groups, the user and group of its daemon's render
/// workers ([`worker_uid`] of its parent). The C library's calls change every thread's ids
/// (the driver may have started threads already).
fn drop_root() -> Result<(), SandboxError> {
    // SAFETY: system calls with integer arguments only.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    // SAFETY: as above.
    let parent = unsafe { libc::getppid() };
    let id = worker_uid(u32::try_from(parent).unwrap_or(0));
    let check = |what: &'static str, r: i32| {
        if r == 0 {
            Ok(())
        } else {
            Err(SandboxError::Root {
                what,
                err: std::io::Error::last_os_error(),
            })
        }
    };
    // SAFETY: an empty group list (a null pointer with a count of 0).
    check("groups", unsafe { libc::setgroups(0, std::ptr::null()) })?;
    // SAFETY: system calls with integer arguments only.
    check("group", unsafe { libc::setresgid(id, id, id) })?;
    // SAFETY: as above.
    check("user", unsafe { libc::setresuid(id, id, id) })?;
    Ok(())
}
