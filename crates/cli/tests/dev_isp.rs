//! The isp device through a real daemon: NV12 written by the guest CPU, converted by the ISP
//! into RGBA (same size) and BGRA (half size), read back and compared with a BT.601
//! reference computed here; bad inputs answer errors and the daemon keeps serving.

mod common;

use common::{connect, cpu_read as read, cpu_write as write, nv12_pattern};

use common::Daemon;
use virtsoc_devapi::RegionId;
use virtsoc_guest::devices::isp;
use virtsoc_guest::{Connection, Format, Status};
use virtsoc_media::worker_processes;

const W: u32 = 256;
const H: u32 = 144;

/// Largest difference allowed per channel against the reference, per backend. The pattern
/// is made of linear ramps, so every bilinear variant agrees with the reference up to
/// rounding. The CPU reference follows the reference's sampling rules exactly (measured: max
/// 0). The GPU samples with the hardware's bilinear filter, which on lavapipe filters 8-bit
/// textures in 8-bit fixed point, so Y, U and V are rounded before the colour matrix (measured:
/// max 2). swscale uses fixed-point coefficients, its own chroma siting and edge handling (up
/// to half a chroma step: about 1.4 code values of U or V, 2.8 of B); measured here: max 4
/// (same size), 5 (half size), mean under 1.
fn max_diff(backend: &str) -> u8 {
    match backend {
        "swscale" => 6,
        "gpu" => 3,
        _ => 1,
    }
}
/// Largest mean difference (all channels, all pixels) allowed against the reference.
const MAX_MEAN_DIFF: f64 = 1.5;

/// Bilinear sample (clamped) of an 8-bit plane with `step` bytes per element.
#[allow(clippy::too_many_arguments)]
fn bilinear(
    p: &[u8],
    stride: usize,
    step: usize,
    ch: usize,
    w: usize,
    h: usize,
    x: f64,
    y: f64,
) -> f64 {
    let x = x.clamp(0.0, (w - 1) as f64);
    let y = y.clamp(0.0, (h - 1) as f64);
    let (x0, y0) = (x.floor() as usize, y.floor() as usize);
    let (x1, y1) = ((x0 + 1).min(w - 1), (y0 + 1).min(h - 1));
    let (tx, ty) = (x - x0 as f64, y - y0 as f64);
    let at = |xx: usize, yy: usize| p[yy * stride + xx * step + ch] as f64;
    let top = at(x0, y0) * (1.0 - tx) + at(x1, y0) * tx;
    let bot = at(x0, y1) * (1.0 - tx) + at(x1, y1) * tx;
    top * (1.0 - ty) + bot * ty
}

/// Reference NV12 -> RGB conversion with scaling: BT.601 limited range, bilinear, pixel
/// centres aligned, chroma centre-sited. Returns `dw * dh` RGB triples.
fn reference_rgb(nv12: &[u8], w: u32, h: u32, dw: u32, dh: u32) -> Vec<[f64; 3]> {
    let (w, h) = (w as usize, h as usize);
    let (luma, chroma) = nv12.split_at(w * h);
    let (sx, sy) = (w as f64 / dw as f64, h as f64 / dh as f64);
    let mut out = Vec::with_capacity((dw * dh) as usize);
    for dy in 0..dh {
        for dx in 0..dw {
            let x = (dx as f64 + 0.5) * sx - 0.5;
            let y = (dy as f64 + 0.5) * sy - 0.5;
            let yy = bilinear(luma, w, 1, 0, w, h, x, y);
            let (cx, cy) = ((x + 0.5) / 2.0 - 0.5, (y + 0.5) / 2.0 - 0.5);
            let u = bilinear(chroma, w, 2, 0, w / 2, h / 2, cx, cy);
            let v = bilinear(chroma, w, 2, 1, w / 2, h / 2, cx, cy);
            let c = 1.164_383_6 * (yy - 16.0);
            let (d, e) = (u - 128.0, v - 128.0);
            out.push([
                (c + 1.596_026_8 * e).clamp(0.0, 255.0),
                (c - 0.391_762_3 * d - 0.812_967_6 * e).clamp(0.0, 255.0),
                (c + 2.017_232_2 * d).clamp(0.0, 255.0),
            ]);
        }
    }
    out
}

