//! `virtsocd`'s command line: every flag, its default and its parser (clap), and the
//! daemon's configuration built from them (`Args::limits`, `Args::devices`, ...).

use std::path::PathBuf;

use clap::Parser;
use virtsoc_host::device::registry::{
    CameraSourceKind, DeviceConfig, DisplayBackendKind, GpuBackendKind, IspBackendKind,
    DEFAULT_GPU_DRIVER_NICE,
};
use virtsoc_host::Limits;
use virtsoc_svm::ProtocolKind;

use crate::error::ConfigError;

/// The virtsoc host daemon.
#[derive(Debug, Parser)]
#[command(name = "virtsocd", version)]
pub struct Args {
    /// Unix socket to listen on (a stale socket file is replaced; a live daemon's is not).
    #[arg(long, default_value = "/tmp/virtsoc.sock")]
    pub socket: PathBuf,
    /// Coherence protocol for guests that do not choose one.
    #[arg(long, default_value = "write-invalidate", value_parser = parse_protocol)]
    pub protocol: ProtocolKind,
    /// Largest window a guest may map, in bytes.
    #[arg(long, default_value_t = 1 << 30)]
    pub max_window: u64,
    /// Host and device memory one guest's regions may hold, in bytes.
    #[arg(long, default_value_t = 4 << 30)]
    pub guest_mem_limit: u64,
    /// Prefetch: suspend a flow while its link's bandwidth (over about ten copies) is under
    /// this fraction of the best seen, unless its last 8 reads were hits (0 disables the
    /// rule).
    #[arg(long, default_value_t = 0.5)]
    pub prefetch_bandwidth_floor: f64,
    /// Prefetch: suspend a flow after this many consecutive mispredictions (0 disables).
    #[arg(long, default_value_t = 3)]
    pub prefetch_max_misses: u32,
    /// Fault injection for tests: every asynchronous copy a copy channel makes waits this
    /// many ms first.
    #[arg(long, default_value_t = 0, hide = true)]
    pub test_dma_delay_ms: u64,
    /// Also accept remote guests on this TCP address (needs --token-file).
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// File holding the token remote guests must present (first line; or set
    /// VIRTSOC_TOKEN).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Serve a VM: `NAME:SHM_FILE:DOORBELL_SOCKET[:WINDOW_MIB]` (repeatable). The daemon
    /// creates the memory file QEMU maps as an ivshmem BAR and listens on the socket QEMU's
    /// virtio-serial chardev connects to.
    #[arg(long = "vm")]
    pub vms: Vec<String>,
    /// GPU backend: auto (wgpu when an adapter can be had, else cpu with a warning), wgpu
    /// (Vulkan; Mesa's CPU driver where there is no GPU; no start without an adapter), cpu,
    /// null.
    #[arg(long, value_enum, default_value_t = GpuBackendKind::Auto)]
    pub gpu_backend: GpuBackendKind,
    /// ISP backend: swscale, gpu (compute shader), cpu, null.
    #[arg(long, value_enum, default_value_t = IspBackendKind::Swscale)]
    pub isp_backend: IspBackendKind,
    /// Where the ISP's libswscale runs (the swscale backend, the gpu backend's YUV
    /// destinations): `process` (sandboxed worker processes of this program, so a crash or
    /// hang in it fails that command only) or `in-process` (in the daemon: two copies of
    /// each frame less, but a crash in libswscale ends the daemon and every guest's session).
    #[arg(long, value_enum, default_value_t = Decoders::Process)]
    pub isp_swscale: Decoders,
    /// Nice value (0-19) of a CPU Vulkan driver's worker threads (lavapipe), so the emulated
    /// GPU leaves the cores to the CPU-side devices first; 0 leaves them alone. No effect on
    /// a real GPU.
    #[arg(long, default_value_t = DEFAULT_GPU_DRIVER_NICE, value_parser = clap::value_parser!(i32).range(0..=19))]
    pub gpu_driver_nice: i32,
    /// Decoding threads per decoder.
    #[arg(long, default_value_t = 2)]
    pub codec_threads: usize,
    /// libx264's preset for the codec device's H.264 encoders (ultrafast, superfast,
    /// veryfast, faster, medium): a faster one costs less CPU time and latency per frame.
    #[arg(long, default_value = "veryfast", value_parser = parse_preset)]
    pub encoder_preset: virtsoc_media::EncoderPreset,
    /// Where the codec device's decoders run: `process` (each decoder's libavcodec in a
    /// sandboxed worker process of its own, this program, so a crash or hang in it ends that
    /// decoder only; its pictures are lent to the frame regions, not copied) or
    /// `in-process` (in the daemon: each picture copied once into its region, and a crash
    /// in libavcodec ends the daemon and every guest's session).
    #[arg(long, value_enum, default_value_t = Decoders::Process)]
    pub decoders: Decoders,
    /// With `--decoders process`: decoder workers kept started ahead, so opening a decoder
    /// does not wait for a process start.
    #[arg(long, default_value_t = virtsoc_media::codec::DEFAULT_SPARE)]
    pub decoder_spares: usize,
    /// How long (microseconds) a codec command of a guest not alone on the codec may wait
    /// for its decoder's worker on the codec's thread before the codec's waiter takes it:
    /// meanwhile no other guest's command starts on the codec; 0 hands it over at once, so
    /// that the guests' decoders run side by side on the host's cores (each handed-over
    /// command costs the daemon about 40 us of CPU).
    #[arg(long, default_value_t = virtsoc_host::device::codec::DEFAULT_GRACE.as_micros() as u64)]
    pub codec_grace_us: u64,
    /// The GLES device's render worker program, started once per guest using OpenGL ES
    /// (default: `virtsoc-render` beside this executable, or `$VIRTSOC_RENDER_WORKER`).
    #[arg(long, value_name = "PATH")]
    pub render_worker: Option<std::path::PathBuf>,
    /// Longest a render worker may take to answer one batch of GLES commands, in
    /// milliseconds; a worker past it is ended as hung (that guest's contexts are lost).
    #[arg(long, default_value_t = 30_000)]
    pub render_deadline_ms: u64,
    /// Display refresh rate in Hz.
    #[arg(long, default_value_t = 60)]
    pub refresh_hz: u32,
    /// Display size, WIDTHxHEIGHT.
    #[arg(long, default_value = "1920x1080", value_parser = parse_size)]
    pub display_size: (u32, u32),
    /// Compose every presented frame and keep its checksum (the display's `checksum`
    /// command), to verify what the planes scan out; costs a composition per frame.
    #[arg(long)]
    pub display_verify: bool,
    /// What consumes scanned-out frames besides the backend: `crc` reads every byte of every
    /// plane of each frame once on a sink thread (as an encoder or remote view would; the
    /// display's `sink` command reports it), `none` reads only what the backend needs.
    #[arg(long, default_value = "none", value_parser = ["none", "crc"])]
    pub display_sink: String,
    /// Display backend: headless, or window (an X11 window; built with the `window` feature).
    #[arg(long, value_enum, default_value_t = DisplayBackendKind::Headless)]
    pub display_backend: DisplayBackendKind,
    /// Camera source: synthetic, file:PATH (a video looped as a camera), or v4l2:DEVICE
    /// (built with the `v4l2` feature).
    #[arg(long, default_value = "synthetic")]
    pub camera_source: CameraSourceKind,
    /// Directory for display snapshots (PNG).
    #[arg(long, default_value = "/tmp")]
    pub snapshot_dir: PathBuf,
    /// Keep guest sessions across restarts: save every session here on SIGTERM, and restore
    /// a saved session into the process guest that reconnects with its resume secret.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Accept live migrations of guest sessions on this TCP address (needs the token).
    #[arg(long)]
    pub migrate_listen: Option<std::net::SocketAddr>,
    /// Tests only: exit at this phase of an incoming migration (`precopy`, `stop`, `ready`,
    /// `resume`), to check that the source resumes its guest with nothing lost.
    #[arg(long, hide = true)]
    pub migrate_fault: Option<virtsoc_host::snapshot::migrate::Fault>,
    /// Print `READY <socket>` on stdout once listening (for supervisors and tests).
    #[arg(long)]
    pub print_ready: bool,
    /// Most spin iterations on a ring before sleeping on its doorbell; each doorbell spins
    /// less (down to 16) while its waits are long and more while they are short.
    #[arg(long, default_value_t = 4096)]
    pub spins: u32,
    /// Most guests (local and remote) served at once; more are refused. Connections still
    /// in their handshake do not count: at most 8 per peer and 32 per listener wait at once,
    /// the oldest idle one cut off for a newcomer.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_guests: u64,
    /// Unix socket of the control API (HTTP + JSON; `virtsoc ctl`); default
    /// `<socket>.control`. Removed on exit like the main socket.
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Unix socket where host programs register services (`docs/services.md`); default
    /// `<socket>.services`. Removed on exit like the main socket.
    #[arg(long)]
    pub services_socket: Option<PathBuf>,
    /// Also serve the control API on this TCP address; every request must carry
    /// `Authorization: Bearer <token>` with the remote-guest token (--token-file).
    #[arg(long)]
    pub control_listen: Option<std::net::SocketAddr>,
    /// The live view's CPU budget: its viewers together may use at most this percent of
    /// the CPU the daemon's other work uses (measured every half second); a frame request
    /// waits, up to a second, until the frames served so far fit. 0: viewers are not paced
    /// (the page's own rate, about 1 ms of CPU a frame on a small machine).
    #[arg(long, default_value_t = virtsoc_control::budget::DEFAULT_PCT, value_parser = view_budget)]
    pub view_budget: f64,
    /// Limit: regions one guest may hold at once (OutOfMemory beyond).
    #[arg(long, default_value_t = Limits::default().regions)]
    pub limit_regions: u64,
    /// Limit: live virtual fences of one guest (OutOfMemory beyond).
    #[arg(long, default_value_t = Limits::default().fences)]
    pub limit_fences: usize,
    /// Limit: items (commands, fence waits and signals) one guest may have queued on one
    /// device (Busy beyond).
    #[arg(long, default_value_t = Limits::default().queued_per_device)]
    pub limit_queued: usize,
    /// Limit: bytes of completions a remote guest may have waiting to be sent before the
    /// daemon takes its next request.
    #[arg(long, default_value_t = Limits::default().remote_bytes_in_flight)]
    pub limit_remote_bytes: u64,
    /// Limit: codec sessions (decoders and encoders) of one guest (OutOfMemory beyond).
    #[arg(long, default_value_t = Limits::default().codec_sessions_per_guest)]
    pub limit_codec_sessions: usize,
    /// Limit: codec sessions of all guests together (Busy beyond).
    #[arg(long, default_value_t = Limits::default().codec_sessions)]
    pub limit_codec_sessions_total: usize,
    /// Limit: codec threads of all sessions together (Busy beyond).
    #[arg(long, default_value_t = Limits::default().codec_threads)]
    pub limit_codec_threads: usize,
    /// Limit: codec threads one guest's open sessions may hold together, its share of
    /// --limit-codec-threads (Busy beyond).
    #[arg(long, default_value_t = Limits::default().codec_threads_per_guest)]
    pub limit_codec_threads_per_guest: usize,
    /// Milliseconds a decoder may sit idle (nothing pending) before its worker process is
    /// closed until its next decode, which resumes at the next key frame (0: never).
    #[arg(long, default_value_t = Limits::default().codec_idle_reap.as_millis() as u64)]
    pub codec_idle_reap_ms: u64,
    /// Limit: sent SMS the modem keeps per guest (the oldest are dropped beyond).
    #[arg(long, default_value_t = Limits::default().sms_sent)]
    pub limit_sms_sent: usize,
    /// Limit: milliseconds between two display snapshots of one guest (Busy sooner).
    #[arg(long, default_value_t = Limits::default().snapshot_interval.as_millis() as u64)]
    pub limit_snapshot_interval_ms: u64,
    /// Limit: cost of one GPU composite, the destination pixels its layers cover, summed
    /// (Busy beyond).
    #[arg(long, default_value_t = Limits::default().gpu_cost)]
    pub limit_gpu_cost: u64,
    /// Limit: GPU submissions of one guest in flight at once (Busy beyond).
    #[arg(long, default_value_t = Limits::default().gpu_in_flight, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub limit_gpu_in_flight: usize,
    /// Limit: one guest's memory-bandwidth share, bytes per second, for the large fills and
    /// copies its devices make (at least 2 MiB each: they run in 256 KiB steps, each waiting
    /// for its bytes of the share; 0: not paced).
    #[arg(long, default_value_t = Limits::default().bandwidth.rate)]
    pub limit_bandwidth: u64,
    /// Limit: bytes of that share a guest may bank while it moves less (its burst).
    #[arg(long, default_value_t = Limits::default().bandwidth.burst)]
    pub limit_bandwidth_burst: u64,
    /// Milliseconds a new connection has to send its complete hello.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    pub handshake_timeout_ms: u64,

