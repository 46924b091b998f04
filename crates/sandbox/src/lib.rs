//! The sandbox every virtsoc worker process enters before it reads anything from the daemon
//! (decoders, the ISP's swscale and the encoders in `virtsoc-media`, the GLES renderer in
//! `virtsoc-render`): no new privileges, root's user and groups dropped when it runs as root
//! (to a user of its own per daemon and kind of worker, [`worker_uid`], so the workers of
//! two daemons never share a process limit), and seccomp filters (rust-vmm's
//! `seccompiler`, as crosvm and Firecracker confine their device processes) on every thread
//! of the process, those it has already and those it starts later.
//!
//! A [`Policy`] names what one kind of worker may call; the rest is the same for all:
//! - `clone` only with `CLONE_THREAD | CLONE_VM` (a thread, never a new process); `clone3`,
//!   whose flags sit behind a pointer the filter cannot read, answers `ENOSYS` (the C
//!   library then uses `clone`);
//! - `tgkill` only to a thread of the worker's own thread group (no signal reaches the daemon
//!   or anyone else; `kill` and `tkill` are never allowed);
//! - `prctl` only to name a thread or read its name, and for the filter's own set-up
//!   (`PR_SET_NO_NEW_PRIVS`); every other option answers `EPERM`;
//! - the policy's refused calls (files by name) answer `EACCES`, so libraries that probe
//!   `/proc` or a cache fall back;
//! - every other call kills the worker, which its daemon sees as a crashed worker.
//!
//! A worker of a daemon that is not root keeps the daemon's user: the filters, not the user,
//! keep it from signalling or tracing the daemon.

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

/// What one kind of worker may call, beyond the thread calls every worker gets with checked
/// arguments (`clone`, `tgkill`, `prctl`).
#[derive(Debug, Clone, Copy)]
pub struct Policy<'a> {
    /// Calls allowed whatever their arguments.
    pub allowed: &'a [i64],
    /// Calls that answer `EACCES` instead of killing the worker (files by name: `openat`,
    /// `readlinkat`, ...). Their older forms, where the architecture has them, are refused
    /// with them.
    pub refused: &'a [i64],
    /// The first user id of this kind of worker when started by root (see [`worker_uid`]).
    pub uid_base: u32,
}

/// `prctl` options a worker may use: naming threads, and the filter's own set-up.
const PRCTL_ALLOWED: &[u64] = &[
    libc::PR_SET_NAME as u64,
    libc::PR_GET_NAME as u64,
    libc::PR_SET_NO_NEW_PRIVS as u64,
];

/// The older form of a call some architectures still have, allowed or refused with it.
#[cfg(target_arch = "x86_64")]
fn legacy(call: i64) -> Option<i64> {
    match call {
        libc::SYS_ppoll => Some(libc::SYS_poll),
        libc::SYS_openat => Some(libc::SYS_open),
        libc::SYS_readlinkat => Some(libc::SYS_readlink),
        libc::SYS_mkdirat => Some(libc::SYS_mkdir),
        _ => None,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn legacy(_call: i64) -> Option<i64> {
    None
}

/// `calls` with their older forms.
fn with_legacy(calls: &[i64]) -> Vec<i64> {
    calls
        .iter()
        .flat_map(|c| std::iter::once(*c).chain(legacy(*c)))
        .collect()
}

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

/// Enters the sandbox of `policy`, for every thread of the calling process.
pub fn enter(policy: &Policy<'_>) -> Result<(), SandboxError> {
    drop_root(policy.uid_base)?;
    let refused = with_legacy(policy.refused);
    let mut allowed = any_args(
        &with_legacy(policy.allowed)
            .iter()
            .chain(&refused)
            .chain(&[libc::SYS_clone3, libc::SYS_prctl, libc::SYS_seccomp])
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
        // Sets no_new_privs first, so no exec can regain privileges either; TSYNC: threads
        // started before this (a driver's) are confined too.
        seccompiler::apply_filter_all_threads(p).map_err(|e| SandboxError::Apply(e.to_string()))?;
    }
    Ok(())
}

/// The CPU time so far of process `pid`, all its threads, in nanoseconds, as the kernel
/// counts it: what a worker used, read by its parent rather than reported by the worker
/// (which a worker taken over by a hostile input could misstate). `None` when the clock
/// cannot be read (no such process). The caller must know `pid` is still its child, not
/// reaped: a reaped worker's pid may name another process.
pub fn cpu_ns_of(pid: u32) -> Option<u64> {
    let mut clock: libc::clockid_t = 0;
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: clock_getcpuclockid writes one clockid_t, which `clock` is.
    if unsafe { libc::clock_getcpuclockid(pid, &mut clock) } != 0 {
        return None;
    }
    read_clock(clock)
}

/// Nanoseconds on `clock`, `None` if it cannot be read.
fn read_clock(clock: libc::clockid_t) -> Option<u64> {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `t` is.
    if unsafe { libc::clock_gettime(clock, &mut t) } != 0 {
        return None;
    }
    Some(
        (t.tv_sec.max(0) as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec.max(0) as u64),
    )
}

/// The user a worker whose kind starts at `base` runs as, for the daemon with pid `daemon`,
/// when started by root.
pub fn worker_uid(base: u32, daemon: u32) -> u32 {
    base.saturating_add(daemon)
}

/// Gives up root: no supplementary groups, the user and group of its daemon's workers of
/// this kind ([`worker_uid`] of its parent). The C library's calls change every thread's ids.
fn drop_root(base: u32) -> Result<(), SandboxError> {
    // SAFETY: a system call with no arguments.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    // SAFETY: as above.
    let parent = unsafe { libc::getppid() };
    let id = worker_uid(base, u32::try_from(parent).unwrap_or(0));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_worker_kind_gets_its_own_user_per_daemon() {
        assert_eq!(worker_uid(0x4000_0000, 77), 0x4000_004d);
        assert_ne!(worker_uid(0x4000_0000, 77), worker_uid(0x5000_0000, 77));
        assert_eq!(worker_uid(u32::MAX - 1, 5), u32::MAX);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn older_forms_go_with_the_calls() {
        let v = with_legacy(&[libc::SYS_openat, libc::SYS_read]);
        assert_eq!(v, vec![libc::SYS_openat, libc::SYS_open, libc::SYS_read]);
    }

    #[test]
    fn a_processs_cpu_time_is_read_from_the_kernel_by_another() {
        use std::io::{BufRead, Write};
        // This process: the same clock its threads read themselves.
        let own = || read_clock(libc::CLOCK_PROCESS_CPUTIME_ID).unwrap();
        let before = own();
        let read = cpu_ns_of(std::process::id()).expect("own clock");
        assert!(before <= read && read <= own(), "{before} {read}");
        // A child that spins, says so, then waits for its input.
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo spun; read x",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let out = child.stdout.take().unwrap();
        std::io::BufReader::new(out).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "spun");
        let spun = cpu_ns_of(child.id()).expect("the child's clock");
        assert!(spun > 1_000_000, "20,000 loops of sh in {spun} ns");
        writeln!(child.stdin.take().unwrap()).unwrap();
        assert!(child.wait().unwrap().success());
        assert_eq!(cpu_ns_of(u32::MAX), None, "no such process");
    }

    #[test]
    fn the_filters_build_for_this_machine() {
        let allowed = any_args(&[libc::SYS_read]);
        assert!(program(allowed, SeccompAction::KillProcess, SeccompAction::Allow).is_ok());
        assert!(checked_rules(1).is_ok());
    }
}
