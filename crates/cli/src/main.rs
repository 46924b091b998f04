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
mod ctl;
mod daemon_proc;
mod keep;
mod report;
mod scenario;
mod snapshot;
mod soak;
mod stats;
mod top;
mod trace;
mod vm;
mod watch;

use std::path::PathBuf;
use std::time::Duration;

use args::{BenchCmd, Cli, Cmd, DebugCmd, VmCmd};
use clap::{Parser, Subcommand};
use daemon_proc::{DaemonProcess, Endpoint};
use virtsoc_guest::{testdev, AccessMode, ConnectOptions, Connection, DeviceId};

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

fn run(cli: Cli) -> Result<(), CliError> {
    match cli.cmd {
        Cmd::Ctl { socket, args } => ctl::run(socket, &args)?,
        Cmd::Snapshot { which } => snapshot::run(which)?,
        Cmd::Migrate { guest, to, socket } => {
            let r = snapshot::migrate(socket, guest, &to)?;
            println!("{}", serde_json::to_string_pretty(&r)?);
        }
        Cmd::Top {
            socket,
            json,
            interval_ms,
            count,
        } => top::run(
            &ctl::target(socket),
            json,
            std::time::Duration::from_millis(interval_ms),
            count,
        )?,
        Cmd::CpuHog { socket, name } => bench_sharing::cpu_hog(&socket, &name)?,
        Cmd::Soak(args) => soak::run(&args)?,
        Cmd::Watch(args) => watch::run(&args)?,
        Cmd::Gles { which } => bench_gles::run_cmd(&which)?,
        Cmd::Bench {
            which: BenchCmd::Gles(args),
        } => bench_gles::run_bench(&args)?,
        Cmd::Bench {
            which:
                BenchCmd::Devices {
                    socket,
                    resolution,
                    frames,
                    json,
                },
        } => {
            let sizes = resolution
                .iter()
                .map(|r| scenario::resolution(r))
                .collect::<Result<Vec<_>, _>>()?;
            // A daemon started for the bench starts no spare decoder workers: a spare's start
            // (a process's exec and linking) would run beside the decoding it measures.
            let rs = with_daemon_spawned(socket, &["--decoder-spares", "0"], false, |e| {
                bench_devices::run(&e.target, e.pid, &sizes, frames)
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rs)?);
            } else {
                bench_devices::print_table(&rs);
            }
        }
        Cmd::Bench {
            which: BenchCmd::Migrate { json },
        } => {
            let r = bench_migrate::run()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                bench_migrate::print(&r);
            }
        }
        Cmd::Bench {
            which:
                BenchCmd::Admission {
                    flood,
                    guests,
                    json,
                },
        } => {
            if guests == 0 {
                return Err(CliError::Usage("--guests must be positive".into()));
            }
            let r = bench_admission::run(flood, guests)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                bench_admission::print(&r);
            }
        }
        Cmd::Bench {
            which:
                BenchCmd::Isolation {
                    seconds,
                    frames,
                    hostile,
                    json,
                },
        } => {
            if !(0.5..=3600.0).contains(&seconds) || frames == 0 {
                return Err(CliError::Usage(
                    "--seconds must be in 0.5..=3600 and --frames positive".into(),
                ));
            }
            let r = bench_isolation::run(&bench_isolation::IsolationParams {
                seconds,
                frames,
                kinds: hostile,
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                bench_isolation::print_table(&r);
            }
            if !r.all_ok {
                return Err(CliError::Usage(
                    "the victim lost more than 20% next to a hostile guest".into(),
                ));
            }
        }
        Cmd::Bench {
            which:
                BenchCmd::Sharing {
                    seconds,
                    guests,
                    scheduler,
                    hogs,
                    hog_kind,
                    no_together,
                    no_codec,
                    repeats,
                    gpu_sizes,
                    chart,
                    json,
                },
        } => {
            let r = bench_sharing::run(&bench_sharing::SharingParams {
                gpu_sizes: bench_sharing::parse_sizes(&gpu_sizes)?,
                repeats: repeats.max(1),
                codec: !no_codec,
                together: !no_together,
                hogs: hogs.into_iter().filter(|n| *n > 0).collect(),
                hog_kinds: bench_sharing::parse_hog_kinds(&hog_kind)?,
                seconds: seconds.max(1),
                guests: guests.into_iter().filter(|n| *n > 0).collect(),
                schedulers: scheduler,
            })?;
            bench_sharing::write_chart(&r, &chart)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                bench_sharing::print_table(&r);
                println!("chart: {}", chart.display());
            }
        }
        Cmd::Bench {
            which:
                BenchCmd::Transport {
                    socket,
                    round_trips,
                    size,
                    reps,
                    channels,
                    vm_image,
                    json,
                },
        } => {
            let mut r = with_daemon(socket, true, |e| {
                bench_transport::run(e, &channels, round_trips, size, reps)
            })?;
            if let Some(image) = vm_image {
                r.channels.push(bench_transport::vm_channel(
                    &image,
                    round_trips,
                    size,
                    reps,
                )?);
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                bench_transport::print_table(&r);
            }
        }
        Cmd::Bench {
            which:
                BenchCmd::Services {
                    socket,
                    channels,
                    round_trips,
                    size,
                    reps,
                    soak,
                    guests,
                    json,
                    chart,
                },
        } => {
            if let Some(seconds) = soak {
                let r = with_daemon(socket, false, |e| {
                    bench_services::soak::soak(e, guests, channels, seconds, size)
                })?;
                println!("{}", serde_json::to_string_pretty(&r)?);
                if r.mismatches > 0 || r.count_errors > 0 {
                    return Err(CliError::Usage(format!(
                        "{} transfers came back wrong; {} guests' transfer counts do not add up",
                        r.mismatches, r.count_errors
                    )));
                }
                return Ok(());
            }
            let r = with_daemon(socket, false, |e| {
                bench_services::run(e, channels, round_trips, size, reps)
            })?;
            if let Some(path) = &chart {
                bench_services::chart::write(&r, path)?;
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                bench_services::print_table(&r);
            }
        }
        Cmd::Bench {
            which:
                BenchCmd::Svm {
                    socket,
                    protocol,
                    ordering,
                    slack_pattern,
                    readers,
                    switch_every,
                    consumer,
                    trace,
                    size,
                    slack_ms,
                    frames,
                    buffers,
                    warmup,
                    json,
                },
        } => {
            if !(0.0..=10_000.0).contains(&slack_ms) {
                return Err(CliError::Usage("--slack-ms must be in 0..=10000".into()));
            }
            let params = bench_svm::SvmBenchParams {
                protocols: protocol,
                orderings: ordering,
                size,
                slack: Duration::from_secs_f64(slack_ms / 1e3),
                pattern: slack_pattern,
                frames,
                buffers,
                warmup,
                readers,
                switch_every,
                consumer,
            };
            let r = match trace {
                Some(path) => {
                    let events = trace::parse(&std::fs::read_to_string(&path)?)?;
                    let results = with_daemon(socket, false, |e| {
                        trace::replay(&e.target, &params.protocols, &events)
                    })?;
                    bench_svm::SvmBenchReport {
                        size: 0,
                        slack_ms: 0.0,
                        slack_pattern: params.pattern,
                        buffers: 0,
                        readers: 0,
                        switch_every: None,
                        consumer: params.consumer,
                        machine_memcpy_ms: 0.0,
                        machine_memcpy_written_ms: 0.0,
                        gpu_upload_ms: None,
                        protocols: results,
                    }
                }
                None => with_daemon(socket, false, |e| bench_svm::run(&e.target, &params))?,
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                bench_svm::print_table(&r);
            }
            if r.protocols.iter().any(|p| p.corrupt_frames > 0) {
                return Err(CliError::Usage("some frames were delivered corrupt".into()));
            }
        }
        Cmd::Demo { socket, frames } => {
            with_daemon(socket, true, |e| {
                let all = ["ring", "remote", "unix", "tcp"].map(String::from);
                let t = bench_transport::run(e, &all, 2000, 16_588_800, 10)?;
                bench_transport::print_table(&t);
                println!();
                let params = bench_svm::SvmBenchParams {
                    protocols: vec![
                        "guest-staging".into(),
                        "write-invalidate".into(),
                        "prefetch".into(),
                    ],
                    orderings: vec![
                        bench_svm::OrderingMode::Atomic,
                        bench_svm::OrderingMode::Fence,
                    ],
                    size: 16_588_800,
                    slack: Duration::from_millis(17),
                    pattern: bench_svm::SlackPattern::Fixed,
                    frames,
                    buffers: 4,
                    warmup: 8,
                    readers: 1,
                    switch_every: None,
                    consumer: bench_svm::Consumer::Checksum,
                };
                let r = bench_svm::run(&e.target, &params)?;
                bench_svm::print_table(&r);
                Ok(())
            })?;
        }
        Cmd::Run {
            scenario,
            socket,
            protocol,
            ordering,
            seconds,
            resolution,
            fps,
            compare,
            rounds,
            clip,
            display_sink,
            composition,
            pacing,
            json,
            save,
        } => {
            let (default_res, default_fps) = scenario::defaults(&scenario);
            let (width, height) =
                scenario::resolution(resolution.as_deref().unwrap_or(default_res))?;
            let fps = fps.unwrap_or(default_fps);
            if !(0.5..=3600.0).contains(&seconds) || !(1..=240).contains(&fps) {
                return Err(CliError::Usage(
                    "--seconds must be 0.5..3600 and --fps 1..240".into(),
                ));
            }
            scenario::rounds::run_cmd(scenario::rounds::RunCmd {
                opts: scenario::RunOpts {
                    scenario,
                    protocol,
                    ordering,
                    seconds,
                    width,
                    height,
                    fps,
                    composition,
                    pacing,
                },
                socket,
                compare,
                rounds,
                clip,
                display_sink,
                json,
                save,
            })?;
        }
        Cmd::Report { results, out } => {
            let rs = report::load(&results)?;
            for f in report::write(&rs, &out)? {
                println!("{}", f.display());
            }
        }
        Cmd::Devices {
            socket,
            json,
            c_header,
        } => {
            if c_header {
                print!("{}", virtsoc_devapi::c_header(virtsoc_devapi::ALL));
                return Ok(());
            }
            let devices = with_daemon(socket, false, |e| {
                let c = Connection::open(&e.target, &ConnectOptions::default())?;
                Ok(c.devices().to_vec())
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&devices)?);
            } else {
                println!(
                    "{:<4} {:<10} {:<14} backend / commands",
                    "id", "device", "memory"
                );
                for d in &devices {
                    println!("{:<4} {:<10} {:<14} {}", d.id, d.name, d.domain, d.backend);
                    if let Some(decl) = virtsoc_devapi::device(virtsoc_guest::DeviceId(d.id)) {
                        let cmds: Vec<String> = decl
                            .commands
                            .iter()
                            .map(|c| {
                                let args: Vec<&str> = c.args.iter().map(|a| a.name).collect();
                                format!("{}({})", c.name, args.join(", "))
                            })
                            .collect();
                        println!("{:<30} {}", "", cmds.join("  "));
                    }
                }
            }
        }
        Cmd::Vm {
            which:
                VmCmd::Run {
                    image,
                    shm,
                    doorbell,
                    window_mib,
                    accel,
                    memory_mib,
                    timeout,
                    args,
                },
        } => {
            let outcome = vm::run(&vm::VmRun {
                image,
                endpoint: shm.zip(doorbell),
                window_mib,
                accel,
                memory_mib,
                timeout: Duration::from_secs(timeout),
                args,
                echo: true,
            })?;
            eprintln!(
                "virtsoc vm run: guest command exited with {:?} after {:.1} s of VM time",
                outcome.exit,
                outcome.wall.as_secs_f64()
            );
            if outcome.exit != Some(0) {
                return Err(CliError::Usage("the guest command failed".into()));
            }
        }
        Cmd::Debug {
            which:
                DebugCmd::Hold {
                    socket,
                    regions,
                    size,
                },
        } => {
            let conn = Connection::open(&socket, &ConnectOptions::default())?;
            for i in 0..regions {
                let id = conn.alloc_blob(size)?.id;
                conn.begin_access(id, DeviceId::PRODUCER, 0, size, AccessMode::Write)?;
                conn.device_cmd(
                    DeviceId::PRODUCER,
                    [testdev::WRITE_PATTERN, id, i as u64, 0, 0, 0],
                )?;
                // Left mid-frame on purpose: the access is never ended.
            }
            println!("READY {}", conn.guest_id());
            use std::io::Write;
            std::io::stdout().flush()?;
            // Wait to be killed; reading stdin blocks until the test closes it.
            let mut sink = String::new();
            let _ = std::io::stdin().read_line(&mut sink);
        }
        Cmd::Debug {
            which:
                DebugCmd::Keep {
                    socket,
                    regions,
                    size,
                    seconds,
                },
        } => keep::run(&socket, regions, size, seconds)?,
    }
    Ok(())
}
