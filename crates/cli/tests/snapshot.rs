//! Snapshots through real daemons: `virtsoc snapshot save` of a guest holding regions (written
//! by the CPU and by a device, one freed so ids have a gap) and fences (signaled, pending,
//! released), `virtsoc snapshot load` into a fresh guest of another daemon, which then sees the
//! same region ids and bytes, fence ids and statuses; the saved guest goes on. A corrupted or
//! truncated file and a load into a guest already holding regions are refused with a clear
//! error, restore nothing, and the daemon keeps serving.

mod common;

use std::path::PathBuf;

use common::{connect, cpu_read, cpu_write, pattern, Daemon};
use virtsoc_guest::{Connection, DeviceId, Fence, Format, RegionId};

fn snapshot_cli(args: &[&str]) -> (bool, String) {
    let out = common::virtsoc_cmd()
        .arg("snapshot")
        .args(args)
        .output()
        .expect("run virtsoc");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("virtsoc-snap-it-{}-{name}", std::process::id()))
}

/// A region written by the producer device (its only valid copy is then the device's).
fn device_write(c: &Connection, id: RegionId, size: u64, seed: u64) -> u64 {
    common::producer_write(c, id, size, seed)
}

struct Saved {
    ids: Vec<(RegionId, u64)>,
    contents: Vec<Vec<u8>>,
    signaled: Fence,
    pending: Fence,
}

fn populate(c: &Connection) -> Saved {
    let a = c.alloc_blob(1 << 20).unwrap();
    let gap = c.alloc_blob(4096).unwrap();
    let img = c.alloc(0, 64, 48, Format::Rgba8, 0).unwrap();
    let dev = c.alloc_blob(300_001).unwrap();
    let untouched = c.alloc_blob(12_345).unwrap();
    c.free(gap.id).unwrap();
    cpu_write(c, a.id, &pattern(1 << 20, 7));
    cpu_write(c, img.id, &pattern(img.size as usize, 9));
    device_write(c, dev.id, dev.size, 42);
    let signaled = c.fence_create().unwrap();
    c.fence_signal(DeviceId::CPU, signaled).unwrap();
    let pending = c.fence_create().unwrap();
    let released = c.fence_create().unwrap();
    c.fence_signal(DeviceId::CPU, released).unwrap();
    c.fence_release(released).unwrap();
    let ids: Vec<(RegionId, u64)> = [a, img, dev, untouched]
        .iter()
        .map(|r| (r.id, r.size))
        .collect();
    let contents = ids
        .iter()
        .map(|&(id, size)| cpu_read(c, id, size as usize))
        .collect();
    Saved {
        ids,
        contents,
        signaled,
        pending,
    }
}

