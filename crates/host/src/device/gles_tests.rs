//! Unit tests of the `gles` device: its worker, charges and clock.

use super::forward::GlCharge;
use super::worker::{DeviceClock, Worker, WorkerError};
use super::*;
use std::path::Path;

#[test]
fn default_worker_is_beside_the_executable() {
    let p = default_worker();
    assert!(p.ends_with(WORKER_PROGRAM) || std::env::var_os("VIRTSOC_RENDER_WORKER").is_some());
}

#[test]
fn small_answers_travel_in_the_result_words() {
    let reply: Vec<u8> = (1..=20).collect();
    let v = inline_reply(&reply);
    assert_eq!((v[0], v[1]), (20, 2));
    assert_eq!(v[2], u64::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 8]));
    assert_eq!(
        v[4] & 0xFFFF_FFFF,
        u64::from_le_bytes([17, 18, 19, 20, 0, 0, 0, 0])
    );
    assert_eq!(inline_reply(&[])[..2], [0, 0]);
}

#[test]
fn a_missing_worker_program_is_an_error() {
    let e = Worker::start(Path::new("/nonexistent/virtsoc-render"), WORKER_DEADLINE).err();
    assert!(matches!(&e, Some(WorkerError::Start { .. })), "{e:?}");
    assert!(e.is_some_and(|e| e.to_string().contains("cannot start render worker")));
}

#[test]
fn gl_memory_is_charged_grown_shrunk_refused_and_given_back() {
    let core = crate::testkit::Core::new();
    let (svm, g) = (&*core.svm, crate::testkit::GUEST);
    let used = || svm.guest_usage(g).map_or(0, |u| u.1);
    let base = used();
    let mut c = GlCharge::default();
    for mib in [8u64, 24, 30, 4] {
        c.set(svm, g, mib << 20).expect("within the limit");
        assert_eq!(used(), base + (mib << 20), "{mib} MiB");
    }
    // Past the guest's limit (64 MiB): refused, and nothing stays charged.
    let e = c.set(svm, g, 100 << 20).expect_err("over the limit");
    assert!(matches!(e, WorkerError::OverLimit { .. }), "{e:?}");
    assert!(
        e.to_string().contains("exceed the guest's memory limit"),
        "{e}"
    );
    assert_eq!(used(), base);
    c.set(svm, g, 1 << 20).expect("within the limit");
    drop(c);
    assert_eq!(used(), base, "given back with the charge");
}

#[test]
fn device_time_is_the_workers_cpu_time_within_bounds() {
    let mut clock = DeviceClock::new();
    clock.cpus = 2;
    std::thread::sleep(Duration::from_millis(20));
    // The CPU time since the previous answer, at least the round trip.
    assert_eq!(
        clock.batch(Duration::from_millis(1), 15_000_000),
        15_000_000
    );
    // Less than the round trip (or a clock going back) is charged the round trip.
    assert_eq!(clock.batch(Duration::from_millis(3), 1_000), 3_000_000);
    // More than the wall time since the previous answer x the CPUs is cut there.
    std::thread::sleep(Duration::from_millis(10));
    let ns = clock.batch(Duration::from_millis(1), u64::MAX / 2);
    assert!((20_000_000..200_000_000).contains(&ns), "{ns}");
}
