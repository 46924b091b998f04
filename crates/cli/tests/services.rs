//! Host services through a real daemon (issue 29): the emulator's services driven from
//! `virtsoc ctl` and read by guests, bulk transfers inline, in place and in packets, the
//! services policy (from a file and changed at run time), and hostile input (forged
//! channels, bad packets, a corrupted ring) that fails only its own channel while another
//! guest process (`virtsoc bench services`) keeps working.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{status_of, virtsoc, Daemon, TempDir};
use virtsoc_guest::services::chan::{flags, kind, Entry};
use virtsoc_guest::services::packet::PacketHeader;
use virtsoc_guest::services::payload::word_sum;
use virtsoc_guest::services::{bulk, Bulk, Clipboard, Geo, Sensors, ServiceChannel};
use virtsoc_guest::{ConnectOptions, Connection, RegionId, Status};

fn guest(d: &Daemon, name: &str) -> Connection {
    Connection::connect(
        d.socket(),
        &ConnectOptions {
            name: name.into(),
            window_size: 64 << 20,
            ..ConnectOptions::default()
        },
    )
    .expect("connect")
}

fn ctl(d: &Daemon, args: &[&str]) -> String {
    let s = d.socket().to_string_lossy().into_owned();
    let mut all = vec!["ctl", "--socket", s.as_str()];
    all.extend_from_slice(args);
    virtsoc(&all)
}

fn daemon(dir: &TempDir) -> Daemon {
    let policy = dir.0.join("services.json");
    std::fs::write(
        &policy,
        r#"{"allow": {"*": ["*"], "jail": ["geo"]}, "instances": {"bulk": "per-guest"},
            "transfer_timeout_ms": 300}"#,
    )
    .unwrap();
    Daemon::start(&["--services-policy", policy.to_str().unwrap()])
}

#[test]
fn emulator_services_follow_the_console() {
    let dir = TempDir::new("services-emu");
    let d = daemon(&dir);
    let c = guest(&d, "phone");

    let mut geo = Geo::open(&c).unwrap();
    assert_eq!(geo.fix().unwrap(), None, "no fix before the host sets one");
    ctl(&d, &["geo", "fix", "-122.084", "37.422", "12"]);
    let f = geo.fix().unwrap().expect("a fix");
    assert_eq!((f.lon, f.lat, f.alt), (-122.084, 37.422, 12.0));
    let nmea = geo.nmea().unwrap();
    assert!(
        nmea.starts_with("$GPGGA,") && nmea.contains("\r\n$GPRMC,"),
        "{nmea}"
    );
    assert!(nmea.contains(",3725.3200,N,12205.0400,W,"), "{nmea}");
    ctl(
        &d,
        &[
            "geo",
            "nmea",
            "$GPGGA,120000.00,4851.0000,N,00221.0000,E,1,08,0.9,35.0,M,0.0,M,,",
        ],
    );
    let f = geo.fix().unwrap().unwrap();
    assert!(
        (f.lat - 48.85).abs() < 1e-9 && (f.lon - 2.35).abs() < 1e-9,
        "{f:?}"
    );
    let track = dir.0.join("t.gpx");
    std::fs::write(
        &track,
        r#"<gpx><trkpt lat="1.5" lon="2.5"><ele>3</ele></trkpt></gpx>"#,
    )
    .unwrap();
    ctl(&d, &["geo", "track", track.to_str().unwrap()]);
    assert_eq!(geo.fix().unwrap().unwrap().lat, 1.5);

    let mut sensors = Sensors::open(&c).unwrap();
    ctl(&d, &["sensor", "set", "accelerometer", "0.5:-1:9.7"]);
    let v = sensors.read("accelerometer").unwrap();
    assert_eq!((v.x, v.y, v.z), (0.5, -1.0, 9.7));
    assert_eq!(sensors.set_rate("accelerometer", 1000).unwrap(), 200);
    let (a, b) = (
        sensors.sample("accelerometer").unwrap(),
        sensors.sample("accelerometer").unwrap(),
    );
    assert!(b.time_ns > a.time_ns);
    assert_eq!(
        status_of(sensors.read("thermometer")),
        Status::BadArgument,
        "unknown sensor"
    );

    let mut clip = Clipboard::open(&c).unwrap();
    ctl(&d, &["clipboard", "set", "from", "the", "host"]);
    assert_eq!(clip.get().unwrap().0, "from the host");
    clip.set("from the guest ✓").unwrap();
    assert!(ctl(&d, &["clipboard", "get"]).contains("from the guest ✓"));
    let listing = ctl(&d, &["services"]);
    assert!(
        listing.contains("\"geo\"") && listing.contains("\"clipboard\""),
        "{listing}"
    );
}

