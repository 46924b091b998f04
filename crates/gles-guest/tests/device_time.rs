//! The `gles` device's time as the schedulers see it, for two guests rendering at once: each
//! guest's device time (control API `device_use.gles.device_ns`, what `virtsoc top --json`
//! shows) covers the time its render worker spent on its batches - the worker's CPU time,
//! all its threads - and the time the guest waited for them, though the two workers ran
//! side by side (the dispatch-to-answer chain of a device that runs one command at a time
//! would have split that wall time between them).
//!
//! The binaries are built by `cargo build -p virtsocd -p virtsoc-render -p
//! virtsoc-gles`; without them (or without glvnd) the test is skipped loudly, unless
//! `VIRTSOC_REQUIRE_ALL` is set.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{dlopen, skip, sym};
use virtsoc_control::client::{request, Target};

/// How long each guest renders.
const RENDER: Duration = Duration::from_millis(1500);

/// The guest's side (this test run again with `VIRTSOC_GLES_TIME_GUEST` set): waits for a
/// line on stdin, clears a 1024 x 1024 pbuffer and waits for it (glFinish) for [`RENDER`],
/// prints `done <ns spent in glFinish> <frames>`, then waits for stdin to close.
#[test]
fn time_guest() {
    if std::env::var_os("VIRTSOC_GLES_TIME_GUEST").is_none() {
        return;
    }
    let (egl, gles) = (dlopen(c"libEGL.so.1"), dlopen(c"libGLESv2.so.2"));
    assert!(!egl.is_null() && !gles.is_null(), "glvnd");
    let _pb = common::pbuffer(egl, &common::ES2_PBUFFER, 2, (1024, 1024));
    let clear_color: extern "C" fn(f32, f32, f32, f32) = sym(gles, c"glClearColor");
    let clear: extern "C" fn(u32) = sym(gles, c"glClear");
    let finish: extern "C" fn() = sym(gles, c"glFinish");
    finish();
    let mut lines = std::io::stdin().lock().lines();
    let _go = lines.next();
    let (t0, mut waited, mut frames) = (Instant::now(), Duration::ZERO, 0u64);
    while t0.elapsed() < RENDER {
        clear_color((frames % 7) as f32 / 7.0, 0.5, 0.25, 1.0);
        clear(0x4000);
        let t = Instant::now();
        finish();
        waited += t.elapsed();
        frames += 1;
    }
    let mut out = std::io::stdout();
    writeln!(out, "\ndone {} {frames}", waited.as_nanos()).expect("stdout");
    out.flush().expect("stdout");
    for _ in lines {}
}

/// A guest process: its `done` line's numbers once it has rendered.
struct Guest(Child, std::io::Lines<BufReader<std::process::ChildStdout>>);

