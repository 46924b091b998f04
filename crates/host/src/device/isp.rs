//! The isp device: colour conversion and scaling between NV12, YUV420P, RGBA8 and BGRA8, with
//! the formats and sizes taken from the two regions' metadata.
//!
//! # Backends (`--isp-backend`)
//!
//! * `swscale`: libswscale, bilinear (the default); `virtsocd` runs it in sandboxed worker
//!   processes (`DeviceConfig::isp_worker`, `--isp-swscale process`): a crash or hang of
//!   libswscale then fails that command alone (`DeviceError` with the reason) and the next
//!   command takes a fresh worker, at the cost of two more copies per frame (the source
//!   into memory shared with the worker, the result out of it). A guest's worker is kept
//!   between its conversions and charged to its memory limit (the process and its two
//!   buffers: `OutOfMemory` when the limit refuses them), and ended after
//!   [`virtsoc_media::isp::IDLE_TIMEOUT`] without a conversion.
//! * `cpu`: the plain-Rust reference of `virtsoc-media` (BT.601 limited range, bilinear).
//! * `gpu`: the GPU device's backend (a compute shader on wgpu), shared with the gpu device
//!   and numbered on its timeline. It writes RGBA8/BGRA8 only, so conversions into NV12 or
//!   YUV420P go to swscale (in a worker, as above, when the daemon runs it there).
//! * `null`: copies between equal formats and sizes, answers `NotSupported` otherwise.
//!
//! # Regions and locking
//!
//! `convert(src, dst)` names both regions as arguments, so the guest brackets both with
//! accesses from this device. Both replicas' buffers are locked at once (in address order,
//! never the regions themselves) and the source is read in place: the ISP copies no frame
//! bytes besides its output. `src == dst` converts nothing.
//!
//! # Guests beside each other
//!
//! With libswscale in worker processes each guest converts in a worker of its own, so when
//! another guest uses the device a conversion runs on a thread of its own and is answered
//! there (`Isp::execute_apart`): one guest's large conversions no longer hold another's.
//! A guest alone, and the other backends, convert on the device's thread.
//!
//! Bad input answers a status: `NotSupported` for a Blob or YUYV region or a conversion the
//! backend cannot do, `BadArgument` for a malformed layout, `OutOfRange` when a region is
//! smaller than its frame, `DeviceError` when the backend fails.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use virtsoc_devapi::isp::Command;
use virtsoc_media::isp::ISP_WORKER_ARG;
use virtsoc_media::{
    Charge, ChargeError, CpuIsp, FrameMut, FrameRef, IspBackend, MediaError, NullIsp, ProcessIsp,
    SwscaleIsp, WorkerPool,
};
use virtsoc_proto::Status;
use virtsoc_svm::{GuestId, RegionId};
use virtsoc_sync::LockExt;

use super::gpu::Gpu;
use super::layers::layout_of;
use super::registry::{DeviceConfig, IspBackendKind};
use super::{Device, DeviceCtx, DeviceResult, Reply};
use crate::status::status_of;
use crate::Result;

/// What converts.
enum Engine {
    /// A `virtsoc-media` backend (swscale, CPU reference, null).
    Media(Box<dyn IspBackend>),
    /// The GPU device's backend for RGB destinations, swscale for YUV ones.
    Gpu {
        gpu: Arc<Gpu>,
        yuv: Box<dyn IspBackend>,
    },
}

/// ISP workers kept started ahead (one converts every command until it fails).
const ISP_WORKER_SPARES: usize = 1;

/// libswscale where `cfg` says: in worker processes of `cfg.isp_worker`, else here; and its
/// description.
fn swscale(cfg: &DeviceConfig) -> (Box<dyn IspBackend>, &'static str) {
    match &cfg.isp_worker {
        Some(program) => {
            let pool = WorkerPool::new(program, &[ISP_WORKER_ARG.to_string()], ISP_WORKER_SPARES);
            (
                Box::new(ProcessIsp::new(pool)),
                "libswscale (bilinear) in sandboxed worker processes",
            )
        }
        None => (Box::new(SwscaleIsp::new()), "libswscale (bilinear)"),
    }
}

/// The isp device.
pub struct Isp {
    engine: Arc<Engine>,
    desc: String,
    /// Conversions of different guests may run at once (libswscale in worker processes,
    /// one per guest): see `Isp::execute_apart`.
    apart: bool,
    /// The guests that have used the device and not gone yet (kept where `apart`).
    users: Mutex<BTreeSet<GuestId>>,
    /// Conversions running apart now, and the most that may ([`apart_max`]).
    apart_now: Arc<AtomicUsize>,
}