#[test]
fn bulk_transfers_inline_in_place_and_in_packets() {
    let dir = TempDir::new("services-bulk");
    let d = daemon(&dir);
    let c = guest(&d, "bulk");
    let mut b = Bulk::open(&c, 4).unwrap();
    assert_eq!(b.echo(b"ping").unwrap(), b"ping");
    // 1 MiB + 5 in 17 packets, pipelined over the 4 slots, reassembled on the host.
    let big: Vec<u8> = (0..(1 << 20) + 5u32).map(|i| (i % 253) as u8).collect();
    assert_eq!(
        b.sink(&big).unwrap(),
        (crc32fast::hash(&big), big.len() as u64)
    );
    // Streamed (no checksum): the drain takes each packet where it lies in its slot, no
    // buffer on the host; the same answer as the reassembled, checked transfer's.
    let want = (big.len() as u64, word_sum(&big));
    let v = b.0.send(bulk::call::DRAIN, &big).unwrap().values;
    assert_eq!((v[0], v[1]), want);
    let v = b.0.send_checked(bulk::call::DRAIN, &big).unwrap().values;
    assert_eq!((v[0], v[1]), want);
    // In any order; a duplicate is refused; a checksum cannot be checked on bytes not kept.
    let pk = |t: u32, i: u32| PacketHeader::new(t, bulk::call::DRAIN, big.len() as u64, i);
    let bytes = |i: u32| &big[(i as usize) << 16..big.len().min(((i as usize) + 1) << 16)];
    for t in [70, 71] {
        for i in (0..17).rev() {
            b.0.post_packet_with(&pk(t, i), bytes(i), 0, flags::NO_CRC)
                .unwrap();
            b.0.reap().unwrap();
        }
    }
    b.0.post_packet_with(&pk(70, 3), bytes(3), 0, flags::NO_CRC)
        .unwrap();
    let e = b.0.reap().unwrap_err();
    assert!(e.to_string().contains("received twice"), "{e}");
    let v = b.0.commit_with(70, 17, 0, flags::NO_CRC).unwrap().values;
    assert_eq!((v[0], v[1]), want);
    let e = b.0.commit(71, 17, crc32fast::hash(&big)).unwrap_err();
    assert!(e.to_string().contains("no checksum"), "{e}");
    // In place: the service reads the region in the guest's window.
    let r = c.alloc_blob(big.len() as u64).unwrap().id;
    common::cpu_write(&c, r, &big);
    assert_eq!(
        b.sink_region(r, big.len() as u64).unwrap(),
        (crc32fast::hash(&big), big.len() as u64)
    );
    // A region a device wrote last: its window replica is stale until the service's read
    // access brings it up to date.
    let crc = common::producer_write(&c, r, big.len() as u64, 42);
    assert_eq!(
        u64::from(b.sink_region(r, big.len() as u64).unwrap().0),
        crc,
        "the service read the producer's bytes, not the window's stale ones"
    );
    // The service's own access brackets the call: an output region never written from
    // the CPU gets its window replica, and its write is recorded (the consumer device,
    // reading from its own memory, sees it).
    let out = c.alloc_blob(big.len() as u64).unwrap().id;
    let rep =
        b.0.call_region(bulk::call::ECHO, (r, 0, big.len() as u64), Some((out, 0)))
            .unwrap();
    assert_eq!(rep.values[0], big.len() as u64);
    assert_eq!(
        common::consumer_checksum(&c, out, big.len() as u64),
        crc,
        "the producer's bytes, echoed"
    );
    assert_eq!(
        common::cpu_read(&c, out, big.len()),
        common::cpu_read(&c, r, big.len())
    );
    // A range outside the region, and a region that is not the guest's.
    assert_eq!(
        status_of(b.0.call_region(bulk::call::SINK, (r, 1, big.len() as u64), None)),
        Status::BadArgument
    );
    assert_eq!(
        status_of(b.0.call_region(bulk::call::SINK, (RegionId(9999), 0, 1), None)),
        Status::BadArgument
    );
}

