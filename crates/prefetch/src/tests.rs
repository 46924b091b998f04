//! Unit tests: synthetic access traces with injected time (no threads, no
//! sleeps) plus one property test over random traces.

use std::time::Duration;

use proptest::prelude::*;

use crate::*;

const PRODUCER: VDev = VDev(1);
const CONSUMER: VDev = VDev(2);
const HOST: PDev = PDev(1);
const DEV: PDev = PDev(2);

fn ms(x: f64) -> Duration {
    Duration::from_secs_f64(x / 1000.0)
}

fn close(a: Duration, b: Duration, tol: Duration) -> bool {
    a.abs_diff(b) <= tol
}

const US: Duration = Duration::from_micros(1);

fn write(
    e: &PrefetchEngine,
    r: u64,
    v: VDev,
    p: PDev,
    size: u64,
    t: Duration,
) -> Option<PrefetchPlan> {
    assert_eq!(
        e.on_begin_access(RegionId(r), v, p, AccessKind::Write, t),
        ReadOutcome::NotRead
    );
    e.on_end_access(RegionId(r), v, p, AccessKind::Write, size, t)
}

fn read(e: &PrefetchEngine, r: u64, v: VDev, p: PDev, t: Duration) -> ReadOutcome {
    let o = e.on_begin_access(RegionId(r), v, p, AccessKind::Read, t);
    assert_eq!(
        e.on_end_access(RegionId(r), v, p, AccessKind::Read, 0, t),
        None
    );
    o
}

/// Runs `frames` frames of a producer(HOST) -> consumer(DEV) pipeline over
/// `regions`, starting at frame index `start`; each copy takes `copy` and is
/// reported, the read comes `slack` after the write. Returns the plans.
#[allow(clippy::too_many_arguments)]
fn pipeline(
    e: &PrefetchEngine,
    regions: &[u64],
    start: u64,
    frames: u64,
    size: u64,
    copy: Duration,
    slack: Duration,
) -> Vec<(u64, Option<PrefetchPlan>, ReadOutcome)> {
    let period = ms(16.7);
    (start..start + frames)
        .map(|i| {
            let r = regions[(i % regions.len() as u64) as usize];
            let t = period * i as u32;
            let plan = write(e, r, PRODUCER, HOST, size, t);
            e.on_copy_complete(HOST, DEV, size, copy);
            let o = read(e, r, CONSUMER, DEV, t + slack);
            (r, plan, o)
        })
        .collect()
}

#[test]
fn engine_is_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PrefetchEngine>();
}

#[test]
fn smoothing_math() {
    let mut s = Ewma::new();
    assert_eq!(s.get(), None);
    assert_eq!(s.update(0.5, 10.0), 10.0); // first value initialises
    assert_eq!(s.update(0.5, 20.0), 15.0);
    assert_eq!(s.update(0.5, 30.0), 22.5);
    assert_eq!(s.update(0.5, f64::NAN), 22.5); // ignored
    assert_eq!(s.samples(), 3);
    let mut a = Ewma::new();
    a.update(0.25, 100.0);
    assert_eq!(a.update(0.25, 0.0), 75.0);

    // Through the engine: bandwidth and slack are smoothed the same way.
    let e = PrefetchEngine::default();
    e.on_copy_complete(HOST, DEV, 100, Duration::from_secs(1));
    e.on_copy_complete(HOST, DEV, 300, Duration::from_secs(1));
    assert_eq!(e.predicted_bandwidth(HOST, DEV), Some(200.0));
    assert_eq!(e.predicted_bandwidth(DEV, HOST), None);
    e.on_copy_complete(HOST, DEV, 0, Duration::from_secs(1)); // ignored
    e.on_copy_complete(HOST, DEV, 10, Duration::ZERO); // ignored
    assert_eq!(e.predicted_bandwidth(HOST, DEV), Some(200.0));

    // Slack 2 ms, then 4 ms -> 3 ms.
    let t0 = Duration::from_secs(1);
    write(&e, 7, PRODUCER, HOST, 10, t0);
    read(&e, 7, CONSUMER, DEV, t0 + ms(2.0));
    let t1 = Duration::from_secs(2);
    write(&e, 7, PRODUCER, HOST, 10, t1);
    read(&e, 7, CONSUMER, DEV, t1 + ms(4.0));
    let plan = write(&e, 7, PRODUCER, HOST, 10, Duration::from_secs(3)).unwrap();
    assert!(close(plan.predicted_slack, ms(3.0), US), "{plan:?}");
}

