//! Where scanned-out frames go: the `--display-backend` choice (headless or an X11 window).

use virtsoc_display as vd;

use crate::device::registry::DisplayBackendKind;
use crate::{HostError, Result};

/// Where scanned-out frames go (`--display-backend`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Output {
    Headless,
    /// An X11 window on this `$DISPLAY`.
    Window(String),
}

impl Output {
    /// The output for a `--display-backend` choice; checks that a window can be had (built
    /// in, and a `$DISPLAY` is set).
    pub(super) fn new(kind: DisplayBackendKind) -> Result<Self> {
        match kind {
            DisplayBackendKind::Headless => Ok(Output::Headless),
            DisplayBackendKind::Window => {
                if !cfg!(feature = "window") {
                    return Err(HostError::Config(
                        "display: --display-backend window is not built into this virtsocd: \
                         rebuild it with the `window` cargo feature \
                         (cargo build -p virtsoc --features window)"
                            .into(),
                    ));
                }
                match std::env::var("DISPLAY") {
                    Ok(d) if !d.is_empty() => Ok(Output::Window(d)),
                    _ => Err(HostError::Config(
                        "display: --display-backend window needs an X11 display, \
                         but $DISPLAY is not set"
                            .into(),
                    )),
                }
            }
        }
    }

    /// The scan-out backend.
    pub(super) fn backend(
        &self,
        width: u32,
        height: u32,
        refresh_hz: u32,
    ) -> Result<Box<dyn vd::DisplayBackend>> {
        match self {
            Output::Headless => Ok(Box::new(vd::HeadlessBackend::new())),
            Output::Window(display) => open_window(display, width, height, refresh_hz),
        }
    }
}

#[cfg(feature = "window")]
fn open_window(
    display: &str,
    width: u32,
    height: u32,
    refresh_hz: u32,
) -> Result<Box<dyn vd::DisplayBackend>> {
    let w = vd::WindowBackend::new("virtsoc display", width, height, refresh_hz).map_err(|e| {
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
    _width: u32,
    _height: u32,
    _refresh_hz: u32,
) -> Result<Box<dyn vd::DisplayBackend>> {
    Err(HostError::Config(
        "display: the window backend is not built in".into(),
    ))
}
