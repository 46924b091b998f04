//! The virtsoc guest's costs per glmark2 scene, read from the daemon's control API
//! (`GET /guests`, and the `gles` device's own counters per guest, `GET /gles/stats`) each
//! time glmark2 prints a scene's result: `gles` device commands (one per stream batch), SVM
//! copies, and the guest's `gles` counters (`round_trips`: batches the guest waited on;
//! `stream_bytes`; `swaps`; `frame_copies`: copies of frame bytes, e.g. a window frame's
//! readback for the display). Against a daemon without `/gles/stats`, the bytes SVM copied
//! into the `gles` domain from elsewhere stand for the stream's bytes, device commands for
//! round trips and every SVM copy for the frame copies (each source is reported).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use virtsoc_control::client::{request, Target};
use virtsoc_sync::LockExt;

/// Cumulative counters of the guests of one program (summed when it opened several).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Snapshot {
    /// `gles` device commands.
    commands: u64,
    /// SVM copies (CPU and device).
    copies: u64,
    /// The daemon's `gles.round_trips`, if reported.
    round_trips: Option<u64>,
    /// The daemon's `gles.bytes` (or `stream_bytes`), if reported.
    bytes: Option<u64>,
    /// Bytes SVM copied into the `gles` domain from another.
    upload_bytes: u64,
    /// The daemon's `gles.frames` (or `swaps`), if reported.
    frames: Option<u64>,
    /// The daemon's `gles.frame_copies`, if reported.
    frame_copies: Option<u64>,
}

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

fn sub(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    Some(a?.saturating_sub(b.unwrap_or(0)))
}

impl Snapshot {
    /// The counters of one guest's stats object.
    fn of_guest(g: &Value) -> Snapshot {
        let n = |v: &Value| v.as_u64();
        let gles = &g["gles"];
        let first = |keys: &[&str]| keys.iter().find_map(|k| n(&gles[*k]));
        Snapshot {
            commands: n(&g["commands"]["gles"]).unwrap_or(0),
            copies: n(&g["counters"]["copies"]).unwrap_or(0)
                + n(&g["counters"]["device_copies"]).unwrap_or(0),
            round_trips: first(&["round_trips"]),
            bytes: first(&["bytes", "stream_bytes"]),
            upload_bytes: g["links"]
                .as_array()
                .map(|ls| {
                    ls.iter()
                        .filter(|l| l["dst"] == "gles" && l["src"] != "gles")
                        .filter_map(|l| n(&l["bytes"]))
                        .sum()
                })
                .unwrap_or(0),
            frames: first(&["frames", "swaps", "presents"]),
            frame_copies: first(&["frame_copies"]),
        }
    }

    /// Field by field the larger of two snapshots of the same guests: every counter only
    /// grows, and a snapshot taken as the program leaves may lack some (the `gles` device
    /// forgets a guest before the control API stops listing it).
    fn latest(self, o: Snapshot) -> Snapshot {
        let max = |a: Option<u64>, b: Option<u64>| a.max(b);
        Snapshot {
            commands: self.commands.max(o.commands),
            copies: self.copies.max(o.copies),
            round_trips: max(self.round_trips, o.round_trips),
            bytes: max(self.bytes, o.bytes),
            upload_bytes: self.upload_bytes.max(o.upload_bytes),
            frames: max(self.frames, o.frames),
            frame_copies: max(self.frame_copies, o.frame_copies),
        }
    }

    fn plus(self, o: Snapshot) -> Snapshot {
        Snapshot {
            commands: self.commands + o.commands,
            copies: self.copies + o.copies,
            round_trips: add(self.round_trips, o.round_trips),
            bytes: add(self.bytes, o.bytes),
            upload_bytes: self.upload_bytes + o.upload_bytes,
            frames: add(self.frames, o.frames),
            frame_copies: add(self.frame_copies, o.frame_copies),
        }
    }

