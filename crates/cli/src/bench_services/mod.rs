//! `virtsoc bench services`: bandwidth and round trip of a host service channel (issue 29)
//! beside the daemon's own ring, a Unix socket and TCP loopback, in one run, with 1 to N
//! channels, from a process guest, or from a VM guest when it runs inside the VM with
//! `--socket vm` (rows with `guest` = `vm`: the service and the ring only).
//!
//! Every kind moves, per transfer, `size` bytes that sit in the sender's memory to the
//! receiver, which reads each of them once:
//! - `service`, payload `region` (zero copy): the guest's bytes are in a region of its
//!   window (where it produced them: it brackets them with a CPU write access, as a
//!   producer does, but copies nothing), and it calls the `bulk` service's `drain` on the
//!   region over a channel of its own; the service reads every byte once in place in the
//!   guest's window (its own SVM access of the window brackets the call). No copy at all.
//! - `service`, payload `stream`: the same `drain` with the bytes streamed through the
//!   channel: the guest copies them into the channel's 64 KiB slots as packets (no
//!   checksum), and the service reads each packet once where it lies in its slot (`drain`
//!   takes its input packet by packet: no reassembly on the host). One copy. (A service
//!   that needs its input whole gets it reassembled: a second copy, on the host.)
//! - `ring`: `bench transport`'s ring: a CPU write of the bytes into the region, then the
//!   consumer device pulling them into its memory. Two copies.
//! - `unix-socket`, `tcp-loopback`: a write of the bytes and the peer thread reading them
//!   into its buffer. Two copies, in the kernel.
//!
//! The round trip of each is a 64-byte message and its answer (the service's a 64-byte
//! inline `echo`, the ring's a NOP). N service channels are N channels of one guest, one
//! thread each; N rings are N guests; N sockets are N socket pairs.
//!
//! Bandwidth with N channels is their aggregate: every channel's timed transfers start at
//! one instant (after each one's untimed first transfer), and the bytes all of them moved are
//! divided by the time until the last one ended ([`Together`]). (Summing each channel's own
//! median rate, as this bench did before, counted a channel's transfers that ran while the
//! others were descheduled as if they had overlapped: with more channels than cores that
//! overstated every kind, unevenly.) The first transfer of every service channel is checked
//! end to end (the service's sum of the payload's words) and not timed.
//!
//! The whole comparison runs in `--rounds` rounds, every kind at every channel count once a
//! round, so that the kinds a ratio compares ran next to each other each time. A row reports
//! the median of its rounds' bandwidths (`rounds_gbps` keeps each) and its round trips over
//! all rounds; the table's ratios are medians of the rounds' own ratios, with their range.
//! (One pass of 10 transfers per channel lasted 13-50 ms a row: one descheduling moved a
//! row by a fifth, and 4 channels' region payloads read 1.92x TCP in one run and 4.15x in
//! the next.)

pub mod chart;
pub mod probe;
pub mod soak;
mod vm;

pub use vm::vm_rows;

use std::time::Instant;

use serde::Serialize;
use virtsoc_guest::services::payload::word_sum;
use virtsoc_guest::services::{bulk, Bulk};
use virtsoc_guest::{AccessMode, ConnectOptions, Connection, DeviceId};

use crate::bench_transport::{self, Consume};
use crate::daemon_proc::Endpoint;
use crate::stats::{median_or_zero, min_max, P50P99};
use crate::together::{Phase, Together};
use crate::CliError;

/// Ring entries (64 KiB slots) of a streaming channel: the guest writes up to this many
/// packets ahead of the service, so a wake-up of the channel's thread that the scheduler
/// delays (a loaded machine) does not stop the guest (4 MiB of slots).
const STREAM_ENTRIES: u32 = 64;

