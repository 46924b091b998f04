//! `virtsoc bench isolation --json`: every row says how it was checked (a `check` field that
//! agrees with `ok`) and carries each of its alone/next-to rounds. The numbers themselves are
//! measurements (reported, not asserted: no timed assertions here).

mod common;

#[test]
fn bench_isolation_json_rows_carry_their_check_and_rounds() {
    let out = common::virtsoc_cmd()
        .args(["bench", "isolation", "--seconds", "2", "--frames", "24"])
        .args(["--hostile", "fence-flood", "--json"])
        .output()
        .expect("run virtsoc bench isolation");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Exit status 1 only says a row was over the tolerance (load-dependent).
    let r: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    // Two seconds of camera: two rounds (each with at least min(--frames, 60) frames).
    assert_eq!(r["rounds"], 2);
    assert!(r["frames"].as_u64().unwrap() >= 24, "{}", r["frames"]);
    let rows = r["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1);
    for row in rows {
        let check = row["check"].as_str().expect("a check field");
        let ok = row["ok"].as_bool().unwrap();
        assert_eq!(check == "ok", ok, "check {check:?} vs ok {ok}");
        if !ok {
            assert!(check.starts_with("FAIL: "), "{check}");
        }
        let rounds = row["rounds"].as_array().expect("rounds");
        assert_eq!(rounds.len(), 2);
        for round in rounds {
            for k in [
                "alone_access_p50_us",
                "access_p50_us",
                "alone_camera_fps",
                "camera_fps",
                "alone_decode_p50_ms",
                "decode_p50_ms",
                "alone_decode_p99_ms",
                "decode_p99_ms",
            ] {
                assert!(round[k].as_f64().unwrap() > 0.0, "{k}: {}", round[k]);
            }
        }
        assert_eq!(row["victim_corrupt"], 0);
        assert!(row["hostile_ops"].as_u64().unwrap() > 0);
    }
    assert_eq!(
        r["all_ok"].as_bool().unwrap(),
        rows.iter().all(|r| r["ok"] == true)
    );
    // The table prints what failed under the rows.
    let table = common::virtsoc_cmd()
        .args(["bench", "isolation", "--seconds", "1", "--frames", "12"])
        .args(["--hostile", "misuse"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("interleaved rounds"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("misuse ")), "{text}");
}