    fn minus(self, o: Snapshot) -> SceneCost {
        SceneCost {
            commands: self.commands.saturating_sub(o.commands),
            copies: self.copies.saturating_sub(o.copies),
            round_trips: sub(self.round_trips, o.round_trips),
            bytes: sub(self.bytes, o.bytes),
            upload_bytes: self.upload_bytes.saturating_sub(o.upload_bytes),
            frames: sub(self.frames, o.frames),
            frame_copies: sub(self.frame_copies, o.frame_copies),
        }
    }
}

/// What one scene cost the virtsoc guest (differences of its counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SceneCost {
    /// `gles` device commands (stream batches).
    pub commands: u64,
    /// SVM copies.
    pub copies: u64,
    /// Round trips, when the daemon counts them.
    pub round_trips: Option<u64>,
    /// Stream bytes, when the daemon counts them.
    pub bytes: Option<u64>,
    /// Bytes SVM copied into the `gles` domain.
    pub upload_bytes: u64,
    /// Frames, when the daemon counts them.
    pub frames: Option<u64>,
    /// Copies of frame bytes, when the daemon counts them.
    pub frame_copies: Option<u64>,
}

/// The guests' list of the control API (None: it did not answer).
fn guests(target: &Target) -> Option<Vec<Value>> {
    let r = request(target, "GET", "/guests", b"").ok()?;
    if r.status != 200 {
        return None;
    }
    match r.json() {
        Value::Array(v) => Some(v),
        _ => None,
    }
}

/// The `gles` device's counters by guest id (`GET /gles/stats`; empty when the daemon has
/// no such route).
fn gles_stats(target: &Target) -> serde_json::Map<String, Value> {
    match request(target, "GET", "/gles/stats", b"") {
        Ok(r) if r.status == 200 => match r.json() {
            Value::Object(mut m) => match m.remove("guests") {
                Some(Value::Object(g)) => g,
                _ => serde_json::Map::new(),
            },
            _ => serde_json::Map::new(),
        },
        _ => serde_json::Map::new(),
    }
}

/// The summed counters of the guests not in `before` (None: no such guest, or no answer).
fn snapshot(target: &Target, before: &BTreeSet<u64>) -> Option<Snapshot> {
    let mut gs = guests(target)?;
    let mut stats = gles_stats(target);
    for g in &mut gs {
        let id = g["id"].as_u64().map(|i| i.to_string()).unwrap_or_default();
        if let (Some(s), Value::Object(m)) = (stats.remove(&id), &mut *g) {
            m.entry("gles").or_insert(s);
        }
    }
    let ours: Vec<Snapshot> = gs
        .iter()
        .filter(|g| g["id"].as_u64().is_some_and(|id| !before.contains(&id)))
        .map(Snapshot::of_guest)
        .collect();
    if ours.is_empty() {
        return None;
    }
    Some(ours.into_iter().fold(Snapshot::default(), Snapshot::plus))
}

/// Reads the counters of the guests a program opens, scene by scene. A program may have
/// closed its connection by the time its last scene's line is read, so a thread also
/// samples them every 100 ms: a scene whose end finds no guest takes the latest sample.
pub struct SceneCostMeter {
    target: Target,
    /// Guests that existed before the program started (not its own).
    before: Arc<BTreeSet<u64>>,
    last: Snapshot,
    scenes: BTreeMap<String, SceneCost>,
    /// Whether the control API answered at all.
    reachable: bool,
    latest: Arc<Mutex<Option<Snapshot>>>,
    stop: Arc<AtomicBool>,
    sampler: Option<std::thread::JoinHandle<()>>,
}

impl SceneCostMeter {
    /// Counters of the daemon whose guest socket is `socket`.
    pub fn new(socket: &str) -> SceneCostMeter {
        SceneCostMeter {
            target: crate::ctl::target(Some(socket.to_string())),
            before: Arc::new(BTreeSet::new()),
            last: Snapshot::default(),
            scenes: BTreeMap::new(),
            reachable: false,
            latest: Arc::new(Mutex::new(None)),
            stop: Arc::new(AtomicBool::new(false)),
            sampler: None,
        }
    }

