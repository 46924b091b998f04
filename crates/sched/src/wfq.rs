//! Weighted fair queueing on measured device time: start-time fair queueing (SFQ) over
//! guests.
//!
//! Every guest has a virtual finish time `F`: each command of device time `t` moves it by
//! `t / share`. The device serves the ready guest with the smallest `F`, so over time each
//! backlogged guest gets device time in proportion to its share, whatever its commands cost.
//! A command's cost is known only when it completes (the GPU answers at GPU completion): at
//! dispatch the guest is charged its recent average command cost, corrected at completion.
//! Accesses (begin/end_access, microseconds beside a composition) are charged when done and
//! kept out of that average, which would otherwise swing between an access's cost and a
//! command's and misjudge every command in flight.
//!
//! - The choice is WF2Q+'s: among the guests whose next command would start no later than
//!   the system virtual time `V` (eligible: not ahead of their fluid share), the one whose
//!   next command would finish first; if none is eligible, the earliest start. Plain
//!   start-time fair queueing lets a guest run ahead of its fluid share by several commands;
//!   this keeps every guest within about one command of it.
//! - `V` moves with the device time done, divided by the shares of the guests wanting the
//!   device, and is never behind the smallest `F` of the guests with work (ready or running).
//!   A new guest starts at `V`, so it neither starves the others nor is starved.
//! - A guest that had no work (or could not keep up) banks little: its `F` is never more
//!   than `credit` of its own device time behind `V` (50 ms). A guest coming back with a
//!   bank would take the device from the others in the next accounting window, making that
//!   window unfair too; AvA's 500 ms window is the other extreme.
//! - An asynchronous device has at most `max_running` device commands (1 by default, the
//!   GPU's 2 since stop 54, [`Scheduler::set_max_running`]; accesses, which the worker
//!   runs itself, are not counted) at once, plus, with a `lead` (0 by
//!   default since stop 52; 1 ms before), one more released that long before the last of
//!   them is expected to answer. Expected: its start (the later
//!   of its dispatch and the previous answer) plus its guest's average command cost. Until
//!   that instant the worker sleeps on its event wait with it as the deadline
//!   ([`Pick::Until`]), or until an answer comes first. The device then has the next
//!   command when the running one ends, instead of idling for the round trip between an
//!   answer and the next submission (the answer, the worker's wake-up and choice, the
//!   submission; with `lead` 0, where each choice waits for the answer, WFQ's throughput
//!   was 7-15% below one guest alone in stop 19's full bench on lavapipe, round robin's
//!   about 0%). The
//!   choice is made on the accounts of every command answered, the running one charged its
//!   guest's average cost at dispatch: nothing else is answered between that instant and
//!   the running command's answer, so it is as fresh as a choice at the answer but for that
//!   command's actual cost and the guests that become ready within the lead. More on the
//!   device at once (`max_running` above 1) makes each choice a queue's length ahead of the
//!   device. A boosted guest is not held by it. Why no lead by default: on lavapipe (stop
//!   52, 8 GPU guests of three sizes, 3-8 runs each) a lead of 1 ms or 0.2 ms left guests of
//!   one size 2.3-3.9% apart in what they got done per second (1.4-2.2% without), and the
//!   grade across sizes at a median of 13.2% (8.7% without); without it the device idles
//!   about 3% of the time (the round trip after each answer: busy 96.7-97.0% against
//!   100%), and the guests together still did as much as one guest alone (overhead median
//!   1.8%, within the 5% target) and as round robin (-0.8 to 1.5%).
//! - A device with asynchronous commands (several guests' work queued on it at once) would
//!   serve whoever is ready while an expensive command runs: a ready guest more than `slack`
//!   of its own device time ahead of a guest whose command is still running waits for that
//!   command's completion instead.
//! - Guests are closed loops (a guest sends its next command once the last one answered): a
//!   guest that had work `anticipate` ago but has none ready this instant is still counted as
//!   wanting the device, so the others do not run ahead of it during its round trip (the
//!   device waits at most `anticipate` for it).
//! - Turns ([`WfqConfig::turn`], 0 by default; the codec device's is 4 ms): the guest
//!   served goes on being served while it has a command ready, until the commands it was
//!   served in a row are expected to have taken the turn's device time; then the choice is
//!   WF2Q+'s again. For a device where a change of guest costs the next command (the codec:
//!   a decoder whose reference pictures and tables the other guests' decoders evicted from
//!   the caches decodes 20-50% slower, `decode_probe`), so that one change serves several
//!   commands. A turn is charged like any commands (the guest then waits the longer), so
//!   each guest stays within about a turn of its fluid share; boosted guests have no turns.
//! - As the `feedback` scheduler, boosted guests (multimedia guests behind their desired frame
//!   rate, [`Scheduler::set_boost`]) go first whenever they have a command ready, and while
//!   any guest is boosted the others have at most one command running at a time, so a boosted
//!   guest's next command waits behind at most one other on a device that runs submissions in
//!   order. Nor does another guest start a command whose usual cost would run into the
//!   boosted guest's next frame (expected one frame period, learnt from when its bursts of
//!   work start, after the last one): devices cannot be preempted, so a long command started
//!   just before a frame would hold it back whatever the order afterwards.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::{GuestId, Nanos, Pick, Scheduler, DEFAULT_SHARE, MS};