#[test]
fn steady_pipeline_is_accurate_and_needs_no_compensation() {
    let e = PrefetchEngine::default();
    let size = 8 << 20;
    let out = pipeline(&e, &[0, 1, 2, 3], 0, 1000, size, ms(4.0), ms(10.0));
    for (i, (_, plan, o)) in out.iter().enumerate() {
        if i < 4 {
            // First cycle of each region: nothing known yet.
            assert_eq!(plan, &None);
            assert_eq!(*o, ReadOutcome::Unpredicted);
            continue;
        }
        let p = plan.as_ref().expect("steady flow must be predicted");
        assert_eq!(p.targets, vec![DEV]);
        assert_eq!(p.source, HOST);
        assert!(!p.zero_shot);
        assert_eq!(*o, ReadOutcome::Hit);
        assert!(close(p.predicted_copy, ms(4.0), US), "{p:?}");
        assert!(close(p.predicted_slack, ms(10.0), US), "{p:?}");
        assert_eq!(p.compensation, Duration::ZERO);
    }
    let s = e.stats();
    assert!(e.accuracy().unwrap() >= 0.99);
    assert_eq!(
        (s.predictions, s.hits, s.misses, s.unpredicted),
        (996, 996, 0, 4)
    );
    assert_eq!(
        (s.virtual_flows, s.physical_flows, s.regions_tracked),
        (1, 1, 4)
    );
    assert_eq!(s.suspensions, 0);
    assert!(s.metadata_bytes > 0);
}

#[test]
fn pipeline_switch_is_predicted_zero_shot() {
    let e = PrefetchEngine::default();
    pipeline(&e, &[0, 1, 2, 3], 0, 20, 1000, ms(1.0), ms(10.0));
    // New ring of buffers, same flow: planned on the very first write.
    let out = pipeline(&e, &[100, 101, 102, 103], 20, 20, 1000, ms(1.0), ms(10.0));
    for (i, (_, plan, o)) in out.iter().enumerate() {
        let p = plan.as_ref().expect("zero-shot plan expected");
        assert_eq!(p.zero_shot, i < 4, "frame {i}");
        assert_eq!(p.targets, vec![DEV]);
        assert_eq!(*o, ReadOutcome::Hit);
    }
    let s = e.stats();
    assert_eq!(s.zero_shot_predictions, 4);
    assert_eq!(s.virtual_flows, 1);
    // A writer with no known flow gets nothing.
    assert_eq!(
        write(&e, 200, VDev(9), HOST, 10, Duration::from_secs(10)),
        None
    );
}

#[test]
fn flow_change_updates_region_edge() {
    let e = PrefetchEngine::default();
    let c = VDev(3);
    let cp = PDev(3);
    let mut t = Duration::ZERO;
    let step = ms(16.0);
    for _ in 0..5 {
        write(&e, 0, PRODUCER, HOST, 10, t);
        read(&e, 0, CONSUMER, DEV, t + ms(5.0));
        t += step;
    }
    let old = e.region_flow(RegionId(0), PRODUCER).unwrap();
    let p = write(&e, 0, PRODUCER, HOST, 10, t).unwrap();
    assert_eq!(p.targets, vec![DEV]);
    assert_eq!(read(&e, 0, c, cp, t + ms(5.0)), ReadOutcome::Miss);
    t += step;
    let p = write(&e, 0, PRODUCER, HOST, 10, t).unwrap();
    assert_eq!(p.targets, vec![cp]);
    assert!(!p.zero_shot);
    assert_ne!(p.flow, old);
    assert_eq!(e.region_flow(RegionId(0), PRODUCER), Some(p.flow));
    assert_eq!(e.flow_info(p.flow).unwrap().readers, vec![c]);
    assert_eq!(read(&e, 0, c, cp, t + ms(5.0)), ReadOutcome::Hit);
}

