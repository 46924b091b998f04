//! VM guests under QEMU (TCG): the guest library inside a real VM reaches the host daemon
//! (its devices and its host services) through an ivshmem BAR and a virtio-serial port. Skipped, loudly, only when QEMU is absent.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use common::{build_guest_image, qemu_present, Daemon};
use virtsoc_guest::{testdev, AccessMode, ConnectOptions, Connection, DeviceId};

/// Builds (once per test binary) the guest image holding this build's `virtsoc`.
fn image() -> &'static PathBuf {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| build_guest_image("vm-image-test"))
}

fn vm_daemon(tag: &str) -> (Daemon, PathBuf, PathBuf) {
    let dir = std::env::temp_dir();
    let shm = dir.join(format!("virtsoc-it-vm-{}-{tag}.shm", std::process::id()));
    let sock = dir.join(format!("virtsoc-it-vm-{}-{tag}.sock", std::process::id()));
    let spec = format!("vm0:{}:{}:64", shm.display(), sock.display());
    (Daemon::start(&["--vm", &spec]), shm, sock)
}

fn vm_run(shm: &PathBuf, sock: &PathBuf, args: &[&str]) -> Command {
    let mut c = common::virtsoc_cmd();
    c.args(["vm", "run", "--timeout", "240", "--image"])
        .arg(image())
        .arg("--shm")
        .arg(shm)
        .arg("--doorbell")
        .arg(sock)
        .arg("--")
        .args(args);
    c
}

