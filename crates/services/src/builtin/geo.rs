//! `geo`: the emulated phone's location. The host sets a fix (`virtsoc ctl geo fix LON LAT
//! [ALT]`), feeds an NMEA sentence (`geo nmea SENTENCE`) or loads a track (NMEA sentences or
//! GPX track points) that replays one point per interval, looping. Guests read the current
//! fix typed (`fix`) or as NMEA sentences (`nmea`: GGA and RMC).

use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::put;
use std::borrow::Cow;

use crate::hypervisor::{CallCtx, CallInfo, Reply, Service};
use crate::payload::{Input, Output};
use crate::{Result, ServiceError};
use virtsoc_sync::LockExt;

/// Call numbers.
pub mod call {
    /// Values: longitude, latitude, altitude (f64 bits), time (Unix ms; 0: no fix yet).
    pub const FIX: u32 = 1;
    /// Output: the fix as `$GPGGA` and `$GPRMC` sentences; values: bytes.
    pub const NMEA: u32 = 2;
}

const CALLS: &[CallInfo] = &[
    CallInfo {
        call: call::FIX,
        name: Cow::Borrowed("fix"),
        doc: Cow::Borrowed("values: longitude, latitude, altitude (f64 bits), Unix ms (0: no fix)"),
    },
    CallInfo {
        call: call::NMEA,
        name: Cow::Borrowed("nmea"),
        doc: Cow::Borrowed("output: GGA and RMC sentences of the fix; values: bytes"),
    },
];

/// One position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fix {
    /// Degrees east.
    pub lon: f64,
    /// Degrees north.
    pub lat: f64,
    /// Metres above sea level.
    pub alt: f64,
}

impl Fix {
    /// A checked fix.
    pub fn new(lon: f64, lat: f64, alt: f64) -> Result<Self> {
        if !(-180.0..=180.0).contains(&lon) || !(-90.0..=90.0).contains(&lat) || !alt.is_finite() {
            return Err(ServiceError::BadArgument(format!(
                "no such place: longitude {lon}, latitude {lat}, altitude {alt}"
            )));
        }
        Ok(Fix { lon, lat, alt })
    }
}

#[derive(Default)]
struct State {
    fix: Option<Fix>,
    track: Vec<Fix>,
    started: Option<Instant>,
    interval_ms: u64,
}