#[test]
fn multi_reader_targets_every_reader() {
    let e = PrefetchEngine::default();
    let (camera, isp, gpu) = (VDev(10), VDev(11), VDev(12));
    let (cam_p, isp_p, gpu_p) = (PDev(1), PDev(2), PDev(3));
    let size = 4_000_000;
    // 1 GB/s to the ISP, 2 GB/s to the GPU: 4 ms + 2 ms sequentially.
    e.on_copy_complete(cam_p, isp_p, size, ms(4.0));
    e.on_copy_complete(cam_p, gpu_p, size, ms(2.0));
    let mut plans = Vec::new();
    for i in 0..10u32 {
        let t = ms(33.0) * i;
        plans.push(write(&e, 5, camera, cam_p, size, t));
        let a = read(&e, 5, isp, isp_p, t + ms(8.0));
        let b = read(&e, 5, gpu, gpu_p, t + ms(9.0));
        if i > 0 {
            assert_eq!((a, b), (ReadOutcome::Hit, ReadOutcome::Hit));
        }
    }
    let p = plans.last().unwrap().as_ref().unwrap();
    assert_eq!(p.targets, vec![isp_p, gpu_p]);
    assert!(close(p.predicted_copy, ms(6.0), US), "{p:?}");
    assert!(close(p.predicted_slack, ms(8.0), US), "{p:?}");
    assert_eq!(p.compensation, Duration::ZERO);
    assert_eq!(e.flow_info(p.flow).unwrap().readers, vec![isp, gpu]);
    assert_eq!(e.stats().hits, 18);
}

#[test]
fn short_slack_is_compensated() {
    let e = PrefetchEngine::default();
    let size = 5_000_000; // 5 ms at 1 GB/s
    let out = pipeline(&e, &[0, 1], 0, 50, size, ms(5.0), ms(2.0));
    let p = out.last().unwrap().1.as_ref().unwrap();
    assert!(close(p.predicted_copy, ms(5.0), US), "{p:?}");
    assert!(close(p.predicted_slack, ms(2.0), US), "{p:?}");
    assert!(close(p.compensation, ms(3.0), US), "{p:?}");
}

#[test]
fn unmeasured_bandwidth_means_no_copy_time() {
    let e = PrefetchEngine::default();
    for i in 0..3u32 {
        let t = ms(20.0) * i;
        let p = write(&e, 1, PRODUCER, HOST, 1 << 20, t);
        if let Some(p) = p {
            assert_eq!(p.predicted_copy, Duration::ZERO);
            assert_eq!(p.compensation, Duration::ZERO);
        }
        read(&e, 1, CONSUMER, DEV, t + ms(1.0));
    }
    assert_eq!(e.stats().predictions, 2);
}

#[test]
fn suspension_after_consecutive_misses_and_shadow_resumption() {
    let e = PrefetchEngine::default();
    let intruder = (VDev(3), PDev(3));
    pipeline(&e, &[0, 1, 2, 3], 0, 8, 100, ms(1.0), ms(5.0));
    let flow = e.region_flow(RegionId(0), PRODUCER).unwrap();
    // Frames 8..10: regions 0,1,2 are read by the intruder instead.
    for (k, r) in [0u64, 1, 2].into_iter().enumerate() {
        let t = ms(16.0) * (8 + k as u32);
        assert!(write(&e, r, PRODUCER, HOST, 100, t).is_some());
        assert_eq!(
            read(&e, r, intruder.0, intruder.1, t + ms(5.0)),
            ReadOutcome::Miss
        );
        let info = e.flow_info(flow).unwrap();
        assert_eq!(info.consecutive_misses, k as u32 + 1);
        assert_eq!(info.miss_suspended, k == 2);
    }
    assert_eq!(e.stats().suspensions, 1);
    assert_eq!(e.stats().suspended_flows, 1);
    // Region 3: flow suspended -> no plan, but a shadow plan is scored.
    let t = ms(16.0) * 11;
    assert_eq!(write(&e, 3, PRODUCER, HOST, 100, t), None);
    assert_eq!(e.stats().shadow_predictions, 1);
    assert_eq!(read(&e, 3, CONSUMER, DEV, t + ms(5.0)), ReadOutcome::Hit);
    let s = e.stats();
    assert_eq!((s.shadow_hits, s.resumptions, s.suspended_flows), (1, 1, 0));
    assert!(!e.flow_info(flow).unwrap().miss_suspended);
    // Shadow outcomes do not enter the accuracy.
    assert_eq!((s.hits, s.misses), (4, 3));
    // Resumed: real plans again.
    let p = write(&e, 3, PRODUCER, HOST, 100, t + ms(16.0)).unwrap();
    assert_eq!(p.flow, flow);
}

