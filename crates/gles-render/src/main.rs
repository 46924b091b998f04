//! `virtsoc-render`: the render worker process the daemon's `gles` device starts per guest.
//! Its stdin is its socket to the daemon (see [`virtsoc_render::worker`]).

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

fn main() {
    // SAFETY: prctl with integer arguments only: die with the daemon (no orphaned
    // workers holding GPU memory), and never gain privileges through exec.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    // A guest's vendor-library settings must not make the worker load virtsoc's own EGL.
    if std::env::var("__EGL_VENDOR_LIBRARY_FILENAMES").is_ok_and(|v| v.contains("virtsoc")) {
        std::env::remove_var("__EGL_VENDOR_LIBRARY_FILENAMES");
    }
    // SAFETY: fd 0 is the socket the daemon passed as stdin; nothing else in this process
    // owns it.
    let sock = UnixStream::from(unsafe { OwnedFd::from_raw_fd(0) });
    if let Err(e) = virtsoc_render::worker::serve(sock) {
        eprintln!("virtsoc-render: {e}");
        std::process::exit(1);
    }
}
