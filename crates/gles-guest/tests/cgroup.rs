//! With `virtsocd --cpu-cgroup`, a GLES guest's render worker goes into the guest's own CPU
//! group, so the CPU the GL burns for the guest (the device itself, on a CPU driver) weighs
//! the guest's share and follows the feedback loop's raises.
//!
//! The guest is this test binary run again (one test in this binary: the guest process is
//! moved between groups, and nothing else must move with it). Where the daemon may not
//! steer CPU weights (not root, no cpu controller) the test is skipped loudly, unless
//! `VIRTSOC_REQUIRE_ALL` is set.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{dlopen, skip, sym};

/// The guest's side: a context on a pbuffer, one cleared and finished frame (the render
/// worker starts), `ready` on stdout, then it waits for stdin to close.
#[test]
fn cgroup_guest() {
    if std::env::var_os("VIRTSOC_GLES_CGROUP_GUEST").is_none() {
        return;
    }
    let (egl, gles) = (dlopen(c"libEGL.so.1"), dlopen(c"libGLESv2.so.2"));
    assert!(!egl.is_null() && !gles.is_null(), "glvnd");
    let _pb = common::pbuffer(egl, &common::ES2_PBUFFER, 2, (64, 64));
    let clear: extern "C" fn(u32) = sym(gles, c"glClear");
    let finish: extern "C" fn() = sym(gles, c"glFinish");
    clear(0x4000);
    finish();
    let mut out = std::io::stdout();
    writeln!(out, "\nready").expect("stdout");
    out.flush().expect("stdout");
    for _ in std::io::stdin().lock().lines() {}
}

/// The cpu controller's group of process `pid` (cgroup v1's `cpu` line, else v2's).
fn cpu_group(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let line = text
        .lines()
        .find(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "cpu"))
        })
        .or_else(|| text.lines().find(|l| l.starts_with("0::")))?;
    line.splitn(3, ':').nth(2).map(str::to_string)
}

/// The children of `parent` whose command is `comm`.
fn children_named(parent: u32, comm: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
                let Some(close) = st.rfind(')') else {
                    return false;
                };
                let name = st
                    .get(st.find('(').map_or(0, |o| o + 1)..close)
                    .unwrap_or("");
                let ppid = st[close + 1..].split_whitespace().nth(1);
                name == comm && ppid == Some(&parent.to_string())
            })
        })
        .collect()
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
fn a_guests_render_worker_runs_in_the_guests_cpu_group() {
    let name = format!("virtsoc-gles-cg-{}", std::process::id());
    let _leftovers = Leftovers(name.clone());
    let tmp = std::env::temp_dir().join(&name);
    let Some((d, _sock, _ctl)) = common::start_daemon(&tmp, &["--cpu-cgroup", &name]) else {
        return;
    };
    let mut guest = Command::new(std::env::current_exe().expect("test executable"))
        .args([
            "--exact",
            "cgroup_guest",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("VIRTSOC_GLES_CGROUP_GUEST", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("guest");
    let mut lines = BufReader::new(guest.stdout.take().expect("stdout")).lines();
    let ready = lines.by_ref().map_while(Result::ok).any(|l| l == "ready");
    assert!(ready, "the guest rendered");
    let group = cpu_group(guest.id()).unwrap_or_default();
    if !group.contains(&format!("{name}/guest-")) {
        drop(guest.stdin.take());
        let _ = guest.wait();
        return skip(&format!(
            "the daemon did not put the guest in a CPU group here (it is in {group:?})"
        ));
    }
    // The worker started at the guest's first batch; it is the daemon's child.
    let t0 = Instant::now();
    let workers = loop {
        let w = children_named(d.0.id(), "virtsoc-render");
        if !w.is_empty() || t0.elapsed() > Duration::from_secs(10) {
            break w;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(workers.len(), 1, "one render worker: {workers:?}");
    assert_eq!(
        cpu_group(workers[0]).as_deref(),
        Some(group.as_str()),
        "the render worker is in its guest's group"
    );
    drop(guest.stdin.take());
    assert!(guest.wait().expect("guest").success());
    let _ = std::fs::remove_dir_all(&tmp);
}
