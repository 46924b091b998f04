//! Which devices the daemon runs, with which backends: built from [`DeviceConfig`].

use std::path::PathBuf;
use std::sync::Arc;

use virtsoc_proto::DeviceId;

use super::testdev::{Consumer, Producer};
use super::{camera, codec, display, gpu, isp, modem, Device};
use crate::{Limits, Result};

/// Backend choices and device settings (from the daemon's command line).
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// GPU backend: `wgpu` (Vulkan; Mesa's CPU driver where there is no GPU), `cpu`, `null`.
    pub gpu: String,
    /// ISP backend: `swscale`, `gpu` (compute shader), `cpu`, `null`.
    pub isp: String,
    /// Nice value of a CPU Vulkan driver's worker threads (lavapipe's `llvmpipe-N`), so the
    /// emulated GPU does not take the cores from the CPU-side devices (see
    /// [`virtsoc_gpu::WgpuBackend::renice_cpu_driver_threads`]); 0 leaves them alone. No
    /// effect on a real GPU.
    pub gpu_driver_nice: i32,
    /// Decoding threads per decoder.
    pub codec_threads: usize,
    /// Display refresh rate.
    pub refresh_hz: u32,
    /// Display size in pixels.
    pub display_size: (u32, u32),
    /// Compose and checksum every presented frame (`--display-verify`).
    pub display_verify: bool,
    /// Where display snapshots go.
    pub snapshot_dir: PathBuf,
    /// Display backend: `headless`, or `window` (an X11 window; needs the `window` feature
    /// and a display).
    pub display_backend: String,
    /// Camera source: `synthetic`, or `file:PATH` (a video looped as a camera).
    pub camera_source: String,
    /// Run each decoder's libavcodec in a worker process: this program, started with
    /// `--codec-worker` (`virtsoc_media::ProcessDecoder`; a prototype, off by default).
    pub codec_worker: Option<PathBuf>,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            gpu: "wgpu".into(),
            isp: "swscale".into(),
            gpu_driver_nice: 10,
            codec_threads: 2,
            refresh_hz: 60,
            display_size: (display::WIDTH, display::HEIGHT),
            display_verify: false,
            snapshot_dir: std::env::temp_dir(),
            display_backend: "headless".into(),
            camera_source: "synthetic".into(),
            codec_worker: None,
        }
    }
}

/// Builds every device, within `limits`.
pub fn build(cfg: &DeviceConfig, limits: &Limits) -> Result<Vec<(DeviceId, Arc<dyn Device>)>> {
    use virtsoc_devapi as api;
    let gpu_dev = Arc::new(gpu::Gpu::new(cfg)?.with_limits(limits));
    let display = display::Display::new(cfg)?
        .with_limits(limits)
        .with_gpu(gpu_dev.wgpu().cloned());
    Ok(vec![
        (DeviceId::PRODUCER, Arc::new(Producer) as Arc<dyn Device>),
        (DeviceId::CONSUMER, Arc::new(Consumer::new("consumer"))),
        (DeviceId::CONSUMER2, Arc::new(Consumer::new("consumer2"))),
        (
            api::codec::ID,
            Arc::new(codec::Codec::new(cfg)?.with_limits(limits)),
        ),
        (api::isp::ID, Arc::new(isp::Isp::new(cfg, &gpu_dev)?)),
        (api::camera::ID, Arc::new(camera::Camera::new(cfg)?)),
        (api::gpu::ID, gpu_dev),
        (api::display::ID, Arc::new(display)),
        (
            api::modem::ID,
            Arc::new(modem::Modem::new(cfg)?.with_limits(limits)),
        ),
    ])
}
