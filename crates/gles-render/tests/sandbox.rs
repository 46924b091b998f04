//! The render worker's sandbox ([`virtsoc_render::sandbox`]): rendering on the host's EGL
//! goes on inside it (llvmpipe's threads, its JIT), while what a compromised worker would try
//! next - a file, a socket, a new process, a signal to or a trace of its daemon, a changed
//! process attribute - is refused or kills the worker.
//!
//! Each probe is this test binary run again (`sandbox_probe` with `VIRTSOC_RENDER_PROBE`
//! set): it opens the host's EGL as the worker does, enters the sandbox, renders a frame,
//! then tries one thing; the parent reads how it ended.

use std::os::unix::process::ExitStatusExt;

use virtsoc_gles_stream::{egl, Encoder};
use virtsoc_render::worker::Renderer;

/// A batch: a context, a 64 x 64 surface made current, a clear, FINISH.
fn frame() -> Encoder {
    let mut e = Encoder::new();
    e.packet(egl::CREATE_CONTEXT).u32(1).u32(0).u32(2);
    e.packet(egl::CREATE_SURFACE).u32(2).u32(64).u32(64).u32(1);
    e.packet(egl::MAKE_CURRENT).u32(1).u32(2).u32(2);
    e.packet(egl::FINISH);
    e
}

/// The probe's side: runs only with `VIRTSOC_RENDER_PROBE` set.
#[test]
fn sandbox_probe() {
    let Ok(what) = std::env::var("VIRTSOC_RENDER_PROBE") else {
        return;
    };
    // The daemon is the parent (asked before the sandbox, which keeps the answer anyway).
    // SAFETY: a system call without arguments.
    let parent = unsafe { libc::getppid() };
    let Ok(mut r) = Renderer::new() else {
        eprintln!("no host EGL");
        std::process::exit(0);
    };
    r.warm_up();
    virtsoc_render::sandbox::enter().expect("sandbox");
    // Rendering works in the sandbox: a new context (the driver's threads), a frame.
    let mut reply = Encoder::new();
    r.run(frame().as_bytes(), &mut reply, false)
        .expect("a frame in the sandbox");
    eprintln!("rendered {} answer bytes", reply.len());
    std::thread::spawn(|| eprintln!("thread ran"))
        .join()
        .expect("thread");
    // SAFETY: system calls with integer arguments only.
    eprintln!("uid {}", unsafe { libc::geteuid() });
    // SAFETY: as above.
    let me = unsafe { libc::getpid() };
    match what.as_str() {
        "fork" => {
            // SAFETY: a raw system call with integer arguments; it touches no memory of this
            // process.
            let r = unsafe { libc::fork() };
            eprintln!("fork answered {r}");
        }
        "clone-process" => {
            // SAFETY: a raw system call with integer arguments (null pointers where it takes
            // any); it touches no memory of this process.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_clone,
                    libc::SIGCHLD as u64,
                    0u64,
                    0u64,
                    0u64,
                    0u64,
                )
            };
            eprintln!("clone of a process answered {r}");
        }
        "prctl" => {
            // SAFETY: a raw system call with integer arguments only.
            let r = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1u64, 0u64, 0u64, 0u64) };
            let e = std::io::Error::last_os_error();
            eprintln!("prctl answered {r} ({e})");
        }
        "kill" => {
            // Signal 0 checks permission only: nothing is delivered if it were allowed.
            // SAFETY: a raw system call with integer arguments only.
            let r = unsafe { libc::kill(parent, 0) };
            eprintln!("kill answered {r}");
        }
        "tgkill-own" => {
            // SAFETY: a raw system call with integer arguments only.
            let r = unsafe { libc::syscall(libc::SYS_tgkill, me, me, 0) };
            eprintln!("tgkill of its own thread answered {r}");
        }
        "tgkill" => {
            // SAFETY: a raw system call with integer arguments only.
            let r = unsafe { libc::syscall(libc::SYS_tgkill, parent, parent, 0) };
            eprintln!("tgkill answered {r}");
        }
        "ptrace" => {
            // SAFETY: a raw system call with integer arguments (null pointers where it takes
            // any); it touches no memory of this process.
            let r = unsafe {
                libc::ptrace(
                    libc::PTRACE_PEEKDATA,
                    parent,
                    std::ptr::null_mut::<libc::c_void>(),
                    std::ptr::null_mut::<libc::c_void>(),
                )
            };
            eprintln!("ptrace answered {r}");
        }
        "exec" => {
            let e = std::process::Command::new("/bin/true").status();
            eprintln!("exec answered {e:?}");
        }
        _ => {
            match std::fs::File::open("/etc/hostname") {
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    eprintln!("open refused")
                }
                other => eprintln!("open answered {other:?}"),
            }
            // A socket: the filter kills the process here.
            let _ = std::net::UdpSocket::bind("127.0.0.1:0");
            eprintln!("socket allowed");
        }
    }
    std::process::exit(0);
}

/// Runs `sandbox_probe` with `what`: its exit status and what it printed; `None` when the
/// host has no EGL.
fn probe(what: &str) -> Option<(std::process::ExitStatus, String)> {
    let out = std::process::Command::new(std::env::current_exe().expect("test executable"))
        .args([
            "--exact",
            "sandbox_probe",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("VIRTSOC_RENDER_PROBE", what)
        .output()
        .expect("run the probe");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    if err.contains("no host EGL") {
        assert!(
            std::env::var_os("VIRTSOC_REQUIRE_ALL").is_none(),
            "no host EGL and VIRTSOC_REQUIRE_ALL is set"
        );
        eprintln!("SKIPPED: no host EGL");
        return None;
    }
    assert!(
        err.contains("rendered") && err.contains("thread ran"),
        "{what}: rendering and threads must work in the sandbox: {err}"
    );
    Some((out.status, err))
}

#[test]
fn the_sandbox_refuses_files_and_kills_on_sockets() {
    let Some((status, err)) = probe("files") else {
        return;
    };
    assert!(err.contains("open refused"), "{err}");
    assert!(!err.contains("socket allowed"), "{err}");
    assert_eq!(status.signal(), Some(libc::SIGSYS), "{status:?}: {err}");
}

/// What a compromised worker would try next - a new process, a program, a changed process
/// attribute, a signal to or a trace of its daemon - is stopped: the worker is killed, or
/// refused. Threads keep working, and a root daemon's workers run as a user of their own.
#[test]
fn a_compromised_worker_cannot_fork_signal_trace_or_reconfigure() {
    for what in ["fork", "clone-process", "exec", "kill", "tgkill", "ptrace"] {
        let Some((status, err)) = probe(what) else {
            return;
        };
        assert_eq!(
            status.signal(),
            Some(libc::SIGSYS),
            "{what} was not stopped: {status:?}: {err}"
        );
    }
    let Some((status, err)) = probe("prctl") else {
        return;
    };
    assert!(status.success(), "{status:?}: {err}");
    assert!(
        err.contains("prctl answered -1"),
        "prctl(PR_SET_DUMPABLE) allowed: {err}"
    );
    let Some((status, err)) = probe("tgkill-own") else {
        return;
    };
    assert!(status.success(), "{status:?}: {err}");
    assert!(err.contains("answered 0"), "{err}");
    // SAFETY: a system call without arguments.
    if unsafe { libc::geteuid() } == 0 {
        let want = virtsoc_render::sandbox::worker_uid(std::process::id());
        assert!(err.contains(&format!("uid {want}")), "{err}");
    }
}
