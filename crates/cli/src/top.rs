//! `virtsoc top`: a live table of the daemon's guests (refreshing in the terminal) or one
//! JSON snapshot (`--json`), from the control API: per guest and device the device time (and
//! its share of the refresh interval), requests, policy refusals and queue depth, plus the
//! memory its regions hold, the bytes copied for it, its presented and dropped frames, and
//! its CPU weight where the daemon steers CPU weights (`virtsocd --cpu-cgroup`).

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
    /// Its CPU weight (`cpu.weight` or `cpu.shares`), where the daemon steers CPU weights
    /// and the guest has a group (absent, `null`, otherwise).
    pub cpu_weight: Option<u64>,
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
            row(g, &fr, before.map(|(b, t)| (b, now.duration_since(t))))
        })
        .collect())
}

/// One guest's row from its control API entry, the display's frame counters and, if it was
/// in the last sample, that row and how long ago it was taken (for utilizations).
fn row(
    g: GuestInfo,
    fr: &BTreeMap<(u64, &'static str), u64>,
    before: Option<(&TopGuest, Duration)>,
) -> TopGuest {
    let devices = g
        .device_use
        .iter()
        .map(|(name, u)| {
            let utilization = before.map(|(b, dt)| {
                let was = b.devices.get(name).map_or(0, |d| d.device_ns);
                u.device_ns.saturating_sub(was) as f64 / dt.as_nanos().max(1) as f64
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
        cpu_weight: g.cpu_weight,
        id: g.id,
        name: g.name,
        transport: g.transport,
        regions: g.regions,
        bytes: g.bytes,
        devices,
    }
}

/// The table: one line per guest and device (the guest's columns on its first line).
fn table(guests: &[TopGuest]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>5} {:<16} {:>6} {:<8} {:>9} {:>10} {:>7} {:>7}  device: util% time_ms requests denied queued",
        "guest", "name", "cpu_w", "device", "regions", "MiB", "shown", "dropped"
    );
    for g in guests {
        let cpu = g.cpu_weight.map_or("-".to_string(), |w| w.to_string());
        let head = format!("{:>5} {:<16.16} {:>6}", g.id, g.name, cpu);
        let tail = format!(
            "{:>9} {:>10.1} {:>7} {:>7}",
            g.regions,
            g.bytes as f64 / (1 << 20) as f64,
            g.presented,
            g.dropped
        );
        if g.devices.is_empty() {
            let _ = writeln!(out, "{head} {:<8} {tail}", "-");
        }
        for (i, (name, d)) in g.devices.iter().enumerate() {
            let util = d
                .utilization
                .map_or("-".to_string(), |u| format!("{:.1}", u * 100.0));
            if i == 0 {
                let _ = write!(out, "{head} {name:<8} {tail}");
            } else {
                let _ = write!(
                    out,
                    "{:w1$} {name:<8} {:w2$}",
                    "",
                    "",
                    w1 = head.len(),
                    w2 = tail.len()
                );
            }
            let _ = writeln!(
                out,
                "  {:>6} {:>9.1} {:>8} {:>6} {:>6}",
                util,
                d.device_ns as f64 / 1e6,
                d.requests,
                d.denied,
                d.queued
            );
        }
    }
    out
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
        print!("\x1b[2J\x1b[H{}", table(&now));
        prev = now;
        n += 1;
        if count.is_some_and(|c| n >= c) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtsoc_control::DeviceUse;

    fn info(id: u64, cpu_weight: Option<u64>) -> GuestInfo {
        let json = serde_json::json!({
            "id": id, "name": format!("g{id}"), "transport": "unix", "protocol": "prefetch",
            "regions": 1, "bytes": 4096, "links": [], "commands": {},
            "counters": serde_json::to_value(virtsoc_control::Counters::default()).unwrap(),
        });
        let mut g: GuestInfo = serde_json::from_value(json).unwrap();
        g.device_use.insert(
            "gpu".into(),
            DeviceUse {
                requests: 3,
                device_ns: 2_000_000,
                denied: 0,
                queued: 1,
            },
        );
        g.cpu_weight = cpu_weight;
        g
    }

    #[test]
    fn cpu_weight_is_a_column_and_in_the_json() {
        let fr = BTreeMap::new();
        let steered = row(info(1, Some(3072)), &fr, None);
        let plain = row(info(2, None), &fr, None);
        assert_eq!(steered.cpu_weight, Some(3072));
        let t = table(&[steered.clone(), plain.clone()]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("cpu_w"), "{t}");
        assert!(lines[1].contains(" 3072 "), "{t}");
        let cols: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(&cols[..4], &["2", "g2", "-", "gpu"], "{t}");
        let j = serde_json::to_value(&steered).unwrap();
        assert_eq!(j["cpu_weight"], 3072);
        assert!(serde_json::to_value(&plain).unwrap()["cpu_weight"].is_null());
    }

    #[test]
    fn utilization_is_device_time_over_the_interval() {
        let fr = BTreeMap::new();
        let mut first = row(info(1, None), &fr, None);
        assert!(first.devices["gpu"].utilization.is_none());
        first.devices.get_mut("gpu").unwrap().device_ns = 1_000_000;
        let next = row(
            info(1, None),
            &fr,
            Some((&first, Duration::from_millis(10))),
        );
        let u = next.devices["gpu"].utilization.unwrap();
        assert!((u - 0.1).abs() < 1e-9, "{u}");
    }
}
