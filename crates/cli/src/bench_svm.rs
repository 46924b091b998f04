//! `virtsoc bench svm`: the SVM microbenchmark (vSoC section 5.2, Table 2).
//!
//! A guest (this process) drives producer -> consumer(s) over a ring of buffers with a slack
//! interval between the write and the read, once per (coherence protocol, ordering mode), all
//! against one daemon, so the numbers compare within one run. Every frame is verified: each
//! consumer's checksum must equal the producer's.
//!
//! Ordering modes (vSoC 3.4): `atomic` waits for every device command before handing the
//! buffer on (and blocks for the prefetch compensation); `fence` queues the write, a signal,
//! and on the reader's queue a wait, the read and its checksum, without waiting in between.

use std::time::{Duration, Instant};

use serde::Serialize;
use virtsoc_guest::{
    testdev, AccessMode, ConnectOptions, Connection, Counters, DeviceId, Opcode, RegionId,
};

use crate::stats::{machine_memcpy_ms, machine_memcpy_written_ms, MeanP50, P50P99};
use crate::CliError;

/// How the guest orders the writer's and the readers' work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum OrderingMode {
    /// The guest waits for each command (the baseline of today's emulators).
    Atomic,
    /// Virtual command fences order the devices; the guest never waits in between.
    Fence,
}

/// How the slack between the write and the read varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SlackPattern {
    /// Always the given slack.
    Fixed,
    /// Uniform in [0.7, 1.3] x slack.
    Jittered,
    /// Half the frames 0.5 x slack, half 1.5 x slack (buffered and v-synced pipelines).
    Bimodal,
}

/// Workload parameters.
#[derive(Debug, Clone)]
pub struct SvmBenchParams {
    pub protocols: Vec<String>,
    pub orderings: Vec<OrderingMode>,
    pub size: u64,
    pub slack: Duration,
    pub pattern: SlackPattern,
    pub frames: usize,
    pub buffers: usize,
    pub warmup: usize,
    /// Readers per flow: 1 (consumer) or 2 (consumer and consumer2).
    pub readers: usize,
    /// Switch to a freshly allocated ring every N frames (a new pipeline).
    pub switch_every: Option<usize>,
    /// The first reader: the checksum test device, or the GPU (an image region then, so
    /// that the GPU's replica is in its own memory and a read is an upload).
    pub consumer: Consumer,
}

/// The device that reads each frame first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Consumer {
    /// The checksum test device (host memory of its own).
    Checksum,
    /// The GPU: the frame is an RGBA image, its GPU replica a texture.
    Gpu,
}

/// Width of the RGBA frames the GPU consumer reads (the height follows from the size).
const GPU_FRAME_WIDTH: u64 = 3840;