    /// Before the program starts: remembers the guests that are not its own and starts
    /// sampling.
    pub fn begin(&mut self) {
        self.end_sampling();
        let gs = guests(&self.target);
        self.reachable = gs.is_some();
        self.before = Arc::new(
            gs.unwrap_or_default()
                .iter()
                .filter_map(|g| g["id"].as_u64())
                .collect(),
        );
        self.last = Snapshot::default();
        self.scenes.clear();
        *self.latest.lock_or_recover() = None;
        if !self.reachable {
            return;
        }
        self.stop = Arc::new(AtomicBool::new(false));
        let (target, before, latest, stop) = (
            self.target.clone(),
            self.before.clone(),
            self.latest.clone(),
            self.stop.clone(),
        );
        self.sampler = Some(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(s) = snapshot(&target, &before) {
                    let mut l = latest.lock_or_recover();
                    *l = Some(l.map_or(s, |old| old.latest(s)));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }));
    }

    fn end_sampling(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.sampler.take() {
            let _ = t.join();
        }
    }

    /// A scene ended: what it cost is the difference to the previous scene's end.
    pub fn scene_ended(&mut self, name: &str) {
        if !self.reachable {
            return;
        }
        let sampled = *self.latest.lock_or_recover();
        let now = match (snapshot(&self.target, &self.before), sampled) {
            (Some(now), Some(s)) => Some(now.latest(s)),
            (now, s) => now.or(s),
        };
        if let Some(now) = now {
            self.scenes.insert(name.to_string(), now.minus(self.last));
            self.last = now;
        }
    }

    /// The program's per-scene costs (empty when the control API did not answer).
    pub fn take(&mut self) -> BTreeMap<String, SceneCost> {
        self.end_sampling();
        std::mem::take(&mut self.scenes)
    }
}

impl Drop for SceneCostMeter {
    fn drop(&mut self) {
        self.end_sampling();
    }
}

/// A scene's per-frame costs on the virtsoc path: medians over rounds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PerFrame {
    /// Round trips (or `gles` commands) per frame.
    pub round_trips: Option<f64>,
    /// `round_trips` or `gles commands`.
    pub round_trips_source: Option<String>,
    /// Stream bytes per frame.
    pub bytes: Option<f64>,
    /// `gles bytes` (the daemon's count) or `SVM bytes into gles`.
    pub bytes_source: Option<String>,
    /// Copies of frame bytes per frame (or SVM copies per frame, see `copies_source`).
    pub copies: Option<f64>,
    /// `frame copies` (the daemon's count) or `SVM copies`.
    pub copies_source: Option<String>,
    /// `daemon` (counted frames) or `fps x duration`.
    pub frames_source: Option<String>,
}

