//! A desktop window backend (X11, through `minifb`), behind the `window`
//! cargo feature.
//!
//! `minifb` windows must stay on the thread that made them, and the display
//! backend must be `Send`, so the window lives on its own UI thread:
//! [`WindowBackend::scanout`] hands the frame (an `Arc` clone, no pixel
//! copy) over a one-slot channel and returns at once; the UI thread converts
//! and shows it. If the UI thread is still busy with the previous frame the
//! new one is skipped rather than blocking vsync. Between frames the UI
//! thread wakes once per refresh period to keep the window responsive.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use minifb::{ScaleMode, Window, WindowOptions};

use crate::backend::DisplayBackend;
use crate::error::{DisplayError, Result};
use crate::frame::PresentedFrame;

/// Shows frames in a desktop window.
#[derive(Debug)]
pub struct WindowBackend {
    tx: Option<SyncSender<PresentedFrame>>,
    closed: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl WindowBackend {
    /// Opens a `width` x `height` window titled `title`, refreshed at up to
    /// `refresh_hz`. Fails (with no window left behind) when no display
    /// server is reachable.
    pub fn new(title: &str, width: u32, height: u32, refresh_hz: u32) -> Result<Self> {
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
                let mut buf: Vec<u32> = Vec::new();
                while window.is_open() {
                    match rx.recv_timeout(tick) {
                        Ok(frame) => {
                            if let Err(e) = to_0rgb(&frame, &mut buf) {
                                log::warn!("window: frame {}: {e}", frame.id);
                                continue;
                            }
                            let (w, h) = (frame.width as usize, frame.height as usize);
                            if let Err(e) = window.update_with_buffer(&buf, w, h) {
                                log::warn!("window: {e}");
                            }
                        }
                        Err(RecvTimeoutError::Timeout) => window.update(),
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                closed_ui.store(true, Ordering::Release);
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

/// Converts a frame to minifb's 0RGB `u32` pixels.
fn to_0rgb(frame: &PresentedFrame, buf: &mut Vec<u32>) -> Result<()> {
    buf.clear();
    for row in frame.rows()? {
        for px in row.chunks_exact(4) {
            let [r, g, b, _] = crate::frame::to_rgba(frame.format, [px[0], px[1], px[2], px[3]]);
            buf.push(u32::from(r) << 16 | u32::from(g) << 8 | u32::from(b));
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
