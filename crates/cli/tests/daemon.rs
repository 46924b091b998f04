//! Integration tests: a real daemon process, real guest processes (the test process and
//! `virtsoc` child processes), real sockets and shared memory.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::atomic::Ordering;

use common::{virtsoc, Daemon};
use virtsoc_guest::{
    testdev, AccessMode, ConnectOptions, Connection, DeviceId, Format, GuestError, Opcode,
    RegionId, Status,
};
use virtsoc_proto::ring::{Doorbell, FutexDoorbell};
use virtsoc_proto::window_layout::{ctl, CONTROL_OFFSET};
use virtsoc_proto::Request;

fn connect(d: &Daemon, coherence: Option<&str>) -> Connection {
    Connection::connect(
        d.socket(),
        &ConnectOptions {
            window_size: 64 << 20,
            coherence: coherence.map(str::to_string),
            ..ConnectOptions::default()
        },
    )
    .expect("connect")
}

fn status_of(e: GuestError) -> Status {
    match e {
        GuestError::Status { status, .. } => status,
        other => panic!("expected a status error, got {other}"),
    }
}

/// One producer -> consumer frame; returns (producer crc, consumer crc).
fn frame(c: &Connection, id: RegionId, size: u64, seed: u64) -> (u64, u64) {
    let w = common::producer_write(c, id, size, seed);
    (w, common::consumer_checksum(c, id, size))
}

#[test]
fn both_protocols_deliver_the_last_write() {
    let d = Daemon::start(&[]);
    for proto in ["guest-staging", "write-invalidate"] {
        let c = connect(&d, Some(proto));
        assert_eq!(c.coherence(), proto);
        let ids: Vec<RegionId> = (0..3).map(|_| c.alloc_blob(300_001).unwrap().id).collect();
        for seed in 0..12u64 {
            let id = ids[seed as usize % 3];
            let (w, r) = frame(&c, id, 300_001, seed);
            assert_eq!(w, r, "{proto}: frame {seed} read stale data");
        }
        // The CPU sees the device's last write too.
        let (w, _) = frame(&c, ids[0], 300_001, 99);
        let a = c
            .begin_access(ids[0], DeviceId::CPU, 0, 300_001, AccessMode::Read)
            .unwrap();
        // SAFETY: the window maps the accessed bytes while the CPU access lasts.
        let bytes = unsafe { std::slice::from_raw_parts(a.ptr.unwrap().as_ptr(), 300_001) };
        assert_eq!(crc32fast::hash(bytes) as u64, w, "{proto}: CPU read");
        c.end_access(ids[0], DeviceId::CPU, 0, 300_001, AccessMode::Read)
            .unwrap();
    }
}

#[test]
fn cpu_writes_reach_the_consumer_device() {
    let d = Daemon::start(&[]);
    for proto in ["guest-staging", "write-invalidate"] {
        let c = connect(&d, Some(proto));
        let r = c.alloc(0, 64, 32, Format::Rgba8, 0).unwrap();
        assert_eq!((r.size, r.stride), (64 * 32 * 4, 256));
        let a = c
            .begin_access(r.id, DeviceId::CPU, 0, r.size, AccessMode::Write)
            .unwrap();
        // SAFETY: the window maps the accessed bytes while the CPU access lasts.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(a.ptr.unwrap().as_ptr(), r.size as usize) };
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        let want = crc32fast::hash(bytes) as u64;
        c.end_access(r.id, DeviceId::CPU, 0, r.size, AccessMode::Write)
            .unwrap();
        c.begin_access(r.id, DeviceId::CONSUMER, 0, r.size, AccessMode::Read)
            .unwrap();
        let got = c
            .device_cmd(
                DeviceId::CONSUMER,
                [testdev::CHECKSUM, u64::from(r.id), 0, 0, 0, 0],
            )
            .unwrap()[0];
        assert_eq!(got, want, "{proto}");
    }
}

