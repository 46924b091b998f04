//! Real device memory under the SVM, through real daemons: GPU-resident replicas (wgpu images
//! filled by uploads and emptied by readbacks) against the CPU reference in every protocol and
//! ordering, no stale texture after a CPU write, the ISP's GPU backend sharing the GPU's
//! memory (zero bytes between them), display planes scanned out of GPU memory, the copy
//! ledger, and one guest's large copy never holding up another guest's commands.

mod common;

use common::{cpu_read, cpu_write, nv12_pattern, Daemon};
use virtsoc_devapi::RegionId;
use virtsoc_guest::devices::{camera, display, gpu, isp, LayerRecord};
use virtsoc_guest::{
    AccessMode, ConnectOptions, Connection, DeviceId, Format, LedgerLink, Opcode, Status,
};

const W: u32 = 320;
const H: u32 = 176;

fn open(d: &Daemon, protocol: &str) -> Connection {
    Connection::connect(
        d.socket(),
        &ConnectOptions {
            coherence: Some(protocol.into()),
            window_size: 64 << 20,
            ..ConnectOptions::default()
        },
    )
    .expect("connect")
}

/// An RGBA overlay: a gradient with alpha from 40 to 240 across.
fn overlay() -> Vec<u8> {
    (0..H)
        .flat_map(|y| {
            (0..W).flat_map(move |x| {
                [
                    (255 * x / (W - 1)) as u8,
                    (255 * y / (H - 1)) as u8,
                    90,
                    (40 + 200 * x / (W - 1)) as u8,
                ]
            })
        })
        .collect()
}

fn layer(src: RegionId, blend: bool) -> LayerRecord {
    LayerRecord {
        src,
        crop: [0, 0, W, H],
        dst_pos: [0, 0],
        dst_size: [W, H],
        rotation: 0,
        alpha: 1.0,
        blend,
    }
}

struct Scene {
    video: RegionId,
    ui: RegionId,
    layers: RegionId,
    out: RegionId,
}

impl Scene {
    fn new(c: &Connection, seed: u32) -> Scene {
        let video = c.alloc(0, W, H, Format::Nv12, 0).unwrap().id;
        let mut frame = nv12_pattern(W, H);
        for b in frame.iter_mut().take((W * H) as usize) {
            *b = b.wrapping_add(seed as u8);
        }
        cpu_write(c, video, &frame);
        let ui = c.alloc(0, W, H, Format::Rgba8, 0).unwrap().id;
        cpu_write(c, ui, &overlay());
        let layers = c.alloc_blob(2 * 64).unwrap().id;
        let mut rec = layer(video, false).to_bytes().to_vec();
        rec.extend_from_slice(&layer(ui, true).to_bytes());
        cpu_write(c, layers, &rec);
        let out = c.alloc(0, W, H, Format::Rgba8, 0).unwrap().id;
        Scene {
            video,
            ui,
            layers,
            out,
        }
    }

    fn cmd(&self) -> gpu::Composite {
        gpu::Composite {
            layers: self.layers,
            count: 2,
            dst: self.out,
        }
    }

    /// Composites, atomic ordering: each request waits for the previous one.
    fn composite_atomic(&self, c: &Connection) {
        reading(c, gpu::ID, &[self.video, self.ui], true);
        c.command_with_access(&self.cmd()).unwrap();
        reading(c, gpu::ID, &[self.video, self.ui], false);
    }

    /// Composites, fence ordering: everything queued at once, then a fence the CPU reads.
    fn composite_fence(&self, c: &Connection) {
        let sz = |id| c.region(id).unwrap().size;
        let (r, w) = (AccessMode::Read as u64, AccessMode::Write as u64);
        for (id, m) in [
            (self.video, r),
            (self.ui, r),
            (self.layers, r),
            (self.out, w),
        ] {
            c.submit_detached(
                Opcode::BeginAccess,
                gpu::ID,
                [u64::from(id), 0, sz(id), m, 0, 0],
            )
            .unwrap();
        }
        use virtsoc_guest::DeviceCommand;
        let seq = c
            .submit(Opcode::DeviceCmd, gpu::ID, self.cmd().encode())
            .unwrap();
        for (id, m) in [
            (self.video, r),
            (self.ui, r),
            (self.layers, r),
            (self.out, w),
        ] {
            c.submit_detached(
                Opcode::EndAccess,
                gpu::ID,
                [u64::from(id), 0, sz(id), m, 0, 0],
            )
            .unwrap();
        }
        let f = c.fence_create().unwrap();
        c.fence_signal(gpu::ID, f).unwrap();
        let comp = c.wait(seq).unwrap();
        assert_eq!(comp.status, 0, "composite");
        // The signal after the composite fires only once the GPU finished it.
        assert!(
            c.fence_wait_cpu(f, std::time::Duration::from_secs(30))
                .unwrap(),
            "the fence never fired"
        );
        c.fence_release(f).unwrap();
        assert!(c.take_async_errors().is_empty());
    }

