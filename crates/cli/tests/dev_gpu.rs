//! The gpu device through real daemons: the same composition (an NV12 video layer, a
//! translucent RGBA layer, a rotated and scaled RGBA layer, a scaled NV12 picture-in-picture),
//! markers and 360-degree projection run on `--gpu-backend wgpu` and on `--gpu-backend cpu`
//! (the reference), and the results are compared end to end. Bad records answer errors and
//! the daemon keeps serving.

mod common;

use common::{connect, cpu_read as read, cpu_write as write, nv12_pattern};

use common::Daemon;
use virtsoc_devapi::RegionId;
use virtsoc_guest::devices::{gpu, LayerRecord, MarkerRecord};
use virtsoc_guest::{AccessMode, Connection, Format, Status};

const W: u32 = 256;
const H: u32 = 144;
/// Overlay size.
const OW: u32 = 128;
const OH: u32 = 72;

/// Largest per-channel difference allowed between the wgpu and the CPU backend. Both follow
/// the same sampling rules in f32 (the shaders filter with `textureLoad` and f32 weights);
/// the crate promises a code value or two, rounding at .5 boundaries can add one.
const MAX_BACKEND_DIFF: u8 = 3;
/// Largest per-channel difference allowed against the blend computed in this test.
const MAX_BLEND_DIFF: u8 = 3;

/// RGBA overlay pixel: red along x, blue along y, alpha 40..240 along x.
fn overlay_px(x: u32, y: u32) -> [u8; 4] {
    [
        (255 * x / (OW - 1)) as u8,
        64,
        (255 * y / (OH - 1)) as u8,
        (40 + 200 * x / (OW - 1)) as u8,
    ]
}

fn overlay() -> Vec<u8> {
    (0..OH)
        .flat_map(|y| (0..OW).flat_map(move |x| overlay_px(x, y)))
        .collect()
}

/// Equirect RGBA, smooth and periodic in longitude: R and B a sine and cosine of the
/// longitude, G along the latitude.
fn equirect(w: u32, h: u32) -> Vec<u8> {
    let mut f = Vec::with_capacity((w * h * 4) as usize);
    for y in 0..h {
        for x in 0..w {
            let a = std::f64::consts::TAU * (x as f64 + 0.5) / w as f64;
            f.extend_from_slice(&[
                (128.0 + 120.0 * a.sin()).round() as u8,
                (255 * y / (h - 1)) as u8,
                (128.0 + 120.0 * a.cos()).round() as u8,
                255,
            ]);
        }
    }
    f
}

/// BT.601 limited range of one NV12 pixel (unscaled: chroma bilinear at centred siting).
fn nv12_rgb(f: &[u8], x: u32, y: u32) -> [f64; 3] {
    let (w, h) = (W as usize, H as usize);
    let luma = f[y as usize * w + x as usize] as f64;
    let chroma = |ch: usize, cx: f64, cy: f64| {
        let cx = cx.clamp(0.0, (w / 2 - 1) as f64);
        let cy = cy.clamp(0.0, (h / 2 - 1) as f64);
        let (x0, y0) = (cx.floor() as usize, cy.floor() as usize);
        let (x1, y1) = ((x0 + 1).min(w / 2 - 1), (y0 + 1).min(h / 2 - 1));
        let (tx, ty) = (cx - x0 as f64, cy - y0 as f64);
        let at = |xx: usize, yy: usize| f[w * h + yy * w + 2 * xx + ch] as f64;
        (at(x0, y0) * (1.0 - tx) + at(x1, y0) * tx) * (1.0 - ty)
            + (at(x0, y1) * (1.0 - tx) + at(x1, y1) * tx) * ty
    };
    let (cx, cy) = ((x as f64 + 0.5) / 2.0 - 0.5, (y as f64 + 0.5) / 2.0 - 0.5);
    let (u, v) = (chroma(0, cx, cy) - 128.0, chroma(1, cx, cy) - 128.0);
    let c = 1.164_383_6 * (luma - 16.0);
    [
        (c + 1.596_026_8 * v).clamp(0.0, 255.0),
        (c - 0.391_762_3 * u - 0.812_967_6 * v).clamp(0.0, 255.0),
        (c + 2.017_232_2 * u).clamp(0.0, 255.0),
    ]
}

