//! Unit tests of the isolation bench: the round plan, pausing.
use super::*;

#[test]
fn a_round_per_second_of_camera() {
    let p = |seconds, frames| {
        Plan::of(&IsolationParams {
            seconds,
            frames,
            kinds: Vec::new(),
            slow: (640, 360),
        })
    };
    let d = p(5.0, 300);
    assert_eq!((d.rounds, d.frames, d.seconds), (5, 60, 1.0));
    let one = p(1.0, 20);
    assert_eq!((one.rounds, one.frames, one.seconds), (1, 20, 1.0));
    let long = p(60.0, 100);
    assert_eq!((long.rounds, long.frames, long.seconds), (5, 60, 12.0));
}

#[test]
fn a_paused_hostile_thread_is_idle_until_resumed() {
    let ctl = Ctl::default();
    let ops = AtomicU64::new(0);
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            while ctl.go() {
                ops.fetch_add(1, Ordering::SeqCst);
                std::thread::yield_now();
            }
            ctl.ended.store(true, Ordering::Release);
        });
        for _ in 0..3 {
            ctl.pause();
            // Idle: its operation under way finished, none starts while paused.
            let n = ops.load(Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(ops.load(Ordering::SeqCst), n);
            ctl.resume();
            while ops.load(Ordering::SeqCst) == n {
                std::thread::yield_now();
            }
        }
        ctl.stop.store(true, Ordering::Release);
        h.join().unwrap();
    });
    // A stopped thread does not hold up a pause.
    ctl.pause();
}
