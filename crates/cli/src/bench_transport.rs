//! `virtsoc bench transport`: round-trip latency and bandwidth of the shared-memory ring
//! channel, beside a Unix socket and TCP loopback measured in the same run.
//!
//! Every channel moves the same thing: a 64-byte request answered by a 64-byte reply for the
//! round trip, and `size` bytes from a buffer of this process into the peer's memory for
//! bandwidth, in two stages that every channel pays for alike:
//! - **landing**: the bytes reach the peer's memory. For the daemon's channels a CPU write
//!   of the buffer (`Connection::write`, which ends when the host has them): a process
//!   guest's copies the buffer into the shared window; a remote guest's sends it from the
//!   buffer, as a socket write does, and the host reads it off the stream into its copy of
//!   the window. For sockets: a write of the buffer and the peer reading it into a buffer
//!   the size of the transfer; the peer answers once it has every byte.
//! - **device read**: the bytes reach the consumer's own memory. For the daemon's channels
//!   the consumer device's read access (the host copies the region into the device's
//!   memory, as it does for every device that keeps its own replica); for sockets the peer
//!   copies its buffer into a "device" buffer as large (kept from one transfer to the next,
//!   as the device's replica is), then answers again.
//!
//! `bandwidth_gbps` is the rate of both stages (the bench's definition); `landing_gbps`
//! the rate of the landing alone. Both compare like with like. The socket peers are threads
//! of this process on the other core; the daemon's channels (shared rings for process
//! guests, frames on TCP for remote guests) go to the daemon process.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use serde::Serialize;
use virtsoc_guest::{AccessMode, ConnectOptions, Connection, DeviceId};

use crate::daemon_proc::Endpoint;
use crate::stats::{percentile, P50P99};
use crate::together::{Phase, Together};
use crate::CliError;

/// Measurements of one channel.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ChannelResult {
    pub channel: String,
    pub rtt_us: P50P99,
    /// Bulk rate: a transfer's landing and its device read (see the module docs; the
    /// landing alone for the socket rows of `bench services`, which asks for no read).
    pub bandwidth_gbps: f64,
    /// Bulk rate of the landing alone (the median landing's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landing_gbps: Option<f64>,
    /// Where a bulk transfer's time goes (medians).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bulk_stages: Option<BulkStages>,
}

/// A bulk transfer in its two stages, median milliseconds each: the landing (`write_ms`;
/// for the daemon's channels the guest's CPU write, `Connection::write`: a copy into the
/// shared window, or for a remote guest the bytes crossing the stream into the host's copy
/// of its window; for sockets the write until the peer has every byte), and the device
/// read (`device_read_ms`: for the daemon's channels the consumer device's read access, the
/// host pulling the bytes into the device's memory; for sockets the peer's copy into its
/// device buffer).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct BulkStages {
    pub write_ms: f64,
    pub device_read_ms: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct TransportReport {
    pub round_trips: usize,
    pub bulk_bytes: u64,
    /// Each channel's row: with several rounds, the median of its rounds (each field's).
    pub channels: Vec<ChannelResult>,
    /// The rounds the rows are medians of (1: one measurement each).
    #[serde(default = "one")]
    pub rounds: usize,
    /// The remote guest's ratios to TCP loopback in each round (bulk, landing, rtt p50),
    /// when both were measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_over_tcp: Vec<RoundRatios>,
}

fn one() -> usize {
    1
}

/// A channel's ratios to another's measured in the same round.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct RoundRatios {
    pub bulk: f64,
    pub landing: Option<f64>,
    pub rtt_p50: f64,
}

