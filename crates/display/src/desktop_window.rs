//! A desktop window backend (X11, through `minifb`), behind the `window`
//! cargo feature.
//!
//! `minifb` windows must stay on the thread that made them, and the display
//! backend must be `Send`, so the window lives on its own UI thread:
//! [`WindowBackend::scanout`] hands the frame (an `Arc` clone, no pixel
//! copy) over a one-slot channel and returns at once; the UI thread has its
//! [`WindowPainter`] show it. If the UI thread is still busy with the
//! previous frame the new one is skipped rather than blocking vsync. Between
//! frames the UI thread wakes once per refresh period to keep the window
//! responsive.
//!
//! Painters: [`CpuPainter`] converts the frame's CPU-visible pixels and has
//! `minifb` put them on the window; a GPU painter (the daemon's, on its wgpu
//! device) presents GPU-resident frames through a surface on the window's
//! native handles ([`WindowTarget::handles`]), so their pixels never come
//! back to the CPU.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use minifb::{ScaleMode, Window, WindowOptions};
use raw_window_handle::{HasDisplayHandle, HasWindowHandle, RawDisplayHandle, RawWindowHandle};

use crate::backend::DisplayBackend;
use crate::error::{DisplayError, Result};
use crate::frame::{FrameData, PresentedFrame};

/// The nice value of the window's UI thread (the lowest priority).
pub const WINDOW_NICE: i32 = 19;

/// The window a [`WindowPainter`] shows a frame in.
pub struct WindowTarget<'w> {
    window: &'w mut Window,
    /// Whether the painter put pixels through `minifb` (which also handles the window's
    /// events); if not, the UI thread lets `minifb` handle them.
    drawn: bool,
}

impl WindowTarget<'_> {
    /// The window's native display and window handles, for a GPU surface on it. They stay
    /// valid until the painter is dropped: the window backend drops its painter before the
    /// window.
    pub fn handles(&self) -> Result<(RawDisplayHandle, RawWindowHandle)> {
        let err = |e: raw_window_handle::HandleError| {
            DisplayError::Backend(format!("window handle: {e}"))
        };
        let display = self.window.display_handle().map_err(err)?.as_raw();
        let window = self.window.window_handle().map_err(err)?.as_raw();
        Ok((display, window))
    }

    /// The window's size in pixels now (the user may resize it).
    pub fn size(&self) -> (u32, u32) {
        let (w, h) = self.window.get_size();
        (w as u32, h as u32)
    }

    /// Shows `width` x `height` 0RGB pixels, scaled to the window keeping their aspect
    /// ratio.
    pub fn show_0rgb(&mut self, pixels: &[u32], width: u32, height: u32) -> Result<()> {
        self.drawn = true;
        self.window
            .update_with_buffer(pixels, width as usize, height as usize)
            .map_err(|e| DisplayError::Backend(format!("window: {e}")))
    }
}

/// Shows frames in a window, on the window's UI thread.
pub trait WindowPainter: Send {
    /// Shows `frame` in `target`.
    fn paint(&mut self, target: &mut WindowTarget<'_>, frame: &PresentedFrame) -> Result<()>;

    /// A short name for logs.
    fn name(&self) -> &'static str;
}

/// Paints the frame's CPU-visible pixels through `minifb`. A frame larger than the window is
/// asked for its pixels at the size it is shown at ([`FrameHandle::rgba_scaled`]: display
/// planes are then composed at that size, on the GPU when they live there), so a UHD frame
/// is not composed, converted and sent at full size only to be scaled down.
///
/// [`FrameHandle::rgba_scaled`]: crate::FrameHandle::rgba_scaled
#[derive(Debug, Default)]
pub struct CpuPainter {
    buf: Vec<u32>,
}

impl WindowPainter for CpuPainter {
    fn paint(&mut self, target: &mut WindowTarget<'_>, frame: &PresentedFrame) -> Result<()> {
        let (w, h) = shown_size((frame.width, frame.height), target.size());
        if (w, h) != (frame.width, frame.height) {
            if let FrameData::Handle(handle) = &frame.data {
                if let Some(rgba) = handle.rgba_scaled(w, h) {
                    self.buf.clear();
                    self.buf
                        .extend(rgba.chunks_exact(4).map(|p| xrgb([p[0], p[1], p[2]])));
                    return target.show_0rgb(&self.buf, w, h);
                }
            }
        }
        to_0rgb(frame, &mut self.buf)?;
        target.show_0rgb(&self.buf, frame.width, frame.height)
    }

    fn name(&self) -> &'static str {
        "cpu"
    }
}