/// Per-frame costs of a scene from each round's costs and FPS (`duration` seconds a scene).
pub fn per_frame<'a>(
    rounds: impl Iterator<Item = (Option<&'a SceneCost>, Option<&'a (String, Option<f64>)>)>,
    duration: f64,
) -> PerFrame {
    let mut rt = Vec::new();
    let mut bytes = Vec::new();
    let mut copies = Vec::new();
    let mut out = PerFrame::default();
    for (cost, scene) in rounds {
        let Some(c) = cost else { continue };
        let frames = match (c.frames, scene.and_then(|s| s.1)) {
            (Some(f), _) if f > 0 => {
                out.frames_source = Some("daemon".into());
                f as f64
            }
            (_, Some(fps)) if fps > 0.0 => {
                out.frames_source = Some("fps x duration".into());
                (fps * duration).max(1.0)
            }
            _ => continue,
        };
        match c.round_trips {
            Some(r) => {
                out.round_trips_source = Some("round_trips".into());
                rt.push(Some(r as f64 / frames));
            }
            None => {
                out.round_trips_source = Some("gles commands".into());
                rt.push(Some(c.commands as f64 / frames));
            }
        }
        let b = match c.bytes {
            Some(b) => {
                out.bytes_source = Some("gles bytes".into());
                b
            }
            None => {
                out.bytes_source = Some("SVM bytes into gles".into());
                c.upload_bytes
            }
        };
        bytes.push(Some(b as f64 / frames));
        let n = match c.frame_copies {
            Some(n) => {
                out.copies_source = Some("frame copies".into());
                n
            }
            None => {
                out.copies_source = Some("SVM copies".into());
                c.copies
            }
        };
        copies.push(Some(n as f64 / frames));
    }
    out.round_trips = super::median(rt);
    out.bytes = super::median(bytes);
    out.copies = super::median(copies);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_stats_become_scene_costs() {
        let g = serde_json::json!({
            "id": 3,
            "commands": {"gles": 120, "display": 4},
            "counters": {"copies": 2, "device_copies": 1},
            "gles": {"round_trips": 60, "stream_bytes": 4096}
        });
        let s = Snapshot::of_guest(&g);
        assert_eq!(s.commands, 120);
        assert_eq!(s.copies, 3);
        assert_eq!(s.round_trips, Some(60));
        assert_eq!(s.bytes, Some(4096));
        assert_eq!(s.frames, None);
        let later = Snapshot {
            commands: 200,
            copies: 5,
            round_trips: Some(100),
            bytes: Some(8192),
            upload_bytes: 0,
            frames: None,
            frame_copies: Some(0),
        };
        let c = later.minus(s);
        assert_eq!(c.commands, 80);
        assert_eq!(c.round_trips, Some(40));
        let name = ("build".to_string(), Some(20.0));
        let pf = per_frame([(Some(&c), Some(&name))].into_iter(), 2.0);
        assert_eq!(pf.round_trips, Some(1.0));
        assert_eq!(pf.bytes, Some(4096.0 / 40.0));
        assert_eq!(pf.frames_source.as_deref(), Some("fps x duration"));
        // Without the daemon's gles counters: commands per frame.
        let bare = Snapshot::of_guest(&serde_json::json!({
            "commands": {"gles": 40},
            "links": [
                {"src": "guest-window", "dst": "gles", "copies": 3, "bytes": 800, "ns": 1},
                {"src": "gles", "dst": "gles", "copies": 3, "bytes": 8000, "ns": 1},
                {"src": "gles", "dst": "guest-window", "copies": 1, "bytes": 99, "ns": 1}
            ]
        }));
        assert_eq!(bare.upload_bytes, 800);
        let pf = per_frame(
            [(Some(&bare.minus(Snapshot::default())), Some(&name))].into_iter(),
            2.0,
        );
        assert_eq!(pf.round_trips, Some(1.0));
        assert_eq!(pf.round_trips_source.as_deref(), Some("gles commands"));
        assert_eq!(pf.bytes, Some(20.0));
        assert_eq!(pf.bytes_source.as_deref(), Some("SVM bytes into gles"));
        assert_eq!(pf.copies_source.as_deref(), Some("SVM copies"));
    }

    #[test]
    fn a_snapshot_without_the_gles_counters_does_not_undo_them() {
        let full = Snapshot {
            commands: 10,
            round_trips: Some(5),
            frame_copies: Some(3),
            ..Snapshot::default()
        };
        let leaving = Snapshot {
            commands: 12,
            ..Snapshot::default()
        };
        let m = full.latest(leaving);
        assert_eq!(m.commands, 12);
        assert_eq!(m.round_trips, Some(5));
        assert_eq!(m.frame_copies, Some(3));
        let c = m.minus(full);
        assert_eq!((c.commands, c.round_trips), (2, Some(0)));
    }
}
