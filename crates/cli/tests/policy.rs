//! The sharing policy (`virtsocd --policy FILE`) through a real daemon: a guest the policy
//! does not allow a device or a command gets `PermissionDenied` while another guest is served
//! as before; SIGHUP reloads the file, a bad reload keeps the old policy, a bad file at start
//! stops the daemon with the line named; refusals show in `virtsoc top --json`.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::Daemon;
use virtsoc_guest::{testdev, AccessMode, ConnectOptions, Connection, DeviceId, RegionId, Status};

fn guest(d: &Daemon, name: &str) -> Connection {
    Connection::connect(
        d.socket(),
        &ConnectOptions {
            name: name.into(),
            window_size: 16 << 20,
            ..ConnectOptions::default()
        },
    )
    .expect("connect")
}

fn policy_file(tag: &str, text: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("virtsoc-policy-{}-{tag}.toml", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p
}

/// Writes a pattern on the producer and checksums it on the consumer: the consumer's
/// result, or the first status refused.
fn frame(c: &Connection, id: RegionId) -> Result<u64, Status> {
    let word = u64::from(id);
    let st = |e: virtsoc_guest::GuestError| e.status();
    c.begin_access(id, DeviceId::PRODUCER, 0, 4096, AccessMode::Write)
        .map_err(st)?;
    c.device_cmd(
        DeviceId::PRODUCER,
        [testdev::WRITE_PATTERN, word, 7, 0, 0, 0],
    )
    .map_err(st)?;
    c.end_access(id, DeviceId::PRODUCER, 0, 4096, AccessMode::Write)
        .map_err(st)?;
    c.begin_access(id, DeviceId::CONSUMER, 0, 4096, AccessMode::Read)
        .map_err(st)?;
    let crc = c
        .device_cmd(DeviceId::CONSUMER, [testdev::CHECKSUM, word, 0, 0, 0, 0])
        .map_err(st);
    c.end_access(id, DeviceId::CONSUMER, 0, 4096, AccessMode::Read)
        .map_err(st)?;
    Ok(crc?[0])
}

const NO_CHECKSUM: &str = "\
[guest.limited]
devices = [\"producer\", \"consumer\"]
commands = [\"producer.*\"]
";

#[test]
fn a_denied_guest_gets_permission_denied_and_another_is_unaffected() {
    let file = policy_file("deny", NO_CHECKSUM);
    let d = Daemon::start(&["--policy", file.to_str().unwrap(), "--scheduler", "wfq"]);
    let limited = guest(&d, "limited");
    let free = guest(&d, "free");
    let a = limited.alloc_blob(4096).unwrap().id;
    let b = free.alloc_blob(4096).unwrap().id;
    let good = frame(&free, b).expect("the other guest is served");
    assert_eq!(frame(&limited, a), Err(Status::PermissionDenied));
    // The refusal is that guest's only: the other goes on, and so does the limited guest's
    // allowed work.
    assert_eq!(frame(&free, b), Ok(good));
    limited
        .device_cmd(
            DeviceId::PRODUCER,
            [testdev::WRITE_PATTERN, u64::from(a), 7, 0, 0, 0],
        )
        .map(|_| ())
        .unwrap_or_else(|e| assert_ne!(e.status(), Status::PermissionDenied));

    // Refusals and device time per guest in `virtsoc top --json`.
    let out = common::virtsoc(&[
        "top",
        "--json",
        "--interval-ms",
        "50",
        "--socket",
        d.socket().to_str().unwrap(),
    ]);
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    let row = |name: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no guest {name} in {out}"))
    };
    assert_eq!(row("limited")["devices"]["consumer"]["denied"], 1, "{out}");
    assert_eq!(row("free")["devices"]["consumer"]["denied"], 0, "{out}");
    assert!(
        row("free")["devices"]["consumer"]["requests"]
            .as_u64()
            .unwrap()
            >= 6
    );

    // Reload: allowed now.
    std::fs::write(&file, "[guest.limited]\nshares = 200\n").unwrap();
    let pid = d.child.id().to_string();
    let hup = |d: &Daemon, needle: &str| {
        let ok = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
        assert!(ok.success());
        d.expect_log(needle)
    };
    hup(&d, "policy reloaded");
    frame(&limited, a).expect("allowed after the reload");
    // A bad reload keeps the policy in force and says why.
    std::fs::write(&file, "[guest.limited]\nshares = 200\ndevices = \"gpu\"\n").unwrap();
    let line = hup(&d, "policy not reloaded");
    assert!(line.contains("line 3"), "{line}");
    frame(&limited, a).expect("the old policy stays");
    let _ = std::fs::remove_file(&file);
}

#[test]
fn a_bad_policy_at_start_is_a_clear_error() {
    let file = policy_file("bad", "[guest.x]\nshares = 0\n");
    let out = Command::new(common::virtsocd())
        .args(["--socket", "/nonexistent/virtsoc-policy.sock", "--policy"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 1") && err.contains("shares"), "{err}");
    let _ = std::fs::remove_file(&file);
}

#[test]
fn the_policy_memory_limit_caps_that_guest_only() {
    let file = policy_file("mem", "[guest.small]\nmemory_limit = 1048576\n");
    let d = Daemon::start(&["--policy", file.to_str().unwrap()]);
    let small = guest(&d, "small");
    let other = guest(&d, "other");
    let err = small.alloc_blob(2 << 20).expect_err("over its limit");
    assert_eq!(err.status(), Status::OutOfMemory);
    small.alloc_blob(512 << 10).unwrap();
    other.alloc_blob(2 << 20).unwrap();
    let _ = std::fs::remove_file(&file);
}

/// The control API changes one guest's policy at runtime (`POST /guests/{id}/policy`):
/// that guest is refused at once, another is unaffected; a bad table is a 400 naming the
/// field and changes nothing; `POST /policy/reload` reads the file again.
#[test]
fn the_control_api_changes_a_guests_policy() {
    use virtsoc_control::client::{control_path, request, Target};
    let file = policy_file("control", "[default]\nshares = 100\n");
    let d = Daemon::start(&["--policy", file.to_str().unwrap()]);
    let limited = guest(&d, "limited");
    let free = guest(&d, "free");
    let a = limited.alloc_blob(4096).unwrap().id;
    let b = free.alloc_blob(4096).unwrap().id;
    frame(&limited, a).expect("allowed before the change");
    let good = frame(&free, b).unwrap();
    let post = |path: &str, body: &str| {
        request(
            &Target::Unix(control_path(d.socket())),
            "POST",
            path,
            body.as_bytes(),
        )
        .unwrap()
    };
    let id = limited.guest_id();
    let r = post(&format!("/guests/{id}/policy"), NO_CHECKSUM_JSON);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["name"], "limited");
    assert_eq!(frame(&limited, a), Err(Status::PermissionDenied));
    assert_eq!(frame(&free, b), Ok(good));
    // Refusals: a bad field, a command the device does not have, an unknown guest.
    let r = post(&format!("/guests/{id}/policy"), r#"{"shares": "many"}"#);
    assert_eq!(r.status, 400);
    assert!(r.body.contains("shares"), "{}", r.body);
    let r = post(
        &format!("/guests/{id}/policy"),
        r#"{"commands": ["consumer.no_such_command"]}"#,
    );
    assert_eq!(r.status, 400);
    assert!(r.body.contains("no_such_command"), "{}", r.body);
    assert_eq!(post("/guests/999999/policy", "{}").status, 404);
    assert_eq!(frame(&limited, a), Err(Status::PermissionDenied));
    // The file read again replaces what the control API set.
    let r = post("/policy/reload", "");
    assert_eq!(r.status, 200, "{}", r.body);
    frame(&limited, a).expect("allowed after the reload");
    let _ = std::fs::remove_file(&file);
}

const NO_CHECKSUM_JSON: &str =
    r#"{"devices": ["producer", "consumer"], "commands": ["producer.*"]}"#;
