//! Sharing a device between guests: device-time accounting per guest, the device's
//! scheduler (`virtsocd --scheduler`, [`virtsoc_sched`]), the policy's shares, rate caps and
//! allow-lists as the device worker applies them.
//!
//! **Device time** of a device command is its busy period on the device: from the later of
//! its dispatch and the previous command's answer on this device, to its answer
//! ([`super::Reply`] being sent). For a device that runs one command at a time this is
//! dispatch to answer; for the GPU, whose submissions run in order while several guests' are
//! queued, it does not count the time a submission waited behind another guest's. Accesses
//! (begin/end_access, run by the worker itself, not queued on the device) count from dispatch
//! to answer and stay out of the commands' chain.
//!
//! **Continuous accounting.** [`Accounting::usage`] counts the command in service too: the
//! oldest command not yet answered has been on the device since the later of its dispatch and
//! the previous answer, and that time so far is its guest's already (AvA's continuous
//! accounting, against counting a command's whole time at its completion). A reader sampling
//! every second so sees each guest's device time up to that instant, not up to its last
//! completion: a long command no longer lands whole in the window it ends in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtsoc_fence::queue::DoneToken;
use virtsoc_proto::{Opcode, Request};
use virtsoc_sched::policy::Policy;

use virtsoc_rate::{TokenBucket, REQUEST};
use virtsoc_sched::{GuestId, Kind, Nanos, Pick, Scheduler};
use virtsoc_sync::LockExt;

use super::{DeviceSlot, Reply};
use crate::policy::PolicyStore;
use crate::session::Session;

/// How the devices are shared: the scheduler kind and the policy; and the guests' CPU
/// weights, where the daemon may set them (`--cpu-cgroup`).
#[derive(Debug, Clone, Default)]
pub struct Sharing {
    /// The scheduler each device runs (`--scheduler`).
    pub scheduler: Kind,
    /// The per-guest policy (`--policy`), reloadable.
    pub policy: Arc<PolicyStore>,
    /// The guests' CPU cgroups, when the daemon may set CPU weights (`--cpu-cgroup`).
    pub cgroups: Option<Arc<crate::cgroup::CpuCgroups>>,
}

impl Sharing {
    /// Gives guest `guest_id` (named `name`, its process `pid`) a CPU cgroup with the
    /// policy's share as its weight, if the daemon steers CPU weights; says why not in the
    /// log.
    pub fn attach_cpu(&self, guest_id: virtsoc_svm::GuestId, name: &str, pid: Option<u32>) {
        let Some(cg) = &self.cgroups else { return };
        let Some(pid) = pid else {
            return log::warn!("cpu weight: guest {guest_id} ({name}): its process is unknown");
        };
        let share = self.policy.current().for_guest(name).shares;
        match cg.attach(guest_id, name, pid, share) {
            Ok(()) => log::info!(
                "cpu weight: guest {guest_id} ({name}), process {pid}: {} {} in {}",
                cg.version().file(),
                cg.version().weight_of(share),
                cg.dir_of(guest_id).display()
            ),
            Err(e) => log::warn!("cpu weight: guest {guest_id} ({name}) not steered: {e}"),
        }
    }

    /// Makes the guests' CPU weights follow the policy's shares when it changes (on SIGHUP,
    /// a control API reload or a guest's entry set): see [`crate::cgroup::CpuCgroups::reweight`].
    pub fn follow_policy_with_cpu_weights(&self) {
        let Some(cg) = self.cgroups.clone() else {
            return;
        };
        self.policy.on_change(move |p| {
            cg.reweight(&|name| p.for_guest(name).shares);
            log::info!("cpu weight: guests re-weighted from the new policy");
        });
    }

    /// The guest left: its CPU cgroup goes.
    pub fn detach_cpu(&self, guest_id: virtsoc_svm::GuestId) {
        if let Some(cg) = &self.cgroups {
            if cg.weight(guest_id).is_none() {
                return;
            }
            match cg.detach(guest_id) {
                Ok(()) => log::info!("cpu weight: guest {guest_id} released its cgroup"),
                Err(e) => log::warn!("cpu weight: {e}"),
            }
        }
    }
}

/// Per-guest views of a device, for the control API and the feedback loop.
impl DeviceSlot {
    /// Each guest's use of this device (device time, requests, refusals).
    pub fn usage(&self) -> HashMap<GuestId, Usage> {
        self.acct.usage()
    }

