//! `virtsoc run gles-video`: the video scenario drawn with OpenGL ES. H.264 is decoded on
//! the codec device into NV12 SVM regions, each an EGLImage sampled through an external
//! texture (`samplerExternalOES`) with a UI layer blended over it, then `eglSwapBuffers`
//! and a present on the daemon's display (`eglPresentVIRTSOC`: the frame read back on the
//! gles queue, an acquire fence, the display's present with the frame's decode time).
//!
//! - **fence** ordering: the guest queues everything and never waits in between: the decode
//!   (`eglQueueDeviceCommandVIRTSOC`), a sync on the codec's queue that the GL queue waits on
//!   (`eglWaitSyncKHR`: the latch's import and the draw run once the decode is done), the
//!   draw, and the present behind its acquire fence. A picture region is decoded into again
//!   only after the GL queue latched it (the codec's queue waits on a GL fence sync), and a
//!   bitstream slot is rewritten after the codec read it (a CPU wait on the fence page,
//!   long signaled in a steady state). The guest is paced by the GL: at most [`IN_FLIGHT`]
//!   drawn frames unfinished (a CPU wait on a fence sync, on the fence page).
//! - **atomic** ordering: the guest waits for each step (the decode, the draw, the present).
//!
//! The vendor library makes one connection per process, and `--compare` runs each mode
//! against a daemon of its own: so each run is a child process (`virtsoc run gles-video
//! --socket ...` with [`GUEST_ENV`] set) whose JSON row the parent reads. The child's
//! connection takes the mode's coherence protocol from `VIRTSOC_COHERENCE`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::gles_egl::{self as e, Egl};
use super::{cpu_seconds, daemon_cpu_seconds, media, now_ns, RunOpts, ScenarioResult};
use crate::bench_svm::OrderingMode;
use crate::stats::P50P99;
use crate::CliError;

/// Set in the child that runs the guest.
pub const GUEST_ENV: &str = "VIRTSOC_GLES_VIDEO_GUEST";
/// The daemon's pid, for the child's CPU figures.
const PID_ENV: &str = "VIRTSOC_GLES_VIDEO_DAEMON_PID";
/// Picture regions taking turns.
const SLOTS: usize = 3;
/// Frames drawn but not finished by the GL that the fence-ordered guest lets be queued.
const IN_FLIGHT: usize = 2;
/// The codec device's id (`virtsoc devices`).
const CODEC: i32 = 10;

/// Runs one mode: in a child process (module docs), or, in that child, the guest itself.
pub fn run(target: &str, daemon_pid: Option<u32>, o: &RunOpts) -> Result<ScenarioResult, CliError> {
    if std::env::var_os(GUEST_ENV).is_some() {
        let pid = daemon_pid.or_else(|| std::env::var(PID_ENV).ok()?.parse().ok());
        return guest(pid, o);
    }
    let exe = std::env::current_exe()?;
    let json = vendor_json()?;
    let res = match (o.width, o.height) {
        (640, 360) => "360p",
        (1280, 720) => "720p",
        (3840, 2160) => "uhd",
        _ => "1080p",
    };
    let mut cmd = Command::new(exe);
    cmd.args([
        "run",
        "gles-video",
        "--socket",
        target,
        "--protocol",
        &o.protocol,
    ])
    .args([
        "--ordering",
        if o.ordering == OrderingMode::Fence {
            "fence"
        } else {
            "atomic"
        },
    ])
    .args(["--seconds", &o.seconds.to_string(), "--resolution", res])
    .args(["--fps", &o.fps.to_string(), "--json"])
    .env(GUEST_ENV, "1")
    .env("VIRTSOC_SOCKET", target)
    .env("VIRTSOC_COHERENCE", &o.protocol)
    .env("__EGL_VENDOR_LIBRARY_FILENAMES", &json)
    .stderr(Stdio::inherit());
    if let Some(pid) = daemon_pid {
        cmd.env(PID_ENV, pid.to_string());
    }
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(CliError::Usage(format!(
            "the gles-video guest failed ({})",
            out.status
        )));
    }
    let rows: Vec<ScenarioResult> = serde_json::from_slice(&out.stdout)?;
    rows.into_iter()
        .next()
        .ok_or_else(|| CliError::Usage("the gles-video guest answered no row".into()))
}

