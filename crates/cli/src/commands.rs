//! The bodies of `virtsoc`'s subcommands that have no module of their own: the benchmarks'
//! dispatch (`bench`), `demo`, `run`, `report`, `devices`, `vm run` and `debug hold`. Each
//! checks its options, runs, and prints a table or JSON.

use std::path::Path;
use std::time::Duration;

use virtsoc_guest::{testdev, AccessMode, ConnectOptions, Connection, DeviceId};

use crate::args::{
    BenchCmd, RunArgs, ServicesArgs, SharingArgs, SvmArgs, TransportArgs, VmRunArgs,
};
use crate::{
    bench_admission, bench_devices, bench_gles, bench_isolation, bench_migrate, bench_services,
    bench_sharing, bench_svm, bench_transport, report, scenario, trace, vm, with_daemon,
    with_daemon_spawned, CliError,
};

/// Prints `value` as pretty JSON on stdout.
pub(crate) fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Prints `value` as JSON when `json`, else with `table`.
fn print_either<T: serde::Serialize>(
    value: &T,
    json: bool,
    table: impl FnOnce(&T),
) -> Result<(), CliError> {
    if json {
        print_json(value)
    } else {
        table(value);
        Ok(())
    }
}

/// `virtsoc bench WHICH`.
pub(crate) fn bench(which: BenchCmd) -> Result<(), CliError> {
    match which {
        BenchCmd::Gles(args) => bench_gles::run_bench(&args),
        BenchCmd::Devices {
            socket,
            resolution,
            frames,
            rounds,
            separate_accesses,
            json,
        } => bench_devices_cmd(
            socket,
            &resolution,
            (frames, rounds, separate_accesses),
            json,
        ),
        BenchCmd::Migrate { json } => {
            print_either(&bench_migrate::run()?, json, bench_migrate::print)
        }
        BenchCmd::Admission {
            flood,
            guests,
            json,
        } => {
            if guests == 0 {
                return Err(CliError::Usage("--guests must be positive".into()));
            }
            print_either(
                &bench_admission::run(flood, guests)?,
                json,
                bench_admission::print,
            )
        }
        BenchCmd::Isolation {
            seconds,
            frames,
            hostile,
            slow_resolution,
            json,
        } => bench_isolation_cmd(
            seconds,
            frames,
            hostile,
            scenario::resolution(&slow_resolution)?,
            json,
        ),
        BenchCmd::Sharing(args) => bench_sharing_cmd(args),
        BenchCmd::Transport(args) => bench_transport_cmd(args),
        BenchCmd::Services(args) => bench_services_cmd(args),
        BenchCmd::Svm(args) => bench_svm_cmd(args),
    }
}

/// `virtsoc bench devices`.
fn bench_devices_cmd(
    socket: Option<String>,
    resolution: &[String],
    (frames, rounds, separate): (usize, usize, bool),
    json: bool,
) -> Result<(), CliError> {
    let sizes = resolution
        .iter()
        .map(|r| scenario::resolution(r))
        .collect::<Result<Vec<_>, _>>()?;
    // A daemon started for the bench starts no spare decoder workers: a spare's start
    // (a process's exec and linking) would run beside the decoding it measures.
    let rs = with_daemon_spawned(socket, &["--decoder-spares", "0"], false, |e| {
        bench_devices::run(&e.target, e.pid, &sizes, (frames, rounds), separate)
    })?;
    print_either(&rs, json, bench_devices::print_table)
}

/// `virtsoc bench isolation`: fails when the victim lost more than 20%.
fn bench_isolation_cmd(
    seconds: f64,
    frames: usize,
    hostile: Vec<String>,
    slow: (u32, u32),
    json: bool,
) -> Result<(), CliError> {
    if !(0.5..=3600.0).contains(&seconds) || frames == 0 {
        return Err(CliError::Usage(
            "--seconds must be in 0.5..=3600 and --frames positive".into(),
        ));
    }
    let r = bench_isolation::run(&bench_isolation::IsolationParams {
        seconds,
        frames,
        kinds: hostile,
        slow,
    })?;
    print_either(&r, json, bench_isolation::print_table)?;
    if !r.all_ok {
        return Err(CliError::Usage(
            "the victim lost more than 20% next to a hostile guest".into(),
        ));
    }
    Ok(())
}