/// Runs all channels `rounds` times, in turn within each round (so a change in the
/// machine's speed meets every channel alike); each row is the median of its rounds.
pub fn run_rounds(
    endpoint: &Endpoint,
    which: &[String],
    round_trips: usize,
    size: u64,
    reps: usize,
    rounds: usize,
) -> Result<TransportReport, CliError> {
    let runs = (0..rounds.max(1))
        .map(|_| run(endpoint, which, round_trips, size, reps))
        .collect::<Result<Vec<_>, _>>()?;
    let remote_over_tcp = runs
        .iter()
        .filter_map(|r| {
            let (bulk, landing, rtt_p50) =
                ratios(r.find("virtsoc over TCP")?, r.find("tcp-loopback")?);
            Some(RoundRatios {
                bulk,
                landing,
                rtt_p50,
            })
        })
        .collect();
    let mut report = runs[0].clone();
    report.rounds = runs.len();
    report.remote_over_tcp = remote_over_tcp;
    for (i, row) in report.channels.iter_mut().enumerate() {
        let of = |f: &dyn Fn(&ChannelResult) -> f64| {
            percentile(
                &runs.iter().map(|r| f(&r.channels[i])).collect::<Vec<_>>(),
                50.0,
            )
        };
        row.rtt_us.p50 = of(&|c| c.rtt_us.p50);
        row.rtt_us.p99 = of(&|c| c.rtt_us.p99);
        row.bandwidth_gbps = of(&|c| c.bandwidth_gbps);
        if row.landing_gbps.is_some() {
            row.landing_gbps = Some(of(&|c| c.landing_gbps.unwrap_or(0.0)));
        }
        if let Some(s) = row.bulk_stages.as_mut() {
            let stage = |c: &ChannelResult, read: bool| {
                c.bulk_stages
                    .as_ref()
                    .map_or(0.0, |s| if read { s.device_read_ms } else { s.write_ms })
            };
            s.write_ms = of(&|c| stage(c, false));
            s.device_read_ms = of(&|c| stage(c, true));
        }
    }
    Ok(report)
}

impl TransportReport {
    /// The row whose channel name starts with `prefix`.
    fn find(&self, prefix: &str) -> Option<&ChannelResult> {
        self.channels.iter().find(|c| c.channel.starts_with(prefix))
    }
}

/// Runs all channels.
pub fn run(
    endpoint: &Endpoint,
    which: &[String],
    round_trips: usize,
    size: u64,
    reps: usize,
) -> Result<TransportReport, CliError> {
    if let Some(bad) = which
        .iter()
        .find(|c| !["ring", "remote", "unix", "tcp"].contains(&c.as_str()))
    {
        return Err(CliError::Usage(format!("unknown channel {bad:?}")));
    }
    let want = |c: &str| which.iter().any(|w| w == c);
    let mut channels = Vec::new();
    if want("ring") {
        let name = if endpoint.target == "vm" || endpoint.target.starts_with("vm:") {
            "shm-ring (VM guest)"
        } else if endpoint.target.starts_with("tcp:") {
            "virtsoc over TCP (remote guest)"
        } else {
            "shm-ring (process guest)"
        };
        channels.push(ring(
            name,
            &endpoint.target,
            None,
            round_trips,
            size,
            reps,
            None,
        )?);
    }
    if let (true, Some((addr, token))) = (want("remote"), &endpoint.remote) {
        channels.push(ring(
            "virtsoc over TCP (remote guest)",
            &format!("tcp:{addr}"),
            Some(token.clone()),
            round_trips,
            size,
            reps,
            None,
        )?);
    }
    if want("unix") {
        channels.push(stream_channel(
            "unix-socket",
            round_trips,
            size,
            reps,
            unix_pair,
            Consume::DeviceRead,
            None,
        )?);
    }
    if want("tcp") {
        channels.push(stream_channel(
            "tcp-loopback",
            round_trips,
            size,
            reps,
            tcp_pair,
            Consume::DeviceRead,
            None,
        )?);
    }
    Ok(TransportReport {
        round_trips,
        bulk_bytes: size,
        channels,
        rounds: 1,
        remote_over_tcp: Vec::new(),
    })
}

