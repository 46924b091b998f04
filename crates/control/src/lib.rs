//! The control API of `virtsocd`: HTTP + JSON on a Unix socket (and optionally TCP, with the
//! remote-guest token), to inspect and steer a running daemon the way the Android emulator's
//! console does (inject an SMS, a call, change the signal, switch the foreground app, ...).
//!
//! This crate knows nothing of the daemon's internals: the daemon implements [`Backend`]
//! (listings, one `control` entry point per device, closing a guest) and [`server::serve`]
//! runs the HTTP side on threads of its own.
//!
//! Why `tiny_http`: the daemon is built of threads (one per guest connection, one per device
//! worker), not of an async runtime, so a small, well-kept *blocking* HTTP/1.1 server on a
//! thread of its own is all the control API needs; `tiny_http` is that (no runtime, few
//! dependencies, listens on Unix sockets as well as TCP) where hyper/axum would bring tokio
//! into a daemon that does not otherwise use it. Handlers only take short locks and send
//! messages (a foreground switch, an SMS into a modem's buffer), so the control server never
//! blocks a device worker, and a slow control client only holds up its own request thread.
//!
//! Routes ([`routes::handle`]):
//!
//! | method | path | body | answer |
//! |---|---|---|---|
//! | GET | `/guests` | | `[GuestInfo]` |
//! | GET | `/guests/{id}/stats` | | `GuestInfo` |
//! | POST | `/guests/{id}/kill` | | `{"killed": id}` |
//! | GET | `/devices` | | `[DeviceInfo]` |
//! | POST | `/display/foreground` | `{"guest": id}` | `{"guest", "latency_us"}` |
//! | POST | `/display/refresh` | `{"hz": n}` | `{"refresh_hz"}` |
//! | POST | `/modem/sms` | `{"from", "text", "guest"?}` | `{"delivered": [...]}` |
//! | POST | `/modem/call` | `{"from", "guest"?}` | `{"delivered": [...]}` |
//! | POST | `/modem/hangup` | `{"guest"?}` | `{"delivered": [...]}` |
//! | POST | `/modem/signal` | `{"rssi": 0..31, "ber": 0..7, "guest"?}` | `{"delivered": [...]}` |
//! | POST | `/modem/registration` | `{"state", "guest"?}` | `{"delivered": [...]}` |
//! | POST | `/camera/source` | `{"source": "synthetic" \| "file:PATH"}` | `{"backend"}` |
//! | POST | `/guests/{id}/snapshot` | `{"path"}` | `{"regions", "region_bytes", "file_bytes", "ms"}` |
//! | POST | `/guests/{id}/restore` | `{"path"}` | `{"regions", "region_bytes", "file_bytes", "ms"}` |
//! | POST | `/guests/{id}/migrate` | `{"to": "HOST:PORT", "token"}` | `{"stop_ms", "precopy_bytes", "dirty_bytes", ...}` |
//! | GET | `/metrics` | | Prometheus text |
//! | POST | `/guests/{id}/policy` | a policy file's guest table (`shares`, `class`, `devices`, `commands`, `rate_cap`, `memory_limit`) | `{"guest", "name", "generation"}` |
//! | POST | `/policy/reload` | | `{"generation"}` (the file read again, as on SIGHUP) |
//! | GET | `/view` | | the live view page (HTML) |
//! | GET | `/guests/{id}/frame.jpg?after=N&max=WxH` | | the guest's latest frame (JPEG) newer than frame N, after waiting up to a second for the view's CPU budget ([`budget`]) and up to a second for a frame (204 if none) |
//! | POST | `/view/report` | `ViewReport` | `{"ok": true}` (what a view page measured) |
//! | GET | `/view/report` | | `[ViewReport]` |
//! | GET | `/view/budget` | | `BudgetStats` (the view's CPU budget and what it has seen; 404 without one) |
//! | POST | `/guests/{id}/record` | `{"seconds", "fps"?, "max"?}` | the presented frames as an H.264 MP4 |
//! | GET | `/services` | | the host services: their calls, counters, programs, the policy |
//! | POST | `/services/policy` | a services policy, or `{"reload": true}` | the policy |
//! | POST | `/services/{name}/{op}` | the operation's arguments | its result (any service's, a host program's included) |
//! | GET, POST | `/geo`, `/geo/fix`, `/geo/nmea`, `/geo/track`, `/sensor`, `/sensor/set`, `/clipboard` | see [`routes`] | the emulator services' state |
//!
//! Errors are `{"error": "..."}` with 400 (malformed JSON, a missing or bad field, named),
//! 401 (TCP without the token), 404 (unknown guest or route), 409 (refused by the device,
//! e.g. no call to hang up), 413 (body over [`MAX_BODY`]) or 500.

