//! `virtsocd`: serves guests on a Unix socket until SIGINT or SIGTERM.

use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Parser;
use virtsoc_host::device::registry::{
    CameraSourceKind, DisplayBackendKind, GpuBackendKind, IspBackendKind, DEFAULT_GPU_DRIVER_NICE,
};
use virtsoc_host::device::share::Sharing;
use virtsoc_host::policy::PolicyStore;
use virtsoc_host::{Daemon, DaemonConfig, Limits};
use virtsoc_svm::ProtocolKind;

/// The virtsoc host daemon.
#[derive(Debug, Parser)]
#[command(name = "virtsocd", version)]
struct Args {
    /// Unix socket to listen on (a stale socket file is replaced; a live daemon's is not).
    #[arg(long, default_value = "/tmp/virtsoc.sock")]
    socket: PathBuf,
    /// Coherence protocol for guests that do not choose one.
    #[arg(long, default_value = "write-invalidate", value_parser = parse_protocol)]
    protocol: ProtocolKind,
    /// Largest window a guest may map, in bytes.
    #[arg(long, default_value_t = 1 << 30)]
    max_window: u64,
    /// Host and device memory one guest's regions may hold, in bytes.
    #[arg(long, default_value_t = 4 << 30)]
    guest_mem_limit: u64,
    /// Prefetch: suspend a flow while its link's bandwidth (over about ten copies) is under
    /// this fraction of the best seen, unless its last 8 reads were hits (0 disables the
    /// rule).
    #[arg(long, default_value_t = 0.5)]
    prefetch_bandwidth_floor: f64,
    /// Prefetch: suspend a flow after this many consecutive mispredictions (0 disables).
    #[arg(long, default_value_t = 3)]
    prefetch_max_misses: u32,
    /// Fault injection for tests: every asynchronous copy waits this many ms first.
    #[arg(long, default_value_t = 0, hide = true)]
    test_dma_delay_ms: u64,
    /// Also accept remote guests on this TCP address (needs --token-file).
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// File holding the token remote guests must present (first line; or set
    /// VIRTSOC_TOKEN).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Serve a VM: `NAME:SHM_FILE:DOORBELL_SOCKET[:WINDOW_MIB]` (repeatable). The daemon
    /// creates the memory file QEMU maps as an ivshmem BAR and listens on the socket QEMU's
    /// virtio-serial chardev connects to.
    #[arg(long = "vm")]
    vms: Vec<String>,
    /// GPU backend: auto (wgpu when an adapter can be had, else cpu with a warning), wgpu
    /// (Vulkan; Mesa's CPU driver where there is no GPU; no start without an adapter), cpu,
    /// null.
    #[arg(long, value_enum, default_value_t = GpuBackendKind::Auto)]
    gpu_backend: GpuBackendKind,
    /// ISP backend: swscale, gpu (compute shader), cpu, null.
    #[arg(long, value_enum, default_value_t = IspBackendKind::Swscale)]
    isp_backend: IspBackendKind,
    /// Where the ISP's libswscale runs (the swscale backend, the gpu backend's YUV
    /// destinations): `process` (sandboxed worker processes of this program, so a crash or
    /// hang in it fails that command only) or `in-process` (in the daemon: two copies of
    /// each frame less, but a crash in libswscale ends the daemon and every guest's session).
    #[arg(long, value_enum, default_value_t = Decoders::Process)]
    isp_swscale: Decoders,
    /// Nice value (0-19) of a CPU Vulkan driver's worker threads (lavapipe), so the emulated
    /// GPU leaves the cores to the CPU-side devices first; 0 leaves them alone. No effect on
    /// a real GPU.
    #[arg(long, default_value_t = DEFAULT_GPU_DRIVER_NICE, value_parser = clap::value_parser!(i32).range(0..=19))]
    gpu_driver_nice: i32,
    /// Decoding threads per decoder.
    #[arg(long, default_value_t = 2)]
    codec_threads: usize,
    /// libx264's preset for the codec device's H.264 encoders (ultrafast, superfast,
    /// veryfast, faster, medium): a faster one costs less CPU time and latency per frame.
    #[arg(long, default_value = "veryfast", value_parser = parse_preset)]
    encoder_preset: virtsoc_media::EncoderPreset,
    /// Where the codec device's decoders run: `process` (each decoder's libavcodec in a
    /// sandboxed worker process of its own, this program, so a crash or hang in it ends that
    /// decoder only; its pictures are lent to the frame regions, not copied) or
    /// `in-process` (in the daemon: each picture copied once into its region, and a crash
    /// in libavcodec ends the daemon and every guest's session).
    #[arg(long, value_enum, default_value_t = Decoders::Process)]
    decoders: Decoders,
    /// With `--decoders process`: decoder workers kept started ahead, so opening a decoder
    /// does not wait for a process start.
    #[arg(long, default_value_t = virtsoc_media::codec::DEFAULT_SPARE)]
    decoder_spares: usize,
    /// The GLES device's render worker program, started once per guest using OpenGL ES
    /// (default: `virtsoc-render` beside this executable, or `$VIRTSOC_RENDER_WORKER`).
    #[arg(long, value_name = "PATH")]
    render_worker: Option<std::path::PathBuf>,
    /// Longest a render worker may take to answer one batch of GLES commands, in
    /// milliseconds; a worker past it is ended as hung (that guest's contexts are lost).
    #[arg(long, default_value_t = 30_000)]
    render_deadline_ms: u64,
    /// Display refresh rate in Hz.
    #[arg(long, default_value_t = 60)]
    refresh_hz: u32,
    /// Display size, WIDTHxHEIGHT.
    #[arg(long, default_value = "1920x1080", value_parser = parse_size)]
    display_size: (u32, u32),
    /// Compose every presented frame and keep its checksum (the display's `checksum`
    /// command), to verify what the planes scan out; costs a composition per frame.
    #[arg(long)]
    display_verify: bool,
    /// What consumes scanned-out frames besides the backend: `crc` reads every byte of every
    /// plane of each frame once on a sink thread (as an encoder or remote view would; the
    /// display's `sink` command reports it), `none` reads only what the backend needs.
    #[arg(long, default_value = "none", value_parser = ["none", "crc"])]
    display_sink: String,
    /// Display backend: headless, or window (an X11 window; built with the `window` feature).
    #[arg(long, value_enum, default_value_t = DisplayBackendKind::Headless)]
    display_backend: DisplayBackendKind,
    /// Camera source: synthetic, file:PATH (a video looped as a camera), or v4l2:DEVICE
    /// (built with the `v4l2` feature).
    #[arg(long, default_value = "synthetic")]
    camera_source: CameraSourceKind,
    /// Directory for display snapshots (PNG).
    #[arg(long, default_value = "/tmp")]
    snapshot_dir: PathBuf,
    /// Keep guest sessions across restarts: save every session here on SIGTERM, and restore
    /// a saved session into the process guest that reconnects with its resume secret.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Accept live migrations of guest sessions on this TCP address (needs the token).
    #[arg(long)]
    migrate_listen: Option<std::net::SocketAddr>,
    /// Tests only: exit at this phase of an incoming migration (`precopy`, `stop`, `ready`,
    /// `resume`), to check that the source resumes its guest with nothing lost.
    #[arg(long, hide = true)]
    migrate_fault: Option<virtsoc_host::snapshot::migrate::Fault>,
    /// Print `READY <socket>` on stdout once listening (for supervisors and tests).
    #[arg(long)]
    print_ready: bool,
    /// Most spin iterations on a ring before sleeping on its doorbell; each doorbell spins
    /// less (down to 16) while its waits are long and more while they are short.
    #[arg(long, default_value_t = 4096)]
    spins: u32,
    /// Most guests (local and remote) served at once; more are refused. Connections still
    /// in their handshake do not count: at most 8 per peer and 32 per listener wait at once,
    /// the oldest idle one cut off for a newcomer.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    max_guests: u64,
    /// Unix socket of the control API (HTTP + JSON; `virtsoc ctl`); default
    /// `<socket>.control`. Removed on exit like the main socket.
    #[arg(long)]
    control: Option<PathBuf>,
    /// Unix socket where host programs register services (`docs/services.md`); default
    /// `<socket>.services`. Removed on exit like the main socket.
    #[arg(long)]
    services_socket: Option<PathBuf>,
    /// Also serve the control API on this TCP address; every request must carry
    /// `Authorization: Bearer <token>` with the remote-guest token (--token-file).
    #[arg(long)]
    control_listen: Option<std::net::SocketAddr>,
    /// The live view's CPU budget: its viewers together may use at most this percent of
    /// the CPU the daemon's other work uses (measured every half second); a frame request
    /// waits, up to a second, until the frames served so far fit. 0: viewers are not paced
    /// (the page's own rate, about 1 ms of CPU a frame on a small machine).
    #[arg(long, default_value_t = virtsoc_control::budget::DEFAULT_PCT, value_parser = view_budget)]
    view_budget: f64,
    /// Limit: regions one guest may hold at once (OutOfMemory beyond).
    #[arg(long, default_value_t = Limits::default().regions)]
    limit_regions: u64,
    /// Limit: live virtual fences of one guest (OutOfMemory beyond).
    #[arg(long, default_value_t = Limits::default().fences)]
    limit_fences: usize,
    /// Limit: items (commands, fence waits and signals) one guest may have queued on one
    /// device (Busy beyond).
    #[arg(long, default_value_t = Limits::default().queued_per_device)]
    limit_queued: usize,
    /// Limit: bytes of completions a remote guest may have waiting to be sent before the
    /// daemon takes its next request.
    #[arg(long, default_value_t = Limits::default().remote_bytes_in_flight)]
    limit_remote_bytes: u64,
    /// Limit: codec sessions (decoders and encoders) of one guest (OutOfMemory beyond).
    #[arg(long, default_value_t = Limits::default().codec_sessions_per_guest)]
    limit_codec_sessions: usize,
    /// Limit: codec sessions of all guests together (Busy beyond).
    #[arg(long, default_value_t = Limits::default().codec_sessions)]
    limit_codec_sessions_total: usize,
    /// Limit: codec threads of all sessions together (Busy beyond).
    #[arg(long, default_value_t = Limits::default().codec_threads)]
    limit_codec_threads: usize,
    /// Limit: codec threads one guest's open sessions may hold together, its share of
    /// --limit-codec-threads (Busy beyond).
    #[arg(long, default_value_t = Limits::default().codec_threads_per_guest)]
    limit_codec_threads_per_guest: usize,
    /// Limit: sent SMS the modem keeps per guest (the oldest are dropped beyond).
    #[arg(long, default_value_t = Limits::default().sms_sent)]
    limit_sms_sent: usize,
    /// Limit: milliseconds between two display snapshots of one guest (Busy sooner).
    #[arg(long, default_value_t = Limits::default().snapshot_interval.as_millis() as u64)]
    limit_snapshot_interval_ms: u64,
    /// Limit: cost of one GPU composite, the destination pixels its layers cover, summed
    /// (Busy beyond).
    #[arg(long, default_value_t = Limits::default().gpu_cost)]
    limit_gpu_cost: u64,
    /// Limit: GPU submissions of one guest in flight at once (Busy beyond).
    #[arg(long, default_value_t = Limits::default().gpu_in_flight, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    limit_gpu_in_flight: usize,
    /// Limit: one guest's memory-bandwidth share, bytes per second, for the large fills and
    /// copies its devices make (at least 2 MiB each: they run in 256 KiB steps, each waiting
    /// for its bytes of the share; 0: not paced).
    #[arg(long, default_value_t = Limits::default().bandwidth.rate)]
    limit_bandwidth: u64,
    /// Limit: bytes of that share a guest may bank while it moves less (its burst).
    #[arg(long, default_value_t = Limits::default().bandwidth.burst)]
    limit_bandwidth_burst: u64,
    /// Milliseconds a new connection has to send its complete hello.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    handshake_timeout_ms: u64,

