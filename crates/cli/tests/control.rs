//! Integration tests of the daemon's control API (`<socket>.control`, HTTP + JSON) and of
//! `virtsoc ctl`, against a real daemon: listings, an SMS read back over AT commands, calls,
//! signal and registration, a foreground switch between two presenting guests, killing one
//! guest, switching the camera source, changing the refresh rate, Prometheus metrics, and the
//! refusals (404, 400 naming the field, 413, 401 on TCP without the token).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{modem_read_once, modem_send, Daemon};
use serde_json::{json, Value};
use virtsoc_control::client::{control_path, request, Response, Target};
use virtsoc_devapi::RegionId;
use virtsoc_guest::devices::camera::Capture;
use virtsoc_guest::devices::display::{Mode, Present, Stats, StatsReply};
use virtsoc_guest::{AccessMode, ConnectOptions, Connection, DeviceId, Format};

const TOKEN: &str = "0123456789abcdef-control-test";

fn daemon() -> Daemon {
    Daemon::start(&["--gpu-backend", "null", "--isp-backend", "null"])
}

fn target(d: &Daemon) -> Target {
    Target::Unix(control_path(d.socket()))
}

fn call(d: &Daemon, method: &str, path: &str, body: Value) -> Response {
    let body = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    request(&target(d), method, path, &body).expect("control request")
}

/// A successful call's JSON answer.
fn ok(d: &Daemon, method: &str, path: &str, body: Value) -> Value {
    let r = call(d, method, path, body);
    assert_eq!(r.status, 200, "{method} {path}: {}", r.body);
    r.json()
}

/// An error answer: its status and its `error` message.
fn refused(r: Response) -> (u16, String) {
    let v: Value = serde_json::from_str(&r.body).expect("a JSON error body");
    let msg = v["error"].as_str().expect("an error field").to_string();
    (r.status, msg)
}

fn connect(d: &Daemon, name: &str) -> Connection {
    Connection::connect(
        d.socket(),
        &ConnectOptions {
            name: name.into(),
            window_size: 32 << 20,
            ..ConnectOptions::default()
        },
    )
    .expect("connect")
}

fn ctl(d: &Daemon, args: &[&str]) -> String {
    let sock = d.socket().to_str().unwrap().to_string();
    let mut all = vec!["ctl", "--socket", sock.as_str()];
    all.extend_from_slice(args);
    common::virtsoc(&all)
}

// ---- modem over AT commands (as in dev_modem.rs) ----

