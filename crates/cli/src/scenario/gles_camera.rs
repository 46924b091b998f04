//! `virtsoc run gles-camera`: the camera preview drawn with OpenGL ES. Each camera frame
//! (NV12, its capture time stamped into its top strip) is converted by the ISP into an RGBA
//! region, which is an EGLImage that GLES samples through an effect (a sepia grade and a
//! vignette, which keep the stamp's whites and blacks apart), then `eglSwapBuffers` and a
//! present on the daemon's display (`eglPresentVIRTSOC` with no time given: the display
//! reads the capture time from the pixels, so the latency is motion-to-photon, capture to
//! scan-out). The flow camera -> isp -> gles -> display is what the prefetch engine learns.
//!
//! - **fence** ordering: nothing waits on the guest. The capture is queued on the camera;
//!   the ISP's queue waits on a sync of the camera's, the conversion is queued; the GL queue
//!   waits on a sync of the ISP's, then latches and draws; the present goes behind its
//!   acquire fence. A camera slot is captured into again only after the ISP read it (the
//!   camera's queue waits on the ISP's sync), an RGBA slot converted into again only after
//!   the GL latched it (the ISP's queue waits on a GL fence sync). The guest is paced by the
//!   GL as in `gles-video` (at most `--in-flight` drawn frames unfinished).
//! - **atomic** ordering: the guest waits for each step; with `--breakdown` it times each
//!   ([`STAGES`]).
//!
//! Each mode runs in a child process ([`super::gles_run`]).

use std::time::{Duration, Instant};

use super::gles_egl::{self as e, Egl};
use super::gles_run::{pace, row, snapshot, Stages};
use super::{RunExtra, RunOpts, ScenarioResult};
use crate::bench_svm::OrderingMode;
use crate::CliError;

/// Camera and RGBA regions taking turns.
const SLOTS: usize = 3;
/// The camera's and the ISP's device ids (`virtsoc devices`).
const CAMERA: i32 = 12;
const ISP: i32 = 11;

/// The effect: a sepia grade of the frame's luma and a vignette darkening the corners to
/// 70% at most (the stamp's white blocks stay well above its black ones, whose threshold the
/// reader takes per row from the markers at the left edge).
const EFFECT: &std::ffi::CStr = c"precision mediump float; varying vec2 tc; uniform sampler2D t; void main() { vec3 c = texture2D(t, tc).rgb; float l = dot(c, vec3(0.299, 0.587, 0.114)); vec3 s = min(vec3(1.0), l * vec3(1.07, 0.94, 0.78)); vec2 d = tc - vec2(0.5); float v = 1.0 - 0.6 * dot(d, d); gl_FragColor = vec4(s * v, 1.0); }";

/// What `--breakdown` times, in a frame's order: the capture into the camera region; the
/// ISP's conversion into the RGBA region; the latch (`glEGLImageTargetTexture2DOES`: the
/// region's access from the gles device and its import) and the effect's draw;
/// `eglSwapBuffers` and the present.
const STAGES: &[&str] = &["capture", "isp", "latch + effect", "present"];

/// The GL objects: the effect's program and a texture and an image per RGBA slot.
struct Scene {
    effect: u32,
    textures: Vec<u32>,
    images: Vec<*mut std::ffi::c_void>,
}

fn scene(egl: &Egl, w: u32, h: u32, rgbs: &[u64]) -> Result<Scene, CliError> {
    let effect = egl.program(EFFECT)?;
    let (images, textures) = egl.images(rgbs, e::TEXTURE_2D)?;
    (egl.gl.viewport)(0, 0, w as i32, h as i32);
    Ok(Scene {
        effect,
        textures,
        images,
    })
}

/// Latches RGBA slot `k` and draws it through the effect.
fn draw(egl: &Egl, s: &Scene, k: usize) {
    egl.draw_image(s.effect, e::TEXTURE_2D, s.textures[k], s.images[k]);
}

/// Syncs of one slot the next use of it waits for.
#[derive(Default, Clone, Copy)]
struct SlotSyncs {
    /// The ISP read the camera slot (the camera's next capture into it waits).
    read: Option<*mut std::ffi::c_void>,
    /// The GL latched the RGBA slot (the ISP's next conversion into it waits).
    latched: Option<*mut std::ffi::c_void>,
}