    /// Commands queued on this device by `guest`.
    pub fn depth_of(&self, guest: virtsoc_svm::GuestId) -> usize {
        let q = self.queues.lock_or_recover();
        q.iter()
            .filter(|(s, _)| s.guest_id() == guest)
            .map(|(_, q)| q.len())
            .sum()
    }

    /// Guests with a queue on this device, by id: their names.
    pub fn guest_names(&self) -> HashMap<u64, String> {
        let q = self.queues.lock_or_recover();
        q.iter()
            .map(|(s, _)| (s.guest_id().0, s.name().to_string()))
            .collect()
    }

    /// The name of this device's scheduler.
    pub fn scheduler(&self) -> &'static str {
        self.acct.scheduler()
    }
}

/// One guest's use of one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Requests answered (commands and accesses).
    pub requests: u64,
    /// Device time of those requests, in nanoseconds.
    pub device_ns: u64,
    /// Requests refused by the policy.
    pub denied: u64,
}

#[derive(Default)]
struct Book {
    usage: HashMap<GuestId, Usage>,
    last_done: Nanos,
    /// Device commands dispatched and not answered yet, in dispatch order: (ticket, guest,
    /// dispatch time).
    running: Vec<(u64, GuestId, Nanos)>,
    next_ticket: u64,
}

impl Book {
    /// Each guest's use, the command in service counted up to `now`.
    fn usage_at(&self, now: Nanos) -> HashMap<GuestId, Usage> {
        let mut usage = self.usage.clone();
        if let Some((_, guest, t0)) = self.running.first() {
            let start = (*t0).max(self.last_done);
            if now > start {
                usage.entry(*guest).or_default().device_ns += now - start;
            }
        }
        usage
    }
}

/// A device's accounting and scheduler, shared by its worker and the answers of its
/// requests (which may come from other threads: the GPU's poller).
pub struct Accounting {
    epoch: Instant,
    book: Mutex<Book>,
    sched: Mutex<Box<dyn Scheduler>>,
    /// The device answers commands that wait for a worker apart from its thread
    /// ([`Device::answers_apart`](super::Device::answers_apart)).
    apart: bool,
}

impl Accounting {
    /// Accounting with a scheduler of `kind`.
    pub fn new(kind: Kind) -> Self {
        Accounting {
            epoch: Instant::now(),
            book: Mutex::new(Book::default()),
            sched: Mutex::new(kind.build()),
            apart: false,
        }
    }

    /// The same for a device that answers commands waiting for a worker apart from its
    /// thread ([`Device::answers_apart`](super::Device::answers_apart)): its scheduler is
    /// told of no command running on it ([`Scheduler::commands_running`]), since none holds
    /// its thread once the next is dispatched.
    pub fn with_apart(mut self, apart: bool) -> Self {
        self.apart = apart;
        self
    }

    /// The same with at most `n` commands on the device at once
    /// ([`virtsoc_sched::Scheduler::set_max_running`]).
    pub fn with_max_running(self, n: usize) -> Self {
        self.sched.lock_or_recover().set_max_running(n);
        self
    }

    /// The same with turns of `turn` ([`virtsoc_sched::Scheduler::set_turn`]).
    pub fn with_turn(self, turn: Duration) -> Self {
        self.sched
            .lock_or_recover()
            .set_turn(turn.as_nanos() as Nanos);
        self
    }

