//! `virtsocd --cpu-cgroup` against the host's real cgroup file system: a guest process goes
//! into a group of its own weighted by its policy share, and back where it was when it
//! leaves. Runs only where the daemon may (root with a writable cpu controller); elsewhere
//! it checks that the daemon says why it does not steer CPU weights.
//!
//! The guest is this test process (its own test binary, one test, so no other test is moved
//! along with it).

mod common;

use common::Daemon;
use virtsoc_guest::{ConnectOptions, Connection};

fn guest(d: &Daemon, name: &str) -> Connection {
    Connection::connect(
        d.socket(),
        &ConnectOptions {
            name: name.into(),
            window_size: 4 << 20,
            ..ConnectOptions::default()
        },
    )
    .expect("connect")
}

fn own_cpu_cgroup() -> String {
    std::fs::read_to_string("/proc/self/cgroup")
        .unwrap_or_default()
        .lines()
        .find(|l| {
            let ctrls = l.split(':').nth(1).unwrap_or("");
            ctrls.split(',').any(|c| c == "cpu") || l.starts_with("0::")
        })
        .map(|l| l.splitn(3, ':').nth(2).unwrap_or("").to_string())
        .unwrap_or_default()
}

/// Removes what a failed run left (the daemon killed before its cleanup).
struct Leftovers(String);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for root in [
            "/sys/fs/cgroup/cpu",
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/unified",
        ] {
            let dir = std::path::Path::new(root).join(&self.0);
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for e in entries.flatten() {
                    if e.path().is_dir() {
                        let _ = std::fs::remove_dir(e.path());
                    }
                }
                let _ = std::fs::remove_dir(&dir);
            }
        }
    }
}

#[test]
fn guest_process_is_weighted_in_its_own_cgroup_and_put_back() {
    let name = format!("virtsoc-it-{}", std::process::id());
    let _leftovers = Leftovers(name.clone());
    let policy = std::env::temp_dir().join(format!("{name}.toml"));
    std::fs::write(&policy, "[guest.heavy]\nshares = 300\n").unwrap();
    let mut d = Daemon::start(&["--cpu-cgroup", &name, "--policy", policy.to_str().unwrap()]);
    let line = d.expect_log("cpu weight:");
    if line.contains("not steered") {
        assert!(
            std::env::var_os("VIRTSOC_REQUIRE_ALL").is_none(),
            "the daemon may not steer CPU weights here and VIRTSOC_REQUIRE_ALL is set: {line}"
        );
        eprintln!("skipped: the daemon may not steer CPU weights here: {line}");
        assert!(line.contains("cgroup") || line.contains("cpu"), "{line}");
        return;
    }
    let v2 = line.contains("cpu.weight");
    let before = own_cpu_cgroup();
    let c = guest(&d, "heavy");
    let placed = d.expect_log("cpu weight: guest");
    assert!(placed.contains("heavy"), "{placed}");
    let now = own_cpu_cgroup();
    assert!(
        now.contains(&format!("{name}/guest-")),
        "not moved: {now} (log: {placed})"
    );
    let dir = placed
        .rsplit(" in ")
        .next()
        .map(|s| s.trim().to_string())
        .unwrap();
    let weight = std::fs::read_to_string(format!(
        "{dir}/{}",
        if v2 { "cpu.weight" } else { "cpu.shares" }
    ))
    .unwrap();
    assert_eq!(weight.trim(), if v2 { "300" } else { "3072" });
    // `virtsoc top --json` shows it.
    let socket = d.socket().to_str().unwrap().to_string();
    let top = common::virtsoc(&["top", "--json", "--interval-ms", "10", "--socket", &socket]);
    let rows: serde_json::Value = serde_json::from_str(&top).unwrap();
    let heavy = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "heavy")
        .unwrap_or_else(|| panic!("{top}"));
    assert_eq!(heavy["cpu_weight"], if v2 { 300 } else { 3072 }, "{top}");
    // A reload (SIGHUP) with another share re-weights it.
    std::fs::write(&policy, "[guest.heavy]\nshares = 50\n").unwrap();
    let pid = rustix::process::Pid::from_raw(d.child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    d.expect_log("re-weighted");
    let weight = std::fs::read_to_string(format!(
        "{dir}/{}",
        if v2 { "cpu.weight" } else { "cpu.shares" }
    ))
    .unwrap();
    assert_eq!(weight.trim(), if v2 { "50" } else { "512" });
    // A second guest of the same process cannot be weighed apart: said so, not moved.
    let other = guest(&d, "other");
    let shared = d.expect_log("not steered");
    assert!(shared.contains("shares process"), "{shared}");
    drop(other);
    drop(c);
    d.expect_log("released its cgroup");
    assert_eq!(own_cpu_cgroup(), before, "not put back");
    assert!(!std::path::Path::new(&dir).exists(), "{dir} left behind");
    // The daemon's exit removes its parent group.
    assert!(d.terminate().success());
    let parent = std::path::Path::new(&dir).parent().unwrap().to_path_buf();
    assert!(!parent.exists(), "{} left behind", parent.display());
    let _ = std::fs::remove_file(&policy);
}
