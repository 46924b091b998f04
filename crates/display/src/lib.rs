//! `virtsoc-display`: the display device of a virtsoc phone, a vsync-paced
//! scan-out engine.
//!
//! * [`Display`] is the core, a pure state machine: guests
//!   [`present`](Display::present) frames, the driver calls
//!   [`on_vsync`](Display::on_vsync) at every vsync with the time, and the
//!   display scans out the last frame presented since the previous vsync,
//!   counting the ones it replaced as dropped. It records scan-out times and
//!   motion-to-photon latency (scan-out time minus the frame's capture
//!   time), and shares the screen between guests: only the foreground
//!   owner's frames are shown, the others' are counted as hidden.
//! * [`VsyncThread`] drives a `Display` in real time on `CLOCK_MONOTONIC`
//!   and delivers [`VsyncEvent`]s to subscribers over channels.
//! * Backends ([`DisplayBackend`]): [`HeadlessBackend`] (keeps the last
//!   frame), [`NullBackend`] (discards), and with the `window` feature a
//!   desktop window (`WindowBackend`, painted on the CPU or, through a
//!   `WindowPainter` the daemon gives it, by a GPU); [`ConsumingSink`] wraps any of them
//!   and reads every byte of every scanned-out frame once (a CRC), as a real consumer of
//!   the screen would. [`Display::snapshot_png`] writes the
//!   frame on screen as a PNG whatever the backend.
//!
//! Because time is injected, everything but `VsyncThread` is tested with
//! plain numbers and no sleeping.

pub mod backend;
#[cfg(feature = "window")]
pub mod desktop_window;
pub mod display;
pub mod error;
pub mod frame;
pub mod sink;
pub mod snapshot;
pub mod vsync;

pub use backend::{DisplayBackend, HeadlessBackend, NullBackend};
#[cfg(feature = "window")]
pub use desktop_window::{CpuPainter, WindowBackend, WindowPainter, WindowTarget};
pub use display::{
    Display, DisplayConfig, DisplayStats, LatencySummary, PresentOutcome, ScanoutRecord, VsyncEvent,
};
pub use error::{DisplayError, Result};
pub use frame::{
    FrameData, FrameHandle, GuestId, PixelFormat, PresentedFrame, ViewPicture, MAX_DIMENSION,
};
pub use sink::{ConsumingSink, SinkCounts, SinkStats};
pub use snapshot::{encode_png, write_png};
pub use vsync::{
    Clock, MonotonicClock, SubscriberId, Subscribers, Tick, VsyncSchedule, VsyncThread,
    SUBSCRIBER_QUEUE,
};