/// The most conversions that run apart at once: one per core (at least 2). Past it a
/// conversion runs on the device's thread, so many guests converting at once share the
/// cores through the device's scheduler rather than all at once in the kernel's.
fn apart_max() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}

/// One of the [`apart_max`] conversions running apart, given back when dropped.
struct ApartSlot(Arc<AtomicUsize>);

impl Drop for ApartSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Isp {
    /// Builds the device from the daemon's configuration (`cfg.isp`: swscale, gpu, cpu or
    /// null); the `gpu` backend runs on `gpu`'s backend.
    pub fn new(cfg: &DeviceConfig, gpu: &Arc<Gpu>) -> Result<Self> {
        let media = |b: Box<dyn IspBackend>, desc: &str| (Engine::Media(b), desc.to_string());
        let (engine, desc) = match cfg.isp {
            IspBackendKind::Swscale => {
                let (b, desc) = swscale(cfg);
                media(b, desc)
            }
            IspBackendKind::Cpu => {
                media(Box::new(CpuIsp::new()), "cpu reference (bilinear, BT.601)")
            }
            IspBackendKind::Null => media(Box::new(NullIsp::new()), "null (copies equal formats)"),
            IspBackendKind::Gpu => {
                let (yuv, yuv_desc) = swscale(cfg);
                (
                    Engine::Gpu {
                        gpu: gpu.clone(),
                        yuv,
                    },
                    format!(
                        "gpu compute on the gpu device's {} backend (YUV destinations: {yuv_desc})",
                        gpu.backend_name()
                    ),
                )
            }
        };
        log::info!("isp: {desc}");
        let apart = matches!(engine, Engine::Media(_)) && cfg.isp_worker.is_some();
        Ok(Isp {
            engine: Arc::new(engine),
            desc,
            apart,
            users: Mutex::default(),
            apart_now: Arc::default(),
        })
    }

    /// Runs `args` of `cx`'s guest on a thread of its own and answers it there, when
    /// conversions may run at once and another guest uses the device: gives `reply` back
    /// otherwise (or without a thread), to run the command here. Each guest's conversions
    /// run in a worker process of its own, so one guest's large conversion (tens of
    /// milliseconds at 3840x2160) does not hold another's ([`apart_max`] at once): until
    /// stop 51 the device's thread waited for every one, and a guest converting UHD
    /// pictures back to back took the victim's 720p camera of `bench isolation` to 73-90%
    /// of its frame rate alone (`--hostile slow-isp`, `docs/results.md` stop 51). At most
    /// one command of a guest is in flight (its queue is held until the answer): one
    /// thread a guest at most.
    fn execute_apart(&self, cx: &DeviceCtx<'_>, args: &[u64; 6], reply: Reply) -> Option<Reply> {
        if !self.apart {
            return Some(reply);
        }
        let others = {
            let mut users = self.users.lock_or_recover();
            users.insert(cx.guest);
            users.iter().any(|g| *g != cx.guest)
        };
        if !others {
            return Some(reply);
        }
        let max = apart_max();
        let taken = self
            .apart_now
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        if taken.is_err() {
            return Some(reply);
        }
        let running = ApartSlot(self.apart_now.clone());
        let engine = self.engine.clone();
        let (guest, svm, domain) = (cx.guest, cx.svm.clone(), cx.domain);
        let (fences, reads_host, args) = (cx.fences.clone(), cx.reads_host, *args);
        let slot = Arc::new(Mutex::new(Some(reply)));
        let kept = slot.clone();
        let started = std::thread::Builder::new()
            .name("isp-convert".into())
            .spawn(move || {
                let Some(reply) = kept.lock_or_recover().take() else {
                    return;
                };
                let cx = DeviceCtx::new(guest, &svm, domain, &fences).reading_host(reads_host);
                let result = engine.execute(&cx, &args);
                drop(running);
                reply.send_because(result, cx.take_reason());
            });
        match started {
            Ok(_) => None,
            // No thread (its slot given back with it): here, as before.
            Err(_) => slot.lock_or_recover().take(),
        }
    }
}

impl Engine {
    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult {
        match Command::decode(args)? {
            Command::Convert(c) => self.convert(cx, c.src, c.dst),
        }
    }