impl Guest {
    fn start() -> Guest {
        let mut child = Command::new(std::env::current_exe().expect("test executable"))
            .args([
                "--exact",
                "time_guest",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("VIRTSOC_GLES_TIME_GUEST", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a guest");
        let out = child.stdout.take().expect("stdout");
        Guest(child, BufReader::new(out).lines())
    }

    fn go(&mut self) {
        let stdin = self.0.stdin.as_mut().expect("stdin");
        writeln!(stdin, "go").expect("to the guest");
    }

    /// `(ns waited in glFinish, frames)`.
    fn done(&mut self) -> (u64, u64) {
        loop {
            let line = self.1.next().expect("the guest reports").expect("stdout");
            if let Some(rest) = line.strip_prefix("done ") {
                let mut w = rest
                    .split_whitespace()
                    .map(|x| x.parse().expect("a number"));
                return (w.next().expect("ns"), w.next().expect("frames"));
            }
        }
    }

    fn leave(mut self) {
        drop(self.0.stdin.take());
        let status = self.0.wait().expect("wait");
        assert!(status.success(), "a guest: {status}");
    }
}

/// Each listed guest's `gles` device time, by process id (guest `gles-<pid>`).
fn device_ns(ctl: &Path, pid: u32) -> u64 {
    let r = request(&Target::Unix(ctl.to_path_buf()), "GET", "/guests", b"").expect("control");
    let name = format!("gles-{pid}");
    r.json()
        .as_array()
        .and_then(|a| a.iter().find(|g| g["name"] == name.as_str()).cloned())
        .and_then(|g| g["device_use"]["gles"]["device_ns"].as_u64())
        .unwrap_or_else(|| panic!("{name} listed with gles device time: {}", r.body))
}

/// CPU time of the daemon's render workers, in nanoseconds (from /proc: user + system).
fn workers_cpu_ns(daemon: u32) -> u64 {
    // SAFETY: sysconf with an integer argument.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    let mut total = 0;
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some((comm, rest)) = stat.split_once(") ") else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        // state ppid ... utime (14th field of stat: index 11 here) stime (12)
        if comm.ends_with("(virtsoc-render") && f.get(1) == Some(&daemon.to_string().as_str()) {
            let ticks: u64 = f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
            total += ticks * 1_000_000_000 / hz;
        }
    }
    total
}

#[test]
fn two_guests_are_charged_their_render_workers_time() {
    if std::env::var_os("VIRTSOC_GLES_TIME_GUEST").is_some() {
        return;
    }
    if dlopen(c"libEGL.so.1").is_null() {
        return skip("glvnd's libEGL.so.1 not installed");
    }
    let tmp = std::env::temp_dir().join(format!("virtsoc-gles-time-{}", std::process::id()));
    let Some((d, _, ctl)) = common::start_daemon(&tmp, &[]) else {
        return;
    };

    let mut guests = [Guest::start(), Guest::start()];
    // Both are set up (their first glFinish answered) before either renders.
    std::thread::sleep(Duration::from_millis(500));
    let pids = [guests[0].0.id(), guests[1].0.id()];
    let before = pids.map(|p| device_ns(&ctl, p));
    let cpu_before = workers_cpu_ns(d.0.id());
    for g in &mut guests {
        g.go();
    }
    let wall = Instant::now();
    let done = [guests[0].done(), guests[1].done()];
    let wall = wall.elapsed().as_nanos() as u64;
    let charged = [0, 1].map(|i| device_ns(&ctl, pids[i]) - before[i]);
    let cpu = workers_cpu_ns(d.0.id()).saturating_sub(cpu_before);
    eprintln!(
        "two guests rendering side by side for {:.2} s: glFinish waited {:.2} s and {:.2} s \
         ({} and {} frames); gles device time charged {:.2} s and {:.2} s; the render \
         workers' CPU time {:.2} s",
        wall as f64 / 1e9,
        done[0].0 as f64 / 1e9,
        done[1].0 as f64 / 1e9,
        done[0].1,
        done[1].1,
        charged[0] as f64 / 1e9,
        charged[1] as f64 / 1e9,
        cpu as f64 / 1e9,
    );
    for i in 0..2 {
        assert!(done[i].1 > 0, "guest {i} rendered");
        assert!(
            charged[i] * 2 >= done[i].0,
            "guest {i}: charged {} ns of device time for {} ns waiting on its worker",
            charged[i],
            done[i].0
        );
    }
    // A chain of dispatch-to-answer periods, each starting at the previous answer, never
    // adds up to more than the wall time; the two workers' time does.
    let sum = charged[0] + charged[1];
    assert!(
        sum > wall + wall / 10,
        "charged {charged:?} ns in all for {wall} ns of two workers rendering side by side"
    );
    // What the workers spent on the CPU is charged (two clock ticks of slack).
    assert!(
        sum + 20_000_000 >= cpu * 8 / 10,
        "charged {charged:?} ns for {cpu} ns of the workers' CPU time"
    );
    for g in guests {
        g.leave();
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