    fn read(&self, c: &Connection) -> Vec<u8> {
        cpu_read(c, self.out, (W * H * 4) as usize)
    }
}

/// Begins (`begin`) or ends read accesses of whole regions `ids` from `device`.
fn reading(c: &Connection, device: DeviceId, ids: &[RegionId], begin: bool) {
    for &id in ids {
        let size = c.region(id).unwrap().size;
        let r = match begin {
            true => c
                .begin_access(id, device, 0, size, AccessMode::Read)
                .map(drop),
            false => c
                .end_access(id, device, 0, size, AccessMode::Read)
                .map(drop),
        };
        r.unwrap();
    }
}

fn max_diff(a: &[u8], b: &[u8]) -> u8 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x.abs_diff(*y)).max().unwrap()
}

fn gpu_backend(c: &Connection) -> String {
    c.devices()
        .iter()
        .find(|d| d.name == "gpu")
        .map(|d| d.backend.clone())
        .unwrap_or_default()
}

/// Tolerance between wgpu (hardware bilinear filtering, 8-bit on lavapipe) and the CPU
/// reference, as in the gpu crate's tests.
const MAX_BACKEND_DIFF: u8 = 4;

#[test]
fn gpu_memory_replicas_give_the_cpu_reference_in_every_protocol_and_ordering() {
    let cpu = Daemon::start(&["--gpu-backend", "cpu"]);
    let reference = {
        let c = open(&cpu, "write-invalidate");
        let s = Scene::new(&c, 0);
        s.composite_atomic(&c);
        s.read(&c)
    };
    let wgpu = Daemon::start(&["--gpu-backend", "auto"]);
    for protocol in ["guest-staging", "write-invalidate", "prefetch"] {
        let c = open(&wgpu, protocol);
        if !gpu_backend(&c).contains("resident") {
            assert!(
                std::env::var_os("VIRTSOC_REQUIRE_ALL").is_none(),
                "no wgpu adapter ({}) and VIRTSOC_REQUIRE_ALL is set",
                gpu_backend(&c)
            );
            eprintln!("WARNING: no wgpu adapter: {}", gpu_backend(&c));
        }
        for fence in [false, true] {
            let s = Scene::new(&c, 0);
            // Several frames, so the prefetch protocol predicts and copies ahead.
            for _ in 0..3 {
                if fence {
                    s.composite_fence(&c)
                } else {
                    s.composite_atomic(&c)
                }
                let got = s.read(&c);
                let d = max_diff(&got, &reference);
                assert!(
                    d <= MAX_BACKEND_DIFF,
                    "{protocol} fence={fence}: differs from the CPU reference by {d}"
                );
            }
        }
    }
}

