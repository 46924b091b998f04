//! Every scheduler (`virtsocd --scheduler`) through a real daemon: guests sharing the test
//! devices get correct results in atomic and fence ordering (a fence-blocked queue, parked
//! accesses and dead queues behave as under round robin), and each guest's device time shows
//! in the control API.

mod common;

use common::Daemon;
use virtsoc_guest::{
    testdev, AccessMode, ConnectOptions, Connection, DeviceId, GuestError, Opcode,
};

fn guest(socket: &std::path::Path, name: &str) -> Connection {
    Connection::connect(
        socket,
        &ConnectOptions {
            name: name.into(),
            window_size: 16 << 20,
            ..ConnectOptions::default()
        },
    )
    .expect("connect")
}

/// `n` producer -> consumer frames, half bracketed in atomic order, half ordered by a fence
/// between the two devices' queues; every checksum must match the pattern written.
fn frames(c: &Connection, n: u64) -> Result<(), GuestError> {
    let size = 64 << 10;
    let id = c.alloc_blob(size)?.id;
    for seed in 0..n {
        let (p, q) = (DeviceId::PRODUCER, DeviceId::CONSUMER);
        let write = [testdev::WRITE_PATTERN, u64::from(id), seed, 0, 0, 0];
        let check = [testdev::CHECKSUM, u64::from(id), 0, 0, 0, 0];
        if seed % 2 == 0 {
            c.begin_access(id, p, 0, size, AccessMode::Write)?;
            let w = c.device_cmd(p, write)?[0];
            c.end_access(id, p, 0, size, AccessMode::Write)?;
            c.begin_access(id, q, 0, size, AccessMode::Read)?;
            let r = c.device_cmd(q, check)?[0];
            c.end_access(id, q, 0, size, AccessMode::Read)?;
            assert_eq!(w, r, "frame {seed}");
        } else {
            let acc = |m: AccessMode| [u64::from(id), 0, size, m as u64, 0, 0];
            c.submit_detached(Opcode::BeginAccess, p, acc(AccessMode::Write))?;
            let w = c.submit(Opcode::DeviceCmd, p, write)?;
            c.submit_detached(Opcode::EndAccess, p, acc(AccessMode::Write))?;
            let f = c.fence_create()?;
            c.fence_signal(p, f)?;
            c.fence_wait(q, f)?;
            c.fence_release(f)?;
            c.submit_detached(Opcode::BeginAccess, q, acc(AccessMode::Read))?;
            let r = c.submit(Opcode::DeviceCmd, q, check)?;
            c.submit_detached(Opcode::EndAccess, q, acc(AccessMode::Read))?;
            let (w, r) = (c.wait(w)?, c.wait(r)?);
            assert_eq!((w.status, r.status), (0, 0), "frame {seed}");
            assert_eq!(w.values[0], r.values[0], "frame {seed}");
        }
    }
    Ok(())
}

#[test]
fn every_scheduler_serves_correct_results_and_accounts_device_time() {
    for sched in ["round-robin", "wfq", "fixed-rate", "aimd", "feedback"] {
        let d = Daemon::start(&["--scheduler", sched, "--gpu-backend", "null"]);
        let socket = d.socket().to_path_buf();
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|i| {
                    let socket = &socket;
                    s.spawn(move || frames(&guest(socket, &format!("g{i}")), 40))
                })
                .collect();
            for h in hs {
                h.join().unwrap().unwrap_or_else(|e| panic!("{sched}: {e}"));
            }
        });
        // A guest that stays: its device time is in the control API.
        let c = guest(&socket, "stays");
        frames(&c, 4).unwrap();
        let out = common::virtsoc(&[
            "top",
            "--json",
            "--interval-ms",
            "20",
            "--socket",
            d.socket().to_str().unwrap(),
        ]);
        let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
        let me = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "stays")
            .unwrap_or_else(|| panic!("{sched}: {out}"));
        for dev in ["producer", "consumer"] {
            let u = &me["devices"][dev];
            assert!(u["requests"].as_u64().unwrap() >= 10, "{sched}: {out}");
            assert!(u["device_ns"].as_u64().unwrap() > 0, "{sched}: {out}");
        }
    }
}