fn px(img: &[u8], w: u32, x: u32, y: u32) -> [u8; 4] {
    let o = ((y * w + x) * 4) as usize;
    [img[o], img[o + 1], img[o + 2], img[o + 3]]
}

fn max_diff(a: &[u8], b: &[u8]) -> u8 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0)
}

fn mean_diff(a: &[u8], b: &[u8]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y) as f64)
        .sum::<f64>()
        / a.len() as f64
}

fn layer(src: RegionId, crop: [u32; 4], pos: [i32; 2], size: [u32; 2]) -> LayerRecord {
    LayerRecord {
        src,
        crop,
        dst_pos: pos,
        dst_size: size,
        rotation: 0,
        alpha: 1.0,
        blend: true,
    }
}

fn records<T>(items: &[T], f: impl Fn(&T) -> Vec<u8>) -> Vec<u8> {
    items.iter().flat_map(f).collect()
}

/// A guest with the composition's sources in place.
struct Scene {
    c: Connection,
    video: RegionId,
    ui: RegionId,
    dst: RegionId,
    dst_size: usize,
}

impl Scene {
    fn new(d: &Daemon) -> Scene {
        let c = connect(d);
        let video = c.alloc(0, W, H, Format::Nv12, 0).unwrap().id;
        write(&c, video, &nv12_pattern(W, H));
        let ui = c.alloc(0, OW, OH, Format::Rgba8, 0).unwrap().id;
        write(&c, ui, &overlay());
        let dst = c.alloc(0, W, H, Format::Rgba8, 0).unwrap();
        Scene {
            c,
            video,
            ui,
            dst: dst.id,
            dst_size: dst.size as usize,
        }
    }

    fn layers(&self) -> Vec<LayerRecord> {
        let (v, u) = (self.video, self.ui);
        vec![
            // The video, full screen, replacing what is below.
            LayerRecord {
                blend: false,
                ..layer(v, [0, 0, W, H], [0, 0], [W, H])
            },
            // The translucent UI at 1:1, with a plane alpha.
            LayerRecord {
                alpha: 0.75,
                ..layer(u, [0, 0, OW, OH], [64, 36], [OW, OH])
            },
            // Part of the UI rotated by 90 degrees and scaled 1.5x, partly off screen.
            LayerRecord {
                rotation: 90,
                ..layer(u, [8, 4, 64, 32], [220, 20], [48, 96])
            },
            // A picture-in-picture of the video, halved.
            layer(v, [32, 16, 128, 72], [8, 100], [64, 36]),
        ]
    }

    /// Runs a composition of `layers` into `dst`, with the sources bracketed by the guest.
    fn composite(&self, layers: &[LayerRecord], count: u64, dst: RegionId) -> Result<u64, Status> {
        let c = &self.c;
        let bytes = records(layers, |l| l.to_bytes().to_vec());
        let blob = c.alloc_blob(bytes.len().max(1) as u64).unwrap().id;
        if !bytes.is_empty() {
            write(c, blob, &bytes);
        }
        let srcs = [self.video, self.ui];
        for s in srcs {
            let size = c.region(s).unwrap().size;
            c.begin_access(s, gpu::ID, 0, size, AccessMode::Read)
                .unwrap();
        }
        let r = c.command_with_access(&gpu::Composite {
            layers: blob,
            count,
            dst,
        });
        for s in srcs {
            let size = c.region(s).unwrap().size;
            c.end_access(s, gpu::ID, 0, size, AccessMode::Read).unwrap();
        }
        c.free(blob).unwrap();
        r.map(|r| r.gpu_us).map_err(|e| e.status())
    }