    fn convert(&self, cx: &DeviceCtx<'_>, src: RegionId, dst: RegionId) -> DeviceResult {
        let src_layout = layout_of(cx, src)?;
        let dst_layout = layout_of(cx, dst)?;
        if src == dst {
            // One region is one format and size: converting it into itself changes nothing.
            return Ok([0; 6]);
        }
        let (n, dn) = (src_layout.size(), dst_layout.size());
        if cx.source_in_device_memory(src) || cx.in_device_memory(dst) {
            // GPU memory (the `gpu` backend's YUV destinations, which swscale writes): read
            // back, convert on the CPU, upload; every copy on the ledger.
            let s = cx.read_bytes(src, n)?;
            let mut d = vec![0u8; dn];
            self.convert_frame(
                Some(cx),
                FrameRef {
                    layout: src_layout,
                    data: &s,
                },
                FrameMut {
                    layout: dst_layout,
                    data: &mut d,
                },
            )?;
            cx.write_bytes(dst, &d)?;
            return Ok([0; 6]);
        }
        // Both replicas are locked at once: the source is read in place, not copied out.
        cx.with_regions(src, dst, |s, d| {
            let s = s.get(..n).ok_or(Status::OutOfRange)?;
            let d = d.get_mut(..dn).ok_or(Status::OutOfRange)?;
            self.convert_frame(
                Some(cx),
                FrameRef {
                    layout: src_layout,
                    data: s,
                },
                FrameMut {
                    layout: dst_layout,
                    data: d,
                },
            )
        })??;
        Ok([0; 6])
    }

    /// Converts `src` into `dst`; a backend's error is a status, its reason recorded on
    /// `cx` (when there is one) for the guest.
    fn convert_frame(
        &self,
        cx: Option<&DeviceCtx<'_>>,
        src: FrameRef<'_>,
        dst: FrameMut<'_>,
    ) -> std::result::Result<(), Status> {
        // Each guest's conversions in workers of its own (`ProcessIsp`), what they keep
        // charged to the guest's memory limit for as long as they keep it.
        let tenant = cx.map_or(0, |cx| cx.guest.0);
        let charge = |bytes: u64| -> std::result::Result<Charge, ChargeError> {
            match cx {
                Some(cx) => cx
                    .svm
                    .charge(cx.guest, bytes)
                    .map(|c| Box::new(c) as Charge)
                    .map_err(ChargeError::from),
                None => Ok(Box::new(())),
            }
        };
        let media = |b: &dyn IspBackend, src, dst| {
            b.convert_charged(tenant, src, dst, &charge).map_err(|e| {
                log::debug!("isp: {}: {e}", b.name());
                let status = status_of(&e);
                match cx {
                    Some(cx) => cx.fail(status, reason_of(&e)),
                    None => status,
                }
            })
        };
        match self {
            Engine::Media(b) => media(b.as_ref(), src, dst),
            Engine::Gpu { yuv, .. } if dst.layout.format.is_yuv() => media(yuv.as_ref(), src, dst),
            Engine::Gpu { gpu, .. } => gpu.convert_frame(src, dst).map(|_| ()),
        }
    }
}

impl Device for Isp {
    fn name(&self) -> &str {
        "isp"
    }

    fn memory_domain(&self) -> &str {
        match self.engine.as_ref() {
            // The GPU backend is the GPU itself: one physical device, one memory.
            Engine::Gpu { .. } => "gpu",
            Engine::Media(_) => "isp",
        }
    }

    fn answers_apart(&self) -> bool {
        // Conversions in workers, beside another guest's (`execute_apart`).
        true
    }

    fn reads_host_memory(&self) -> bool {
        // The CPU backends read a source where it is current in host memory (a camera
        // frame); the GPU backend reads its own memory.
        matches!(self.engine.as_ref(), Engine::Media(_))
    }

    fn backend(&self) -> String {
        self.desc.clone()
    }

    fn guest_gone(&self, guest: GuestId) {
        self.users.lock_or_recover().remove(&guest);
        // Its swscale workers end (another guest never gets them).
        match self.engine.as_ref() {
            Engine::Media(b) => b.forget(guest.0),
            Engine::Gpu { yuv, .. } => yuv.forget(guest.0),
        }
    }

    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult {
        self.engine.execute(cx, args)
    }

