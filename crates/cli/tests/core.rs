//! Integration tests of the vSoC core: the prefetch protocol, virtual command fences and flow
//! control, with a real daemon process and real guest processes.

mod common;

use common::{virtsoc, Daemon};
use virtsoc_guest::{
    testdev, AccessMode, ConnectOptions, Connection, DeviceId, GuestError, Opcode, Status,
};

fn connect(d: &Daemon, coherence: &str) -> Connection {
    Connection::connect(
        d.socket(),
        &ConnectOptions {
            window_size: 64 << 20,
            coherence: Some(coherence.to_string()),
            ..ConnectOptions::default()
        },
    )
    .expect("connect")
}

#[test]
fn every_protocol_and_ordering_delivers_correct_data() {
    let d = Daemon::start(&[]);
    let sock = d.socket().to_str().unwrap().to_string();
    for extra in [
        vec!["--readers", "1", "--slack-pattern", "bimodal"],
        vec![
            "--readers",
            "2",
            "--switch-every",
            "5",
            "--slack-pattern",
            "jittered",
        ],
    ] {
        let mut args = vec![
            "bench",
            "svm",
            "--json",
            "--frames",
            "12",
            "--warmup",
            "2",
            "--size",
            "1000003",
            "--slack-ms",
            "1",
            "--ordering",
            "atomic,fence",
            "--socket",
            &sock,
        ];
        args.extend(extra.iter().copied());
        let v: serde_json::Value = serde_json::from_str(&virtsoc(&args)).unwrap();
        let results = v["protocols"].as_array().unwrap();
        assert_eq!(results.len(), 6, "3 protocols x 2 orderings");
        for r in results {
            assert_eq!(r["corrupt_frames"], 0, "{r}");
            assert_eq!(r["frames"], 12, "{r}");
        }
    }
}

