//! How a device shares itself between guests, as pure logic.
//!
//! Nothing here reads a clock, sleeps or starts a thread: every call takes the current time
//! (`now`, nanoseconds on any monotonic clock the caller chooses), so the device worker uses
//! the real clock and the tests a fake one.
//!
//! - [`Scheduler`]: which guest a device serves next, among the guests with a command ready.
//!   [`RoundRobin`](rr::RoundRobin) is the baseline (the device worker's historical order);
//!   [`Wfq`](wfq::Wfq) is start-time fair queueing on measured device time with per-guest
//!   shares; [`RateControl`](rate::RateControl) is AvA's windowed accounting with fixed-rate
//!   polling or AIMD delay control for devices that cannot be preempted.
//! - [`dfr::DfrController`]: the desired-frame-rate feedback loop of the multimedia VM
//!   scheduler (Algorithm 1), steering a multimedia guest's share from its presented rate.
//! - [`policy::Policy`]: the per-guest sharing policy (shares, rate caps, allowed devices and
//!   commands, memory limit, class) parsed from TOML or JSON.

pub mod dfr;
pub mod policy;
pub mod rate;
pub mod rr;
pub mod wfq;

#[cfg(test)]
mod tests;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    /// An unknown scheduler name.
    #[error("unknown scheduler {0:?} (round-robin, wfq, fixed-rate, aimd, feedback)")]
    UnknownScheduler(String),
    /// A policy file that does not parse or does not validate.
    #[error("policy line {line}: {msg}")]
    Policy {
        /// The line of the file at fault (1-based; 0 when the file as a whole is).
        line: usize,
        /// What is wrong there.
        msg: String,
    },
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, SchedError>;

/// A guest: the one typed id every crate uses ([`virtsoc_ids::GuestId`]).
pub use virtsoc_ids::GuestId;

/// Nanoseconds since an arbitrary origin.
pub type Nanos = u64;

/// One millisecond in [`Nanos`].
pub const MS: Nanos = 1_000_000;

/// What a scheduler answers when asked which guest to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Serve this guest's next command now.
    Serve(GuestId),
    /// Serve nobody now; ask again at this time (a rate control postponing every ready
    /// guest) or earlier if something changes.
    Until(Nanos),
    /// Serve nobody now; ask again when something changes (a command completes, a queue
    /// becomes ready).
    Wait,
}

/// A device's scheduling policy. The device worker calls [`pick`](Self::pick) with the guests
/// that have a command ready, [`dispatched`](Self::dispatched) when it starts a device command
/// and [`completed`](Self::completed) with the command's measured device time when its reply
/// is sent; an access (begin/end_access) is reported once done, by [`access`](Self::access).
pub trait Scheduler: Send {
    /// The name the daemon's `--scheduler` flag uses.
    fn name(&self) -> &'static str;
    /// Sets a guest's share (weight, at least 1; guests never told have share 100).
    fn set_share(&mut self, guest: GuestId, share: u32);
    /// The guest is gone: forget its state.
    fn forget(&mut self, guest: GuestId);
    /// Chooses among `ready` (guests with a command ready, no duplicates); `busy` are guests
    /// with a command still running on the device.
    fn pick(&mut self, ready: &[GuestId], busy: &[GuestId], now: Nanos) -> Pick;
    /// A command of `guest` started.
    fn dispatched(&mut self, guest: GuestId, now: Nanos);
    /// A command of `guest` finished after `device_ns` of device time.
    fn completed(&mut self, guest: GuestId, device_ns: Nanos, now: Nanos);
    /// An access of `guest` (begin/end_access, not a device command: run by the worker, never
    /// overlapping the guest's other requests on the device) took `device_ns`. Charged when
    /// it is done, and kept out of the guest's usual command cost. By default a command
    /// dispatched and completed at once.
    fn access(&mut self, guest: GuestId, device_ns: Nanos, now: Nanos) {
        self.dispatched(guest, now);
        self.completed(guest, device_ns, now);
    }
    /// Boosts `guest` (a multimedia guest behind its desired frame rate) above the others,
    /// or ends its boost. Schedulers without classes ignore it.
    fn set_boost(&mut self, _guest: GuestId, _on: bool) {}
    /// How many device commands are on the device now (dispatched, not answered; accesses
    /// are not counted), told before each [`pick`](Self::pick). Ignored by default.
    fn commands_running(&mut self, _n: usize) {}
    /// Lets the guest served keep the device for its next ready commands, up to `turn` of
    /// device time in a row, before the others get their say: for a device where a change
    /// of guest makes the next command slower (decoders evicting each other's pictures from
    /// the caches). 0 (the default): no turns. Schedulers without turns ignore it.
    fn set_turn(&mut self, _turn: Nanos) {}
    /// How many device commands may be on the device at once (at least 1): for an
    /// asynchronous device that does more with the next command already queued behind the
    /// running one. Schedulers that do not hold commands back ignore it.
    fn set_max_running(&mut self, _n: usize) {}
}

/// The schedulers the daemon offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    /// Each guest with work in turn, one command at a time (the baseline).
    #[default]
    RoundRobin,
    /// Weighted fair queueing on measured device time (WF2Q+), shares from the policy.
    Wfq,
    /// AvA's fixed-rate control: a guest over its share of the window's device time is
    /// checked again after a fixed delay.
    FixedRate,
    /// AvA's AIMD control: a guest over its share is checked again after a delay that halves
    /// (`b`) each window it exhausts its share and grows by `a` otherwise.
    Aimd,
    /// WFQ with multimedia boost, steered by the DFR feedback loop ([`dfr`]) the daemon runs
    /// for multimedia guests.
    Feedback,
}

impl Kind {
    /// Every kind, in the order benches report them.
    pub const ALL: [Kind; 5] = [
        Kind::RoundRobin,
        Kind::Wfq,
        Kind::FixedRate,
        Kind::Aimd,
        Kind::Feedback,
    ];

    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Kind::RoundRobin => "round-robin",
            Kind::Wfq => "wfq",
            Kind::FixedRate => "fixed-rate",
            Kind::Aimd => "aimd",
            Kind::Feedback => "feedback",
        }
    }

    /// A fresh scheduler of this kind with default parameters.
    pub fn build(self) -> Box<dyn Scheduler> {
        match self {
            Kind::RoundRobin => Box::new(rr::RoundRobin::default()),
            Kind::Wfq => Box::new(wfq::Wfq::new(wfq::WfqConfig::default())),
            Kind::FixedRate => Box::new(rate::RateControl::fixed(rate::RateConfig::default())),
            Kind::Aimd => Box::new(rate::RateControl::aimd(rate::RateConfig::default())),
            Kind::Feedback => Box::new(wfq::Wfq::feedback(wfq::WfqConfig::default())),
        }
    }
}

impl std::str::FromStr for Kind {
    type Err = SchedError;
    fn from_str(s: &str) -> Result<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| SchedError::UnknownScheduler(s.to_string()))
    }
}

/// The share a guest has until told otherwise.
pub const DEFAULT_SHARE: u32 = 100;