#[test]
fn shadow_miss_keeps_flow_suspended() {
    let e = PrefetchEngine::default();
    pipeline(&e, &[0, 1, 2, 3, 4], 0, 5, 100, ms(1.0), ms(5.0));
    pipeline(&e, &[0, 1, 2, 3, 4], 5, 1, 100, ms(1.0), ms(5.0));
    let flow = e.region_flow(RegionId(0), PRODUCER).unwrap();
    for (k, r) in [1u64, 2, 3, 4].into_iter().enumerate() {
        let t = ms(16.0) * (6 + k as u32);
        let plan = write(&e, r, PRODUCER, HOST, 100, t);
        assert_eq!(plan.is_some(), k < 3);
        assert_eq!(
            read(&e, r, VDev(3), PDev(3), t + ms(5.0)),
            ReadOutcome::Miss
        );
    }
    let s = e.stats();
    assert_eq!(
        (s.misses, s.shadow_misses, s.suspensions, s.resumptions),
        (3, 1, 1, 0)
    );
    assert!(e.flow_info(flow).unwrap().miss_suspended);
}

/// A flow with `hits` plans in a row that hit, then (`miss`) one read on a device its plan
/// did not cover before the planned one; copies at 1 GB/s throughout. Returns the flow.
fn flow_after(e: &PrefetchEngine, hits: u64, miss: bool, size: u64) -> FlowId {
    pipeline(e, &[0], 0, hits + 1, size, ms(1.0), ms(10.0));
    let t = Duration::from_secs(1);
    let flow = write(e, 0, PRODUCER, HOST, size, t).unwrap().flow;
    if miss {
        assert_eq!(
            read(e, 0, CONSUMER, PDev(3), t + ms(10.0)),
            ReadOutcome::Miss
        );
    }
    assert_eq!(read(e, 0, CONSUMER, DEV, t + ms(10.0)), ReadOutcome::Hit);
    flow
}

#[test]
fn bandwidth_drop_suspends_a_flow_that_missed_and_recovery_resumes() {
    let e = PrefetchEngine::default();
    let size = 1_000_000;
    let flow = flow_after(&e, 10, true, size);
    // The steady bandwidth (a tenth per copy) from 1 GB/s towards 0.1 GB/s: 0.1 + 0.9 *
    // 0.9^k, under half of 1 GB/s at the 8th slow copy, not before.
    for k in 1..=8 {
        assert!(!e.flow_info(flow).unwrap().bandwidth_suspended, "copy {k}");
        e.on_copy_complete(HOST, DEV, size, ms(10.0));
    }
    assert!(e.flow_info(flow).unwrap().bandwidth_suspended);
    assert_eq!(e.stats().suspensions, 1);
    let t = Duration::from_secs(2);
    assert_eq!(write(&e, 0, PRODUCER, HOST, size, t), None);
    // One shadow hit does not lift a bandwidth suspension.
    assert_eq!(read(&e, 0, CONSUMER, DEV, t + ms(10.0)), ReadOutcome::Hit);
    assert!(e.flow_info(flow).unwrap().bandwidth_suspended);
    // An on-demand copy at full speed: 0.1 + 0.9 * 0.9^8 = 0.487 -> 0.538 GB/s >= 0.5.
    e.on_copy_complete(HOST, DEV, size, ms(1.0));
    assert!(!e.flow_info(flow).unwrap().bandwidth_suspended);
    assert_eq!(e.stats().resumptions, 1);
    let p = write(&e, 0, PRODUCER, HOST, size, Duration::from_secs(3)).unwrap();
    assert_eq!(p.flow, flow);
    // The copy time is predicted from the faster average (alpha 0.5): the last copy counts
    // half.
    let bw = e.predicted_bandwidth(HOST, DEV).unwrap();
    assert!(bw > 0.5e9 && bw < 0.6e9, "{bw}");
}

