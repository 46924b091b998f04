//! The live view and recordings: a page that shows every guest's display with its frame rate
//! and latency beside it, the JPEG frames it pulls, the reports it posts back, and MP4
//! recordings of a guest's presented frames.
//!
//! Why JPEG frames pulled over plain HTTP: the daemon's control server is blocking
//! (`tiny_http`, a thread per request), the page needs per-frame metadata to measure latency
//! (the frame id and its age travel as headers beside each JPEG), and a viewer that
//! asks for the next frame only once it has drawn the last one gets exactly the frames it can
//! take: a slow viewer drops frames for itself only, and nothing ever queues for it in the
//! daemon. Each request waits (up to a second, on its own request thread) for a frame newer
//! than the one the page has, so there is no polling between frames. MJPEG in an `<img>`
//! would hide the per-frame metadata; WebSocket or WebRTC would bring an async stack or a
//! media server for the same frames.
//!
//! What a viewer costs the daemon: each frame is a picture sampled straight from the
//! display's planes plus one JPEG, made on the request's thread. For the 1080p camera
//! scenario that is about 1 ms of CPU a frame (the picture about 0.43 ms, most of it reading
//! the 270 source rows another core just wrote; libavcodec's JPEG about 0.39 ms; the request
//! the rest), so the page's 10 frames a second within a 480x480 box would be a point of a
//! core against the daemon's 8%. The daemon therefore holds all viewers together to a CPU
//! budget ([`crate::budget`], `virtsocd --view-budget`, 4% of its other CPU by default): a
//! frame request waits until what the view used so far fits it, which for that scenario is
//! about 3 frames a second (docs/results.md, stop 22; `virtsoc watch camera --measure`).
//! A picture equal to the last one encoded (an unchanged screen, a second viewer) reuses its
//! JPEG.
//!
//! Capture -> view latency is summed from two spans, each on one clock, never a difference
//! of two machines' (or two programs') wall clocks: `X-Frame-Age-Ms`, capture -> the JPEG
//! made, on the daemon's media clock (both ends there), plus response received -> drawn on
//! the page's `performance.now()`. The headers' transit is left out (loopback: well under a
//! millisecond). A browser whose wall clock differs from the daemon's (another machine, a
//! VM, reduced timer precision) made the old sum of the daemon's send time and the page's
//! `Date.now()` negative.

use std::time::Duration;

use serde::Deserialize;

use crate::routes::{parse, Answer};
use crate::types::ViewReport;
use crate::{Backend, ControlError};

/// The live view page.
const PAGE: &str = include_str!("live_view.html");
/// How long a frame request waits for a newer frame.
const FRAME_WAIT: Duration = Duration::from_secs(1);
/// The default and largest size of a view frame.
const VIEW_MAX: (u32, u32) = (640, 640);
const VIEW_LIMIT: (u32, u32) = (1920, 1920);
/// The longest recording, in seconds.
pub const MAX_RECORD_SECONDS: f64 = 600.0;

