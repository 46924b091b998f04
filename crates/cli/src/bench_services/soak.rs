//! `virtsoc bench services --soak SECONDS`: many guests with several channels each send the
//! bulk service payloads of random sizes for a while, every one checked, and the daemon's
//! memory is compared before and after.
//!
//! Each channel makes its payloads in a region of its own and alternates between the two
//! ways a payload travels: streamed through the channel in 64 KiB packets (`sink`: the
//! service's CRC-32 and length of the reassembled bytes), and read in place in the region
//! (`sink` on the region). Every answer is checked: CRC-32 and length, and the service's
//! count of the guest's transfers, which must come out as exactly 1..=N over the guest's
//! channels (none lost, none run twice).

use std::time::{Duration, Instant};

use serde::Serialize;
use virtsoc_guest::services::Bulk;
use virtsoc_guest::{AccessMode, ConnectOptions, Connection, DeviceId};

use crate::daemon_proc::Endpoint;
use crate::CliError;

/// What a soak run saw.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SoakReport {
    /// Guests (connections) at once.
    pub guests: u32,
    /// Channels per guest.
    pub channels: u32,
    /// Largest payload, bytes.
    pub max_bytes: u64,
    /// Seconds it ran.
    pub seconds: f64,
    /// Transfers sent and checked.
    pub transfers: u64,
    /// Of them, through regions read in place.
    pub region_transfers: u64,
    /// Bytes sent.
    pub bytes: u64,
    /// Transfers whose checksum or length the service answered wrong.
    pub mismatches: u64,
    /// Guests whose transfer counts were not exactly 1..=N (a transfer lost or run twice).
    pub count_errors: u64,
    /// The daemon's resident memory before, KiB (0 when unknown).
    pub rss_before_kib: u64,
    /// After every guest left, KiB.
    pub rss_after_kib: u64,
    /// After / before.
    pub rss_ratio: f64,
    /// The machine's load average at the start (`/proc/loadavg`).
    pub load: String,
}

fn rss_kib(pid: Option<u32>) -> u64 {
    let Some(pid) = pid else { return 0 };
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// What one channel did.
#[derive(Default)]
struct Tally {
    transfers: u64,
    region: u64,
    bytes: u64,
    mismatches: u64,
    /// The service's count of the guest's transfers, as each answer said it.
    counts: Vec<u64>,
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// One soak channel: transfers of random sizes up to `max`, streamed and in its region in
/// turn, until `end`, each checked.
fn soak_channel(conn: &Connection, seed: u64, max: u64, end: Instant) -> Result<Tally, CliError> {
    let mut bulk = Bulk::open(conn, 8)?;
    let region = conn.alloc_blob(max)?.id;
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut t = Tally::default();
    while Instant::now() < end {
        let size = 1 + next(&mut x) % max;
        let salt = next(&mut x);
        // The payload is made in the channel's region (no copy of it elsewhere): read in
        // place by the service, or streamed from there in packets.
        let stream = t.transfers % 2 == 0;
        let mode = if stream {
            AccessMode::ReadWrite
        } else {
            AccessMode::Write
        };
        let a = conn.begin_access(region, DeviceId::CPU, 0, size, mode)?;
        let ptr = a
            .ptr
            .ok_or_else(|| CliError::Usage("no pointer for CPU access".into()))?;
        // SAFETY: the library checked that [ptr, ptr + size) lies in the mapped window; it
        // stays mapped and this thread's own until the access ends below.
        let data = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), size as usize) };
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i as u64 ^ salt) as u8;
        }
        let crc = crc32fast::hash(data);
        let r = if stream {
            let r = bulk.sink_counted(data);
            conn.end_access(region, DeviceId::CPU, 0, size, mode)?;
            r?
        } else {
            conn.end_access(region, DeviceId::CPU, 0, size, mode)?;
            t.region += 1;
            let v = bulk
                .0
                .call_region(
                    virtsoc_guest::services::bulk::call::SINK,
                    (region, 0, size),
                    None,
                )?
                .values;
            virtsoc_guest::services::Sink {
                crc: v[0] as u32,
                len: v[1],
                nth: v[2],
                total_bytes: v[3],
            }
        };
        if (r.crc, r.len) != (crc, size) {
            t.mismatches += 1;
        }
        t.counts.push(r.nth);
        t.transfers += 1;
        t.bytes += size;
    }
    bulk.0.close()?;
    conn.free(region)?;
    Ok(t)
}

