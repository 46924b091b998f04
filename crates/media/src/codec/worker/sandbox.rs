//! The decoder worker's sandbox, entered before it reads anything from its parent: no new
//! privileges, root's user and groups dropped (to `nobody`) when it runs as root, and a
//! seccomp filter (built with rust-vmm's `seccompiler`, as crosvm and Firecracker confine
//! their device processes).
//!
//! The filter allows what decoding needs and nothing more: reading and writing the
//! descriptors the worker has (its socket), memory (mapping, protecting, advising), threads
//! (libavcodec's frame and slice threads: clone, futexes, scheduling, signals masks), time,
//! and memfds for the shared picture buffers. Opening files answers `EACCES` (libraries that
//! probe `/proc` or `/sys` then fall back), and every other system call - sockets, exec,
//! `ptrace`, mounting, namespaces, files by name - kills the worker, which its parent sees
//! as a crashed decoder. The filter covers every thread the worker starts later.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, SeccompRule};

use crate::error::{MediaError, Result};

/// System calls a decoder worker may make.
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
    // Threads.
    libc::SYS_clone,
    libc::SYS_clone3,
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
    libc::SYS_tgkill,
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

fn program(calls: &[i64], mismatch: SeccompAction, matched: SeccompAction) -> Result<BpfProgram> {
    let rules: BTreeMap<i64, Vec<SeccompRule>> = calls.iter().map(|c| (*c, Vec::new())).collect();
    let filter = SeccompFilter::new(rules, mismatch, matched, arch()?)
        .map_err(|e| MediaError::Unsupported(format!("seccomp filter: {e}")))?;
    filter.try_into().map_err(|e: seccompiler::BackendError| {
        MediaError::Unsupported(format!("seccomp filter: {e}"))
    })
}

/// Enters the sandbox (for the calling process: call it while it has one thread).
pub fn enter() -> Result<()> {
    drop_root()?;
    let refused: Vec<i64> = REFUSED.iter().chain(LEGACY_REFUSED).copied().collect();
    let allowed: Vec<i64> = ALLOWED
        .iter()
        .chain(LEGACY_ALLOWED)
        .chain(&refused)
        .copied()
        .collect();
    // Both filters apply; the stricter answer wins: a refused call gets EACCES from the
    // second, anything outside both lists is killed by the first.
    let kill = program(&allowed, SeccompAction::KillProcess, SeccompAction::Allow)?;
    let refuse = program(
        &refused,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
    )?;
    for p in [&kill, &refuse] {
        // Sets no_new_privs first, so no exec can regain privileges either.
        seccompiler::apply_filter(p)
            .map_err(|e| MediaError::Unsupported(format!("seccomp: {e}")))?;
    }
    Ok(())
}

/// Gives up root: no supplementary groups, the group and user `nobody`.
fn drop_root() -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        return Ok(());
    }
    const NOBODY: u32 = 65534;
    let err = |what: &str, e: rustix::io::Errno| {
        MediaError::Unsupported(format!("decoder worker: dropping root ({what}): {e}"))
    };
    rustix::thread::set_thread_groups(&[]).map_err(|e| err("groups", e))?;
    // The process has one thread here, so the thread's ids are the process's.
    let gid = rustix::process::Gid::from_raw(NOBODY);
    let uid = rustix::process::Uid::from_raw(NOBODY);
    rustix::thread::set_thread_res_gid(gid, gid, gid).map_err(|e| err("group", e))?;
    rustix::thread::set_thread_res_uid(uid, uid, uid).map_err(|e| err("user", e))?;
    Ok(())
}
