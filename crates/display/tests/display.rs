//! Behaviour of the display: pacing, latency, foreground sharing, PNG
//! snapshots, backends and vsync delivery. Everything but the
//! `VsyncThread` tests runs on injected time.

use std::fs::File;
use std::io::BufReader;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::Duration;

use virtsoc_display::{
    Display, DisplayBackend, DisplayConfig, DisplayError, DisplayStats, FrameHandle, GuestId,
    HeadlessBackend, NullBackend, PixelFormat, PresentOutcome, PresentedFrame, VsyncThread,
};

const MS: u64 = 1_000_000;
/// 60 Hz period as the display rounds it.
const PERIOD: u64 = 16_666_667;

fn frame(id: u64) -> PresentedFrame {
    PresentedFrame::new(id, 4, 2, PixelFormat::Rgba8, vec![id as u8; 32])
}

fn display() -> (Display, HeadlessBackend) {
    let headless = HeadlessBackend::new();
    let d = Display::new(DisplayConfig::new(4, 2).with_backend(headless.clone())).unwrap();
    (d, headless)
}

/// `submitted = presented + dropped + hidden + failed + pending`.
fn assert_balanced(d: &Display) {
    let s: DisplayStats = d.stats();
    let pending = u64::from(d.pending_frame_id().is_some());
    assert_eq!(
        s.submitted,
        s.presented + s.dropped + s.hidden + s.failed + pending,
        "unbalanced: {s:?} pending={pending}"
    );
}

#[test]
fn three_presents_between_vsyncs_present_one_and_drop_two() {
    let (mut d, headless) = display();
    d.on_vsync(0);
    assert_eq!(d.present(frame(1)).unwrap(), PresentOutcome::Queued);
    assert_eq!(
        d.present(frame(2)).unwrap(),
        PresentOutcome::Replaced { dropped: 1 }
    );
    assert_eq!(
        d.present(frame(3)).unwrap(),
        PresentOutcome::Replaced { dropped: 2 }
    );
    let ev = d.on_vsync(PERIOD);
    let rec = ev.scanout.expect("a frame was scanned out");
    assert_eq!(
        (rec.frame_id, rec.vsync_seq, rec.scanout_ns),
        (3, 2, PERIOD)
    );
    assert_eq!(ev.missed, 0);

    let s = d.stats();
    assert_eq!((s.submitted, s.presented, s.dropped), (3, 1, 2));
    assert_eq!(s.vsyncs, 2);
    assert_eq!(headless.last_frame().unwrap().id, 3);
    assert_eq!(headless.scanout_count(), 1);
    assert_eq!(d.last_frame().unwrap().id, 3);

    // A vsync with nothing new repeats the screen without calling the
    // backend.
    let ev = d.on_vsync(2 * PERIOD);
    assert_eq!(ev.scanout, None);
    assert_eq!(d.stats().idle_vsyncs, 2);
    assert_eq!(headless.scanout_count(), 1);
    assert_eq!(d.last_frame().unwrap().id, 3);

    // One frame per period: nothing is dropped.
    for (i, id) in (10..20).enumerate() {
        d.present(frame(id)).unwrap();
        let ev = d.on_vsync((3 + i as u64) * PERIOD);
        assert_eq!(ev.scanout.unwrap().frame_id, id);
    }
    let s = d.stats();
    assert_eq!((s.presented, s.dropped), (11, 2));
    let ids: Vec<u64> = d.scanouts().map(|r| r.frame_id).collect();
    assert_eq!(ids, [3, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]);
    assert_balanced(&d);
}

#[test]
fn late_vsyncs_are_counted_as_missed_and_time_never_runs_back() {
    let (mut d, _) = display();
    d.on_vsync(1000);
    assert_eq!(d.on_vsync(1000 + PERIOD).missed, 0);
    // Slept through two vsyncs.
    assert_eq!(d.on_vsync(1000 + 4 * PERIOD).missed, 2);
    assert_eq!(d.stats().missed_vsyncs, 2);
    // A clock that runs backwards is clamped to the last vsync.
    let ev = d.on_vsync(5);
    assert_eq!(ev.timestamp_ns, 1000 + 4 * PERIOD);
    assert_eq!(ev.missed, 0);
    assert_eq!(ev.seq, 4);
}