    /// How each device chooses the next guest: round-robin, wfq (weighted fair queueing on
    /// device time), fixed-rate or aimd (AvA's rate controls).
    #[arg(long, default_value = "round-robin")]
    scheduler: virtsoc_sched::Kind,
    /// Sharing policy (TOML or JSON): per-guest shares, rate caps, allowed devices and
    /// commands, class. Reloaded on SIGHUP (a bad file then keeps the old policy).
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Host services policy (JSON): which guest may use which service (`geo`, `sensor`,
    /// `clipboard`, `bulk`), shared or per-guest instances. Changed at run time with `virtsoc
    /// ctl services policy`. Without it every guest may use every service.
    #[arg(long)]
    services_policy: Option<PathBuf>,
    /// Steer guests' CPU weight: each guest's process goes into a cgroup NAME/guest-ID under
    /// the daemon's own (cgroup v2 cpu.weight, or v1 cpu.shares), weighted by its share (the
    /// policy's, the feedback loop's). Without the permission or the controller the daemon
    /// says so and goes on without.
    #[arg(long, value_name = "NAME")]
    cpu_cgroup: Option<String>,
}

/// Where a native library runs (`--decoders`, `--isp-swscale`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Decoders {
    /// In sandboxed worker processes (one per decoder; the ISP's as many as convert at once).
    Process,
    /// In the daemon's process.
    InProcess,
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--codec-worker") {
        // A decoder worker (stdin: its socket to the daemon).
        std::process::exit(match virtsoc_host::device::codec::serve_worker() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("virtsocd codec worker: {e}");
                1
            }
        });
    }
    if std::env::args().nth(1).as_deref() == Some(virtsoc_media::isp::ISP_WORKER_ARG) {
        // An ISP worker (stdin: its socket to the daemon).
        std::process::exit(match virtsoc_media::isp::serve_isp() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("virtsocd isp worker: {e}");
                1
            }
        });
    }
    virtsoc_host::runtime_dir::ensure();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("virtsocd: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> virtsoc_host::Result<()> {
    // Everything that can fail on a bad configuration runs before the socket is touched.
    let policy = Arc::new(match &args.policy {
        Some(p) => PolicyStore::load(p)?,
        None => PolicyStore::default(),
    });
    let cgroups =
        args.cpu_cgroup
            .as_deref()
            .and_then(
                |name| match virtsoc_host::cgroup::CpuCgroups::detect(name) {
                    Ok(cg) => {
                        log::info!("cpu weight: {} in {}", cg.version(), cg.parent().display());
                        Some(Arc::new(cg))
                    }
                    Err(e) => {
                        log::warn!("cpu weight: not steered: {e}");
                        None
                    }
                },
            );
    let sharing = Sharing {
        scheduler: args.scheduler,
        policy: policy.clone(),
        cgroups: cgroups.clone(),
    };
    sharing.follow_policy_with_cpu_weights();
    let daemon = Daemon::new(DaemonConfig {
        sharing,
        socket: args.socket.clone(),
        protocol: args.protocol,
        max_window: args.max_window,
        guest_mem_limit: args.guest_mem_limit,
        spins: args.spins,
        handshake_timeout: std::time::Duration::from_millis(args.handshake_timeout_ms),
        max_connections: usize::try_from(args.max_guests).unwrap_or(usize::MAX),
        test_dma_delay: std::time::Duration::from_millis(args.test_dma_delay_ms),
        token: token(&args)?,
        state_dir: args.state_dir.clone(),
        view_budget_pct: args.view_budget,
        services_policy: args.services_policy.clone(),
        limits: Limits {
            regions: args.limit_regions,
            fences: args.limit_fences,
            queued_per_device: args.limit_queued,
            remote_bytes_in_flight: args.limit_remote_bytes,
            codec_sessions_per_guest: args.limit_codec_sessions,
            codec_sessions: args.limit_codec_sessions_total,
            codec_threads: args.limit_codec_threads,
            codec_threads_per_guest: args.limit_codec_threads_per_guest,
            codec_idle_reap: Limits::default().codec_idle_reap,
            sms_sent: args.limit_sms_sent,
            snapshot_interval: std::time::Duration::from_millis(args.limit_snapshot_interval_ms),
            gpu_cost: args.limit_gpu_cost,
            gpu_in_flight: args.limit_gpu_in_flight,
            bandwidth: virtsoc_svm::pace::Share {
                rate: args.limit_bandwidth,
                burst: args.limit_bandwidth_burst,
            },
        },
        devices: virtsoc_host::device::registry::DeviceConfig {
            gpu: args.gpu_backend,
            isp: args.isp_backend,
            gpu_driver_nice: args.gpu_driver_nice,
            codec_threads: args.codec_threads,
            encoder_preset: args.encoder_preset,
            codec_worker: match args.decoders {
                Decoders::Process => Some(std::env::current_exe()?),
                Decoders::InProcess => None,
            },
            codec_worker_spares: args.decoder_spares,
            isp_worker: match args.isp_swscale {
                Decoders::Process => Some(std::env::current_exe()?),
                Decoders::InProcess => None,
            },
            render_worker: args.render_worker.clone(),
            render_deadline: std::time::Duration::from_millis(args.render_deadline_ms.max(1)),
            refresh_hz: args.refresh_hz,
            display_size: args.display_size,
            display_verify: args.display_verify,
            display_sink: args.display_sink == "crc",
            snapshot_dir: args.snapshot_dir.clone(),
            display_backend: args.display_backend,
            camera_source: args.camera_source.clone(),
        },
        prefetch: {
            let cfg = virtsoc_prefetch::Config {
                bandwidth_floor: args.prefetch_bandwidth_floor,
                max_consecutive_misses: args.prefetch_max_misses,
                ..virtsoc_prefetch::Config::default()
            };
            cfg.validate()
                .map_err(|e| virtsoc_host::HostError::Config(e.to_string()))?;
            cfg
        },
    })?;
    let vms = args
        .vms
        .iter()
        .map(|v| virtsoc_host::vm::VmConfig::parse(v))
        .collect::<virtsoc_host::Result<Vec<_>>>()?;
    let tcp = args.listen.map(std::net::TcpListener::bind).transpose()?;
    let listener = claim_socket(&args.socket)?;
    // Ours now: removed when run() returns, whether it succeeded or not.
    let _socket_file = SocketFile(args.socket.clone());
    let (stop_rx, stop_tx) = UnixStream::pair()?;
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::low_level::pipe::register(sig, stop_tx.try_clone()?)?;
    }
    if args.policy.is_some() {
        reload_on_sighup(policy)?;
    }
    let control_path = args
        .control
        .clone()
        .unwrap_or_else(|| virtsoc_host::control::default_path(&args.socket));
    // Stopped, and its socket removed, when run() returns.
    let _control = virtsoc_host::control::start(&daemon, Some(&control_path), args.control_listen)?;
    let services_path = args
        .services_socket
        .clone()
        .unwrap_or_else(|| virtsoc_host::services::external::default_path(&args.socket));
    // Its socket is removed when run() returns.
    let _services = virtsoc_host::services::external::start(
        daemon.service_hypervisor(),
        &services_path,
        daemon.config().token.clone(),
    )?;
    if let (Some(addr), Some(token)) = (_control.tcp_addr(), &daemon.config().token) {
        // The page needs the token like every TCP request; it rides in the URL.
        eprintln!("virtsocd: live view at http://{addr}/view#token={token}");
    }
    for vm in &vms {
        virtsoc_host::vm::start(daemon.clone(), vm.clone())?;
    }
    if let Some(addr) = args.migrate_listen {
        virtsoc_host::snapshot::migrate::listen(&daemon, addr, args.migrate_fault)?;
    }
    if args.print_ready {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        if let Some(t) = &tcp {
            writeln!(out, "LISTEN {}", t.local_addr()?)?;
        }
        writeln!(out, "READY {}", args.socket.display())?;
        out.flush()?;
    }
    let result = daemon.serve(listener, tcp, OwnedFd::from(stop_rx));
    for vm in &vms {
        virtsoc_host::vm::cleanup(vm);
    }
    if args.migrate_listen.is_some() {
        // The socket where VM guests' ports of incoming migrations arrive.
        let mut port_socket = args.socket.clone().into_os_string();
        port_socket.push(".migrate");
        let _ = std::fs::remove_file(port_socket);
    }
    if let Some(cg) = &cgroups {
        cg.release_all();
    }
    result
}

