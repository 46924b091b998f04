//! Request and response bodies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A guest's coherence counters (the SVM manager's `guest_counters`): the record declared
/// once in [`virtsoc_proto::counters`], serialised as its thirteen SVM counters.
pub use virtsoc_proto::counters::Counters;

/// Copies of one guest's bytes on one link between memory domains (`src == dst`: a device's
/// own copies in its memory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkCopies {
    /// Source memory domain name.
    pub src: String,
    /// Destination memory domain name (equal to `src` for a device's own copies).
    pub dst: String,
    /// Number of copies.
    pub copies: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Time spent copying, in nanoseconds.
    pub ns: u64,
}

/// A live guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestInfo {
    /// Guest id, as the daemon assigned it at connection.
    pub id: u64,
    /// Name the guest gave when it connected.
    pub name: String,
    /// `unix` (process guest), `tcp` (remote guest) or `vm`.
    pub transport: String,
    /// Coherence protocol.
    pub protocol: String,
    /// Regions it holds.
    pub regions: u64,
    /// Host bytes its regions hold.
    pub bytes: u64,
    /// Its coherence counters.
    pub counters: Counters,
    /// Copies by link.
    pub links: Vec<LinkCopies>,
    /// Device commands it queued, by device name.
    pub commands: BTreeMap<String, u64>,
    /// Its use of each device it has a queue on, by device name.
    #[serde(default)]
    pub device_use: BTreeMap<String, DeviceUse>,
    /// Its CPU weight (cgroup v2 `cpu.weight` or v1 `cpu.shares`) where the daemon steers
    /// CPU weights (`virtsocd --cpu-cgroup`) and its process has a group; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_weight: Option<u64>,
    /// What pacing to its bandwidth share did to it (`virtsocd --limit-bandwidth`).
    #[serde(default)]
    pub paced: Paced,
    /// Fence waits of its device queues given up after its policy's `fence_wait_ms` (a fence
    /// that was never signaled).
    #[serde(default)]
    pub abandoned_waits: u64,
}

/// A guest's large fills and copies paced to its bandwidth share so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Paced {
    /// Bytes its devices moved in paced steps.
    pub bytes: u64,
    /// Time those steps waited for their bytes of the share, in nanoseconds.
    pub wait_ns: u64,
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
    /// Device id, as the daemon's registry numbers devices.
    pub id: u32,
    /// Device name (`gpu`, `display`, `modem`, ...), as the guests open it.
    pub name: String,
    /// Backend description (e.g. `libavcodec 59 (h264, hevc)` for a decoder).
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
    /// Guest id.
    pub guest: u64,
    /// Frames of the guest the display scanned out.
    pub presented: u64,
    /// Frames of the guest replaced before they reached scan-out.
    pub dropped: u64,
    /// Motion-to-photon latencies of its last scanned-out frames, in nanoseconds.
    pub latencies_ns: Vec<u64>,
}

/// `POST /display/foreground`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForegroundRequest {
    /// Id of the guest to bring to the foreground.
    pub guest: u64,
}

/// `POST /display/refresh`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefreshRequest {
    /// New display refresh rate, in hertz.
    pub hz: u32,
}

/// `POST /modem/sms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmsRequest {
    /// Sender's number, as shown to the guest.
    pub from: String,
    /// Message text.
    pub text: String,
    #[serde(default)]
    /// Guest to deliver to; `None` delivers to every modem already open.
    pub guest: Option<u64>,
}

/// `POST /modem/call`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRequest {
    /// Caller's number, as shown to the guest.
    pub from: String,
    #[serde(default)]
    /// Guest to ring; `None` rings every modem already open.
    pub guest: Option<u64>,
}

/// `POST /modem/hangup` (an empty body is fine).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HangupRequest {
    #[serde(default)]
    /// Guest whose call to hang up; `None` hangs up on every modem already open.
    pub guest: Option<u64>,
}

/// `POST /modem/signal`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// Received signal strength as an AT+CSQ value: 0..=31, 99 = unknown.
    pub rssi: u8,
    #[serde(default = "unknown_ber")]
    /// Bit error rate as an AT+CSQ value: 0..=7, 99 = unknown (the default).
    pub ber: u8,
    #[serde(default)]
    /// Guest to report to; `None` applies to every modem already open (and to modems opened later).
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
    /// Guest whose registration changes; `None` changes every modem already open (and modems opened
    /// later).
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
    /// Width of the JPEG in pixels.
    pub width: u32,
    /// Height of the JPEG in pixels.
    pub height: u32,
    /// The JPEG-encoded frame.
    pub jpeg: Vec<u8>,
    /// Capture (or decode) stamp to JPEG ready, in milliseconds (0 when unstamped).
    pub age_ms: f64,
}

/// What a live-view page measured for one guest and posted back (missing fields are 0).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ViewReport {
    /// Guest the report is about.
    pub guest: u64,
    /// Frames the page decoded and drew.
    pub frames: u64,
    /// Distinct frame ids among them.
    pub distinct: u64,
    /// Frames drawn per second over the last second.
    pub fps: f64,
    /// Capture stamp -> frame decoded in the page, median (ms).
    pub latency_ms_p50: f64,
    /// Capture stamp -> frame decoded in the page, 95th percentile (ms).
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