    /// Nanoseconds since the device started.
    pub fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// The scheduler's name.
    pub fn scheduler(&self) -> &'static str {
        self.sched.lock_or_recover().name()
    }

    /// A device command of `guest` was dispatched at `t0`: it is running until
    /// [`finish`](Self::finish) with the ticket this returns.
    pub fn begin(&self, guest: GuestId, t0: Nanos) -> u64 {
        let mut b = self.book.lock_or_recover();
        let ticket = b.next_ticket;
        b.next_ticket += 1;
        b.running.push((ticket, guest, t0));
        ticket
    }

    /// A request of `guest` dispatched at `t0` has been answered; `command`: the ticket of a
    /// device command ([`begin`](Self::begin), in the device's order of execution), else an
    /// access; `measured`: the device time the device measured itself
    /// ([`Reply::busy_for`]), counted as it is, outside the commands' chain.
    pub fn finish(&self, guest: GuestId, t0: Nanos, command: Option<u64>, measured: Option<u64>) {
        let now = self.now();
        let ns = {
            let mut b = self.book.lock_or_recover();
            if let Some(ticket) = command {
                b.running.retain(|(t, _, _)| *t != ticket);
            }
            let start = if let Some(ns) = measured {
                now.saturating_sub(ns)
            } else if command.is_some() {
                let s = t0.max(b.last_done).min(now);
                b.last_done = now;
                s
            } else {
                t0.min(now)
            };
            let u = b.usage.entry(guest).or_default();
            u.requests += 1;
            u.device_ns += now - start;
            now - start
        };
        let mut sched = self.sched.lock_or_recover();
        if command.is_some() {
            sched.completed(guest, ns, now);
        } else {
            sched.access(guest, ns, now);
        }
    }

    /// A request of `guest` was refused by the policy.
    pub fn denied(&self, guest: GuestId) {
        let mut b = self.book.lock_or_recover();
        b.usage.entry(guest).or_default().denied += 1;
    }

    /// Device commands dispatched and not answered yet.
    pub fn commands_running(&self) -> usize {
        self.book.lock_or_recover().running.len()
    }

    /// Every guest's use of the device so far, the command in service counted up to now.
    pub fn usage(&self) -> HashMap<GuestId, Usage> {
        let now = self.now();
        self.book.lock_or_recover().usage_at(now)
    }

    /// Sets `guest`'s share on this device (the feedback loop).
    pub fn set_share(&self, guest: GuestId, share: u32) {
        self.with_sched(|s| s.set_share(guest, share));
    }

    /// Boosts `guest` on this device, or ends its boost (the feedback loop).
    pub fn set_boost(&self, guest: GuestId, on: bool) {
        self.with_sched(|s| s.set_boost(guest, on));
    }

    fn with_sched<T>(&self, f: impl FnOnce(&mut dyn Scheduler) -> T) -> T {
        f(self.sched.lock_or_recover().as_mut())
    }

    fn forget(&self, guest: GuestId) {
        let mut b = self.book.lock_or_recover();
        b.usage.remove(&guest);
        b.running.retain(|(_, g, _)| *g != guest);
        drop(b);
        self.with_sched(|s| s.forget(guest));
    }
}

/// The worker's side: which guests it has applied the policy to, and their rate caps.
pub(super) struct Arbiter {
    sharing: Sharing,
    generation: Option<u64>,
    known: HashMap<GuestId, Option<TokenBucket>>,
}

impl Arbiter {
    pub(super) fn new(sharing: Sharing) -> Self {
        Arbiter {
            sharing,
            generation: None,
            known: HashMap::new(),
        }
    }

    pub(super) fn policy(&self) -> &Arc<PolicyStore> {
        &self.sharing.policy
    }

    fn apply(&mut self, acct: &Accounting, guest: GuestId, name: &str) {
        let policy = self.sharing.policy.current();
        let p = policy.for_guest(name);
        acct.with_sched(|s| s.set_share(guest, p.shares));
        let bucket = p.rate_cap.map(TokenBucket::per_second);
        self.known.insert(guest, bucket);
    }

    /// Chooses the next guest among `ready` (guest, name) pairs; `busy`: guests with a
    /// request running on the device. Guests over their rate cap wait for a token.
    pub(super) fn pick(
        &mut self,
        acct: &Accounting,
        ready: &[(GuestId, &str)],
        busy: &[GuestId],
    ) -> Pick {
        let gen = self.sharing.policy.generation();
        if self.generation != Some(gen) {
            self.generation = Some(gen);
            self.known.clear();
        }
        for (g, name) in ready {
            if !self.known.contains_key(g) {
                self.apply(acct, *g, name);
            }
        }
        let now = acct.now();
        let mut wake = Nanos::MAX;
        let mut eligible = Vec::with_capacity(ready.len());
        for (g, _) in ready {
            match self.known.get_mut(g).and_then(Option::as_mut) {
                Some(b) => {
                    let at = b.ready_at(now, REQUEST);
                    if at > now {
                        wake = wake.min(at);
                    } else {
                        eligible.push(*g);
                    }
                }
                None => eligible.push(*g),
            }
        }
        let pick = if eligible.is_empty() {
            Pick::Wait
        } else {
            let commands = if acct.apart {
                0
            } else {
                acct.commands_running()
            };
            acct.with_sched(|s| {
                s.commands_running(commands);
                s.pick(&eligible, busy, now)
            })
        };
        match pick {
            Pick::Serve(g) => {
                if let Some(Some(b)) = self.known.get_mut(&g) {
                    let _ = b.take(now, REQUEST);
                }
                Pick::Serve(g)
            }
            Pick::Until(t) => Pick::Until(t.min(wake)),
            Pick::Wait if wake != Nanos::MAX => Pick::Until(wake),
            Pick::Wait => Pick::Wait,
        }
    }