#[test]
fn guests_cannot_touch_each_others_regions() {
    let d = Daemon::start(&[]);
    let a = connect(&d, None);
    let b = connect(&d, None);
    assert_ne!(a.guest_id(), b.guest_id());
    let id = a.alloc_blob(4096).unwrap().id;
    frame(&a, id, 4096, 1);
    let e = |r: Result<_, GuestError>| status_of(r.expect_err("must fail"));
    assert_eq!(
        e(b.begin_access(id, DeviceId::CPU, 0, 4096, AccessMode::Read)
            .map(|_| ())),
        Status::NoSuchRegion
    );
    assert_eq!(
        e(
            b.begin_access(id, DeviceId::CONSUMER, 0, 4096, AccessMode::Read)
                .map(|_| ())
        ),
        Status::NoSuchRegion
    );
    assert_eq!(
        e(b.device_cmd(
            DeviceId::CONSUMER,
            [testdev::CHECKSUM, u64::from(id), 0, 0, 0, 0]
        )
        .map(|_| ())),
        Status::NoSuchRegion
    );
    assert_eq!(e(b.free(id)), Status::NoSuchRegion);
    // A's region is untouched and still usable.
    let (w, r) = frame(&a, id, 4096, 2);
    assert_eq!(w, r);
    a.free(id).unwrap();
}

#[test]
fn malformed_requests_get_errors_and_the_daemon_survives() {
    let mut d = Daemon::start(&[]);
    let c = connect(&d, None);
    let region = c.alloc_blob(8192).unwrap().id;
    // The raw requests name it by its wire word.
    let id = u64::from(region);
    let raw = |op: u32, dev: u32, args: [u64; 6]| -> u32 {
        let seq = 1_000_000 + op as u64 * 100 + dev as u64;
        c.submit_raw(Request {
            seq,
            opcode: op,
            device: dev,
            args,
        })
        .unwrap();
        c.wait(seq).unwrap().status
    };
    let st = |s: Status| s as u32;
    assert_eq!(raw(77, 0, [0; 6]), st(Status::UnknownOpcode));
    assert_eq!(
        raw(Opcode::DeviceCmd as u32, 99, [1, id, 0, 0, 0, 0]),
        st(Status::UnknownDevice)
    );
    assert_eq!(
        raw(Opcode::BeginAccess as u32, 99, [id, 0, 8192, 1, 0, 0]),
        st(Status::UnknownDevice)
    );
    assert_eq!(
        raw(Opcode::BeginAccess as u32, 0, [id, 0, 8192, 9, 0, 0]),
        st(Status::BadArgument)
    );
    assert_eq!(
        raw(Opcode::BeginAccess as u32, 1, [id, 0, u64::MAX, 1, 0, 0]),
        st(Status::OutOfRange)
    );
    assert_eq!(
        raw(
            Opcode::BeginAccess as u32,
            0,
            [id, u64::MAX - 1, 4, 1, 0, 0]
        ),
        st(Status::OutOfRange)
    );
    assert_eq!(
        raw(Opcode::EndAccess as u32, 2, [id, 8192, 1, 1, 0, 0]),
        st(Status::OutOfRange)
    );
    assert_eq!(
        raw(Opcode::Alloc as u32, 0, [0, 0, 0, 0, 0, 0]),
        st(Status::BadArgument)
    );
    assert_eq!(
        raw(Opcode::Alloc as u32, 0, [u64::MAX, 0, 0, 0, 0, 0]),
        st(Status::BadArgument)
    );
    assert_eq!(
        raw(Opcode::Alloc as u32, 0, [0, 1 << 40, 1, 1, 0, 0]),
        st(Status::BadArgument)
    );
    assert_eq!(
        raw(Opcode::Alloc as u32, 0, [0, 10, 10, 77, 0, 0]),
        st(Status::BadArgument)
    );
    assert_eq!(
        raw(Opcode::Free as u32, 0, [u64::MAX, 0, 0, 0, 0, 0]),
        st(Status::NoSuchRegion)
    );
    assert_eq!(
        raw(Opcode::DeviceCmd as u32, 1, [55, id, 0, 0, 0, 0]),
        st(Status::UnknownOpcode)
    );
    // A device command on a region the device never began accessing.
    assert_eq!(
        raw(
            Opcode::DeviceCmd as u32,
            2,
            [testdev::CHECKSUM, id, 0, 0, 0, 0]
        ),
        st(Status::BadArgument)
    );
    // An allocation bigger than the guest's memory limit is refused up front, cleanly.
    assert_eq!(
        status_of(c.alloc_blob(1 << 34).unwrap_err()),
        Status::OutOfMemory
    );
    // The session still works after all that.
    let (w, r) = frame(&c, region, 8192, 3);
    assert_eq!(w, r);

    // Now corrupt the ring itself: the daemon drops this guest, and only this guest.
    let other = connect(&d, None);
    c.window()
        .atomic_u32(CONTROL_OFFSET + ctl::SQ_TAIL)
        .unwrap()
        .fetch_add(100_000, Ordering::SeqCst);
    // Wake the host so it looks at the ring.
    FutexDoorbell::host_bell(&c.window(), 0).force_wake();
    d.expect_log("violated the transport protocol");
    assert!(matches!(c.nop(), Err(GuestError::Closed)));
    let oid = other.alloc_blob(4096).unwrap().id;
    let (w, r) = frame(&other, oid, 4096, 4);
    assert_eq!(w, r);
    assert!(d.alive());
}