/// The location service.
#[derive(Default)]
pub struct Geo {
    state: Mutex<State>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `ddmm.mmmm,H` of a coordinate (`deg` digits of degrees).
fn nmea_coord(v: f64, deg: usize, pos: char, neg: char) -> String {
    let a = v.abs();
    let d = a.trunc();
    let m = (a - d) * 60.0;
    format!(
        "{:0deg$}{:07.4},{}",
        d as u32,
        m,
        if v < 0.0 { neg } else { pos }
    )
}

fn with_checksum(body: &str) -> String {
    let cs = body.bytes().fold(0u8, |a, b| a ^ b);
    format!("${body}*{cs:02X}\r\n")
}

/// Civil date (y, m, d) of a day count since 1970-01-01.
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The GGA and RMC sentences of `f` at Unix time `ms`.
pub fn sentences(f: &Fix, ms: u64) -> String {
    let secs = ms / 1000;
    let (h, mi, s, cs) = (secs / 3600 % 24, secs / 60 % 60, secs % 60, ms % 1000 / 10);
    let t = format!("{h:02}{mi:02}{s:02}.{cs:02}");
    let (y, mo, d) = civil((secs / 86_400) as i64);
    let lat = nmea_coord(f.lat, 2, 'N', 'S');
    let lon = nmea_coord(f.lon, 3, 'E', 'W');
    let gga = format!("GPGGA,{t},{lat},{lon},1,08,0.9,{:.1},M,0.0,M,,", f.alt);
    let rmc = format!(
        "GPRMC,{t},A,{lat},{lon},0.0,0.0,{d:02}{mo:02}{:02},,,A",
        y % 100
    );
    with_checksum(&gga) + &with_checksum(&rmc)
}

fn coord(v: &str, hemi: &str) -> Option<f64> {
    let dot = v.find('.').unwrap_or(v.len());
    let split = dot.checked_sub(2)?;
    let deg: f64 = v.get(..split)?.parse().ok()?;
    let min: f64 = v.get(split..)?.parse().ok()?;
    let x = deg + min / 60.0;
    match hemi {
        "N" | "E" => Some(x),
        "S" | "W" => Some(-x),
        _ => None,
    }
}

/// The fix of one `$GPGGA` or `$GPRMC` sentence (checksum checked when present).
pub fn parse_nmea(line: &str) -> Result<Fix> {
    let bad = |m: &str| ServiceError::BadArgument(format!("NMEA {line:?}: {m}"));
    let line = line.trim();
    let body = line.strip_prefix('$').ok_or_else(|| bad("no leading $"))?;
    let body = match body.split_once('*') {
        Some((b, cs)) => {
            let want = u8::from_str_radix(cs, 16).map_err(|_| bad("checksum"))?;
            if b.bytes().fold(0u8, |a, x| a ^ x) != want {
                return Err(bad("checksum does not match"));
            }
            b
        }
        None => body,
    };
    let f: Vec<&str> = body.split(',').collect();
    let kind = f.first().map(|k| k.get(2..).unwrap_or(""));
    let (lat, lon, alt) = match kind {
        Some("GGA") if f.len() > 9 => (
            coord(f[2], f[3]),
            coord(f[4], f[5]),
            f[9].parse().unwrap_or(0.0),
        ),
        Some("RMC") if f.len() > 6 => (coord(f[3], f[4]), coord(f[5], f[6]), 0.0),
        _ => return Err(bad("not a GGA or RMC sentence")),
    };
    Fix::new(
        lon.ok_or_else(|| bad("longitude"))?,
        lat.ok_or_else(|| bad("latitude"))?,
        alt,
    )
}

fn attr(tag: &str, name: &str) -> Option<f64> {
    let at = tag.find(&format!("{name}=\""))? + name.len() + 2;
    let end = tag[at..].find('"')? + at;
    tag[at..end].parse().ok()
}

/// The points of a track: NMEA sentences (one per line) or GPX `<trkpt>`/`<wpt>` elements.
pub fn parse_track(text: &str) -> Result<Vec<Fix>> {
    let mut pts = Vec::new();
    if text.contains("<gpx") || text.contains("<trkpt") {
        for chunk in text.split("<trkpt").skip(1) {
            let tag = chunk.split('>').next().unwrap_or("");
            let (lat, lon) = (attr(tag, "lat"), attr(tag, "lon"));
            let end = chunk.find("</trkpt>").unwrap_or(chunk.len());
            let ele = chunk[..end]
                .split_once("<ele>")
                .and_then(|(_, r)| r.split_once("</ele>"))
                .and_then(|(e, _)| e.trim().parse().ok())
                .unwrap_or(0.0);
            match (lat, lon) {
                (Some(lat), Some(lon)) => pts.push(Fix::new(lon, lat, ele)?),
                _ => {
                    return Err(ServiceError::BadArgument(
                        "GPX trkpt without lat/lon".into(),
                    ))
                }
            }
        }
    } else {
        for l in text.lines().filter(|l| !l.trim().is_empty()) {
            pts.push(parse_nmea(l)?);
        }
    }
    if pts.is_empty() {
        return Err(ServiceError::BadArgument("the track has no points".into()));
    }
    Ok(pts)
}

impl Geo {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock_or_recover()
    }

    /// The current fix: the track's point for now, else the fix set last.
    pub fn current(&self) -> Option<Fix> {
        let s = self.lock();
        if let (Some(t0), false) = (s.started, s.track.is_empty()) {
            let i = t0.elapsed().as_millis() as u64 / s.interval_ms.max(1);
            return s.track.get((i % s.track.len() as u64) as usize).copied();
        }
        s.fix
    }

    fn set(&self, f: Fix) {
        let mut s = self.lock();
        s.fix = Some(f);
        s.track.clear();
        s.started = None;
    }
}

fn num(args: &Value, k: &str) -> Result<f64> {
    args[k]
        .as_f64()
        .ok_or_else(|| ServiceError::BadArgument(format!("field `{k}`: a number")))
}

impl Service for Geo {
    fn name(&self) -> &str {
        "geo"
    }

    fn calls(&self) -> Vec<CallInfo> {
        CALLS.to_vec()
    }

