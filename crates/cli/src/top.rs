//! `virtsoc top`: a live table of the daemon's guests (refreshing in the terminal) or one
//! JSON snapshot (`--json`), from the control API: per guest and device the device time (and
//! its share of the refresh interval), requests, policy refusals and queue depth, plus the
//! memory its regions hold, the bytes copied for it, and its presented and dropped frames.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use virtsoc_control::client::{request, Target};
use virtsoc_control::GuestInfo;

use crate::CliError;

/// One guest's row.
#[derive(Debug, Clone, Serialize)]
pub struct TopGuest {
    pub id: u64,
    pub name: String,
    pub transport: String,
    pub regions: u64,
    pub bytes: u64,
    /// Bytes copied for it, all links.
    pub copy_bytes: u64,
    pub presented: u64,
    pub dropped: u64,
    pub devices: BTreeMap<String, TopDevice>,
}

/// One guest on one device.
#[derive(Debug, Clone, Serialize)]
pub struct TopDevice {
    pub requests: u64,
    pub device_ns: u64,
    pub denied: u64,
    pub queued: u64,
    /// Device time over the last interval as a fraction of the interval (absent on the
    /// first sample).
    pub utilization: Option<f64>,
}

fn get(target: &Target, path: &str) -> Result<String, CliError> {
    let r = request(target, "GET", path, b"")?;
    if r.status != 200 {
        return Err(CliError::Usage(format!(
            "control API {path}: {} {}",
            r.status, r.body
        )));
    }
    Ok(r.body)
}

/// `(guest, metric) -> value` of the display's frame counters in the Prometheus text.
fn frames(metrics: &str) -> BTreeMap<(u64, &'static str), u64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines() {
        for (metric, key) in [
            ("virtsoc_display_presented_frames_total{", "presented"),
            ("virtsoc_display_dropped_frames_total{", "dropped"),
        ] {
            let Some(rest) = line.strip_prefix(metric) else {
                continue;
            };
            let guest = rest
                .split("guest=\"")
                .nth(1)
                .and_then(|s| s.split('"').next())
                .and_then(|s| s.parse().ok());
            let value = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
            if let (Some(g), Some(v)) = (guest, value) {
                out.insert((g, key), v as u64);
            }
        }
    }
    out
}

/// One sample of every guest; `prev` (the last sample and its time) gives utilizations.
pub fn sample(
    target: &Target,
    prev: Option<(&[TopGuest], Instant)>,
) -> Result<Vec<TopGuest>, CliError> {
    let now = Instant::now();
    let guests: Vec<GuestInfo> = serde_json::from_str(&get(target, "/guests")?)?;
    let metrics = get(target, "/metrics").unwrap_or_default();
    let fr = frames(&metrics);
    Ok(guests
        .into_iter()
        .map(|g| {
            let before = prev.and_then(|(p, t)| p.iter().find(|x| x.id == g.id).map(|x| (x, t)));
            let devices = g
                .device_use
                .iter()
                .map(|(name, u)| {
                    let utilization = before.map(|(b, t)| {
                        let was = b.devices.get(name).map_or(0, |d| d.device_ns);
                        let dt = now.duration_since(t).as_nanos().max(1) as f64;
                        u.device_ns.saturating_sub(was) as f64 / dt
                    });
                    let d = TopDevice {
                        requests: u.requests,
                        device_ns: u.device_ns,
                        denied: u.denied,
                        queued: u.queued,
                        utilization,
                    };
                    (name.clone(), d)
                })
                .collect();
            TopGuest {
                presented: fr.get(&(g.id, "presented")).copied().unwrap_or(0),
                dropped: fr.get(&(g.id, "dropped")).copied().unwrap_or(0),
                copy_bytes: g.links.iter().map(|l| l.bytes).sum(),
                id: g.id,
                name: g.name,
                transport: g.transport,
                regions: g.regions,
                bytes: g.bytes,
                devices,
            }
        })
        .collect())
}

fn print_table(guests: &[TopGuest]) {
    println!(
        "{:>5} {:<16} {:<8} {:>9} {:>10} {:>7} {:>7}  device: util% time_ms requests denied queued",
        "guest", "name", "device", "regions", "MiB", "shown", "dropped"
    );
    for g in guests {
        let mut first = true;
        let devs: Vec<_> = g.devices.iter().collect();
        if devs.is_empty() {
            println!(
                "{:>5} {:<16.16} {:<8} {:>9} {:>10.1} {:>7} {:>7}",
                g.id,
                g.name,
                "-",
                g.regions,
                g.bytes as f64 / (1 << 20) as f64,
                g.presented,
                g.dropped
            );
        }
        for (name, d) in devs {
            let util = d
                .utilization
                .map_or("-".to_string(), |u| format!("{:.1}", u * 100.0));
            if first {
                print!(
                    "{:>5} {:<16.16} {:<8} {:>9} {:>10.1} {:>7} {:>7}",
                    g.id,
                    g.name,
                    name,
                    g.regions,
                    g.bytes as f64 / (1 << 20) as f64,
                    g.presented,
                    g.dropped
                );
                first = false;
            } else {
                print!("{:>5} {:<16} {:<8} {:>43}", "", "", name, "");
            }
            println!(
                "  {:>6} {:>9.1} {:>8} {:>6} {:>6}",
                util,
                d.device_ns as f64 / 1e6,
                d.requests,
                d.denied,
                d.queued
            );
        }
    }
}

/// Runs `virtsoc top`: `count` refreshes (forever if `None`) every `interval`, or one JSON
/// snapshot (two samples `interval` apart, so utilizations are filled in).
pub fn run(
    target: &Target,
    json: bool,
    interval: Duration,
    count: Option<u64>,
) -> Result<(), CliError> {
    let mut prev = sample(target, None)?;
    let mut at = Instant::now();
    if json {
        std::thread::sleep(interval);
        let now = sample(target, Some((&prev, at)))?;
        println!("{}", serde_json::to_string_pretty(&now)?);
        return Ok(());
    }
    let mut n = 0u64;
    loop {
        std::thread::sleep(interval);
        let now = sample(target, Some((&prev, at)))?;
        at = Instant::now();
        print!("\x1b[2J\x1b[H");
        print_table(&now);
        prev = now;
        n += 1;
        if count.is_some_and(|c| n >= c) {
            return Ok(());
        }
    }
}
