//! Replaying a recorded access trace (`virtsoc bench svm --trace FILE`).
//!
//! The format is plain text, one event per line, fields separated by whitespace; `#` starts a
//! comment:
//!
//! ```text
//! # t_ms  op     region  device     [size]
//! 0.0     alloc  1       -          16588800
//! 0.0     write  1       producer
//! 17.2    read   1       consumer
//! 17.5    read   1       consumer2
//! 90.0    free   1       -
//! ```
//!
//! - `t_ms`: when the event starts, in milliseconds from the start of the replay (events must
//!   be in time order; the replay sleeps until each one and never skips one that is late);
//! - `op`: `alloc` (needs `size`), `free`, `write`, `read`;
//! - `region`: a name local to the trace (any unsigned integer);
//! - `device`: `cpu`, `producer`, `consumer` or `consumer2` (`-` for alloc and free).
//!
//! A `write` is begin_access(W), a device write of a pattern (or a CPU fill), end_access; a
//! `read` is begin_access(R), a checksum, end_access, checked against the region's last write.
//! Real traces (from an instrumented gralloc, say) map their devices onto these four.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use virtsoc_guest::{testdev, AccessMode, ConnectOptions, Connection, DeviceId, RegionId};

use crate::bench_svm::{OrderingMode, ProtocolResult};
use crate::stats::{MeanP50, P50P99};
use crate::CliError;

/// What an event does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceOp {
    Alloc(u64),
    Free,
    Write(DeviceId),
    Read(DeviceId),
}

/// One trace event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceEvent {
    pub at: Duration,
    pub region: u64,
    pub op: TraceOp,
}

fn device(name: &str, line: usize) -> Result<DeviceId, CliError> {
    Ok(match name {
        "cpu" => DeviceId::CPU,
        "producer" => DeviceId::PRODUCER,
        "consumer" => DeviceId::CONSUMER,
        "consumer2" => DeviceId::CONSUMER2,
        other => {
            return Err(CliError::Usage(format!(
                "trace line {line}: unknown device {other:?}"
            )))
        }
    })
}

/// Parses a trace.
pub fn parse(text: &str) -> Result<Vec<TraceEvent>, CliError> {
    let mut out: Vec<TraceEvent> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = n + 1;
        let body = raw.split('#').next().unwrap_or("").trim();
        if body.is_empty() {
            continue;
        }
        let f: Vec<&str> = body.split_whitespace().collect();
        let bad = |what: &str| CliError::Usage(format!("trace line {line}: {what}: {raw:?}"));
        if f.len() < 4 {
            return Err(bad("expected t_ms op region device [size]"));
        }
        let t: f64 = f[0].parse().map_err(|_| bad("bad time"))?;
        if !(0.0..=86_400_000.0).contains(&t) {
            return Err(bad("time out of range"));
        }
        let region: u64 = f[2].parse().map_err(|_| bad("bad region"))?;
        let op = match f[1] {
            "alloc" => TraceOp::Alloc(
                f.get(4)
                    .ok_or_else(|| bad("alloc needs a size"))?
                    .parse()
                    .ok()
                    .filter(|s| *s > 0)
                    .ok_or_else(|| bad("bad size"))?,
            ),
            "free" => TraceOp::Free,
            "write" => TraceOp::Write(device(f[3], line)?),
            "read" => TraceOp::Read(device(f[3], line)?),
            _ => return Err(bad("unknown op")),
        };
        let at = Duration::from_secs_f64(t / 1e3);
        if out.last().is_some_and(|e| e.at > at) {
            return Err(bad("events out of time order"));
        }
        out.push(TraceEvent { at, region, op });
    }
    if out.is_empty() {
        return Err(CliError::Usage("trace has no events".into()));
    }
    Ok(out)
}

/// Replays `events` once per protocol (atomic ordering) and reports like the synthetic runs.
pub fn replay(
    socket: &str,
    protocols: &[String],
    events: &[TraceEvent],
) -> Result<Vec<ProtocolResult>, CliError> {
    protocols
        .iter()
        .map(|p| replay_one(socket, p, events))
        .collect()
}

struct Live {
    id: RegionId,
    size: u64,
    last_crc: Option<u64>,
}