/// Shows frames in a desktop window.
#[derive(Debug)]
pub struct WindowBackend {
    tx: Option<SyncSender<PresentedFrame>>,
    closed: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl WindowBackend {
    /// Opens a `width` x `height` window titled `title`, refreshed at up to
    /// `refresh_hz`, painted by a [`CpuPainter`]. Fails (with no window left
    /// behind) when no display server is reachable.
    pub fn new(title: &str, width: u32, height: u32, refresh_hz: u32) -> Result<Self> {
        Self::with_painter(
            title,
            width,
            height,
            refresh_hz,
            Box::new(CpuPainter::default()),
        )
    }

    /// [`new`](Self::new) with frames shown by `painter`, which lives (and is dropped, before
    /// the window) on the window's UI thread.
    pub fn with_painter(
        title: &str,
        width: u32,
        height: u32,
        refresh_hz: u32,
        mut painter: Box<dyn WindowPainter>,
    ) -> Result<Self> {
        let (tx, rx) = mpsc::sync_channel::<PresentedFrame>(1);
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let closed = Arc::new(AtomicBool::new(false));
        let closed_ui = Arc::clone(&closed);
        let title = title.to_string();
        let tick = Duration::from_nanos(1_000_000_000 / u64::from(refresh_hz.max(1)));
        let thread = std::thread::Builder::new()
            .name("virtsoc-window".into())
            .spawn(move || {
                let opts = WindowOptions {
                    resize: true,
                    scale_mode: ScaleMode::AspectRatioStretch,
                    ..WindowOptions::default()
                };
                // The window is a view of what the devices make: on a machine whose CPU
                // also runs the devices (and, on a CPU adapter, the GPU), it gets the cores
                // they leave (Linux nice values are per thread). It shows fewer frames then,
                // rather than slowing the guests down.
                if let Err(e) = rustix::process::setpriority_process(None, WINDOW_NICE) {
                    log::warn!("window: cannot lower the UI thread's priority: {e}");
                }
                let mut window = match Window::new(&title, width as usize, height as usize, opts) {
                    Ok(w) => w,
                    Err(e) => {
                        let _ = ready_tx.send(Err(DisplayError::Backend(format!(
                            "cannot open window: {e}"
                        ))));
                        return;
                    }
                };
                window.set_target_fps(0);
                let _ = ready_tx.send(Ok(()));
                log::info!("window: frames painted by the {} painter", painter.name());
                while window.is_open() {
                    match rx.recv_timeout(tick) {
                        Ok(frame) => {
                            let mut target = WindowTarget {
                                window: &mut window,
                                drawn: false,
                            };
                            if let Err(e) = painter.paint(&mut target, &frame) {
                                log::warn!("window: frame {}: {e}", frame.id);
                            }
                            if !target.drawn {
                                window.update();
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => window.update(),
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                closed_ui.store(true, Ordering::Release);
                // A GPU painter's surface is made on the window's handles: it goes first.
                drop(painter);
                drop(window);
            })
            .map_err(DisplayError::Spawn)?;
        let ready = ready_rx
            .recv()
            .unwrap_or_else(|_| Err(DisplayError::Backend("window thread died".into())));
        if let Err(e) = ready {
            let _ = thread.join();
            return Err(e);
        }
        Ok(WindowBackend {
            tx: Some(tx),
            closed,
            thread: Some(thread),
        })
    }

    /// Whether the user closed the window.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

/// The size a `frame` is shown at in a `window`: scaled down to fit at its aspect ratio, never
/// up (minifb scales up itself).
fn shown_size(frame: (u32, u32), window: (u32, u32)) -> (u32, u32) {
    let scale =
        (window.0 as f64 / frame.0.max(1) as f64).min(window.1 as f64 / frame.1.max(1) as f64);
    if scale >= 1.0 {
        return frame;
    }
    let even = |v: f64| ((v.round() as u32) & !1).max(2);
    (even(frame.0 as f64 * scale), even(frame.1 as f64 * scale))
}

/// One pixel in minifb's 0RGB `u32`.
fn xrgb([r, g, b]: [u8; 3]) -> u32 {
    u32::from(r) << 16 | u32::from(g) << 8 | u32::from(b)
}

/// Converts a frame to minifb's 0RGB `u32` pixels.
fn to_0rgb(frame: &PresentedFrame, buf: &mut Vec<u32>) -> Result<()> {
    buf.clear();
    for row in frame.rows()? {
        for px in row.chunks_exact(4) {
            let [r, g, b, _] = crate::frame::to_rgba(frame.format, [px[0], px[1], px[2], px[3]]);
            buf.push(xrgb([r, g, b]));
        }
    }
    Ok(())
}

impl DisplayBackend for WindowBackend {
    fn scanout(&mut self, frame: &PresentedFrame) -> Result<()> {
        if self.is_closed() {
            return Err(DisplayError::Backend("window closed".into()));
        }
        let Some(tx) = &self.tx else {
            return Err(DisplayError::Backend("window closed".into()));
        };
        match tx.try_send(frame.clone()) {
            Ok(()) | Err(TrySendError::Full(_)) => Ok(()),
            Err(TrySendError::Disconnected(_)) => {
                Err(DisplayError::Backend("window thread gone".into()))
            }
        }
    }

    fn name(&self) -> &'static str {
        "window"
    }
}

impl Drop for WindowBackend {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::PixelFormat;

    #[test]
    fn frames_are_shown_at_most_at_the_window_size() {
        assert_eq!(shown_size((3840, 2160), (1920, 1080)), (1920, 1080));
        assert_eq!(shown_size((3840, 2160), (1920, 1200)), (1920, 1080));
        assert_eq!(shown_size((640, 480), (1920, 1080)), (640, 480));
        assert_eq!(shown_size((1000, 1000), (500, 300)), (300, 300));
    }

    #[test]
    fn converts_to_0rgb() {
        let f = PresentedFrame::new(1, 2, 1, PixelFormat::Bgra8, vec![1, 2, 3, 4, 5, 6, 7, 8]);
        let mut buf = Vec::new();
        to_0rgb(&f, &mut buf).unwrap();
        assert_eq!(buf, vec![0x0003_0201, 0x0007_0605]);
    }

    /// Without a display server the backend fails cleanly; with one it
    /// opens, shows a frame and closes.
    #[test]
    fn opens_or_fails_cleanly() {
        let has_x = std::env::var_os("DISPLAY").is_some();
        match WindowBackend::new("virtsoc test", 4, 2, 60) {
            Ok(mut w) => {
                assert!(has_x);
                let f = PresentedFrame::new(1, 4, 2, PixelFormat::Rgba8, vec![128; 32]);
                w.scanout(&f).unwrap();
            }
            Err(e) => {
                assert!(!has_x, "DISPLAY is set but the window failed: {e}");
                assert!(matches!(e, DisplayError::Backend(_)));
            }
        }
    }
}