    fn markers(&self, markers: &[MarkerRecord]) -> Result<u64, Status> {
        let c = &self.c;
        let bytes = records(markers, |m| m.to_bytes().to_vec());
        let blob = c.alloc_blob(bytes.len() as u64).unwrap().id;
        write(c, blob, &bytes);
        let r = c.command_with_access(&gpu::Markers {
            markers: blob,
            count: markers.len() as u64,
            dst: self.dst,
        });
        c.free(blob).unwrap();
        r.map(|r| r.gpu_us).map_err(|e| e.status())
    }
}

fn gpu_backend(c: &Connection) -> String {
    c.devices()
        .iter()
        .find(|d| d.name == "gpu")
        .map(|d| d.backend.clone())
        .unwrap_or_default()
}

/// Composite, markers and projection on one daemon; returns the three images.
fn render(d: &Daemon) -> [Vec<u8>; 3] {
    let s = Scene::new(d);
    eprintln!("gpu backend: {}", gpu_backend(&s.c));
    let layers = s.layers();
    // A warm-up (pipelines, pools), then the measured frame.
    s.composite(&layers, layers.len() as u64, s.dst).unwrap();
    let t = std::time::Instant::now();
    let gpu_us = s.composite(&layers, layers.len() as u64, s.dst).unwrap();
    eprintln!(
        "composite of {} layers into {W}x{H}: gpu_us {gpu_us}, guest round trip {:?}",
        layers.len(),
        t.elapsed()
    );
    let composed = read(&s.c, s.dst, s.dst_size);

    let marks = [
        MarkerRecord {
            x: 50,
            y: 40,
            size: 10,
            rgba: [255, 0, 0, 255],
        },
        MarkerRecord {
            x: 200,
            y: 100,
            size: 6,
            rgba: [0, 255, 0, 128],
        },
    ];
    s.markers(&marks).unwrap();
    let marked = read(&s.c, s.dst, s.dst_size);

    let (ew, eh) = (256, 128);
    let pano = s.c.alloc(0, ew, eh, Format::Rgba8, 0).unwrap().id;
    write(&s.c, pano, &equirect(ew, eh));
    let view = s.c.alloc(0, 128, 72, Format::Rgba8, 0).unwrap();
    let project = |yaw_deg: f64| {
        let urad = |deg: f64| (deg.to_radians() * 1e6).round() as i64 as u64;
        s.c.command_with_access(&gpu::Project {
            src: pano,
            dst: view.id,
            yaw: urad(yaw_deg),
            pitch: urad(0.0),
            fov: urad(90.0),
        })
        .unwrap();
        read(&s.c, view.id, view.size as usize)
    };
    let front = project(0.0);
    let right = project(90.0);
    let left = project(-90.0);
    let mut both = front.clone();
    both.extend_from_slice(&right);
    check_projection(&front, &right, &left);
    check_composition(&composed);
    check_markers(&composed, &marked);
    [composed, marked, both]
}

/// The 1:1 parts of the composition against BT.601 and the straight-alpha blend.
fn check_composition(img: &[u8]) {
    let video = nv12_pattern(W, H);
    // Video only (outside every other layer).
    for (x, y) in [(2, 2), (40, 20), (250, 140), (100, 137)] {
        let want = nv12_rgb(&video, x, y);
        let got = px(img, W, x, y);
        for c in 0..3 {
            let d = (got[c] as f64 - want[c]).abs();
            assert!(
                d <= MAX_BLEND_DIFF as f64,
                "video at ({x},{y}): {got:?} vs {want:?}"
            );
        }
        assert_eq!(got[3], 255);
    }
    // The translucent UI over the video: rgb = src * A + dst * (1 - A), A = a * 0.75.
    for (ox, oy) in [(0, 0), (10, 60), (64, 36), (127, 71), (100, 5)] {
        let (x, y) = (64 + ox, 36 + oy);
        let s = overlay_px(ox, oy);
        let a = s[3] as f64 / 255.0 * 0.75;
        let base = nv12_rgb(&video, x, y);
        let got = px(img, W, x, y);
        for c in 0..3 {
            let want = s[c] as f64 * a + base[c] * (1.0 - a);
            let d = (got[c] as f64 - want).abs();
            assert!(
                d <= MAX_BLEND_DIFF as f64,
                "blend at ({x},{y}) channel {c}: {} vs {want:.1}",
                got[c]
            );
        }
    }
}

