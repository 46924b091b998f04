//! The multimedia feedback loop (`virtsocd --scheduler feedback`): every 100 ms it reads each
//! guest's presented frames from the display (which knows them exactly) and runs the DFR
//! controller ([`virtsoc_sched::dfr`], the multimedia VM scheduler's Algorithm 1) of every
//! guest whose policy class is `multimedia`. The share it computes becomes the guest's share
//! on every device's scheduler, and a guest behind its desired frame rate is boosted ahead of
//! batch guests until it catches up. Shares go back to the policy's when the guest idles.
//! Where the daemon steers CPU weights (`--cpu-cgroup`, [`crate::cgroup`]), the same share is
//! the guest's CPU weight: a video guest that needs the CPU to make its frames gets it ahead
//! of processes spinning beside it. The daemon's own threads that make its frames on a
//! CPU-emulated GPU (a CPU Vulkan driver's rasterizer threads, at a low priority by default,
//! `--gpu-driver-nice`) get a group of their own too (cgroup v1), whose weight follows the
//! highest raised share of an active multimedia guest: otherwise the frames' GPU work would
//! wait behind the spinners whatever the guest's own weight.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use virtsoc_svm::GuestId;

use virtsoc_control::DisplayGuestMetrics;
use virtsoc_sched::dfr::{DfrConfig, DfrController};
use virtsoc_sched::policy::Class;
use virtsoc_sync::EventCount;

use super::DeviceSlot;
use crate::cgroup::CpuCgroups;
use crate::policy::PolicyStore;

/// How often the loop samples the display.
const PERIOD: Duration = Duration::from_millis(100);

/// The running loop; stopped by [`FeedbackLoop::stop`].
pub struct FeedbackLoop {
    stop: Arc<AtomicBool>,
    wake: Arc<EventCount>,
    handle: Option<JoinHandle<()>>,
}

impl FeedbackLoop {
    /// Starts the loop over `slots` (it does nothing without a display device); it steers
    /// CPU weights through `cgroups` if given.
    pub fn start(
        slots: Vec<Arc<DeviceSlot>>,
        policy: Arc<PolicyStore>,
        cgroups: Option<Arc<CpuCgroups>>,
    ) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(EventCount::default());
        let (s, w) = (stop.clone(), wake.clone());
        let handle = std::thread::Builder::new()
            .name("dfr-feedback".into())
            .spawn(move || run(&slots, &policy, cgroups.as_deref(), &s, &w))?;
        Ok(FeedbackLoop {
            stop,
            wake,
            handle: Some(handle),
        })
    }

    /// Stops the loop and waits for it.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.notify();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

struct Tracked {
    ctl: DfrController,
}

/// Sets `guest`'s CPU weight from `share`, if the daemon steers CPU weights.
fn cpu_share(cgroups: Option<&CpuCgroups>, guest: GuestId, share: u32) {
    if let Some(cg) = cgroups {
        if let Err(e) = cg.set_share(guest, share) {
            log::warn!("feedback: {e}");
        }
    }
}

/// The share the daemon's device threads should have: the highest of the active multimedia
/// guests' shares the controller has raised (their frames need more of the CPU, the device
/// threads' work included), none when no controller has.
fn device_threads_share<'a>(ctls: impl Iterator<Item = &'a DfrController>) -> Option<u32> {
    ctls.filter(|c| c.fps().is_some() && c.raised())
        .map(DfrController::share)
        .max()
}