#[test]
fn a_cpu_write_after_a_gpu_read_is_uploaded_again() {
    let d = Daemon::start(&["--gpu-backend", "auto"]);
    for protocol in ["write-invalidate", "prefetch"] {
        let c = open(&d, protocol);
        let s = Scene::new(&c, 0);
        s.composite_atomic(&c);
        let first = s.read(&c);
        // The CPU rewrites the video (its GPU texture is now stale): the next composition
        // must see the new bytes.
        let mut frame = nv12_pattern(W, H);
        for b in frame.iter_mut().take((W * H) as usize) {
            *b = b.wrapping_add(60);
        }
        cpu_write(&c, s.video, &frame);
        s.composite_atomic(&c);
        let second = s.read(&c);
        assert!(
            max_diff(&first, &second) > 30,
            "{protocol}: the second composition used the stale texture"
        );
        // And a sub-range write uploads only that range, still seen.
        let gpu_domain = c
            .devices()
            .iter()
            .find(|x| x.name == "gpu")
            .unwrap()
            .domain_id;
        let into_gpu = || -> u64 {
            c.ledger()
                .unwrap()
                .iter()
                .filter(|l| l.dst == gpu_domain && l.src != gpu_domain)
                .map(|l| l.bytes)
                .sum()
        };
        let before = into_gpu();
        let row = vec![235u8; W as usize];
        let size = c.region(s.video).unwrap().size;
        let a = c
            .begin_access(s.video, DeviceId::CPU, 0, W as u64, AccessMode::Write)
            .unwrap();
        // SAFETY: the library checked [ptr, ptr + W) inside the window.
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), a.ptr.unwrap().as_ptr(), row.len()) };
        c.end_access(s.video, DeviceId::CPU, 0, W as u64, AccessMode::Write)
            .unwrap();
        s.composite_atomic(&c);
        let uploaded = into_gpu() - before;
        let third = s.read(&c);
        assert_eq!(
            uploaded, W as u64,
            "{protocol}: a one-row write of a {size} byte frame uploads the row"
        );
        assert_ne!(third[..(W * 4) as usize], second[..(W * 4) as usize]);
    }
}

fn links(c: &Connection) -> Vec<(String, LedgerLink)> {
    c.ledger()
        .unwrap()
        .into_iter()
        .map(|l| {
            (
                format!("{}->{}", c.domain_name(l.src), c.domain_name(l.dst)),
                l,
            )
        })
        .collect()
}

#[test]
fn the_isp_gpu_backend_and_the_gpu_share_memory_and_move_zero_bytes_between_them() {
    let d = Daemon::start(&["--gpu-backend", "auto", "--isp-backend", "gpu"]);
    let c = open(&d, "write-invalidate");
    let domain = |name: &str| {
        c.devices()
            .iter()
            .find(|x| x.name == name)
            .unwrap()
            .domain_id
    };
    assert_eq!(
        domain("isp"),
        domain("gpu"),
        "one physical device, one domain"
    );
    assert_eq!(domain("display"), domain("gpu"), "scan-out from GPU memory");
    let cam = c.alloc(0, W, H, Format::Nv12, 0).unwrap();
    let rgb = c.alloc(0, W, H, Format::Rgba8, 0).unwrap();
    let out = c.alloc(0, W, H, Format::Rgba8, 0).unwrap();
    let layers = c.alloc_blob(64).unwrap().id;
    cpu_write(&c, layers, &layer(rgb.id, false).to_bytes());
    for _ in 0..3 {
        c.command_with_access(&camera::Capture { frame: cam.id })
            .unwrap();
        c.command_with_access(&isp::Convert {
            src: cam.id,
            dst: rgb.id,
        })
        .unwrap();
        c.begin_access(rgb.id, gpu::ID, 0, rgb.size, AccessMode::Read)
            .unwrap();
        c.command_with_access(&gpu::Composite {
            layers,
            count: 1,
            dst: out.id,
        })
        .unwrap();
        c.end_access(rgb.id, gpu::ID, 0, rgb.size, AccessMode::Read)
            .unwrap();
    }
    let ledger = links(&c);
    let gpu_name = c.domain_name(domain("gpu"));
    for (name, l) in &ledger {
        // The camera's frames are uploaded into GPU memory (and the layer records written
        // by the CPU); nothing else moves: the ISP's output is already where the GPU reads.
        let upload = *name == format!("camera->{gpu_name}");
        let records = name.starts_with("guest-window->");
        assert!(upload || records, "unexpected copies on {name}: {l:?}");
    }
    let uploads = ledger
        .iter()
        .find(|(n, _)| *n == format!("camera->{gpu_name}"))
        .map(|(_, l)| l.copies)
        .unwrap_or(0);
    assert_eq!(uploads, 3, "one upload per camera frame: {ledger:?}");
}