/// Reads until the output contains `needle` (bounded).
fn read_until(c: &Connection, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = Vec::new();
    loop {
        out.extend(modem_read_once(c));
        let s = String::from_utf8_lossy(&out).into_owned();
        if s.contains(needle) {
            return s;
        }
        assert!(Instant::now() < deadline, "no {needle:?} in {s:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn at(c: &Connection, line: &str) -> String {
    modem_send(c, line.as_bytes());
    read_until(c, "OK\r\n")
}

// ---- display ----

fn frame(c: &Connection, w: u32, h: u32) -> RegionId {
    let r = c.alloc(0, w, h, Format::Rgba8, 0).expect("alloc");
    let a = c
        .begin_access(r.id, DeviceId::CPU, 0, r.size, AccessMode::Write)
        .unwrap();
    // SAFETY: the window maps the whole region while the CPU access lasts.
    let px = unsafe { std::slice::from_raw_parts_mut(a.ptr.unwrap().as_ptr(), r.size as usize) };
    px.fill(0x80);
    c.end_access(r.id, DeviceId::CPU, 0, r.size, AccessMode::Write)
        .unwrap();
    r.id
}

fn present(c: &Connection, region: RegionId) {
    c.command_with_access(&Present {
        frame: region,
        capture_ns: 0,
    })
    .expect("present");
}

fn stats(c: &Connection) -> StatsReply {
    c.command(&Stats {}).expect("stats")
}

/// Both guests present one frame each, then a vsync or so passes.
fn present_both(a: (&Connection, RegionId), b: (&Connection, RegionId)) {
    present(a.0, a.1);
    present(b.0, b.1);
    std::thread::sleep(Duration::from_millis(20));
}

#[test]
fn ctl_without_arguments_lists_the_commands() {
    let out = common::virtsoc(&["ctl"]);
    for cmd in [
        "guests",
        "devices",
        "stats GUEST",
        "display foreground GUEST",
        "display refresh HZ",
        "sms send FROM TEXT",
        "gsm call FROM",
        "gsm cancel",
        "gsm signal RSSI",
        "gsm registration STATE",
        "camera source SRC",
        "kill GUEST",
        "metrics",
    ] {
        assert!(out.contains(cmd), "{cmd:?} missing from {out}");
    }
}

#[test]
fn guests_devices_and_stats_are_listed() {
    let d = daemon();
    let a = connect(&d, "app-a");
    let b = connect(&d, "app-b");
    let f = frame(&a, 64, 64);
    present(&a, f);

    let guests = ok(&d, "GET", "/guests", Value::Null);
    let list = guests.as_array().unwrap();
    assert_eq!(list.len(), 2, "{guests}");
    for (g, c, name) in [(&list[0], &a, "app-a"), (&list[1], &b, "app-b")] {
        assert_eq!(g["id"], c.guest_id());
        assert_eq!(g["name"], name);
        assert_eq!(g["transport"], "unix");
        assert_eq!(g["protocol"], "write-invalidate");
    }
    assert_eq!(list[0]["regions"], 1);
    assert!(list[0]["bytes"].as_u64().unwrap() >= 64 * 64 * 4);
    assert!(list[0]["counters"]["copies"].as_u64().is_some());
    assert!(list[0]["commands"]["display"].as_u64().unwrap() >= 1);

    let devices = ok(&d, "GET", "/devices", Value::Null);
    let display = devices
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "display")
        .expect("a display");
    assert_eq!(display["domain"], "gpu");
    assert!(display["backend"].as_str().unwrap().contains("Hz"));

    let s = ok(
        &d,
        "GET",
        &format!("/guests/{}/stats", a.guest_id()),
        Value::Null,
    );
    assert_eq!(s["id"], a.guest_id());
    assert_eq!(s["name"], "app-a");

    // The console prints the same.
    let out = ctl(&d, &["guests"]);
    assert!(out.contains("app-a") && out.contains("app-b"), "{out}");
    let out = ctl(&d, &["devices"]);
    assert!(out.contains("display") && out.contains("modem"), "{out}");
    let out = ctl(&d, &["stats", &b.guest_id().to_string()]);
    assert!(out.contains("app-b"), "{out}");
}

#[test]
fn an_injected_sms_is_read_over_at_commands() {
    let d = daemon();
    let c = connect(&d, "phone");
    assert!(at(&c, "ATE0\r").ends_with("OK\r\n"));
    assert_eq!(at(&c, "AT+CMGF=1\r"), "\r\nOK\r\n");

    // To every guest with a modem open.
    let r = ok(
        &d,
        "POST",
        "/modem/sms",
        json!({ "from": "+15551234567", "text": "hello from the control API" }),
    );
    assert_eq!(r["delivered"], json!([c.guest_id()]));
    let cmti = read_until(&c, "+CMTI: \"SM\",");
    let index: u32 = cmti
        .split("+CMTI: \"SM\",")
        .nth(1)
        .and_then(|s| s.trim().parse().ok())
        .expect("an index");
    let msg = at(&c, &format!("AT+CMGR={index}\r"));
    assert!(
        msg.contains("+15551234567") && msg.contains("hello from the control API"),
        "{msg:?}"
    );

    // Through the console, to that guest by id; listed with AT+CMGL.
    let out = ctl(&d, &["sms", "send", "+15550001", "second", "message"]);
    assert!(out.contains(&c.guest_id().to_string()), "{out}");
    read_until(&c, "+CMTI:");
    let list = at(&c, "AT+CMGL=\"ALL\"\r");
    assert!(
        list.contains("\"+15550001\"") && list.contains("second message"),
        "{list:?}"
    );
    let one = ok(
        &d,
        "POST",
        "/modem/sms",
        json!({ "from": "+15550002", "text": "just you", "guest": c.guest_id() }),
    );
    assert_eq!(one["delivered"], json!([c.guest_id()]));
    read_until(&c, "+CMTI:");
}

#[test]
fn calls_signal_and_registration_reach_the_modem() {
    let d = daemon();
    let c = connect(&d, "phone");
    assert!(at(&c, "ATE0\r").ends_with("OK\r\n"));

    ok(&d, "POST", "/modem/call", json!({ "from": "+15557654321" }));
    read_until(&c, "RING");
    let calls = at(&c, "AT+CLCC\r");
    assert!(calls.contains("+15557654321"), "{calls:?}");
    ctl(&d, &["gsm", "cancel"]);
    read_until(&c, "NO CARRIER");
    assert_eq!(at(&c, "AT+CLCC\r"), "\r\nOK\r\n", "no call any more");
    // Nothing to hang up now: the one guest named refuses.
    let (status, msg) = refused(call(
        &d,
        "POST",
        "/modem/hangup",
        json!({ "guest": c.guest_id() }),
    ));
    assert_eq!(status, 409, "{msg}");

    ctl(&d, &["gsm", "signal", "7", "3"]);
    assert_eq!(at(&c, "AT+CSQ\r"), "\r\n+CSQ: 7,3\r\n\r\nOK\r\n");
    ok(
        &d,
        "POST",
        "/modem/registration",
        json!({ "state": "roaming" }),
    );
    let creg = at(&c, "AT+CREG?\r");
    assert!(creg.contains("+CREG: 0,5"), "{creg:?}");
    ctl(&d, &["gsm", "registration", "home"]);
    let creg = at(&c, "AT+CREG?\r");
    assert!(creg.contains("+CREG: 0,1"), "{creg:?}");

    // A guest opening its modem later finds the network as set.
    ok(&d, "POST", "/modem/signal", json!({ "rssi": 12, "ber": 1 }));
    let late = connect(&d, "late");
    assert!(at(&late, "ATE0\r").ends_with("OK\r\n"));
    assert_eq!(at(&late, "AT+CSQ\r"), "\r\n+CSQ: 12,1\r\n\r\nOK\r\n");
}

#[test]
fn a_foreground_switch_changes_whose_frames_are_presented() {
    let d = daemon();
    let a = connect(&d, "first");
    let b = connect(&d, "second");
    let (fa, fb) = (frame(&a, 64, 64), frame(&b, 64, 64));
    // The first guest to present has the screen.
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats(&a).presented < 3 {
        assert!(
            Instant::now() < deadline,
            "the first guest's frames never shown"
        );
        present_both((&a, fa), (&b, fb));
    }
    assert_eq!(stats(&b).presented, 0, "the second guest is hidden");

    let r = ok(
        &d,
        "POST",
        "/display/foreground",
        json!({ "guest": b.guest_id() }),
    );
    assert_eq!(r["guest"], b.guest_id());
    assert_eq!(r["foreground"], b.guest_id());
    assert!(r["latency_us"].as_f64().is_some(), "{r}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats(&b).presented < 3 {
        assert!(
            Instant::now() < deadline,
            "the second guest's frames never shown"
        );
        present_both((&a, fa), (&b, fb));
    }
    let a_before = stats(&a).presented;
    for _ in 0..5 {
        present_both((&a, fa), (&b, fb));
    }
    assert_eq!(
        stats(&a).presented,
        a_before,
        "the first guest is hidden now"
    );
    assert!(stats(&a).dropped > 0);

    // And back, through the console.
    let out = ctl(&d, &["display", "foreground", &a.guest_id().to_string()]);
    assert!(out.contains("latency_us"), "{out}");
    let a_now = stats(&a).presented;
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats(&a).presented <= a_now {
        assert!(
            Instant::now() < deadline,
            "the first guest never shown again"
        );
        present_both((&a, fa), (&b, fb));
    }
}

#[test]
fn kill_closes_only_that_guest() {
    let d = daemon();
    let a = connect(&d, "victim");
    let b = connect(&d, "bystander");
    let f = frame(&b, 64, 64);
    let r = ok(
        &d,
        "POST",
        &format!("/guests/{}/kill", a.guest_id()),
        json!({}),
    );
    assert_eq!(r["killed"], a.guest_id());
    assert!(
        a.command(&Stats {}).is_err(),
        "the killed guest's session is closed"
    );
    // The other guest goes on.
    present(&b, f);
    stats(&b);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ids: Vec<u64> = ok(&d, "GET", "/guests", Value::Null)
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["id"].as_u64().unwrap())
            .collect();
        if ids == vec![b.guest_id()] {
            break;
        }
        assert!(Instant::now() < deadline, "guests {ids:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, _) = refused(call(
        &d,
        "POST",
        &format!("/guests/{}/kill", a.guest_id()),
        json!({}),
    ));
    assert_eq!(status, 404);
    // Through the console.
    ctl(&d, &["kill", &b.guest_id().to_string()]);
    assert!(b.command(&Stats {}).is_err());
}

