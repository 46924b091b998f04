//! Service sessions across live migrations (issue 29, item 4): a process guest streams
//! sensor samples on one channel and sends bulk transfers (in 64 KiB packets) on another
//! while it migrates to a second daemon and back, three times. Its channels keep their ids, and the
//! services' counters (sample numbers, the bulk service's count of transfers) run on with
//! no gap and no repeat: nothing was lost or run twice, and every transfer's checksum and
//! length came back right.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use common::{connect_to, free_port, migration_daemon, request_migration};
use virtsoc_guest::services::{Bulk, Sensors};

const TOKEN: &str = "services-migration-token-0123456789";
/// Migrations of the guest (back and forth).
const MOVES: u64 = 6;

/// Progress of one stream: how many calls came back, told to the test as they do.
struct Progress {
    done: AtomicU64,
    tx: std::sync::Mutex<mpsc::Sender<()>>,
}

impl Progress {
    fn new(tx: mpsc::Sender<()>) -> Self {
        Progress {
            done: AtomicU64::new(0),
            tx: std::sync::Mutex::new(tx),
        }
    }

    fn one(&self) {
        self.done.fetch_add(1, Ordering::SeqCst);
        let _ = self.tx.lock().unwrap().send(());
    }
}

/// Waits until both streams made `n` more calls than they had.
fn both_advance(rx: &mpsc::Receiver<()>, a: &Progress, b: &Progress, n: u64) {
    let (a0, b0) = (a.done.load(Ordering::SeqCst), b.done.load(Ordering::SeqCst));
    while a.done.load(Ordering::SeqCst) < a0 + n || b.done.load(Ordering::SeqCst) < b0 + n {
        rx.recv_timeout(Duration::from_secs(60))
            .expect("a stream stopped making progress");
    }
}

/// Sets the flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn sensor_and_bulk_sessions_follow_a_migrating_guest() {
    let token_file =
        std::env::temp_dir().join(format!("virtsoc-svc-mig-{}.token", std::process::id()));
    std::fs::write(&token_file, TOKEN).unwrap();
    let ports = [free_port(), free_port()];
    let daemons = [
        migration_daemon(&token_file, ports[0], None),
        migration_daemon(&token_file, ports[1], None),
    ];
    let g = connect_to(daemons[0].socket());
    g.set_auto_reconnect(Some(Duration::from_secs(30)));
    let first_guest = g.guest_id();

    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel();
    let (sp, bp) = (Progress::new(tx.clone()), Progress::new(tx));
    std::thread::scope(|s| {
        let sensors = s.spawn(|| {
            let _stop_on_failure = StopOnDrop(&stop);
            let mut sn = Sensors::open(&g).unwrap();
            let id = sn.0.id();
            assert_eq!(sn.set_rate("accelerometer", 200).unwrap(), 200);
            let mut seqs = Vec::new();
            let mut last_time = 0;
            while !stop.load(Ordering::SeqCst) {
                let v = sn.sample("accelerometer").unwrap();
                assert!(v.time_ns >= last_time, "sample times run on");
                last_time = v.time_ns;
                seqs.push(v.seq);
                sp.one();
            }
            assert_eq!(sn.0.id(), id, "the channel kept its id");
            assert_eq!(sn.0.moves(), MOVES, "it followed every move");
            sn.0.close().unwrap();
            seqs
        });
        let bulk = s.spawn(|| {
            let _stop_on_failure = StopOnDrop(&stop);
            let mut b = Bulk::open(&g, 8).unwrap();
            let id = b.0.id();
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut counts = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let size = 1 + (x % (4 << 20)) as usize;
                let data: Vec<u8> = (0..size).map(|i| (i as u64 ^ x) as u8).collect();
                let r = b.sink_counted(&data).unwrap();
                assert_eq!((r.crc, r.len), (crc32fast::hash(&data), size as u64));
                counts.push(r.nth);
                bp.one();
            }
            assert_eq!(b.0.id(), id, "the channel kept its id");
            assert_eq!(b.0.moves(), MOVES, "it followed every move");
            b.0.close().unwrap();
            counts
        });

        // If this thread fails, the streams stop too (the scope joins them).
        let _stop_on_failure = StopOnDrop(&stop);
        // Both streams run on the first daemon, move to the second and back, three times.
        both_advance(&rx, &sp, &bp, 3);
        for m in 0..MOVES as usize {
            let (from, to) = (m % 2, 1 - m % 2);
            let (status, v) = request_migration(
                &daemons[from],
                g.guest_id(),
                &format!("127.0.0.1:{}", ports[to]),
                TOKEN,
            );
            assert_eq!(status, 200, "{v}");
            both_advance(&rx, &sp, &bp, 3);
        }
        stop.store(true, Ordering::SeqCst);

        let seqs = sensors.join().unwrap();
        let counts = bulk.join().unwrap();
        let consecutive = |v: &[u64]| v.iter().zip(1..).all(|(a, b)| *a == b);
        assert!(consecutive(&seqs), "sample numbers {seqs:?}");
        assert!(consecutive(&counts), "bulk transfer counts {counts:?}");
    });
    assert_ne!(g.guest_id(), first_guest, "the guest moved (and back)");
    std::fs::remove_file(&token_file).ok();
}