/// The daemon's own channel: a NOP round trip, and a CPU write of `size` bytes that a
/// device then reads (the host pulls the bytes out of the window, or off the stream).
pub fn ring(
    name: &str,
    target: &str,
    token: Option<String>,
    round_trips: usize,
    size: u64,
    reps: usize,
    together: Option<&Together>,
) -> Result<ChannelResult, CliError> {
    let mut turn = together.map(Together::turn);
    let mut opts = ConnectOptions {
        name: "bench-transport".into(),
        coherence: Some("write-invalidate".into()),
        window_size: size + (64 << 20),
        ..ConnectOptions::default()
    };
    if token.is_some() {
        opts.token = token;
    }
    let conn = Connection::open(target, &opts)?;
    if let Some(t) = turn.as_mut() {
        t.reach(Phase::RoundTrips);
    }
    for _ in 0..round_trips / 10 {
        conn.nop()?;
    }
    let mut rtt = Vec::with_capacity(round_trips);
    for _ in 0..round_trips {
        let t0 = Instant::now();
        conn.nop()?;
        rtt.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    if let Some(t) = turn.as_mut() {
        t.reach(Phase::Transfers);
    }
    let id = conn.alloc_blob(size)?.id;
    let src = vec![0x5au8; size as usize];
    let mut times = Vec::new();
    let (mut write, mut read) = (Vec::new(), Vec::new());
    let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
    for i in 0..reps + 1 {
        if let (1, Some(t)) = (i, turn.as_mut()) {
            t.start();
        }
        let t0 = Instant::now();
        conn.write(id, 0, &src)?;
        let t1 = Instant::now();
        conn.begin_access(id, DeviceId::CONSUMER, 0, size, AccessMode::Read)?;
        conn.end_access(id, DeviceId::CONSUMER, 0, size, AccessMode::Read)?;
        let t2 = Instant::now();
        if i > 0 {
            times.push((t2 - t0).as_secs_f64());
            write.push(ms(t0, t1));
            read.push(ms(t1, t2));
        }
    }
    if let Some(t) = &turn {
        t.end();
    }
    conn.free(id)?;
    Ok(ChannelResult {
        channel: name.into(),
        rtt_us: P50P99::of(&rtt),
        bandwidth_gbps: size as f64 / percentile(&times, 50.0) / 1e9,
        landing_gbps: Some(size as f64 / percentile(&write, 50.0) / 1e6),
        bulk_stages: Some(BulkStages {
            write_ms: percentile(&write, 50.0),
            device_read_ms: percentile(&read, 50.0),
        }),
    })
}

/// Boots a VM guest that measures its own ring channel against a daemon started for it.
pub fn vm_channel(
    image: &std::path::Path,
    round_trips: usize,
    size: u64,
    reps: usize,
) -> Result<ChannelResult, CliError> {
    let out = crate::vm::bench_in_vm(
        image,
        ("transport", "ring"),
        (round_trips, size, reps),
        (size * 2 + (64 << 20)).next_power_of_two() >> 20,
        std::time::Duration::from_secs(600),
    )?;
    let mut r: TransportReport = serde_json::from_str(&out)?;
    let mut c = r
        .channels
        .pop()
        .ok_or_else(|| CliError::Usage("the VM reported no channel".into()))?;
    c.channel = "shm-ring (VM guest, TCG)".into();
    Ok(c)
}

/// Bulk header kinds: land the bytes and answer; land, answer, copy them into the device
/// buffer and answer again.
const LAND: u8 = 1;
const LAND_AND_READ: u8 = 2;

/// Peer loop: a header `[kind u8][len u64]`, then `len` bytes, landed in a buffer of the
/// peer's as large as the transfer (kept from one transfer to the next, as the daemon keeps
/// the region they land in; a 1 MiB buffer overwritten 16 times stays in the cache, and
/// measured a cheaper landing than any receiver that keeps the bytes gets); answers 64
/// bytes. A `LAND_AND_READ` transfer is then copied into the peer's device buffer (as large,
/// kept too), and answered again.
fn serve_stream(mut s: impl Read + Write) {
    let (mut buf, mut dev) = (Vec::new(), Vec::new());
    let mut head = [0u8; 9];
    while s.read_exact(&mut head).is_ok() {
        let len = u64::from_le_bytes(head[1..9].try_into().unwrap_or([0; 8]));
        // The bench's own peer: transfers are the bench's sizes, at most 1 GiB.
        let Some(n) = usize::try_from(len).ok().filter(|&n| n <= 1 << 30) else {
            return;
        };
        if buf.len() < n {
            buf.resize(n, 0);
        }
        if s.read_exact(&mut buf[..n]).is_err() {
            return;
        }
        if s.write_all(&[0u8; 64]).is_err() {
            return;
        }
        if head[0] == LAND_AND_READ {
            if dev.len() < n {
                dev.resize(n, 0);
            }
            dev[..n].copy_from_slice(&buf[..n]);
            if s.write_all(&[0u8; 64]).is_err() {
                return;
            }
        }
    }
}

/// A connected Unix stream pair, its peer served on a thread (no path: several pairs can be
/// measured at once).
pub(crate) fn unix_pair() -> Result<(Box<dyn ReadWrite>, std::thread::JoinHandle<()>), CliError> {
    let (c, s) = UnixStream::pair()?;
    let h = std::thread::spawn(move || serve_stream(s));
    Ok((Box::new(c), h))
}

/// A connected TCP loopback pair (no Nagle), its peer served on a thread.
pub(crate) fn tcp_pair() -> Result<(Box<dyn ReadWrite>, std::thread::JoinHandle<()>), CliError> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let h = std::thread::spawn(move || {
        if let Ok((s, _)) = l.accept() {
            let _ = s.set_nodelay(true);
            serve_stream(s);
        }
    });
    let c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    Ok((Box::new(c), h))
}

