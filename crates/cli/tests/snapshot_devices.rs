//! Device objects in a snapshot, as records of the commands that made them: a guest's open
//! decoder and encoder (their handles work after the restore, and new sessions get new
//! handles), its modem's stored SMS and registration, and its place in the display's
//! foreground, saved on one daemon and restored into a fresh guest of another.

mod common;

use std::time::{Duration, Instant};

use common::{connect, Daemon};
use virtsoc_control::client::{control_path, request, Target};
use virtsoc_guest::devices::modem::{Read, Write};
use virtsoc_guest::devices::{codec, codec_kind};
use virtsoc_guest::{Connection, Format};

fn send(c: &Connection, bytes: &[u8]) {
    for chunk in bytes.chunks(32) {
        let mut w = [0u64; 4];
        for (i, &b) in chunk.iter().enumerate() {
            w[i / 8] |= u64::from(b) << (8 * (i % 8));
        }
        let r = c
            .command(&Write {
                len: chunk.len() as u64,
                b0: w[0],
                b1: w[1],
                b2: w[2],
                b3: w[3],
            })
            .unwrap();
        assert_eq!(r.accepted, chunk.len() as u64);
    }
}

fn read_until(c: &Connection, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = Vec::new();
    loop {
        let r = c.command(&Read {}).unwrap();
        let words = [r.b0, r.b1, r.b2, r.b3, r.b4];
        out.extend((0..r.len as usize).map(|i| (words[i / 8] >> (8 * (i % 8))) as u8));
        let s = String::from_utf8_lossy(&out).into_owned();
        if s.contains(needle) {
            return s;
        }
        assert!(Instant::now() < deadline, "no {needle:?} in {s:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn post(d: &Daemon, path: &str, body: serde_json::Value) -> serde_json::Value {
    let r = request(
        &Target::Unix(control_path(d.socket())),
        "POST",
        path,
        body.to_string().as_bytes(),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{path}: {}", r.body);
    r.json()
}

#[test]
fn decoders_encoders_modem_and_foreground_are_restored() {
    let args = ["--gpu-backend", "null", "--isp-backend", "null"];
    let a = Daemon::start(&args);
    let g = connect(&a);
    let dec = g
        .command(&codec::OpenDecoder {
            kind: codec_kind::H264,
            format: Format::Nv12 as u64,
            threads: 1,
        })
        .unwrap()
        .handle;
    let enc = g
        .command(&codec::OpenEncoder {
            width: 320,
            height: 240,
            fps: 30,
            bitrate: 500_000,
        })
        .unwrap()
        .handle;
    send(&g, b"ATE0\r");
    read_until(&g, "OK");
    post(
        &a,
        "/modem/sms",
        serde_json::json!({ "from": "+15551234", "text": "kept across", "guest": g.guest_id() }),
    );
    read_until(&g, "+CMTI:");
    post(
        &a,
        "/display/foreground",
        serde_json::json!({ "guest": g.guest_id() }),
    );
    let file = std::env::temp_dir().join(format!("virtsoc-snapdev-{}.snap", std::process::id()));
    let run = |args: &[&str]| {
        let out = common::virtsoc_cmd()
            .arg("snapshot")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "save",
        &g.guest_id().to_string(),
        file.to_str().unwrap(),
        "--socket",
        a.socket().to_str().unwrap(),
    ]);

    let b = Daemon::start(&args);
    let h = connect(&b);
    run(&[
        "load",
        file.to_str().unwrap(),
        "--guest",
        &h.guest_id().to_string(),
        "--socket",
        b.socket().to_str().unwrap(),
    ]);
    // The codec sessions are there under their handles (a decoder starts afresh: it decodes
    // from the next key frame on); new sessions get new handles.
    h.command(&codec::Flush { handle: dec }).unwrap();
    let next = h
        .command(&codec::OpenDecoder {
            kind: codec_kind::H264,
            format: Format::Nv12 as u64,
            threads: 1,
        })
        .unwrap()
        .handle;
    assert!(next > dec.max(enc), "{next} after {dec}, {enc}");
    // The modem kept its stored message and its settings (echo off: no echo of the command).
    send(&h, b"AT+CMGF=1\r");
    read_until(&h, "OK");
    send(&h, b"AT+CMGL=\"ALL\"\r");
    let list = read_until(&h, "OK\r\n");
    assert!(
        list.contains("+15551234") && list.contains("kept across"),
        "{list:?}"
    );
    assert!(!list.contains("AT+CMGL"), "echo is off: {list:?}");
    std::fs::remove_file(&file).ok();
}