/// The value of `name` in `url`'s query, percent-decoded (`None` when absent).
pub fn query_param(url: &str, name: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a request is for a view frame (`GET /guests/{id}/frame.jpg`): the requests the
/// view's CPU budget paces and is charged for.
pub fn is_frame_request(method: &str, url: &str) -> bool {
    let path = url.split_once('?').map_or(url, |(p, _)| p);
    method == "GET" && path.starts_with("/guests/") && path.ends_with("/frame.jpg")
}

/// Whether a request belongs to the live view (a frame, the page, `/view/...`): the requests
/// charged to the view's CPU budget.
pub fn is_view_request(method: &str, url: &str) -> bool {
    let path = url.split_once('?').map_or(url, |(p, _)| p);
    is_frame_request(method, url) || path == "/view" || path.starts_with("/view/")
}

/// Parses `WxH` (each 16..=limit).
fn size_arg(v: &str, field: &str, limit: (u32, u32)) -> Result<(u32, u32), ControlError> {
    let bad = || {
        ControlError::BadRequest(format!(
            "field `{field}`: {v:?} is not WIDTHxHEIGHT within 16x16..{}x{}",
            limit.0, limit.1
        ))
    };
    let (w, h) = v.split_once('x').ok_or_else(bad)?;
    let (w, h): (u32, u32) = (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
    if !(16..=limit.0).contains(&w) || !(16..=limit.1).contains(&h) {
        return Err(bad());
    }
    Ok((w, h))
}

fn query_of(query: &str, name: &str) -> Option<String> {
    query_param(&format!("?{query}"), name)
}

/// `POST /guests/{id}/record`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordRequest {
    seconds: f64,
    #[serde(default = "default_fps")]
    fps: u32,
    #[serde(default)]
    max: Option<String>,
}

fn default_fps() -> u32 {
    30
}

fn guest_of(backend: &dyn Backend, s: &str) -> Result<u64, ControlError> {
    let id = s
        .parse()
        .map_err(|_| ControlError::NotFound(format!("no guest {s:?}")))?;
    backend
        .guest(id)
        .map(|_| id)
        .ok_or_else(|| ControlError::NotFound(format!("no guest {id}")))
}

/// Serves the live view's routes (`parts`: the path's segments; `query`: after the `?`).
pub fn route(
    backend: &dyn Backend,
    method: &str,
    parts: &[&str],
    query: &str,
    body: &[u8],
) -> Result<Answer, ControlError> {
    let (get, post) = (method == "GET", method == "POST");
    match (parts, get, post) {
        (["view"], true, _) => Ok(Answer {
            headers: vec![("Cache-Control", "no-store".into())],
            ..Answer::bytes("text/html; charset=utf-8", PAGE.as_bytes().to_vec())
        }),
        (["view", "display"], true, _) => Ok(Answer::json(&backend.device_control(
            "display",
            "metrics",
            &serde_json::Value::Null,
        )?)),
        (["view", "report"], true, _) => Ok(Answer::json(&backend.view_reports())),
        (["view", "budget"], true, _) => match backend.view_budget() {
            Some(b) => Ok(Answer::json(&b.stats())),
            None => Err(ControlError::NotFound("this daemon paces no view".into())),
        },
        (["view", "report"], _, true) => {
            let r: ViewReport = parse(body)?;
            backend
                .guest(r.guest)
                .ok_or_else(|| ControlError::NotFound(format!("no guest {}", r.guest)))?;
            backend.note_view(r);
            Ok(Answer::json(&serde_json::json!({ "ok": true })))
        }
        (["guests", id, "frame.jpg"], true, _) => {
            let guest = guest_of(backend, id)?;
            let after = match query_of(query, "after") {
                Some(v) => v.parse().map_err(|_| {
                    ControlError::BadRequest(format!("field `after`: {v:?} is not a frame id"))
                })?,
                None => 0,
            };
            let max = match query_of(query, "max") {
                Some(v) => size_arg(&v, "max", VIEW_LIMIT)?,
                None => VIEW_MAX,
            };
            match backend.view_frame(guest, after, max, FRAME_WAIT)? {
                Some(f) => Ok(Answer {
                    headers: vec![
                        ("Cache-Control", "no-store".into()),
                        ("X-Frame-Id", f.id.to_string()),
                        ("X-Frame-Age-Ms", format!("{:.3}", f.age_ms)),
                        ("X-Frame-Size", format!("{}x{}", f.width, f.height)),
                    ],
                    ..Answer::bytes("image/jpeg", f.jpeg)
                }),
                None => Ok(Answer {
                    status: 204,
                    ..Answer::bytes("text/plain", Vec::new())
                }),
            }
        }
        (["guests", id, "record"], _, true) => {
            let guest = guest_of(backend, id)?;
            let r: RecordRequest = parse(body)?;
            if !(r.seconds > 0.0 && r.seconds <= MAX_RECORD_SECONDS) {
                return Err(ControlError::BadRequest(format!(
                    "field `seconds`: must be in (0, {MAX_RECORD_SECONDS}]"
                )));
            }
            if !(1..=60).contains(&r.fps) {
                return Err(ControlError::BadRequest(
                    "field `fps`: must be 1..60".into(),
                ));
            }
            let max = match &r.max {
                Some(v) => size_arg(v, "max", (3840, 2160))?,
                None => (1280, 720),
            };
            let (mp4, frames) = backend.record(guest, r.seconds, r.fps, max)?;
            Ok(Answer {
                headers: vec![("X-Frames", frames.to_string())],
                ..Answer::bytes("video/mp4", mp4)
            })
        }
        (["view", ..], ..) | (["guests", ..], ..) => Err(ControlError::MethodNotAllowed),
        _ => Err(ControlError::NotFound("no route".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_decoded() {
        assert_eq!(
            query_param("/view?token=a%2Bb&x=1", "token").unwrap(),
            "a+b"
        );
        assert_eq!(query_param("/view?x=1", "token"), None);
        assert_eq!(query_param("/view", "token"), None);
        assert_eq!(query_param("/v?t=%zz", "t").unwrap(), "%zz");
        assert_eq!(query_param("/v?t=%4", "t").unwrap(), "%4");
        assert_eq!(query_param("/v?t=%éé", "t").unwrap(), "%éé");
    }

    #[test]
    fn the_views_requests_are_told_apart() {
        assert!(is_frame_request(
            "GET",
            "/guests/3/frame.jpg?after=2&max=480x480"
        ));
        assert!(!is_frame_request("POST", "/guests/3/frame.jpg"));
        assert!(!is_frame_request("GET", "/guests/3/stats"));
        assert!(is_view_request("GET", "/guests/3/frame.jpg"));
        assert!(is_view_request("GET", "/view?token=x"));
        assert!(is_view_request("POST", "/view/report"));
        assert!(!is_view_request("GET", "/viewer"));
        assert!(!is_view_request("GET", "/guests"));
    }

    #[test]
    fn sizes_are_checked() {
        assert_eq!(size_arg("640x360", "max", VIEW_LIMIT).unwrap(), (640, 360));
        for bad in ["640", "0x10", "640x", "99999x10", "axb"] {
            let e = size_arg(bad, "max", VIEW_LIMIT).unwrap_err();
            assert!(e.to_string().contains("`max`"), "{e}");
        }
    }
}