/// Parameters of [`Wfq`].
#[derive(Debug, Clone, Copy)]
pub struct WfqConfig {
    /// How far (its own device time) a guest may be behind the system's virtual time when
    /// it has work again.
    pub credit: Nanos,
    /// How far (its own device time) a ready guest may be ahead of a running one.
    pub slack: Nanos,
    /// Weight of the newest sample in a guest's average command cost (0..=1).
    pub cost_weight: f64,
    /// How long a guest that had work still counts as wanting the device.
    pub anticipate: Nanos,
    /// Most commands on the device at once (several guests' queued on an asynchronous
    /// device): enough to keep it busy, few enough that each choice is made on fresh
    /// accounts, not a queue's length ahead of the device.
    pub max_running: usize,
    /// With `max_running` commands on the device, one more is released this long before
    /// the last of them is expected to finish (its guest's average command cost after its
    /// start), so that it is on the device when that one answers: the dispatch round trip
    /// (answer, choice, submission) no longer leaves the device idle. 0: the next choice
    /// waits for an answer (the default).
    pub lead: Nanos,
    /// A guest served keeps the device for its next commands while it has one ready, until
    /// its commands dispatched in a row are expected (each at its guest's average cost) to
    /// take this much device time: a turn ([`Scheduler::set_turn`]). 0: every choice is a
    /// new one.
    pub turn: Nanos,
}

impl Default for WfqConfig {
    fn default() -> Self {
        WfqConfig {
            credit: 50 * MS,
            slack: 2 * MS,
            cost_weight: 0.5,
            anticipate: 2 * MS,
            max_running: 1,
            lead: 0,
            turn: 0,
        }
    }
}

/// Most charges a guest may have outstanding (one per command not yet completed).
const MAX_PENDING: usize = 64;

#[derive(Debug)]
struct Flow {
    share: f64,
    finish: f64,
    cost: f64,
    pending: VecDeque<f64>,
}

/// Start-time fair queueing over measured device time.
#[derive(Debug)]
pub struct Wfq {
    cfg: WfqConfig,
    flows: HashMap<GuestId, Flow>,
    shares: HashMap<GuestId, u32>,
    vtime: f64,
    /// When each guest last had work (ready, running or just completed).
    seen: HashMap<GuestId, Nanos>,
    /// Boosted guests (feedback scheduler only).
    boosted: HashSet<GuestId>,
    /// When each boosted guest's last burst of work started, and its average period.
    frames: HashMap<GuestId, (Nanos, f64)>,
    feedback: bool,
    /// Device commands on the device now ([`Scheduler::commands_running`]).
    commands: usize,
    /// Device commands dispatched and not answered, in dispatch order: guest, dispatch time.
    inflight: VecDeque<(GuestId, Nanos)>,
    /// When the last device command answered.
    last_done: Nanos,
    /// The guest whose turn it is and the device time dispatched in it.
    turn: Option<(GuestId, f64)>,
}

impl Wfq {
    /// A scheduler with no guests yet.
    pub fn new(cfg: WfqConfig) -> Self {
        Wfq {
            cfg,
            flows: HashMap::new(),
            shares: HashMap::new(),
            vtime: 0.0,
            seen: HashMap::new(),
            boosted: HashSet::new(),
            frames: HashMap::new(),
            feedback: false,
            commands: 0,
            inflight: VecDeque::new(),
            last_done: 0,
            turn: None,
        }
    }

    /// WFQ with multimedia boost: the `feedback` scheduler.
    pub fn feedback(cfg: WfqConfig) -> Self {
        Wfq {
            feedback: true,
            ..Wfq::new(cfg)
        }
    }

    /// The system virtual time.
    pub fn vtime(&self) -> f64 {
        self.vtime
    }

    /// A guest's virtual finish time, if known.
    pub fn finish(&self, guest: GuestId) -> Option<f64> {
        self.flows.get(&guest).map(|f| f.finish)
    }

    fn flow(&mut self, guest: GuestId) -> &mut Flow {
        let share = f64::from(*self.shares.get(&guest).unwrap_or(&DEFAULT_SHARE));
        let v = self.vtime;
        self.flows.entry(guest).or_insert(Flow {
            share,
            finish: v,
            cost: 0.0,
            pending: VecDeque::new(),
        })
    }
}