#[test]
fn display_planes_scan_out_of_gpu_memory_and_every_copy_is_on_the_ledger() {
    let d = Daemon::start(&["--gpu-backend", "auto", "--display-size", "320x176"]);
    let c = open(&d, "write-invalidate");
    let s = Scene::new(&c, 0);
    let frames = 4u64;
    for i in 0..frames {
        // The decoder's stand-in: the CPU writes the NV12 frame; the display shows it as a
        // plane under the UI plane.
        let mut f = nv12_pattern(W, H);
        f[0] = i as u8;
        cpu_write(&c, s.video, &f);
        reading(&c, display::ID, &[s.video, s.ui], true);
        c.command_with_access(&display::PresentLayers {
            layers: s.layers,
            count: 2,
            capture_ns: 1,
        })
        .unwrap();
        reading(&c, display::ID, &[s.video, s.ui], false);
    }
    let gpu_domain = c
        .devices()
        .iter()
        .find(|x| x.name == "display")
        .unwrap()
        .domain_id;
    let to_gpu: Vec<_> = links(&c)
        .into_iter()
        .filter(|(_, l)| l.dst == gpu_domain)
        .collect();
    let size = |id| c.region(id).unwrap().size;
    let moved: u64 = to_gpu.iter().map(|(_, l)| l.bytes).sum();
    // Each video frame uploaded once, the unchanged UI once, the layer records once, nothing
    // else (the display copies nothing when presenting planes).
    assert_eq!(
        moved,
        frames * size(s.video) + size(s.ui) + size(s.layers),
        "bytes into GPU memory: {to_gpu:?}"
    );
    let c2 = c.counters().unwrap();
    assert_eq!(c2.device_copies, 0, "presenting planes copies nothing");
    // More layers than planes, or a rotation: NotSupported (the guest composes instead).
    let five = c.alloc_blob(5 * 64).unwrap().id;
    let rec: Vec<u8> = (0..5).flat_map(|_| layer(s.ui, true).to_bytes()).collect();
    cpu_write(&c, five, &rec);
    let r = c.command_with_access(&display::PresentLayers {
        layers: five,
        count: 5,
        capture_ns: 0,
    });
    assert_eq!(common::status_of(r), Status::NotSupported);
}

#[test]
fn one_guests_copy_in_flight_does_not_hold_up_another_guests_commands() {
    use virtsoc_guest::testdev;
    // Every asynchronous copy waits 3 s before it starts (fault injection): A's copy is
    // certainly still in flight while B is served, however loaded the machine is.
    let d = Daemon::start(&["--test-dma-delay-ms", "3000"]);
    let a = Connection::connect(
        d.socket(),
        &ConnectOptions {
            coherence: Some("prefetch".into()),
            window_size: 64 << 20,
            ..ConnectOptions::default()
        },
    )
    .unwrap();
    let b = open(&d, "write-invalidate");
    let big: u64 = 16 << 20;
    let id = a.alloc_blob(big).unwrap().id;
    let (w, r) = (AccessMode::Write, AccessMode::Read);
    let round = |seed: u64| {
        a.begin_access(id, DeviceId::PRODUCER, 0, big, w).unwrap();
        a.device_cmd(
            DeviceId::PRODUCER,
            [testdev::WRITE_PATTERN, u64::from(id), seed, 0, 0, 0],
        )
        .unwrap()[0]
    };
    // Teach A's predictor producer -> consumer (the prefetches of the training rounds wait
    // 3 s each: A's reads fetch synchronously meanwhile, which is fine here).
    for seed in 0..3 {
        round(seed);
        a.end_access(id, DeviceId::PRODUCER, 0, big, w).unwrap();
        a.begin_access(id, DeviceId::CONSUMER, 0, big, r).unwrap();
        a.end_access(id, DeviceId::CONSUMER, 0, big, r).unwrap();
    }
    let crc = round(9);
    // The write ends (a prefetch to the consumer starts, held 3 s) and A's read is queued on
    // the consumer right away: it must wait for the copy...
    let end = a
        .submit(
            Opcode::EndAccess,
            DeviceId::PRODUCER,
            [
                u64::from(id),
                0,
                big,
                w as u64,
                virtsoc_guest::ACCESS_COMPENSATES,
                0,
            ],
        )
        .unwrap();
    // The producer's worker has ended the write (and started the held copy) before the read
    // reaches the consumer's worker (the two workers are not ordered otherwise).
    assert_eq!(a.wait(end).unwrap().status, 0);
    let waits_before = a.counters().unwrap().inflight_waits;
    let a_read = a
        .submit(
            Opcode::BeginAccess,
            DeviceId::CONSUMER,
            [u64::from(id), 0, big, r as u64, 0, 0],
        )
        .unwrap();
    let fa = a.fence_create().unwrap();
    a.fence_signal(DeviceId::CONSUMER, fa).unwrap();
    // ...while B's command on the same device is served meanwhile.
    let small = b.alloc_blob(4096).unwrap().id;
    cpu_write(&b, small, &[7u8; 4096]);
    b.begin_access(small, DeviceId::CONSUMER, 0, 4096, r)
        .unwrap();
    b.device_cmd(
        DeviceId::CONSUMER,
        [testdev::CHECKSUM, u64::from(small), 0, 0, 0, 0],
    )
    .unwrap();
    let served_first = !a.fence_signaled(fa).unwrap();
    assert!(served_first, "B's command was served only after A's copy");
    // A's read completes after its copy (it waited for it, parked), with the bytes.
    assert_eq!(a.wait(a_read).unwrap().status, 0);
    assert_eq!(
        a.counters().unwrap().inflight_waits,
        waits_before + 1,
        "A's read waited for its copy in flight"
    );
    let got = a
        .device_cmd(
            DeviceId::CONSUMER,
            [testdev::CHECKSUM, u64::from(id), 0, 0, 0, 0],
        )
        .unwrap()[0];
    assert_eq!(got, crc);
}