pub mod budget;
pub mod client;
pub mod error;
pub mod live_view;
pub mod metrics;
pub mod routes;
pub mod server;
pub mod types;
pub mod workers;

pub use error::ControlError;
pub use types::*;

/// Largest request body accepted (bigger ones get 413 before being read).
pub const MAX_BODY: usize = 64 << 10;

/// What the control API needs of the daemon. Every method must return quickly (short locks,
/// no waiting on devices).
pub trait Backend: Send + Sync + 'static {
    /// The live guests.
    fn guests(&self) -> Vec<GuestInfo>;
    /// One live guest.
    fn guest(&self, id: u64) -> Option<GuestInfo> {
        self.guests().into_iter().find(|g| g.id == id)
    }
    /// The devices.
    fn devices(&self) -> Vec<DeviceInfo>;
    /// Runs control operation `op` of the device named `device`.
    fn device_control(
        &self,
        device: &str,
        op: &str,
        args: &serde_json::Value,
    ) -> Result<serde_json::Value, ControlError>;
    /// Closes guest `id`'s session (others are unaffected).
    fn kill(&self, id: u64) -> Result<(), ControlError>;
    /// Guest `guest`'s latest presented frame newer than frame `after`, as a JPEG fitting
    /// `max` (width, height), waiting up to `wait` for one; `Ok(None)` when none came.
    fn view_frame(
        &self,
        _guest: u64,
        _after: u64,
        _max: (u32, u32),
        _wait: std::time::Duration,
    ) -> Result<Option<ViewFrame>, ControlError> {
        Err(ControlError::Unsupported("the live view".into()))
    }
    /// Records guest `guest`'s presented frames for `seconds` at up to `fps` into an MP4
    /// (frames fitting `max`); returns the file's bytes and the frames recorded.
    fn record(
        &self,
        _guest: u64,
        _seconds: f64,
        _fps: u32,
        _max: (u32, u32),
    ) -> Result<(Vec<u8>, u64), ControlError> {
        Err(ControlError::Unsupported("recording".into()))
    }
    /// Keeps what a live-view page measured (the latest report per guest).
    fn note_view(&self, _report: ViewReport) {}
    /// The latest live-view reports.
    fn view_reports(&self) -> Vec<ViewReport> {
        Vec::new()
    }
    /// The live view's CPU budget, if frames are paced ([`budget`]).
    fn view_budget(&self) -> Option<&budget::ViewBudget> {
        None
    }
    /// Sets the sharing policy of guest `guest` (by its name: every guest of that name) to
    /// `policy` (a policy file's per-guest table, as JSON).
    fn set_policy(
        &self,
        _guest: u64,
        _policy: &serde_json::Value,
    ) -> Result<serde_json::Value, ControlError> {
        Err(ControlError::Unsupported("policies".into()))
    }
    /// Reads the daemon's policy file again (as SIGHUP does).
    fn reload_policy(&self) -> Result<serde_json::Value, ControlError> {
        Err(ControlError::Unsupported("policies".into()))
    }
    /// Sessions that ended over a second ago and are still referenced: a leak when not 0.
    fn lingering_sessions(&self) -> u64 {
        0
    }
    /// Saves guest `id`'s session to the snapshot file `path` (quiesces the guest meanwhile:
    /// this one may take as long as writing the guest's memory takes).
    fn snapshot_save(&self, id: u64, path: &str) -> Result<serde_json::Value, ControlError> {
        let _ = (id, path);
        Err(ControlError::Unsupported("snapshots".into()))
    }
    /// Migrates guest `id` to the daemon whose migration listener is `to`.
    fn migrate(&self, id: u64, to: &str, token: &str) -> Result<serde_json::Value, ControlError> {
        let _ = (id, to, token);
        Err(ControlError::Unsupported("migration".into()))
    }
    /// Restores the snapshot file `path` into guest `id`'s fresh session.
    fn snapshot_load(&self, id: u64, path: &str) -> Result<serde_json::Value, ControlError> {
        let _ = (id, path);
        Err(ControlError::Unsupported("snapshots".into()))
    }
}
