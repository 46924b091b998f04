//! `virtsoc bench migrate`: snapshot and restore of a guest holding 256 MiB of regions (time
//! and file size), and a live migration between two daemons of a guest holding 64 MiB of
//! regions that a 60 fps frame loop keeps writing (4 MiB per frame) through the pre-copy and
//! the stop, while the same guest runs the camera scenario (`virtsoc run camera`: camera ->
//! ISP -> display at 30 fps, 360p): host-side stop time, guest-observed downtime (the longest
//! gap between two written frames), camera frames dropped as the display counts them
//! (captured minus scanned out), and whether every region's bytes are identical after the
//! restore and after the migration.
//!
//! Both daemons are started by the benchmark with the devices' default backends (the GPU's
//! wgpu, or its CPU backend where no adapter opens, and the ISP's), with a migration
//! listener and a token each. Before the snapshot and before the migration the guest has
//! the GPU compose [`GPU_PAIRS`] random images into destination regions it never reads: their
//! only valid replica is then resident in the GPU's memory (the ledger's copies out of the
//! GPU's domain, `gpu_readback_bytes_before`, say none was read back), so the snapshot and
//! the migration must read them back from the device and move them.
//!
//! Integrity: every region holds a seeded random fill (no two blocks alike) and is checked
//! per [`BLOCK`]-byte block against a CRC-32 of the block's offset and bytes, so a block
//! that arrives at another offset, in the same region or another, fails (a fill that repeats
//! every 256 bytes, as until issue 27, passed a displaced block); `bad_blocks` counts them.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};
use virtsoc_control::client::{control_path, request, Target};
use virtsoc_guest::devices as api;
use virtsoc_guest::{AccessMode, ConnectOptions, Connection, DeviceId, Format};

use crate::bench_svm::OrderingMode;
use crate::daemon_proc::DaemonProcess;
use crate::scenario::full_layer;
use crate::scenario::pipe::Pipe;
use crate::CliError;
use virtsoc_devapi::RegionId;
use virtsoc_sync::LockExt;

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
    /// The GPU-written regions saved (their only valid replica in the GPU's memory).
    pub gpu: GpuRegions,
}

/// Regions the GPU wrote and the guest never read, before a save or a migration.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GpuRegions {
    /// The GPU's backend as the daemon lists it.
    pub backend: String,
    pub regions: u64,
    pub bytes: u64,
    /// Bytes the guest's ledger counted copied into the GPU's memory domain before the save
    /// or migration (the sources' uploads: the GPU worked in its own memory).
    pub upload_bytes_before: u64,
    /// Bytes the guest's ledger counted copied out of the GPU's memory domain before the
    /// save or migration: 0 means the compositions' results were resident there only.
    pub readback_bytes_before: u64,
    /// The same after the save (the saved guest's ledger; `None` after a migration, whose
    /// source guest is gone): the save's readback out of the GPU's memory shows here.
    pub readback_bytes_after: Option<u64>,
    /// Every block of them equal to the composed source after the restore or migration.
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
    /// migration, GPU-written regions included.
    pub regions_identical: bool,
    /// The GPU-written regions migrated.
    pub migrated_gpu: GpuRegions,
    /// Integrity blocks checked (snapshot and migration) and those that failed.
    pub blocks_checked: u64,
    pub bad_blocks: u64,
    /// The ISP's backend on the source daemon, as listed.
    pub isp_backend: String,
}

fn free_port() -> Result<u16, CliError> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A daemon with the devices' default backends and a migration listener on `port`.
fn spawn(port: u16) -> Result<DaemonProcess, CliError> {
    let addr = format!("127.0.0.1:{port}");
    DaemonProcess::spawn(&["--migrate-listen", &addr], true)
}

