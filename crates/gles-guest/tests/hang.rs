//! A render worker that hangs: a real daemon whose `--render-worker` never answers, with a
//! short `--render-deadline-ms`. The worker is ended at the deadline, the program's EGL
//! calls fail cleanly (`EGL_BAD_ALLOC` for a context), the next at once, and the daemon
//! goes on serving other guests.
//!
//! The binaries are built by `cargo build -p virtsocd -p virtsoc-gles`;
//! without them (or without glvnd) the test is skipped loudly, unless `VIRTSOC_REQUIRE_ALL`
//! is set.

mod common;

use std::time::Duration;

#[test]
fn a_hung_render_worker_is_ended_at_the_deadline() {
    common::worker_fails(
        "hang",
        "#!/bin/sh\nexec sleep 600\n",
        &["--render-deadline-ms", "700"],
        Duration::from_secs(5),
    );
}
