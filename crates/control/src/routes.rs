//! Routing: a method, a path and a body in, a status and a body out (no HTTP here, so the
//! routes are tested without sockets).

use std::time::Instant;

use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::types::*;
use crate::{Backend, ControlError};

/// An answer: HTTP status, content type, extra headers, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status code (200, 400, 404, ...).
    pub status: u16,
    /// Value of the `Content-Type` header.
    pub content_type: &'static str,
    /// Extra response headers (name, value).
    pub headers: Vec<(&'static str, String)>,
    /// Response body.
    pub body: Vec<u8>,
}

impl Answer {
    /// A 200 answer of `content_type`.
    pub fn bytes(content_type: &'static str, body: Vec<u8>) -> Answer {
        Answer {
            status: 200,
            content_type,
            headers: Vec::new(),
            body,
        }
    }

    /// A 200 answer with `v` as JSON.
    pub fn json(v: &impl serde::Serialize) -> Answer {
        Answer::bytes(
            "application/json",
            serde_json::to_vec(v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}").into_bytes()),
        )
    }

    /// The answer for an error: its status and `{"error": "..."}`.
    pub fn error(e: &ControlError) -> Answer {
        Answer {
            status: e.status(),
            ..Answer::bytes("application/json", e.body().into_bytes())
        }
    }
}

/// Parses a JSON body into `T`; errors name the offending field.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ControlError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        body
    };
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            ControlError::BadRequest(format!("bad request body: {inner}"))
        } else {
            ControlError::BadRequest(format!("field `{path}`: {inner}"))
        }
    })
}

/// Serves one request. `received` is when it arrived (the foreground switch's latency is
/// measured from there).
pub fn handle(
    backend: &dyn Backend,
    method: &str,
    path: &str,
    body: &[u8],
    received: Instant,
) -> Answer {
    match route(backend, method, path, body, received) {
        Ok(a) => a,
        Err(e) => Answer::error(&e),
    }
}

fn guest_id(s: &str) -> Result<u64, ControlError> {
    s.parse()
        .map_err(|_| ControlError::NotFound(format!("no guest {s:?}")))
}

fn known_guest(backend: &dyn Backend, id: u64) -> Result<GuestInfo, ControlError> {
    backend
        .guest(id)
        .ok_or_else(|| ControlError::NotFound(format!("no guest {id}")))
}

fn check_guest(backend: &dyn Backend, id: Option<u64>) -> Result<(), ControlError> {
    match id {
        Some(id) => known_guest(backend, id).map(|_| ()),
        None => Ok(()),
    }
}

fn to_value(v: &impl serde::Serialize) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// `Err(MethodNotAllowed)` unless `ok` (the route's method is the request's).
fn want(ok: bool) -> Result<(), ControlError> {
    if ok {
        Ok(())
    } else {
        Err(ControlError::MethodNotAllowed)
    }
}

/// Answers one request: the route its path names (`path?query`), each group of routes in a
/// function of its own.
fn route(
    backend: &dyn Backend,
    method: &str,
    path: &str,
    body: &[u8],
    received: Instant,
) -> Result<Answer, ControlError> {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let get = method == "GET";
    let post = method == "POST";
    let not_found = || ControlError::NotFound(format!("no route {method} {path}"));
    match parts.as_slice() {
        ["view", ..] | ["guests", _, "frame.jpg" | "record"] => {
            crate::live_view::route(backend, method, &parts, query, body)
        }
        ["guests"] => {
            want(get)?;
            Ok(Answer::json(&backend.guests()))
        }
        ["guests", id, op @ ("stats" | "policy" | "kill" | "snapshot" | "restore" | "migrate")] => {
            guest_route(backend, method, id, op, body)
        }
        ["policy", "reload"] => {
            want(post)?;
            Ok(Answer::json(&backend.reload_policy()?))
        }
        ["devices"] => {
            want(get)?;
            Ok(Answer::json(&backend.devices()))
        }
        ["display", "foreground"] => {
            want(post)?;
            let r: ForegroundRequest = parse(body)?;
            known_guest(backend, r.guest)?;
            let mut v = backend.device_control("display", "foreground", &to_value(&r))?;
            let latency_us = received.elapsed().as_secs_f64() * 1e6;
            if let Value::Object(m) = &mut v {
                m.insert("latency_us".into(), json!(latency_us));
            }
            Ok(Answer::json(&v))
        }
        ["display", "refresh"] => {
            want(post)?;
            let r: RefreshRequest = parse(body)?;
            if !(1..=1000).contains(&r.hz) {
                return Err(ControlError::BadRequest(
                    "field `hz`: must be 1..1000".into(),
                ));
            }
            Ok(Answer::json(&backend.device_control(
                "display",
                "refresh",
                &to_value(&r),
            )?))
        }
        ["modem", op] => {
            want(post)?;
            let args = modem_args(backend, op, body, path)?;
            Ok(Answer::json(&backend.device_control("modem", op, &args)?))
        }
        ["gles", "stats"] => {
            want(get)?;
            Ok(Answer::json(&backend.device_control(
                "gles",
                "stats",
                &Value::Null,
            )?))
        }
        ["camera", "source"] => {
            want(post)?;
            let r: CameraSourceRequest = parse(body)?;
            Ok(Answer::json(&backend.device_control(
                "camera",
                "source",
                &to_value(&r),
            )?))
        }
        ["geo" | "sensor" | "clipboard" | "services", ..] => {
            services_route(backend, method, &parts, body)
        }
        ["metrics"] => {
            want(get)?;
            Ok(Answer::bytes(
                "text/plain; version=0.0.4",
                crate::metrics::render(backend)?.into_bytes(),
            ))
        }
        _ => Err(not_found()),
    }
}