#[test]
fn a_flow_whose_plans_all_hit_keeps_prefetching_at_a_low_bandwidth() {
    let e = PrefetchEngine::default();
    let size = 1_000_000;
    let flow = flow_after(&e, 10, false, size);
    for _ in 0..40 {
        e.on_copy_complete(HOST, DEV, size, ms(10.0));
    }
    assert!(!e.flow_info(flow).unwrap().bandwidth_suspended);
    let t = Duration::from_secs(2);
    assert!(write(&e, 0, PRODUCER, HOST, size, t).is_some());
    // A miss ends its run of hits: the next copy's low bandwidth suspends it.
    assert_eq!(
        read(&e, 0, CONSUMER, PDev(3), t + ms(10.0)),
        ReadOutcome::Miss
    );
    assert_eq!(read(&e, 0, CONSUMER, DEV, t + ms(10.0)), ReadOutcome::Hit);
    e.on_copy_complete(HOST, DEV, size, ms(10.0));
    assert!(e.flow_info(flow).unwrap().bandwidth_suspended);
    // Eight shadow hits in a row, two reads a cycle (still slow copies): it prefetches again.
    for i in 0..4u32 {
        let t = Duration::from_secs(3 + u64::from(i));
        assert!(e.flow_info(flow).unwrap().bandwidth_suspended, "cycle {i}");
        assert_eq!(write(&e, 0, PRODUCER, HOST, size, t), None);
        e.on_copy_complete(HOST, DEV, size, ms(10.0));
        assert_eq!(read(&e, 0, CONSUMER, DEV, t + ms(10.0)), ReadOutcome::Hit);
        assert_eq!(
            read(&e, 0, CONSUMER, PDev(3), t + ms(10.0)),
            ReadOutcome::Hit
        );
    }
    assert!(!e.flow_info(flow).unwrap().bandwidth_suspended);
    assert!(write(&e, 0, PRODUCER, HOST, size, Duration::from_secs(20)).is_some());
}

#[test]
fn copies_of_a_noisy_but_steady_bandwidth_do_not_suspend() {
    // 1 MiB copies between 6 and 18 GB/s in a pseudo-random order, as measured for one
    // pair on a quiet 2-core machine (the copying thread's core and the caches): the
    // smoothed-over-two-copies rule suspended such a flow every few dozen copies.
    let e = PrefetchEngine::default();
    let size = 1 << 20;
    let flow = flow_after(&e, 2, true, size);
    let mut x: u64 = 12345;
    for i in 0..5000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let gbs = 6.0 + 12.0 * ((x >> 33) as f64 / (1u64 << 31) as f64);
        e.on_copy_complete(
            HOST,
            DEV,
            size,
            Duration::from_secs_f64(size as f64 / (gbs * 1e9)),
        );
        assert!(
            !e.flow_info(flow).unwrap().bandwidth_suspended,
            "copy {i} at {gbs:.1} GB/s"
        );
    }
    assert_eq!(e.stats().suspensions, 0);
}

