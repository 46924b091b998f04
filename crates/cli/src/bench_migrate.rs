//! `virtsoc bench migrate`: snapshot and restore of a guest holding 256 MiB of regions (time
//! and file size), and a live migration between two daemons of a guest holding 64 MiB of
//! regions that a 60 fps frame loop keeps writing (4 MiB per frame) through the pre-copy and
//! the stop, while the same guest runs the camera scenario (`virtsoc run camera`: camera ->
//! ISP -> display at 30 fps, 360p): host-side stop time, guest-observed downtime (the longest
//! gap between two written frames), camera frames dropped as the display counts them
//! (captured minus scanned out), and whether every region's bytes are identical after the
//! restore and after the migration.
//!
//! Both daemons are started by the benchmark (null GPU and ISP backends: the regions live in
//! host RAM and the guest window), with a migration listener and a token each.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};
use virtsoc_control::client::{control_path, request, Target};
use virtsoc_guest::{AccessMode, ConnectOptions, Connection, DeviceId};

use crate::daemon_proc::DaemonProcess;
use crate::CliError;

const MIB: u64 = 1 << 20;
/// One frame period at 60 fps.
const FRAME: Duration = Duration::from_nanos(16_666_667);
/// How long the camera scenario runs (the migration starts 0.5 s into it).
const CAMERA_SECONDS: f64 = 3.0;

#[derive(Debug, Clone, Default, Serialize)]
pub struct SnapshotResult {
    pub region_bytes: u64,
    pub file_bytes: u64,
    pub save_ms: u64,
    pub restore_ms: u64,
    pub identical: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct MigrateResult {
    pub snapshot: SnapshotResult,
    /// Bytes of regions the migrated guest holds.
    pub migrated_region_bytes: u64,
    /// The source's report (pre-copy, dirty part, stop time).
    pub migration: Value,
    /// Longest gap between two completed frames of the 60 fps writer around the migration,
    /// as the guest saw it (the stop, the hand-over and the library's reconnect).
    pub downtime_ms: f64,
    /// Camera frames (the camera scenario, camera -> ISP -> display at 30 fps on the
    /// migrated guest, running across the migration) that never reached the screen: frames
    /// captured minus frames the display scanned out (its counters move with the guest).
    pub frames_dropped: u64,
    /// Of those: frames the guest dropped itself for being more than a frame late (the
    /// downtime), the rest the display replaced or never showed.
    pub frames_dropped_late: u64,
    /// Camera frames captured, and scanned out by the display.
    pub frames: u64,
    pub frames_presented: u64,
    /// Whether the camera scenario was still running when the guest was handed over (it
    /// runs a fixed time; a slow pre-copy could outlast it).
    pub camera_spanned_migration: bool,
    /// The 60 fps writer: frames written, and slots that went by without one.
    pub writer_frames: u64,
    pub writer_frames_dropped: u64,
    /// Every region's bytes equal to what was written: after the restore and after the
    /// migration.
    pub regions_identical: bool,
}

fn free_port() -> Result<u16, CliError> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn spawn(port: u16) -> Result<DaemonProcess, CliError> {
    let addr = format!("127.0.0.1:{port}");
    DaemonProcess::spawn(
        &[
            "--gpu-backend",
            "null",
            "--isp-backend",
            "null",
            "--migrate-listen",
            &addr,
        ],
        true,
    )
}

fn control(d: &DaemonProcess, path: &str, body: Value) -> Result<Value, CliError> {
    let socket = std::path::PathBuf::from(d.endpoint().target);
    let r = request(
        &Target::Unix(control_path(&socket)),
        "POST",
        path,
        body.to_string().as_bytes(),
    )?;
    if r.status != 200 {
        return Err(CliError::Usage(format!("{path}: {}", r.body)));
    }
    Ok(r.json())
}

fn connect(d: &DaemonProcess, window: u64) -> Result<Connection, CliError> {
    Ok(Connection::connect(
        d.endpoint().target,
        &ConnectOptions {
            name: "bench-migrate".into(),
            window_size: window,
            ..ConnectOptions::default()
        },
    )?)
}

/// Bytes that differ per seed (their first 8 bytes are the seed; the rest repeats a
/// 256-byte block derived from it).
fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let block: Vec<u8> = (0..256u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9).wrapping_add(seed * 131) as u8)
        .collect();
    let mut v: Vec<u8> = Vec::with_capacity(n);
    while v.len() < n {
        let k = (n - v.len()).min(block.len());
        v.extend_from_slice(&block[..k]);
    }
    let s = seed.to_le_bytes();
    let k = n.min(8);
    v[..k].copy_from_slice(&s[..k]);
    v
}