    /// How each device chooses the next guest: round-robin, wfq (weighted fair queueing on
    /// device time), fixed-rate or aimd (AvA's rate controls).
    #[arg(long, default_value = "round-robin")]
    pub scheduler: virtsoc_sched::Kind,
    /// Sharing policy (TOML or JSON): per-guest shares, rate caps, allowed devices and
    /// commands, class. Reloaded on SIGHUP (a bad file then keeps the old policy).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Host services policy (JSON): which guest may use which service (`geo`, `sensor`,
    /// `clipboard`, `bulk`), shared or per-guest instances. Changed at run time with `virtsoc
    /// ctl services policy`. Without it every guest may use every service.
    #[arg(long)]
    pub services_policy: Option<PathBuf>,
    /// Steer guests' CPU weight: each guest's process goes into a cgroup NAME/guest-ID under
    /// the daemon's own (cgroup v2 cpu.weight, or v1 cpu.shares), weighted by its share (the
    /// policy's, the feedback loop's). Without the permission or the controller the daemon
    /// says so and goes on without.
    #[arg(long, value_name = "NAME")]
    pub cpu_cgroup: Option<String>,
}

/// Where a native library runs (`--decoders`, `--isp-swscale`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Decoders {
    /// In sandboxed worker processes (one per decoder; the ISP's as many as convert at once).
    Process,
    /// In the daemon's process.
    InProcess,
}

