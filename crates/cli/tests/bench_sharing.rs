//! `virtsoc bench sharing` runs end to end on small compositions: part (a)'s fairness guests
//! rotate through their buffers (each guest checks, before it is measured, that every
//! destination holds its own source's fill: a bench whose guests did not rotate exits with
//! an error), its backlogged codec guests decode (every decode and receive answered without
//! an error, or the bench fails) and the report keeps its fields. The numbers themselves are measurements
//! (reported, not asserted: no timed assertions here).

mod common;

#[test]
fn bench_sharing_reports_fairness_and_multimedia_rows_with_rotating_guests() {
    let chart = std::env::temp_dir().join(format!("sharing-test-{}.svg", std::process::id()));
    let out = common::virtsoc_cmd()
        .args([
            "bench",
            "sharing",
            "--json",
            "--seconds",
            "1",
            "--repeats",
            "1",
        ])
        .args(["--guests", "2", "--scheduler", "wfq", "--no-together"])
        .args([
            "--gpu-sizes",
            "64x36,96x54,128x72",
            "--hogs",
            "1",
            "--hog-kind",
            "gpu",
        ])
        .arg("--chart")
        .arg(&chart)
        .output()
        .expect("run virtsoc bench sharing");
    let _ = std::fs::remove_file(&chart);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench sharing failed: {}\nstdout: {stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("no JSON report ({e}): {stdout}"));
    let fairness = r["fairness"].as_array().expect("fairness");
    assert_eq!(fairness.len(), 1, "{fairness:?}");
    let f = &fairness[0];
    assert_eq!(f["scheduler"], "wfq");
    assert_eq!(f["guests"], 2);
    assert_eq!(f["device"], "gpu");
    for field in ["unfairness_median", "overhead_pct"] {
        assert!(f[field].is_f64(), "{field}: {f}");
    }
    // The grade's work per window from the guests' answers' times: per guest, over the
    // windows together, its whole units counted at the edges but for the parts of the
    // units under way at the first and last edge.
    let windows = |key: &str| -> Vec<Vec<f64>> {
        serde_json::from_value(f[key].clone()).unwrap_or_else(|e| panic!("{key}: {e}: {f}"))
    };
    let (work, units) = (windows("window_work"), windows("window_units"));
    assert_eq!(work.len(), units.len(), "{f}");
    assert!(!work.is_empty(), "{f}");
    for g in 0..2 {
        let w: f64 = work.iter().map(|x| x[g]).sum();
        let u: f64 = units.iter().map(|x| x[g]).sum();
        assert!(
            w > 0.0 && (w - u).abs() <= 2.0,
            "guest {g}: {w} from times, {u} counted"
        );
    }
    assert!(f["unfairness_guest_counted_median"].is_f64(), "{f}");
    let rotation = f["rotation"].as_u64().expect("rotation");
    assert!(rotation > 1, "the guests reuse one buffer: {f}");
    // Both sizes alone were measured (the floor of the overhead), on each device.
    let sizes: Vec<&str> = r["alone"]
        .as_array()
        .expect("alone")
        .iter()
        .map(|a| a["size"].as_str().unwrap())
        .collect();
    assert_eq!(sizes, ["64x36", "96x54", "640x360", "1280x720"]);
    // The same on the codec.
    let codec = r["fairness_codec"].as_array().expect("fairness_codec");
    assert_eq!(codec.len(), 1, "{codec:?}");
    assert_eq!(codec[0]["device"], "codec");
    assert_eq!(codec[0]["guests"], 2);
    assert!(codec[0]["overhead_pct"].is_f64(), "{}", codec[0]);
    // Part (b): round robin with 0 and 1 hog, feedback with 1.
    let multimedia = r["multimedia"].as_array().expect("multimedia");
    let runs: Vec<(&str, u64)> = multimedia
        .iter()
        .map(|m| {
            assert!(m["dfr_pct"].is_f64(), "{m}");
            (
                m["scheduler"].as_str().unwrap(),
                m["hogs"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        runs,
        [("round-robin", 0), ("round-robin", 1), ("feedback", 1)]
    );
}

/// `--hog-kind gles`: a GLES video guest (the vendor library in a child process) against an
/// unmodified glmark2-es2 rendering through the same daemon, under round robin, feedback and
/// feedback steering CPU weights: the video presented frames in every run and the hog's
/// batches reached the gles device.
#[test]
fn bench_sharing_runs_a_gles_video_guest_against_glmark2_hogs() {
    let chart = std::env::temp_dir().join(format!("sharing-gles-{}.svg", std::process::id()));
    let out = common::virtsoc_cmd()
        .args(["bench", "sharing", "--json", "--seconds", "1"])
        .args([
            "--repeats",
            "1",
            "--guests",
            "2",
            "--scheduler",
            "round-robin",
        ])
        .args([
            "--no-together",
            "--no-codec",
            "--gpu-sizes",
            "64x36,96x54,128x72",
        ])
        .args(["--hogs", "1", "--hog-kind", "gles"])
        .arg("--chart")
        .arg(&chart)
        .output()
        .expect("run virtsoc bench sharing");
    let _ = std::fs::remove_file(&chart);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench sharing failed: {}\nstdout: {stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    let runs: Vec<(String, u64, bool)> = r["multimedia"]
        .as_array()
        .expect("multimedia")
        .iter()
        .map(|m| {
            assert_eq!(m["hog_kind"], "gles", "{m}");
            assert!(
                m["presented_fps"].as_f64().unwrap() > 0.0,
                "the video drew: {m}"
            );
            if m["hogs"] == 1 {
                assert!(
                    m["hog_commands_per_s"].as_f64().unwrap() > 0.0,
                    "the hog rendered through virtsoc: {m}"
                );
            }
            (
                m["scheduler"].as_str().unwrap().to_string(),
                m["hogs"].as_u64().unwrap(),
                m["cpu_weight"].as_bool().unwrap(),
            )
        })
        .collect();
    let want = [
        ("round-robin", 0, false),
        ("round-robin", 1, false),
        ("feedback", 1, false),
        ("feedback", 1, true),
    ];
    assert_eq!(
        runs,
        want.map(|(s, h, c)| (s.to_string(), h, c)).to_vec(),
        "{stdout}"
    );
}
