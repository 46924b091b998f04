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
//!   With `--breakdown` it also finishes the latch, the video quad and the UI layer one by
//!   one and times every stage ([`STAGES`]).
//!
//! Each mode runs in a child process ([`super::gles_run`]).

use std::time::{Duration, Instant};

use super::gles_egl::{self as e, Egl};
use super::gles_run::{pace, row, snapshot, Stages};
use super::{media, now_ns, RunExtra, RunOpts, ScenarioResult};
use crate::bench_svm::OrderingMode;
use crate::CliError;

/// Picture regions taking turns.
const SLOTS: usize = 3;
/// Frames drawn but not finished by the GL that the fence-ordered guest lets be queued,
/// unless `--in-flight` says otherwise.
pub const IN_FLIGHT: usize = 2;
/// The codec device's id (`virtsoc devices`).
const CODEC: i32 = 10;
/// What `--breakdown` times, in a frame's order: the bitstream unit written into its
/// region; the decode and the picture's delivery into its region (two device commands);
/// the latch (`glEGLImageTargetTexture2DOES`: the region's access from the gles device,
/// its import and the YUV conversion); the video quad; the UI layer blended over it;
/// `eglSwapBuffers` and the present (the frame read back into a display region, the
/// display's present).
const STAGES: &[&str] = &[
    "write unit",
    "decode",
    "latch",
    "video quad",
    "ui layer",
    "present",
];

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
    let (images, textures) = egl.images(pictures, e::TEXTURE_EXTERNAL)?;
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

/// Latches picture `k` and draws it with the UI over it (stages 2-4 of [`STAGES`]).
fn draw(egl: &Egl, s: &Scene, k: usize, st: &mut Stages) -> Result<(), CliError> {
    let g = &egl.gl;
    (g.disable)(0x0BE2);
    (g.use_program)(s.video);
    (g.bind_texture)(e::TEXTURE_EXTERNAL, s.textures[k]);
    (g.target_texture)(e::TEXTURE_EXTERNAL, s.images[k]);
    st.end(egl, 2, true)?;
    egl.quad();
    st.end(egl, 3, true)?;
    (g.use_program)(s.ui);
    (g.enable)(0x0BE2);
    (g.bind_texture)(e::TEXTURE_2D, s.ui_tex);
    egl.quad();
    st.end(egl, 4, true)
}

/// The guest: decode, draw, present for `o.seconds`; its row.
pub fn guest(pid: Option<u32>, o: &RunOpts, x: &RunExtra) -> Result<ScenarioResult, CliError> {
    let (w, h) = (o.width, o.height);
    let fence = o.ordering == OrderingMode::Fence;
    let mut st = Stages::new(STAGES, x.breakdown && !fence);
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
    // One decoding thread: each packet's picture comes out with its own packet, so the
    // picture drawn and presented in iteration i is unit i's and carries unit i's write
    // time in either ordering (with frame threads the decoder is a packet behind, and a
    // fence-ordered guest, which never reads receive_frame's answer, could not tell). The
    // GL, not the decode, bounds this scenario's frame rate on a CPU renderer.
    let dec = egl.command(
        c"codec",
        c"open_decoder",
        &[virtsoc_devapi::codec_kind::H264, 3, 1],
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
        st.start();
        egl.write(
            bits[slot],
            |b, _| b[..unit.len()].copy_from_slice(unit),
            unit.len(),
        )?;
        st.end(&egl, 0, false)?;
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
            let got = egl.command(c"codec", c"receive_frame", &[dec, pic])?;
            // The picture is unit i's (one decoding thread), checked by its pts.
            if got.first() != Some(&1) || got.get(1) != Some(&i) {
                return Err(CliError::Usage(format!(
                    "unit {i}: the decoder answered {got:?}, not unit {i}'s picture"
                )));
            }
            st.end(&egl, 1, false)?;
        }
        frames_in += 1;
        if behind {
            late += 1; // dropped, as Android's renderer drops a late frame
        } else if fence {
            let decoded = egl.device_sync(CODEC)?;
            egl.gl_wait(decoded)?;
            egl.destroy(decoded);
            draw(&egl, &sc, k, &mut st)?;
            latched[k] = Some(egl.sync(e::SYNC_FENCE, &[])?);
            egl.swap_and_present(w, h, decoded_at, false)?;
            // Paced by the GL (as a BufferQueue of `IN_FLIGHT` buffers): at most that many
            // frames queued ahead of a GL slower than the clip.
            drawn.push_back(egl.sync(e::SYNC_FENCE, &[])?);
            if drawn.len() > x.in_flight {
                if let Some(s) = drawn.pop_front() {
                    egl.finish_sync(s)?;
                }
            }
        } else {
            draw(&egl, &sc, k, &mut st)?;
            egl.finish_sync(egl.sync(e::SYNC_FENCE, &[])?)?;
            egl.swap_and_present(w, h, decoded_at, true)?;
            st.end(&egl, 5, false)?;
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
    row(&egl, o, pid, &before, (frames_in, late, wall), &st)
}
