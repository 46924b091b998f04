//! Each scenario runs briefly through a real daemon and real devices; frames must flow and
//! the metrics must be sane. No timing thresholds.

mod common;

use common::{virtsoc, Daemon};

fn run(d: &Daemon, args: &[&str]) -> Vec<serde_json::Value> {
    let mut a = vec!["run"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--json", "--socket", d.socket().to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&virtsoc(&a)).unwrap();
    v.as_array().unwrap().clone()
}

fn sane(r: &serde_json::Value, stamped: bool) {
    let f = |k: &str| {
        r[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {r}"))
    };
    assert!(f("frames_in") > 0.0, "{r}");
    assert!(f("presented") > 0.0, "frames reached the display: {r}");
    assert!(f("presented") <= f("frames_in"), "{r}");
    assert!(f("copies_per_frame") > 0.0, "{r}");
    let (p50, p99) = (
        r["latency_ms"]["p50"].as_f64().unwrap(),
        r["latency_ms"]["p99"].as_f64().unwrap(),
    );
    assert!(p99 >= p50 && p50 >= 0.0, "{r}");
    if stamped {
        assert!(
            p50 > 0.0,
            "latency read back from the presented pixels: {r}"
        );
    }
    assert!(
        !r["access_latency_cdf_us"].as_array().unwrap().is_empty(),
        "{r}"
    );
}

#[test]
fn video_scenarios_run() {
    let d = Daemon::start(&[]);
    for s in ["uhd-video", "video-360"] {
        for r in run(
            &d,
            &[
                s,
                "--seconds",
                "1.5",
                "--resolution",
                "360p",
                "--protocol",
                "prefetch",
            ],
        ) {
            assert_eq!(r["scenario"], s);
            sane(&r, true);
        }
    }
}

#[test]
fn camera_scenarios_run_and_measure_latency_from_pixels() {
    let d = Daemon::start(&[]);
    for s in ["camera", "ar"] {
        for r in run(
            &d,
            &[
                s,
                "--seconds",
                "1.5",
                "--resolution",
                "360p",
                "--ordering",
                "atomic",
            ],
        ) {
            sane(&r, true);
        }
    }
}

/// The GLES scenarios (the guest in a child process loading the vendor library through
/// glvnd): frames drawn by GLES reach the display in both orderings, the camera's capture
/// time is read back from the presented pixels (through the ISP and the GLES effect), the
/// consuming sink read them, and the frames came into the gles domain over the SVM (the
/// ledger's `... -> gles` links).
#[test]
fn gles_scenarios_draw_and_present() {
    let d = Daemon::start(&["--display-sink", "crc"]);
    for (s, ordering) in [
        ("gles-camera", "fence"),
        ("gles-camera", "atomic"),
        ("gles-video", "fence"),
    ] {
        for r in run(
            &d,
            &[
                s,
                "--seconds",
                "1.5",
                "--resolution",
                "360p",
                "--protocol",
                "prefetch",
                "--ordering",
                ordering,
            ],
        ) {
            assert_eq!(r["scenario"], s, "{r}");
            assert_eq!(r["composition"], "gles", "{r}");
            assert!(r["presented"].as_f64().unwrap() > 0.0, "{r}");
            let p50 = r["latency_ms"]["p50"].as_f64().unwrap();
            assert!(p50 > 0.0, "latency measured: {r}");
            assert_eq!(r["display_sink"], "crc", "{r}");
            assert!(r["sink_bytes_per_frame"].as_f64().unwrap() >= 640.0 * 360.0 * 4.0);
            let links: Vec<&str> = r["ledger"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|l| l["link"].as_str())
                .collect();
            let into_gles = if s == "gles-camera" {
                "isp->gles"
            } else {
                "codec->gles"
            };
            assert!(links.contains(&into_gles), "{s} {ordering}: {links:?}");
        }
    }
}

/// `--breakdown`: the atomic gles-video guest finishes and times every stage of a frame, in
/// the frame's order (with `--compare`, the atomic rows); asking it of fence ordering alone
/// (where stages overlap) is refused.
#[test]
fn gles_video_breaks_each_frame_into_its_stages() {
    let d = Daemon::start(&["--display-sink", "crc"]);
    let args = [
        "gles-video",
        "--seconds",
        "1.5",
        "--resolution",
        "360p",
        "--ordering",
        "atomic",
        "--breakdown",
    ];
    let rows = run(&d, &args);
    let stages = rows[0]["stages_ms"].as_array().expect("stages_ms").clone();
    let names: Vec<&str> = stages.iter().filter_map(|s| s[0].as_str()).collect();
    assert_eq!(
        names,
        [
            "write unit",
            "decode",
            "latch",
            "video quad",
            "ui layer",
            "present"
        ],
        "{}",
        rows[0]
    );
    for s in &stages {
        assert!(s[1].as_f64().unwrap() > 0.0, "every stage took time: {s}");
    }
    // With --compare the atomic rows are timed and the fence rows run as they always do.
    let rows = virtsoc(&[
        "run",
        "gles-video",
        "--compare",
        "--breakdown",
        "--seconds",
        "0.6",
        "--resolution",
        "360p",
        "--json",
    ]);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&rows).unwrap();
    assert_eq!(rows.len(), 6);
    for r in &rows {
        let timed = r["stages_ms"].as_array().is_some_and(|s| s.len() == 6);
        assert_eq!(timed, r["ordering"] == "atomic", "{r}");
    }
    let out = common::virtsoc_cmd()
        .args([
            "run",
            "gles-video",
            "--ordering",
            "fence",
            "--breakdown",
            "--socket",
        ])
        .arg(d.socket())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--ordering atomic"), "{err}");
}

#[test]
fn compare_runs_every_protocol_and_ordering_and_the_report_draws_it() {
    let d = Daemon::start(&[]);
    let rs = run(
        &d,
        &[
            "camera",
            "--seconds",
            "0.6",
            "--resolution",
            "360p",
            "--compare",
        ],
    );
    assert_eq!(rs.len(), 6);
    let combos: Vec<String> = rs
        .iter()
        .map(|r| {
            format!(
                "{}/{}",
                r["protocol"].as_str().unwrap(),
                r["ordering"].as_str().unwrap()
            )
        })
        .collect();
    for p in ["guest-staging", "write-invalidate", "prefetch"] {
        for o in ["atomic", "fence"] {
            assert!(combos.contains(&format!("{p}/{o}")), "{combos:?}");
        }
    }
    for r in &rs {
        sane(r, false);
    }
    let dir = std::env::temp_dir().join(format!("virtsoc-report-{}", std::process::id()));
    let json = dir.join("results.json");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(&json, serde_json::to_string(&rs).unwrap()).unwrap();
    let out = virtsoc(&[
        "report",
        json.to_str().unwrap(),
        "--out",
        dir.join("charts").to_str().unwrap(),
    ]);
    for name in [
        "fps.png",
        "fps.svg",
        "latency.png",
        "latency.svg",
        "access-cdf.png",
        "access-cdf.svg",
    ] {
        let p = dir.join("charts").join(name);
        assert!(out.contains(name), "{out}");
        assert!(
            std::fs::metadata(&p).unwrap().len() > 1000,
            "{name} has content"
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_scenario_arguments_are_clear_errors() {
    let out = common::virtsoc_cmd()
        .args(["run", "teleport", "--socket", "/nonexistent.sock"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let out = common::virtsoc_cmd()
        .args(["run", "camera", "--resolution", "8k"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("resolution"));
}