/// The glvnd vendor JSON naming `libEGL_virtsoc.so` beside this executable (in a
/// directory of this process's own).
fn vendor_json() -> Result<PathBuf, CliError> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let lib = dir.join("libEGL_virtsoc.so");
    if !lib.is_file() {
        return Err(CliError::Usage(format!(
            "{} not built (cargo build -p virtsoc-gles)",
            lib.display()
        )));
    }
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-video-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let path = tmp.join("virtsoc.json");
    let text = format!(
        "{{\"file_format_version\":\"1.0.0\",\"ICD\":{{\"library_path\":{}}}}}\n",
        serde_json::to_string(&lib.canonicalize()?.display().to_string())?
    );
    std::fs::write(&path, text)?;
    Ok(path)
}

/// An RGBA UI layer: transparent, an opaque bar at the bottom and a translucent panel above.
fn ui_layer(b: &mut [u8], stride: usize, w: usize, h: usize) {
    for y in h / 2..h {
        for x in 0..w {
            let px = if y >= h - h / 16 {
                [30, 30, 40, 255]
            } else if y > h * 3 / 4 && x > w / 10 && x < w * 9 / 10 {
                [255, 255, 255, 96]
            } else {
                continue;
            };
            if let Some(d) = b.get_mut(y * stride + 4 * x..y * stride + 4 * x + 4) {
                d.copy_from_slice(&px);
            }
        }
    }
}

/// The GL objects of one run.
struct Scene {
    video: u32,
    ui: u32,
    ui_tex: u32,
    textures: Vec<u32>,
    images: Vec<*mut std::ffi::c_void>,
}

fn scene(egl: &Egl, w: u32, h: u32, pictures: &[u64]) -> Result<Scene, CliError> {
    let video = egl.program(c"#extension GL_OES_EGL_image_external : require\nprecision mediump float; varying vec2 tc; uniform samplerExternalOES t; void main() { gl_FragColor = texture2D(t, tc); }")?;
    let ui = egl.program(c"precision mediump float; varying vec2 tc; uniform sampler2D t; void main() { gl_FragColor = texture2D(t, tc); }")?;
    let ui_region = egl.region(e::FORMAT_RGBA8, w, h)?;
    let (wu, hu) = (w as usize, h as usize);
    egl.write(
        ui_region,
        |b, stride| ui_layer(b, stride.max(4 * wu), wu, hu),
        wu * hu * 4,
    )?;
    let ui_image = egl.image(ui_region)?;
    let ui_tex = egl.texture(e::TEXTURE_2D);
    (egl.gl.target_texture)(e::TEXTURE_2D, ui_image);
    let mut textures = Vec::new();
    let mut images = Vec::new();
    for &p in pictures {
        images.push(egl.image(p)?);
        textures.push(egl.texture(e::TEXTURE_EXTERNAL));
    }
    (egl.gl.viewport)(0, 0, w as i32, h as i32);
    (egl.gl.blend_func)(0x0302, 0x0303);
    Ok(Scene {
        video,
        ui,
        ui_tex,
        textures,
        images,
    })
}

/// Latches picture `k` and draws it with the UI over it.
fn draw(egl: &Egl, s: &Scene, k: usize) {
    let g = &egl.gl;
    (g.use_program)(s.video);
    (g.disable)(0x0BE2);
    (g.bind_texture)(e::TEXTURE_EXTERNAL, s.textures[k]);
    (g.target_texture)(e::TEXTURE_EXTERNAL, s.images[k]);
    egl.quad();
    (g.use_program)(s.ui);
    (g.enable)(0x0BE2);
    (g.bind_texture)(e::TEXTURE_2D, s.ui_tex);
    egl.quad();
}

/// Counters at the start of the measured run.
struct Before {
    hits: u64,
    misses: u64,
    copies: u64,
    copy_ns: u64,
    ledger: Vec<(String, String, u64, u64)>,
    cpu_guest: f64,
    cpu_daemon: Option<f64>,
}

/// The daemon's memory domains (the guest window, host RAM, the devices'), read on a
/// connection of its own (the vendor library's is inside the library).
fn domains() -> Result<Vec<String>, CliError> {
    let target = std::env::var("VIRTSOC_SOCKET").unwrap_or_else(|_| "/tmp/virtsoc.sock".into());
    let c = virtsoc_guest::Connection::open(&target, &virtsoc_guest::ConnectOptions::default())?;
    let mut names = vec!["guest-window".to_string(), "host-ram".to_string()];
    for d in c.devices() {
        if !names.contains(&d.domain) {
            names.push(d.domain.clone());
        }
    }
    c.close();
    Ok(names)
}