    /// The guest's queue on this device is gone.
    pub(super) fn forget(&mut self, acct: &Accounting, guest: GuestId) {
        self.known.remove(&guest);
        acct.forget(guest);
    }
}

/// Whether the policy lets the guest named `name` send `req` to this device.
pub(super) fn permitted(slot: &DeviceSlot, policy: &Policy, name: &str, req: &Request) -> bool {
    let p = policy.for_guest(name);
    let device = slot.device.name();
    if Opcode::from_u32(req.opcode).is_some_and(Opcode::runs_device_command) {
        crate::policy::allows_command(p, slot.id, device, req.args[0])
    } else {
        p.allows_device(device)
    }
}

/// Marks a queue busy (its flag `busy`) and makes the reply of its request `req`, which
/// clears the mark, accounts the request's device time and wakes the worker once sent.
pub(super) fn start(
    slot: &DeviceSlot,
    busy: &Arc<AtomicBool>,
    session: &Arc<Session>,
    req: Request,
    token: DoneToken,
) -> Reply {
    let flag = busy.clone();
    flag.store(true, Ordering::Release);
    let wake = slot.waker();
    let acct = slot.acct.clone();
    let (guest, t0) = (session.guest_id(), slot.acct.now());
    let command = Opcode::from_u32(req.opcode)
        .is_some_and(Opcode::runs_device_command)
        .then(|| {
            slot.acct.with_sched(|s| s.dispatched(guest, t0));
            slot.acct.begin(guest, t0)
        });
    Reply {
        session: session.clone(),
        seq: req.seq,
        token: Some(token),
        busy_ns: None,
        ends: None,
        on_sent: Some(Box::new(move |measured| {
            acct.finish(guest, t0, command, measured);
            flag.store(false, Ordering::Release);
            wake();
        })),
    }
}

/// The device time of the commands of a device that runs apart in a worker process (a
/// guest's GLES render worker, a decoder's worker), from the worker's CPU time as the kernel
/// counts it, read by the daemon (`virtsoc_sandbox::cpu_ns_of`; a worker taken over by a
/// hostile input cannot misstate it) ([`Reply::busy_for`](super::Reply::busy_for)): what the
/// guest's work cost, wherever and whenever it ran, rather than the wall time of the device
/// thread's call. A render worker's batch is charged at least its wall time (a GPU's time is
/// not the worker's CPU time: [`batch`](Self::batch)); a decoder's command is not
/// ([`measured`](Self::measured)).
pub(crate) struct DeviceClock {
    pub(crate) cpus: u64,
    pub(crate) cpu_ns: u64,
    pub(crate) at: std::time::Instant,
}

impl DeviceClock {
    pub(crate) fn new() -> Self {
        DeviceClock {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
            cpu_ns: 0,
            at: std::time::Instant::now(),
        }
    }

    /// A clock for a worker that has used `cpu_ns` already (its start, before it served
    /// this guest): only what it uses from now on is charged.
    pub(crate) fn since(cpu_ns: u64) -> Self {
        DeviceClock {
            cpu_ns,
            ..DeviceClock::new()
        }
    }

    /// The device time of a command from clocks the kernel keeps, which no worker can
    /// misstate: the worker's CPU time since the previous charge (`cpu_ns`, its CPU time so
    /// far as this process read it) plus `own`, the CPU time the command took on the
    /// device's thread (reading the guest's packet, writing it to the worker, placing the
    /// pictures). No floor at the command's wall time: a software decoder's work is CPU
    /// time, and a short command's wall time on a busy host also holds its wait for a CPU
    /// (the worker woken behind other guests' processes), which charged the guests of small
    /// pictures most (with 8 guests a 640x360 picture cost 27-58% more than alone by the
    /// wall, 20-24% by CPU time; a 1080p one 0-13% either way: `docs/results.md`, stop 46).
    pub(crate) fn measured(&mut self, cpu_ns: u64, own: Duration) -> u64 {
        let spent = cpu_ns.saturating_sub(self.cpu_ns);
        self.cpu_ns = self.cpu_ns.max(cpu_ns);
        spent.saturating_add(own.as_nanos() as u64)
    }