impl Wfq {
    /// `t` of device time was done: the system's virtual time moves by it, shared by the
    /// guests wanting the device (WF2Q+'s `V = max(V + W / sum of shares, min start)`; the
    /// second term is applied in `pick`).
    fn advance(&mut self, t: f64) {
        let active: f64 = self
            .seen
            .keys()
            .filter_map(|g| self.flows.get(g).map(|f| f.share))
            .sum::<f64>()
            .max(1.0);
        self.vtime += t / active;
    }

    /// When the last command on the device is expected to answer: each command runs from
    /// the later of its dispatch and the previous one's answer for its guest's average
    /// command cost.
    fn expected_done(&self) -> Option<Nanos> {
        let mut end: Option<f64> = None;
        for (g, t0) in &self.inflight {
            let cost = self.flows.get(g).map_or(0.0, |f| f.cost);
            let start = end.unwrap_or(self.last_done as f64).max(*t0 as f64);
            end = Some(start + cost);
        }
        end.map(|e| e as Nanos)
    }

    /// With `max_running` commands on the device: `None` if one more may be dispatched now
    /// (the lead instant is past), else what to answer.
    fn hold(&self, now: Nanos) -> Option<Pick> {
        let cap = self.cfg.max_running.max(1);
        if self.commands < cap {
            return None;
        }
        if self.cfg.lead == 0 || self.commands > cap || self.inflight.len() != self.commands {
            return Some(Pick::Wait);
        }
        let release = self.expected_done()?.saturating_sub(self.cfg.lead);
        (now < release).then_some(Pick::Until(release))
    }

    /// If `cand` (not boosted) would run into a boosted guest's next frame: until when to
    /// hold it.
    fn next_frame_conflict(&self, cand: GuestId, now: Nanos) -> Option<Nanos> {
        if self.boosted.is_empty() || self.boosted.contains(&cand) {
            return None;
        }
        let cost = self.flows.get(&cand).map_or(0.0, |f| f.cost);
        let mut until: Option<Nanos> = None;
        for (start, period) in self.frames.values() {
            if *period <= 0.0 {
                continue;
            }
            let next = *start as f64 + period;
            // Late by half a period: it skipped a frame; do not wait for it.
            let give_up = next + period / 2.0;
            if (now as f64) < give_up && now as f64 + cost > next {
                let t = give_up as Nanos;
                until = Some(until.map_or(t, |u| u.min(t)));
            }
        }
        until
    }
}