fn write(c: &Connection, id: u64, bytes: &[u8]) -> Result<(), CliError> {
    let len = bytes.len() as u64;
    let a = c.begin_access(id, DeviceId::CPU, 0, len, AccessMode::Write)?;
    let p = a
        .ptr
        .ok_or_else(|| CliError::Usage("no CPU pointer".into()))?;
    // SAFETY: the pointer covers `len` bytes of the window until end_access.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.as_ptr(), bytes.len()) };
    c.end_access(id, DeviceId::CPU, 0, len, AccessMode::Write)?;
    Ok(())
}

fn read(c: &Connection, id: u64, len: usize) -> Result<Vec<u8>, CliError> {
    let a = c.begin_access(id, DeviceId::CPU, 0, len as u64, AccessMode::Read)?;
    let p = a
        .ptr
        .ok_or_else(|| CliError::Usage("no CPU pointer".into()))?;
    let mut out = vec![0u8; len];
    // SAFETY: the pointer covers `len` bytes of the window until end_access.
    unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), out.as_mut_ptr(), len) };
    c.end_access(id, DeviceId::CPU, 0, len as u64, AccessMode::Read)?;
    Ok(out)
}

/// Snapshot of 256 MiB of regions on `a`, restored into a fresh guest of `b`.
fn snapshot(a: &DaemonProcess, b: &DaemonProcess) -> Result<SnapshotResult, CliError> {
    let (n, size) = (16usize, 16 * MIB);
    let g = connect(a, (n as u64 + 8) * size)?;
    let mut regions = Vec::new();
    for i in 0..n {
        let r = g.alloc_blob(size)?;
        let bytes = pattern(size as usize, i as u64 + 1);
        write(&g, r.id, &bytes)?;
        regions.push((r.id, crc32fast::hash(&bytes)));
    }
    let file = std::env::temp_dir().join(format!("virtsoc-bench-{}.snap", std::process::id()));
    let path = file.display().to_string();
    let saved = control(
        a,
        &format!("/guests/{}/snapshot", g.guest_id()),
        json!({ "path": path }),
    )?;
    let h = connect(b, (n as u64 + 8) * size)?;
    let loaded = control(
        b,
        &format!("/guests/{}/restore", h.guest_id()),
        json!({ "path": path }),
    )?;
    let mut identical = true;
    for (id, crc) in &regions {
        identical &= crc32fast::hash(&read(&h, *id, size as usize)?) == *crc;
    }
    let _ = std::fs::remove_file(&file);
    Ok(SnapshotResult {
        region_bytes: n as u64 * size,
        file_bytes: saved["file_bytes"].as_u64().unwrap_or(0),
        save_ms: saved["ms"].as_u64().unwrap_or(0),
        restore_ms: loaded["ms"].as_u64().unwrap_or(0),
        identical,
    })
}