/// A 320x240, 30-frame H.264 clip of FFmpeg's `testsrc2`.
fn make_clip(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("virtsoc-control-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    common::mp4_clip(&dir)
}

fn camera_backend(d: &Daemon) -> String {
    ok(d, "GET", "/devices", Value::Null)
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "camera")
        .and_then(|d| d["backend"].as_str())
        .unwrap()
        .to_string()
}

#[test]
fn the_camera_source_switches_at_runtime() {
    let d = daemon();
    let c = connect(&d, "camera-app");
    let r = c.alloc(0, 320, 240, Format::Nv12, 0).unwrap();
    let cap = || -> virtsoc_guest::devices::camera::CaptureReply {
        c.command_with_access(&Capture { frame: r.id })
            .expect("capture")
    };
    assert!(camera_backend(&d).starts_with("synthetic"));
    for i in 0..3 {
        let reply = cap();
        assert_eq!(reply.index, i);
        assert_ne!(
            (reply.marker_x, reply.marker_y),
            (0, 0),
            "the moving square"
        );
    }

    let clip = make_clip("camera");
    let src = format!("file:{}", clip.display());
    let out = ok(&d, "POST", "/camera/source", json!({ "source": src }));
    assert!(
        out["backend"].as_str().unwrap().starts_with("file "),
        "{out}"
    );
    assert!(camera_backend(&d).contains(clip.to_str().unwrap()));
    // Captures from now on come from the file: a new camera (index 0), no square.
    let reply = cap();
    assert_eq!(reply.index, 0, "a fresh camera on the new source");
    assert_eq!((reply.marker_x, reply.marker_y), (0, 0));

    ctl(&d, &["camera", "source", "synthetic"]);
    assert!(camera_backend(&d).starts_with("synthetic"));
    assert_ne!(
        {
            let r = cap();
            (r.marker_x, r.marker_y)
        },
        (0, 0)
    );

    // A source that cannot be used is refused, naming the field; nothing changes.
    let (status, msg) = refused(call(
        &d,
        "POST",
        "/camera/source",
        json!({ "source": "file:/nonexistent/clip.mp4" }),
    ));
    assert_eq!(status, 400);
    assert!(msg.contains("source"), "{msg}");
    assert!(camera_backend(&d).starts_with("synthetic"));
    let _ = std::fs::remove_dir_all(clip.parent().unwrap());
}