#[test]
fn a_vm_guest_runs_the_svm_benchmark_against_the_host_daemon() {
    if !qemu_present() {
        return;
    }
    let (d, shm, sock) = vm_daemon("bench");
    let out = vm_run(
        &shm,
        &sock,
        &[
            "bench",
            "svm",
            "--socket",
            "vm",
            "--json",
            "--frames",
            "8",
            "--warmup",
            "2",
            "--size",
            "1048576",
            "--slack-ms",
            "2",
            "--ordering",
            "atomic,fence",
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON from the guest");
    let results = v["protocols"].as_array().unwrap();
    assert_eq!(results.len(), 6);
    for r in results {
        assert_eq!(r["corrupt_frames"], 0, "{r}");
        assert_eq!(r["frames"], 8, "{r}");
    }
    d.expect_log("VM vm0 disconnected");
}

fn ctl(d: &Daemon, args: &[&str]) -> String {
    let s = d.socket().to_string_lossy().into_owned();
    let mut all = vec!["ctl", "--socket", s.as_str()];
    all.extend_from_slice(args);
    common::virtsoc(&all)
}

/// A VM guest opens host service channels (their doorbells ring over the VM's port) and
/// calls geo, sensor, clipboard and bulk, the sensor's samples (the guest sleeps until the
/// host's answer) while a bulk transfer of 16 packets runs on another channel: every answer
/// is the host's, every byte checked.
#[test]
fn a_vm_guest_calls_the_host_services_over_channels() {
    if !qemu_present() {
        return;
    }
    let (d, shm, sock) = vm_daemon("services");
    ctl(&d, &["geo", "fix", "-122.084", "37.422", "12"]);
    ctl(&d, &["sensor", "set", "accelerometer", "0.5:-1:9.7"]);
    ctl(&d, &["clipboard", "set", "from", "the", "host"]);
    let size = 1u64 << 20;
    let out = vm_run(
        &shm,
        &sock,
        &[
            "debug",
            "services",
            "--socket",
            "vm",
            "--clipboard",
            "from the VM",
            "--size",
            &size.to_string(),
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .expect("JSON from the guest");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["geo"]["lon"], -122.084, "{v}");
    assert_eq!(v["geo"]["lat"], 37.422, "{v}");
    assert_eq!(v["geo"]["alt"], 12.0, "{v}");
    assert!(v["nmea"].as_str().unwrap().contains("GGA"), "{v}");
    assert_eq!(
        v["sensor"]["accelerometer"],
        serde_json::json!([0.5, -1.0, 9.7])
    );
    let seqs: Vec<u64> = serde_json::from_value(v["sensor"]["samples"].clone()).unwrap();
    assert!(
        seqs.len() == 3 && seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "samples numbered in order: {v}"
    );
    assert_eq!(v["clipboard"]["before"], "from the host", "{v}");
    assert_eq!(v["clipboard"]["after"], "from the VM", "{v}");
    assert!(ctl(&d, &["clipboard", "get"]).contains("from the VM"));
    let b = &v["bulk"];
    assert_eq!(b["echo_ok"], true, "{v}");
    assert_eq!(b["packets"], 16, "{v}");
    let want: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
    assert_eq!(b["sink"]["len"], size, "{v}");
    assert_eq!(b["sink"]["crc"], crc32fast::hash(&want), "{v}");
    assert_eq!(b["drain"]["len"], size, "{v}");
    assert_eq!(b["drain"]["sum"], b["drain"]["want_sum"], "{v}");
    d.expect_log("VM vm0 disconnected");
}

/// A VM that floods its port with doorbells (the test plays QEMU's end of the port: a
/// session, no channel of its own) holds up neither another guest's host service channels
/// nor the daemon. Needs no QEMU.
#[test]
fn a_vm_flooding_its_port_with_bells_does_not_hold_up_other_guests_channels() {
    use std::io::{Read, Write};
    use virtsoc_guest::services::Bulk;
    use virtsoc_proto::handshake::{Hello, PROTOCOL_VERSION};

    let (mut d, _shm, sock) = vm_daemon("flood");
    let mut port = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let hello = serde_json::to_vec(&Hello {
        protocol: PROTOCOL_VERSION,
        name: "flood".into(),
        window_size: 64 << 20,
        sq_entries: 64,
        cq_entries: 64,
        token: None,
        coherence: None,
        resume: None,
    })
    .unwrap();
    let mut msg = vec![2u8];
    msg.extend_from_slice(&(hello.len() as u32).to_le_bytes());
    msg.extend_from_slice(&hello);
    port.write_all(&msg).unwrap();
    let mut b = [0u8; 1];
    while b[0] != 3 {
        port.read_exact(&mut b).unwrap();
    }
    let mut len = [0u8; 4];
    port.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    port.read_exact(&mut body).unwrap();
    let reply: virtsoc_proto::handshake::Reply = serde_json::from_slice(&body).unwrap();
    assert!(
        matches!(reply, virtsoc_proto::handshake::Reply::Welcome { .. }),
        "{reply:?}"
    );
    d.expect_log("VM vm0 guest");
    // 1 MiB of doorbells while a process guest calls a service over a channel.
    let done = std::sync::atomic::AtomicBool::new(false);
    let calls = std::thread::scope(|s| {
        s.spawn(|| {
            let bells = vec![1u8; 64 << 10];
            for _ in 0..16 {
                port.write_all(&bells).unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let c = common::connect(&d);
        let mut bulk = Bulk::open(&c, 4).unwrap();
        let data: Vec<u8> = (0..(256u32 << 10)).map(|i| (i * 7) as u8).collect();
        let mut calls = 0;
        while calls < 20 || !done.load(std::sync::atomic::Ordering::SeqCst) {
            assert_eq!(bulk.echo(&data[..4096]).unwrap(), &data[..4096]);
            let (crc, n) = bulk.sink(&data).unwrap();
            assert_eq!((crc, n), (crc32fast::hash(&data), data.len() as u64));
            calls += 1;
        }
        bulk.0.close().unwrap();
        calls
    });
    eprintln!("{calls} rounds of the process guest's calls during the flood");
    assert!(d.alive());
    drop(port);
    d.expect_log("VM vm0 disconnected");
}

#[test]
fn a_vm_guest_runs_a_camera_scenario_through_the_host_devices() {
    if !qemu_present() {
        return;
    }
    let (_d, shm, sock) = vm_daemon("scenario");
    let out = vm_run(
        &shm,
        &sock,
        &[
            "run",
            "camera",
            "--socket",
            "vm",
            "--json",
            "--seconds",
            "1.5",
            "--resolution",
            "360p",
            "--ordering",
            "fence",
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON from the guest");
    let r = &v[0];
    assert!(r["frames_in"].as_u64().unwrap() > 0, "{r}");
    assert!(
        r["presented"].as_u64().unwrap() > 0,
        "frames reached the host display: {r}"
    );
    assert!(
        r["latency_ms"]["p50"].as_f64().unwrap() > 0.0,
        "latency read from the pixels: {r}"
    );
}

/// The daemon's open service channels, all services together.
fn service_channels(d: &Daemon) -> u64 {
    let out = ctl(d, &["services"]);
    let json = out.trim_end().strip_suffix("OK").unwrap_or(&out);
    let v: serde_json::Value = serde_json::from_str(json).expect("services JSON");
    let list = v["services"].as_array().expect("services");
    list.iter().filter_map(|s| s["channels"].as_u64()).sum()
}

/// A VM killed mid-frame, with service channels open (geo, sensor, and bulk with a transfer
/// half sent): its session's regions and its channels are released, and other guests are
/// served, devices and services.
#[test]
fn killing_the_vm_frees_its_session_and_the_daemon_keeps_serving() {
    if !qemu_present() {
        return;
    }
    let (mut d, shm, sock) = vm_daemon("kill");
    let mut vm = vm_run(
        &shm,
        &sock,
        &[
            "debug",
            "hold",
            "--socket",
            "vm",
            "--regions",
            "3",
            "--channels",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut err = BufReader::new(vm.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let qemu: i32 = line
        .trim()
        .strip_prefix("VM-PID ")
        .expect("VM-PID line")
        .parse()
        .unwrap();
    let mut out = BufReader::new(vm.stdout.take().unwrap());
    line.clear();
    while !line.starts_with("READY") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the VM guest never got ready"
        );
    }
    assert_eq!(service_channels(&d), 3, "the VM's three channels");
    // The guest is mid-frame with three regions and mid-transfer on a channel: kill the
    // whole VM.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(qemu).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let _ = vm.wait();
    let l = d.expect_log("gone: released");
    // Its three regions and its three channels' rings and slots.
    assert!(l.contains("released 6 regions"), "{l}");
    d.expect_log("VM vm0 disconnected");
    assert!(d.alive());
    // Process guests are still served.
    let c = Connection::connect(d.socket(), &ConnectOptions::default()).unwrap();
    let id = c.alloc_blob(65536).unwrap().id;
    c.begin_access(id, DeviceId::PRODUCER, 0, 65536, AccessMode::Write)
        .unwrap();
    let w = c
        .device_cmd(
            DeviceId::PRODUCER,
            [testdev::WRITE_PATTERN, u64::from(id), 1, 0, 0, 0],
        )
        .unwrap()[0];
    c.end_access(id, DeviceId::PRODUCER, 0, 65536, AccessMode::Write)
        .unwrap();
    c.begin_access(id, DeviceId::CONSUMER, 0, 65536, AccessMode::Read)
        .unwrap();
    let r = c
        .device_cmd(
            DeviceId::CONSUMER,
            [testdev::CHECKSUM, u64::from(id), 0, 0, 0, 0],
        )
        .unwrap()[0];
    assert_eq!(w, r);
    // The VM's channels are gone (each channel's thread ends at its next wake-up).
    let t0 = std::time::Instant::now();
    while service_channels(&d) != 0 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "the killed VM's channels stay open: {}",
            service_channels(&d)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // And the services serve another guest.
    let mut bulk = virtsoc_guest::services::Bulk::open(&c, 8).unwrap();
    let data: Vec<u8> = (0..(300u32 << 10)).map(|i| (i * 13) as u8).collect();
    assert_eq!(
        bulk.sink(&data).unwrap(),
        (crc32fast::hash(&data), data.len() as u64)
    );
    bulk.0.close().unwrap();
}
