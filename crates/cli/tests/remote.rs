//! Remote guests over TCP: the same API with the bytes in the stream, and authentication.

mod common;

use common::Daemon;
use virtsoc_guest::{AccessMode, ConnectOptions, Connection, DeviceId, GuestError};

const TOKEN: &str = "0123456789abcdef-remote-test";

fn daemon_with_tcp(test: &str) -> (Daemon, std::path::PathBuf) {
    let f = std::env::temp_dir().join(format!("virtsoc-token-{}-{test}", std::process::id()));
    std::fs::write(&f, format!("{TOKEN}\n")).unwrap();
    let d = Daemon::start(&[
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        f.to_str().unwrap(),
    ]);
    (d, f)
}

fn opts(token: Option<&str>) -> ConnectOptions {
    ConnectOptions {
        token: token.map(str::to_string),
        window_size: 32 << 20,
        ..ConnectOptions::default()
    }
}

#[test]
fn a_remote_guest_uses_the_same_api() {
    let (d, f) = daemon_with_tcp("api");
    let target = format!("tcp:{}", d.tcp.as_ref().unwrap());
    for proto in ["guest-staging", "write-invalidate", "prefetch"] {
        let c = Connection::open(
            &target,
            &ConnectOptions {
                coherence: Some(proto.into()),
                ..opts(Some(TOKEN))
            },
        )
        .unwrap();
        let size = 300_000u64;
        let id = c.alloc_blob(size).unwrap().id;
        // CPU write: the bytes travel in the stream to the host's copy of the window.
        let a = c
            .begin_access(id, DeviceId::CPU, 0, size, AccessMode::Write)
            .unwrap();
        // SAFETY: the window maps the accessed bytes while the CPU access lasts.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(a.ptr.unwrap().as_ptr(), size as usize) };
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let want = crc32fast::hash(bytes) as u64;
        c.end_access(id, DeviceId::CPU, 0, size, AccessMode::Write)
            .unwrap();
        let got = common::consumer_checksum(&c, id, size);
        assert_eq!(got, want, "{proto}: the device saw the remote CPU's bytes");
        // Device write, CPU read: the bytes come back in the stream.
        let crc = common::producer_write(&c, id, size, 9);
        let a = c
            .begin_access(id, DeviceId::CPU, 0, size, AccessMode::Read)
            .unwrap();
        // SAFETY: the window maps the accessed bytes while the CPU access lasts.
        let bytes = unsafe { std::slice::from_raw_parts(a.ptr.unwrap().as_ptr(), size as usize) };
        assert_eq!(
            crc32fast::hash(bytes) as u64,
            crc,
            "{proto}: the remote CPU read the device's bytes"
        );
        // A partial read of the middle.
        let a = c
            .begin_access(id, DeviceId::CPU, 1000, 10, AccessMode::Read)
            .unwrap();
        // SAFETY: the window maps the accessed bytes while the CPU access lasts.
        let part = unsafe { std::slice::from_raw_parts(a.ptr.unwrap().as_ptr(), 10) };
        assert_eq!(part, &bytes[1000..1010]);
        // Fences work too (status by round trip).
        let fence = c.fence_create().unwrap();
        c.fence_signal(DeviceId::PRODUCER, fence).unwrap();
        c.nop().unwrap();
        c.free(id).unwrap();
    }
    std::fs::remove_file(f).unwrap();
}

#[test]
fn wrong_or_missing_tokens_are_refused_before_anything_is_allocated() {
    let (d, f) = daemon_with_tcp("auth");
    let target = format!("tcp:{}", d.tcp.as_ref().unwrap());
    for bad in [Some("0123456789abcdef-remote-tesT"), Some(""), None] {
        let e = Connection::open(&target, &opts(bad))
            .err()
            .expect("must be refused");
        assert!(
            matches!(&e, GuestError::Refused(r) if r.contains("token")),
            "{e}"
        );
        d.expect_log("bad or missing token");
    }
    // No guest was admitted: the first good guest gets id 1.
    let c = Connection::open(&target, &opts(Some(TOKEN))).unwrap();
    assert_eq!(c.guest_id(), 1);
    std::fs::remove_file(f).unwrap();
}

