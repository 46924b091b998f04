//! `virtsocd`, the virtsoc host daemon: serves guests on a Unix socket until SIGINT or
//! SIGTERM. The same executable is the daemon's sandboxed decoder and ISP worker processes
//! (`--codec-worker`, `--isp-worker` as the first argument).
//!
//! [`args`] holds the command line, [`serve`] the process around `virtsoc_host::Daemon`
//! (its socket, signals, control and services sockets), [`error`] why it did not start.

mod args;
mod error;
mod serve;

use clap::Parser;

fn main() {
    if let Some(code) = worker(std::env::args().nth(1).as_deref()) {
        std::process::exit(code);
    }
    virtsoc_host::runtime_dir::ensure();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = args::Args::parse();
    if let Err(e) = serve::run(args) {
        eprintln!("virtsocd: {e}");
        std::process::exit(1);
    }
}

/// Runs a worker process when `first` (the first argument) asks for one; its exit code.
fn worker(first: Option<&str>) -> Option<i32> {
    let (what, result) = match first {
        // A decoder worker (stdin: its socket to the daemon).
        Some("--codec-worker") => (
            "codec",
            virtsoc_host::device::codec::serve_worker().map_err(|e| e.to_string()),
        ),
        // An ISP worker (stdin: its socket to the daemon).
        Some(a) if a == virtsoc_media::isp::ISP_WORKER_ARG => (
            "isp",
            virtsoc_media::isp::serve_isp().map_err(|e| e.to_string()),
        ),
        _ => return None,
    };
    Some(match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("virtsocd {what} worker: {e}");
            1
        }
    })
}
