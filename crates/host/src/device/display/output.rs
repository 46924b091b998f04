//! Where scanned-out frames go: the `--display-backend` choice (headless or an X11 window,
//! painted by the GPU when it is a wgpu device, see `gpu_painter`).

use std::sync::Arc;

use virtsoc_display as vd;
use virtsoc_gpu::WgpuBackend;

use crate::device::registry::DisplayBackendKind;
use crate::{HostError, Result};

/// Where scanned-out frames go (`--display-backend`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Output {
    Headless,
    /// An X11 window on this `$DISPLAY`; `surface`: presented through a GPU surface also on
    /// a CPU adapter.
    Window {
        display: String,
        surface: bool,
    },
}

impl Output {
    /// The output for a `--display-backend` choice; checks that a window can be had (built
    /// in, and a `$DISPLAY` is set).
    pub(super) fn new(kind: DisplayBackendKind) -> Result<Self> {
        match kind {
            DisplayBackendKind::Headless => Ok(Output::Headless),
            DisplayBackendKind::Window | DisplayBackendKind::WindowSurface => {
                if !cfg!(feature = "window") {
                    return Err(HostError::Config(
                        "display: --display-backend window is not built into this virtsocd: \
                         rebuild it with the `window` cargo feature \
                         (cargo build -p virtsocd --features window)"
                            .into(),
                    ));
                }
                match std::env::var("DISPLAY") {
                    Ok(display) if !display.is_empty() => Ok(Output::Window {
                        display,
                        surface: kind == DisplayBackendKind::WindowSurface,
                    }),
                    _ => Err(HostError::Config(
                        "display: --display-backend window needs an X11 display, \
                         but $DISPLAY is not set"
                            .into(),
                    )),
                }
            }
        }
    }

    /// The scan-out backend; a window presents on `gpu` through a surface when there is one
    /// (and it is not a CPU adapter, unless asked for).
    pub(super) fn backend(
        &self,
        width: u32,
        height: u32,
        refresh_hz: u32,
        gpu: Option<Arc<WgpuBackend>>,
    ) -> Result<Box<dyn vd::DisplayBackend>> {
        match self {
            Output::Headless => Ok(Box::new(vd::HeadlessBackend::new())),
            Output::Window { display, surface } => {
                let gpu = gpu.filter(|g| *surface || !g.adapter_info().is_cpu());
                open_window(display, (width, height), refresh_hz, gpu)
            }
        }
    }
}

#[cfg(feature = "window")]
fn open_window(
    display: &str,
    (width, height): (u32, u32),
    refresh_hz: u32,
    gpu: Option<Arc<WgpuBackend>>,
) -> Result<Box<dyn vd::DisplayBackend>> {
    let painter: Box<dyn vd::WindowPainter> = match gpu {
        Some(gpu) => Box::new(super::gpu_painter::GpuPainter::new(gpu)),
        None => Box::new(vd::CpuPainter::default()),
    };
    let w = vd::WindowBackend::with_painter("virtsoc display", width, height, refresh_hz, painter)
        .map_err(|e| {
            HostError::Config(format!(
                "display: cannot open a window on X11 display {display:?}: {e}"
            ))
        })?;
    log::info!("display: window {width}x{height} open on X11 display {display}");
    Ok(Box::new(w))
}

#[cfg(not(feature = "window"))]
fn open_window(
    _display: &str,
    _size: (u32, u32),
    _refresh_hz: u32,
    _gpu: Option<Arc<WgpuBackend>>,
) -> Result<Box<dyn vd::DisplayBackend>> {
    Err(HostError::Config(
        "display: the window backend is not built in".into(),
    ))
}
