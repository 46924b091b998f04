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
//! Bad input answers a status: `NotSupported` for a Blob or YUYV region or a conversion the
//! backend cannot do, `BadArgument` for a malformed layout, `OutOfRange` when a region is
//! smaller than its frame, `DeviceError` when the backend fails.

use std::sync::Arc;

use virtsoc_devapi::isp::Command;
use virtsoc_media::isp::ISP_WORKER_ARG;
use virtsoc_media::{
    Charge, ChargeError, CpuIsp, FrameMut, FrameRef, IspBackend, MediaError, NullIsp, ProcessIsp,
    SwscaleIsp, WorkerPool,
};
use virtsoc_proto::Status;
use virtsoc_svm::{GuestId, RegionId};

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
    engine: Engine,
    desc: String,
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
        Ok(Isp { engine, desc })
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
        match &self.engine {
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
        match self.engine {
            // The GPU backend is the GPU itself: one physical device, one memory.
            Engine::Gpu { .. } => "gpu",
            Engine::Media(_) => "isp",
        }
    }

    fn reads_host_memory(&self) -> bool {
        // The CPU backends read a source where it is current in host memory (a camera
        // frame); the GPU backend reads its own memory.
        matches!(self.engine, Engine::Media(_))
    }

    fn backend(&self) -> String {
        self.desc.clone()
    }

    fn guest_gone(&self, guest: GuestId) {
        // Its swscale workers end (another guest never gets them).
        match &self.engine {
            Engine::Media(b) => b.forget(guest.0),
            Engine::Gpu { yuv, .. } => yuv.forget(guest.0),
        }
    }

    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult {
        match Command::decode(args)? {
            Command::Convert(c) => self.convert(cx, c.src, c.dst),
        }
    }

    fn execute_async(&self, cx: &DeviceCtx<'_>, args: &[u64; 6], reply: Reply) {
        // The GPU backend on resident images (RGB destinations): submitted, answered when
        // the GPU is done, zero copies (the ISP works in the GPU's memory).
        if let (Engine::Gpu { gpu, .. }, Ok(Command::Convert(c))) =
            (&self.engine, Command::decode(args))
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
                let r = isp.convert_frame(
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
            isp.convert_frame(
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
}