#[test]
fn verify_mode_checksums_match_the_cpu_reference() {
    use virtsoc_gpu::{CpuBackend, FrameLayout, FrameRef, GpuBackend, Layer, OwnedFrame, Rect};
    let d = Daemon::start(&[
        "--gpu-backend",
        "wgpu",
        "--display-size",
        "320x176",
        "--display-verify",
    ]);
    let c = open(&d, "prefetch");
    let s = Scene::new(&c, 7);
    // The reference: the same two layers composed by the CPU over a black, opaque screen.
    let mut video = nv12_pattern(W, H);
    for b in video.iter_mut().take((W * H) as usize) {
        *b = b.wrapping_add(7);
    }
    let ui = overlay();
    let mut want =
        OwnedFrame::new(FrameLayout::packed(virtsoc_gpu::PixelFormat::Rgba8, W, H).unwrap())
            .unwrap();
    for px in want.data.chunks_exact_mut(4) {
        px[3] = 255;
    }
    let full = Rect::new(0, 0, W, H);
    let nv12 = FrameLayout::packed(virtsoc_gpu::PixelFormat::Nv12, W, H).unwrap();
    let rgba = FrameLayout::packed(virtsoc_gpu::PixelFormat::Rgba8, W, H).unwrap();
    CpuBackend::new()
        .composite(
            &[
                Layer::new(FrameRef::new(nv12, &video).unwrap(), full).with_blend(false),
                Layer::new(FrameRef::new(rgba, &ui).unwrap(), full),
            ],
            want.as_mut(),
        )
        .unwrap();
    let want_crc = crc32fast::hash(&want.data) as u64;
    for _ in 0..3 {
        reading(&c, display::ID, &[s.video, s.ui], true);
        let shown = c
            .command_with_access(&display::PresentLayers {
                layers: s.layers,
                count: 2,
                capture_ns: 1,
            })
            .unwrap();
        reading(&c, display::ID, &[s.video, s.ui], false);
        let v = c.command(&display::Checksum::default()).unwrap();
        assert_eq!(v.frame_id, shown.frame_id);
        assert_eq!(
            v.crc, want_crc,
            "the planes scanned out of GPU memory compose to the CPU reference"
        );
    }
    // Without --display-verify the command is not supported.
    let plain = Daemon::start(&[]);
    let c = open(&plain, "prefetch");
    assert_eq!(
        common::status_of(c.command(&display::Checksum::default())),
        Status::NotSupported
    );
}