#[test]
fn a_saved_session_is_restored_with_its_ids_bytes_and_fences() {
    let a = Daemon::start(&["--gpu-backend", "null", "--isp-backend", "null"]);
    let g1 = connect(&a);
    let saved = populate(&g1);
    let file = tmp("session.snap");
    let (ok, out) = snapshot_cli(&[
        "save",
        &g1.guest_id().to_string(),
        file.to_str().unwrap(),
        "--socket",
        a.socket().to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{out}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["regions"], 4, "{out}");
    // The saved guest goes on after the quiesce.
    cpu_write(&g1, saved.ids[0].0, &pattern(1 << 20, 8));
    assert_eq!(cpu_read(&g1, saved.ids[0].0, 16), pattern(16, 8));

    let b = Daemon::start(&["--gpu-backend", "null", "--isp-backend", "null"]);
    let g2 = connect(&b);
    let bystander = connect(&b);
    let load = |file: &PathBuf, guest: u64| {
        snapshot_cli(&[
            "load",
            file.to_str().unwrap(),
            "--guest",
            &guest.to_string(),
            "--socket",
            b.socket().to_str().unwrap(),
        ])
    };

    // Bad files first: each is refused with a clear error, and nothing is restored.
    let bytes = std::fs::read(&file).unwrap();
    let bad = tmp("bad.snap");
    let mut corrupted = bytes.clone();
    let mid = corrupted.len() / 2;
    corrupted[mid] ^= 1;
    let mut other_version = bytes.clone();
    other_version[8] = 9;
    for (what, contents, want) in [
        ("truncated", &bytes[..bytes.len() - 100], "truncated"),
        ("corrupted", &corrupted[..], "checksum"),
        ("other version", &other_version[..], "version 9"),
    ] {
        std::fs::write(&bad, contents).unwrap();
        let (ok, out) = load(&bad, g2.guest_id());
        assert!(!ok, "{what} file accepted: {out}");
        assert!(out.contains(want), "{what}: {out}");
        assert_eq!(g2.usage().unwrap().0, 0, "{what}: regions restored");
        assert!(g2.region(saved.ids[0].0).is_none());
    }
    // The daemon kept serving the other guest meanwhile.
    let r = bystander.alloc_blob(4096).unwrap();
    cpu_write(&bystander, r.id, &[5; 4096]);

    let (ok, out) = load(&file, g2.guest_id());
    assert!(ok, "{out}");
    for (&(id, size), want) in saved.ids.iter().zip(&saved.contents) {
        assert_eq!(&cpu_read(&g2, id, size as usize), want, "region {id}");
    }
    assert_eq!(g2.usage().unwrap().0, 4);
    assert!(g2.fence_signaled(saved.signaled).unwrap());
    assert!(!g2.fence_signaled(saved.pending).unwrap());
    g2.fence_signal(DeviceId::CPU, saved.pending).unwrap();
    g2.nop().unwrap(); // the signal is detached: CPU requests run in order
    assert!(g2.fence_signaled(saved.pending).unwrap());
    // New allocations never reuse a restored id (nor the freed one below them).
    let fresh = g2.alloc_blob(10).unwrap();
    assert!(fresh.id > saved.ids.iter().map(|r| r.0).max().unwrap());
    // A device works on restored regions.
    let crc = device_write(&g2, saved.ids[2].0, saved.ids[2].1, 5);
    assert_ne!(crc, 0);

    // Restoring into a guest already holding regions is refused.
    let (ok, out) = load(&file, g2.guest_id());
    assert!(!ok && out.contains("fresh session"), "{out}");
    std::fs::remove_file(&file).ok();
    std::fs::remove_file(&bad).ok();
}

/// `kill -9` of the daemon while it writes a snapshot over an older one: the older file is
/// still there and loads (the new one is written to a temporary file renamed into place only
/// once complete and synced).
#[test]
fn a_daemon_killed_while_writing_leaves_the_previous_snapshot_loadable() {
    let mut a = Daemon::start(&["--gpu-backend", "null", "--isp-backend", "null"]);
    let g = connect(&a);
    let ids: Vec<RegionId> = (0..6)
        .map(|i| {
            let r = g.alloc_blob(8 << 20).unwrap();
            cpu_write(&g, r.id, &pattern(8 << 20, i));
            r.id
        })
        .collect();
    let dir = tmp("killdir");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("s.snap");
    let save = |file: &PathBuf| {
        common::virtsoc_cmd()
            .args([
                "snapshot",
                "save",
                &g.guest_id().to_string(),
                file.to_str().unwrap(),
                "--socket",
                a.socket().to_str().unwrap(),
            ])
            .spawn()
            .unwrap()
    };
    assert!(save(&file).wait().unwrap().success());
    let old = std::fs::read(&file).unwrap();
    for &id in &ids {
        cpu_write(&g, id, &pattern(8 << 20, 99));
    }
    let mut second = save(&file);
    // Wait (bounded) for the second write to be under way, then kill the daemon.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let writing = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().contains(".tmp."));
        if writing || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::yield_now();
    }
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let _ = second.wait();
    // Whatever the moment of the kill, the file is a complete snapshot: the old one, or (if
    // the rename won the race) the new one.
    let img = virtsoc_host::snapshot::read_image(&file).expect("the snapshot file loads");
    let now = std::fs::read(&file).unwrap();
    let seed = if now == old { None } else { Some(99u8) };
    for (i, r) in img.regions.iter().enumerate() {
        let want = pattern(8 << 20, seed.unwrap_or(i as u8));
        assert_eq!(r.bytes.as_deref(), Some(&want[..]), "region {}", r.id);
    }
    std::fs::remove_dir_all(&dir).ok();
}