/// The guest: capture, convert, draw, present for `o.seconds`; its row.
pub fn guest(pid: Option<u32>, o: &RunOpts, x: &RunExtra) -> Result<ScenarioResult, CliError> {
    let (w, h) = (o.width, o.height);
    let fence = o.ordering == OrderingMode::Fence;
    let mut st = Stages::new(STAGES, x.breakdown && !fence);
    let egl = Egl::open(w, h)?;
    let cams: Vec<u64> = (0..SLOTS)
        .map(|_| egl.region(e::FORMAT_NV12, w, h))
        .collect::<Result<_, _>>()?;
    let rgbs: Vec<u64> = (0..SLOTS)
        .map(|_| egl.region(e::FORMAT_RGBA8, w, h))
        .collect::<Result<_, _>>()?;
    let sc = scene(&egl, w, h, &rgbs)?;
    let period = Duration::from_secs_f64(1.0 / f64::from(o.fps.max(1)));
    let before = snapshot(&egl, pid)?;
    let mut slots = [SlotSyncs::default(); SLOTS];
    let (mut frames_in, mut late) = (0u64, 0u64);
    let t0 = Instant::now();
    let (mut anchor, mut dropped_last) = (t0, false);
    let mut drawn = std::collections::VecDeque::new();
    let mut i = 0u64;
    while t0.elapsed().as_secs_f64() < o.seconds {
        let behind = pace(&mut anchor, &mut dropped_last, i, period);
        let k = (i as usize) % SLOTS;
        let (cam, rgb) = (cams[k], rgbs[k]);
        frames_in += 1;
        if !fence {
            st.start();
            egl.command(c"camera", c"capture", &[cam])?;
            st.end(&egl, 0, false)?;
            if behind {
                late += 1;
            } else {
                egl.command(c"isp", c"convert", &[cam, rgb])?;
                st.end(&egl, 1, false)?;
                draw(&egl, &sc, k);
                egl.finish_sync(egl.sync(e::SYNC_FENCE, &[])?)?;
                st.end(&egl, 2, false)?;
                egl.swap_and_present(w, h, 0, true)?;
                st.end(&egl, 3, false)?;
            }
            i += 1;
            continue;
        }
        if let Some(s) = slots[k].read.take() {
            egl.device_wait(s, c"camera")?;
            egl.destroy(s);
        }
        egl.queue(c"camera", c"capture", &[cam])?;
        if behind {
            late += 1; // captured, not shown (as a preview drops a late frame)
            i += 1;
            continue;
        }
        let captured = egl.device_sync(CAMERA)?;
        egl.device_wait(captured, c"isp")?;
        egl.destroy(captured);
        if let Some(s) = slots[k].latched.take() {
            egl.device_wait(s, c"isp")?;
            egl.destroy(s);
        }
        egl.queue(c"isp", c"convert", &[cam, rgb])?;
        slots[k].read = Some(egl.device_sync(ISP)?);
        let converted = egl.device_sync(ISP)?;
        egl.gl_wait(converted)?;
        egl.destroy(converted);
        draw(&egl, &sc, k);
        slots[k].latched = Some(egl.sync(e::SYNC_FENCE, &[])?);
        egl.swap_and_present(w, h, 0, false)?;
        drawn.push_back(egl.sync(e::SYNC_FENCE, &[])?);
        if drawn.len() > x.in_flight {
            if let Some(s) = drawn.pop_front() {
                egl.finish_sync(s)?;
            }
        }
        i += 1;
    }
    for s in drawn {
        egl.finish_sync(s)?;
    }
    for s in slots.iter().flat_map(|s| [s.read, s.latched]).flatten() {
        egl.finish_sync(s)?;
    }
    egl.finish_sync(egl.sync(e::SYNC_FENCE, &[])?)?;
    let wall = t0.elapsed().as_secs_f64();
    std::thread::sleep(period * 3);
    row(&egl, o, pid, &before, (frames_in, late, wall), &st)
}