#[test]
fn the_refresh_rate_changes_at_runtime() {
    let d = daemon();
    let c = connect(&d, "ui");
    assert_eq!(c.command(&Mode {}).unwrap().refresh_hz, 60);
    let r = ok(&d, "POST", "/display/refresh", json!({ "hz": 30 }));
    assert_eq!(r["refresh_hz"], 30);
    assert_eq!(c.command(&Mode {}).unwrap().refresh_hz, 30);
    let display = ok(&d, "GET", "/devices", Value::Null)
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "display")
        .unwrap()
        .clone();
    assert!(
        display["backend"].as_str().unwrap().contains("@30Hz"),
        "{display}"
    );
    ctl(&d, &["display", "refresh", "90"]);
    assert_eq!(c.command(&Mode {}).unwrap().refresh_hz, 90);
    // The display keeps scanning out at the new rate: a presented frame is shown.
    let f = frame(&c, 64, 64);
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats(&c).presented == 0 {
        assert!(Instant::now() < deadline, "nothing scanned out at 90 Hz");
        present(&c, f);
        std::thread::sleep(Duration::from_millis(15));
    }
    let (status, msg) = refused(call(&d, "POST", "/display/refresh", json!({ "hz": 0 })));
    assert_eq!(status, 400);
    assert!(msg.contains("hz"), "{msg}");
}

