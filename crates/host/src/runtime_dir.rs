//! The process's `XDG_RUNTIME_DIR`: a private one for virtsoc's binaries when the environment
//! has none (a service, a container, CI), so the GPU stack's start-up probe stays quiet.

use std::path::PathBuf;

/// Gives the process a private `XDG_RUNTIME_DIR` (`$TMPDIR/virtsoc-runtime-<uid>`, mode 0700,
/// as a login session has) when it has none: the GPU stack's start-up probe for a Wayland
/// compositor (libwayland's `wl_display_connect`, called by wgpu's EGL backend) prints
/// `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` twice per process that
/// opens a GPU otherwise, though nothing failed (without the variable there is no compositor
/// to reach). Call it first, before any thread exists. A directory that is not ours or not
/// private is left alone (and so is the environment).
pub fn ensure() {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let set = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .is_some_and(|d| d.is_absolute() && d.is_dir());
    if set {
        return;
    }
    let uid = rustix::process::getuid().as_raw();
    let dir = std::env::temp_dir().join(format!("virtsoc-runtime-{uid}"));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0 => {
            // Before any thread exists (the caller's contract), so no other thread reads the
            // environment while it changes.
            std::env::set_var("XDG_RUNTIME_DIR", &dir)
        }
        _ => {}
    }
}