/// One measured channel kind at one channel count.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Row {
    /// `service`, `ring`, `unix-socket` or `tcp-loopback`.
    pub channel: String,
    /// How a service row's payload travels: `region` (read in place) or `stream` (packets
    /// through the channel's slots). Absent for the other kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// `process`, or `vm` when the bench runs inside a VM guest (`--socket vm`: every kind
    /// then runs in the VM, its sockets the VM kernel's).
    pub guest: String,
    /// Channels running at once.
    pub channels: u32,
    /// Bytes per second over all channels, in GB/s: the median of the rounds'.
    pub bandwidth_gbps: f64,
    /// Round trip of a small message on one channel, in microseconds: the medians of the
    /// rounds' p50 and p99.
    pub rtt_us: P50P99,
    /// Each round's bandwidth, in GB/s, in the order the rounds ran.
    #[serde(default)]
    pub rounds_gbps: Vec<f64>,
}

/// The report.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Report {
    /// Bytes per transfer.
    pub bulk_bytes: u64,
    /// Round trips timed per channel.
    pub round_trips: usize,
    /// Transfers timed per channel and round.
    pub reps: usize,
    /// Rounds of the whole comparison.
    #[serde(default)]
    pub rounds: usize,
    /// The machine's load average when the run started (`/proc/loadavg`).
    pub load: String,
    /// Every measurement.
    pub rows: Vec<Row>,
}

/// How the service's payload travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Payload {
    /// In a region of the guest's window, read in place.
    Region,
    /// In 64 KiB packets through the channel's slots.
    Stream,
}

impl Payload {
    fn name(self) -> &'static str {
        match self {
            Payload::Region => "region",
            Payload::Stream => "stream",
        }
    }
}

/// Round trips of a 64-byte echo on `bulk`, in microseconds.
fn echo_round_trips(bulk: &mut Bulk, round_trips: usize) -> Result<Vec<f64>, CliError> {
    let msg = [0x42u8; 64];
    let mut rtt = Vec::with_capacity(round_trips);
    for i in 0..round_trips + round_trips / 10 {
        let t0 = Instant::now();
        let back = bulk.echo(&msg)?;
        if i >= round_trips / 10 {
            rtt.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        if back.len() != msg.len() {
            return Err(CliError::Usage(
                "bulk echo answered the wrong length".into(),
            ));
        }
    }
    Ok(rtt)
}

/// What one channel of the service measured: (round trips in us, bytes/s).
fn service_channel(
    conn: &Connection,
    payload: Payload,
    round_trips: usize,
    size: u64,
    reps: usize,
    together: &Together,
) -> Result<Vec<f64>, CliError> {
    let mut turn = together.turn();
    let entries = if payload == Payload::Stream {
        STREAM_ENTRIES
    } else {
        1
    };
    let mut bulk = Bulk::open(conn, entries)?;
    turn.reach(Phase::RoundTrips);
    let rtt = echo_round_trips(&mut bulk, round_trips)?;
    turn.reach(Phase::Transfers);
    let src: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    let want = (size, word_sum(&src));
    let id = conn.alloc_blob(size)?.id;
    // The guest produces its payload in the region once (a CPU write); each transfer then
    // brackets it as a producer does.
    let a = conn.begin_access(id, DeviceId::CPU, 0, size, AccessMode::Write)?;
    let ptr = a
        .ptr
        .ok_or_else(|| CliError::Usage("no pointer for CPU access".into()))?;
    // SAFETY: the library checked that [ptr, ptr + size) lies in the mapped window.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr.as_ptr(), size as usize) };
    conn.end_access(id, DeviceId::CPU, 0, size, AccessMode::Write)?;
    for i in 0..reps + 1 {
        if i == 1 {
            turn.start();
        }
        let v = match payload {
            Payload::Region => {
                conn.begin_access(id, DeviceId::CPU, 0, size, AccessMode::Write)?;
                conn.end_access(id, DeviceId::CPU, 0, size, AccessMode::Write)?;
                bulk.0
                    .call_region(bulk::call::DRAIN, (id, 0, size), None)?
                    .values
            }
            Payload::Stream => bulk.0.call(bulk::call::DRAIN, &src)?.values,
        };
        if (v[0], v[1]) != want {
            return Err(CliError::Usage(format!(
                "the service drained {} bytes summing to {:#x}, expected {} and {:#x}",
                v[0], v[1], want.0, want.1
            )));
        }
    }
    turn.end();
    bulk.0.close()?;
    conn.free(id)?;
    Ok(rtt)
}

/// The aggregate rate of `n` channels that each moved `reps` transfers of `size` bytes
/// together, in GB/s.
fn aggregate_gbps(together: &Together, n: u32, reps: usize, size: u64) -> Result<f64, CliError> {
    let secs = together
        .span_secs()
        .filter(|s| *s > 0.0)
        .ok_or_else(|| CliError::Usage("no channel finished its transfers".into()))?;
    Ok(f64::from(n) * reps as f64 * size as f64 / secs / 1e9)
}

fn service_row(
    endpoint: &Endpoint,
    payload: Payload,
    n: u32,
    round_trips: usize,
    size: u64,
    reps: usize,
) -> Result<Row, CliError> {
    let opts = ConnectOptions {
        name: "bench-services".into(),
        coherence: Some("write-invalidate".into()),
        window_size: (size + (6 << 20)) * u64::from(n) + (64 << 20),
        ..ConnectOptions::default()
    };
    let conn = Connection::open(&endpoint.target, &opts)?;
    let together = Together::new(n as usize);
    let results: Vec<Result<Vec<f64>, CliError>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| service_channel(&conn, payload, round_trips, size, reps, &together))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(CliError::Usage("channel thread panicked".into())))
            })
            .collect()
    });
    let mut rtt = None;
    for r in results {
        rtt.get_or_insert(r?);
    }
    Ok(Row {
        channel: "service".into(),
        payload: Some(payload.name().into()),
        guest: guest_kind(&endpoint.target).into(),
        channels: n,
        bandwidth_gbps: aggregate_gbps(&together, n, reps, size)?,
        rtt_us: P50P99::of(&rtt.unwrap_or_default()),
        rounds_gbps: Vec::new(),
    })
}