#[test]
fn forget_region_drops_entries_but_keeps_flows() {
    let e = PrefetchEngine::default();
    pipeline(&e, &[0, 1, 2, 3], 0, 12, 10, ms(1.0), ms(5.0));
    let before = e.stats();
    assert_eq!(before.regions_tracked, 4);
    e.forget_region(RegionId(0));
    assert_eq!(e.region_flow(RegionId(0), PRODUCER), None);
    let s = e.stats();
    assert_eq!(s.regions_tracked, 3);
    assert_eq!(s.virtual_flows, before.virtual_flows);
    // Reading a forgotten region is unpredicted; writing it is zero-shot.
    assert_eq!(
        read(&e, 0, CONSUMER, DEV, Duration::from_secs(1)),
        ReadOutcome::Unpredicted
    );
    let p = write(&e, 0, PRODUCER, HOST, 10, Duration::from_secs(2)).unwrap();
    assert!(p.zero_shot);
    e.forget_regions_where(|k| k.0 >= 2);
    assert_eq!(e.stats().regions_tracked, 2);
    assert!(e.region_flow(RegionId(1), PRODUCER).is_some());
    assert_eq!(e.region_flow(RegionId(2), PRODUCER), None);
    // Many regions, then forget all: the table gives memory back.
    pipeline(
        &e,
        &(1000..3000).collect::<Vec<_>>(),
        0,
        2000,
        10,
        ms(1.0),
        ms(5.0),
    );
    let big = e.stats().metadata_bytes;
    e.forget_regions_where(|_| true);
    let s = e.stats();
    assert_eq!(s.regions_tracked, 0);
    assert!(s.metadata_bytes < big / 4, "{} vs {big}", s.metadata_bytes);
}

#[test]
fn repeated_and_fresh_reads() {
    let e = PrefetchEngine::default();
    // Fresh region: unpredicted, no edge created.
    assert_eq!(
        read(&e, 9, CONSUMER, DEV, Duration::ZERO),
        ReadOutcome::Unpredicted
    );
    assert_eq!(e.stats().virtual_flows, 0);
    pipeline(&e, &[0], 0, 3, 10, ms(1.0), ms(5.0));
    let t = Duration::from_secs(1);
    write(&e, 0, PRODUCER, HOST, 10, t).unwrap();
    assert_eq!(read(&e, 0, CONSUMER, DEV, t + ms(1.0)), ReadOutcome::Hit);
    assert_eq!(read(&e, 0, CONSUMER, DEV, t + ms(2.0)), ReadOutcome::Hit);
    let s = e.stats();
    assert_eq!(s.hits, 3); // frames 1, 2 and one for this cycle
    assert_eq!(e.flow_info(FlowId(0)).unwrap().reads, 3);
    // Write with no reader in between: the empty cycle creates nothing.
    write(&e, 0, PRODUCER, HOST, 10, t + ms(20.0)).unwrap();
    write(&e, 0, PRODUCER, HOST, 10, t + ms(40.0)).unwrap();
    assert_eq!(e.stats().virtual_flows, 1);
}

#[test]
fn read_write_in_place_pipeline() {
    // camera writes, GPU processes in place (ReadWrite), display reads.
    let e = PrefetchEngine::default();
    let (camera, gpu, display) = (VDev(1), VDev(2), VDev(3));
    let (cam_p, gpu_p) = (PDev(1), PDev(2));
    let r = RegionId(42);
    let mut last = (None, None);
    for i in 0..5u32 {
        let t = ms(33.0) * i;
        let p1 = e.on_end_access(r, camera, cam_p, AccessKind::Write, 100, t);
        let o1 = e.on_begin_access(r, gpu, gpu_p, AccessKind::ReadWrite, t + ms(5.0));
        let p2 = e.on_end_access(r, gpu, gpu_p, AccessKind::ReadWrite, 100, t + ms(8.0));
        // The display shares the GPU's physical device: no copy needed.
        let o2 = e.on_begin_access(r, display, gpu_p, AccessKind::Read, t + ms(12.0));
        if i >= 1 {
            assert_eq!(o1, ReadOutcome::Hit);
            assert_eq!(o2, ReadOutcome::Hit);
        }
        last = (p1, p2);
    }
    let (p1, p2) = (last.0.unwrap(), last.1.unwrap());
    assert_eq!(p1.targets, vec![gpu_p]);
    assert!(!p1.zero_shot && !p2.zero_shot);
    assert!(p2.targets.is_empty());
    assert_eq!(p2.predicted_copy, Duration::ZERO);
    assert_ne!(p1.flow, p2.flow);
}