/// Freeing regions while the GPU may still be using their images (the guest did not drain):
/// the host keeps what a submission uses until it completes (or refuses the command cleanly
/// if the regions were gone first), and the memory goes back once it is done.
#[test]
fn regions_freed_under_a_gpu_submission_are_released_after_it() {
    let d = Daemon::start(&["--gpu-backend", "auto"]);
    let c = open(&d, "write-invalidate");
    let (w, h) = (1920u32, 1088u32);
    let video = c.alloc(0, w, h, Format::Nv12, 0).unwrap();
    let ui = c.alloc(0, w, h, Format::Rgba8, 0).unwrap();
    let out = c.alloc(0, w, h, Format::Rgba8, 0).unwrap();
    cpu_write(&c, video.id, &nv12_pattern(w, h));
    let layers = c.alloc_blob(2 * 64).unwrap().id;
    let full = |src| LayerRecord {
        src,
        crop: [0, 0, w, h],
        dst_pos: [0, 0],
        dst_size: [w, h],
        rotation: 0,
        alpha: 1.0,
        blend: true,
    };
    let mut rec = full(video.id).to_bytes().to_vec();
    rec.extend_from_slice(&full(ui.id).to_bytes());
    cpu_write(&c, layers, &rec);
    for (id, size, m) in [
        (video.id, video.size, AccessMode::Read),
        (ui.id, ui.size, AccessMode::Read),
    ] {
        c.begin_access(id, gpu::ID, 0, size, m).unwrap();
    }
    use virtsoc_guest::DeviceCommand;
    let cmd = gpu::Composite {
        layers,
        count: 2,
        dst: out.id,
    };
    for (id, size, m) in [
        (layers, 128, AccessMode::Read),
        (out.id, out.size, AccessMode::Write),
    ] {
        c.begin_access(id, gpu::ID, 0, size, m).unwrap();
    }
    let seq = c.submit(Opcode::DeviceCmd, gpu::ID, cmd.encode()).unwrap();
    // Freed right away, while the composition is queued or running.
    for id in [video.id, ui.id, out.id] {
        c.free(id).unwrap();
    }
    let st = c.wait(seq).unwrap().status;
    assert!(
        st == 0 || st == Status::NoSuchRegion as u32 || st == Status::BadArgument as u32,
        "the command finished or was refused cleanly: status {st}"
    );
    let (regions, bytes) = c.usage().unwrap();
    assert_eq!(regions, 1, "only the layer records are left");
    assert!(bytes < 1 << 20, "{bytes} bytes still held");
    // The daemon goes on serving this guest and others.
    let other = open(&d, "prefetch");
    let s = Scene::new(&other, 1);
    s.composite_atomic(&other);
    assert_eq!(s.read(&other).len(), (W * H * 4) as usize);
}

/// A display plane whose source is a CPU device's output (the swscale ISP's, in host memory)
/// is scanned out where it is, as a display controller reads system RAM: nothing moves into
/// GPU memory but the layer records, the display's checksum (verify mode) is that of the
/// ISP's output, and the guest-staging baseline still uploads every frame.
#[test]
fn display_planes_of_host_memory_are_scanned_out_in_place() {
    for (protocol, in_place) in [
        ("write-invalidate", true),
        ("prefetch", true),
        ("guest-staging", false),
    ] {
        let d = Daemon::start(&["--display-size", "320x176", "--display-verify"]);
        let c = open(&d, protocol);
        let cam = c.alloc(0, W, H, Format::Nv12, 0).unwrap();
        let rgb = c.alloc(0, W, H, Format::Rgba8, 0).unwrap();
        let layers = c.alloc_blob(64).unwrap().id;
        cpu_write(&c, layers, &layer(rgb.id, false).to_bytes());
        let frames = 4u64;
        for _ in 0..frames {
            c.command_with_access(&camera::Capture { frame: cam.id })
                .unwrap();
            c.command_with_access(&isp::Convert {
                src: cam.id,
                dst: rgb.id,
            })
            .unwrap();
            c.begin_access(rgb.id, display::ID, 0, rgb.size, AccessMode::Read)
                .unwrap();
            let shown = c
                .command_with_access(&display::PresentLayers {
                    layers,
                    count: 1,
                    capture_ns: 0,
                })
                .unwrap();
            c.end_access(rgb.id, display::ID, 0, rgb.size, AccessMode::Read)
                .unwrap();
            let v = c.command(&display::Checksum::default()).unwrap();
            assert_eq!(v.frame_id, shown.frame_id);
            let want = crc32fast::hash(&cpu_read(&c, rgb.id, rgb.size as usize)) as u64;
            assert_eq!(v.crc, want, "{protocol}: the screen is the ISP's output");
        }
        let gpu_domain = c
            .devices()
            .iter()
            .find(|x| x.name == "display")
            .unwrap()
            .domain_id;
        let into_gpu: u64 = links(&c)
            .into_iter()
            // Copies into GPU memory; the display's own (verify mode composing each
            // frame) are src == dst.
            .filter(|(_, l)| l.dst == gpu_domain && l.src != gpu_domain)
            .map(|(_, l)| l.bytes)
            .sum();
        if in_place {
            assert_eq!(
                into_gpu,
                64,
                "{protocol}: only the layer records: {:?}",
                links(&c)
            );
        } else {
            assert!(
                into_gpu >= frames * rgb.size,
                "{protocol}: the baseline uploads each frame: {:?}",
                links(&c)
            );
        }
    }
}