/// `GET /guests/ID/stats`, `POST /guests/ID/policy|kill|snapshot|restore|migrate`: the
/// method checked first, then the id, then that the guest is connected.
fn guest_route(
    backend: &dyn Backend,
    method: &str,
    id: &str,
    op: &str,
    body: &[u8],
) -> Result<Answer, ControlError> {
    want(method == if op == "stats" { "GET" } else { "POST" })?;
    let id = guest_id(id)?;
    let stats = known_guest(backend, id)?;
    match op {
        "stats" => Ok(Answer::json(&stats)),
        "policy" => {
            let v: Value = parse(body)?;
            if !v.is_object() {
                return Err(ControlError::BadRequest(
                    "bad request body: a guest's policy table (an object)".into(),
                ));
            }
            Ok(Answer::json(&backend.set_policy(id, &v)?))
        }
        "kill" => {
            backend.kill(id)?;
            Ok(Answer::json(&json!({ "killed": id })))
        }
        "migrate" => {
            let r: MigrateRequest = parse(body)?;
            Ok(Answer::json(&backend.migrate(id, &r.to, &r.token)?))
        }
        // snapshot, restore
        _ => {
            let r: SnapshotRequest = parse(body)?;
            if !std::path::Path::new(&r.path).is_absolute() {
                return Err(ControlError::BadRequest(
                    "field `path`: must be an absolute path".into(),
                ));
            }
            let v = if op == "snapshot" {
                backend.snapshot_save(id, &r.path)?
            } else {
                backend.snapshot_load(id, &r.path)?
            };
            Ok(Answer::json(&v))
        }
    }
}

/// The arguments of the modem command `POST /modem/OP` sends, its body checked (`path`:
/// the request's, named when there is no such command).
fn modem_args(
    backend: &dyn Backend,
    op: &str,
    body: &[u8],
    path: &str,
) -> Result<Value, ControlError> {
    match op {
        "sms" => {
            let r: SmsRequest = parse(body)?;
            check_guest(backend, r.guest)?;
            Ok(to_value(&r))
        }
        "call" => {
            let r: CallRequest = parse(body)?;
            check_guest(backend, r.guest)?;
            Ok(to_value(&r))
        }
        "hangup" => {
            let r: HangupRequest = parse(body)?;
            check_guest(backend, r.guest)?;
            Ok(to_value(&r))
        }
        "signal" => {
            let r: SignalRequest = parse(body)?;
            if r.rssi > 31 && r.rssi != 99 {
                return Err(ControlError::BadRequest(
                    "field `rssi`: must be 0..31 (or 99, unknown)".into(),
                ));
            }
            if r.ber > 7 && r.ber != 99 {
                return Err(ControlError::BadRequest(
                    "field `ber`: must be 0..7 (or 99, unknown)".into(),
                ));
            }
            check_guest(backend, r.guest)?;
            Ok(to_value(&r))
        }
        "registration" => {
            let r: RegistrationRequest = parse(body)?;
            const STATES: [&str; 5] = ["home", "searching", "denied", "roaming", "not-registered"];
            if !STATES.contains(&r.state.as_str()) {
                return Err(ControlError::BadRequest(format!(
                    "field `state`: {:?} is not one of {}",
                    r.state,
                    STATES.join(", ")
                )));
            }
            check_guest(backend, r.guest)?;
            Ok(to_value(&r))
        }
        _ => Err(ControlError::NotFound(format!("no route {path}"))),
    }
}

