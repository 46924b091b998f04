//! The soak of issue 10, short: `virtsoc soak` starts its own daemon, runs good, hostile,
//! crashing (SIGKILLed) and reconnecting guests, and checks that the daemon's memory,
//! descriptors and threads come back and every good guest's data was right.

use std::process::Command;

#[test]
fn soak_with_eight_guests_passes_its_checks() {
    let out = Command::new(env!("CARGO_BIN_EXE_virtsoc"))
        .args(["soak", "--guests", "8", "--seconds", "20", "--json"])
        .output()
        .expect("run virtsoc soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "soak failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_str(&stdout).expect("json report");
    for c in r["checks"].as_array().expect("checks") {
        assert_eq!(c["ok"], true, "check failed: {c}");
    }
    // Every role ran.
    for k in [
        "good_rounds",
        "hostile_rounds",
        "crashes",
        "reconnects",
        "presents",
    ] {
        assert!(r[k].as_u64().unwrap_or(0) > 0, "{k} = {}", r[k]);
    }
    assert_eq!(r["good_bad_data"], 0);
    assert_eq!(r["hostile_accepted"], 0);
    assert_eq!(r["daemon_alive"], true);
}