fn snapshot(egl: &Egl, pid: Option<u32>) -> Result<Before, CliError> {
    let mut ledger = Vec::new();
    let all = domains()?;
    for s in &all {
        for d in &all {
            let (c, b) = egl.ledger(s, d)?;
            ledger.push((s.to_string(), d.to_string(), c, b));
        }
    }
    Ok(Before {
        hits: egl.counter(c"hits")?,
        misses: egl.counter(c"misses")?,
        copies: egl.counter(c"copies")? + egl.counter(c"device_copies")?,
        copy_ns: egl.counter(c"copy_ns")?,
        ledger,
        cpu_guest: cpu_seconds(std::process::id()).unwrap_or(0.0),
        cpu_daemon: pid.and_then(daemon_cpu_seconds),
    })
}

/// Sleeps until frame `i`'s start on the schedule from `anchor`; returns whether to drop
/// the frame: more than a frame late, the schedule re-anchors at now and every other late
/// frame is dropped (as the other scenarios do), so a pipeline slower than the frame rate
/// still shows frames.
fn pace(anchor: &mut Instant, dropped_last: &mut bool, i: u64, period: Duration) -> bool {
    let start = *anchor + period * i as u32;
    let now = Instant::now();
    if start > now {
        std::thread::sleep(start - now);
        *dropped_last = false;
        return false;
    }
    let behind = now - start;
    if behind <= period {
        *dropped_last = false;
        return false;
    }
    *anchor += behind;
    *dropped_last = !*dropped_last;
    *dropped_last
}

/// The guest: decode, draw, present for `o.seconds`; its row.
fn guest(pid: Option<u32>, o: &RunOpts) -> Result<ScenarioResult, CliError> {
    let (w, h) = (o.width, o.height);
    let fence = o.ordering == OrderingMode::Fence;
    let clip = media::clip("flat", w, h, o.fps, 4)?;
    let units = media::load_units(&clip)?;
    let max_unit = units.iter().map(Vec::len).max().unwrap_or(0);
    if max_unit == 0 {
        return Err(CliError::Usage("the clip has no frames".into()));
    }
    let egl = Egl::open(w, h)?;
    let bits: Vec<u64> = (0..2)
        .map(|_| egl.region(e::FORMAT_BLOB, max_unit as u32, 1))
        .collect::<Result<_, _>>()?;
    let pictures: Vec<u64> = (0..SLOTS)
        .map(|_| egl.region(e::FORMAT_NV12, w, h))
        .collect::<Result<_, _>>()?;
    let sc = scene(&egl, w, h, &pictures)?;
    let dec = egl.command(
        c"codec",
        c"open_decoder",
        &[virtsoc_devapi::codec_kind::H264, 3, 0],
    )?[0];
    let period = Duration::from_secs_f64(1.0 / f64::from(o.fps.max(1)));
    let before = snapshot(&egl, pid)?;
    // Fence mode: the codec's read of each bitstream slot, the GL's latch of each picture.
    let mut read: Vec<Option<*mut std::ffi::c_void>> = vec![None; 2];
    let mut latched: Vec<Option<*mut std::ffi::c_void>> = vec![None; SLOTS];
    let (mut frames_in, mut late) = (0u64, 0u64);
    let t0 = Instant::now();
    let (mut anchor, mut dropped_last) = (t0, false);
    let mut drawn = std::collections::VecDeque::new();
    let mut i = 0u64;
    while t0.elapsed().as_secs_f64() < o.seconds {
        let behind = pace(&mut anchor, &mut dropped_last, i, period);
        let unit = &units[(i as usize) % units.len()];
        let (slot, k) = ((i % 2) as usize, (i as usize) % SLOTS);
        if let Some(s) = read[slot].take() {
            egl.finish_sync(s)?;
        }
        let decoded_at = now_ns();
        egl.write(
            bits[slot],
            |b, _| b[..unit.len()].copy_from_slice(unit),
            unit.len(),
        )?;
        let (len, pic) = (unit.len() as u64, pictures[k]);
        if fence {
            if let Some(s) = latched[k].take() {
                egl.device_wait(s, c"codec")?;
                egl.destroy(s);
            }
            egl.queue(c"codec", c"decode", &[dec, bits[slot], len, i])?;
            read[slot] = Some(egl.device_sync(CODEC)?);
            egl.queue(c"codec", c"receive_frame", &[dec, pic])?;
        } else {
            egl.command(c"codec", c"decode", &[dec, bits[slot], len, i])?;
            egl.command(c"codec", c"receive_frame", &[dec, pic])?;
        }
        frames_in += 1;
        if behind {
            late += 1; // dropped, as Android's renderer drops a late frame
        } else if fence {
            let decoded = egl.device_sync(CODEC)?;
            egl.gl_wait(decoded)?;
            egl.destroy(decoded);
            draw(&egl, &sc, k);
            latched[k] = Some(egl.sync(e::SYNC_FENCE, &[])?);
            egl.swap_and_present(w, h, decoded_at, false)?;
            // Paced by the GL (as a BufferQueue of `IN_FLIGHT` buffers): at most that many
            // frames queued ahead of a GL slower than the clip.
            drawn.push_back(egl.sync(e::SYNC_FENCE, &[])?);
            if drawn.len() > IN_FLIGHT {
                if let Some(s) = drawn.pop_front() {
                    egl.finish_sync(s)?;
                }
            }
        } else {
            draw(&egl, &sc, k);
            egl.finish_sync(egl.sync(e::SYNC_FENCE, &[])?)?;
            egl.swap_and_present(w, h, decoded_at, true)?;
        }
        i += 1;
    }
    for s in drawn {
        egl.finish_sync(s)?;
    }
    for s in read.into_iter().chain(latched).flatten() {
        egl.finish_sync(s)?;
    }
    egl.finish_sync(egl.sync(e::SYNC_FENCE, &[])?)?;
    let wall = t0.elapsed().as_secs_f64();
    std::thread::sleep(period * 3);
    egl.command(c"codec", c"close", &[dec])?;
    row(&egl, o, pid, &before, (frames_in, late, wall))
}

