//! The multimedia feedback loop (`virtsocd --scheduler feedback`): every 100 ms it reads each
//! guest's presented frames from the display (which knows them exactly) and runs the DFR
//! controller ([`virtsoc_sched::dfr`], the multimedia VM scheduler's Algorithm 1) of every
//! guest whose policy class is `multimedia`. The share it computes becomes the guest's share
//! on every device's scheduler, and a guest behind its desired frame rate is boosted ahead of
//! batch guests until it catches up. Shares go back to the policy's when the guest idles.
//! Where the daemon steers CPU weights (`--cpu-cgroup`, [`crate::cgroup`]), the same share is
//! the guest's CPU weight: a video guest that needs the CPU to make its frames gets it ahead
//! of processes spinning beside it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use virtsoc_control::DisplayGuestMetrics;
use virtsoc_sched::dfr::{DfrConfig, DfrController};
use virtsoc_sched::policy::Class;

use super::DeviceSlot;
use crate::cgroup::CpuCgroups;
use crate::policy::PolicyStore;
use crate::sync::EventCount;

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
fn cpu_share(cgroups: Option<&CpuCgroups>, guest: u64, share: u32) {
    if let Some(cg) = cgroups {
        if let Err(e) = cg.set_share(guest, share) {
            log::warn!("feedback: {e}");
        }
    }
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
    let mut tracked: HashMap<u64, Tracked> = HashMap::new();
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
            let p = current.for_guest(name);
            if p.class != Class::Multimedia {
                // No longer multimedia (a reload): back to the policy's share, no boost.
                if tracked.remove(&m.guest).is_some() {
                    cpu_share(cgroups, m.guest, p.shares);
                    for (s, guests) in &on {
                        if guests.contains_key(&m.guest) {
                            s.acct.set_share(m.guest, p.shares);
                            s.acct.set_boost(m.guest, false);
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
            cpu_share(cgroups, m.guest, share);
            for (s, guests) in &on {
                if guests.contains_key(&m.guest) {
                    s.acct.set_share(m.guest, share);
                    s.acct.set_boost(m.guest, behind);
                }
            }
        }
        wake.wait_past_for(seen, Some(PERIOD));
    }
}