/// `virtsoc bench sharing`.
fn bench_sharing_cmd(a: SharingArgs) -> Result<(), CliError> {
    let r = bench_sharing::run(&bench_sharing::SharingParams {
        gpu_sizes: bench_sharing::parse_sizes("gpu-sizes", &a.gpu_sizes, false)?,
        codec_sizes: bench_sharing::parse_sizes("codec-sizes", &a.codec_sizes, true)?,
        codec_threads: a.codec_threads.max(1),
        gpu: !a.no_gpu,
        repeats: a.repeats.max(1),
        codec: !a.no_codec,
        together: !a.no_together,
        hogs: a.hogs.into_iter().filter(|n| *n > 0).collect(),
        hog_kinds: bench_sharing::parse_hog_kinds(&a.hog_kind)?,
        seconds: a.seconds.max(1),
        guests: a.guests.into_iter().filter(|n| *n > 0).collect(),
        schedulers: a.scheduler,
    })?;
    bench_sharing::write_chart(&r, &a.chart)?;
    print_either(&r, a.json, |r| {
        bench_sharing::print_table(r);
        println!("chart: {}", a.chart.display());
    })
}

/// `virtsoc bench transport`.
fn bench_transport_cmd(a: TransportArgs) -> Result<(), CliError> {
    let mut r = with_daemon(a.socket, true, |e| {
        bench_transport::run_rounds(e, &a.channels, a.round_trips, a.size, a.reps, a.rounds)
    })?;
    if let Some(image) = a.vm_image {
        r.channels.push(bench_transport::vm_channel(
            &image,
            a.round_trips,
            a.size,
            a.reps,
        )?);
    }
    print_either(&r, a.json, bench_transport::print_table)
}

/// `virtsoc bench services`, or its soak with `--soak SECONDS` (which fails on a wrong
/// transfer or count).
fn bench_services_cmd(a: ServicesArgs) -> Result<(), CliError> {
    if let Some(seconds) = a.soak {
        let r = with_daemon(a.socket, false, |e| {
            bench_services::soak::soak(e, a.guests, a.channels, seconds, a.size)
        })?;
        print_json(&r)?;
        if r.mismatches > 0 || r.count_errors > 0 {
            return Err(CliError::Usage(format!(
                "{} transfers came back wrong; {} guests' transfer counts do not add up",
                r.mismatches, r.count_errors
            )));
        }
        return Ok(());
    }
    let mut r = with_daemon(a.socket, false, |e| {
        let each = (a.round_trips, a.size, a.reps);
        bench_services::run(e, a.channels, each, a.rounds)
    })?;
    if let Some(image) = &a.vm_image {
        let vm = bench_services::vm_rows(image, a.round_trips, a.size, a.reps)?;
        r.rows.extend(vm);
    }
    if let Some(path) = &a.chart {
        bench_services::chart::write(&r, path)?;
    }
    print_either(&r, a.json, bench_services::print_table)
}