/// Compares `got` (4 bytes per pixel, channel order `order` for R, G, B) with the reference;
/// returns (max, mean) difference.
fn compare(got: &[u8], want: &[[f64; 3]], order: [usize; 3], allowed: u8, what: &str) -> (u8, f64) {
    let mut max = 0u8;
    let mut sum = 0.0;
    for (i, (px, w)) in got.chunks_exact(4).zip(want).enumerate() {
        assert_eq!(px[3], 255, "{what}: pixel {i} is opaque");
        for c in 0..3 {
            let d = (px[order[c]] as f64 - w[c]).abs();
            sum += d;
            max = max.max(d.round() as u8);
        }
    }
    let mean = sum / (want.len() * 3) as f64;
    assert!(
        max <= allowed && mean <= MAX_MEAN_DIFF,
        "{what}: max difference {max} (allowed {allowed}), mean {mean:.2} (allowed {MAX_MEAN_DIFF})"
    );
    (max, mean)
}

fn convert(c: &Connection, src: RegionId, dst: RegionId) -> Result<(), Status> {
    c.command_with_access(&isp::Convert { src, dst })
        .map(|_| ())
        .map_err(|e| e.status())
}

#[test]
fn isp_converts_nv12_to_rgba_and_half_size_bgra() {
    let frame = nv12_pattern(W, H);
    let full = reference_rgb(&frame, W, H, W, H);
    let half = reference_rgb(&frame, W, H, W / 2, H / 2);
    for backend in ["swscale", "cpu", "gpu"] {
        let d = Daemon::start(&["--isp-backend", backend]);
        let c = connect(&d);
        let desc = c.devices().iter().find(|x| x.name == "isp").unwrap();
        eprintln!("isp backend {backend}: {}", desc.backend);
        let src = c.alloc(0, W, H, Format::Nv12, 0).unwrap();
        write(&c, src.id, &frame);

        let rgba = c.alloc(0, W, H, Format::Rgba8, 0).unwrap();
        convert(&c, src.id, rgba.id).unwrap();
        let got = read(&c, rgba.id, rgba.size as usize);
        let (max, mean) = compare(
            &got,
            &full,
            [0, 1, 2],
            max_diff(backend),
            &format!("{backend} RGBA"),
        );
        eprintln!("{backend}: NV12 -> RGBA {W}x{H}: max diff {max}, mean {mean:.2}");

        let bgra = c.alloc(0, W / 2, H / 2, Format::Bgra8, 0).unwrap();
        convert(&c, src.id, bgra.id).unwrap();
        let got = read(&c, bgra.id, bgra.size as usize);
        let what = format!("{backend} BGRA half size");
        let (max, mean) = compare(&got, &half, [2, 1, 0], max_diff(backend), &what);
        eprintln!(
            "{backend}: NV12 -> BGRA {}x{}: max diff {max}, mean {mean:.2}",
            W / 2,
            H / 2
        );
    }
}