/// Reloads the policy on every SIGHUP; a bad file keeps the old policy and is logged.
fn reload_on_sighup(policy: Arc<PolicyStore>) -> virtsoc_host::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])?;
    std::thread::Builder::new()
        .name("policy-reload".into())
        .spawn(move || {
            for _ in signals.forever() {
                match policy.reload() {
                    Ok(()) => log::info!("policy reloaded"),
                    Err(e) => log::error!("policy not reloaded, keeping the old one: {e}"),
                }
            }
        })?;
    Ok(())
}

/// The socket file this daemon bound, removed on drop.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Binds the Unix socket. An existing socket file is replaced only if no daemon answers on
/// it (a stale file left by a crash); a live daemon's socket and non-socket files are left
/// alone.
fn claim_socket(path: &Path) -> virtsoc_host::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
        Ok(m) if !m.file_type().is_socket() => {
            return Err(virtsoc_host::HostError::Config(format!(
                "{} exists and is not a socket; not replacing it",
                path.display()
            )))
        }
        Ok(_) => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(virtsoc_host::HostError::Config(format!(
                    "another daemon is already listening on {}; not replacing its socket",
                    path.display()
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                log::info!("replacing stale socket {}", path.display());
                std::fs::remove_file(path)?;
            }
            Err(e) => {
                return Err(virtsoc_host::HostError::Config(format!(
                    "cannot tell whether a daemon listens on {}: {e}",
                    path.display()
                )))
            }
        },
    }
    Ok(UnixListener::bind(path)?)
}