#[test]
fn latency_samples_are_scanout_minus_capture() {
    let (mut d, _) = display();
    d.on_vsync(0);
    d.present(frame(1).with_capture_ns(5 * MS).with_submitted_ns(10 * MS))
        .unwrap();
    let rec = d.on_vsync(PERIOD).scanout.unwrap();
    assert_eq!(rec.latency_ns, Some(PERIOD - 5 * MS));
    assert_eq!(rec.submitted_ns, 10 * MS);
    assert_eq!(rec.capture_ns, Some(5 * MS));

    // No capture time, no sample.
    d.present(frame(2)).unwrap();
    assert_eq!(d.on_vsync(2 * PERIOD).scanout.unwrap().latency_ns, None);

    // A frame that sat out a vsync (presented after it was captured long
    // ago) shows its full age.
    d.present(frame(3).with_capture_ns(PERIOD)).unwrap();
    d.on_vsync(3 * PERIOD);
    // A capture time in the future (clock mismatch) is not a sample.
    d.present(frame(4).with_capture_ns(100 * PERIOD)).unwrap();
    assert_eq!(d.on_vsync(4 * PERIOD).scanout.unwrap().latency_ns, None);

    assert_eq!(d.latency_samples(), vec![PERIOD - 5 * MS, 2 * PERIOD]);
    let lat = d.stats().latency;
    assert_eq!(lat.count, 2);
    assert_eq!(lat.min_ns, PERIOD - 5 * MS);
    assert_eq!(lat.max_ns, 2 * PERIOD);
    assert_eq!(lat.mean_ns(), Some((3 * PERIOD - 5 * MS) / 2));
}

#[test]
fn history_is_bounded_and_drainable() {
    let mut d = Display::new(DisplayConfig::new(4, 2).with_history(3)).unwrap();
    for i in 1..=5 {
        d.present(frame(i)).unwrap();
        d.on_vsync(i * PERIOD);
    }
    let ids: Vec<u64> = d.scanouts().map(|r| r.frame_id).collect();
    assert_eq!(ids, [3, 4, 5]);
    assert_eq!(d.drain_scanouts().len(), 3);
    assert_eq!(d.scanouts().count(), 0);
    assert_eq!(d.stats().presented, 5);
}

#[test]
fn foreground_switching_hides_and_reveals() {
    let (mut d, headless) = display();
    let a = |id| frame(id).with_owner(GuestId(1));
    let b = |id| frame(id).with_owner(GuestId(2));

    // Before any foreground is chosen every owner is shown.
    d.present(a(1)).unwrap();
    assert_eq!(d.on_vsync(PERIOD).scanout.unwrap().frame_id, 1);

    d.set_foreground(GuestId(1));
    assert_eq!(d.foreground(), Some(GuestId(1)));
    assert_eq!(d.present(b(100)).unwrap(), PresentOutcome::Hidden);
    assert_eq!(d.present(b(101)).unwrap(), PresentOutcome::Hidden);
    assert_eq!(d.present(a(2)).unwrap(), PresentOutcome::Queued);
    let ev = d.on_vsync(2 * PERIOD);
    assert_eq!(ev.scanout.unwrap().frame_id, 2);
    assert_eq!(ev.foreground, Some(GuestId(1)));
    let s = d.stats();
    assert_eq!((s.presented, s.dropped, s.hidden), (2, 0, 2));

    // A queued foreground frame becomes hidden when its owner loses the
    // foreground; the new owner's latest hidden frame is shown at once.
    d.present(a(3)).unwrap();
    d.set_foreground(GuestId(2));
    let rec = d.on_vsync(3 * PERIOD).scanout.unwrap();
    assert_eq!(
        (rec.frame_id, rec.owner, rec.revealed),
        (101, GuestId(2), true)
    );
    assert_eq!(rec.latency_ns, None);
    assert_eq!(headless.last_frame().unwrap().id, 101);
    let s = d.stats();
    assert_eq!((s.presented, s.dropped, s.hidden, s.revealed), (2, 0, 3, 1));

    // The foreground owner draws: a new frame replacing a revealed one is
    // not a drop (the revealed one was already counted as hidden).
    d.set_foreground(GuestId(1));
    d.set_foreground(GuestId(2));
    d.present(b(102)).unwrap();
    d.present(b(103)).unwrap();
    assert_eq!(d.on_vsync(4 * PERIOD).scanout.unwrap().frame_id, 103);
    let s = d.stats();
    assert_eq!((s.presented, s.dropped), (3, 1));

    // Switching back shows what owner 1 last presented (frame 3, hidden
    // when it lost the foreground).
    d.set_foreground(GuestId(1));
    let rec = d.on_vsync(5 * PERIOD).scanout.unwrap();
    assert_eq!((rec.frame_id, rec.revealed), (3, true));
    // ... and switching to 2 again shows its frame on screen before.
    d.set_foreground(GuestId(2));
    assert_eq!(d.on_vsync(6 * PERIOD).scanout.unwrap().frame_id, 103);

    // Setting the same foreground again changes nothing.
    d.set_foreground(GuestId(2));
    assert_eq!(d.on_vsync(7 * PERIOD).scanout, None);

    // A departed owner leaves nothing to reveal.
    d.present(a(4)).unwrap();
    d.remove_owner(GuestId(1));
    d.set_foreground(GuestId(1));
    assert_eq!(d.on_vsync(8 * PERIOD).scanout, None);
    assert_balanced(&d);
}

