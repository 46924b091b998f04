//! A render worker that dies: a real daemon whose `--render-worker` exits at once. The
//! program's EGL calls that need the host fail cleanly (`EGL_BAD_ALLOC` for a context),
//! every later one too, and the daemon goes on serving other guests.
//!
//! The binaries are built by `cargo build -p virtsocd -p virtsoc-gles`;
//! without them (or without glvnd) the test is skipped loudly, unless `VIRTSOC_REQUIRE_ALL`
//! is set.

mod common;

use std::time::Duration;

#[test]
fn a_dead_render_worker_fails_the_guest_cleanly() {
    common::worker_fails("lost", "#!/bin/sh\nexit 3\n", &[], Duration::from_secs(10));
}