/// The host services' routes (issue 29), all answered by the `service` device:
/// `GET /services`, `POST /services/policy` (a policy, or `{"reload": true}`),
/// `GET /geo`, `POST /geo/fix|nmea|track`, `GET /sensor`, `POST /sensor/set`,
/// `GET /clipboard`, `POST /clipboard` (`{"text": ...}`), and `POST /services/NAME/OP` for
/// operation `OP` of any service, a host program's included.
fn services_route(
    backend: &dyn Backend,
    method: &str,
    parts: &[&str],
    body: &[u8],
) -> Result<Answer, ControlError> {
    let op = match (method, parts) {
        ("POST", ["services", name, op])
            if !name.contains('.')
                && !op.is_empty()
                && op
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
        {
            return services_call(backend, &format!("{name}.{op}"), body);
        }
        ("GET", ["services"]) => "services.list",
        ("POST", ["services", "policy"]) => "services.policy",
        ("GET", ["geo"]) => "geo.get",
        ("POST", ["geo", "fix"]) => "geo.fix",
        ("POST", ["geo", "nmea"]) => "geo.nmea",
        ("POST", ["geo", "track"]) => "geo.track",
        ("GET", ["sensor"]) => "sensor.get",
        ("POST", ["sensor", "set"]) => "sensor.set",
        ("GET", ["clipboard"]) => "clipboard.get",
        ("POST", ["clipboard"]) => "clipboard.set",
        (_, ["services" | "geo" | "sensor" | "clipboard"])
        | (_, ["services", "policy"])
        | (_, ["geo", "fix" | "nmea" | "track"])
        | (_, ["sensor", "set"]) => return Err(ControlError::MethodNotAllowed),
        _ => {
            return Err(ControlError::NotFound(format!(
                "no route {method} /{}",
                parts.join("/")
            )))
        }
    };
    if method == "POST" {
        return services_call(backend, op, body);
    }
    Ok(Answer::json(&backend.device_control(
        "service",
        op,
        &Value::Null,
    )?))
}