#[test]
fn isp_rejects_bad_regions_and_keeps_serving() {
    let d = Daemon::start(&["--isp-backend", "swscale"]);
    let a = connect(&d);
    let b = connect(&d);
    let src = a.alloc(0, W, H, Format::Nv12, 0).unwrap();
    write(&a, src.id, &nv12_pattern(W, H));
    let dst = a.alloc(0, W, H, Format::Rgba8, 0).unwrap();

    // A Blob destination has no pixel format.
    let blob = a.alloc_blob(W as u64 * H as u64 * 4).unwrap();
    assert_eq!(convert(&a, src.id, blob.id), Err(Status::NotSupported));

    // YUYV is a region format the ISP does not convert.
    let yuyv = a.alloc(0, W, H, Format::Yuyv, 0).unwrap();
    assert_eq!(convert(&a, yuyv.id, dst.id), Err(Status::NotSupported));
    assert_eq!(convert(&a, src.id, yuyv.id), Err(Status::NotSupported));

    // Another guest's region: ids are per guest, so take one of b's that a does not have.
    let mut theirs = RegionId::default();
    for _ in 0..8 {
        theirs = b.alloc(0, 64, 64, Format::Rgba8, 0).unwrap().id;
    }
    assert!(a.region(theirs).is_none());
    let r = a.command(&isp::Convert {
        src: src.id,
        dst: theirs,
    });
    assert_eq!(r.unwrap_err().status(), Status::NoSuchRegion);
    let r = a.command(&isp::Convert {
        src: theirs,
        dst: dst.id,
    });
    assert_eq!(r.unwrap_err().status(), Status::NoSuchRegion);

    // Both guests are still served.
    convert(&a, src.id, dst.id).unwrap();
    let bsrc = b.alloc(0, 64, 32, Format::Nv12, 0).unwrap();
    let bdst = b.alloc(0, 32, 16, Format::Yuv420p, 0).unwrap();
    write(&b, bsrc.id, &nv12_pattern(64, 32));
    convert(&b, bsrc.id, bdst.id).unwrap();
    let y = read(&b, bdst.id, bdst.size as usize);
    assert!(
        y[..32 * 16].iter().any(|&v| v != y[0]),
        "a ramp, not a fill"
    );
    let mut d = d;
    assert!(d.alive());
}

/// Regression: NV12 -> YUV420P at the same size with widths 16 mod 32 (720x480, 720x576,
/// 1936x1088) used to crash the whole daemon inside libswscale (misaligned chroma rows reached
/// its SIMD paths). Through every backend (the `gpu` one sends YUV destinations to swscale),
/// the conversion must answer, keep the luma exactly (NV12 and YUV420P share it), and leave
/// the daemon serving another guest.
#[test]
fn isp_same_size_yuv_conversions_at_widths_16_mod_32_do_not_kill_the_daemon() {
    for backend in ["swscale", "gpu", "cpu"] {
        let mut d = Daemon::start(&["--isp-backend", backend]);
        let c = connect(&d);
        for (w, h) in [(720u32, 480u32), (720, 576), (1936, 1088), (48, 16)] {
            let frame = nv12_pattern(w, h);
            let src = c.alloc(0, w, h, Format::Nv12, 0).unwrap();
            write(&c, src.id, &frame);
            let dst = c.alloc(0, w, h, Format::Yuv420p, 0).unwrap();
            convert(&c, src.id, dst.id).unwrap_or_else(|s| panic!("{backend} {w}x{h}: {s:?}"));
            let got = read(&c, dst.id, dst.size as usize);
            let luma = (w * h) as usize;
            assert_eq!(got[..luma], frame[..luma], "{backend} {w}x{h}: luma");
            // And back, through the same scaler family.
            let back = c.alloc(0, w, h, Format::Nv12, 0).unwrap();
            convert(&c, dst.id, back.id).unwrap();
            assert_eq!(
                read(&c, back.id, back.size as usize),
                frame,
                "{backend} {w}x{h}: NV12 -> YUV420P -> NV12 is lossless"
            );
        }
        assert!(d.alive(), "{backend}: the daemon survived");
        let other = connect(&d);
        assert!(other.alloc(0, 64, 64, Format::Rgba8, 0).is_ok());
    }
}

