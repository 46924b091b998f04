//! `GET /metrics`: the daemon's counters as Prometheus text, built with the `prometheus`
//! crate from a fresh [`Registry`] filled at each scrape from the daemon's own counters (which
//! are the source of truth: the SVM manager's per-guest counters and copy ledger, the
//! sessions' command counts, the display's scan-out records).
//!
//! The motion-to-photon histogram covers the display's window of each guest's latest
//! scanned-out frames (the display keeps the last 4096 samples per guest), not every frame
//! since the guest connected.

use prometheus::{
    CounterVec, Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use crate::types::DisplayGuestMetrics;
use crate::{Backend, ControlError};

/// Upper bounds of the motion-to-photon histogram's buckets, in seconds.
pub const M2P_BUCKETS: [f64; 12] = [
    0.005, 0.010, 0.016, 0.025, 0.033, 0.050, 0.075, 0.100, 0.150, 0.250, 0.500, 1.0,
];

fn internal(e: prometheus::Error) -> ControlError {
    ControlError::Internal(format!("metrics: {e}"))
}

struct Families {
    reg: Registry,
}

impl Families {
    fn counter(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntCounterVec, ControlError> {
        let c = IntCounterVec::new(Opts::new(name, help), labels).map_err(internal)?;
        self.reg.register(Box::new(c.clone())).map_err(internal)?;
        Ok(c)
    }

    fn seconds(&self, name: &str, help: &str, labels: &[&str]) -> Result<CounterVec, ControlError> {
        let c = CounterVec::new(Opts::new(name, help), labels).map_err(internal)?;
        self.reg.register(Box::new(c.clone())).map_err(internal)?;
        Ok(c)
    }

    fn gauge(&self, name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec, ControlError> {
        let g = IntGaugeVec::new(Opts::new(name, help), labels).map_err(internal)?;
        self.reg.register(Box::new(g.clone())).map_err(internal)?;
        Ok(g)
    }
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Label names of a guest's series, of a guest's series by link, and by device.
const G: &[&str] = &["guest", "name"];
const GL: &[&str] = &["guest", "name", "src", "dst"];
const GD: &[&str] = &["guest", "name", "device"];

/// The metrics page.
pub fn render(backend: &dyn Backend) -> Result<String, ControlError> {
    let f = Families {
        reg: Registry::new_custom(Some("virtsoc".into()), None).map_err(internal)?,
    };
    let guests_up = f.gauge("guests", "Live guest sessions.", &[])?;
    let lingering = f.gauge(
        "sessions_lingering",
        "Guest sessions that ended over a second ago and are still referenced (a leak).",
        &[],
    )?;
    let per_guest = GuestFamilies::declare(&f)?;
    let queued = f.gauge(
        "device_queued",
        "Commands waiting in a device's queues.",
        &["device"],
    )?;
    let display = DisplayFamilies::declare(&f)?;

    let guests = backend.guests();
    guests_up.with_label_values(&[]).set(guests.len() as i64);
    lingering
        .with_label_values(&[])
        .set(i64::try_from(backend.lingering_sessions()).unwrap_or(i64::MAX));
    for g in &guests {
        per_guest.observe(g);
    }
    for d in backend.devices() {
        queued.with_label_values(&[&d.name]).set(d.queued as i64);
    }
    display.observe(backend, &guests)?;
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&f.reg.gather(), &mut out)
        .map_err(internal)?;
    String::from_utf8(out).map_err(|e| ControlError::Internal(e.to_string()))
}

/// The series of one guest's memory, commands, copies and prefetches.
struct GuestFamilies {
    regions: IntGaugeVec,
    bytes: IntGaugeVec,
    commands: IntCounterVec,
    copies: IntCounterVec,
    copy_bytes: IntCounterVec,
    copy_time: CounterVec,
    sync_fetches: IntCounterVec,
    prefetches: IntCounterVec,
    hits: IntCounterVec,
    misses: IntCounterVec,
    device_time: CounterVec,
}

impl GuestFamilies {
    fn declare(f: &Families) -> Result<Self, ControlError> {
        Ok(GuestFamilies {
            regions: f.gauge("guest_regions", "Regions a guest holds.", G)?,
            bytes: f.gauge("guest_bytes", "Host bytes a guest's regions hold.", G)?,
            commands: f.counter(
                "guest_commands_total",
                "Device commands a guest queued, by device.",
                GD,
            )?,
            copies: f.counter(
                "coherence_copies_total",
                "Copies of a guest's bytes by link between memory domains (src == dst: a \
                 device's own).",
                GL,
            )?,
            copy_bytes: f.counter(
                "coherence_bytes_total",
                "Bytes of those copies, by link.",
                GL,
            )?,
            copy_time: f.seconds(
                "coherence_seconds_total",
                "Time spent in those copies, by link.",
                GL,
            )?,
            sync_fetches: f.counter(
                "coherence_sync_fetches_total",
                "Reads that fetched synchronously.",
                G,
            )?,
            prefetches: f.counter("prefetches_total", "Copies started by predictions.", G)?,
            hits: f.counter(
                "prediction_hits_total",
                "Prefetch predictions that were right.",
                G,
            )?,
            misses: f.counter(
                "prediction_misses_total",
                "Prefetch predictions that were wrong.",
                G,
            )?,
            device_time: f.seconds(
                "guest_device_seconds_total",
                "Device time of a guest's requests, by device.",
                GD,
            )?,
        })
    }

    fn observe(&self, g: &crate::types::GuestInfo) {
        let id = g.id.to_string();
        let l = [id.as_str(), g.name.as_str()];
        self.regions.with_label_values(&l).set(g.regions as i64);
        self.bytes.with_label_values(&l).set(g.bytes as i64);
        for (dev, n) in &g.commands {
            self.commands
                .with_label_values(&[&id, &g.name, dev])
                .inc_by(*n);
        }
        for (dev, u) in &g.device_use {
            self.device_time
                .with_label_values(&[&id, &g.name, dev])
                .inc_by(secs(u.device_ns));
        }
        for link in &g.links {
            let ll = [id.as_str(), g.name.as_str(), &link.src, &link.dst];
            self.copies.with_label_values(&ll).inc_by(link.copies);
            self.copy_bytes.with_label_values(&ll).inc_by(link.bytes);
            self.copy_time.with_label_values(&ll).inc_by(secs(link.ns));
        }
        self.sync_fetches
            .with_label_values(&l)
            .inc_by(g.counters.sync_fetches);
        self.prefetches
            .with_label_values(&l)
            .inc_by(g.counters.prefetches);
        self.hits.with_label_values(&l).inc_by(g.counters.hits);
        self.misses.with_label_values(&l).inc_by(g.counters.misses);
    }
}

/// The series of the display's scan-out records per guest.
struct DisplayFamilies {
    presented: IntCounterVec,
    dropped: IntCounterVec,
    m2p: HistogramVec,
}

impl DisplayFamilies {
    fn declare(f: &Families) -> Result<Self, ControlError> {
        let presented = f.counter(
            "display_presented_frames_total",
            "A guest's frames that reached the screen.",
            G,
        )?;
        let dropped = f.counter(
            "display_dropped_frames_total",
            "A guest's frames replaced before a vsync or hidden behind another guest.",
            G,
        )?;
        let m2p = HistogramVec::new(
            HistogramOpts::new(
                "display_motion_to_photon_seconds",
                "Motion-to-photon latency of a guest's latest scanned-out frames.",
            )
            .buckets(M2P_BUCKETS.to_vec()),
            G,
        )
        .map_err(internal)?;
        f.reg.register(Box::new(m2p.clone())).map_err(internal)?;
        Ok(DisplayFamilies {
            presented,
            dropped,
            m2p,
        })
    }

    /// Asks the display for its records (none without a display) and fills the series of
    /// `guests` (a guest gone since the listing is left out).
    fn observe(
        &self,
        backend: &dyn Backend,
        guests: &[crate::types::GuestInfo],
    ) -> Result<(), ControlError> {
        let display: Vec<DisplayGuestMetrics> =
            match backend.device_control("display", "metrics", &serde_json::Value::Null) {
                Ok(v) => serde_json::from_value(v)
                    .map_err(|e| ControlError::Internal(format!("display metrics: {e}")))?,
                Err(ControlError::NotFound(_) | ControlError::Unsupported(_)) => Vec::new(),
                Err(e) => return Err(e),
            };
        for m in display {
            let Some(g) = guests.iter().find(|g| g.id == m.guest) else {
                continue; // gone since the listing
            };
            let id = g.id.to_string();
            let l = [id.as_str(), g.name.as_str()];
            self.presented.with_label_values(&l).inc_by(m.presented);
            self.dropped.with_label_values(&l).inc_by(m.dropped);
            let h = self.m2p.with_label_values(&l);
            for ns in m.latencies_ns {
                h.observe(secs(ns));
            }
        }
        Ok(())
    }
}
