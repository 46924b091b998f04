//! `virtsoc`: benchmarks, the demo, and guest-side tools.
//!
//! Every subcommand is a guest process: it connects to a daemon given with `--socket`, or
//! starts its own `virtsocd` child process when none is given.

mod args;
mod bench_admission;
mod bench_devices;
mod bench_gles;
mod bench_isolation;
mod bench_migrate;
mod bench_services;
mod bench_sharing;
mod bench_svm;
mod bench_transport;
mod commands;
mod ctl;
mod daemon_proc;
mod keep;
mod report;
mod scenario;
mod snapshot;
mod soak;
mod stats;
mod together;
mod top;
mod trace;
mod vm;
mod watch;

use std::time::Duration;

use args::{Cli, Cmd, DebugCmd, VmCmd};
use clap::{Parser, Subcommand};
use daemon_proc::{DaemonProcess, Endpoint};

/// Errors of the command line tool.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A call into the guest library failed (connect, request, device command).
    #[error("guest library: {0}")]
    Guest(#[from] virtsoc_guest::GuestError),
    /// Reading or writing a file, socket or terminal failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// JSON input or output could not be (de)serialized.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// Bad command line; the text is the usage hint.
    #[error("{0}")]
    Usage(String),
}

fn main() {
    // Before any thread: benches that open a GPU in this process (`bench devices`' floor, the
    // window sink) would otherwise have libwayland print an error that is not one.
    virtsoc_host::runtime_dir::ensure();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    // Inside a VM guest the arguments come hex-encoded from the kernel command line.
    let cli = match std::env::var("VIRTSOC_ARGS_HEX")
        .ok()
        .and_then(|h| vm::decode_args(&h))
    {
        Some(args) if std::env::args().len() == 1 => {
            Cli::parse_from(std::iter::once("virtsoc".to_string()).chain(args))
        }
        _ => Cli::parse(),
    };
    if let Err(e) = run(cli) {
        eprintln!("virtsoc: {e}");
        std::process::exit(1);
    }
}

/// Runs `f` against `socket`, or against a daemon started for the purpose (which also
/// serves remote guests on loopback when `remote`).
fn with_daemon<T>(
    socket: Option<String>,
    remote: bool,
    f: impl FnOnce(&Endpoint) -> Result<T, CliError>,
) -> Result<T, CliError> {
    with_daemon_spawned(socket, &[], remote, f)
}

/// Like [`with_daemon`], giving a daemon started for the purpose `extra` arguments.
fn with_daemon_spawned<T>(
    socket: Option<String>,
    extra: &[&str],
    remote: bool,
    f: impl FnOnce(&Endpoint) -> Result<T, CliError>,
) -> Result<T, CliError> {
    match socket {
        Some(s) => f(&Endpoint {
            target: s,
            remote: None,
            pid: None,
        }),
        None => {
            let d = DaemonProcess::spawn(extra, remote)?;
            let r = f(&d.endpoint());
            d.stop()?;
            r
        }
    }
}

/// Runs one subcommand: each one's body is a function of its module (`commands` for the
/// benchmarks and tools without one of their own).
fn run(cli: Cli) -> Result<(), CliError> {
    match cli.cmd {
        Cmd::Ctl { socket, args } => ctl::run(socket, &args),
        Cmd::Snapshot { which } => snapshot::run(which),
        Cmd::Migrate { guest, to, socket } => {
            commands::print_json(&snapshot::migrate(socket, guest, &to)?)
        }
        Cmd::Top {
            socket,
            json,
            interval_ms,
            count,
        } => top::run(
            &ctl::target(socket),
            json,
            Duration::from_millis(interval_ms),
            count,
        ),
        Cmd::CpuHog { socket, name } => bench_sharing::cpu_hog(&socket, &name),
        Cmd::Soak(args) => soak::run(&args),
        Cmd::Watch(args) => watch::run(&args),
        Cmd::Gles { which } => bench_gles::run_cmd(&which),
        Cmd::Bench { which } => commands::bench(which),
        Cmd::Demo { socket, frames } => commands::demo(socket, frames),
        Cmd::Run(args) => commands::run_scenario(args),
        Cmd::Report { results, out } => commands::report(&results, &out),
        Cmd::Devices {
            socket,
            json,
            c_header,
        } => commands::devices(socket, json, c_header),
        Cmd::Vm {
            which: VmCmd::Run(args),
        } => commands::vm_run(args),
        Cmd::Debug {
            which:
                DebugCmd::Hold {
                    socket,
                    regions,
                    size,
                    channels,
                },
        } => commands::hold(&socket, regions, size, channels),
        Cmd::Debug {
            which:
                DebugCmd::Keep {
                    socket,
                    regions,
                    size,
                    seconds,
                    services,
                },
        } => keep::run(&socket, regions, size, seconds, services),
        Cmd::Debug {
            which:
                DebugCmd::Services {
                    socket,
                    clipboard,
                    size,
                },
        } => bench_services::probe::run(&socket, &clipboard, size).map(|v| println!("{v}")),
    }
}
