//! Scan-out backends: the [`DisplayBackend`] trait and the always-available
//! [`HeadlessBackend`] and [`NullBackend`]. (The window backend lives in
//! `window`, behind the `window` cargo feature.)

use std::sync::{Arc, Mutex};
use virtsoc_sync::LockExt;

use crate::error::Result;
use crate::frame::PresentedFrame;

/// Where scanned-out frames go. Called from the vsync thread once per new
/// frame (not again for a vsync that repeats the previous frame).
pub trait DisplayBackend: Send {
    /// Shows `frame`. An error is counted by the display and the frame is
    /// lost; the display keeps running.
    fn scanout(&mut self, frame: &PresentedFrame) -> Result<()>;

    /// A short name for logs.
    fn name(&self) -> &'static str {
        "unnamed"
    }
}

/// Discards every frame.
#[derive(Debug, Default, Clone, Copy)]
pub struct NullBackend;

impl DisplayBackend for NullBackend {
    fn scanout(&mut self, _frame: &PresentedFrame) -> Result<()> {
        Ok(())
    }

    fn name(&self) -> &'static str {
        "null"
    }
}

#[derive(Debug, Default)]
struct HeadlessState {
    last: Option<PresentedFrame>,
    scanouts: u64,
}

/// Keeps the last scanned-out frame (no copy: frames share their pixels).
///
/// Clones share state, so keep a clone to look at what the display showed
/// after handing the backend to it.
#[derive(Debug, Default, Clone)]
pub struct HeadlessBackend {
    state: Arc<Mutex<HeadlessState>>,
}

impl HeadlessBackend {
    /// A backend that has shown nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The last frame scanned out.
    pub fn last_frame(&self) -> Option<PresentedFrame> {
        self.state.lock_or_recover().last.clone()
    }

    /// How many frames were scanned out.
    pub fn scanout_count(&self) -> u64 {
        self.state.lock_or_recover().scanouts
    }
}

impl DisplayBackend for HeadlessBackend {
    fn scanout(&mut self, frame: &PresentedFrame) -> Result<()> {
        let mut s = self.state.lock_or_recover();
        s.last = Some(frame.clone());
        s.scanouts += 1;
        Ok(())
    }

    fn name(&self) -> &'static str {
        "headless"
    }
}