/// Markers: the opaque square covers exactly pixels 45..=54 x 35..=44; the translucent
/// one is half green; nothing else changes.
fn check_markers(before: &[u8], after: &[u8]) {
    let red = [255, 0, 0, 255];
    for y in 35..45 {
        for x in 45..55 {
            assert_eq!(px(after, W, x, y), red, "({x},{y}) inside the red marker");
        }
    }
    for (x, y) in [(44, 40), (55, 40), (50, 34), (50, 45)] {
        assert_eq!(
            px(after, W, x, y),
            px(before, W, x, y),
            "({x},{y}) just outside the red marker"
        );
    }
    let (b, a) = (px(before, W, 200, 100), px(after, W, 200, 100));
    let alpha = 128.0 / 255.0;
    let want = [0.0, 255.0, 0.0].map(|v: f64| v * alpha);
    for c in 0..3 {
        let w = want[c] + b[c] as f64 * (1.0 - alpha);
        assert!(
            (a[c] as f64 - w).abs() <= 2.0,
            "green marker: {a:?} over {b:?}"
        );
    }
    let changed = before
        .chunks_exact(4)
        .zip(after.chunks_exact(4))
        .filter(|(p, q)| p != q)
        .count();
    assert!(
        (100..=100 + 36).contains(&changed),
        "{changed} pixels changed"
    );
}

/// The projection is an image (not a fill), looks at the centre of the panorama at yaw 0 and
/// turns right with positive yaw.
fn check_projection(front: &[u8], right: &[u8], left: &[u8]) {
    let distinct: std::collections::HashSet<[u8; 4]> = front
        .chunks_exact(4)
        .map(|p| [p[0], p[1], p[2], p[3]])
        .collect();
    assert!(distinct.len() > 200, "only {} colours", distinct.len());
    assert!(mean_diff(front, right) > 20.0, "yaw changes the view");
    assert!(mean_diff(right, left) > 20.0, "yaw changes the view");
    // Centre pixel: longitude 180 deg (R = 128, B = 8) at yaw 0; 270 deg (R = 8, B = 128)
    // at +90; 90 deg (R = 248, B = 128) at -90. G is about mid-latitude.
    let centre = |img: &[u8]| px(img, 128, 64, 36);
    for (img, r, b) in [(front, 128, 8), (right, 8, 128), (left, 248, 128)] {
        let p = centre(img);
        assert!(
            p[0].abs_diff(r) <= 6 && p[2].abs_diff(b) <= 6 && p[1].abs_diff(128) <= 6,
            "centre {p:?}, want R {r} B {b}"
        );
    }
}

#[test]
fn wgpu_and_cpu_backends_agree_end_to_end() {
    let wgpu = Daemon::start(&["--gpu-backend", "auto"]);
    let got = render(&wgpu);
    let on = gpu_backend(&connect(&wgpu));
    if !on.starts_with("wgpu") {
        assert!(
            std::env::var_os("VIRTSOC_REQUIRE_ALL").is_none(),
            "no wgpu adapter ({on}) and VIRTSOC_REQUIRE_ALL is set"
        );
        eprintln!("WARNING: no wgpu adapter here ({on}); both runs used the CPU backend");
    }
    drop(wgpu);
    let cpu = Daemon::start(&["--gpu-backend", "cpu"]);
    let want = render(&cpu);
    for (what, (g, w)) in ["composite", "markers", "project"]
        .iter()
        .zip(got.iter().zip(&want))
    {
        let (max, mean) = (max_diff(g, w), mean_diff(g, w));
        eprintln!("{what}: wgpu vs cpu max diff {max}, mean {mean:.3}");
        assert!(
            max <= MAX_BACKEND_DIFF,
            "{what}: wgpu and cpu differ by up to {max} (allowed {MAX_BACKEND_DIFF})"
        );
    }
}