impl Args {
    /// The per-guest limits the `--limit-*` flags set.
    pub fn limits(&self) -> Limits {
        Limits {
            regions: self.limit_regions,
            fences: self.limit_fences,
            queued_per_device: self.limit_queued,
            remote_bytes_in_flight: self.limit_remote_bytes,
            codec_sessions_per_guest: self.limit_codec_sessions,
            codec_sessions: self.limit_codec_sessions_total,
            codec_threads: self.limit_codec_threads,
            codec_threads_per_guest: self.limit_codec_threads_per_guest,
            codec_idle_reap: std::time::Duration::from_millis(self.codec_idle_reap_ms),
            sms_sent: self.limit_sms_sent,
            snapshot_interval: std::time::Duration::from_millis(self.limit_snapshot_interval_ms),
            gpu_cost: self.limit_gpu_cost,
            gpu_in_flight: self.limit_gpu_in_flight,
            bandwidth: virtsoc_svm::pace::Share {
                rate: self.limit_bandwidth,
                burst: self.limit_bandwidth_burst,
            },
        }
    }

    /// The devices' configuration; the worker processes (`--decoders process`,
    /// `--isp-swscale process`) are this executable.
    pub fn devices(&self) -> Result<DeviceConfig, ConfigError> {
        let worker = |d: Decoders| match d {
            Decoders::Process => std::env::current_exe()
                .map(Some)
                .map_err(ConfigError::OwnExecutable),
            Decoders::InProcess => Ok(None),
        };
        Ok(DeviceConfig {
            gpu: self.gpu_backend,
            isp: self.isp_backend,
            gpu_driver_nice: self.gpu_driver_nice,
            codec_threads: self.codec_threads,
            encoder_preset: self.encoder_preset,
            codec_worker: worker(self.decoders)?,
            codec_worker_spares: self.decoder_spares,
            codec_grace: std::time::Duration::from_micros(self.codec_grace_us),
            isp_worker: worker(self.isp_swscale)?,
            render_worker: self.render_worker.clone(),
            render_deadline: std::time::Duration::from_millis(self.render_deadline_ms.max(1)),
            refresh_hz: self.refresh_hz,
            display_size: self.display_size,
            display_verify: self.display_verify,
            display_sink: self.display_sink == "crc",
            snapshot_dir: self.snapshot_dir.clone(),
            display_backend: self.display_backend,
            camera_source: self.camera_source.clone(),
        })
    }