/// `n` channels of kind `name` at once.
fn baseline_row(
    endpoint: &Endpoint,
    name: &str,
    n: u32,
    round_trips: usize,
    size: u64,
    reps: usize,
) -> Result<Row, CliError> {
    let together = Together::new(n as usize);
    let t = Some(&together);
    let one = || -> Result<bench_transport::ChannelResult, CliError> {
        let (rt, land) = (round_trips, Consume::Land);
        match name {
            "ring" => bench_transport::ring("ring", &endpoint.target, None, rt, size, reps, t),
            "unix-socket" => {
                let pair = bench_transport::unix_pair;
                bench_transport::stream_channel(name, rt, size, reps, pair, land, t)
            }
            _ => {
                let pair = bench_transport::tcp_pair;
                bench_transport::stream_channel(name, rt, size, reps, pair, land, t)
            }
        }
    };
    let results: Vec<Result<bench_transport::ChannelResult, CliError>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n).map(|_| s.spawn(one)).collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(CliError::Usage("channel thread panicked".into())))
            })
            .collect()
    });
    let mut rtt_us = None;
    for r in results {
        rtt_us.get_or_insert(r?.rtt_us);
    }
    let bw = aggregate_gbps(&together, n, reps, size)?;
    let rtt_us = rtt_us.unwrap_or(P50P99 { p50: 0.0, p99: 0.0 });
    Ok(Row {
        channel: name.into(),
        payload: None,
        guest: guest_kind(&endpoint.target).into(),
        channels: n,
        bandwidth_gbps: bw,
        rtt_us,
        rounds_gbps: Vec::new(),
    })
}

