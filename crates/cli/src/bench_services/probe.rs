//! `virtsoc debug services`: one guest calls each host service over channels of its own,
//! several at once, and prints what it got as JSON: the location fix and its NMEA, a sensor's
//! value and samples at a rate it asks for (a call that waits on the host), the clipboard
//! both ways, and the bulk service's echo and a transfer of `size` bytes in 64 KiB packets
//! (checked with a CRC by the host, and drained in place), while the sensor waits. The VM
//! test (`crates/cli/tests/vm.rs`) runs it inside a VM and checks each answer
//! against what the host set.

use std::time::Instant;

use serde_json::{json, Value};
use virtsoc_guest::services::payload::word_sum;
use virtsoc_guest::services::{bulk, Bulk, Clipboard, Geo, Sensors};
use virtsoc_guest::{ConnectOptions, Connection};

use crate::CliError;

/// The bulk payload: the same bytes the caller can recompute.
pub fn payload(size: u64) -> Vec<u8> {
    (0..size).map(|i| (i * 31 % 251) as u8).collect()
}

fn sensor(conn: &Connection) -> Result<Value, CliError> {
    let mut s = Sensors::open(conn)?;
    let v = s.read("accelerometer")?;
    let rate = s.set_rate("accelerometer", 50)?;
    let mut seqs = Vec::new();
    for _ in 0..3 {
        seqs.push(s.sample("accelerometer")?.seq);
    }
    s.0.close()?;
    Ok(json!({"accelerometer": [v.x, v.y, v.z], "rate": rate, "samples": seqs}))
}

fn bulk_calls(conn: &Connection, size: u64) -> Result<Value, CliError> {
    let mut b = Bulk::open(conn, 8)?;
    let msg: Vec<u8> = (0..200u8).collect();
    let echo_ok = b.echo(&msg)? == msg;
    let data = payload(size);
    let t0 = Instant::now();
    let r = b.0.send_checked(bulk::call::SINK, &data)?.values;
    let sink_s = t0.elapsed().as_secs_f64();
    let d = b.0.call(bulk::call::DRAIN, &data)?.values;
    b.0.close()?;
    Ok(json!({
        "echo_ok": echo_ok,
        "bytes": size,
        "packets": size.div_ceil(u64::from(virtsoc_guest::services::packet::PACKET_SIZE)),
        "sink": {"crc": r[0] as u32, "len": r[1], "want_crc": crc32fast::hash(&data)},
        "drain": {"len": d[0], "sum": d[1], "want_sum": word_sum(&data)},
        "sink_seconds": sink_s,
    }))
}

/// Calls every service once from a guest of `target` and returns what it got.
pub fn run(target: &str, clipboard_text: &str, size: u64) -> Result<Value, CliError> {
    let opts = ConnectOptions {
        name: "services-probe".into(),
        ..ConnectOptions::default()
    };
    let conn = Connection::open(target, &opts)?;
    // Three channels open at once (a fourth and fifth come and go in the threads below).
    let mut geo = Geo::open(&conn)?;
    let mut clip = Clipboard::open(&conn)?;
    let fix = geo.fix()?;
    let nmea = geo.nmea()?;
    let (before, _) = clip.get()?;
    let version = clip.set(clipboard_text)?;
    let (after, _) = clip.get()?;
    // A sensor's samples (the guest sleeps until the host's next one) and a bulk transfer
    // at once: two sleepers of the connection on its one port.
    let (s, b) = std::thread::scope(|sc| {
        let s = sc.spawn(|| sensor(&conn));
        let b = sc.spawn(|| bulk_calls(&conn, size));
        let join = |h: std::thread::ScopedJoinHandle<'_, Result<Value, CliError>>| {
            h.join()
                .unwrap_or_else(|_| Err(CliError::Usage("a probe thread panicked".into())))
        };
        (join(s), join(b))
    });
    geo.0.close()?;
    clip.0.close()?;
    Ok(json!({
        "guest": conn.guest_id(),
        "geo": fix.map(|f| json!({"lon": f.lon, "lat": f.lat, "alt": f.alt})),
        "nmea": nmea,
        "clipboard": {"before": before, "after": after, "version": version},
        "sensor": s?,
        "bulk": b?,
    }))
}
