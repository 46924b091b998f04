//! Admission of calls to a service instance that runs a limited number of calls at once,
//! in the order one of the daemon's device schedulers ([`virtsoc_sched`]: round robin, WFQ,
//! AvA's rate controls) picks among the guests waiting, with the service time of each call
//! charged to its guest as a device's time is.
//!
//! [`GateCore`] is the pure logic (no clock, no threads): calls arrive, [`GateCore::admit`]
//! asks the scheduler which guest goes next while there is room, and a call's end frees its
//! place. [`Gate`] puts it behind a lock and a condition variable for the channel threads.

use std::collections::{HashSet, VecDeque};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use virtsoc_sched::{GuestId, Kind, Pick, Scheduler};
use virtsoc_sync::{CondvarExt, LockExt};

/// A call's place in the gate.
pub type Ticket = u64;

/// The gate's logic.
pub struct GateCore {
    sched: Box<dyn Scheduler>,
    limit: usize,
    waiting: VecDeque<(GuestId, Ticket)>,
    running: Vec<(GuestId, Ticket)>,
    admitted: HashSet<Ticket>,
    next: Ticket,
}

impl GateCore {
    /// At most `limit` calls at once (at least 1), ordered by a scheduler of `kind`.
    pub fn new(kind: Kind, limit: usize) -> Self {
        GateCore {
            sched: kind.build(),
            limit: limit.max(1),
            waiting: VecDeque::new(),
            running: Vec::new(),
            admitted: HashSet::new(),
            next: 1,
        }
    }

    /// A call of `guest` arrives; its ticket.
    pub fn arrive(&mut self, guest: u64) -> Ticket {
        let t = self.next;
        self.next += 1;
        self.waiting.push_back((GuestId(guest), t));
        t
    }

    /// Admits waiting calls while there is room, as the scheduler picks; the time to ask
    /// again when it postponed everyone (a rate control).
    pub fn admit(&mut self, now: u64) -> Option<u64> {
        while self.running.len() < self.limit && !self.waiting.is_empty() {
            let mut ready: Vec<GuestId> = Vec::new();
            for (g, _) in &self.waiting {
                if !ready.contains(g) {
                    ready.push(*g);
                }
            }
            let busy: Vec<GuestId> = self.running.iter().map(|(g, _)| *g).collect();
            match self.sched.pick(&ready, &busy, now) {
                Pick::Serve(g) => {
                    let i = self.waiting.iter().position(|(w, _)| *w == g)?;
                    if let Some(call) = self.waiting.remove(i) {
                        self.sched.dispatched(g, now);
                        self.running.push(call);
                        self.admitted.insert(call.1);
                    }
                }
                Pick::Until(at) => return Some(at),
                Pick::Wait => return None,
            }
        }
        None
    }

    /// Whether `ticket` was admitted (and takes that news: asked once).
    pub fn take_admitted(&mut self, ticket: Ticket) -> bool {
        self.admitted.remove(&ticket)
    }

    /// The call with `ticket` ended after `service_ns`.
    pub fn done(&mut self, ticket: Ticket, service_ns: u64, now: u64) {
        if let Some(i) = self.running.iter().position(|(_, t)| *t == ticket) {
            let (g, _) = self.running.remove(i);
            self.sched.completed(g, service_ns, now);
        }
    }

    /// A guest's share (weight) for the scheduler.
    pub fn set_share(&mut self, guest: u64, share: u32) {
        self.sched.set_share(GuestId(guest), share);
    }

    /// Calls waiting.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

/// [`GateCore`] for threads: [`Gate::enter`] blocks until the call is admitted.
pub struct Gate {
    core: Mutex<GateCore>,
    cv: Condvar,
    origin: Instant,
}

/// An admitted call; ends the call when dropped.
pub struct Pass<'a> {
    gate: &'a Gate,
    ticket: Ticket,
    start: Instant,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let mut c = self.gate.lock();
        let now = self.gate.now();
        c.done(self.ticket, self.start.elapsed().as_nanos() as u64, now);
        c.admit(now);
        drop(c);
        self.gate.cv.notify_all();
    }
}

impl Gate {
    /// A gate of `limit` calls at once ordered by `kind`.
    pub fn new(kind: Kind, limit: usize) -> Self {
        Gate {
            core: Mutex::new(GateCore::new(kind, limit)),
            cv: Condvar::new(),
            origin: Instant::now(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateCore> {
        self.core.lock_or_recover()
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Sets `guest`'s share.
    pub fn set_share(&self, guest: u64, share: u32) {
        self.lock().set_share(guest, share);
    }

    /// Waits for `guest`'s call to be admitted.
    pub fn enter(&self, guest: u64) -> Pass<'_> {
        let mut c = self.lock();
        let ticket = c.arrive(guest);
        loop {
            let again = c.admit(self.now());
            if c.take_admitted(ticket) {
                drop(c);
                self.cv.notify_all();
                return Pass {
                    gate: self,
                    ticket,
                    start: Instant::now(),
                };
            }
            c = match again {
                Some(at) => {
                    let wait = Duration::from_nanos(at.saturating_sub(self.now()));
                    self.cv.wait_timeout_or_recover(c, wait).0
                }
                None => self.cv.wait_or_recover(c),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_at_a_time_round_robin_between_guests() {
        let mut g = GateCore::new(Kind::RoundRobin, 1);
        let a1 = g.arrive(1);
        let a2 = g.arrive(1);
        let b1 = g.arrive(2);
        g.admit(0);
        assert!(g.take_admitted(a1));
        assert!(
            !g.take_admitted(b1) && !g.take_admitted(a2),
            "one at a time"
        );
        g.done(a1, 10, 10);
        g.admit(10);
        assert!(
            g.take_admitted(b1),
            "the other guest before a's second call"
        );
        g.done(b1, 10, 20);
        g.admit(20);
        assert!(g.take_admitted(a2));
        assert_eq!(g.waiting(), 0);
    }

    #[test]
    fn wfq_favours_the_guest_with_the_larger_share() {
        let mut g = GateCore::new(Kind::Wfq, 1);
        g.set_share(1, 100);
        g.set_share(2, 400);
        let mut served = [0u32; 3];
        let mut now = 0;
        let mut tickets: Vec<(u64, Ticket)> = Vec::new();
        for _ in 0..20 {
            tickets.push((1, g.arrive(1)));
            tickets.push((2, g.arrive(2)));
        }
        for _ in 0..20 {
            g.admit(now);
            let (guest, t) = *tickets
                .iter()
                .find(|(_, t)| g.take_admitted(*t))
                .expect("one admitted");
            tickets.retain(|(_, x)| *x != t);
            served[guest as usize] += 1;
            now += 1_000_000;
            g.done(t, 1_000_000, now);
        }
        assert!(served[2] >= 3 * served[1], "{served:?}");
    }
}