/// `gpu::composite_damage` through the daemon: after a whole composition, the guest changes
/// the UI and recomposes only a damaged rectangle. Inside it the result is the new
/// composition (the CPU reference's, within the backends' tolerance), outside it the pixels
/// of the first one, unchanged; on GPU memory and on the CPU backend, in every protocol. A
/// rectangle outside the target is `BadArgument`.
#[test]
fn a_damaged_rectangle_is_recomposed_and_the_rest_kept() {
    use virtsoc_guest::devices::pack_damage;
    let (x0, y0, dw, dh) = (40u32, 24u32, 96u32, 64u32);
    let inside = |i: usize| {
        let (x, y) = ((i % W as usize) as u32, (i / W as usize) as u32);
        (x0..x0 + dw).contains(&x) && (y0..y0 + dh).contains(&y)
    };
    let cpu = Daemon::start(&["--gpu-backend", "cpu"]);
    for backend in ["cpu", "wgpu"] {
        let d = Daemon::start(&["--gpu-backend", backend]);
        for protocol in ["write-invalidate", "prefetch", "guest-staging"] {
            let c = open(&d, protocol);
            let s = Scene::new(&c, 3);
            s.composite_atomic(&c);
            let before = s.read(&c);
            // The UI changes; the reference is the whole composition of the new UI.
            let ui: Vec<u8> = overlay().iter().map(|b| b.wrapping_add(77)).collect();
            cpu_write(&c, s.ui, &ui);
            let want = {
                let rc = open(&cpu, protocol);
                let r = Scene::new(&rc, 3);
                cpu_write(&rc, r.ui, &ui);
                r.composite_atomic(&rc);
                r.read(&rc)
            };
            reading(&c, gpu::ID, &[s.video, s.ui], true);
            let damage = pack_damage(x0 as u16, y0 as u16, dw as u16, dh as u16);
            c.command_with_access(&gpu::CompositeDamage {
                layers: s.layers,
                count: 2,
                dst: s.out,
                damage,
            })
            .unwrap();
            let bad = c.command_with_access(&gpu::CompositeDamage {
                layers: s.layers,
                count: 2,
                dst: s.out,
                damage: pack_damage(W as u16 - 8, 0, 16, 16),
            });
            assert_eq!(
                common::status_of(bad),
                Status::BadArgument,
                "{backend} {protocol}"
            );
            reading(&c, gpu::ID, &[s.video, s.ui], false);
            let after = s.read(&c);
            let (mut changed, mut kept) = (0, 0);
            for (i, ((a, b), w)) in after
                .chunks_exact(4)
                .zip(before.chunks_exact(4))
                .zip(want.chunks_exact(4))
                .enumerate()
            {
                if inside(i) {
                    assert!(
                        max_diff(a, w) <= MAX_BACKEND_DIFF,
                        "{backend} {protocol}: pixel {i} inside: {a:?} vs {w:?}"
                    );
                    changed += usize::from(a != b);
                } else {
                    assert_eq!(a, b, "{backend} {protocol}: pixel {i} outside changed");
                    kept += 1;
                }
            }
            assert!(changed > 0, "{backend} {protocol}: the new UI shows inside");
            assert_eq!(kept, (W * H - dw * dh) as usize);
        }
    }
}
