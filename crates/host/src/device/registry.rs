//! Which devices the daemon runs, with which backends: built from [`DeviceConfig`].

use std::path::PathBuf;
use std::sync::Arc;

use virtsoc_proto::DeviceId;
use virtsoc_svm::{DomainId, Topology};

use super::testdev::{Consumer, Producer};
use super::{camera, codec, display, gles, gpu, isp, modem, Device};
use crate::{Limits, Result};

/// The GPU device's backend (`--gpu-backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum GpuBackendKind {
    /// `wgpu` when an adapter can be had, else `cpu` (with a warning and the reason in the
    /// device's listing).
    #[default]
    Auto,
    /// Vulkan through wgpu (Mesa's CPU driver where there is no GPU); the daemon does not
    /// start without an adapter.
    Wgpu,
    /// The CPU reference backend.
    Cpu,
    /// Fills every output grey (for tests that do not look at pixels).
    Null,
}

/// The ISP device's backend (`--isp-backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum IspBackendKind {
    /// libswscale (bilinear).
    #[default]
    Swscale,
    /// A compute shader on the GPU device's backend (YUV destinations: libswscale).
    Gpu,
    /// The CPU reference converter.
    Cpu,
    /// Copies equal formats only.
    Null,
}

/// Where the display's scanned-out frames go (`--display-backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum DisplayBackendKind {
    /// Nowhere but snapshots and the control API's view.
    #[default]
    Headless,
    /// An X11 window on `$DISPLAY` (needs the `window` feature). On a GPU, frames are
    /// composed and presented there through a surface on the window; on a CPU adapter
    /// (lavapipe), whose present copies the image to the X server while the whole device
    /// waits, they are composed on the GPU at the window's size and read back instead.
    Window,
    /// An X11 window presented through a GPU surface also on a CPU adapter.
    WindowSurface,
}

/// Where the camera's frames come from (`--camera-source`): `synthetic`, `file:PATH` or
/// `v4l2:DEVICE`. Parsed with [`str::parse`]; the file or device is checked when the camera
/// is built.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum CameraSourceKind {
    /// A generated test pattern stamped with its capture time.
    #[default]
    Synthetic,
    /// A video file looped as a camera.
    File(PathBuf),
    /// A V4L2 capture device (needs the `v4l2` feature).
    V4l2(PathBuf),
}

impl std::str::FromStr for CameraSourceKind {
    // A `String`: this parses a command-line value (`--camera-source`), whose error clap
    // prints as it is after its own words; nothing matches on it.
    type Err = String;

    fn from_str(spec: &str) -> std::result::Result<Self, String> {
        if spec == "synthetic" {
            return Ok(CameraSourceKind::Synthetic);
        }
        if let Some(dev) = spec.strip_prefix("v4l2:") {
            return Ok(CameraSourceKind::V4l2(PathBuf::from(dev)));
        }
        match spec.strip_prefix("file:") {
            Some("") => Err("camera: camera source file: needs a path (file:PATH)".into()),
            Some(path) => Ok(CameraSourceKind::File(PathBuf::from(path))),
            None => Err(format!(
                "camera: unknown camera source {spec:?} (expected synthetic, file:PATH or \
                 v4l2:DEVICE)"
            )),
        }
    }
}

impl std::fmt::Display for CameraSourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CameraSourceKind::Synthetic => f.write_str("synthetic"),
            CameraSourceKind::File(p) => write!(f, "file:{}", p.display()),
            CameraSourceKind::V4l2(p) => write!(f, "v4l2:{}", p.display()),
        }
    }
}

/// The default nice value of a CPU Vulkan driver's worker threads: they weigh about half
/// a default thread, so CPU-side devices still go first (2:1), while the rasterizers wait
/// for a core no longer than the daemon's own threads do. At nice 10 (a tenth) they waited
/// 3-4 times longer after each wake-up, and with one core idle while the other rasterizer
/// waited behind a thread feeding the GPU, a third of the machine sat idle under GPU work
/// alone (`virtsoc_gpu`'s `driver_threads` module, docs/results.md, stop 23).
pub const DEFAULT_GPU_DRIVER_NICE: i32 = 3;