#[test]
fn bad_records_answer_errors_and_the_daemon_keeps_serving() {
    let mut d = Daemon::start(&["--gpu-backend", "auto"]);
    let s = Scene::new(&d);
    let good = s.layers();
    let one = |l: LayerRecord| s.composite(&[l], 1, s.dst);

    // A source id that is none of this guest's regions.
    assert_eq!(
        one(layer(RegionId(9999), [0, 0, 8, 8], [0, 0], [8, 8])),
        Err(Status::NoSuchRegion)
    );
    // A crop outside its source.
    assert_eq!(
        one(layer(s.video, [200, 0, 100, H], [0, 0], [W, H])),
        Err(Status::BadArgument)
    );
    assert_eq!(
        one(layer(s.ui, [0, 0, OW, OH + 1], [0, 0], [W, H])),
        Err(Status::BadArgument)
    );
    // Bad rotation, alpha, destination size.
    let base = layer(s.ui, [0, 0, OW, OH], [0, 0], [OW, OH]);
    assert_eq!(
        one(LayerRecord {
            rotation: 45,
            ..base
        }),
        Err(Status::BadArgument)
    );
    assert_eq!(
        one(LayerRecord { alpha: 2.0, ..base }),
        Err(Status::BadArgument)
    );
    assert_eq!(
        one(LayerRecord {
            dst_size: [0, 10],
            ..base
        }),
        Err(Status::BadArgument)
    );
    // More records than the blob holds.
    assert_eq!(s.composite(&good[..1], 2, s.dst), Err(Status::OutOfRange));
    assert_eq!(
        s.composite(&good[..1], u64::MAX / 8, s.dst),
        Err(Status::OutOfRange)
    );
    // Destinations that are not RGB frames.
    let blob = s.c.alloc_blob(W as u64 * H as u64 * 4).unwrap().id;
    assert_eq!(s.composite(&good, 4, blob), Err(Status::NotSupported));
    let nv12 = s.c.alloc(0, W, H, Format::Nv12, 0).unwrap().id;
    assert_eq!(s.composite(&good, 4, nv12), Err(Status::NotSupported));
    // A source the GPU was not given access to.
    let hidden = s.c.alloc(0, 16, 16, Format::Rgba8, 0).unwrap().id;
    assert_eq!(
        one(layer(hidden, [0, 0, 16, 16], [0, 0], [16, 16])),
        Err(Status::BadArgument)
    );
    // A zero field of view, a zero-sized marker.
    let r = s.c.command_with_access(&gpu::Project {
        src: s.ui,
        dst: s.dst,
        yaw: 0,
        pitch: 0,
        fov: 0,
    });
    assert_eq!(r.unwrap_err().status(), Status::BadArgument);
    let zero = MarkerRecord {
        x: 1,
        y: 1,
        size: 0,
        rgba: [1, 2, 3, 4],
    };
    assert_eq!(s.markers(&[zero]), Err(Status::BadArgument));

    // Still serving this guest and another one.
    s.composite(&good, good.len() as u64, s.dst).unwrap();
    let other = Scene::new(&d);
    other
        .composite(&other.layers(), 4, other.dst)
        .expect("another guest composes");
    let img = read(&other.c, other.dst, other.dst_size);
    assert!(img.chunks_exact(4).any(|p| p != &img[..4]), "not a fill");
    // Counted on the GPU timeline: every command that reached the backend retired.
    let desc = gpu_backend(&connect(&d));
    eprintln!("after the errors: {desc}");
    assert!(desc.contains("timeline"), "{desc}");
    assert!(d.alive());
}
