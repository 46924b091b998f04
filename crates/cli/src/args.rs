//! The command line: `virtsoc`'s commands and their options (clap).

use std::path::PathBuf;

use super::*;

#[derive(Debug, Parser)]
#[command(
    name = "virtsoc",
    version,
    about = "virtsoc benchmarks, demo and guest tools"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Cmd {
    /// Benchmarks (each reports ratios measured in one run).
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
    /// The main job: transport and SVM benchmarks side by side.
    Demo {
        /// Daemon to use: a Unix socket path, tcp:HOST:PORT (token from $VIRTSOC_TOKEN) or vm;
        /// default: start one.
        #[arg(long)]
        socket: Option<String>,
        /// Frames per protocol.
        #[arg(long, default_value_t = 120)]
        frames: usize,
    },
    /// Runs an application scenario (uhd-video, video-360, camera, ar, livestream) through
    /// real devices.
    Run(RunArgs),
    /// A guest that only burns CPU until killed (`bench sharing`'s CPU hogs, run as processes
    /// of their own so the daemon can weigh them).
    #[command(hide = true)]
    CpuHog {
        #[arg(long)]
        socket: String,
        #[arg(long)]
        name: String,
    },
    /// Draws charts (PNG and SVG) from `virtsoc run --json` results.
    Report {
        results: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// Lists the daemon's devices with their backends and commands.
    Devices {
        #[arg(long)]
        socket: Option<String>,
        #[arg(long)]
        json: bool,
        /// Print the C header with one stub per device command (generated from the
        /// declarations) instead.
        #[arg(long)]
        c_header: bool,
    },
    /// The daemon's console (control API): guests, devices, SMS, calls, signal, foreground,
    /// camera source, metrics. `virtsoc ctl` alone lists the commands.
    Ctl {
        /// Control socket (default /tmp/virtsoc.sock.control), or tcp:HOST:PORT.
        #[arg(long)]
        socket: Option<String>,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Snapshots of guest sessions through the daemon's control API: `save GUEST FILE`,
    /// `load FILE --guest GUEST`.
    Snapshot {
        #[command(subcommand)]
        which: snapshot::SnapshotCmd,
    },
    /// Live migration of guest GUEST to the daemon whose `--migrate-listen` is HOST:PORT
    /// (that daemon's token in $VIRTSOC_TOKEN); the guest library follows by itself.
    Migrate {
        guest: u64,
        /// tcp:HOST:PORT of the target's migration listener.
        #[arg(long)]
        to: String,
        /// The guest's daemon's control socket (default /tmp/virtsoc.sock.control).
        #[arg(long)]
        socket: Option<String>,
    },
    /// A live table of the daemon's guests: device time per device, queues, memory, copies,
    /// frames (control API).
    Top {
        /// Control socket (default /tmp/virtsoc.sock.control; a guest socket is accepted), or
        /// tcp:HOST:PORT.
        #[arg(long)]
        socket: Option<String>,
        /// One snapshot as JSON instead of the refreshing table.
        #[arg(long)]
        json: bool,
        /// Refresh interval in milliseconds.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Stop after this many refreshes.
        #[arg(long)]
        count: Option<u64>,
    },
    /// VM guests: boot a QEMU guest and run a virtsoc command inside it.
    Vm {
        #[command(subcommand)]
        which: VmCmd,
    },
    /// Soak: mixed good, hostile, crashing and reconnecting guests against a daemon of its
    /// own; checks its memory, descriptors and threads afterwards.
    Soak(soak::SoakArgs),
    /// Runs a scenario against a daemon of its own with the live view on (prints its URL),
    /// until Ctrl-C; `--measure SECONDS` measures the view's cost with a headless viewer.
    Watch(watch::WatchArgs),
    /// OpenGL ES through virtsoc: `vendor-json` (the glvnd vendor JSON of
    /// libEGL_virtsoc.so), `validate` (glmark2's checks natively and through virtsoc).
    Gles {
        #[command(subcommand)]
        which: bench_gles::GlesCmd,
    },
    /// Tools for tests.
    #[command(hide = true)]
    Debug {
        #[command(subcommand)]
        which: DebugCmd,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum BenchCmd {
    /// Unmodified glmark2-es2 natively, through virtsoc and through virgl, round by round:
    /// FPS per scene, scores, CPU, the virtsoc path's round trips and copies per frame.
    Gles(bench_gles::BenchGlesArgs),
    /// Per-frame cost of the real devices through the daemon: decode, ISP, GPU composition.
    Devices {
        #[arg(long)]
        socket: Option<String>,
        /// Sizes to measure (360p, 720p, 1080p, uhd).
        #[arg(long, value_delimiter = ',', default_value = "1080p,uhd")]
        resolution: Vec<String>,
        /// Frames per measurement.
        #[arg(long, default_value_t = 90)]
        frames: usize,
        /// Rounds of each decode measurement, through the daemon and natively in turn: the
        /// ratio is the median of the rounds' ratios, each round's printed.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// The player brackets each command with a begin_access and an end_access request
        /// per region, as before commands took their own accesses (`DeviceCmdAccess`): 3
        /// requests a command instead of 1, for comparison.
        #[arg(long)]
        separate_accesses: bool,
        #[arg(long)]
        json: bool,
    },
    /// Snapshot/restore of 256 MiB of regions and a live migration under a 60 fps writer
    /// between two daemons of its own: times, sizes, downtime, dropped frames, integrity.
    Migrate {
        #[arg(long)]
        json: bool,
    },
    /// Sharing the GPU between guests: unfairness per 1 s window and throughput overhead of
    /// each scheduler with 2, 4 and 8 guests of different per-command cost.
    Sharing(SharingArgs),
    /// A victim guest's SVM access p50 and camera fps alone and next to each kind of hostile
    /// guest (issue 10), in a daemon of its own; check: within 20% of alone.
    Isolation {
        /// Seconds of the victim's camera scenario per row.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Frames of the victim's SVM pipeline per row.
        #[arg(long, default_value_t = 300)]
        frames: usize,
        /// Hostile kinds to run (default all).
        #[arg(long, value_delimiter = ',')]
        hostile: Vec<String>,
        /// Picture size of the `slow-decoder` hostile guest's realistic clip and of the
        /// `slow-encoder`'s pictures (360p, 720p, 1080p, uhd).
        #[arg(long, default_value = "uhd")]
        slow_resolution: String,
        #[arg(long)]
        json: bool,
    },
    /// Admission under a flood: good local guests connect one after another while hostile
    /// peers keep every pre-handshake budget full (idle connections on the Unix socket and
    /// the TCP listener, reopened as they are let go): admission time p50/p99/max and the
    /// guests locked out.
    Admission {
        /// Idle connections per listener.
        #[arg(long, default_value_t = 64)]
        flood: usize,
        /// Good local guests, one after another.
        #[arg(long, default_value_t = 200)]
        guests: usize,
        #[arg(long)]
        json: bool,
    },
    /// Round-trip latency and bandwidth of the ring channel, a Unix socket and TCP loopback.
    Transport(TransportArgs),
    /// Host services (issue 29): bandwidth and round trip of a service channel beside the
    /// daemon's ring, a Unix socket and TCP loopback, with 1 to N channels at once.
    Services(ServicesArgs),
    /// The SVM microbenchmark: producer -> consumer over a ring of buffers, per protocol.
    Svm(SvmArgs),
}

#[derive(Debug, Subcommand)]
pub(crate) enum VmCmd {
    /// Boots the guest image under QEMU and runs `virtsoc ARGS...` inside it against the
    /// host daemon (use `--socket vm` in ARGS to reach it); a GLES image
    /// (`build-guest-image.sh --gles`) runs ARGS as a command (`glmark2-es2 --validate`).
    Run(VmRunArgs),
}

#[derive(Debug, Subcommand)]
pub(crate) enum DebugCmd {
    /// Allocates and fills regions, prints READY, then waits to be killed.
    Hold {
        #[arg(long)]
        socket: String,
        #[arg(long, default_value_t = 4)]
        regions: usize,
        #[arg(long, default_value_t = 1 << 20)]
        size: u64,
        /// Also opens host service channels to geo, sensor and bulk, and leaves a bulk
        /// transfer half sent (2 of its 4 packets posted, no commit).
        #[arg(long)]
        channels: bool,
    },
    /// Allocates regions and fills them from the CPU, prints READY, then for SECONDS reads
    /// them back every 100 ms (following the session by itself through daemon restarts and
    /// migrations) and prints JSON: checks made, bad checks, the guest ids it had. Fails if
    /// a check found other bytes.
    Keep {
        #[arg(long)]
        socket: String,
        #[arg(long, default_value_t = 3)]
        regions: usize,
        #[arg(long, default_value_t = 1 << 18)]
        size: u64,
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
        /// Also call the bulk and location services each round, over channels that follow
        /// the session.
        #[arg(long)]
        services: bool,
    },
    /// Calls each host service (geo, sensor, clipboard, bulk) over channels of its own and
    /// prints what it got as JSON (the VM test runs it inside a VM).
    Services {
        #[arg(long)]
        socket: String,
        /// Text the guest puts on the clipboard.
        #[arg(long, default_value = "from the guest")]
        clipboard: String,
        /// Bytes of the bulk transfer (in 64 KiB packets).
        #[arg(long, default_value_t = 1 << 20)]
        size: u64,
    },
}

/// `virtsoc run`: a scenario, its size and rate, how it is measured and saved.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    pub(crate) scenario: String,
    #[arg(long)]
    pub(crate) socket: Option<String>,
    #[arg(long, default_value = "prefetch")]
    pub(crate) protocol: String,
    #[arg(long, value_enum, default_value = "fence")]
    pub(crate) ordering: bench_svm::OrderingMode,
    #[arg(long, default_value_t = 5.0)]
    pub(crate) seconds: f64,
    /// 360p, 720p, 1080p or uhd (default: uhd for uhd-video, else 1080p).
    #[arg(long)]
    pub(crate) resolution: Option<String>,
    /// Frame rate (default: 60 for uhd-video, else 30).
    #[arg(long)]
    pub(crate) fps: Option<u32>,
    /// How layers reach the screen: display planes where the display can show them (the
    /// GPU composes the rest), or always the GPU.
    #[arg(long, value_enum, default_value = "planes")]
    pub(crate) composition: scenario::show::Composition,
    /// When frames start: aligned to land just before a vsync (vsync), or on the
    /// scenario's own clock (free).
    #[arg(long, value_enum, default_value = "vsync")]
    pub(crate) pacing: scenario::Pacing,
    /// Run every protocol x ordering combination and print a table.
    #[arg(long)]
    pub(crate) compare: bool,
    /// Run every mode this many times, interleaved (round 1: every mode, round 2: every
    /// mode, ...), each run on a fresh daemon; rows hold the medians.
    #[arg(long, default_value_t = 1)]
    pub(crate) rounds: usize,
    /// The video scenarios' clip: cheap (ultrafast, no CABAC/deblocking/B-frames) or
    /// realistic (preset medium, high bitrate, noise). Default: realistic for uhd-video.
    #[arg(long, value_enum)]
    pub(crate) clip: Option<scenario::media::Clip>,
    /// gles-video and gles-camera with fence ordering: frames drawn but not finished by the
    /// GL that the guest queues before it waits for the oldest (0: it waits for each).
    #[arg(long, default_value_t = scenario::gles_video::IN_FLIGHT)]
    pub(crate) in_flight: usize,
    /// gles-video and gles-camera with atomic ordering: finish every stage of every frame
    /// (a fence sync the guest waits on) and report each stage's p50: where each
    /// millisecond goes. Slower than the stages overlapped.
    #[arg(long)]
    pub(crate) breakdown: bool,
    /// What consumes presented frames in the daemon started for the run: crc (every byte
    /// of every plane read once per scanned-out frame) or none.
    #[arg(long, default_value = "crc", value_parser = ["crc", "none"])]
    pub(crate) display_sink: String,
    #[arg(long)]
    pub(crate) json: bool,
    /// Also write the results as JSON to this file (for `virtsoc report`).
    #[arg(long)]
    pub(crate) save: Option<PathBuf>,
}

/// `virtsoc bench sharing`: schedulers, guest and hog counts, chart.
#[derive(Debug, clap::Args)]
pub(crate) struct SharingArgs {
    /// Seconds measured per configuration.
    #[arg(long, default_value_t = 5)]
    pub(crate) seconds: u64,
    /// Guest counts.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    pub(crate) guests: Vec<usize>,
    /// Schedulers to compare.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "round-robin,wfq,fixed-rate,aimd"
    )]
    pub(crate) scheduler: Vec<virtsoc_sched::Kind>,
    /// Hog counts of the multimedia part (0 to skip it).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub(crate) hogs: Vec<usize>,
    /// What the multimedia guest competes with: `gpu` (composition loops), `cpu`
    /// (spinning processes), `gles` (unmodified glmark2-es2 instances through virtsoc,
    /// against a GLES video guest; needs glmark2-es2 and Xvfb), any of them.
    #[arg(long, value_delimiter = ',', default_value = "gpu,cpu")]
    pub(crate) hog_kind: Vec<String>,
    /// Skip the two-guests-together part.
    #[arg(long)]
    pub(crate) no_together: bool,
    /// Skip the fairness part on the codec.
    #[arg(long)]
    pub(crate) no_codec: bool,
    /// Skip the fairness part on the GPU.
    #[arg(long)]
    pub(crate) no_gpu: bool,
    /// Rounds of (each size alone, the guests together) per GPU guest count: the
    /// overhead is their median.
    #[arg(long, default_value_t = 3)]
    pub(crate) repeats: usize,
    /// The GPU fairness guests' three composition sizes (WxH,WxH,WxH).
    #[arg(long, value_delimiter = ',', default_value = "320x180,640x360,960x540")]
    pub(crate) gpu_sizes: Vec<String>,
    /// The codec fairness guests' three clip sizes (WxH,WxH,WxH; one size three times is
    /// the control: no weighing of one size's work against another's).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "640x360,1280x720,1920x1080"
    )]
    pub(crate) codec_sizes: Vec<String>,
    /// The threads of each codec fairness guest's decoder (libavcodec's frame threads).
    #[arg(long, default_value_t = 1)]
    pub(crate) codec_threads: u32,
    /// Where to write the chart (SVG): unfairness per scheduler and guest count, the
    /// video guest's % of DFR against the hogs.
    #[arg(long, default_value = "sharing.svg")]
    pub(crate) chart: PathBuf,
    #[arg(long)]
    pub(crate) json: bool,
}