/// Backend choices and device settings (from the daemon's command line).
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// GPU backend.
    pub gpu: GpuBackendKind,
    /// ISP backend.
    pub isp: IspBackendKind,
    /// Nice value of a CPU Vulkan driver's worker threads (lavapipe's `llvmpipe-N`), so the
    /// emulated GPU does not take the cores from the CPU-side devices (see
    /// [`virtsoc_gpu::WgpuBackend::renice_cpu_driver_threads`]); 0 leaves them alone. No
    /// effect on a real GPU. Default [`DEFAULT_GPU_DRIVER_NICE`].
    pub gpu_driver_nice: i32,
    /// Decoding threads per decoder.
    pub codec_threads: usize,
    /// How hard the software H.264 encoder works per frame (`--encoder-preset`).
    pub encoder_preset: virtsoc_media::EncoderPreset,
    /// Display refresh rate.
    pub refresh_hz: u32,
    /// Display size in pixels.
    pub display_size: (u32, u32),
    /// Compose and checksum every presented frame (`--display-verify`).
    pub display_verify: bool,
    /// Read every byte of every scanned-out frame's planes once (`--display-sink crc`).
    pub display_sink: bool,
    /// Where display snapshots go.
    pub snapshot_dir: PathBuf,
    /// Display backend (a window needs the `window` feature and a display).
    pub display_backend: DisplayBackendKind,
    /// Camera source.
    pub camera_source: CameraSourceKind,
    /// Run each decoder's libavcodec in a sandboxed worker process: this program, started
    /// with `--codec-worker` (`virtsoc_media::ProcessDecoder`; `virtsocd`'s default). `None`:
    /// decoders run in this process.
    pub codec_worker: Option<PathBuf>,
    /// Decoder workers kept started ahead.
    pub codec_worker_spares: usize,
    /// How long a codec command of a guest not alone on the codec may wait for its
    /// worker on the codec's thread before it goes to the waiter (default
    /// [`codec::DEFAULT_GRACE`]; 0: at once, so other guests' decodes run beside it).
    pub codec_grace: std::time::Duration,
    /// Run the ISP's libswscale (the `swscale` backend, the `gpu` backend's YUV
    /// destinations) in sandboxed worker processes: this program, started with
    /// `--isp-worker` (`virtsoc_media::ProcessIsp`; `virtsocd`'s default). `None`: in this
    /// process.
    pub isp_worker: Option<PathBuf>,
    /// The GLES render worker program (`virtsoc-render`); `None`: the default of
    /// [`gles::default_worker`] (beside the daemon's executable).
    pub render_worker: Option<PathBuf>,
    /// Longest a render worker may take to answer one batch before it is ended as hung
    /// (default [`gles::WORKER_DEADLINE`]).
    pub render_deadline: std::time::Duration,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            gpu: GpuBackendKind::default(),
            isp: IspBackendKind::default(),
            gpu_driver_nice: DEFAULT_GPU_DRIVER_NICE,
            codec_threads: 2,
            encoder_preset: virtsoc_media::EncoderPreset::default(),
            refresh_hz: 60,
            display_size: (display::WIDTH, display::HEIGHT),
            display_verify: false,
            display_sink: false,
            snapshot_dir: std::env::temp_dir(),
            display_backend: DisplayBackendKind::default(),
            camera_source: CameraSourceKind::default(),
            codec_worker: None,
            codec_worker_spares: virtsoc_media::codec::DEFAULT_SPARE,
            codec_grace: codec::DEFAULT_GRACE,
            isp_worker: None,
            render_worker: None,
            render_deadline: gles::WORKER_DEADLINE,
        }
    }
}

/// Builds every device, within `limits`.
pub fn build(cfg: &DeviceConfig, limits: &Limits) -> Result<Vec<(DeviceId, Arc<dyn Device>)>> {
    use virtsoc_devapi as api;
    let gpu_dev = Arc::new(gpu::Gpu::new(cfg)?.with_limits(limits));
    let display = display::Display::new(cfg, gpu_dev.wgpu().cloned())?.with_limits(limits);
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
        (api::gles::ID, Arc::new(gles::Gles::new(cfg))),
    ])
}

/// Places each device in the memory domain it names, adding the domains to `topo`: one
/// domain per physical device's memory, devices naming the same domain share it.
pub fn with_domains(
    devices: Vec<(DeviceId, Arc<dyn Device>)>,
    topo: &mut Topology,
) -> Vec<(DeviceId, DomainId, Arc<dyn Device>)> {
    let mut domains: Vec<(String, DomainId)> = Vec::new();
    devices
        .into_iter()
        .map(|(id, d)| {
            let name = d.memory_domain().to_string();
            let dom = match domains.iter().find(|(n, _)| *n == name) {
                Some((_, dom)) => *dom,
                None => {
                    let dom = topo.add_device_domain(&name);
                    domains.push((name, dom));
                    dom
                }
            };
            (id, dom, d)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn backend_names_parse_and_bad_ones_list_the_choices() {
        let names = |v: &[GpuBackendKind]| -> Vec<String> {
            v.iter()
                .map(|k| k.to_possible_value().unwrap().get_name().to_string())
                .collect()
        };
        assert_eq!(
            names(GpuBackendKind::value_variants()),
            ["auto", "wgpu", "cpu", "null"]
        );
        assert_eq!(
            IspBackendKind::from_str("gpu", false),
            Ok(IspBackendKind::Gpu)
        );
        assert_eq!(
            DisplayBackendKind::from_str("window", false),
            Ok(DisplayBackendKind::Window)
        );
        assert!(GpuBackendKind::from_str("vulkan9", false).is_err());
        assert!(IspBackendKind::from_str("magic", false).is_err());

        assert_eq!("synthetic".parse(), Ok(CameraSourceKind::Synthetic));
        let file: CameraSourceKind = "file:/a/b.mp4".parse().unwrap();
        assert_eq!(file, CameraSourceKind::File("/a/b.mp4".into()));
        assert_eq!(file.to_string(), "file:/a/b.mp4");
        assert_eq!(
            "v4l2:/dev/video0".parse(),
            Ok(CameraSourceKind::V4l2("/dev/video0".into()))
        );
        let e = "rtsp://cam/1".parse::<CameraSourceKind>().unwrap_err();
        assert!(
            e.contains("unknown camera source") && e.contains("file:PATH"),
            "{e}"
        );
        assert!("file:"
            .parse::<CameraSourceKind>()
            .unwrap_err()
            .contains("needs a path"));
    }
}
