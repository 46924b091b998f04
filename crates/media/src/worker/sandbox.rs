//! The workers' sandbox (decoders, the ISP's swscale), entered before it reads anything from its parent: no new
//! privileges, root's user and groups dropped when it runs as root (to a user of its own per
//! daemon, [`WORKER_UID_BASE`] + the daemon's pid, so the workers of two daemons never
//! share a process limit), and a seccomp filter (built with rust-vmm's `seccompiler`, as
//! crosvm and Firecracker confine their device processes).
//!
//! The filter allows what decoding and converting need and nothing more: reading and writing the
//! descriptors the worker has (its socket), memory (mapping, protecting, advising), threads
//! (libavcodec's frame and slice threads: futexes, scheduling, signal masks), time, and
//! memfds for the shared picture buffers. Some calls are allowed only with the arguments
//! threads need:
//! - `clone` only with `CLONE_THREAD | CLONE_VM` (a thread, never a new process);
//!   `clone3`, whose flags sit behind a pointer the filter cannot read, answers `ENOSYS`
//!   (the C library then uses `clone`);
//! - `tgkill` only to a thread of the worker's own thread group (no signal reaches the daemon
//!   or anyone else; `kill` and `tkill` are not allowed at all);
//! - `prctl` only to name a thread or read its name, and for the filter's own set-up
//!   (`PR_SET_NO_NEW_PRIVS`); every other option answers `EPERM`.
//!
//! Opening files answers `EACCES` (libraries that probe `/proc` or `/sys` then fall back),
//! and every other system call - `fork`, sockets, exec, `ptrace`, mounting, namespaces, files
//! by name - kills the worker, which its parent sees as a crashed worker. The filter covers
//! every thread the worker starts later.
//!
//! A worker of a daemon that is not root keeps the daemon's user: the filter, not the user,
//! is what keeps it from signalling or tracing the daemon.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

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

/// System calls that answer `EACCES` instead of killing the worker.
const REFUSED: &[i64] = &[libc::SYS_openat, libc::SYS_readlinkat];

/// The same for the older calls only some architectures have.
#[cfg(target_arch = "x86_64")]
const LEGACY_ALLOWED: &[i64] = &[libc::SYS_poll];
#[cfg(target_arch = "x86_64")]
const LEGACY_REFUSED: &[i64] = &[libc::SYS_open, libc::SYS_readlink];
#[cfg(not(target_arch = "x86_64"))]
const LEGACY_ALLOWED: &[i64] = &[];
#[cfg(not(target_arch = "x86_64"))]
const LEGACY_REFUSED: &[i64] = &[];

fn arch() -> Result<seccompiler::TargetArch> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e| MediaError::Unsupported(format!("seccomp on {}: {e}", std::env::consts::ARCH)))
}

/// The first user id of workers of a root daemon: a worker runs as this plus its
/// daemon's pid.
pub const WORKER_UID_BASE: u32 = 0x4000_0000;

/// `prctl` options a worker may use: naming threads, and the filter's own set-up.
const PRCTL_ALLOWED: &[u64] = &[
    libc::PR_SET_NAME as u64,
    libc::PR_GET_NAME as u64,
    libc::PR_SET_NO_NEW_PRIVS as u64,
];

fn filter_err<E: std::fmt::Display>(e: E) -> MediaError {
    MediaError::Unsupported(format!("seccomp filter: {e}"))
}

fn condition(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value).map_err(filter_err)
}

/// The calls allowed only with some arguments: `clone` for threads, `tgkill` within the
/// worker's own thread group `tgid`.
fn checked_rules(tgid: u32) -> Result<Vec<(i64, Vec<SeccompRule>)>> {
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
) -> Result<BpfProgram> {
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

/// Enters the sandbox (for the calling process: call it while it has one thread).
pub fn enter() -> Result<()> {
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
        .collect::<Result<Vec<_>>>()?;
    let prctl = program(
        vec![(
            libc::SYS_prctl,
            vec![SeccompRule::new(other_prctl).map_err(filter_err)?],
        )],
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
    )?;
    for p in [&kill, &refuse, &no_clone3, &prctl] {
        // Sets no_new_privs first, so no exec can regain privileges either.
        seccompiler::apply_filter(p)
            .map_err(|e| MediaError::Unsupported(format!("seccomp: {e}")))?;
    }
    Ok(())
}

/// The user a worker of the daemon with pid `daemon` runs as when started by root.
pub fn worker_uid(daemon: u32) -> u32 {
    WORKER_UID_BASE.saturating_add(daemon)
}

/// Gives up root: no supplementary groups, the user and group of its daemon's workers
/// ([`worker_uid`] of its parent).
fn drop_root() -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        return Ok(());
    }
    let id = worker_uid(rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32));
    let err = |what: &str, e: rustix::io::Errno| {
        MediaError::Unsupported(format!("worker: dropping root ({what}): {e}"))
    };
    rustix::thread::set_thread_groups(&[]).map_err(|e| err("groups", e))?;
    // The process has one thread here, so the thread's ids are the process's.
    let gid = rustix::process::Gid::from_raw(id);
    let uid = rustix::process::Uid::from_raw(id);
    rustix::thread::set_thread_res_gid(gid, gid, gid).map_err(|e| err("group", e))?;
    rustix::thread::set_thread_res_uid(uid, uid, uid).map_err(|e| err("user", e))?;
    Ok(())
}