/// `guests` guests with `channels` channels each send payloads of random sizes up to `max`
/// bytes for `seconds`, every one checked.
pub fn soak(
    endpoint: &Endpoint,
    guests: u32,
    channels: u32,
    seconds: f64,
    max: u64,
) -> Result<SoakReport, CliError> {
    if !(1..=16).contains(&channels) || guests == 0 || max == 0 {
        return Err(CliError::Usage(
            "--soak needs --guests >= 1, --channels 1..=16 and --size >= 1".into(),
        ));
    }
    let load = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string();
    let before = rss_kib(endpoint.pid);
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(seconds);
    let opts = |g: u32| ConnectOptions {
        name: format!("soak-{g}"),
        // Each channel's region of `max` bytes, its rings, and room to spare.
        window_size: (u64::from(channels) * (max + (2 << 20)) + (32 << 20))
            .next_multiple_of(1 << 20),
        ..ConnectOptions::default()
    };
    // Connected one after the other: the daemon admits a few handshakes per peer at once.
    let conns = (0..guests)
        .map(|g| Connection::open(&endpoint.target, &opts(g)))
        .collect::<Result<Vec<_>, _>>()?;
    let per_guest: Vec<Result<Vec<Tally>, CliError>> = std::thread::scope(|s| {
        let hs: Vec<Vec<_>> = conns
            .iter()
            .enumerate()
            .map(|(g, conn)| {
                (0..channels)
                    .map(|c| {
                        let seed = (g as u64) << 8 | u64::from(c);
                        s.spawn(move || soak_channel(conn, seed, max, end))
                    })
                    .collect()
            })
            .collect();
        hs.into_iter()
            .map(|g| {
                g.into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(CliError::Usage("soak channel panicked".into()))
                        })
                    })
                    .collect()
            })
            .collect()
    });
    let mut r = SoakReport {
        guests,
        channels,
        max_bytes: max,
        seconds: t0.elapsed().as_secs_f64(),
        transfers: 0,
        region_transfers: 0,
        bytes: 0,
        mismatches: 0,
        count_errors: 0,
        rss_before_kib: before,
        rss_after_kib: 0,
        rss_ratio: 0.0,
        load,
    };
    for g in per_guest {
        let mut counts = Vec::new();
        for t in g? {
            r.transfers += t.transfers;
            r.region_transfers += t.region;
            r.bytes += t.bytes;
            r.mismatches += t.mismatches;
            counts.extend(t.counts);
        }
        counts.sort_unstable();
        if !counts.iter().zip(1..).all(|(a, b)| *a == b) {
            r.count_errors += 1;
        }
    }
    drop(conns);
    r.rss_after_kib = settled_rss(endpoint.pid, before);
    r.rss_ratio = if before > 0 {
        r.rss_after_kib as f64 / before as f64
    } else {
        0.0
    };
    Ok(r)
}

/// The daemon's RSS once the guests' departure has been handled: read until it stops
/// falling (at most 5 s; the daemon releases a guest's memory on its own threads).
fn settled_rss(pid: Option<u32>, before: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = rss_kib(pid);
    while Instant::now() < deadline && last > before + before / 10 {
        std::thread::sleep(Duration::from_millis(200));
        let now = rss_kib(pid);
        if now >= last {
            return now;
        }
        last = now;
    }
    last
}