/// The backend and memory domain daemon `d` lists for device `name`.
fn device_info(d: &DaemonProcess, name: &str) -> Result<(String, String), CliError> {
    let socket = std::path::PathBuf::from(d.endpoint().target);
    let r = request(&Target::Unix(control_path(&socket)), "GET", "/devices", b"")?;
    let devices: Vec<virtsoc_control::DeviceInfo> = serde_json::from_str(&r.body)?;
    devices
        .into_iter()
        .find(|x| x.name == name)
        .map(|x| (x.backend, x.domain))
        .ok_or_else(|| CliError::Usage(format!("the daemon lists no {name} device")))
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

/// `n` bytes of a seeded random fill (splitmix64): no two blocks alike, within a region or
/// across seeds.
fn fill(n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed ^ 0x6a09_e667_f3bc_c908;
    let mut v: Vec<u8> = Vec::with_capacity(n + 8);
    while v.len() < n {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        v.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    v.truncate(n);
    v
}

/// The integrity check's block: a page, the unit a misplaced copy would move.
const BLOCK: usize = 4096;

/// Each [`BLOCK`]'s CRC-32 over its offset (little-endian u64) and its bytes.
fn block_sums(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks(BLOCK)
        .enumerate()
        .map(|(i, b)| {
            let mut h = crc32fast::Hasher::new();
            h.update(&((i * BLOCK) as u64).to_le_bytes());
            h.update(b);
            h.finalize()
        })
        .collect()
}

/// How many blocks of `got` fail `want` (the sums of what was written): a block whose
/// sum differs, and every block missing or extra.
fn bad_blocks(want: &[u32], got: &[u8]) -> u64 {
    let sums = block_sums(got);
    let differ = want.iter().zip(&sums).filter(|(a, b)| a != b).count();
    (differ + want.len().abs_diff(sums.len())) as u64
}

/// Checks tallied over regions: blocks checked and failed.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    checked: u64,
    bad: u64,
}

impl Tally {
    /// Checks region `id` of `c` (`len` bytes) against `want`; true if every block passed.
    fn check(
        &mut self,
        c: &Connection,
        id: RegionId,
        len: usize,
        want: &[u32],
    ) -> Result<bool, CliError> {
        let bad = bad_blocks(want, &read(c, id, len)?);
        self.checked += want.len() as u64;
        self.bad += bad;
        Ok(bad == 0)
    }
}

/// Images the GPU composes before a save or a migration, and their size.
const GPU_PAIRS: usize = 2;
const GPU_SIZE: (u32, u32) = (1280, 720);

/// The GPU-written regions of a guest: (destination, the sums of its source's fill).
struct GpuWritten {
    dsts: Vec<(RegionId, Vec<u32>)>,
    len: usize,
}

/// Has the GPU of `c` compose [`GPU_PAIRS`] random images (seeds from `seed`) into
/// destinations the guest does not read, so their valid replica is the GPU's only.
fn gpu_write(c: &Connection, seed: u64) -> Result<GpuWritten, CliError> {
    let (w, h) = GPU_SIZE;
    let len = w as usize * h as usize * 4;
    let mut p = Pipe::new(c, OrderingMode::Atomic);
    let mut dsts = Vec::new();
    for k in 0..GPU_PAIRS {
        let src = c.alloc(0, w, h, Format::Rgba8, 0)?.id;
        let dst = c.alloc(0, w, h, Format::Rgba8, 0)?.id;
        let layers = c.alloc_blob(api::LAYER_RECORD as u64)?.id;
        let bytes = fill(len, seed + k as u64);
        p.cpu_write(src, &bytes)?;
        p.cpu_write(layers, &full_layer(src, w, h, false).to_bytes())?;
        let t = p.run_with(
            &api::gpu::Composite {
                layers,
                count: 1,
                dst,
            },
            &[src],
        )?;
        p.result(t)?;
        dsts.push((dst, block_sums(&bytes)));
    }
    Ok(GpuWritten { dsts, len })
}

/// Bytes the ledger of `c` counts copied out of memory domain `domain` (readbacks).
fn readback_bytes(c: &Connection, domain: &str) -> Result<u64, CliError> {
    Ok(c.ledger()?
        .iter()
        .filter(|l| l.src != l.dst && c.domain_name(l.src) == domain)
        .map(|l| l.bytes)
        .sum())
}

/// Bytes the ledger of `c` counts copied into memory domain `domain` (uploads).
fn upload_bytes(c: &Connection, domain: &str) -> Result<u64, CliError> {
    Ok(c.ledger()?
        .iter()
        .filter(|l| l.src != l.dst && c.domain_name(l.dst) == domain)
        .map(|l| l.bytes)
        .sum())
}

/// What `gpu` looks like on `c` (where the regions now are) after the move.
fn gpu_check(
    c: &Connection,
    gpu: &GpuWritten,
    backend: String,
    (upload_bytes_before, readback_bytes_before): (u64, u64),
    tally: &mut Tally,
) -> Result<GpuRegions, CliError> {
    let mut identical = true;
    for (id, sums) in &gpu.dsts {
        identical &= tally.check(c, *id, gpu.len, sums)?;
    }
    Ok(GpuRegions {
        backend,
        regions: gpu.dsts.len() as u64,
        bytes: (gpu.dsts.len() * gpu.len) as u64,
        upload_bytes_before,
        readback_bytes_before,
        readback_bytes_after: None,
        identical,
    })
}

fn write(c: &Connection, id: RegionId, bytes: &[u8]) -> Result<(), CliError> {
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

fn read(c: &Connection, id: RegionId, len: usize) -> Result<Vec<u8>, CliError> {
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

/// Snapshot of 256 MiB of regions on `a` (and the GPU-written ones), restored into a fresh
/// guest of `b`.
fn snapshot(
    a: &DaemonProcess,
    b: &DaemonProcess,
    tally: &mut Tally,
) -> Result<SnapshotResult, CliError> {
    let (n, size) = (16usize, 16 * MIB);
    let g = connect(a, (n as u64 + 8) * size)?;
    let mut regions = Vec::new();
    for i in 0..n {
        let r = g.alloc_blob(size)?;
        let bytes = fill(size as usize, i as u64 + 1);
        write(&g, r.id, &bytes)?;
        regions.push((r.id, block_sums(&bytes)));
    }
    let gpu = gpu_write(&g, 500)?;
    let (gpu_backend, gpu_domain) = device_info(a, "gpu")?;
    let before = (
        upload_bytes(&g, &gpu_domain)?,
        readback_bytes(&g, &gpu_domain)?,
    );
    let file = std::env::temp_dir().join(format!("virtsoc-bench-{}.snap", std::process::id()));
    let path = file.display().to_string();
    let saved = control(
        a,
        &format!("/guests/{}/snapshot", g.guest_id()),
        json!({ "path": path }),
    )?;
    let readback_after = readback_bytes(&g, &gpu_domain)?;
    let h = connect(b, (n as u64 + 8) * size)?;
    let loaded = control(
        b,
        &format!("/guests/{}/restore", h.guest_id()),
        json!({ "path": path }),
    )?;
    let mut identical = true;
    for (id, sums) in &regions {
        identical &= tally.check(&h, *id, size as usize, sums)?;
    }
    let mut gpu = gpu_check(&h, &gpu, gpu_backend, before, tally)?;
    gpu.readback_bytes_after = Some(readback_after);
    let _ = std::fs::remove_file(&file);
    Ok(SnapshotResult {
        region_bytes: n as u64 * size + gpu.bytes,
        file_bytes: saved["file_bytes"].as_u64().unwrap_or(0),
        save_ms: saved["ms"].as_u64().unwrap_or(0),
        restore_ms: loaded["ms"].as_u64().unwrap_or(0),
        identical: identical && gpu.identical,
        gpu,
    })
}

/// Runs the benchmark.
pub fn run() -> Result<MigrateResult, CliError> {
    let (pa, pb) = (free_port()?, free_port()?);
    let a = spawn(pa)?;
    let b = spawn(pb)?;
    let mut tally = Tally::default();
    let mut out = MigrateResult {
        snapshot: snapshot(&a, &b, &mut tally)?,
        isp_backend: device_info(&a, "isp")?.0,
        ..MigrateResult::default()
    };

    // 64 MiB of regions, a 60 fps loop writing 4 MiB frames into them in turn.
    let (n, size) = (16usize, 4 * MIB);
    let g = Arc::new(connect(&a, 192 * MIB)?);
    g.set_auto_reconnect(Some(Duration::from_secs(30)));
    let mut ids = Vec::new();
    for i in 0..n {
        let r = g.alloc_blob(size)?;
        write(&g, r.id, &fill(size as usize, i as u64))?;
        ids.push(r.id);
    }
    let gpu = gpu_write(&g, 600)?;
    let (gpu_backend, gpu_domain) = device_info(&a, "gpu")?;
    let gpu_before = (
        upload_bytes(&g, &gpu_domain)?,
        readback_bytes(&g, &gpu_domain)?,
    );
    out.migrated_region_bytes = n as u64 * size + (GPU_PAIRS * gpu.len) as u64;
    let seeds: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new((0..n as u64).collect()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(g.clone(), ids.clone(), seeds.clone(), stop.clone(), size);
    // The camera scenario (camera -> ISP -> display, 30 fps) on the same guest, across the
    // migration; its frames are counted at the display, whose counters move with the guest.
    let camera = spawn_camera(g.clone());
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
    let seeds = seeds.lock_or_recover().clone();
    let mut identical = out.snapshot.identical;
    for (k, id) in ids.iter().enumerate() {
        let want = block_sums(&fill(size as usize, seeds[k]));
        identical &= tally.check(&g, *id, size as usize, &want)?;
    }
    out.migrated_gpu = gpu_check(&g, &gpu, gpu_backend, gpu_before, &mut tally)?;
    out.regions_identical = identical && out.migrated_gpu.identical;
    out.blocks_checked = tally.checked;
    out.bad_blocks = tally.bad;
    drop(g);
    drop(b);
    drop(a);
    Ok(out)
}

/// The frame loop: 60 fps, each frame a fresh fill of the next of `ids` (`size` bytes) whose
/// seed goes to `seeds`, until `stop`; a frame that fails across the hand-over is written
/// again. The frames' completion times and the slots missed.
fn spawn_writer(
    g: Arc<Connection>,
    ids: Vec<RegionId>,
    seeds: Arc<Mutex<Vec<u64>>>,
    stop: Arc<AtomicBool>,
    size: u64,
) -> std::thread::JoinHandle<Result<(Vec<Instant>, u64), CliError>> {
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
            let bytes = fill(size as usize, seed);
            // A frame whose request was in flight when the daemon handed the guest over
            // fails; it is written again on the new daemon.
            let mut tries = 0;
            while let Err(e) = write(&g, ids[k], &bytes) {
                tries += 1;
                if tries > 100 {
                    return Err(e);
                }
            }
            seeds.lock_or_recover()[k] = seed;
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
}

/// The camera scenario on guest `g` for [`CAMERA_SECONDS`], on a thread.
fn spawn_camera(
    g: Arc<Connection>,
) -> std::thread::JoinHandle<Result<crate::scenario::ScenarioResult, CliError>> {
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
    for (what, g) in [
        ("snapshot", &r.snapshot.gpu),
        ("migration", &r.migrated_gpu),
    ] {
        println!(
            "{what}: {} GPU-written regions ({} MiB; before it {} bytes uploaded into the GPU's memory, {} read back from it{}), identical: {}; GPU backend {}",
            g.regions,
            g.bytes >> 20,
            g.upload_bytes_before,
            g.readback_bytes_before,
            g.readback_bytes_after
                .map_or(String::new(), |b| format!(", {b} after")),
            g.identical,
            g.backend
        );
    }
    println!(
        "integrity: {} of {} blocks of {} bytes (random fill, CRC-32 with the offset) failed; ISP backend {}",
        r.bad_blocks, r.blocks_checked, BLOCK, r.isp_backend
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_displaced_block_fails_the_integrity_check() {
        let bytes = fill(8 * BLOCK, 7);
        let want = block_sums(&bytes);
        assert_eq!(bad_blocks(&want, &bytes), 0);
        // Blocks 2 and 5 swapped: both fail.
        let mut got = bytes.clone();
        let (a, b) = got.split_at_mut(5 * BLOCK);
        a[2 * BLOCK..3 * BLOCK].swap_with_slice(&mut b[..BLOCK]);
        assert_eq!(bad_blocks(&want, &got), 2);
        // Block 3 a copy of block 1 (a stale page mapped twice): it fails.
        let mut got = bytes.clone();
        got.copy_within(BLOCK..2 * BLOCK, 3 * BLOCK);
        assert_eq!(bad_blocks(&want, &got), 1);
        // The whole region shifted by 256 bytes (the period of the old pattern).
        let mut got = bytes.clone();
        got.rotate_right(256);
        assert_eq!(bad_blocks(&want, &got), 8);
        // One block short.
        assert_eq!(bad_blocks(&want, &bytes[..7 * BLOCK]), 1);
    }

    #[test]
    fn a_block_is_bound_to_its_offset_even_with_equal_bytes() {
        // The same bytes at two offsets have different sums.
        let zeros = vec![0u8; 2 * BLOCK];
        let sums = block_sums(&zeros);
        assert_ne!(sums[0], sums[1]);
    }

    #[test]
    fn the_fill_depends_on_the_seed_and_does_not_repeat() {
        let a = fill(1 << 16, 1);
        assert_ne!(a, fill(1 << 16, 2));
        assert_eq!(a, fill(1 << 16, 1));
        assert_ne!(&a[..256], &a[256..512]);
        assert_eq!(fill(13, 3).len(), 13);
    }
}
