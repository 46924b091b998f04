//! `virtsoc bench svm`: the SVM microbenchmark (vSoC Table 2).
//!
//! A guest (this process) drives producer -> consumer over a ring of buffers with a slack
//! interval between the write and the read, once per coherence protocol, against one daemon.
//! Every frame is verified: the consumer's checksum must equal the producer's.

use std::time::{Duration, Instant};

use serde::Serialize;
use virtsoc_guest::{testdev, AccessMode, ConnectOptions, Connection, DeviceId};

use crate::stats::{machine_memcpy_ms, MeanP50, P50P99};
use crate::CliError;

/// Workload parameters.
#[derive(Debug, Clone)]
pub struct SvmBenchParams {
    pub protocols: Vec<String>,
    pub size: u64,
    pub slack: Duration,
    pub frames: usize,
    pub buffers: usize,
    pub warmup: usize,
}

/// Results of one protocol.
#[derive(Debug, Clone, Serialize)]
pub struct ProtocolResult {
    pub protocol: String,
    /// Latency of the reader's begin_access, in microseconds.
    pub access_latency_us: P50P99,
    /// Host copy time per frame for coherence, in milliseconds.
    pub coherence_ms: MeanP50,
    /// Useful bytes (one frame size per frame) over wall time.
    pub throughput_gbps: f64,
    pub copies_per_frame: f64,
    /// Mean time the writer's library blocked for compensation, in milliseconds.
    pub compensation_ms: f64,
    pub frames: usize,
    /// Frames whose consumer checksum differed from the producer's (must be 0).
    pub corrupt_frames: usize,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct SvmBenchReport {
    pub size: u64,
    pub slack_ms: f64,
    pub buffers: usize,
    pub machine_memcpy_ms: f64,
    pub protocols: Vec<ProtocolResult>,
}

/// Runs the benchmark for every protocol against the daemon at `socket`.
pub fn run(socket: &std::path::Path, p: &SvmBenchParams) -> Result<SvmBenchReport, CliError> {
    if p.frames == 0 || p.buffers == 0 || p.size == 0 {
        return Err(CliError::Usage(
            "frames, buffers and size must be positive".into(),
        ));
    }
    let mut results = Vec::new();
    for proto in &p.protocols {
        results.push(run_one(socket, proto, p)?);
    }
    let memcpy = machine_memcpy_ms(p.size as usize, 20);
    Ok(SvmBenchReport {
        size: p.size,
        slack_ms: p.slack.as_secs_f64() * 1e3,
        buffers: p.buffers,
        machine_memcpy_ms: memcpy,
        protocols: results,
    })
}

fn run_one(
    socket: &std::path::Path,
    proto: &str,
    p: &SvmBenchParams,
) -> Result<ProtocolResult, CliError> {
    let ring_bytes = p.size.saturating_mul(p.buffers as u64);
    let opts = ConnectOptions {
        name: format!("bench-svm-{proto}"),
        coherence: Some(proto.to_string()),
        // guest-staging keeps a window replica of every buffer.
        window_size: ring_bytes + (64 << 20),
        ..ConnectOptions::default()
    };
    let conn = Connection::connect(socket, &opts)?;
    let ring: Vec<u64> = (0..p.buffers)
        .map(|_| conn.alloc_blob(p.size).map(|r| r.id))
        .collect::<Result<_, _>>()?;
    let mut latency_us = Vec::with_capacity(p.frames);
    let mut coherence_ms = Vec::with_capacity(p.frames);
    let mut copies = 0u64;
    let mut compensation = Duration::ZERO;
    let mut corrupt = 0;
    let mut t_start = Instant::now();
    for i in 0..p.warmup + p.frames {
        if i == p.warmup {
            t_start = Instant::now();
        }
        let id = ring[i % ring.len()];
        let (crc_w, crc_r, lat, coh, cp, comp) = frame(&conn, id, p.size, i as u64, p.slack)?;
        if i >= p.warmup {
            latency_us.push(lat.as_secs_f64() * 1e6);
            coherence_ms.push(coh.as_secs_f64() * 1e3);
            copies += cp as u64;
            compensation += comp;
            if crc_w != crc_r {
                corrupt += 1;
            }
        }
    }
    let wall = t_start.elapsed();
    for id in ring {
        conn.free(id)?;
    }
    Ok(ProtocolResult {
        protocol: proto.to_string(),
        access_latency_us: P50P99::of(&latency_us),
        coherence_ms: MeanP50::of(&coherence_ms),
        throughput_gbps: (p.size as f64 * p.frames as f64) / wall.as_secs_f64() / 1e9,
        copies_per_frame: copies as f64 / p.frames as f64,
        compensation_ms: compensation.as_secs_f64() * 1e3 / p.frames as f64,
        frames: p.frames,
        corrupt_frames: corrupt,
    })
}

/// One frame: producer writes, slack, consumer reads and checksums.
#[allow(clippy::type_complexity)]
fn frame(
    conn: &Connection,
    id: u64,
    size: u64,
    seed: u64,
    slack: Duration,
) -> Result<(u64, u64, Duration, Duration, u32, Duration), CliError> {
    let w = AccessMode::Write;
    let r = AccessMode::Read;
    let b = conn.begin_access(id, DeviceId::PRODUCER, 0, size, w)?;
    let crc_w = conn.device_cmd(
        DeviceId::PRODUCER,
        [testdev::WRITE_PATTERN, id, seed, 0, 0, 0],
    )?[0];
    let e = conn.end_access(id, DeviceId::PRODUCER, 0, size, w)?;
    if !slack.is_zero() {
        std::thread::sleep(slack);
    }
    let t0 = Instant::now();
    let rb = conn.begin_access(id, DeviceId::CONSUMER, 0, size, r)?;
    let lat = t0.elapsed();
    let crc_r = conn.device_cmd(DeviceId::CONSUMER, [testdev::CHECKSUM, id, 0, 0, 0, 0])?[0];
    let re = conn.end_access(id, DeviceId::CONSUMER, 0, size, r)?;
    let coherence = b.coherence + e.coherence + rb.coherence + re.coherence;
    let copies = b.copies + e.copies + rb.copies + re.copies;
    Ok((crc_w, crc_r, lat, coherence, copies, e.compensation))
}

/// Prints the report as a table.
pub fn print_table(r: &SvmBenchReport) {
    println!(
        "SVM microbenchmark: {} bytes per frame, slack {:.1} ms, {} buffers; machine memcpy {:.3} ms",
        r.size, r.slack_ms, r.buffers, r.machine_memcpy_ms
    );
    println!(
        "{:<18} {:>10} {:>10} {:>11} {:>10} {:>10} {:>8} {:>9} {:>8}",
        "protocol",
        "acc p50us",
        "acc p99us",
        "coh mean ms",
        "coh p50ms",
        "tput GB/s",
        "copies",
        "comp ms",
        "corrupt"
    );
    for p in &r.protocols {
        println!(
            "{:<18} {:>10.1} {:>10.1} {:>11.3} {:>10.3} {:>10.3} {:>8.2} {:>9.3} {:>8}",
            p.protocol,
            p.access_latency_us.p50,
            p.access_latency_us.p99,
            p.coherence_ms.mean,
            p.coherence_ms.p50,
            p.throughput_gbps,
            p.copies_per_frame,
            p.compensation_ms,
            p.corrupt_frames
        );
    }
}