    fn call(&self, _: &CallCtx, c: u32, _: &dyn Input, out: &mut dyn Output) -> Result<Reply> {
        let fix = self.current();
        if c == call::NMEA {
            let Some(f) = fix else {
                return Ok(Reply::default());
            };
            let n = put(out, sentences(&f, now_ms()).as_bytes())?;
            return Ok(Reply {
                len: n,
                values: [n as u64, 0, 0, 0],
            });
        }
        Ok(match fix {
            Some(f) => Reply {
                len: 0,
                values: [f.lon.to_bits(), f.lat.to_bits(), f.alt.to_bits(), now_ms()],
            },
            None => Reply::default(),
        })
    }

    fn control(&self, op: &str, args: &Value) -> Result<Value> {
        match op {
            "fix" => {
                let alt = if args["alt"].is_null() {
                    0.0
                } else {
                    num(args, "alt")?
                };
                let f = Fix::new(num(args, "lon")?, num(args, "lat")?, alt)?;
                self.set(f);
                Ok(json!({ "lon": f.lon, "lat": f.lat, "alt": f.alt }))
            }
            "nmea" => {
                let s = args["sentence"]
                    .as_str()
                    .ok_or_else(|| ServiceError::BadArgument("field `sentence`".into()))?;
                let f = parse_nmea(s)?;
                self.set(f);
                Ok(json!({ "lon": f.lon, "lat": f.lat, "alt": f.alt }))
            }
            "track" => {
                let t = args["text"]
                    .as_str()
                    .ok_or_else(|| ServiceError::BadArgument("field `text`: the track".into()))?;
                let pts = parse_track(t)?;
                let interval = args["interval_ms"]
                    .as_u64()
                    .unwrap_or(1000)
                    .clamp(10, 3_600_000);
                let mut s = self.lock();
                let n = pts.len();
                s.track = pts;
                s.interval_ms = interval;
                s.started = Some(Instant::now());
                Ok(json!({ "points": n, "interval_ms": interval }))
            }
            "get" => Ok(match self.current() {
                Some(f) => json!({ "lon": f.lon, "lat": f.lat, "alt": f.alt,
                                   "nmea": sentences(&f, now_ms()) }),
                None => json!({ "fix": null }),
            }),
            _ => Err(ServiceError::BadArgument(format!(
                "geo: no operation {op:?} (fix, nmea, track, get)"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_round_trip_and_checksums_are_checked() {
        let f = Fix::new(-122.084, 37.4219983, 12.5).unwrap();
        let s = sentences(&f, 1_700_000_000_000);
        let mut lines = s.lines();
        let gga = parse_nmea(lines.next().unwrap()).unwrap();
        assert!((gga.lon - f.lon).abs() < 1e-5 && (gga.lat - f.lat).abs() < 1e-5);
        assert_eq!(gga.alt, 12.5);
        let rmc_line = lines.next().unwrap();
        assert!(rmc_line.contains(",141123,"), "{rmc_line}"); // 2023-11-14
        assert!(parse_nmea(rmc_line).is_ok());
        let broken = rmc_line.replace("*", "0*");
        assert!(parse_nmea(&broken).is_err());
        assert!(parse_nmea("$GPXYZ,1,2").is_err());
        assert!(Fix::new(200.0, 0.0, 0.0).is_err());
    }

    #[test]
    fn tracks_parse_from_gpx_and_replay() {
        let gpx = r#"<gpx><trk><trkseg><trkpt lat="48.85" lon="2.35"><ele>35</ele></trkpt>
            <trkpt lat="48.86" lon="2.36"></trkpt></trkseg></trk></gpx>"#;
        let t = parse_track(gpx).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].lat, t[0].alt, t[1].lon), (48.85, 35.0, 2.36));
        assert!(parse_track("<gpx></gpx>").is_err());
        let g = Geo::default();
        assert!(g.current().is_none());
        g.control("track", &json!({"text": gpx, "interval_ms": 3_600_000}))
            .unwrap();
        assert_eq!(g.current().unwrap().lat, 48.85);
        g.control("fix", &json!({"lon": 1.0, "lat": 2.0})).unwrap();
        assert_eq!(g.current().unwrap(), Fix::new(1.0, 2.0, 0.0).unwrap());
    }
}