#[test]
fn config_validation() {
    assert!(Config::default().validate().is_ok());
    let bad = Config {
        alpha: 0.0,
        ..Config::default()
    };
    assert_eq!(bad.validate(), Err(ConfigError::Alpha(0.0)));
    assert!(PrefetchEngine::try_new(bad).is_err());
    assert_eq!(PrefetchEngine::new(bad).config().alpha, 0.5);
    let bad = Config {
        bandwidth_floor: f64::NAN,
        ..Config::default()
    };
    assert!(matches!(
        bad.validate(),
        Err(ConfigError::BandwidthFloor(_))
    ));
}

#[derive(Debug, Clone)]
enum Op {
    Begin(u8, u8, u8, u8, u16),
    End(u8, u8, u8, u8, u32, u16),
    Copy(u8, u8, u32, u32),
    Forget(u8),
    ForgetWhere(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, 0u8..4, 0u8..3, 0u8..3, 0u16..20_000).prop_map(|(r, v, p, k, dt)| Op::Begin(r, v, p, k, dt)),
        4 => (0u8..6, 0u8..4, 0u8..3, 0u8..3, any::<u32>(), 0u16..20_000)
            .prop_map(|(r, v, p, k, s, dt)| Op::End(r, v, p, k, s, dt)),
        2 => (0u8..3, 0u8..3, any::<u32>(), any::<u32>()).prop_map(|(s, d, b, us)| Op::Copy(s, d, b, us)),
        1 => (0u8..6).prop_map(Op::Forget),
        1 => (0u8..6).prop_map(Op::ForgetWhere),
    ]
}

fn kind(k: u8) -> AccessKind {
    match k {
        0 => AccessKind::Read,
        1 => AccessKind::Write,
        _ => AccessKind::ReadWrite,
    }
}

proptest! {
    #[test]
    fn random_traces_never_panic(
        alpha in 0.01f64..=1.0,
        misses in 0u32..5,
        floor in 0.0f64..=1.0,
        ops in proptest::collection::vec(op(), 0..300),
    ) {
        let e = PrefetchEngine::try_new(Config { alpha, max_consecutive_misses: misses, bandwidth_floor: floor }).unwrap();
        let mut now = Duration::ZERO;
        for op in ops {
            match op {
                Op::Begin(r, v, p, k, dt) => {
                    now += Duration::from_micros(dt.into());
                    let o = e.on_begin_access(RegionId(r.into()), VDev(v.into()), PDev(p.into()), kind(k), now);
                    prop_assert_eq!(o == ReadOutcome::NotRead, !kind(k).is_read());
                }
                Op::End(r, v, p, k, size, dt) => {
                    now += Duration::from_micros(dt.into());
                    let plan = e.on_end_access(RegionId(r.into()), VDev(v.into()), PDev(p.into()), kind(k), size.into(), now);
                    if let Some(plan) = plan {
                        prop_assert!(kind(k).is_write());
                        prop_assert!(!plan.targets.contains(&plan.source));
                        prop_assert_eq!(plan.compensation, plan.predicted_copy.saturating_sub(plan.predicted_slack));
                    }
                }
                Op::Copy(s, d, b, us) => e.on_copy_complete(PDev(s.into()), PDev(d.into()), b.into(), Duration::from_micros(us.into())),
                Op::Forget(r) => e.forget_region(RegionId(r.into())),
                Op::ForgetWhere(m) => e.forget_regions_where(|k| k.0 % 3 == u64::from(m % 3)),
            }
            if let Some(a) = e.accuracy() {
                prop_assert!((0.0..=1.0).contains(&a), "accuracy {}", a);
            }
            let s = e.stats();
            prop_assert!(s.zero_shot_predictions <= s.predictions);
            prop_assert!(s.resumptions <= s.suspensions);
            prop_assert!(s.suspended_flows <= s.virtual_flows);
            prop_assert!(s.regions_tracked <= 6);
        }
    }
}