#[test]
fn a_crashed_guest_is_cleaned_up_and_the_next_guest_is_served() {
    let mut d = Daemon::start(&[]);
    let mut guest = common::virtsoc_cmd()
        .args([
            "debug",
            "hold",
            "--regions",
            "4",
            "--size",
            "1048576",
            "--socket",
        ])
        .arg(d.socket())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(guest.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let gid: u64 = line
        .trim()
        .strip_prefix("READY ")
        .expect("guest ready")
        .parse()
        .unwrap();
    // Mid-frame: accesses begun, never ended. Kill it hard.
    guest.kill().unwrap();
    guest.wait().unwrap();
    let l = d.expect_log(&format!("guest {gid} "));
    let l = if l.contains("gone") {
        l
    } else {
        d.expect_log(&format!("guest {gid} "))
    };
    assert!(l.contains("released 4 regions"), "{l}");
    let c = connect(&d, None);
    assert_eq!(c.usage().unwrap(), (0, 0));
    let id = c.alloc_blob(1 << 20).unwrap().id;
    let (w, r) = frame(&c, id, 1 << 20, 5);
    assert_eq!(w, r);
    assert!(d.alive());
}

#[test]
fn a_guest_that_disconnects_releases_its_memory() {
    let d = Daemon::start(&[]);
    let c = connect(&d, None);
    let id = c.alloc_blob(1 << 20).unwrap().id;
    frame(&c, id, 1 << 20, 1);
    let (regions, bytes) = c.usage().unwrap();
    assert_eq!(regions, 1);
    assert_eq!(bytes, 2 << 20, "producer and consumer replicas");
    let gid = c.guest_id();
    drop(c);
    let l = d.expect_log(&format!("guest {gid} ("));
    let l = if l.contains("gone") {
        l
    } else {
        d.expect_log(&format!("guest {gid} ("))
    };
    assert!(l.contains("released 1 regions"), "{l}");
}

#[test]
fn many_guest_processes_at_once() {
    let d = Daemon::start(&[]);
    let sock = d.socket().to_str().unwrap().to_string();
    let kids: Vec<_> = ["guest-staging", "write-invalidate", "guest-staging"]
        .iter()
        .map(|p| {
            common::virtsoc_cmd()
                .args([
                    "bench",
                    "svm",
                    "--json",
                    "--frames",
                    "15",
                    "--warmup",
                    "2",
                    "--size",
                    "524288",
                    "--slack-ms",
                    "1",
                    "--protocol",
                    p,
                    "--socket",
                    &sock,
                ])
                .output()
                .unwrap()
        })
        .collect();
    for k in kids {
        assert!(k.status.success(), "{}", String::from_utf8_lossy(&k.stderr));
        let v: serde_json::Value = serde_json::from_slice(&k.stdout).unwrap();
        assert_eq!(v["protocols"][0]["corrupt_frames"], 0);
        assert_eq!(v["protocols"][0]["frames"], 15);
    }
}

#[test]
fn threads_of_one_guest_share_a_connection() {
    let d = Daemon::start(&[]);
    let c = connect(&d, Some("write-invalidate"));
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let c = &c;
            s.spawn(move || {
                let id = c.alloc_blob(65536).unwrap().id;
                for i in 0..25 {
                    let (w, r) = frame(c, id, 65536, t * 1000 + i);
                    assert_eq!(w, r);
                }
                c.free(id).unwrap();
            });
        }
    });
    assert_eq!(c.usage().unwrap().0, 0);
}