/// Runs the benchmark.
pub fn run() -> Result<MigrateResult, CliError> {
    let (pa, pb) = (free_port()?, free_port()?);
    let a = spawn(pa)?;
    let b = spawn(pb)?;
    let mut out = MigrateResult {
        snapshot: snapshot(&a, &b)?,
        ..MigrateResult::default()
    };

    // 64 MiB of regions, a 60 fps loop writing 4 MiB frames into them in turn.
    let (n, size) = (16usize, 4 * MIB);
    let g = Arc::new(connect(&a, 192 * MIB)?);
    g.set_auto_reconnect(Some(Duration::from_secs(30)));
    let mut ids = Vec::new();
    for i in 0..n {
        let r = g.alloc_blob(size)?;
        write(&g, r.id, &pattern(size as usize, i as u64))?;
        ids.push(r.id);
    }
    out.migrated_region_bytes = n as u64 * size;
    let seeds: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new((0..n as u64).collect()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (g, ids, seeds, stop) = (g.clone(), ids.clone(), seeds.clone(), stop.clone());
        std::thread::spawn(move || -> Result<(Vec<Instant>, u64), CliError> {
            let t0 = Instant::now();
            let mut done = Vec::new();
            let mut frame = 0u64;
            let mut slots_missed = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let slot = t0 + FRAME * frame as u32;
                let now = Instant::now();
                if now < slot {
                    std::thread::sleep(slot - now);
                }
                let k = frame as usize % ids.len();
                let seed = 1000 + frame;
                let bytes = pattern(size as usize, seed);
                // A frame whose request was in flight when the daemon handed the guest over
                // fails; it is written again on the new daemon.
                let mut tries = 0;
                while let Err(e) = write(&g, ids[k], &bytes) {
                    tries += 1;
                    if tries > 100 {
                        return Err(e);
                    }
                }
                seeds.lock().unwrap_or_else(|p| p.into_inner())[k] = seed;
                done.push(Instant::now());
                frame += 1;
                // Slots that went by without a frame are dropped frames.
                let behind = (t0.elapsed().as_nanos() / FRAME.as_nanos()) as u64;
                if behind > frame {
                    slots_missed += behind - frame;
                    frame = behind;
                }
            }
            Ok((done, slots_missed))
        })
    };
    // The camera scenario (camera -> ISP -> display, 30 fps) on the same guest, across the
    // migration; its frames are counted at the display, whose counters move with the guest.
    let camera = {
        let g = g.clone();
        let opts = crate::scenario::RunOpts {
            scenario: "camera".into(),
            protocol: g.coherence().to_string(),
            ordering: crate::bench_svm::OrderingMode::Fence,
            seconds: CAMERA_SECONDS,
            width: 640,
            height: 360,
            fps: 30,
            composition: crate::scenario::show::Composition::Planes,
            pacing: crate::scenario::Pacing::default(),
        };
        std::thread::spawn(move || crate::scenario::run_on(&g, None, &opts))
    };
    let camera_t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let target_token = b
        .endpoint()
        .remote
        .map(|(_, t)| t)
        .ok_or_else(|| CliError::Usage("target daemon has no token".into()))?;
    out.migration = control(
        &a,
        &format!("/guests/{}/migrate", g.guest_id()),
        json!({ "to": format!("127.0.0.1:{pb}"), "token": target_token }),
    )?;
    // The hand-over is done; the guest is stopped until it resumes at the target, which
    // its next request (the writer's or the camera's) makes it do at once.
    out.camera_spanned_migration = camera_t0.elapsed().as_secs_f64() + 0.2 < CAMERA_SECONDS;
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    let (done, missed) = writer
        .join()
        .map_err(|_| CliError::Usage("frame loop panicked".into()))??;
    let cam = camera
        .join()
        .map_err(|_| CliError::Usage("camera scenario panicked".into()))??;
    out.frames = cam.frames_in;
    out.frames_presented = cam.presented;
    out.frames_dropped = cam.frames_in.saturating_sub(cam.presented);
    out.frames_dropped_late = cam.dropped_late;
    out.writer_frames = done.len() as u64;
    out.writer_frames_dropped = missed;
    out.downtime_ms = done
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        .fold(0.0, f64::max);
    let seeds = seeds.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut identical = out.snapshot.identical;
    for (k, id) in ids.iter().enumerate() {
        identical &= read(&g, *id, size as usize)? == pattern(size as usize, seeds[k]);
    }
    out.regions_identical = identical;
    drop(g);
    drop(b);
    drop(a);
    Ok(out)
}

pub fn print(r: &MigrateResult) {
    println!(
        "snapshot of {} MiB: save {} ms, file {} MiB, restore {} ms, identical {}",
        r.snapshot.region_bytes >> 20,
        r.snapshot.save_ms,
        r.snapshot.file_bytes >> 20,
        r.snapshot.restore_ms,
        r.snapshot.identical
    );
    println!(
        "live migration of {} MiB written at 60 fps: {}",
        r.migrated_region_bytes >> 20,
        r.migration
    );
    println!(
        "downtime {:.1} ms (longest gap between written frames; {} of {} dropped), camera -> ISP -> display: {} of {} frames not shown, regions identical: {}",
        r.downtime_ms,
        r.writer_frames_dropped,
        r.writer_frames + r.writer_frames_dropped,
        r.frames_dropped,
        r.frames,
        r.regions_identical
    );
}
