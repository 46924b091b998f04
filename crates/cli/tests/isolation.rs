//! `virtsoc bench isolation` runs end to end: its victim alone and next to hostile guests,
//! one row each, with the hostile guests' work counted and the victim's data verified. The
//! numbers themselves are measurements (reported, not asserted: no timed assertions here).

mod common;

#[test]
fn bench_isolation_measures_the_victim_next_to_each_hostile_kind() {
    let kinds = [
        "region-flood",
        "fence-flood",
        "misuse",
        "handshake-trickle",
        "slow-decoder",
        "slow-decoder-1",
        "slow-encoder",
        "slow-isp",
        "session-churn",
    ];
    let out = common::virtsoc_cmd()
        .args(["bench", "isolation", "--seconds", "1", "--frames", "20"])
        .args(["--hostile", &kinds.join(","), "--json"])
        .args(["--slow-resolution", "360p"])
        .output()
        .expect("run virtsoc bench isolation");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Exit status 1 only says a row was over the tolerance (load-dependent); the report is
    // printed either way.
    let r: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let rows = r["rows"].as_array().expect("rows");
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["hostile"].as_str().unwrap())
        .collect();
    assert_eq!(names, kinds);
    for row in rows {
        let name = row["hostile"].as_str().unwrap();
        assert_eq!(
            row["victim_corrupt"], 0,
            "{name}: the victim read wrong data"
        );
        assert!(
            row["hostile_ops"].as_u64().unwrap() > 0,
            "{name} did nothing"
        );
        for k in ["alone_camera_fps", "camera_fps"] {
            assert!(row[k].as_f64().unwrap() > 0.0, "{name}: {k} {}", row[k]);
        }
        for k in [
            "alone_access_p50_us",
            "access_p50_us",
            "alone_decode_p50_ms",
            "decode_p50_ms",
            "alone_decode_p99_ms",
            "decode_p99_ms",
        ] {
            assert!(row[k].as_f64().unwrap() > 0.0, "{name}: {k} {}", row[k]);
        }
    }
    // Every misuse is refused. (Whether a flood reaches its limit within the row depends on
    // the machine's speed: not asserted.)
    let row = |k: &str| rows.iter().find(|r| r["hostile"] == k).unwrap();
    assert_eq!(
        row("misuse")["hostile_refused"],
        row("misuse")["hostile_ops"],
        "a misuse was accepted"
    );
    let unknown = common::virtsoc_cmd()
        .args(["bench", "isolation", "--hostile", "nope"])
        .output()
        .unwrap();
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown hostile kind"));
}