#[test]
fn policy_and_hostile_input_fail_only_their_own_channel() {
    let dir = TempDir::new("services-bad");
    let d = daemon(&dir);
    // Another guest process streams through its own channels all along.
    let sock = d.socket().to_string_lossy().into_owned();
    let other = common::virtsoc_cmd()
        .args(["bench", "services", "--socket", &sock, "--channels", "2"])
        .args([
            "--size",
            "1048576",
            "--reps",
            "20",
            "--round-trips",
            "200",
            "--rounds",
            "2",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start virtsoc bench services");

    let jail = guest(&d, "jail");
    assert_eq!(
        status_of(Bulk::open(&jail, 1)),
        Status::PermissionDenied,
        "the policy file keeps jail to geo"
    );
    assert_eq!(
        status_of(ServiceChannel::open(&jail, "no-such")),
        Status::NotSupported
    );
    let mut jail_geo = Geo::open(&jail).unwrap();

    let c = guest(&d, "victim");
    let mut b = Bulk::open(&c, 2).unwrap();
    let mut spare = Bulk::open(&c, 1).unwrap();
    // A forged channel id: the jail closes the victim's channel.
    let forged = jail.command(&virtsoc_guest::devices::service::Close { channel: b.0.id() });
    assert_eq!(status_of(forged), Status::BadArgument);

    let data = vec![7u8; 3 * 65536];
    let pk = |i: u32| PacketHeader::new(9, bulk::call::SINK, data.len() as u64, i);
    // Duplicate packet.
    b.0.post_packet(&pk(0), &data[..65536], 0).unwrap();
    b.0.reap().unwrap();
    b.0.post_packet(&pk(0), &data[..65536], 0).unwrap();
    let e = b.0.reap().unwrap_err();
    assert!(e.to_string().contains("received twice"), "{e}");
    // Overlapping packet (a length its index does not allow), and a bad slot.
    let mut long = pk(1);
    long.len += 1;
    b.0.post_packet(&long, &data[..65536], 1).unwrap();
    let e = b.0.reap().unwrap_err();
    assert!(e.to_string().contains("overlaps"), "{e}");
    let bad_slot = b.0.raw(Entry {
        code: kind::CALL,
        call: bulk::call::ECHO,
        slot: 77,
        len: 4,
        ..Entry::default()
    });
    assert!(bad_slot.map(|r| r.code).unwrap_or(1) != 0);
    // A commit whose counts do not add up: packet 2 never sent.
    b.0.post_packet(&pk(1), &data[..65536], 1).unwrap();
    b.0.reap().unwrap();
    let e = b.0.commit(9, 3, crc32fast::hash(&data)).unwrap_err();
    assert!(e.to_string().contains("missing [2]"), "{e}");
    // A transfer that never finishes: dropped after the policy's 300 ms without a packet.
    b.0.post_packet(&pk(0), &data[..65536], 0).unwrap();
    b.0.reap().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let e = b.0.commit(9, 3, crc32fast::hash(&data)).unwrap_err();
    assert!(e.to_string().contains("timed out"), "{e}");
    // An unknown request kind and a commit of a transfer never opened.
    let r = b.0.raw(Entry {
        code: 99,
        ..Entry::default()
    });
    assert_eq!(r.unwrap().code, Status::BadArgument as u32);
    assert_eq!(status_of(b.0.commit(12345, 1, 0)), Status::BadArgument);
    // The channel still works after all that.
    assert_eq!(b.echo(b"still here").unwrap(), b"still here");

    // A corrupted ring index closes that channel only.
    let w = c.window();
    w.atomic_u32(b.0.base() + 16)
        .unwrap()
        .store(1000, Ordering::SeqCst);
    w.atomic_u32(b.0.base() + 32)
        .unwrap()
        .fetch_add(1, Ordering::SeqCst);
    let _ = rustix::thread::futex::wake(
        w.atomic_u32(b.0.base() + 32).unwrap(),
        rustix::thread::futex::Flags::empty(),
        1,
    );
    let e = b.0.reap().unwrap_err();
    assert!(e.to_string().contains("closed"), "{e}");
    assert!(b.echo(b"x").is_err(), "the corrupted channel stays closed");
    assert_eq!(spare.echo(b"spare").unwrap(), b"spare");
    assert!(jail_geo.fix().is_ok());

    // A slow call holds up only its own channel: a sample at 1 Hz waits, other calls go on.
    let mut slow = Sensors::open(&c).unwrap();
    slow.set_rate("light", 1).unwrap();
    slow.sample("light").unwrap();
    let done = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        let done2 = done.clone();
        s.spawn(move || {
            slow.sample("light").unwrap();
            done2.store(true, Ordering::SeqCst);
        });
        for _ in 0..20 {
            assert_eq!(spare.echo(b"go").unwrap(), b"go");
        }
        assert!(!done.load(Ordering::SeqCst), "echoes waited for the sample");
    });

    // The policy changes at run time: the victim loses bulk at its next call.
    ctl(
        &d,
        &[
            "services",
            "policy",
            r#"{"allow": {"*": ["geo"], "bench-services": ["*"]}}"#,
        ],
    );
    assert_eq!(status_of(spare.echo(b"denied")), Status::PermissionDenied);
    assert!(jail_geo.fix().is_ok());
    ctl(&d, &["services", "policy", "reload"]);
    assert_eq!(spare.echo(b"back").unwrap(), b"back");

    // The other guest process finished its run with every transfer checked.
    let out = other
        .wait_with_output()
        .expect("run virtsoc bench services");
    assert!(
        out.status.success(),
        "bench services failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(
        rows.len(),
        10,
        "service (region, stream) and 3 other kinds x 1..=2 channels"
    );
    for r in rows {
        assert!(r["bandwidth_gbps"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["rounds_gbps"].as_array().unwrap().len(), 2, "{r}");
        assert!(r["rtt_us"]["p50"].as_f64().unwrap() > 0.0, "{r}");
        assert!(["service", "ring", "unix-socket", "tcp-loopback"]
            .contains(&r["channel"].as_str().unwrap()));
    }
}

#[test]
fn transfers_count_against_the_guests_memory_limit() {
    let d = Daemon::start(&["--guest-mem-limit", "8388608"]);
    let c = guest(&d, "small");
    let mut b = Bulk::open(&c, 4).unwrap();
    let big = vec![1u8; 12 << 20];
    assert_eq!(
        status_of(b.sink(&big)),
        Status::OutOfMemory,
        "a transfer larger than the guest's memory limit"
    );
    // Refused and revoked: its memory came back, a transfer within the limit goes through.
    let ok = vec![2u8; 3 << 20];
    assert_eq!(
        b.sink(&ok).unwrap(),
        (crc32fast::hash(&ok), ok.len() as u64)
    );
    assert_eq!(b.sink(&ok).unwrap().1, ok.len() as u64, "and again");
    // A drain takes its packets where they lie: the same 12 MiB, over the limit once
    // reassembled, goes through streamed; with a checksum it is buffered, and refused.
    let v = b.0.send(bulk::call::DRAIN, &big).unwrap().values;
    assert_eq!((v[0], v[1]), (big.len() as u64, word_sum(&big)));
    assert_eq!(
        status_of(b.0.send_checked(bulk::call::DRAIN, &big)),
        Status::OutOfMemory
    );
}

#[test]
fn a_short_soak_checks_every_transfer_and_count() {
    let d = Daemon::start(&[]);
    let sock = d.socket().to_string_lossy().into_owned();
    let out = common::virtsoc_cmd()
        .args(["bench", "services", "--socket", &sock, "--soak", "2"])
        .args(["--guests", "3", "--channels", "2", "--size", "3000000"])
        .output()
        .expect("run the soak");
    assert!(
        out.status.success(),
        "soak failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (r["mismatches"].as_u64(), r["count_errors"].as_u64()),
        (Some(0), Some(0))
    );
    let (n, in_place) = (
        r["transfers"].as_u64().unwrap(),
        r["region_transfers"].as_u64().unwrap(),
    );
    assert!(
        n >= 6 && in_place > 0 && in_place < n,
        "both ways, in turn: {r}"
    );
}