    /// The device time of a batch whose round trip took `wall`, after which the worker's
    /// CPU time so far was `cpu_ns`: the CPU time since the previous batch, at most the wall
    /// time since then times the host's CPUs, at least `wall`.
    pub(crate) fn batch(&mut self, wall: Duration, cpu_ns: u64) -> u64 {
        let since = self.at.elapsed();
        self.at = std::time::Instant::now();
        let ceiling = (since.as_nanos() as u64).saturating_mul(self.cpus);
        let spent = cpu_ns.saturating_sub(self.cpu_ns).min(ceiling);
        self.cpu_ns = self.cpu_ns.max(cpu_ns);
        spent.max(wall.as_nanos() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_in_service_counts_up_to_now() {
        let mut b = Book::default();
        b.running.push((0, GuestId(1), 10));
        b.running.push((1, GuestId(2), 12));
        // Guest 1's command is on the device since 10; guest 2's waits behind it.
        let u = b.usage_at(25);
        assert_eq!(u[&GuestId(1)].device_ns, 15);
        assert!(!u.contains_key(&GuestId(2)));
        // Guest 1's answered at 30 (20 ns counted); guest 2's started then.
        b.running.remove(0);
        b.last_done = 30;
        b.usage.entry(GuestId(1)).or_default().device_ns = 20;
        let u = b.usage_at(34);
        assert_eq!(u[&GuestId(1)].device_ns, 20);
        assert_eq!(u[&GuestId(2)].device_ns, 4);
        // A reader before the answer's time sees nothing negative.
        assert_eq!(
            b.usage_at(29).get(&GuestId(2)).map_or(0, |u| u.device_ns),
            0
        );
    }

    /// Under WFQ, which keeps one command on a device at a time, a command of guest 1 that
    /// waits apart (its worker) holds guest 2 on a device that answers apart only if the
    /// scheduler is told of it.
    #[test]
    fn a_command_waiting_apart_holds_no_other_guest_under_wfq() {
        let sharing = Sharing {
            scheduler: Kind::Wfq,
            ..Sharing::default()
        };
        for apart in [false, true] {
            let acct = Accounting::new(Kind::Wfq).with_apart(apart);
            let mut arbiter = Arbiter::new(sharing.clone());
            let (g1, g2) = (GuestId(1), GuestId(2));
            // Guest 1 once answered (10 ms a command), then dispatched again: running.
            let t0 = acct.now();
            assert_eq!(arbiter.pick(&acct, &[(g1, "a")], &[]), Pick::Serve(g1));
            acct.with_sched(|s| s.dispatched(g1, t0));
            let t = acct.begin(g1, t0);
            // (The clock must be past the 10 ms charged: no charge starts before it.)
            std::thread::sleep(std::time::Duration::from_millis(12));
            acct.finish(g1, t0, Some(t), Some(10_000_000));
            let t1 = acct.now();
            acct.with_sched(|s| s.dispatched(g1, t1));
            acct.begin(g1, t1);
            let got = arbiter.pick(&acct, &[(g2, "b")], &[g1]);
            match apart {
                true => assert_eq!(got, Pick::Serve(g2)),
                false => assert_ne!(got, Pick::Serve(g2), "held until guest 1's is about done"),
            }
        }
    }

    #[test]
    fn a_measured_device_time_is_counted_as_it_is() {
        let acct = Accounting::new(Kind::default());
        let t0 = acct.now();
        let (a, b) = (acct.begin(GuestId(1), t0), acct.begin(GuestId(2), t0));
        std::thread::sleep(std::time::Duration::from_millis(5));
        // Two commands that ran side by side (two render workers): each is charged what
        // the device measured, together more than the wall time since their dispatch.
        acct.finish(GuestId(1), t0, Some(a), Some(4_000_000));
        acct.finish(GuestId(2), t0, Some(b), Some(4_000_000));
        let u = acct.usage();
        assert_eq!(
            (u[&GuestId(1)].device_ns, u[&GuestId(2)].device_ns),
            (4_000_000, 4_000_000)
        );
        assert_eq!((u[&GuestId(1)].requests, u[&GuestId(2)].requests), (1, 1));
    }
}
