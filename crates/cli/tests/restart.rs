//! `virtsocd --state-dir`: a process guest holding regions and fences while its daemon is
//! stopped (SIGTERM) and started again goes on by itself: the guest library reconnects with
//! its resume secret, maps the new daemon's window, and finds the same region ids, bytes and
//! fence states. A resume secret the daemon does not know is refused; a corrupted saved
//! session is not restored (and the daemon serves others).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{connect_to, cpu_read, cpu_write, pattern, Daemon};
use virtsoc_guest::DeviceId;

fn state_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("virtsoc-state-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn saved_files(dir: &PathBuf) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|r| r.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default()
}

const DEVICES: [&str; 4] = ["--gpu-backend", "null", "--isp-backend", "null"];

#[test]
fn a_process_guest_goes_on_across_a_daemon_restart() {
    let dir = state_dir("restart");
    let dir_s = dir.to_str().unwrap().to_string();
    let extra: Vec<&str> = DEVICES
        .iter()
        .copied()
        .chain(["--state-dir", &dir_s])
        .collect();
    let mut a = Daemon::start(&extra);
    let socket = a.socket().to_path_buf();
    let g = connect_to(&socket);
    g.set_auto_reconnect(Some(Duration::from_secs(60)));
    assert!(g.resume_secret().is_some());
    let r1 = g.alloc_blob(2 << 20).unwrap();
    let r2 = g.alloc_blob(4096).unwrap();
    cpu_write(&g, r1.id, &pattern(2 << 20, 1));
    cpu_write(&g, r2.id, &pattern(4096, 2));
    let done = g.fence_create().unwrap();
    g.fence_signal(DeviceId::CPU, done).unwrap();
    let pending = g.fence_create().unwrap();
    g.nop().unwrap();

    // Stop the daemon: it saves the session before closing it.
    assert!(a.terminate().success());
    drop(a);
    let files = saved_files(&dir);
    assert_eq!(files.len(), 1, "{files:?}");

    // A new daemon on the same socket and state directory; the guest just goes on.
    let b = Daemon::start_with(&[], Some(socket.clone()), &extra);
    assert_eq!(cpu_read(&g, r1.id, 2 << 20), pattern(2 << 20, 1));
    assert_eq!(cpu_read(&g, r2.id, 4096), pattern(4096, 2));
    assert!(g.fence_signaled(done).unwrap());
    assert!(!g.fence_signaled(pending).unwrap());
    g.fence_signal(DeviceId::CPU, pending).unwrap();
    g.nop().unwrap();
    assert!(g.fence_signaled(pending).unwrap());
    cpu_write(&g, r2.id, &pattern(4096, 3));
    assert_eq!(cpu_read(&g, r2.id, 4096), pattern(4096, 3));
    let fresh = g.alloc_blob(100).unwrap();
    assert!(fresh.id > r2.id);
    assert!(
        saved_files(&dir).is_empty(),
        "the claimed session's file is removed"
    );
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupted_saved_session_is_not_restored() {
    let dir = state_dir("corrupt");
    let dir_s = dir.to_str().unwrap().to_string();
    let extra: Vec<&str> = DEVICES
        .iter()
        .copied()
        .chain(["--state-dir", &dir_s])
        .collect();
    let mut a = Daemon::start(&extra);
    let socket = a.socket().to_path_buf();
    let g = connect_to(&socket);
    let r = g.alloc_blob(1 << 20).unwrap();
    cpu_write(&g, r.id, &pattern(1 << 20, 9));
    assert!(a.terminate().success());
    drop(a);
    let file = saved_files(&dir).pop().expect("a saved session");
    let mut bytes = std::fs::read(&file).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();

    let b = Daemon::start_with(&[], Some(socket.clone()), &extra);
    b.expect_log("not restored");
    // The guest's secret names no session the daemon could restore: refused, not half-done.
    match g.reconnect(Duration::from_secs(30)) {
        Err(virtsoc_guest::GuestError::Refused(m)) => {
            assert!(m.contains("no saved session"), "{m}")
        }
        other => panic!("resumed from a corrupted file: {other:?}"),
    }
    // The daemon serves other guests.
    let h = connect_to(&socket);
    let x = h.alloc_blob(4096).unwrap();
    cpu_write(&h, x.id, &[1; 4096]);
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}