    fn execute_async(&self, cx: &DeviceCtx<'_>, args: &[u64; 6], reply: Reply) {
        // The GPU backend on resident images (RGB destinations): submitted, answered when
        // the GPU is done, zero copies (the ISP works in the GPU's memory).
        if let (Engine::Gpu { gpu, .. }, Ok(Command::Convert(c))) =
            (self.engine.as_ref(), Command::decode(args))
        {
            let rgb = layout_of(cx, c.dst).map(|l| !l.format.is_yuv());
            match (rgb, gpu.images(cx, c.src, c.dst)) {
                (Ok(true), Ok(Some((src, dst)))) if c.src != c.dst => {
                    return gpu.convert_images(cx.guest, &src, &dst, reply);
                }
                (Err(st), _) | (_, Err(st)) => return reply.send(Err(st)),
                _ => {}
            }
        }
        let Some(reply) = self.execute_apart(cx, args, reply) else {
            return;
        };
        let result = self.execute(cx, args);
        reply.send_because(result, cx.take_reason());
    }
}

/// The reason a guest sees for a backend error, as short as the completion's room allows: a
/// worker's failure without its name and advice ("swscale process exited (signal: 9 ...)").
fn reason_of(e: &MediaError) -> String {
    match e {
        MediaError::Worker(m) => {
            let m = m.trim_start_matches("isp-worker: ");
            m.split_once(';').map_or(m, |(what, _)| what).to_string()
        }
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtsoc_media::{FrameLayout, PixelFormat};

    fn cfg(isp: &str, gpu: &str) -> DeviceConfig {
        use clap::ValueEnum;
        DeviceConfig {
            isp: ValueEnum::from_str(isp, false).unwrap(),
            gpu: ValueEnum::from_str(gpu, false).unwrap(),
            ..DeviceConfig::default()
        }
    }

    #[test]
    fn a_worker_failure_is_a_short_reason() {
        let e = MediaError::Worker(
            "isp-worker: swscale process exited (signal: 9 (SIGKILL)); the next conversion \
             starts another"
                .into(),
        );
        assert_eq!(status_of(&e), Status::DeviceError);
        assert_eq!(
            reason_of(&e),
            "swscale process exited (signal: 9 (SIGKILL))"
        );
    }

    #[test]
    fn errors_map_to_statuses() {
        assert_eq!(
            status_of(&MediaError::Unsupported("x".into())),
            Status::NotSupported
        );
        assert_eq!(
            status_of(&MediaError::InvalidLayout("x".into())),
            Status::BadArgument
        );
    }

    fn nv12_grey(w: u32, h: u32) -> (FrameLayout, Vec<u8>) {
        let l = FrameLayout::packed(PixelFormat::Nv12, w, h).unwrap();
        let mut b = vec![128u8; l.size()];
        b[..(w * h) as usize].fill(126);
        (l, b)
    }

    #[test]
    fn every_backend_converts_or_refuses_cleanly() {
        let gpu = Arc::new(Gpu::new(&cfg("swscale", "cpu")).unwrap());
        let (sl, src) = nv12_grey(16, 8);
        for name in ["swscale", "cpu", "gpu", "null"] {
            let isp = Isp::new(&cfg(name, "cpu"), &gpu).unwrap();
            for (fmt, w, h) in [
                (PixelFormat::Rgba8, 16, 8),
                (PixelFormat::Bgra8, 8, 4),
                (PixelFormat::Yuv420p, 8, 4),
            ] {
                let dl = FrameLayout::packed(fmt, w, h).unwrap();
                let mut dst = vec![0u8; dl.size()];
                let r = isp.engine.convert_frame(
                    None,
                    FrameRef {
                        layout: sl,
                        data: &src,
                    },
                    FrameMut {
                        layout: dl,
                        data: &mut dst,
                    },
                );
                if name == "null" {
                    assert_eq!(r, Err(Status::NotSupported), "{name} {fmt:?}");
                    continue;
                }
                r.unwrap_or_else(|s| panic!("{name} {fmt:?}: {s:?}"));
                // Y 126, U = V = 128: grey 128 +- rounding.
                let v = if fmt.is_yuv() { dst[0] } else { dst[1] };
                let want = if fmt.is_yuv() { 126 } else { 128 };
                assert!(v.abs_diff(want) <= 2, "{name} {fmt:?}: {v}");
            }
        }
        // A buffer shorter than its layout is refused, not read past.
        let isp = Isp::new(&cfg("cpu", "cpu"), &gpu).unwrap();
        let dl = FrameLayout::packed(PixelFormat::Rgba8, 16, 8).unwrap();
        let mut dst = vec![0u8; 10];
        assert_eq!(
            isp.engine.convert_frame(
                None,
                FrameRef {
                    layout: sl,
                    data: &src
                },
                FrameMut {
                    layout: dl,
                    data: &mut dst
                }
            ),
            Err(Status::OutOfRange)
        );
    }

    /// A backend whose conversions wait for the test's word, then fill the destination
    /// with 0x42.
    struct Held(Mutex<std::sync::mpsc::Receiver<()>>);

    impl IspBackend for Held {
        fn name(&self) -> &str {
            "held"
        }
        fn convert(&self, _src: FrameRef<'_>, dst: FrameMut<'_>) -> virtsoc_media::Result<()> {
            let go = self.0.lock_or_recover();
            go.recv_timeout(std::time::Duration::from_secs(30))
                .map_err(|_| MediaError::Worker("no word".into()))?;
            dst.data.fill(0x42);
            Ok(())
        }
    }

    /// With conversions that may run at once, one guest's conversion in progress does not
    /// hold another guest's command, and is answered, with what it wrote, once done.
    #[test]
    fn a_conversion_in_progress_holds_no_other_guest() {
        use crate::device::tests::{reply_for, results};
        use crate::testkit::{Core, GUEST};
        use virtsoc_devapi::{isp as api, DeviceCommand};
        use virtsoc_proto::{wire::Format, AccessMode, DeviceId, Opcode};
        use virtsoc_svm::{AccessSpec, DomainId};

        let (word, heard) = std::sync::mpsc::channel();
        let isp = Isp {
            engine: Arc::new(Engine::Media(Box::new(Held(Mutex::new(heard))))),
            desc: "held".into(),
            apart: true,
            users: Mutex::default(),
            apart_now: Arc::default(),
        };
        let mut core = Core::new();
        let nv12 = [0, 64, 48, Format::Nv12 as u64, 0, 0];
        let rgba = [0, 64, 48, Format::Rgba8 as u64, 0, 0];
        let src = core.call(Opcode::Alloc, DeviceId::CPU, nv12).unwrap()[0];
        let dst = core.call(Opcode::Alloc, DeviceId::CPU, rgba).unwrap()[0];
        let domain = DomainId(2);
        for (id, mode) in [(src, AccessMode::Read), (dst, AccessMode::Write)] {
            let len = core.svm.meta(GUEST, RegionId(id)).unwrap().size;
            let spec = AccessSpec::new(DeviceId::PRODUCER.0, domain, 0, len, mode);
            core.svm.begin_access(GUEST, RegionId(id), &spec).unwrap();
        }
        let cx = |g| DeviceCtx::new(g, &core.svm, domain, core.session.fences());
        let (cx1, cx2) = (cx(GUEST), cx(GuestId(2)));
        // The other guest's commands name regions it does not have: refused at once.
        let other = api::Convert {
            src: RegionId(999),
            dst: RegionId(998),
        };
        isp.execute_async(&cx2, &other.encode(), reply_for(&core, 1));
        assert_eq!(results(&core).len(), 1);

        let convert = api::Convert {
            src: RegionId(src),
            dst: RegionId(dst),
        };
        let (done, answered) = std::sync::mpsc::channel();
        let mut reply = reply_for(&core, 7);
        reply.on_sent = Some(Box::new(move |_| done.send(()).unwrap()));
        isp.execute_async(&cx1, &convert.encode(), reply);
        assert!(results(&core).is_empty(), "answered before it converted");
        // Answered on a thread of its own too (another guest uses the device), while the
        // first conversion waits.
        let (other_done, other_answered) = std::sync::mpsc::channel();
        let mut reply = reply_for(&core, 8);
        reply.on_sent = Some(Box::new(move |_| other_done.send(()).unwrap()));
        isp.execute_async(&cx2, &other.encode(), reply);
        other_answered
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the other guest held");
        let got = results(&core);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, 8);

        word.send(()).unwrap();
        answered
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap();
        let got = results(&core);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0], (7, Ok([0; 6])));
        let written = cx1.with_source(RegionId(dst), |b| b[..4].to_vec()).unwrap();
        assert_eq!(written, [0x42; 4], "what the conversion wrote");
    }
}