/// The run's row from the counters, the display's statistics and the latches' latencies.
fn row(
    egl: &Egl,
    o: &RunOpts,
    pid: Option<u32>,
    b: &Before,
    (frames_in, late, wall): (u64, u64, f64),
) -> Result<ScenarioResult, CliError> {
    let st = egl.command(c"display", c"stats", &[])?;
    let (presented, dropped, p50, p99) = (st[0], st[1], st[3], st[4]);
    let frames = frames_in.max(1) as f64;
    let mut ledger = Vec::new();
    for (s, d, c0, b0) in &b.ledger {
        let (c, bytes) = egl.ledger(s, d)?;
        if c > *c0 {
            ledger.push(serde_json::json!({
                "link": format!("{s}->{d}"),
                "copies_per_frame": (c - c0) as f64 / frames,
                "mb_per_frame": (bytes - b0) as f64 / 1e6 / frames,
            }));
        }
    }
    let (hits, misses) = (
        egl.counter(c"hits")? - b.hits,
        egl.counter(c"misses")? - b.misses,
    );
    let copies = egl.counter(c"copies")? + egl.counter(c"device_copies")? - b.copies;
    let copy_ns = egl.counter(c"copy_ns")? - b.copy_ns;
    let mut access = egl.import_latency_us()?;
    access.sort_by(|a, b| a.total_cmp(b));
    let acc = P50P99::of(&access);
    let cpu_daemon = b
        .cpu_daemon
        .zip(pid.and_then(daemon_cpu_seconds))
        .map(|(a, z)| (z - a) / wall * 100.0);
    let cpu_guest = (cpu_seconds(std::process::id()).unwrap_or(0.0) - b.cpu_guest) / wall * 100.0;
    let v = serde_json::json!({
        "scenario": o.scenario,
        "protocol": o.protocol,
        "ordering": format!("{:?}", o.ordering).to_lowercase(),
        "resolution": format!("{}x{}", o.width, o.height),
        "target_fps": o.fps,
        "seconds": wall,
        "presented_fps": presented as f64 / wall,
        "frames_in": frames_in,
        "presented": presented,
        "dropped": late + dropped,
        "dropped_late": late,
        "dropped_replaced": dropped,
        "latency_ms": {"p50": p50 as f64 / 1e6, "p99": p99 as f64 / 1e6},
        "access_latency_us": {"p50": acc.p50, "p99": acc.p99},
        "copies_per_frame": copies as f64 / frames,
        "ledger": ledger,
        "composition": "gles",
        "pacing": "free",
        "coherence_ms_per_frame": copy_ns as f64 / 1e6 / frames,
        "prediction_accuracy": (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
        "cpu_daemon_pct": cpu_daemon,
        "cpu_guest_pct": cpu_guest,
    });
    Ok(serde_json::from_value(v)?)
}