#[test]
fn metrics_parse_as_prometheus_text() {
    let d = daemon();
    let c = connect(&d, "metered");
    let f = frame(&c, 64, 64);
    let deadline = Instant::now() + Duration::from_secs(30);
    while stats(&c).presented < 2 {
        assert!(Instant::now() < deadline, "nothing scanned out");
        present(&c, f);
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = call(&d, "GET", "/metrics", Value::Null);
    assert_eq!(r.status, 200);
    let text = ctl(&d, &["metrics"]);
    for body in [&r.body, &text] {
        let lines = body.lines().map(|l| Ok(l.to_string()));
        let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text");
        let id = c.guest_id().to_string();
        let of_guest = |name: &str| {
            scrape
                .samples
                .iter()
                .filter(|s| s.metric == name && s.labels.get("guest") == Some(id.as_str()))
                .count()
        };
        for family in [
            "virtsoc_guest_commands_total",
            "virtsoc_coherence_copies_total",
            "virtsoc_coherence_bytes_total",
            "virtsoc_coherence_seconds_total",
            "virtsoc_prediction_hits_total",
            "virtsoc_prediction_misses_total",
            "virtsoc_display_presented_frames_total",
            "virtsoc_display_dropped_frames_total",
            "virtsoc_display_motion_to_photon_seconds",
        ] {
            assert!(
                of_guest(family) > 0,
                "no {family} for guest {id} in\n{body}"
            );
        }
        let presented = scrape
            .samples
            .iter()
            .find(|s| s.metric == "virtsoc_display_presented_frames_total")
            .unwrap();
        assert_eq!(presented.labels.get("name"), Some("metered"));
        let copies = scrape
            .samples
            .iter()
            .find(|s| s.metric == "virtsoc_coherence_copies_total")
            .unwrap();
        assert!(copies.labels.get("src").is_some() && copies.labels.get("dst").is_some());
        assert!(scrape.samples.iter().any(|s| s.metric == "virtsoc_guests"));
        assert!(scrape
            .samples
            .iter()
            .any(|s| s.metric == "virtsoc_device_queued"
                && s.labels.get("device") == Some("display")));
    }
}

#[test]
fn bad_requests_are_refused_with_json_errors() {
    let d = daemon();
    let c = connect(&d, "only");
    let raw = |method: &str, path: &str, body: &[u8]| {
        refused(request(&target(&d), method, path, body).expect("request"))
    };
    // Unknown guests: 404.
    for (method, path, body) in [
        ("GET", "/guests/999/stats", &b""[..]),
        ("POST", "/guests/999/kill", b"{}"),
        ("POST", "/display/foreground", br#"{"guest": 999}"#),
        (
            "POST",
            "/modem/sms",
            br#"{"from": "+1555", "text": "x", "guest": 999}"#,
        ),
        ("GET", "/guests/abc/stats", b""),
    ] {
        let (status, msg) = raw(method, path, body);
        assert_eq!(status, 404, "{method} {path}: {msg}");
        assert!(msg.contains("guest"), "{msg}");
    }
    assert_eq!(raw("GET", "/nope", b"").0, 404);
    // Malformed JSON, missing or mistyped fields: 400 naming the field.
    let (status, msg) = raw("POST", "/display/foreground", br#"{"guest": "#);
    assert_eq!(status, 400, "{msg}");
    let (status, msg) = raw("POST", "/modem/sms", br#"{"text": "no sender"}"#);
    assert_eq!(status, 400);
    assert!(msg.contains("`from`"), "{msg}");
    let (status, msg) = raw("POST", "/display/foreground", br#"{"guest": "one"}"#);
    assert_eq!(status, 400);
    assert!(msg.contains("guest"), "{msg}");
    let (status, msg) = raw("POST", "/modem/signal", br#"{"rssi": 40}"#);
    assert_eq!(status, 400);
    assert!(msg.contains("rssi"), "{msg}");
    let (status, msg) = raw("POST", "/modem/registration", br#"{"state": "moon"}"#);
    assert_eq!(status, 400);
    assert!(msg.contains("state"), "{msg}");
    // Oversized bodies: 413.
    let big = format!(
        r#"{{"from": "+1555", "text": "{}"}}"#,
        "x".repeat(virtsoc_control::MAX_BODY)
    );
    let (status, _) = raw("POST", "/modem/sms", big.as_bytes());
    assert_eq!(status, 413);
    // The daemon and the guest are fine after all that (the guest is listed once the daemon
    // registered its session, which may come just after the guest's handshake returned).
    let t0 = std::time::Instant::now();
    loop {
        let g = ok(&d, "GET", "/guests", Value::Null);
        if g[0]["id"] == c.guest_id() {
            break;
        }
        assert!(
            t0.elapsed().as_secs() < 10,
            "the guest was never listed: {g}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    stats(&c);
}

fn token_file(tag: &str) -> PathBuf {
    let f = std::env::temp_dir().join(format!("virtsoc-ctl-token-{}-{tag}", std::process::id()));
    std::fs::write(&f, format!("{TOKEN}\n")).unwrap();
    f
}

#[test]
fn tcp_control_needs_the_token() {
    let f = token_file("tcp");
    let d = Daemon::start(&[
        "--gpu-backend",
        "null",
        "--control-listen",
        "127.0.0.1:0",
        "--token-file",
        f.to_str().unwrap(),
    ]);
    let line = d.expect_log("control API on tcp ");
    let addr = line.rsplit(' ').next().unwrap().to_string();
    let at = |token: Option<&str>, body: &[u8]| {
        request(
            &Target::Tcp(addr.clone(), token.map(str::to_string)),
            "POST",
            "/modem/sms",
            body,
        )
        .expect("request")
    };
    let sms = br#"{"from": "+1555", "text": "hi"}"#;
    for token in [None, Some("wrong-token-wrong-token"), Some("")] {
        let (status, msg) = refused(at(token, sms));
        assert_eq!(status, 401, "{token:?}: {msg}");
    }
    // 401 comes before the body is read: even an oversized one.
    let big = vec![b' '; 2 * virtsoc_control::MAX_BODY];
    assert_eq!(refused(at(None, &big)).0, 401);
    assert_eq!(at(Some(TOKEN), sms).status, 200);
    let guests = request(
        &Target::Tcp(addr.clone(), Some(TOKEN.into())),
        "GET",
        "/guests",
        b"",
    )
    .unwrap();
    assert_eq!(guests.status, 200);
    // A token in the query string (logs, histories) is refused; the live view's page itself
    // (static HTML) needs none, and takes the token from its URL's fragment.
    let query = request(
        &Target::Tcp(addr.clone(), None),
        "GET",
        &format!("/guests?token={TOKEN}"),
        b"",
    )
    .unwrap();
    assert_eq!(query.status, 401);
    let page = request(&Target::Tcp(addr.clone(), None), "GET", "/view", b"").unwrap();
    assert_eq!(page.status, 200);
    assert!(page.body.contains("location.hash"));
    // The console over TCP takes the token from $VIRTSOC_TOKEN.
    let out = common::virtsoc_cmd()
        .args(["ctl", "--socket", &format!("tcp:{addr}"), "devices"])
        .env("VIRTSOC_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("modem"));
    let out = common::virtsoc_cmd()
        .args(["ctl", "--socket", &format!("tcp:{addr}"), "devices"])
        .env_remove("VIRTSOC_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
    let _ = std::fs::remove_file(f);
}

#[test]
fn tcp_control_without_a_token_does_not_start() {
    let out = Command::new(common::virtsocd())
        .args(["--socket", "/tmp/virtsoc-ctl-notoken.sock"])
        .args(["--gpu-backend", "null", "--control-listen", "127.0.0.1:0"])
        .env_remove("VIRTSOC_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("token"));
}

#[test]
fn the_control_socket_is_removed_on_exit() {
    let mut d = daemon();
    let path = control_path(d.socket());
    assert!(path.exists());
    ok(&d, "GET", "/devices", Value::Null);
    assert!(d.terminate().success());
    assert!(!Path::new(&path).exists(), "{} left behind", path.display());

    // --control chooses the path.
    let custom =
        std::env::temp_dir().join(format!("virtsoc-ctl-custom-{}.ctl", std::process::id()));
    let mut d = Daemon::start(&[
        "--gpu-backend",
        "null",
        "--control",
        custom.to_str().unwrap(),
    ]);
    let r = request(&Target::Unix(custom.clone()), "GET", "/guests", b"").unwrap();
    assert_eq!(r.status, 200);
    assert!(d.terminate().success());
    assert!(!custom.exists());
}