/// Results of one (protocol, ordering).
#[derive(Debug, Clone, Serialize)]
pub struct ProtocolResult {
    pub protocol: String,
    pub ordering: OrderingMode,
    /// Host-side duration of the readers' begin_access, in microseconds.
    pub access_latency_us: P50P99,
    /// Host copy time per frame for coherence (asynchronous prefetches included), ms.
    pub coherence_ms: MeanP50,
    /// Useful bytes (frame size x readers x frames) over wall time.
    pub throughput_gbps: f64,
    pub copies_per_frame: f64,
    /// Reads by a predicted device / reads scored (prefetch only).
    pub prediction_accuracy: Option<f64>,
    /// Compensation the writer was asked to block for, mean per frame, ms.
    pub compensation_ms: MeanP50,
    /// Prediction bookkeeping time over wall time, percent.
    pub cpu_overhead_pct: f64,
    /// Bytes held by the SVM bookkeeping (twin hypergraphs and region table).
    pub svm_metadata_bytes: u64,
    pub sync_fetches: u64,
    pub inflight_waits: u64,
    /// Wall time per frame, ms (slack included).
    pub frame_ms: f64,
    pub frames: usize,
    /// Reads whose checksum differed from the write's (must be 0).
    pub corrupt_frames: usize,
    /// Largest host queue depth seen by the guest.
    pub max_queue_depth: u32,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct SvmBenchReport {
    pub size: u64,
    pub slack_ms: f64,
    pub slack_pattern: SlackPattern,
    pub buffers: usize,
    pub readers: usize,
    pub switch_every: Option<usize>,
    pub consumer: Consumer,
    /// Median memcpy of one frame streaming through memory (cold source).
    pub machine_memcpy_ms: f64,
    /// The same with the source written just before, as a device's output is when the SVM
    /// copies it after the write: the floor the coherence copies compare with.
    pub machine_memcpy_written_ms: f64,
    /// With `--consumer gpu`: median upload of one frame into a GPU image, from a source
    /// written just before, measured in this process on the same kind of device (wgpu picks
    /// the same adapter as the daemon's): the floor of a coherence copy into GPU memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_upload_ms: Option<f64>,
    pub protocols: Vec<ProtocolResult>,
}

/// Small deterministic generator for slack patterns (no global state).
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The slack of frame `i`.
pub fn slack_for(p: SlackPattern, base: Duration, i: usize, rng: &mut SplitMix) -> Duration {
    match p {
        SlackPattern::Fixed => base,
        SlackPattern::Jittered => base.mul_f64(0.7 + 0.6 * rng.next_f64()),
        SlackPattern::Bimodal => base.mul_f64(if i.is_multiple_of(2) { 0.5 } else { 1.5 }),
    }
}

/// Runs the benchmark for every protocol and ordering against the daemon at `socket`.
pub fn run(socket: &str, p: &SvmBenchParams) -> Result<SvmBenchReport, CliError> {
    if p.frames == 0 || p.buffers == 0 || p.size == 0 {
        return Err(CliError::Usage(
            "frames, buffers and size must be positive".into(),
        ));
    }
    if !(1..=2).contains(&p.readers) {
        return Err(CliError::Usage("--readers must be 1 or 2".into()));
    }
    if p.switch_every == Some(0) {
        return Err(CliError::Usage("--switch-every must be positive".into()));
    }
    if p.consumer == Consumer::Gpu
        && (!p.size.is_multiple_of(GPU_FRAME_WIDTH * 4) || p.size < GPU_FRAME_WIDTH * 4)
    {
        return Err(CliError::Usage(format!(
            "--consumer gpu reads RGBA frames {GPU_FRAME_WIDTH} pixels wide: --size must be a multiple of {}",
            GPU_FRAME_WIDTH * 4
        )));
    }
    let mut results = Vec::new();
    for proto in &p.protocols {
        for &ordering in &p.orderings {
            results.push(run_one(socket, proto, ordering, p)?);
        }
    }
    Ok(SvmBenchReport {
        size: p.size,
        slack_ms: p.slack.as_secs_f64() * 1e3,
        slack_pattern: p.pattern,
        buffers: p.buffers,
        readers: p.readers,
        switch_every: p.switch_every,
        consumer: p.consumer,
        machine_memcpy_ms: machine_memcpy_ms(p.size as usize, 20),
        machine_memcpy_written_ms: machine_memcpy_written_ms(p.size as usize, 20),
        gpu_upload_ms: (p.consumer == Consumer::Gpu)
            .then(|| gpu_upload_ms(p.size, p.buffers, 20))
            .flatten(),
        protocols: results,
    })
}

/// Median time of one upload (`write_image`) of an RGBA frame of `size` bytes into a GPU
/// image, over a ring of `buffers` images as the benchmark's frames rotate (on lavapipe an
/// upload into the image written last costs a fraction of one into another), the source
/// written just before each and the previous upload finished; `None` without a GPU adapter.
fn gpu_upload_ms(size: u64, buffers: usize, reps: usize) -> Option<f64> {
    use virtsoc_gpu::{FrameLayout, PixelFormat, WgpuBackend};
    let b = WgpuBackend::new()
        .map_err(|e| log::warn!("bench svm: no GPU to measure an upload on: {e}"))
        .ok()?;
    let layout = FrameLayout::packed(
        PixelFormat::Rgba8,
        GPU_FRAME_WIDTH as u32,
        (size / (GPU_FRAME_WIDTH * 4)) as u32,
    )
    .ok()?;
    let imgs = (0..buffers.max(1))
        .map(|_| b.create_image(layout).ok())
        .collect::<Option<Vec<_>>>()?;
    let mut src = vec![0u8; size as usize];
    let mut times = Vec::with_capacity(reps);
    for r in 0..reps + 2 * imgs.len() {
        src.fill(r as u8); // the producer's write, not timed
        let t0 = Instant::now();
        b.write_image(&imgs[r % imgs.len()], 0, &src).ok()?;
        if r >= 2 * imgs.len() {
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        // Let the upload finish before the next one, as the pipeline's frames do.
        b.wait_submission(b.last_submission()).ok()?;
    }
    Some(crate::stats::percentile(&times, 50.0))
}

/// Per-frame measurements.
struct FrameOut {
    corrupt: usize,
    /// Host-side begin_access durations of the readers.
    reader_latency: Vec<Duration>,
    compensation: Duration,
}

fn readers(p: &SvmBenchParams) -> Vec<DeviceId> {
    let first = match p.consumer {
        Consumer::Checksum => DeviceId::CONSUMER,
        Consumer::Gpu => virtsoc_guest::devices::gpu::ID,
    };
    [first, DeviceId::CONSUMER2][..p.readers].to_vec()
}

/// The command a reader runs on the frame: a checksum, or nothing for the GPU (the access is
/// what is measured; the second reader checks the bytes).
fn read_cmd(dev: DeviceId, id: RegionId) -> Option<[u64; 6]> {
    let id = u64::from(id);
    (dev != virtsoc_guest::devices::gpu::ID).then_some([testdev::CHECKSUM, id, 0, 0, 0, 0])
}

fn alloc_ring(conn: &Connection, p: &SvmBenchParams) -> Result<Vec<RegionId>, CliError> {
    (0..p.buffers)
        .map(|_| {
            match p.consumer {
                Consumer::Checksum => conn.alloc_blob(p.size),
                Consumer::Gpu => conn.alloc(
                    0,
                    GPU_FRAME_WIDTH as u32,
                    (p.size / (GPU_FRAME_WIDTH * 4)) as u32,
                    virtsoc_guest::Format::Rgba8,
                    0,
                ),
            }
            .map(|r| r.id)
            .map_err(Into::into)
        })
        .collect()
}

fn run_one(
    socket: &str,
    proto: &str,
    ordering: OrderingMode,
    p: &SvmBenchParams,
) -> Result<ProtocolResult, CliError> {
    let ring_bytes = p.size.saturating_mul(p.buffers as u64);
    let opts = ConnectOptions {
        name: format!("bench-svm-{proto}-{ordering:?}"),
        coherence: Some(proto.to_string()),
        // guest-staging keeps a window replica of every buffer (twice when switching rings).
        window_size: 2 * ring_bytes + (64 << 20),
        ..ConnectOptions::default()
    };
    let conn = Connection::open(socket, &opts)?;
    let mut ring = alloc_ring(&conn, p)?;
    let mut rng = SplitMix(0x5eed);
    let mut latency_us = Vec::new();
    let mut compensation_ms = Vec::new();
    let mut coherence_ms = Vec::new();
    let mut corrupt = 0;
    let mut before = Counters::default();
    let mut last = Counters::default();
    let mut t_start = Instant::now();
    let mut measured_frames = 0;
    for i in 0..p.warmup + p.frames {
        if i == p.warmup {
            before = conn.counters()?;
            last = before;
            t_start = Instant::now();
        }
        if let Some(n) = p.switch_every {
            if i > 0 && i % n == 0 {
                // Queued device work may still name the old ring.
                conn.drain()?;
                for id in ring.drain(..) {
                    conn.free(id)?;
                }
                ring = alloc_ring(&conn, p)?;
            }
        }
        let id = ring[i % ring.len()];
        let slack = slack_for(p.pattern, p.slack, i, &mut rng);
        let out = match ordering {
            OrderingMode::Atomic => frame_atomic(&conn, id, p, i as u64, slack)?,
            OrderingMode::Fence => frame_fence(&conn, id, p, i as u64, slack)?,
        };
        if i >= p.warmup {
            // Copies of this frame (asynchronous ones finished before its reads completed).
            let now = conn.counters()?;
            coherence_ms.push(now.since(&last).copy_ns as f64 / 1e6);
            last = now;
            measured_frames += 1;
            latency_us.extend(out.reader_latency.iter().map(|d| d.as_secs_f64() * 1e6));
            compensation_ms.push(out.compensation.as_secs_f64() * 1e3);
            corrupt += out.corrupt;
        }
    }
    let wall = t_start.elapsed();
    conn.drain()?;
    let after = conn.counters()?;
    for id in ring {
        conn.free(id)?;
    }
    if let Some((seq, st)) = conn.take_async_errors().first() {
        return Err(CliError::Usage(format!(
            "{proto}/{ordering:?}: request {seq} failed: {}",
            st.message()
        )));
    }
    let d = after.since(&before);
    let frames = measured_frames as f64;
    let scored = d.hits + d.misses;
    Ok(ProtocolResult {
        protocol: proto.to_string(),
        ordering,
        access_latency_us: P50P99::of(&latency_us),
        coherence_ms: MeanP50::of(&coherence_ms),
        throughput_gbps: (p.size as f64 * p.readers as f64 * frames) / wall.as_secs_f64() / 1e9,
        copies_per_frame: d.copies as f64 / frames,
        prediction_accuracy: (scored > 0).then(|| d.hits as f64 / scored as f64),
        compensation_ms: MeanP50::of(&compensation_ms),
        cpu_overhead_pct: d.bookkeeping_ns as f64 / wall.as_nanos() as f64 * 100.0,
        svm_metadata_bytes: after.metadata_bytes,
        sync_fetches: d.sync_fetches,
        inflight_waits: d.inflight_waits,
        frame_ms: wall.as_secs_f64() * 1e3 / frames,
        frames: measured_frames,
        corrupt_frames: corrupt,
        max_queue_depth: conn.max_queue_depth(),
    })
}

/// Atomic ordering: every call waits for its completion.
fn frame_atomic(
    conn: &Connection,
    id: RegionId,
    p: &SvmBenchParams,
    seed: u64,
    slack: Duration,
) -> Result<FrameOut, CliError> {
    let (w, r, size) = (AccessMode::Write, AccessMode::Read, p.size);
    conn.begin_access(id, DeviceId::PRODUCER, 0, size, w)?;
    let crc_w = conn.device_cmd(
        DeviceId::PRODUCER,
        [testdev::WRITE_PATTERN, u64::from(id), seed, 0, 0, 0],
    )?[0];
    let e = conn.end_access(id, DeviceId::PRODUCER, 0, size, w)?;
    sleep(slack);
    let mut out = FrameOut {
        corrupt: 0,
        reader_latency: Vec::new(),
        compensation: e.compensation,
    };
    for dev in readers(p) {
        let b = conn.begin_access(id, dev, 0, size, r)?;
        out.reader_latency.push(b.host_elapsed);
        if let Some(cmd) = read_cmd(dev, id) {
            let crc_r = conn.device_cmd(dev, cmd)?[0];
            out.corrupt += usize::from(crc_r != crc_w);
        }
        conn.end_access(id, dev, 0, size, r)?;
    }
    Ok(out)
}

/// Fence ordering: the write, a signal, and each reader's wait/read/checksum are queued; the
/// guest waits only at the end, to verify the checksums.
fn frame_fence(
    conn: &Connection,
    id: RegionId,
    p: &SvmBenchParams,
    seed: u64,
    slack: Duration,
) -> Result<FrameOut, CliError> {
    let (w, r, size) = (AccessMode::Write as u64, AccessMode::Read as u64, p.size);
    // The queued requests are built as words here.
    let (region, id) = (id, u64::from(id));
    let f = conn.fence_create()?;
    conn.submit_detached(
        Opcode::BeginAccess,
        DeviceId::PRODUCER,
        [id, 0, size, w, 0, 0],
    )?;
    let s_write = conn.submit(
        Opcode::DeviceCmd,
        DeviceId::PRODUCER,
        [testdev::WRITE_PATTERN, id, seed, 0, 0, 0],
    )?;
    let s_end = conn.submit(
        Opcode::EndAccess,
        DeviceId::PRODUCER,
        [id, 0, size, w, 0, 0],
    )?;
    conn.fence_signal(DeviceId::PRODUCER, f)?;
    sleep(slack);
    let mut pending = Vec::new();
    for dev in readers(p) {
        conn.fence_wait(dev, f)?;
        let s_b = conn.submit(Opcode::BeginAccess, dev, [id, 0, size, r, 0, 0])?;
        let s_c = read_cmd(dev, region)
            .map(|cmd| conn.submit(Opcode::DeviceCmd, dev, cmd))
            .transpose()?;
        conn.submit_detached(Opcode::EndAccess, dev, [id, 0, size, r, 0, 0])?;
        pending.push((s_b, s_c));
    }
    conn.fence_release(f)?;
    let ok = |seq| -> Result<[u64; 6], CliError> {
        let c = conn.wait(seq)?;
        if c.status != 0 {
            return Err(CliError::Usage(format!(
                "request {seq} failed with status {}",
                c.status
            )));
        }
        Ok(c.values)
    };
    let crc_w = ok(s_write)?[0];
    let comp = Duration::from_nanos(ok(s_end)?[3]);
    let mut out = FrameOut {
        corrupt: 0,
        reader_latency: Vec::new(),
        compensation: comp,
    };
    for (s_b, s_c) in pending {
        out.reader_latency.push(Duration::from_nanos(ok(s_b)?[4]));
        if let Some(s_c) = s_c {
            out.corrupt += usize::from(ok(s_c)?[0] != crc_w);
        }
    }
    Ok(out)
}

fn sleep(d: Duration) {
    if !d.is_zero() {
        std::thread::sleep(d);
    }
}

/// Prints the report as a table.
pub fn print_table(r: &SvmBenchReport) {
    println!(
        "SVM microbenchmark: {} bytes per frame, slack {:.1} ms ({:?}), {} buffers, {} reader(s) ({:?} first){}; machine memcpy {:.3} ms cold, {:.3} ms right after the source was written",
        r.size,
        r.slack_ms,
        r.slack_pattern,
        r.buffers,
        r.readers,
        r.consumer,
        r.switch_every.map(|n| format!(", new ring every {n} frames")).unwrap_or_default(),
        r.machine_memcpy_ms,
        r.machine_memcpy_written_ms
    );
    if let Some(u) = r.gpu_upload_ms {
        println!(
            "one upload of the frame into a GPU image ({} rotating, source just written): {u:.3} ms",
            r.buffers
        );
    }
    println!(
        "{:<17} {:<6} {:>9} {:>9} {:>8} {:>7} {:>6} {:>7} {:>7} {:>6} {:>8} {:>7}",
        "protocol",
        "order",
        "acc p50us",
        "acc p99us",
        "coh ms",
        "GB/s",
        "copies",
        "predict",
        "comp ms",
        "cpu %",
        "meta KiB",
        "corrupt"
    );
    for p in &r.protocols {
        println!(
            "{:<17} {:<6} {:>9.1} {:>9.1} {:>8.3} {:>7.3} {:>6.2} {:>7} {:>7.3} {:>6.3} {:>8.1} {:>7}",
            p.protocol,
            format!("{:?}", p.ordering).to_lowercase(),
            p.access_latency_us.p50,
            p.access_latency_us.p99,
            p.coherence_ms.mean,
            p.throughput_gbps,
            p.copies_per_frame,
            p.prediction_accuracy
                .map(|a| format!("{:.1}%", a * 100.0))
                .unwrap_or_else(|| "-".into()),
            p.compensation_ms.mean,
            p.cpu_overhead_pct,
            p.svm_metadata_bytes as f64 / 1024.0,
            p.corrupt_frames
        );
    }
}