fn run(
    slots: &[Arc<DeviceSlot>],
    policy: &PolicyStore,
    cgroups: Option<&CpuCgroups>,
    stop: &AtomicBool,
    wake: &EventCount,
) {
    let Some(display) = slots.iter().find(|s| s.device.name() == "display").cloned() else {
        return;
    };
    let epoch = Instant::now();
    let cfg = DfrConfig {
        initial_dfr: 30.0,
        ..DfrConfig::default()
    };
    if let Some(cg) = cgroups {
        let threads: Vec<u32> = slots.iter().flat_map(|s| s.device.cpu_threads()).collect();
        match cg.attach_device_threads(&threads) {
            Ok(0) => {}
            Ok(n) => log::info!(
                "feedback: {n} CPU driver threads in {} ({} {})",
                cg.parent().join("device").display(),
                cg.version().file(),
                cg.device_weight().unwrap_or(0)
            ),
            Err(e) => log::info!("feedback: {e}"),
        }
    }
    let mut tracked: HashMap<u64, Tracked> = HashMap::new();
    let mut device_share = None;
    while !stop.load(Ordering::SeqCst) {
        let seen = wake.current();
        let metrics: Vec<DisplayGuestMetrics> = display
            .device
            .control("metrics", &serde_json::Value::Null)
            .ok()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        let names = display.guest_names();
        // Each device hears only of guests with a queue on it, so a departed guest's
        // scheduler state goes with its queue (the worker forgets it).
        let on: Vec<_> = slots.iter().map(|s| (s, s.guest_names())).collect();
        let now = epoch.elapsed().as_nanos() as u64;
        let current = policy.current();
        tracked.retain(|g, _| names.contains_key(g));
        for m in &metrics {
            let Some(name) = names.get(&m.guest) else {
                continue;
            };
            let g = GuestId(m.guest);
            let p = current.for_guest(name);
            if p.class != Class::Multimedia {
                // No longer multimedia (a reload): back to the policy's share, no boost.
                if tracked.remove(&m.guest).is_some() {
                    cpu_share(cgroups, g, p.shares);
                    for (s, guests) in &on {
                        if guests.contains_key(&m.guest) {
                            s.acct.set_share(g, p.shares);
                            s.acct.set_boost(g, false);
                        }
                    }
                }
                continue;
            }
            let t = tracked.entry(m.guest).or_insert_with(|| Tracked {
                ctl: DfrController::new(cfg, p.shares),
            });
            if let Some(share) = t.ctl.observe(now, m.presented) {
                log::info!(
                    "feedback: guest {} ({name}) share {share}, {:.1} fps, desired {:.1}",
                    m.guest,
                    t.ctl.fps().unwrap_or(0.0),
                    t.ctl.dfr()
                );
            }
            // Applied every period, so a device the guest starts using later hears of it too.
            let (share, behind) = (t.ctl.share(), t.ctl.behind());
            cpu_share(cgroups, g, share);
            for (s, guests) in &on {
                if guests.contains_key(&m.guest) {
                    s.acct.set_share(g, share);
                    s.acct.set_boost(g, behind);
                }
            }
        }
        if let Some(cg) = cgroups {
            let want = device_threads_share(tracked.values().map(|t| &t.ctl));
            if want != device_share {
                match cg.set_device_share(want) {
                    Ok(()) => {
                        log::info!("feedback: CPU driver threads' share {want:?}");
                        device_share = want;
                    }
                    Err(e) => log::warn!("feedback: {e}"),
                }
            }
        }
        wake.wait_past_for(seen, Some(PERIOD));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtsoc_sched::MS;

    #[test]
    fn device_threads_follow_the_highest_raised_active_guest() {
        let cfg = DfrConfig {
            initial_dfr: 30.0,
            ..DfrConfig::default()
        };
        let mut slow = DfrController::new(cfg, 100);
        let mut fine = DfrController::new(cfg, 100);
        assert_eq!(device_threads_share([&slow, &fine].into_iter()), None);
        // 10 fps against a DFR of 30: the fast start doubles the share every 200 ms.
        let (mut n_slow, mut n_fine) = (0, 0);
        for i in 0..=10u64 {
            n_slow += 1;
            n_fine += 3;
            slow.observe(i * 100 * MS, n_slow);
            fine.observe(i * 100 * MS, n_fine);
        }
        assert!(
            slow.raised() && !fine.raised(),
            "{} {}",
            slow.share(),
            fine.share()
        );
        assert_eq!(
            device_threads_share([&slow, &fine].into_iter()),
            Some(slow.share())
        );
        // Idle for a second: its share is restored, the threads' goes back.
        for i in 11..=25u64 {
            slow.observe(i * 100 * MS, n_slow);
        }
        assert!(!slow.raised());
        assert_eq!(device_threads_share([&slow, &fine].into_iter()), None);
    }
}