    /// The prefetcher's configuration, checked.
    pub fn prefetch(&self) -> Result<virtsoc_prefetch::Config, ConfigError> {
        let cfg = virtsoc_prefetch::Config {
            bandwidth_floor: self.prefetch_bandwidth_floor,
            max_consecutive_misses: self.prefetch_max_misses,
            ..virtsoc_prefetch::Config::default()
        };
        cfg.validate()
            .map_err(|e| ConfigError::Prefetch(e.to_string()))?;
        Ok(cfg)
    }

    /// The remote-guest token: the first line of `--token-file`, else `$VIRTSOC_TOKEN`; at
    /// least 16 characters.
    pub fn token(&self) -> Result<Option<String>, ConfigError> {
        let t = match &self.token_file {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .map_err(|source| ConfigError::TokenFile {
                        path: p.clone(),
                        source,
                    })?
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string(),
            ),
            None => std::env::var("VIRTSOC_TOKEN").ok(),
        };
        match t {
            Some(t) if t.len() < 16 => Err(ConfigError::ShortToken),
            t => Ok(t),
        }
    }
}

// The value parsers below answer `String` errors where no crate has a type for the mistake:
// clap prints the text as it is after its own words ("invalid value ... for '--size'"), and
// nothing matches on it.

fn parse_protocol(s: &str) -> Result<ProtocolKind, virtsoc_svm::SvmError> {
    s.parse()
}

/// Parses `WIDTHxHEIGHT` (a `String` error: clap's value parser, see above).
fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let (w, h) = s
        .split_once('x')
        .ok_or_else(|| format!("{s:?} is not WIDTHxHEIGHT"))?;
    let n = |v: &str| v.parse::<u32>().map_err(|e| format!("{s:?}: {e}"));
    Ok((n(w)?, n(h)?))
}

/// Parses an encoder preset's name (a `String` error: clap's value parser, see above).
fn parse_preset(s: &str) -> Result<virtsoc_media::EncoderPreset, String> {
    virtsoc_media::EncoderPreset::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = virtsoc_media::EncoderPreset::ALL
            .iter()
            .map(|p| p.name())
            .collect();
        format!("{s:?} is not one of {}", names.join(", "))
    })
}

/// Parses `--view-budget`: a percentage, 0 to 100 (a `String` error: clap's value parser,
/// see above).
fn view_budget(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=100.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not a percentage in 0..=100"))
    }
}
