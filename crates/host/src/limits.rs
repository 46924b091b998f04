//! What one guest may hold and ask for: every limit of the daemon counted against a guest (or
//! against all guests of one kind of device together), in one place.
//!
//! Each limit has a `virtsocd` flag; the defaults are sized for a phone-class workload with a
//! comfortable margin (a 4K camera pipeline with a few hundred regions and fences) while
//! keeping one guest from growing the daemon without bound.
//!
//! What a guest gets when it hits a limit:
//! - memory and objects it holds (regions, fences, codec sessions of its own): `OutOfMemory`;
//! - bandwidth: nothing is refused; a large fill or copy a device makes for the guest waits
//!   for its bytes of the guest's share, chunk by chunk ([`virtsoc_svm::pace`]);
//! - queues, rates and shared capacity (queued items, global codec sessions and threads,
//!   snapshots, GPU work per command and in flight): `Busy` (try again later).
//!
//! | field | default | flag |
//! |---|---|---|
//! | [`regions`](Limits::regions) | 65536 | `--limit-regions` |
//! | [`fences`](Limits::fences) | 16384 | `--limit-fences` |
//! | [`queued_per_device`](Limits::queued_per_device) | 4096 | `--limit-queued` |
//! | [`remote_bytes_in_flight`](Limits::remote_bytes_in_flight) | 256 MiB | `--limit-remote-bytes` |
//! | [`codec_sessions_per_guest`](Limits::codec_sessions_per_guest) | 16 | `--limit-codec-sessions` |
//! | [`codec_sessions`](Limits::codec_sessions) | 64 | `--limit-codec-sessions-total` |
//! | [`codec_threads`](Limits::codec_threads) | 64 | `--limit-codec-threads` |
//! | [`codec_threads_per_guest`](Limits::codec_threads_per_guest) | 16 | `--limit-codec-threads-per-guest` |
//! | [`sms_sent`](Limits::sms_sent) | 256 | `--limit-sms-sent` |
//! | [`snapshot_interval`](Limits::snapshot_interval) | 1 s | `--limit-snapshot-interval-ms` |
//! | [`gpu_cost`](Limits::gpu_cost) | 8 x 3840 x 2160 | `--limit-gpu-cost` |
//! | [`gpu_in_flight`](Limits::gpu_in_flight) | 2 | `--limit-gpu-in-flight` |
//! | [`bandwidth`](Limits::bandwidth) | 1 GiB/s, burst 64 MiB | `--limit-bandwidth`, `--limit-bandwidth-burst` |
//!
//! The memory a guest's replicas hold is limited separately (`--guest-mem-limit`), and so
//! are its window (`--max-window`) and the number of guests (`--max-guests`).

use std::time::Duration;

use virtsoc_svm::pace::Share;

/// The daemon's per-guest (and per-device) limits. See the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Regions one guest may hold at once (`OutOfMemory` beyond). A blob larger than the
    /// guest's memory limit is refused at allocation (`OutOfMemory`) too.
    pub regions: u64,
    /// Live (unsignaled or unreleased) virtual fences of one guest, page-backed and overflow
    /// together (`OutOfMemory` beyond).
    pub fences: usize,
    /// Items (commands, fence waits and signals) one guest may have queued on one device and
    /// not yet executed (`Busy` beyond).
    pub queued_per_device: usize,
    /// Bytes of completions (with their read payloads) a remote guest may have queued for
    /// sending: the daemon takes no further request from it until they drain below this.
    pub remote_bytes_in_flight: u64,
    /// Open codec sessions (decoders and encoders) of one guest (`OutOfMemory` beyond).
    pub codec_sessions_per_guest: usize,
    /// Open codec sessions of all guests together (`Busy` beyond).
    pub codec_sessions: usize,
    /// Codec threads of all open sessions together (`Busy` for a session that would go past).
    pub codec_threads: usize,
    /// Codec threads of one guest's open sessions: its share of [`codec_threads`]
    /// (`Busy` for a session that would go past), so no guest holds every guest's.
    ///
    /// [`codec_threads`]: Limits::codec_threads
    pub codec_threads_per_guest: usize,
    /// How long a decoder may sit idle before its backend (worker process) is closed until
    /// its next `decode` (`device::codec`'s reaper; zero: never).
    pub codec_idle_reap: Duration,
    /// Sent messages the modem keeps per guest; the oldest delivered ones are dropped beyond.
    /// (Its received-message store is the modem's own, 30 slots: a full store answers
    /// `+CMS ERROR: 322`.)
    pub sms_sent: usize,
    /// Shortest time between two display snapshots of one guest (`Busy` sooner).
    pub snapshot_interval: Duration,
    /// Largest cost of one GPU command: the sum over its layers of the destination pixels
    /// each covers (its destination rectangle clipped to the target), `Busy` beyond.
    pub gpu_cost: u64,
    /// GPU submissions of one guest in flight at once (`Busy` beyond).
    pub gpu_in_flight: usize,
    /// One guest's memory-bandwidth share for the large moves its devices make for it
    /// (fills and copies of at least [`virtsoc_svm::stream::STREAM_MIN`] bytes): bytes per
    /// second and burst ([`virtsoc_svm::pace`]; rate 0: not paced). The default, 1 GiB/s
    /// with 64 MiB of burst: above the most a benchmark pipeline moves through one guest's
    /// paced device (`virtsoc bench svm`: a 16.6 MB UHD frame filled every ~20 ms, 0.8
    /// GB/s; a UHD NV12 stream at 60 fps is 0.75 GB/s), a burst of four such frames, and
    /// below what the `queue-flood` hostile moved unpaced on the 2-core machine measured
    /// (1.2-1.5 GB/s, `docs/results.md` stop 20).
    pub bandwidth: Share,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            regions: 65536,
            fences: 16384,
            queued_per_device: 4096,
            remote_bytes_in_flight: 256 << 20,
            codec_sessions_per_guest: 16,
            codec_sessions: 64,
            codec_threads: 64,
            codec_threads_per_guest: 16,
            codec_idle_reap: Duration::from_secs(120),
            sms_sent: 256,
            snapshot_interval: Duration::from_secs(1),
            gpu_cost: 8 * 3840 * 2160,
            gpu_in_flight: 2,
            bandwidth: Share {
                rate: 1 << 30,
                burst: 64 << 20,
            },
        }
    }
}