/// `virtsoc bench transport`: channels, sizes, repetitions.
#[derive(Debug, clap::Args)]
pub(crate) struct TransportArgs {
    /// Daemon to use: a Unix socket path, tcp:HOST:PORT (token from $VIRTSOC_TOKEN) or vm;
    /// default: start one.
    #[arg(long)]
    pub(crate) socket: Option<String>,
    #[arg(long, default_value_t = 5000)]
    pub(crate) round_trips: usize,
    #[arg(long, default_value_t = 16_588_800)]
    pub(crate) size: u64,
    #[arg(long, default_value_t = 20)]
    pub(crate) reps: usize,
    /// Rounds: every channel measured once per round, the channels in turn, and each row
    /// the median of its rounds (the remote / TCP ratios printed per round).
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Channels to measure: ring (this guest's shared rings), remote (virtsoc over TCP),
    /// unix, tcp (plain sockets).
    #[arg(long, value_delimiter = ',', default_value = "ring,remote,unix,tcp")]
    pub(crate) channels: Vec<String>,
    /// Also measure a VM guest's ring (ivshmem + virtio-serial) by booting this image.
    #[arg(long)]
    pub(crate) vm_image: Option<PathBuf>,
    #[arg(long)]
    pub(crate) json: bool,
}

/// `virtsoc bench services`: channels, sizes, the soak, chart.
#[derive(Debug, clap::Args)]
pub(crate) struct ServicesArgs {
    /// Daemon to use (a Unix socket path, or vm inside a VM guest); default: start one.
    #[arg(long)]
    pub(crate) socket: Option<String>,
    /// Most channels at once (rows for 1..=N).
    #[arg(long, default_value_t = 4)]
    pub(crate) channels: u32,
    #[arg(long, default_value_t = 2000)]
    pub(crate) round_trips: usize,
    #[arg(long, default_value_t = 16 << 20)]
    pub(crate) size: u64,
    /// Transfers timed per channel, each round.
    #[arg(long, default_value_t = 40)]
    pub(crate) reps: usize,
    /// Rounds of the whole comparison (every kind at every channel count once a round): rows
    /// report the median, the ratios the median of the rounds' ratios with their range.
    #[arg(long, default_value_t = 5)]
    pub(crate) rounds: usize,
    /// Instead of the comparison: a soak of this many seconds, `--guests` guests with
    /// `--channels` channels each sending payloads of random sizes up to `--size`
    /// (streamed in 64 KiB packets or in a region read in place, at random), every one
    /// checked, the daemon's RSS before and after.
    #[arg(long)]
    pub(crate) soak: Option<f64>,
    #[arg(long, default_value_t = 16)]
    pub(crate) guests: u32,
    #[arg(long)]
    pub(crate) json: bool,
    /// Also draw the comparison's bandwidths and round trips as an SVG chart here.
    #[arg(long)]
    pub(crate) chart: Option<std::path::PathBuf>,
    /// Also boot a VM guest from this image (`scripts/build-guest-image.sh`; TCG) that
    /// runs the comparison with one channel: its rows (`"guest": "vm"`: the service and the
    /// ring) come after the process guest's.
    #[arg(long)]
    pub(crate) vm_image: Option<std::path::PathBuf>,
}

/// `virtsoc bench svm`: protocols, orderings, the pipeline's shape, a trace to replay.
#[derive(Debug, clap::Args)]
pub(crate) struct SvmArgs {
    /// Daemon to use: a Unix socket path, tcp:HOST:PORT (token from $VIRTSOC_TOKEN) or vm;
    /// default: start one.
    #[arg(long)]
    pub(crate) socket: Option<String>,
    /// Comma-separated coherence protocols.
    #[arg(
        long,
        default_value = "guest-staging,write-invalidate,prefetch",
        value_delimiter = ','
    )]
    pub(crate) protocol: Vec<String>,
    /// Comma-separated ordering modes: fence, atomic.
    #[arg(long, default_value = "atomic", value_delimiter = ',')]
    pub(crate) ordering: Vec<bench_svm::OrderingMode>,
    /// How the slack varies from frame to frame.
    #[arg(long, value_enum, default_value = "fixed")]
    pub(crate) slack_pattern: bench_svm::SlackPattern,
    /// Readers per flow (1: consumer; 2: consumer and consumer2).
    #[arg(long, default_value_t = 1)]
    pub(crate) readers: usize,
    /// Switch to a new pipeline (freshly allocated ring) every N frames.
    #[arg(long)]
    pub(crate) switch_every: Option<usize>,
    /// The first reader: the checksum test device, or the GPU (RGBA frames 3840 wide
    /// whose GPU replica is a texture: a read is an upload).
    #[arg(long, value_enum, default_value = "checksum")]
    pub(crate) consumer: bench_svm::Consumer,
    /// Replay a recorded access trace instead of the synthetic pipeline (format: see
    /// `crates/cli/src/trace.rs`).
    #[arg(long)]
    pub(crate) trace: Option<PathBuf>,
    /// Bytes per frame (default: one 3840x2160 frame at 2 bytes per pixel).
    #[arg(long, default_value_t = 16_588_800)]
    pub(crate) size: u64,
    /// Slack interval between the write and the read, in milliseconds.
    #[arg(long, default_value_t = 17.0)]
    pub(crate) slack_ms: f64,
    #[arg(long, default_value_t = 200)]
    pub(crate) frames: usize,
    /// Buffers in the ring.
    #[arg(long, default_value_t = 4)]
    pub(crate) buffers: usize,
    /// Unmeasured frames first (lazy allocation, page faults).
    #[arg(long, default_value_t = 8)]
    pub(crate) warmup: usize,
    #[arg(long)]
    pub(crate) json: bool,
}

/// `virtsoc vm run`: the image, the daemon's endpoint, the VM's size and the guest command.
#[derive(Debug, clap::Args)]
pub(crate) struct VmRunArgs {
    /// Directory made by scripts/build-guest-image.sh.
    #[arg(long)]
    pub(crate) image: PathBuf,
    /// Memory file of a running daemon's VM endpoint (with --doorbell); default: start a
    /// daemon for this run.
    #[arg(long, requires = "doorbell")]
    pub(crate) shm: Option<PathBuf>,
    /// Doorbell socket of that endpoint.
    #[arg(long, requires = "shm")]
    pub(crate) doorbell: Option<PathBuf>,
    /// Window size in MiB (must match the endpoint's).
    #[arg(long, default_value_t = 64)]
    pub(crate) window_mib: u64,
    /// tcg (works everywhere) or kvm (where the host supports it).
    #[arg(long, default_value = "tcg")]
    pub(crate) accel: String,
    #[arg(long, default_value_t = 512)]
    pub(crate) memory_mib: u32,
    /// Give up (and kill QEMU) after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub(crate) timeout: u64,
    /// The command to run inside the guest.
    #[arg(last = true, required = true)]
    pub(crate) args: Vec<String>,
}