/// `virtsoc bench svm`: the synthetic pipeline, or a recorded trace replayed; fails when a
/// frame was delivered corrupt.
fn bench_svm_cmd(a: SvmArgs) -> Result<(), CliError> {
    if !(0.0..=10_000.0).contains(&a.slack_ms) {
        return Err(CliError::Usage("--slack-ms must be in 0..=10000".into()));
    }
    let params = bench_svm::SvmBenchParams {
        protocols: a.protocol,
        orderings: a.ordering,
        size: a.size,
        slack: Duration::from_secs_f64(a.slack_ms / 1e3),
        pattern: a.slack_pattern,
        frames: a.frames,
        buffers: a.buffers,
        warmup: a.warmup,
        readers: a.readers,
        switch_every: a.switch_every,
        consumer: a.consumer,
    };
    let r = match a.trace {
        Some(path) => {
            let events = trace::parse(&std::fs::read_to_string(&path)?)?;
            let results = with_daemon(a.socket, false, |e| {
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
        None => with_daemon(a.socket, false, |e| bench_svm::run(&e.target, &params))?,
    };
    print_either(&r, a.json, bench_svm::print_table)?;
    if r.protocols.iter().any(|p| p.corrupt_frames > 0) {
        return Err(CliError::Usage("some frames were delivered corrupt".into()));
    }
    Ok(())
}

/// `virtsoc demo`: the transport benchmark, then the SVM benchmark of three protocols in
/// both orderings.
pub(crate) fn demo(socket: Option<String>, frames: usize) -> Result<(), CliError> {
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
    })
}

/// `virtsoc run SCENARIO`.
pub(crate) fn run_scenario(a: RunArgs) -> Result<(), CliError> {
    let (default_res, default_fps) = scenario::defaults(&a.scenario);
    let (width, height) = scenario::resolution(a.resolution.as_deref().unwrap_or(default_res))?;
    let fps = a.fps.unwrap_or(default_fps);
    if !(0.5..=3600.0).contains(&a.seconds) || !(1..=240).contains(&fps) {
        return Err(CliError::Usage(
            "--seconds must be 0.5..3600 and --fps 1..240".into(),
        ));
    }
    scenario::rounds::run_cmd(scenario::rounds::RunCmd {
        opts: scenario::RunOpts {
            scenario: a.scenario,
            protocol: a.protocol,
            ordering: a.ordering,
            seconds: a.seconds,
            width,
            height,
            fps,
            composition: a.composition,
            pacing: a.pacing,
        },
        socket: a.socket,
        compare: a.compare,
        rounds: a.rounds,
        clip: a.clip,
        in_flight: a.in_flight,
        breakdown: a.breakdown,
        display_sink: a.display_sink,
        json: a.json,
        save: a.save,
    })
}

/// `virtsoc report RESULTS --out DIR`: the charts' paths, one a line.
pub(crate) fn report(results: &Path, out: &Path) -> Result<(), CliError> {
    let rs = report::load(results)?;
    for f in report::write(&rs, out)? {
        println!("{}", f.display());
    }
    Ok(())
}

/// `virtsoc devices`: the daemon's devices and their commands, or the C header.
pub(crate) fn devices(socket: Option<String>, json: bool, c_header: bool) -> Result<(), CliError> {
    if c_header {
        print!("{}", virtsoc_devapi::c_header(virtsoc_devapi::ALL));
        return Ok(());
    }
    let devices = with_daemon(socket, false, |e| {
        let c = Connection::open(&e.target, &ConnectOptions::default())?;
        Ok(c.devices().to_vec())
    })?;
    if json {
        return print_json(&devices);
    }
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
    Ok(())
}

/// `virtsoc vm run`: fails when the guest command did.
pub(crate) fn vm_run(a: VmRunArgs) -> Result<(), CliError> {
    let outcome = vm::run(&vm::VmRun {
        image: a.image,
        endpoint: a.shm.zip(a.doorbell),
        window_mib: a.window_mib,
        accel: a.accel,
        memory_mib: a.memory_mib,
        timeout: Duration::from_secs(a.timeout),
        args: a.args,
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
    Ok(())
}

/// `virtsoc debug hold`: opens `regions` regions mid-write (and with `channels`, service
/// channels with a bulk transfer half sent) and waits to be killed.
pub(crate) fn hold(
    socket: &str,
    regions: usize,
    size: u64,
    channels: bool,
) -> Result<(), CliError> {
    use virtsoc_guest::services::{bulk, Bulk, Geo, Sensors};
    let conn = Connection::open(socket, &ConnectOptions::default())?;
    let mut open = (None, None, None);
    if channels {
        let (geo, sensors, mut b) = (
            Geo::open(&conn)?,
            Sensors::open(&conn)?,
            Bulk::open(&conn, 8)?,
        );
        let data = vec![0x33u8; 4 * virtsoc_services::packet::PACKET_SIZE as usize];
        let packets = virtsoc_services::reassembly::split(1, bulk::call::SINK, &data);
        for (slot, (h, bytes)) in packets.iter().take(2).enumerate() {
            b.0.post_packet(h, bytes, slot as u32)?;
        }
        open = (Some(geo), Some(sensors), Some(b));
    }
    for i in 0..regions {
        let id = conn.alloc_blob(size)?.id;
        conn.begin_access(id, DeviceId::PRODUCER, 0, size, AccessMode::Write)?;
        conn.device_cmd(
            DeviceId::PRODUCER,
            [testdev::WRITE_PATTERN, u64::from(id), i as u64, 0, 0, 0],
        )?;
        // Left mid-frame on purpose: the access is never ended.
    }
    println!("READY {}", conn.guest_id());
    use std::io::Write;
    std::io::stdout().flush()?;
    // Wait to be killed; reading stdin blocks until the test closes it.
    let mut sink = String::new();
    let _ = std::io::stdin().read_line(&mut sink);
    drop(open);
    Ok(())
}