#[test]
fn png_snapshot_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shot.png");
    let (mut d, _) = display();
    assert!(matches!(d.snapshot_png(&path), Err(DisplayError::NoFrame)));

    // 4x2 BGRA with 4 bytes of row padding.
    let mut data = Vec::new();
    let mut want = Vec::new();
    for y in 0..2u8 {
        for x in 0..4u8 {
            let (r, g, b, a) = (x * 60, y * 200, 255 - x * 10, 200 + x);
            data.extend_from_slice(&[b, g, r, a]);
            want.extend_from_slice(&[r, g, b, a]);
        }
        data.extend_from_slice(&[0xEE; 4]);
    }
    let f = PresentedFrame::new(7, 4, 2, PixelFormat::Bgra8, data).with_stride(20);
    d.present(f).unwrap();
    d.on_vsync(PERIOD);
    d.snapshot_png(&path).unwrap();

    let decoder = png::Decoder::new(BufReader::new(File::open(&path).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (4, 2));
    assert_eq!(info.color_type, png::ColorType::Rgba);
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    assert_eq!(&buf[..info.buffer_size()], want.as_slice());
    assert!(!dir.path().join("shot.png.tmp").exists());
}

#[test]
fn snapshot_of_unmapped_handle_fails_cleanly() {
    #[derive(Debug)]
    struct GpuOnly;
    impl FrameHandle for GpuOnly {
        fn pixels(&self) -> Option<&[u8]> {
            None
        }
    }
    #[derive(Debug)]
    struct Mapped(Vec<u8>);
    impl FrameHandle for Mapped {
        fn pixels(&self) -> Option<&[u8]> {
            Some(&self.0)
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let (mut d, _) = display();
    let h: Arc<dyn FrameHandle> = Arc::new(GpuOnly);
    d.present(PresentedFrame::new(1, 4, 2, PixelFormat::Rgba8, h))
        .unwrap();
    d.on_vsync(PERIOD);
    assert!(matches!(
        d.snapshot_png(dir.path().join("a.png")),
        Err(DisplayError::PixelsUnavailable { id: 1 })
    ));

    let h: Arc<dyn FrameHandle> = Arc::new(Mapped(vec![9; 32]));
    d.present(PresentedFrame::new(2, 4, 2, PixelFormat::Rgba8, h))
        .unwrap();
    d.on_vsync(2 * PERIOD);
    d.snapshot_png(dir.path().join("b.png")).unwrap();

    // A handle whose mapping is too small is rejected at present time.
    let h: Arc<dyn FrameHandle> = Arc::new(Mapped(vec![9; 8]));
    assert!(matches!(
        d.present(PresentedFrame::new(3, 4, 2, PixelFormat::Rgba8, h)),
        Err(DisplayError::InvalidFrame { id: 3, .. })
    ));
}

#[test]
fn malformed_frames_and_configs_are_errors() {
    let (mut d, _) = display();
    let short = PresentedFrame::new(1, 4, 2, PixelFormat::Rgba8, vec![0u8; 31]);
    assert!(matches!(
        d.present(short),
        Err(DisplayError::InvalidFrame { id: 1, .. })
    ));
    assert_eq!(d.stats().rejected, 1);
    assert_eq!(d.stats().submitted, 0);
    assert_eq!(d.pending_frame_id(), None);

    for cfg in [
        DisplayConfig::new(0, 2),
        DisplayConfig::new(4, 0),
        DisplayConfig::new(4, 2).with_refresh_hz(0),
        DisplayConfig::new(4, 2).with_refresh_hz(5000),
    ] {
        assert!(matches!(
            Display::new(cfg),
            Err(DisplayError::InvalidConfig(_))
        ));
    }
}

#[test]
fn backend_failures_are_counted_not_fatal() {
    struct Flaky(u32);
    impl DisplayBackend for Flaky {
        fn scanout(&mut self, _f: &PresentedFrame) -> virtsoc_display::Result<()> {
            self.0 += 1;
            if self.0 % 2 == 1 {
                Err(DisplayError::Backend("lost the surface".into()))
            } else {
                Ok(())
            }
        }
    }
    let mut d = Display::new(DisplayConfig::new(4, 2).with_backend(Flaky(0))).unwrap();
    d.present(frame(1)).unwrap();
    assert_eq!(d.on_vsync(PERIOD).scanout, None);
    assert_eq!(d.last_error(), Some("display backend: lost the surface"));
    d.present(frame(2)).unwrap();
    assert_eq!(d.on_vsync(2 * PERIOD).scanout.unwrap().frame_id, 2);
    let s = d.stats();
    assert_eq!((s.failed, s.presented), (1, 1));
    assert_balanced(&d);
}

#[test]
fn null_backend_discards() {
    let mut d = Display::new(DisplayConfig::new(4, 2).with_backend(NullBackend)).unwrap();
    d.present(frame(1)).unwrap();
    assert_eq!(d.on_vsync(PERIOD).scanout.unwrap().frame_id, 1);
    assert!(format!("{d:?}").contains("null"));
}

// ---------------------------------------------------------------------
// VsyncThread: real clock, but the tests only wait on channels.
// ---------------------------------------------------------------------

const WAIT: Duration = Duration::from_secs(10);

fn thread_display() -> VsyncThread {
    let d = Display::new(DisplayConfig::new(4, 2).with_refresh_hz(1000)).unwrap();
    VsyncThread::spawn(d).unwrap()
}

#[test]
fn vsync_thread_delivers_events_and_scans_out() {
    let vt = thread_display();
    let (_id, rx) = vt.subscribe();
    let first = rx.recv_timeout(WAIT).unwrap();
    let second = rx.recv_timeout(WAIT).unwrap();
    assert!(second.seq > first.seq);
    assert!(second.timestamp_ns > first.timestamp_ns);

    vt.present(frame(42).with_owner(GuestId(3))).unwrap();
    let rec = loop {
        let ev = rx.recv_timeout(WAIT).unwrap();
        if let Some(rec) = ev.scanout {
            break rec;
        }
    };
    assert_eq!((rec.frame_id, rec.owner), (42, GuestId(3)));
    vt.with_display(|d| {
        assert_eq!(d.last_frame().unwrap().id, 42);
        assert_eq!(d.stats().presented, 1);
    });
}

#[test]
fn vsync_thread_unsubscribe_drop_and_stop() {
    let mut vt = thread_display();
    let (a, rx_a) = vt.subscribe();
    let (_b, rx_b) = vt.subscribe();
    let (_c, rx_c) = vt.subscribe();
    rx_a.recv_timeout(WAIT).unwrap();
    assert_eq!(vt.subscriber_count(), 3);

    // Unsubscribing disconnects the receiver once its queue is drained.
    assert!(vt.unsubscribe(a));
    assert!(!vt.unsubscribe(a));
    let end = loop {
        match rx_a.recv_timeout(WAIT) {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert_eq!(end, RecvTimeoutError::Disconnected);

    // A dropped receiver is removed at the next vsync.
    drop(rx_b);
    while vt.subscriber_count() > 1 {
        rx_c.recv_timeout(WAIT).unwrap();
    }

    // Stopping disconnects everyone and the thread is gone.
    vt.stop().unwrap();
    let end = loop {
        match rx_c.recv_timeout(WAIT) {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert_eq!(end, RecvTimeoutError::Disconnected);
    assert_eq!(vt.subscriber_count(), 0);
    vt.stop().unwrap();
}

/// A headless display holding two frames for vsyncs.
fn queue_of_two() -> (Display, HeadlessBackend) {
    let headless = HeadlessBackend::new();
    let d = Display::new(
        DisplayConfig::new(4, 2)
            .with_backend(headless.clone())
            .with_queue_depth(2),
    )
    .unwrap();
    (d, headless)
}

/// Depth 2 (a BufferQueue-like FIFO): two frames presented between vsyncs are both shown, on
/// consecutive vsyncs; a third replaces the newest waiting one.
#[test]
fn a_queue_of_two_shows_a_burst_and_replaces_only_the_newest() {
    let (mut d, headless) = queue_of_two();
    let balanced = |d: &Display| {
        let s = d.stats();
        assert_eq!(
            s.submitted,
            s.presented + s.dropped + s.hidden + s.failed + d.waiting() as u64,
            "{s:?}"
        );
    };
    // Frames submitted just before the vsync they are meant for.
    let at = |id: u64, t: u64| frame(id).with_submitted_ns(t);
    d.on_vsync(0);
    assert_eq!(
        d.present(at(1, PERIOD - MS)).unwrap(),
        PresentOutcome::Queued
    );
    assert_eq!(
        d.present(at(2, PERIOD - MS)).unwrap(),
        PresentOutcome::Queued
    );
    assert_eq!(d.waiting(), 2);
    balanced(&d);
    assert_eq!(d.on_vsync(PERIOD).scanout.map(|r| r.frame_id), Some(1));
    assert_eq!(d.on_vsync(2 * PERIOD).scanout.map(|r| r.frame_id), Some(2));
    assert_eq!(d.stats().dropped, 0);
    // A burst of three: the third replaces the second, the first stays first.
    for id in 3..=5 {
        d.present(at(id, 3 * PERIOD - MS)).unwrap();
    }
    assert_eq!(d.stats().dropped, 1);
    balanced(&d);
    assert_eq!(d.on_vsync(3 * PERIOD).scanout.map(|r| r.frame_id), Some(3));
    assert_eq!(d.on_vsync(4 * PERIOD).scanout.map(|r| r.frame_id), Some(5));
    assert!(d.on_vsync(5 * PERIOD).scanout.is_none());
    balanced(&d);
    assert_eq!(headless.scanout_count(), 4);
    // A frame that already waited half a period behind another is shown at once, the older
    // dropped: the queue catches up instead of staying a vsync behind.
    d.present(at(6, 5 * PERIOD + MS)).unwrap();
    d.present(at(7, 5 * PERIOD + 2 * MS)).unwrap();
    assert_eq!(d.on_vsync(6 * PERIOD).scanout.map(|r| r.frame_id), Some(7));
    assert_eq!(d.stats().dropped, 2);
    // The frame dropped at the vsync is reported with its owner (for per-guest counts).
    assert_eq!(d.drain_late_drops(), vec![GuestId(0)]);
    balanced(&d);
}

/// Depth 2 with frames paced to arrive just before each vsync (as the scenarios' vsync pacing
/// does): after a burst the queue must not stay two deep, which would show every later frame
/// a vsync late. One frame is dropped and the latency goes back to the lead.
#[test]
fn a_queue_of_two_does_not_stay_a_vsync_behind_after_a_burst() {
    let (mut d, _) = queue_of_two();
    let lead = 3 * MS;
    let at =
        |id: u64, capture: u64, t: u64| frame(id).with_capture_ns(capture).with_submitted_ns(t);
    d.on_vsync(0);
    // A burst: frames 1 and 2 both before the first vsync.
    d.present(at(1, PERIOD - 2 * lead, PERIOD - 2 * lead))
        .unwrap();
    d.present(at(2, PERIOD - lead, PERIOD - lead)).unwrap();
    let mut latencies = Vec::new();
    let mut shown = Vec::new();
    for k in 1..=10u64 {
        let r = d.on_vsync(k * PERIOD).scanout;
        shown.push(r.map(|r| r.frame_id));
        latencies.push(r.and_then(|r| r.latency_ns));
        // Then one frame a period, `lead` before the next vsync.
        let t = (k + 1) * PERIOD - lead;
        d.present(at(k + 2, t, t)).unwrap();
    }
    // The burst's first frame, then the queue catches up: the burst's second frame, passed
    // over once, is dropped for the frame behind it, and every later frame is shown at the
    // vsync it was paced for.
    assert_eq!(shown[..3], [Some(1), Some(3), Some(4)]);
    assert_eq!(d.stats().dropped, 1, "{shown:?}");
    for (k, l) in latencies.iter().enumerate().skip(1) {
        assert_eq!(*l, Some(lead), "vsync {}: {shown:?} {latencies:?}", k + 1);
    }
}