impl Scheduler for Wfq {
    fn name(&self) -> &'static str {
        if self.feedback {
            "feedback"
        } else {
            "wfq"
        }
    }

    fn set_boost(&mut self, guest: GuestId, on: bool) {
        if !self.feedback {
            return;
        }
        if on {
            self.boosted.insert(guest);
        } else {
            self.boosted.remove(&guest);
            self.frames.remove(&guest);
        }
    }

    fn commands_running(&mut self, n: usize) {
        self.commands = n;
    }

    fn set_turn(&mut self, turn: Nanos) {
        self.cfg.turn = turn;
    }

    fn set_max_running(&mut self, n: usize) {
        self.cfg.max_running = n.max(1);
    }

    fn set_share(&mut self, guest: GuestId, share: u32) {
        let share = share.max(1);
        self.shares.insert(guest, share);
        if let Some(f) = self.flows.get_mut(&guest) {
            f.share = f64::from(share);
        }
    }

    fn forget(&mut self, guest: GuestId) {
        self.flows.remove(&guest);
        self.shares.remove(&guest);
        self.seen.remove(&guest);
        self.boosted.remove(&guest);
        self.frames.remove(&guest);
        self.inflight.retain(|(g, _)| *g != guest);
    }

    fn pick(&mut self, ready: &[GuestId], busy: &[GuestId], now: Nanos) -> Pick {
        if ready.is_empty() {
            return Pick::Wait;
        }
        let horizon = now.saturating_sub(self.cfg.anticipate);
        // A boosted guest with work again after a pause: a frame starts.
        for g in ready.iter().filter(|g| self.boosted.contains(g)) {
            if self.seen.get(g).is_some_and(|t| *t >= horizon) {
                continue;
            }
            let e = self.frames.entry(*g).or_insert((now, 0.0));
            let gap = now.saturating_sub(e.0) as f64;
            if gap > 0.0 && gap < 1e9 {
                e.1 = if e.1 == 0.0 {
                    gap
                } else {
                    0.5 * e.1 + 0.5 * gap
                };
            }
            e.0 = now;
        }
        for g in ready.iter().chain(busy) {
            self.flow(*g);
            self.seen.insert(*g, now);
        }
        self.seen.retain(|_, t| *t >= horizon);
        // Bounded credit: a returning guest is at most that far behind.
        let (v, credit) = (self.vtime, self.cfg.credit as f64);
        let mut min_active = f64::INFINITY;
        for g in ready.iter().chain(busy) {
            if let Some(f) = self.flows.get_mut(g) {
                f.finish = f.finish.max(v - credit / f.share);
                min_active = min_active.min(f.finish);
            }
        }
        if min_active.is_finite() {
            self.vtime = self.vtime.max(min_active);
        }
        // WF2Q+: among the guests not ahead of the system's virtual time (eligible), the one
        // whose next command would finish first; none eligible: the earliest start.
        let tags: Vec<(GuestId, f64, f64)> = ready
            .iter()
            .filter_map(|g| {
                let f = self.flows.get(g)?;
                Some((*g, f.finish, f.finish + f.cost / f.share))
            })
            .collect();
        let eligible = tags
            .iter()
            .filter(|t| t.1 <= self.vtime + 1e-6)
            .min_by(|a, b| a.2.total_cmp(&b.2));
        let earliest = tags.iter().min_by(|a, b| a.1.total_cmp(&b.1));
        let (cand, cf) = eligible
            .or(earliest)
            .map_or((ready[0], f64::INFINITY), |t| (t.0, t.1));
        if !self.boosted.is_empty() {
            let boosted = ready
                .iter()
                .filter(|g| self.boosted.contains(g))
                .filter_map(|g| self.flows.get(g).map(|f| (*g, f.finish)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            if let Some((g, _)) = boosted {
                return Pick::Serve(g);
            }
            if busy.iter().any(|g| !self.boosted.contains(g)) {
                return Pick::Wait;
            }
        }
        if let Some(p) = self.hold(now) {
            // The next choice waits for the lead instant (or an answer), made then on
            // accounts as fresh as the device allows.
            return p;
        }
        let turns = self.cfg.turn > 0 && self.boosted.is_empty();
        let in_turn = self
            .turn
            .filter(|(g, used)| turns && *used < self.cfg.turn as f64 && ready.contains(g));
        if let Some((g, _)) = in_turn {
            return Pick::Serve(g);
        }
        // The guests behind: running, or between two commands.
        let share = self.flows.get(&cand).map_or(1.0, |f| f.share);
        let limit = cf - self.cfg.slack as f64 / share;
        let mut wait = None;
        for (g, t) in &self.seen {
            if ready.contains(g) {
                continue;
            }
            let Some(f) = self.flows.get(g) else { continue };
            if f.finish < limit {
                let until = if busy.contains(g) {
                    Nanos::MAX
                } else {
                    t + self.cfg.anticipate
                };
                wait = Some(wait.map_or(until, |w: Nanos| w.min(until)));
            }
        }
        if wait.is_none() {
            if let Some(t) = self.next_frame_conflict(cand, now) {
                wait = Some(t);
            }
        }
        match wait {
            None => Pick::Serve(cand),
            Some(Nanos::MAX) => Pick::Wait,
            Some(t) => Pick::Until(t.max(now + 1)),
        }
    }

    fn dispatched(&mut self, guest: GuestId, now: Nanos) {
        if self.inflight.len() == MAX_PENDING {
            self.inflight.pop_front();
        }
        self.inflight.push_back((guest, now));
        let f = self.flow(guest);
        let est = f.cost;
        f.finish += est / f.share;
        if f.pending.len() == MAX_PENDING {
            f.pending.pop_front();
        }
        f.pending.push_back(est);
        self.turn = match self.turn {
            Some((g, used)) if g == guest => Some((g, used + est)),
            _ => Some((guest, est)),
        };
    }

    fn completed(&mut self, guest: GuestId, device_ns: Nanos, now: Nanos) {
        let w = self.cfg.cost_weight.clamp(0.0, 1.0);
        let t = device_ns as f64;
        if let Some(i) = self.inflight.iter().position(|(g, _)| *g == guest) {
            self.inflight.remove(i);
        }
        self.last_done = self.last_done.max(now);
        if !self.flows.contains_key(&guest) {
            return;
        }
        self.seen.insert(guest, now);
        self.advance(t);
        let Some(f) = self.flows.get_mut(&guest) else {
            return;
        };
        let est = f.pending.pop_front().unwrap_or(0.0);
        f.finish += (t - est) / f.share;
        f.cost = if f.cost == 0.0 {
            t
        } else {
            (1.0 - w) * f.cost + w * t
        };
    }

    fn access(&mut self, guest: GuestId, device_ns: Nanos, now: Nanos) {
        self.seen.insert(guest, now);
        self.advance(device_ns as f64);
        let f = self.flow(guest);
        f.finish += device_ns as f64 / f.share;
    }
}
