//! Live migration between two real daemons over TCP with the token: a process guest holding
//! regions (written by the CPU and by a device) and fences is migrated back and forth ten
//! times, its library following by itself, with every region's bytes and every fence's state
//! checked after each move and the regions written again in between. Faults: a target that
//! dies mid-migration and a wrong token leave the guest running on its source, which never
//! noticed; the daemons keep serving.

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::time::Duration;

use common::{
    connect_to, cpu_read, cpu_write, free_port, guest_state, migration_daemon, pattern,
    request_migration,
};
use virtsoc_guest::DeviceId;

const TOKEN: &str = "migration-test-token-0123456789";

#[test]
fn a_guest_migrates_back_and_forth_with_its_regions_and_fences() {
    let token_file = std::env::temp_dir().join(format!("virtsoc-mig-{}.token", std::process::id()));
    std::fs::write(&token_file, TOKEN).unwrap();
    let (pa, pb) = (free_port(), free_port());
    let daemons = [
        migration_daemon(&token_file, pa, None),
        migration_daemon(&token_file, pb, None),
    ];
    let ports = [pa, pb];
    let g = connect_to(daemons[0].socket());
    g.set_auto_reconnect(Some(Duration::from_secs(30)));
    let sizes = [1usize << 20, 300_000, 4096];
    let mut seeds = [1u8, 2, 3];
    let (ids, signaled, pending) = guest_state(&g, &sizes, &seeds);

    // The first move through the CLI.
    let out = common::virtsoc_cmd()
        .args([
            "migrate",
            &g.guest_id().to_string(),
            "--to",
            &format!("tcp:127.0.0.1:{}", ports[1]),
            "--socket",
            daemons[0].socket().to_str().unwrap(),
        ])
        .env("VIRTSOC_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut at = 1;
    for round in 0..10 {
        if round > 0 {
            let (status, v) = request_migration(
                &daemons[at],
                g.guest_id(),
                &format!("127.0.0.1:{}", ports[1 - at]),
                TOKEN,
            );
            assert_eq!(status, 200, "round {round}: {v}");
            at = 1 - at;
        }
        // The library follows by itself; every byte and fence made it.
        for ((&id, &n), &s) in ids.iter().zip(&sizes).zip(&seeds) {
            assert_eq!(
                cpu_read(&g, id, n),
                pattern(n, s),
                "round {round}: region {id}"
            );
        }
        assert!(g.fence_signaled(signaled).unwrap(), "round {round}");
        assert!(!g.fence_signaled(pending).unwrap(), "round {round}");
        // Write between moves, so each migration carries new bytes.
        let k = round % ids.len();
        seeds[k] = seeds[k].wrapping_add(17);
        cpu_write(&g, ids[k], &pattern(sizes[k], seeds[k]));
        let n = g.usage().unwrap().0;
        assert_eq!(n, 3, "round {round}");
    }
    g.fence_signal(DeviceId::CPU, pending).unwrap();
    g.nop().unwrap();
    assert!(g.fence_signaled(pending).unwrap());
    std::fs::remove_file(&token_file).ok();
}

#[test]
fn a_failed_migration_leaves_the_guest_running_on_its_source() {
    let token_file =
        std::env::temp_dir().join(format!("virtsoc-mig-f-{}.token", std::process::id()));
    std::fs::write(&token_file, TOKEN).unwrap();
    let (pa, pb) = (free_port(), free_port());
    let a = migration_daemon(&token_file, pa, None);
    let _b = migration_daemon(&token_file, pb, None);
    let g = connect_to(a.socket());
    let r = g.alloc_blob(1 << 20).unwrap();
    cpu_write(&g, r.id, &pattern(1 << 20, 5));
    let id = g.guest_id();

    // A wrong token is refused by the target.
    let (status, v) = request_migration(&a, id, &format!("127.0.0.1:{pb}"), "wrong-token");
    assert_eq!(status, 409, "{v}");
    assert!(v["error"].as_str().unwrap().contains("token"), "{v}");

    // A target that dies after the pre-copy started.
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let fake_addr = fake.local_addr().unwrap().to_string();
    let dying = std::thread::spawn(move || {
        let (mut s, _) = fake.accept().unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = s.read(&mut buf);
        // Accept the hello (a well-formed ACK), then die while regions stream in.
        use std::io::Write;
        let mut payload = Vec::new();
        let sock = "/nonexistent";
        payload.extend_from_slice(&(sock.len() as u32).to_le_bytes());
        payload.extend_from_slice(sock.as_bytes());
        let mut h = Vec::new();
        h.extend_from_slice(&101u32.to_le_bytes());
        h.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&h);
        crc.update(&payload);
        h.extend_from_slice(&crc.finalize().to_le_bytes());
        s.write_all(&h).unwrap();
        s.write_all(&payload).unwrap();
        let _ = s.read(&mut buf);
        drop(s);
    });
    let (status, v) = request_migration(&a, id, &fake_addr, TOKEN);
    dying.join().unwrap();
    assert_eq!(status, 409, "{v}");
    // The guest never noticed: same session, same bytes, still taking requests.
    assert_eq!(g.guest_id(), id);
    assert_eq!(cpu_read(&g, r.id, 1 << 20), pattern(1 << 20, 5));
    cpu_write(&g, r.id, &pattern(1 << 20, 6));
    assert_eq!(cpu_read(&g, r.id, 16), pattern(16, 6));
    std::fs::remove_file(&token_file).ok();
}

/// Requests in flight while the guest moves run exactly once: a thread allocates regions and
/// creates and signals fences (the signals detached, nobody waits for them) without pause
/// while the guest migrates there and back; afterwards the guest holds exactly the regions it
/// allocated and every fence it signaled is signaled.
#[test]
fn requests_in_flight_during_a_migration_run_exactly_once() {
    let token_file =
        std::env::temp_dir().join(format!("virtsoc-mig-x-{}.token", std::process::id()));
    std::fs::write(&token_file, TOKEN).unwrap();
    let (pa, pb) = (free_port(), free_port());
    let daemons = [
        migration_daemon(&token_file, pa, None),
        migration_daemon(&token_file, pb, None),
    ];
    let g = std::sync::Arc::new(connect_to(daemons[0].socket()));
    g.set_auto_reconnect(Some(Duration::from_secs(30)));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worker = {
        let (g, stop) = (g.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut allocated, mut fences) = (0u64, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                g.alloc_blob(4096).unwrap();
                allocated += 1;
                let f = g.fence_create().unwrap();
                g.fence_signal(DeviceId::CPU, f).unwrap();
                fences.push(f);
            }
            (allocated, fences)
        })
    };
    let mut at = 0;
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(50));
        let (status, v) = request_migration(
            &daemons[at],
            g.guest_id(),
            &format!("127.0.0.1:{}", [pa, pb][1 - at]),
            TOKEN,
        );
        assert_eq!(status, 200, "{v}");
        // The migration commits once the guest resumed at the target (its next request
        // takes it there); only then does it have its new id.
        daemons[1 - at].expect_log("resumed the session");
        at = 1 - at;
    }
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (allocated, fences) = worker.join().unwrap();
    g.nop().unwrap();
    assert_eq!(
        g.usage().unwrap().0,
        allocated,
        "each alloc ran exactly once"
    );
    for f in fences {
        assert!(g.fence_signaled(f).unwrap(), "{f:?} lost its signal");
    }
    std::fs::remove_file(&token_file).ok();
}
