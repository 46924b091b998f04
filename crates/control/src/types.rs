//! Request and response bodies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A guest's coherence counters (the SVM manager's `guest_counters`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub copies: u64,
    pub copy_ns: u64,
    pub copy_bytes: u64,
    pub device_copies: u64,
    pub device_copy_bytes: u64,
    pub device_copy_ns: u64,
    pub sync_fetches: u64,
    pub inflight_waits: u64,
    pub prefetches: u64,
    pub hits: u64,
    pub misses: u64,
    pub compensation_ns: u64,
    pub bookkeeping_ns: u64,
}

/// Copies of one guest's bytes on one link between memory domains (`src == dst`: a device's
/// own copies in its memory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkCopies {
    pub src: String,
    pub dst: String,
    pub copies: u64,
    pub bytes: u64,
    pub ns: u64,
}

/// A live guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestInfo {
    pub id: u64,
    pub name: String,
    /// `unix` (process guest), `tcp` (remote guest) or `vm`.
    pub transport: String,
    /// Coherence protocol.
    pub protocol: String,
    /// Regions it holds.
    pub regions: u64,
    /// Host bytes its regions hold.
    pub bytes: u64,
    pub counters: Counters,
    /// Copies by link.
    pub links: Vec<LinkCopies>,
    /// Device commands it queued, by device name.
    pub commands: BTreeMap<String, u64>,
    /// Its use of each device it has a queue on, by device name.
    #[serde(default)]
    pub device_use: BTreeMap<String, DeviceUse>,
}

/// One guest's use of one device (the device worker's accounting).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceUse {
    /// Requests answered (commands and accesses).
    pub requests: u64,
    /// Their device time (busy period on the device), in nanoseconds.
    pub device_ns: u64,
    /// Requests the policy refused.
    pub denied: u64,
    /// Items waiting in its queue now.
    pub queued: u64,
}

/// A device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub id: u32,
    pub name: String,
    pub backend: String,
    /// Its memory domain.
    pub domain: String,
    /// Commands waiting in its queues now.
    pub queued: u64,
}

/// One guest's display counters and its latest motion-to-photon samples (the display's
/// `metrics` control operation answers a list of these).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisplayGuestMetrics {
    pub guest: u64,
    pub presented: u64,
    pub dropped: u64,
    /// Motion-to-photon latencies of its last scanned-out frames, in nanoseconds.
    pub latencies_ns: Vec<u64>,
}

/// `POST /display/foreground`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForegroundRequest {
    pub guest: u64,
}

/// `POST /display/refresh`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefreshRequest {
    pub hz: u32,
}

/// `POST /modem/sms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmsRequest {
    pub from: String,
    pub text: String,
    #[serde(default)]
    pub guest: Option<u64>,
}

/// `POST /modem/call`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRequest {
    pub from: String,
    #[serde(default)]
    pub guest: Option<u64>,
}

/// `POST /modem/hangup` (an empty body is fine).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HangupRequest {
    #[serde(default)]
    pub guest: Option<u64>,
}

/// `POST /modem/signal`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    pub rssi: u8,
    #[serde(default = "unknown_ber")]
    pub ber: u8,
    #[serde(default)]
    pub guest: Option<u64>,
}

fn unknown_ber() -> u8 {
    99
}

/// `POST /modem/registration`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrationRequest {
    /// `home`, `searching`, `denied`, `roaming` or `not-registered`.
    pub state: String,
    #[serde(default)]
    pub guest: Option<u64>,
}

/// `POST /camera/source`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CameraSourceRequest {
    /// `synthetic` or `file:PATH`.
    pub source: String,
}

/// A guest's frame for the live view.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewFrame {
    /// The display's frame id.
    pub id: u64,
    /// Size of the JPEG.
    pub width: u32,
    pub height: u32,
    pub jpeg: Vec<u8>,
    /// Capture (or decode) stamp to JPEG ready, in milliseconds (0 when unstamped).
    pub age_ms: f64,
}

/// What a live-view page measured for one guest and posted back (missing fields are 0).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ViewReport {
    pub guest: u64,
    /// Frames the page decoded and drew.
    pub frames: u64,
    /// Distinct frame ids among them.
    pub distinct: u64,
    /// Frames drawn per second over the last second.
    pub fps: f64,
    /// Capture stamp -> frame decoded in the page, median and 95th percentile (ms).
    pub latency_ms_p50: f64,
    pub latency_ms_p95: f64,
    /// The guest's presented frame rate the page read from the daemon.
    pub presented_fps: f64,
}

/// `POST /guests/{id}/snapshot` and `POST /guests/{id}/restore`: a snapshot file on the
/// daemon's host.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// Absolute path of the file.
    pub path: String,
}

/// `POST /guests/{id}/migrate`: live migration to another daemon's migration listener.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
    /// `HOST:PORT` of the target's `--migrate-listen`.
    pub to: String,
    /// The target daemon's token.
    pub token: String,
}
