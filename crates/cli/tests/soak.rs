//! The soak of issue 10, short: `virtsoc soak` starts its own daemon, runs good, hostile,
//! crashing (SIGKILLed) and reconnecting guests, and checks that the daemon's memory,
//! descriptors and threads come back and every good guest's data was right.

mod common;

fn soak(args: &[&str]) -> serde_json::Value {
    let out = common::virtsoc_cmd()
        .arg("soak")
        .args(args)
        .arg("--json")
        .output()
        .expect("run virtsoc soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "soak failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).expect("json report")
}

/// Every role, the hostile guests' bursts of malformed ring entries included.
#[test]
fn soak_with_eight_guests_passes_its_checks() {
    let r = soak(&["--guests", "8", "--seconds", "20"]);
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

/// Regression test of a leak the soak found: hostile guests that send bursts of malformed
/// ring entries (random opcodes, device ids and arguments, `submit_raw`) and hang up left some
/// of their sessions behind (a window memfd and a socket each): a device worker slept holding
/// its list of queues, and with it the sessions of guests that had left. The daemon's
/// descriptors must come back, and no ended session may still be referenced (the
/// `virtsoc_sessions_lingering` metric).
#[test]
fn hostile_raw_bursts_leave_nothing_behind() {
    let r = soak(&["--guests", "4", "--seconds", "10", "--roles", "hostile"]);
    assert_eq!(r["end"]["fds"], r["start"]["fds"], "{r}");
    let released = r["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "sessions released")
        .expect("a sessions-released check");
    assert_eq!(released["ok"], true, "{released}");
}