/// The kind of guest a bench of `target` runs as.
fn guest_kind(target: &str) -> &'static str {
    if target == "vm" || target.starts_with("vm:") {
        "vm"
    } else if target.starts_with("tcp:") {
        "remote"
    } else {
        "process"
    }
}

/// The kinds measured beside the service from a guest of `target`: inside a VM only the
/// ring (the guest's image has no loopback network, and the VM kernel's own sockets say
/// nothing of the way to the host).
fn baselines(target: &str) -> &'static [&'static str] {
    match guest_kind(target) {
        "vm" => &["ring"],
        _ => &["ring", "unix-socket", "tcp-loopback"],
    }
}

/// Runs every channel kind with 1..=`max_channels` channels, the whole comparison `rounds`
/// times.
pub fn run(
    endpoint: &Endpoint,
    max_channels: u32,
    (round_trips, size, reps): (usize, u64, usize),
    rounds: usize,
) -> Result<Report, CliError> {
    if !(1..=16).contains(&max_channels) {
        return Err(CliError::Usage("--channels must be 1..=16".into()));
    }
    if rounds == 0 {
        return Err(CliError::Usage("--rounds must be at least 1".into()));
    }
    let load = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string();
    let mut all = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let mut rows = Vec::new();
        for n in 1..=max_channels {
            for p in [Payload::Region, Payload::Stream] {
                rows.push(service_row(endpoint, p, n, round_trips, size, reps)?);
            }
            for name in baselines(&endpoint.target) {
                rows.push(baseline_row(endpoint, name, n, round_trips, size, reps)?);
            }
        }
        all.push(rows);
    }
    Ok(Report {
        bulk_bytes: size,
        round_trips,
        reps,
        rounds,
        load,
        rows: merge_rounds(all),
    })
}

/// One row per kind and channel count from the rounds' rows (each round measured the same
/// rows in the same order): the median bandwidth, every round's kept, and the medians of
/// the rounds' round-trip percentiles.
fn merge_rounds(rounds: Vec<Vec<Row>>) -> Vec<Row> {
    let mut it = rounds.into_iter();
    let Some(first) = it.next() else {
        return Vec::new();
    };
    let mut rows: Vec<(Row, Vec<f64>, Vec<f64>)> = first
        .into_iter()
        .map(|r| {
            let (p50, p99) = (vec![r.rtt_us.p50], vec![r.rtt_us.p99]);
            let mut r = r;
            r.rounds_gbps = vec![r.bandwidth_gbps];
            (r, p50, p99)
        })
        .collect();
    for round in it {
        for r in round {
            if let Some((m, p50, p99)) = rows.iter_mut().find(|(m, ..)| same_row(m, &r)) {
                m.rounds_gbps.push(r.bandwidth_gbps);
                p50.push(r.rtt_us.p50);
                p99.push(r.rtt_us.p99);
            }
        }
    }
    rows.into_iter()
        .map(|(mut r, p50, p99)| {
            r.bandwidth_gbps = median_or_zero(&r.rounds_gbps);
            r.rtt_us = P50P99 {
                p50: median_or_zero(&p50),
                p99: median_or_zero(&p99),
            };
            r
        })
        .collect()
}

/// Whether `a` and `b` measured the same kind at the same channel count from the same guest.
fn same_row(a: &Row, b: &Row) -> bool {
    (&a.channel, &a.payload, &a.guest, a.channels) == (&b.channel, &b.payload, &b.guest, b.channels)
}