fn services_call(backend: &dyn Backend, op: &str, body: &[u8]) -> Result<Answer, ControlError> {
    let args: Value = parse(body)?;
    if !args.is_object() {
        return Err(ControlError::BadRequest(
            "bad request body: a JSON object".into(),
        ));
    }
    Ok(Answer::json(&backend.device_control("service", op, &args)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backend;

    /// One guest (7, "g"), one display; device operations echo their arguments.
    struct Fake;

    impl Backend for Fake {
        fn guests(&self) -> Vec<GuestInfo> {
            vec![GuestInfo {
                id: 7,
                name: "g".into(),
                transport: "unix".into(),
                protocol: "prefetch".into(),
                regions: 1,
                bytes: 4096,
                counters: Counters {
                    hits: 3,
                    ..Counters::default()
                },
                links: vec![LinkCopies {
                    src: "cpu".into(),
                    dst: "gpu".into(),
                    copies: 2,
                    bytes: 8192,
                    ns: 1000,
                }],
                commands: [("display".to_string(), 5)].into_iter().collect(),
                device_use: Default::default(),
                cpu_weight: None,
                paced: Default::default(),
                abandoned_waits: 0,
            }]
        }
        fn devices(&self) -> Vec<DeviceInfo> {
            vec![DeviceInfo {
                id: 14,
                name: "display".into(),
                backend: "headless".into(),
                domain: "gpu".into(),
                queued: 0,
            }]
        }
        fn device_control(
            &self,
            device: &str,
            op: &str,
            args: &Value,
        ) -> Result<Value, ControlError> {
            match (device, op) {
                ("display", "metrics") => Ok(json!([{
                    "guest": 7, "presented": 4, "dropped": 1, "latencies_ns": [20_000_000]
                }])),
                ("display", "foreground") => Ok(json!({ "guest": args["guest"] })),
                _ => Ok(json!({ "op": op, "args": args })),
            }
        }
        fn kill(&self, _id: u64) -> Result<(), ControlError> {
            Ok(())
        }
    }

    fn go(method: &str, path: &str, body: &str) -> (u16, Value) {
        let a = handle(&Fake, method, path, body.as_bytes(), Instant::now());
        let text = String::from_utf8_lossy(&a.body).into_owned();
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (a.status, v)
    }

    #[test]
    fn routes_answer_json() {
        assert_eq!(go("GET", "/guests", "").1[0]["id"], 7);
        assert_eq!(go("GET", "/guests/7/stats", "").1["name"], "g");
        assert_eq!(go("GET", "/devices", "").1[0]["domain"], "gpu");
        let (s, v) = go("POST", "/display/foreground", r#"{"guest": 7}"#);
        assert_eq!(s, 200);
        assert!(v["latency_us"].is_number());
        let (s, v) = go("POST", "/modem/signal", r#"{"rssi": 10}"#);
        assert_eq!((s, v["args"]["ber"].clone()), (200, json!(99)));
        assert_eq!(
            go("POST", "/modem/hangup", "").0,
            200,
            "an empty body is {{}}"
        );
    }

    #[test]
    fn snapshot_and_migration_routes_check_their_arguments() {
        let (s, v) = go("POST", "/guests/7/snapshot", r#"{"path": "relative.snap"}"#);
        assert_eq!(s, 400);
        assert!(v["error"].as_str().unwrap().contains("absolute"), "{v}");
        assert_eq!(
            go("POST", "/guests/8/restore", r#"{"path": "/tmp/x.snap"}"#).0,
            404
        );
        let (s, v) = go("POST", "/guests/7/migrate", r#"{"to": "127.0.0.1:1"}"#);
        assert_eq!(s, 400);
        assert!(v["error"].as_str().unwrap().contains("token"), "{v}");
        assert_eq!(go("GET", "/guests/7/snapshot", "").0, 405);
        // A backend without snapshots says so.
        let (s, v) = go("POST", "/guests/7/snapshot", r#"{"path": "/tmp/x.snap"}"#);
        assert_eq!(s, 404);
        assert!(
            v["error"].as_str().unwrap().contains("not supported"),
            "{v}"
        );
    }

    #[test]
    fn services_routes_reach_the_service_device() {
        let (s, v) = go("POST", "/geo/fix", r#"{"lon": 1.5, "lat": 2}"#);
        assert_eq!((s, v["op"].as_str()), (200, Some("geo.fix")));
        assert_eq!(v["args"]["lon"], 1.5);
        assert_eq!(go("GET", "/clipboard", "").1["op"], "clipboard.get");
        assert_eq!(
            go("POST", "/clipboard", r#"{"text": "x"}"#).1["op"],
            "clipboard.set"
        );
        assert_eq!(go("GET", "/services", "").1["op"], "services.list");
        assert_eq!(go("POST", "/sensor/set", "{}").1["op"], "sensor.set");
        assert_eq!(go("GET", "/geo/fix", "").0, 405);
        assert_eq!(
            go("POST", "/services/upper/stats", "{}").1["op"],
            "upper.stats"
        );
        assert_eq!(go("POST", "/services/upper/bad.op", "{}").0, 404);
        assert_eq!(go("POST", "/geo/teleport", "{}").0, 404);
        assert_eq!(go("POST", "/clipboard", "[1]").0, 400);
        assert_eq!(go("POST", "/services/policy", "{").0, 400);
    }

    #[test]
    fn errors_have_their_status_and_name_the_field() {
        let (s, v) = go("GET", "/guests/8/stats", "");
        assert_eq!(s, 404);
        assert!(v["error"].as_str().unwrap().contains("no guest 8"));
        assert_eq!(go("POST", "/display/foreground", r#"{"guest": 8}"#).0, 404);
        let (s, v) = go("POST", "/modem/call", "{}");
        assert_eq!(s, 400);
        assert!(v["error"].as_str().unwrap().contains("`from`"), "{v}");
        let (s, v) = go("POST", "/modem/signal", r#"{"rssi": 1, "ber": "x"}"#);
        assert_eq!(s, 400);
        assert!(v["error"].as_str().unwrap().contains("`ber`"), "{v}");
        let (s, v) = go(
            "POST",
            "/camera/source",
            r#"{"source": "synthetic", "x": 1}"#,
        );
        assert_eq!(s, 400);
        assert!(v["error"].as_str().unwrap().contains('x'), "{v}");
        assert_eq!(go("POST", "/display/foreground", "{").0, 400);
        assert_eq!(go("GET", "/display/foreground", "").0, 405);
        assert_eq!(go("GET", "/nothing", "").0, 404);
    }

    #[test]
    fn metrics_are_prometheus_text() {
        let (s, v) = go("GET", "/metrics", "");
        assert_eq!(s, 200);
        let text = v.as_str().unwrap();
        for line in [
            "virtsoc_guests 1",
            "virtsoc_prediction_hits_total{guest=\"7\",name=\"g\"} 3",
            "virtsoc_coherence_copies_total{dst=\"gpu\",guest=\"7\",name=\"g\",src=\"cpu\"} 2",
            "virtsoc_guest_commands_total{device=\"display\",guest=\"7\",name=\"g\"} 5",
            "virtsoc_display_presented_frames_total{guest=\"7\",name=\"g\"} 4",
            "virtsoc_display_motion_to_photon_seconds_bucket{guest=\"7\",name=\"g\",le=\"0.025\"} 1",
            "virtsoc_display_motion_to_photon_seconds_bucket{guest=\"7\",name=\"g\",le=\"0.016\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }

    #[test]
    fn tokens_compare_in_full() {
        use crate::server::constant_time_eq;
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }
}