/// The remote-guest token: from --token-file, else $VIRTSOC_TOKEN.
fn token(args: &Args) -> virtsoc_host::Result<Option<String>> {
    let t = match &args.token_file {
        Some(p) => Some(
            std::fs::read_to_string(p)?
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string(),
        ),
        None => std::env::var("VIRTSOC_TOKEN").ok(),
    };
    match t {
        Some(t) if t.len() < 16 => Err(virtsoc_host::HostError::Config(
            "the remote-guest token must be at least 16 characters".into(),
        )),
        t => Ok(t),
    }
}

fn parse_protocol(s: &str) -> Result<ProtocolKind, String> {
    s.parse().map_err(|e: virtsoc_svm::SvmError| e.to_string())
}

/// Parses `WIDTHxHEIGHT`.
fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let (w, h) = s
        .split_once('x')
        .ok_or_else(|| format!("{s:?} is not WIDTHxHEIGHT"))?;
    let n = |v: &str| v.parse::<u32>().map_err(|e| format!("{s:?}: {e}"));
    Ok((n(w)?, n(h)?))
}

fn parse_preset(s: &str) -> Result<virtsoc_media::EncoderPreset, String> {
    virtsoc_media::EncoderPreset::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = virtsoc_media::EncoderPreset::ALL
            .iter()
            .map(|p| p.name())
            .collect();
        format!("{s:?} is not one of {}", names.join(", "))
    })
}

/// Parses `--view-budget`: a percentage, 0 to 100.
fn view_budget(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=100.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not a percentage in 0..=100"))
    }
}