#[test]
fn prefetch_predicts_a_steady_pipeline() {
    // Tests share two cores, so link bandwidth swings; the bandwidth rule would (rightly)
    // suspend prefetching then. Here we check the predictor alone.
    let d = Daemon::start(&["--prefetch-bandwidth-floor", "0"]);
    let out = virtsoc(&[
        "bench",
        "svm",
        "--json",
        "--protocol",
        "prefetch",
        "--frames",
        "40",
        "--warmup",
        "8",
        "--size",
        "2097152",
        "--slack-ms",
        "3",
        "--socket",
        d.socket().to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let r = &v["protocols"][0];
    assert_eq!(r["corrupt_frames"], 0);
    assert!(r["prediction_accuracy"].as_f64().unwrap() >= 0.99, "{r}");
    assert_eq!(
        r["copies_per_frame"], 1.0,
        "one device-to-device copy per frame: {r}"
    );
    assert_eq!(r["sync_fetches"], 0, "every read was prefetched: {r}");
    assert!(r["svm_metadata_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn a_queued_wait_never_passes_its_signal() {
    let d = Daemon::start(&[]);
    let c = connect(&d, "prefetch");
    let size = 4 << 20;
    let id = c.alloc_blob(size).unwrap().id;
    let f = c.fence_create().unwrap();
    assert!(!c.fence_signaled(f).unwrap());
    // The reader's work is queued first, behind a wait on a fence nobody signaled yet.
    c.fence_wait(DeviceId::CONSUMER, f).unwrap();
    let s_begin = c
        .submit(
            Opcode::BeginAccess,
            DeviceId::CONSUMER,
            [u64::from(id), 0, size, AccessMode::Read as u64, 0, 0],
        )
        .unwrap();
    let s_sum = c
        .submit(
            Opcode::DeviceCmd,
            DeviceId::CONSUMER,
            [testdev::CHECKSUM, u64::from(id), 0, 0, 0, 0],
        )
        .unwrap();
    // Other devices and the CPU are not held up by that wait.
    c.nop().unwrap();
    let other = c.alloc_blob(4096).unwrap().id;
    c.begin_access(other, DeviceId::PRODUCER, 0, 4096, AccessMode::Write)
        .unwrap();
    assert!(
        !c.fence_signaled(f).unwrap(),
        "nothing signaled the fence yet"
    );
    // Now the write and its signal.
    c.begin_access(id, DeviceId::PRODUCER, 0, size, AccessMode::Write)
        .unwrap();
    let crc = c
        .device_cmd(
            DeviceId::PRODUCER,
            [testdev::WRITE_PATTERN, u64::from(id), 77, 0, 0, 0],
        )
        .unwrap()[0];
    c.end_access(id, DeviceId::PRODUCER, 0, size, AccessMode::Write)
        .unwrap();
    c.fence_signal(DeviceId::PRODUCER, f).unwrap();
    assert_eq!(c.wait(s_begin).unwrap().status, 0);
    let sum = c.wait(s_sum).unwrap();
    assert_eq!(sum.status, 0);
    assert_eq!(
        sum.values[0], crc,
        "the read ran after the write it waited for"
    );
    assert!(c.fence_signaled(f).unwrap(), "the page shows the signal");
    c.fence_release(f).unwrap();
    assert!(c.take_async_errors().is_empty());
}

/// A guest thread blocks on the CPU until a device signals a fence (a HAL's `sync_wait`): it
/// returns signaled once the device's queued work before the signal is done, and unsignaled
/// when its timeout passes first.
#[test]
fn a_cpu_wait_returns_when_the_device_signals() {
    let d = Daemon::start(&[]);
    let c = connect(&d, "write-invalidate");
    let size = 16 << 20;
    let id = c.alloc_blob(size).unwrap().id;
    let never = c.fence_create().unwrap();
    assert!(!c
        .fence_wait_cpu(never, std::time::Duration::from_millis(20))
        .unwrap());
    let f = c.fence_create().unwrap();
    c.begin_access(id, DeviceId::PRODUCER, 0, size, AccessMode::Write)
        .unwrap();
    let s_write = c
        .submit(
            Opcode::DeviceCmd,
            DeviceId::PRODUCER,
            [testdev::WRITE_PATTERN, u64::from(id), 5, 0, 0, 0],
        )
        .unwrap();
    c.fence_signal(DeviceId::PRODUCER, f).unwrap();
    assert!(c
        .fence_wait_cpu(f, std::time::Duration::from_secs(30))
        .unwrap());
    // The signal came after the write: its completion is there (or arriving) already.
    assert!(c.fence_signaled(f).unwrap());
    assert_eq!(c.wait(s_write).unwrap().status, 0);
    c.end_access(id, DeviceId::PRODUCER, 0, size, AccessMode::Write)
        .unwrap();
    c.fence_release(f).unwrap();
    c.fence_release(never).unwrap();
    assert!(c.take_async_errors().is_empty());
}

#[test]
fn fence_misuse_gets_errors() {
    let d = Daemon::start(&[]);
    let a = connect(&d, "write-invalidate");
    let b = connect(&d, "write-invalidate");
    let f = a.fence_create().unwrap();
    let status = |e: GuestError| match e {
        GuestError::Status { status, .. } => status,
        other => panic!("{other}"),
    };
    // Another guest's fence (or any made-up id) is not a fence of b's.
    let junk = b.call(
        Opcode::FenceWait,
        DeviceId::CONSUMER,
        [f.to_u64() ^ 0x5555_0000_0000, 0, 0, 0, 0, 0],
    );
    assert_eq!(status(junk.unwrap_err()), Status::BadArgument);
    let cpu_wait = a.call(
        Opcode::FenceWait,
        DeviceId::CPU,
        [f.to_u64(), 0, 0, 0, 0, 0],
    );
    assert_eq!(
        status(cpu_wait.unwrap_err()),
        Status::BadArgument,
        "the CPU never blocks on a fence"
    );
    let bad_dev = a.call(
        Opcode::FenceSignal,
        DeviceId(42),
        [f.to_u64(), 0, 0, 0, 0, 0],
    );
    assert_eq!(status(bad_dev.unwrap_err()), Status::UnknownDevice);
    // Signaling on the CPU is immediate.
    a.call(
        Opcode::FenceSignal,
        DeviceId::CPU,
        [f.to_u64(), 0, 0, 0, 0, 0],
    )
    .unwrap();
    assert!(a.fence_signaled(f).unwrap());
}

#[test]
fn flow_control_keeps_host_queues_bounded() {
    let d = Daemon::start(&[]);
    let c = connect(&d, "write-invalidate");
    let id = c.alloc_blob(1 << 20).unwrap().id;
    c.begin_access(id, DeviceId::CONSUMER, 0, 1 << 20, AccessMode::Read)
        .unwrap();
    // A guest that submits as fast as it can: 1500 asynchronous checksums, each far slower
    // on the host than a submission.
    let mut windows = Vec::new();
    for _ in 0..1500 {
        c.submit_detached(
            Opcode::DeviceCmd,
            DeviceId::CONSUMER,
            [testdev::CHECKSUM, u64::from(id), 0, 0, 0, 0],
        )
        .unwrap();
        windows.push(c.pacing_window());
    }
    c.drain().unwrap();
    assert!(c.take_async_errors().is_empty());
    // Without pacing the depth would reach the completion ring's 256 entries.
    let depth = c.max_queue_depth();
    assert!(depth > 0, "the host queue was used");
    assert!(
        depth <= 64,
        "MIMD pacing kept the host queue short: {depth}"
    );
    let (lo, hi) = (windows.iter().min().unwrap(), windows.iter().max().unwrap());
    assert!(hi > lo, "the window moved: {lo}..{hi}");
    assert!(
        windows[100..].iter().any(|w| *w < *hi),
        "a backed-up host made the window shrink: {lo}..{hi}"
    );
}

/// Commands parked behind a fence wait hold no credit the guest needs to send the signal
/// that releases them: far more of them than the rings hold, then the signal, all complete.
/// (With the completion ring's slots as credits this hung forever at the ring's size.)
#[test]
fn commands_parked_behind_a_wait_never_deadlock_the_session() {
    let d = Daemon::start(&[]);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let socket = d.socket().to_path_buf();
    std::thread::spawn(move || {
        let c = Connection::connect(
            &socket,
            &ConnectOptions {
                window_size: 16 << 20,
                sq_entries: 64,
                cq_entries: 64,
                ..ConnectOptions::default()
            },
        )
        .expect("connect");
        let id = c.alloc_blob(4096).unwrap().id;
        c.begin_access(id, DeviceId::CONSUMER, 0, 4096, AccessMode::Read)
            .unwrap();
        let f = c.fence_create().unwrap();
        c.fence_wait(DeviceId::CONSUMER, f).unwrap();
        let parked = 300;
        let seqs: Vec<u64> = (0..parked)
            .map(|_| {
                c.submit(
                    Opcode::DeviceCmd,
                    DeviceId::CONSUMER,
                    [testdev::CHECKSUM, u64::from(id), 0, 0, 0, 0],
                )
                .unwrap()
            })
            .collect();
        c.fence_signal(DeviceId::CPU, f).unwrap();
        let ok = seqs
            .iter()
            .filter(|s| c.wait(**s).map(|r| r.status == 0).unwrap_or(false))
            .count();
        c.end_access(id, DeviceId::CONSUMER, 0, 4096, AccessMode::Read)
            .unwrap();
        let _ = done_tx.send((ok, parked));
    });
    let (ok, parked) = done_rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("the session deadlocked: commands parked behind a wait never completed");
    assert_eq!(ok, parked, "every parked command completed");
}

#[test]
fn a_trace_replays_against_every_protocol() {
    let d = Daemon::start(&[]);
    let dir = std::env::temp_dir().join(format!("virtsoc-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.trace");
    let mut t =
        String::from("# t_ms op region device [size]\n0 alloc 1 - 65536\n0 alloc 2 - 65536\n");
    for i in 0..20 {
        let (r, ms) = (1 + i % 2, i as f64 * 2.0);
        t += &format!("{ms} write {r} producer\n{} read {r} consumer\n", ms + 1.0);
    }
    t += "41 write 1 cpu\n42 read 1 consumer2\n43 free 1 -\n43 free 2 -\n";
    std::fs::write(&path, t).unwrap();
    let out = virtsoc(&[
        "bench",
        "svm",
        "--json",
        "--trace",
        path.to_str().unwrap(),
        "--socket",
        d.socket().to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let results = v["protocols"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    for r in results {
        assert_eq!(r["corrupt_frames"], 0, "{r}");
        assert_eq!(r["frames"], 21, "{r}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