fn replay_one(
    socket: &str,
    proto: &str,
    events: &[TraceEvent],
) -> Result<ProtocolResult, CliError> {
    let peak: u64 = events
        .iter()
        .filter_map(|e| match e.op {
            TraceOp::Alloc(s) => Some(s),
            _ => None,
        })
        .sum();
    let conn = Connection::open(
        socket,
        &ConnectOptions {
            name: format!("trace-{proto}"),
            coherence: Some(proto.to_string()),
            window_size: peak.saturating_add(64 << 20).min(1 << 30),
            ..ConnectOptions::default()
        },
    )?;
    let mut live: HashMap<u64, Live> = HashMap::new();
    let mut latency_us = Vec::new();
    let mut compensation_ms = Vec::new();
    let (mut corrupt, mut reads) = (0, 0);
    let before = conn.counters()?;
    let t0 = Instant::now();
    for (i, e) in events.iter().enumerate() {
        if let Some(wait) = e.at.checked_sub(t0.elapsed()) {
            std::thread::sleep(wait);
        }
        let missing = || {
            CliError::Usage(format!(
                "trace event {}: region {} not allocated",
                i + 1,
                e.region
            ))
        };
        match e.op {
            TraceOp::Alloc(size) => {
                let id = conn.alloc_blob(size)?.id;
                if let Some(old) = live.insert(
                    e.region,
                    Live {
                        id,
                        size,
                        last_crc: None,
                    },
                ) {
                    conn.free(old.id)?;
                }
            }
            TraceOp::Free => {
                let l = live.remove(&e.region).ok_or_else(missing)?;
                conn.free(l.id)?;
            }
            TraceOp::Write(dev) => {
                let l = live.get_mut(&e.region).ok_or_else(missing)?;
                let (crc, compensation) = write(&conn, l, dev, i)?;
                compensation_ms.push(compensation.as_secs_f64() * 1e3);
                l.last_crc = Some(crc);
            }
            TraceOp::Read(dev) => {
                let l = live.get(&e.region).ok_or_else(missing)?;
                let (crc, latency) = read(&conn, l, dev)?;
                latency_us.push(latency.as_secs_f64() * 1e6);
                reads += 1;
                if l.last_crc.is_some_and(|w| w != crc) {
                    corrupt += 1;
                }
            }
        }
    }
    let wall = t0.elapsed();
    let d = conn.counters()?.since(&before);
    for (_, l) in live {
        conn.free(l.id)?;
    }
    let scored = d.hits + d.misses;
    let n = reads.max(1) as f64;
    Ok(ProtocolResult {
        protocol: proto.to_string(),
        ordering: OrderingMode::Atomic,
        access_latency_us: P50P99::of(&latency_us),
        coherence_ms: MeanP50 {
            mean: d.copy_ns as f64 / 1e6 / n,
            p50: d.copy_ns as f64 / 1e6 / n,
        },
        throughput_gbps: 0.0,
        copies_per_frame: d.copies as f64 / n,
        prediction_accuracy: (scored > 0).then(|| d.hits as f64 / scored as f64),
        compensation_ms: MeanP50::of(&compensation_ms),
        cpu_overhead_pct: d.bookkeeping_ns as f64 / wall.as_nanos() as f64 * 100.0,
        svm_metadata_bytes: d.metadata_bytes,
        sync_fetches: d.sync_fetches,
        inflight_waits: d.inflight_waits,
        frame_ms: wall.as_secs_f64() * 1e3 / n,
        frames: reads,
        corrupt_frames: corrupt,
        max_queue_depth: conn.max_queue_depth(),
    })
}

/// Event `i`, a write of region `l` by `dev`: the CPU fills it with `i`'s low byte, a device
/// writes its pattern. The checksum of what was written and the access's compensation.
fn write(
    conn: &Connection,
    l: &Live,
    dev: DeviceId,
    i: usize,
) -> Result<(u64, std::time::Duration), CliError> {
    let a = conn.begin_access(l.id, dev, 0, l.size, AccessMode::Write)?;
    let crc = if dev == DeviceId::CPU {
        let ptr = a
            .ptr
            .ok_or_else(|| CliError::Usage("no CPU pointer".into()))?;
        // SAFETY: the library bounds-checked [ptr, ptr + size) in the window.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), l.size as usize) };
        bytes.fill(i as u8);
        crc32fast::hash(bytes) as u64
    } else {
        conn.device_cmd(
            dev,
            [testdev::WRITE_PATTERN, u64::from(l.id), i as u64, 0, 0, 0],
        )?[0]
    };
    let end = conn.end_access(l.id, dev, 0, l.size, AccessMode::Write)?;
    Ok((crc, end.compensation))
}

/// A read of region `l` by `dev`: the checksum of what it read and the access's latency.
fn read(
    conn: &Connection,
    l: &Live,
    dev: DeviceId,
) -> Result<(u64, std::time::Duration), CliError> {
    let a = conn.begin_access(l.id, dev, 0, l.size, AccessMode::Read)?;
    let latency = a.host_elapsed;
    let crc = if dev == DeviceId::CPU {
        let ptr = a
            .ptr
            .ok_or_else(|| CliError::Usage("no CPU pointer".into()))?;
        // SAFETY: the library bounds-checked [ptr, ptr + size) in the window.
        crc32fast::hash(unsafe { std::slice::from_raw_parts(ptr.as_ptr(), l.size as usize) }) as u64
    } else {
        conn.device_cmd(dev, [testdev::CHECKSUM, u64::from(l.id), 0, 0, 0, 0])?[0]
    };
    conn.end_access(l.id, dev, 0, l.size, AccessMode::Read)?;
    Ok((crc, latency))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_trace() {
        let t = parse("# header\n0 alloc 7 - 4096\n0.5 write 7 producer # comment\n17 read 7 consumer2\n20 free 7 -\n").unwrap();
        assert_eq!(t.len(), 4);
        assert_eq!(t[0].op, TraceOp::Alloc(4096));
        assert_eq!(t[1].op, TraceOp::Write(DeviceId::PRODUCER));
        assert_eq!(t[2].op, TraceOp::Read(DeviceId::CONSUMER2));
        assert_eq!(t[2].at, Duration::from_millis(17));
    }

    #[test]
    fn rejects_bad_traces() {
        for bad in [
            "",
            "0 alloc 1 -",
            "0 alloc 1 - 0",
            "0 write 1 gpu",
            "0 jump 1 cpu",
            "x write 1 cpu",
            "5 write 1 cpu\n4 read 1 cpu",
            "-1 write 1 cpu",
            "0 write",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} must be rejected");
        }
    }
}