#[test]
fn tcp_without_a_token_does_not_start() {
    let out = std::process::Command::new(common::virtsocd())
        .args([
            "--socket",
            "/tmp/virtsoc-notoken.sock",
            "--listen",
            "127.0.0.1:0",
        ])
        .env_remove("VIRTSOC_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("token"));
}

#[test]
fn a_remote_guest_that_vanishes_is_cleaned_up() {
    let (d, f) = daemon_with_tcp("vanish");
    let target = format!("tcp:{}", d.tcp.as_ref().unwrap());
    let c = Connection::open(&target, &opts(Some(TOKEN))).unwrap();
    let id = c.alloc_blob(1 << 20).unwrap().id;
    c.begin_access(id, DeviceId::PRODUCER, 0, 1 << 20, AccessMode::Write)
        .unwrap();
    let gid = c.guest_id();
    drop(c);
    let l = d.expect_log(&format!("guest {gid} ("));
    let l = if l.contains("gone") {
        l
    } else {
        d.expect_log(&format!("guest {gid} ("))
    };
    assert!(l.contains("released 1 regions"), "{l}");
    std::fs::remove_file(f).unwrap();
}

/// The bytes of a remote guest's CPU write go off the socket straight into the region (the
/// host's copy of its window): the daemon buffers none of them, so a write the guest's
/// limit leaves no room to buffer still lands, whole. (Bytes the daemon must buffer - a
/// frame it cannot place - count against the limit: `link::stream`'s tests.) Other guests
/// go on.
#[test]
fn a_remote_guests_writes_go_straight_into_its_regions() {
    let f = std::env::temp_dir().join(format!("virtsoc-token-{}-charge", std::process::id()));
    std::fs::write(&f, format!("{TOKEN}\n")).unwrap();
    let d = Daemon::start(&[
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        f.to_str().unwrap(),
        "--guest-mem-limit",
        &(48u64 << 20).to_string(),
    ]);
    let addr = d.tcp.clone().expect("tcp address");
    let remote = Connection::connect_tcp(
        &addr,
        &ConnectOptions {
            window_size: 64 << 20,
            ..opts(Some(TOKEN))
        },
    )
    .expect("remote guest");
    // 24 MiB written in one access: 24 MiB buffered, within 48.
    let len = 24u64 << 20;
    let r = remote.alloc_blob(len).unwrap().id;
    common::cpu_write(&remote, r, &vec![7u8; len as usize]);
    assert_eq!(common::cpu_read(&remote, r, 16), vec![7u8; 16]);
    // A decoder's worker process is charged 32 MiB: buffering the same write would make the
    // daemon hold 56 MiB for a guest limited to 48.
    remote
        .command(&virtsoc_guest::devices::codec::OpenDecoder {
            kind: virtsoc_guest::devices::codec_kind::H264,
            format: virtsoc_guest::Format::Nv12 as u64,
            threads: 1,
        })
        .expect("a decoder within the limit");
    let a = remote
        .begin_access(r, DeviceId::CPU, 0, len, AccessMode::Write)
        .unwrap();
    // SAFETY: the pointer covers `len` bytes of the guest's copy until end_access.
    unsafe { std::ptr::write_bytes(a.ptr.unwrap().as_ptr(), 9, len as usize) };
    remote
        .end_access(r, DeviceId::CPU, 0, len, AccessMode::Write)
        .expect("nothing buffered: the write lands at the limit");
    assert_eq!(common::cpu_read(&remote, r, 16), vec![9u8; 16]);
    // A local guest is unaffected.
    let local = common::connect(&d);
    let r = local.alloc_blob(4096).unwrap().id;
    common::cpu_write(&local, r, b"fine");
    assert_eq!(common::cpu_read(&local, r, 4), b"fine");
    let _ = std::fs::remove_file(f);
}

/// `Connection::write` on a remote guest sends the caller's bytes without touching its copy
/// of the window: a device and a later CPU read see them all the same, a partial write
/// after it keeps the rest, and a process guest's write (a copy into the shared window)
/// reads back the same.
#[test]
fn a_write_from_a_buffer_reaches_devices_and_later_reads() {
    let (d, f) = daemon_with_tcp("write");
    let target = format!("tcp:{}", d.tcp.as_ref().unwrap());
    let remote = Connection::open(&target, &opts(Some(TOKEN))).unwrap();
    let local = common::connect(&d);
    let size = 1_000_003u64;
    let bytes: Vec<u8> = (0..size).map(|i| (i * 7 % 253) as u8).collect();
    for c in [&remote, &local] {
        let id = c.alloc_blob(size).unwrap().id;
        c.write(id, 0, &bytes).unwrap();
        assert_eq!(
            common::consumer_checksum(c, id, size),
            crc32fast::hash(&bytes) as u64,
            "the device saw the written bytes"
        );
        assert!(common::cpu_read(c, id, size as usize) == bytes);
        c.write(id, 500, b"middle").unwrap();
        let mut want = bytes.clone();
        want[500..506].copy_from_slice(b"middle");
        assert!(common::cpu_read(c, id, size as usize) == want);
        assert!(
            c.write(id, size - 2, b"past").is_err(),
            "a range past the end"
        );
    }
    std::fs::remove_file(f).unwrap();
}

/// Posted writes (`Connection::write_posted`) from a remote and a process guest: the first
/// asks where the region lies, later ones are one request each, queued without waiting; a
/// device and a CPU read see each in turn. Once a device has written the region, a posted
/// write is refused (an async error, nothing published: a read still sees the device's
/// bytes) until the CPU writes it again the ordinary way.
#[test]
fn posted_writes_reach_devices_and_are_refused_after_a_device_wrote() {
    let (d, f) = daemon_with_tcp("posted");
    let target = format!("tcp:{}", d.tcp.as_ref().unwrap());
    let remote = Connection::open(&target, &opts(Some(TOKEN))).unwrap();
    let local = common::connect(&d);
    let size = 70_000u64;
    for (c, who) in [(&remote, "remote"), (&local, "process")] {
        let id = c.alloc_blob(size).unwrap().id;
        for seed in 1..5u8 {
            let bytes: Vec<u8> = (0..size).map(|i| (i as u8).wrapping_mul(seed)).collect();
            c.write_posted(id, 0, &bytes).unwrap();
            let want = crc32fast::hash(&bytes) as u64;
            assert_eq!(common::consumer_checksum(c, id, size), want, "{who} {seed}");
            assert_eq!(common::cpu_read(c, id, 16), bytes[..16], "{who} {seed}");
        }
        assert!(c.take_async_errors().is_empty(), "{who}");
        // A device writes the region: the next posted write is refused.
        common::producer_write(c, id, size, 3);
        let device = common::cpu_read(c, id, 16);
        c.write_posted(id, 0, &vec![0xEE; size as usize]).unwrap();
        c.drain().unwrap();
        let refused = c.take_async_errors();
        assert_eq!(refused.len(), 1, "{who}: {refused:?}");
        assert_eq!(refused[0].1, virtsoc_guest::Status::BadArgument, "{who}");
        assert_eq!(
            common::cpu_read(c, id, 16),
            device,
            "{who}: nothing published"
        );
        c.write(id, 0, &vec![0x11; size as usize]).unwrap();
        c.write_posted(id, 0, &vec![0x22; size as usize]).unwrap();
        assert_eq!(common::cpu_read(c, id, 16), vec![0x22; 16], "{who}");
        assert!(c.take_async_errors().is_empty(), "{who}");
    }
    std::fs::remove_file(f).unwrap();
}
