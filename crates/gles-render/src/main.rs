//! `virtsoc-render`: the render worker process the daemon's `gles` device starts per guest.
//! Its stdin is its socket to the daemon (see [`virtsoc_render::worker`]); it enters its
//! sandbox ([`virtsoc_render::sandbox`]) once the host's EGL is open. Its stdout carries
//! one line, the shader precision it runs guest shaders at (`Renderer::warm_up`).

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
    if virtsoc_render::sandbox::wanted() {
        // The sandbox refuses files, so Mesa's shader disk cache could neither read nor
        // write an entry: it is not set up at all (no name-service lookup of the user's
        // home, no descriptor of the cache's index kept).
        std::env::set_var("MESA_SHADER_CACHE_DISABLE", "true");
    }
    // SAFETY: fd 0 is the socket the daemon passed as stdin; nothing else in this process
    // owns it.
    let sock = UnixStream::from(unsafe { OwnedFd::from_raw_fd(0) });
    // The sandbox: entered once the host's EGL is open, before the first batch is read
    // (`VIRTSOC_RENDER_SANDBOX=off` leaves the worker unconfined, for debugging).
    let confine = || {
        if !virtsoc_render::sandbox::wanted() {
            log::warn!("render worker: VIRTSOC_RENDER_SANDBOX=off, not sandboxed");
            return Ok(());
        }
        virtsoc_render::sandbox::enter()
    };
    if let Err(e) = virtsoc_render::worker::serve_confined(sock, confine) {
        eprintln!("virtsoc-render: {e}");
        std::process::exit(1);
    }
}
