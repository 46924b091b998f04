//! Round robin: the baseline. Guests are served in turn, one command each, in the order they
//! first showed up, whatever their commands cost; no device time is taken into account.

use crate::{GuestId, Nanos, Pick, Scheduler};

/// Round robin over the guests in order of first appearance.
#[derive(Debug, Default)]
pub struct RoundRobin {
    order: Vec<GuestId>,
    last: Option<GuestId>,
}

impl Scheduler for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn set_share(&mut self, _guest: GuestId, _share: u32) {}

    fn forget(&mut self, guest: GuestId) {
        self.order.retain(|g| *g != guest);
    }

    fn pick(&mut self, ready: &[GuestId], _busy: &[GuestId], _now: Nanos) -> Pick {
        for g in ready {
            if !self.order.contains(g) {
                self.order.push(*g);
            }
        }
        if ready.is_empty() {
            return Pick::Wait;
        }
        let start = self
            .last
            .and_then(|l| self.order.iter().position(|g| *g == l))
            .map_or(0, |i| i + 1);
        let n = self.order.len();
        let next = (0..n)
            .map(|k| self.order[(start + k) % n])
            .find(|g| ready.contains(g))
            .unwrap_or(ready[0]);
        self.last = Some(next);
        Pick::Serve(next)
    }

    fn dispatched(&mut self, _guest: GuestId, _now: Nanos) {}

    fn completed(&mut self, _guest: GuestId, _device_ns: Nanos, _now: Nanos) {}
}