/// `row`'s bandwidth over that of the `kind` row beside it (same channels and guest), per
/// round: the median and the range of the rounds' ratios (rows without rounds count as one).
pub fn ratio_to(rows: &[Row], row: &Row, kind: &str) -> Option<(f64, f64, f64)> {
    let base = rows
        .iter()
        .find(|x| x.channel == kind && x.channels == row.channels && x.guest == row.guest)?;
    let per_round = |r: &Row| match r.rounds_gbps.is_empty() {
        true => vec![r.bandwidth_gbps],
        false => r.rounds_gbps.clone(),
    };
    let ratios: Vec<f64> = per_round(row)
        .iter()
        .zip(per_round(base))
        .filter(|(_, d)| *d > 0.0)
        .map(|(n, d)| n / d)
        .collect();
    let (min, max) = min_max(&ratios)?;
    Some((median_or_zero(&ratios), min, max))
}

/// Prints the report as a table, with the service's ratios to the ring and TCP (medians of
/// the rounds' ratios, their range beside the TCP one).
pub fn print_table(r: &Report) {
    println!(
        "Host services: {} bytes per transfer, {} round trips, {} transfers per channel, \
         {} rounds (load average {})",
        r.bulk_bytes, r.round_trips, r.reps, r.rounds, r.load
    );
    println!(
        "{:<19} {:>8} {:>11} {:>11} {:>10} {:>15} {:>7} {:>19}",
        "channel",
        "channels",
        "rtt p50 us",
        "rtt p99 us",
        "bulk GB/s",
        "range",
        "x ring",
        "x tcp [range]"
    );
    for row in &r.rows {
        let ratio = |c: &str| ratio_to(&r.rows, row, c);
        let name = match &row.payload {
            Some(p) => format!("{}/{p}", row.channel),
            None => row.channel.clone(),
        };
        let name = match row.guest.as_str() {
            "process" => name,
            g => format!("{name} ({g})"),
        };
        let (lo, hi) =
            min_max(&row.rounds_gbps).unwrap_or((row.bandwidth_gbps, row.bandwidth_gbps));
        println!(
            "{:<19} {:>8} {:>11.2} {:>11.2} {:>10.3} {:>15} {:>7} {:>19}",
            name,
            row.channels,
            row.rtt_us.p50,
            row.rtt_us.p99,
            row.bandwidth_gbps,
            format!("[{lo:.2}, {hi:.2}]"),
            ratio("ring").map_or("-".into(), |(m, ..)| format!("{m:.2}")),
            ratio("tcp-loopback").map_or("-".into(), |(m, lo, hi)| format!(
                "{m:.2} [{lo:.2}, {hi:.2}]"
            )),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::chart::tests::row;
    use super::*;

    fn round(region: f64, tcp: f64, rtt: f64) -> Vec<Row> {
        let mut r = vec![
            row("service", Some("region"), 1, region),
            row("tcp-loopback", None, 1, tcp),
        ];
        r[0].rtt_us = P50P99 {
            p50: rtt,
            p99: rtt * 2.0,
        };
        r
    }

    #[test]
    fn rows_are_the_rounds_medians_and_ratios_are_taken_per_round() {
        let rows = merge_rounds(vec![
            round(10.0, 5.0, 2.0),
            round(30.0, 10.0, 9.0),
            round(12.0, 4.0, 3.0),
        ]);
        assert_eq!(rows.len(), 2);
        let region = &rows[0];
        assert_eq!(region.rounds_gbps, [10.0, 30.0, 12.0]);
        assert_eq!(region.bandwidth_gbps, 12.0);
        assert_eq!(region.rtt_us, P50P99 { p50: 3.0, p99: 6.0 });
        // Per round 2.0, 3.0 and 3.0: not 12 / 5 from the two medians.
        assert_eq!(
            ratio_to(&rows, region, "tcp-loopback"),
            Some((3.0, 2.0, 3.0))
        );
        assert_eq!(ratio_to(&rows, region, "ring"), None);
        // Another channel count is another row.
        let mut other = round(1.0, 1.0, 1.0);
        other[0].channels = 2;
        let rows = merge_rounds(vec![round(10.0, 5.0, 2.0), other]);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].rounds_gbps, [10.0]);
        assert!(merge_rounds(Vec::new()).is_empty());
    }
}