/// swscale runs in sandboxed workers by default: a worker killed while the daemon converts
/// fails that command alone (`DeviceError` with the reason), workers killed between
/// commands go unnoticed, and the daemon and the guest go on.
#[test]
fn a_killed_isp_worker_fails_one_command_at_most() {
    let mut d = Daemon::start(&["--isp-backend", "swscale"]);
    let c = connect(&d);
    let desc = c.devices().iter().find(|x| x.name == "isp").unwrap();
    assert!(desc.backend.contains("worker"), "{}", desc.backend);
    let frame = nv12_pattern(W, H);
    let src = c.alloc(0, W, H, Format::Nv12, 0).unwrap();
    write(&c, src.id, &frame);
    let dst = c.alloc(0, W, H, Format::Rgba8, 0).unwrap();
    convert(&c, src.id, dst.id).unwrap();
    let want = read(&c, dst.id, dst.size as usize);
    let pid = d.child.id();
    // Kills and waits until each is dead (a zombie or gone), as the daemon would see it.
    let kill = |pids: Vec<u32>| {
        for p in pids {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &p.to_string()])
                .status();
            for _ in 0..500 {
                match std::fs::read_to_string(format!("/proc/{p}/stat")) {
                    Ok(st) if !st.contains(") Z ") => {
                        std::thread::sleep(std::time::Duration::from_millis(2))
                    }
                    _ => break,
                }
            }
        }
    };
    // Between commands: the idle worker and the one waiting, both gone.
    kill(worker_processes(pid, "--isp-worker"));
    convert(&c, src.id, dst.id).unwrap();
    assert_eq!(read(&c, dst.id, dst.size as usize), want);
    // While converting a large frame: that command fails with the reason, or (when the kill
    // comes before or after the worker's part) succeeds; the next one succeeds.
    let (bw, bh) = (3840, 2160);
    let big = c.alloc(0, bw, bh, Format::Nv12, 0).unwrap();
    write(&c, big.id, &nv12_pattern(bw, bh));
    let out = c.alloc(0, 2 * bw, 2 * bh, Format::Rgba8, 0).unwrap();
    let mut failed = 0;
    for delay_ms in [5u64, 20, 60, 120] {
        let killer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(delay_ms));
            kill(worker_processes(pid, "--isp-worker"));
        });
        let r = c.command_with_access(&isp::Convert {
            src: big.id,
            dst: out.id,
        });
        killer.join().unwrap();
        if let Err(e) = r {
            assert_eq!(e.status(), Status::DeviceError, "{e}");
            assert!(e.to_string().contains("swscale process"), "{e}");
            failed += 1;
        }
        convert(&c, src.id, dst.id).unwrap();
        assert_eq!(read(&c, dst.id, dst.size as usize), want);
    }
    eprintln!("{failed} of 4 large conversions met the kill");
    assert!(d.alive());
}

/// An ISP worker kept for a guest is charged to that guest's memory limit (its process and
/// its buffers): a guest whose limit holds the frames but not a worker with them gets
/// `OutOfMemory` with the reason, not a worker; a conversion between equal formats needs no
/// worker and still works; the daemon goes on.
#[test]
fn an_isp_worker_counts_against_its_guests_memory_limit() {
    let (w, h) = (1280u32, 720u32);
    // The two frames (1.4 MB + 3.7 MB) fit in 16 MiB; a worker (32 MiB) with them does not.
    let mut d = Daemon::start(&["--isp-backend", "swscale", "--guest-mem-limit", "16777216"]);
    let c = connect(&d);
    let src = c.alloc(0, w, h, Format::Nv12, 0).unwrap();
    write(&c, src.id, &nv12_pattern(w, h));
    let dst = c.alloc(0, w, h, Format::Rgba8, 0).unwrap();
    let e = c
        .command_with_access(&isp::Convert {
            src: src.id,
            dst: dst.id,
        })
        .unwrap_err();
    assert_eq!(e.status(), Status::OutOfMemory, "{e}");
    assert!(e.to_string().contains("isp worker"), "{e}");
    let pid = d.child.id();
    assert!(
        worker_processes(pid, "--isp-worker").len() <= 1,
        "only the pool's spare runs: no worker was kept for the guest"
    );
    // Equal format and size: a copy in the daemon, no worker, no charge.
    let same = c.alloc(0, w, h, Format::Nv12, 0).unwrap();
    convert(&c, src.id, same.id).unwrap();
    assert_eq!(read(&c, same.id, same.size as usize), nv12_pattern(w, h));
    drop(c);
    // A guest without a tight limit converts.
    let d2 = Daemon::start(&["--isp-backend", "swscale"]);
    let c2 = connect(&d2);
    let src = c2.alloc(0, w, h, Format::Nv12, 0).unwrap();
    write(&c2, src.id, &nv12_pattern(w, h));
    let dst = c2.alloc(0, w, h, Format::Rgba8, 0).unwrap();
    convert(&c2, src.id, dst.id).unwrap();
    assert!(d.alive());
}