#[test]
fn bench_svm_reports_copies_per_protocol() {
    let d = Daemon::start(&[]);
    let out = virtsoc(&[
        "bench",
        "svm",
        "--json",
        "--frames",
        "10",
        "--warmup",
        "2",
        "--size",
        "1048576",
        "--slack-ms",
        "2",
        "--socket",
        d.socket().to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let p = v["protocols"].as_array().unwrap();
    assert_eq!(p.len(), 3);
    assert_eq!(p[0]["protocol"], "guest-staging");
    assert_eq!(p[0]["copies_per_frame"], 2.0);
    assert_eq!(p[1]["protocol"], "write-invalidate");
    assert_eq!(p[1]["copies_per_frame"], 1.0);
    assert_eq!(p[2]["protocol"], "prefetch");
    assert_eq!(p[2]["copies_per_frame"], 1.0);
    for x in p {
        assert_eq!(x["corrupt_frames"], 0);
        assert!(
            x["access_latency_us"]["p99"].as_f64().unwrap()
                >= x["access_latency_us"]["p50"].as_f64().unwrap()
        );
    }
    assert!(v["machine_memcpy_ms"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_transport_measures_three_channels() {
    let d = Daemon::start(&[]);
    let out = virtsoc(&[
        "bench",
        "transport",
        "--json",
        "--round-trips",
        "200",
        "--size",
        "1048576",
        "--reps",
        "3",
        "--socket",
        d.socket().to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = v["channels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["channel"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["shm-ring (process guest)", "unix-socket", "tcp-loopback"]
    );
    for c in v["channels"].as_array().unwrap() {
        assert!(c["bandwidth_gbps"].as_f64().unwrap() > 0.0);
        assert!(c["rtt_us"]["p50"].as_f64().unwrap() > 0.0);
        // Every row pays both stages, the socket rows too: a landing and a device read.
        assert!(c["landing_gbps"].as_f64().unwrap() >= c["bandwidth_gbps"].as_f64().unwrap());
        assert!(
            c["bulk_stages"]["device_read_ms"].as_f64().unwrap() > 0.0,
            "{c}"
        );
    }
}

#[test]
fn refused_handshakes_are_clear() {
    let d = Daemon::start(&[]);
    let e = Connection::connect(
        d.socket(),
        &ConnectOptions {
            coherence: Some("telepathy".into()),
            ..ConnectOptions::default()
        },
    )
    .err()
    .unwrap();
    assert!(
        matches!(&e, GuestError::Refused(r) if r.contains("telepathy")),
        "{e}"
    );
    let e = Connection::connect("/nonexistent/virtsoc.sock", &ConnectOptions::default())
        .err()
        .unwrap();
    assert!(matches!(e, GuestError::Connect { .. }));
    // Garbage instead of a hello: refused, daemon fine.
    let mut s = std::os::unix::net::UnixStream::connect(d.socket()).unwrap();
    use std::io::Write;
    s.write_all(&[5, 0, 0, 0, b'h', b'e', b'l', b'l', b'o'])
        .unwrap();
    let (reply, _): (virtsoc_proto::handshake::Reply, _) =
        virtsoc_proto::handshake::recv_json(&s).unwrap();
    assert!(matches!(
        reply,
        virtsoc_proto::handshake::Reply::Refused { .. }
    ));
    connect(&d, None).nop().unwrap();
}

#[test]
fn sigterm_shuts_down_cleanly_and_guests_see_it() {
    let mut d = Daemon::start(&[]);
    let c = connect(&d, None);
    c.alloc_blob(4096).unwrap();
    let status = d.terminate();
    assert!(status.success(), "{status:?}");
    assert!(!d.socket().exists(), "socket removed");
    assert!(matches!(c.nop(), Err(GuestError::Closed)));
}