/// A bidirectional byte stream.
pub trait ReadWrite: Read + Write + Send {}
impl<T: Read + Write + Send> ReadWrite for T {}

type PairFn = fn() -> Result<(Box<dyn ReadWrite>, std::thread::JoinHandle<()>), CliError>;

/// What a plain-socket peer does with a bulk transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Consume {
    /// Lands it (`bench services`' socket rows).
    Land,
    /// Lands it, then copies it into its device buffer (`bench transport`: the same two
    /// stages as the daemon's channels).
    DeviceRead,
}

/// One plain-socket channel of `pair`: round trips of 64 bytes, then `reps` bulk transfers
/// of `size` bytes (the median's rate), each landed and, with `Consume::DeviceRead`, copied
/// into the peer's device buffer.
pub(crate) fn stream_channel(
    name: &str,
    round_trips: usize,
    size: u64,
    reps: usize,
    pair: PairFn,
    consume: Consume,
    together: Option<&Together>,
) -> Result<ChannelResult, CliError> {
    let mut turn = together.map(Together::turn);
    let (mut c, peer) = pair()?;
    let mut reply = [0u8; 64];
    let mut msg = [0u8; 64];
    msg[1..9].copy_from_slice(&55u64.to_le_bytes());
    if let Some(t) = turn.as_mut() {
        t.reach(Phase::RoundTrips);
    }
    let mut rtt = Vec::with_capacity(round_trips);
    for i in 0..round_trips + round_trips / 10 {
        let t0 = Instant::now();
        c.write_all(&msg)?;
        c.read_exact(&mut reply)?;
        if i >= round_trips / 10 {
            rtt.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    if let Some(t) = turn.as_mut() {
        t.reach(Phase::Transfers);
    }
    let data = vec![0x5au8; size as usize];
    let (mut times, mut land, mut read) = (Vec::new(), Vec::new(), Vec::new());
    let read_too = consume == Consume::DeviceRead;
    let mut head = [if read_too { LAND_AND_READ } else { LAND }; 9];
    head[1..9].copy_from_slice(&size.to_le_bytes());
    for i in 0..reps + 1 {
        if let (1, Some(t)) = (i, turn.as_mut()) {
            t.start();
        }
        let t0 = Instant::now();
        c.write_all(&head)?;
        c.write_all(&data)?;
        c.read_exact(&mut reply)?;
        let t1 = Instant::now();
        if read_too {
            c.read_exact(&mut reply)?;
        }
        let t2 = Instant::now();
        if i > 0 {
            times.push((t2 - t0).as_secs_f64());
            land.push((t1 - t0).as_secs_f64() * 1e3);
            read.push((t2 - t1).as_secs_f64() * 1e3);
        }
    }
    if let Some(t) = &turn {
        t.end();
    }
    drop(c);
    let _ = peer.join();
    Ok(ChannelResult {
        channel: name.to_string(),
        rtt_us: P50P99::of(&rtt),
        bandwidth_gbps: size as f64 / percentile(&times, 50.0) / 1e9,
        landing_gbps: Some(size as f64 / percentile(&land, 50.0) / 1e6),
        bulk_stages: read_too.then(|| BulkStages {
            write_ms: percentile(&land, 50.0),
            device_read_ms: percentile(&read, 50.0),
        }),
    })
}

/// A channel's bulk rates over another's (`bandwidth_gbps`, `landing_gbps`) and its round
/// trip's p50 over the other's.
fn ratios(a: &ChannelResult, b: &ChannelResult) -> (f64, Option<f64>, f64) {
    let landing = a.landing_gbps.zip(b.landing_gbps).map(|(x, y)| x / y);
    (
        a.bandwidth_gbps / b.bandwidth_gbps,
        landing,
        a.rtt_us.p50 / b.rtt_us.p50,
    )
}

/// Prints the report as a table.
pub fn print_table(r: &TransportReport) {
    println!(
        "Transport: {} round trips, {} bytes per bulk transfer, {} round(s) (rows: medians)",
        r.round_trips, r.bulk_bytes, r.rounds
    );
    println!(
        "{:<32} {:>11} {:>11} {:>12} {:>12}",
        "channel", "rtt p50 us", "rtt p99 us", "bulk GB/s", "landing GB/s"
    );
    for c in &r.channels {
        let landing = c.landing_gbps.map_or("-".into(), |g| format!("{g:.3}"));
        println!(
            "{:<32} {:>11.2} {:>11.2} {:>12.3} {:>12}",
            c.channel, c.rtt_us.p50, c.rtt_us.p99, c.bandwidth_gbps, landing
        );
    }
    println!("bulk = landing + device read: every row pays both stages (the socket peers copy what they land into a device buffer)");
    for c in &r.channels {
        if let Some(s) = &c.bulk_stages {
            println!(
                "{}: bulk ms = landing {:.2} + device read {:.2}",
                c.channel, s.write_ms, s.device_read_ms
            );
        }
    }
    if let (Some(remote), Some(tcp)) = (r.find("virtsoc over TCP"), r.find("tcp-loopback")) {
        let (bulk, landing, rtt) = ratios(remote, tcp);
        let landing = landing.map_or("-".into(), |x| format!("{x:.2}x"));
        println!(
            "remote guest / TCP loopback (medians): bulk {bulk:.2}x, landing {landing}, rtt p50 {rtt:.2}x"
        );
    }
    for (i, x) in r.remote_over_tcp.iter().enumerate() {
        let landing = x.landing.map_or("-".into(), |l| format!("{l:.2}x"));
        println!(
            "  round {}: bulk {:.2}x, landing {landing}, rtt p50 {:.2}x",
            i + 1,
            x.bulk,
            x.rtt_p50
        );
    }
}
