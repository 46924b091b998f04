//! How a session talks to its guest: one trait, three transports.
//!
//! - [`ShmLink`]: request/completion rings in the shared window, with doorbells — futexes for
//!   process guests, the virtio-serial port for VM guests. Requests being served or parked
//!   in a device queue (behind a fence wait) hold no completion slot: a completion that
//!   finds the ring full waits in the link's overflow, moved into the ring as the guest frees
//!   slots, and the host stops taking requests only while a ring's worth of completions waits
//!   there. So a guest that stops reading completions stalls only itself, and requests parked
//!   behind a fence wait never keep the host from taking the signal that releases them.
//! - [`StreamLink`]: frames on a TCP stream for remote guests; CPU-access bytes travel in the
//!   frames. A completion goes out at once from the thread that posts it when nothing waits
//!   before it and the socket takes it whole without blocking (one vectored send, no thread
//!   hand-off); otherwise it queues for the writer thread, which sends what is left of it:
//!   a slow reader never blocks a device worker, and no request is taken while
//!   [`STREAM_MAX_UNSENT`] completions wait to be sent (requests being served or parked
//!   behind a fence wait do not count, as on the rings). A CPU write's bytes are read off the
//!   socket straight into the host's copy of the guest's window when the link knows where
//!   they go ([`StreamLink::placing`]): no buffer in between.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use virtsoc_proto::ring::{host_rings, peer_sleeps, Doorbell, RingConsumer, RingProducer};
use virtsoc_proto::window_layout::{ctl, CONTROL_OFFSET};
use virtsoc_proto::{Completion, Request, SharedWindow};
use virtsoc_sync::LockExt;

mod stream;
pub use stream::StreamLink;

/// Completions waiting to be sent to a remote guest (its reading slow) before no more of its
/// requests are taken.
pub const STREAM_MAX_UNSENT: usize = 256;

/// A request and the bytes that came with it.
#[derive(Debug)]
pub struct Incoming {
    /// The request as the guest queued it.
    pub req: Request,
    /// Bytes that came with it (a remote guest's CPU write); empty for ring guests.
    pub payload: Vec<u8>,
    /// The payload's memory, charged to the guest while the request holds it (remote guests
    /// whose link charges: [`StreamLink::charging`]).
    pub charge: Option<virtsoc_svm::MemoryCharge>,
    /// The request's bytes were read straight into the window, where its placer said they
    /// go ([`StreamLink::placing`]); `payload` is empty.
    pub placed: bool,
}

/// Where a remote guest's CPU write goes in the host's copy of its window: for a request
/// whose frame carries `len` bytes, the window offset of its bytes when it is a valid CPU
/// write of exactly `len` bytes, else `None` (then the bytes are read into a buffer and the
/// request is checked as any other).
pub type PayloadPlacer = Box<dyn Fn(&Request, u64) -> Option<u64> + Send + Sync>;

/// Charges a remote guest's frame payload against its memory limit before it is read
/// ([`StreamLink::charging`]).
pub type PayloadCharger =
    Box<dyn Fn(u64) -> Result<virtsoc_svm::MemoryCharge, virtsoc_svm::SvmError> + Send + Sync>;

/// Why a link stopped.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The guest broke the transport protocol (ring emptied or full, bad frame); the text says
    /// what.
    #[error("the guest violated the transport protocol: {0}")]
    Violation(String),
    /// The guest's ring indices (or the window under them) are out of range.
    #[error("the guest violated the transport protocol: {0}")]
    Ring(#[from] virtsoc_proto::ProtoError),
}

/// The host end of a guest transport.
pub trait HostLink: Send + Sync {
    /// Blocks until the next request; `Ok(None)` once the link is closed.
    fn next(&self) -> Result<Option<Incoming>, LinkError>;
    /// Posts a completion (with the bytes of a remote CPU read). Never blocks on the guest.
    fn post(&self, c: Completion, payload: Vec<u8>) -> Result<(), LinkError>;
    /// Wakes `next` and hangs up.
    fn close(&self);
    /// Whether CPU-access bytes travel in the link (no window shared with the guest).
    fn carries_bulk(&self) -> bool;
}

/// Completions held by the host beyond the ring before the guest is in violation: far more
/// than any guest's queues allow in flight (the host stops taking requests at one ring's
/// worth, and what it took before is bounded by the per-device queue limits).
const OVERFLOW_HARD_MAX: usize = 1 << 20;

/// The completion ring and the completions waiting for room in it, in order.
struct Completions {
    ring: RingProducer<Completion>,
    overflow: VecDeque<Completion>,
}

impl Completions {
    /// Moves waiting completions into the ring while it has room; whether any moved.
    fn flush(&mut self) -> Result<bool, LinkError> {
        let mut moved = false;
        while let Some(c) = self.overflow.front() {
            if !self.ring.push(*c)? {
                break;
            }
            self.overflow.pop_front();
            moved = true;
        }
        Ok(moved)
    }
}

/// Rings in a shared window.
pub struct ShmLink {
    window: Arc<SharedWindow>,
    sq: Mutex<RingConsumer<Request>>,
    cq: Mutex<Completions>,
    popped: AtomicU64,
    posted: AtomicU64,
    host_bell: Box<dyn Doorbell>,
    guest_bell: Box<dyn Doorbell>,
    closed: AtomicBool,
    on_close: Box<dyn Fn() + Send + Sync>,
}

impl ShmLink {
    /// A link over `window` with the given doorbells; `on_close` hangs up the side channel.
    pub fn new(
        window: Arc<SharedWindow>,
        host_bell: Box<dyn Doorbell>,
        guest_bell: Box<dyn Doorbell>,
        on_close: Box<dyn Fn() + Send + Sync>,
    ) -> Self {
        let (sq, cq) = host_rings(&window);
        ShmLink {
            window,
            sq: Mutex::new(sq),
            cq: Mutex::new(Completions {
                ring: cq,
                overflow: VecDeque::new(),
            }),
            popped: AtomicU64::new(0),
            posted: AtomicU64::new(0),
            host_bell,
            guest_bell,
            closed: AtomicBool::new(false),
            on_close,
        }
    }

    fn in_flight(&self) -> u64 {
        // Saturating: a post the host never took a request for must not wrap the count.
        self.popped
            .load(Ordering::SeqCst)
            .saturating_sub(self.posted.load(Ordering::SeqCst))
    }

    /// Whether one more request may be taken: fewer completions than the ring holds wait in
    /// the overflow (those the guest has made room for are moved into the ring first).
    fn can_take(&self) -> Result<bool, LinkError> {
        let mut cq = self.cq.lock_or_recover();
        if cq.flush()? {
            self.guest_bell.notify();
        }
        let capacity = self.window.layout().cq_entries as usize;
        Ok(cq.overflow.len() < capacity)
    }
}

impl HostLink for ShmLink {
    fn next(&self) -> Result<Option<Incoming>, LinkError> {
        let mut sq = self.sq.lock_or_recover();
        loop {
            let mut ready = || {
                self.closed.load(Ordering::SeqCst)
                    || match (sq.available(), self.can_take()) {
                        (Ok(n), Ok(ok)) => n > 0 && ok,
                        _ => true,
                    }
            };
            // Completions an awake guest has not reaped: it may be waiting for the core this
            // thread spins on (`AdaptiveSpin::spin_behind`). A sleeping guest was woken by
            // the completion's doorbell, and the kernel places a woken thread by itself.
            let mut behind = || {
                !peer_sleeps(&self.window, ctl::GUEST_SLEEPING)
                    && self
                        .cq
                        .try_lock()
                        .is_ok_and(|cq| cq.ring.unconsumed().is_ok_and(|n| n > 0))
            };
            self.host_bell.wait_behind(&mut ready, &mut behind, None);
            if self.closed.load(Ordering::SeqCst) {
                return Ok(None);
            }
            let take = self.can_take()?;
            let avail = sq.available()?;
            if !take || avail == 0 {
                continue;
            }
            let req = sq
                .pop()?
                .ok_or_else(|| LinkError::Violation("ring emptied under the host".into()))?;
            self.popped.fetch_add(1, Ordering::SeqCst);
            return Ok(Some(Incoming {
                req,
                payload: Vec::new(),
                charge: None,
                placed: false,
            }));
        }
    }

    fn post(&self, mut c: Completion, _payload: Vec<u8>) -> Result<(), LinkError> {
        let mut cq = self.cq.lock_or_recover();
        c.queue_depth = self.in_flight().saturating_sub(1).min(u32::MAX as u64) as u32;
        if cq.overflow.len() >= OVERFLOW_HARD_MAX {
            return Err(LinkError::Violation(
                "the guest left over a million completions unread".into(),
            ));
        }
        cq.overflow.push_back(c);
        self.posted.fetch_add(1, Ordering::SeqCst);
        if cq.flush()? {
            drop(cq);
            self.guest_bell.notify();
        }
        Ok(())
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Ok(w) = self.window.atomic_u32(CONTROL_OFFSET + ctl::HOST_STATE) {
            w.store(1, Ordering::SeqCst);
        }
        self.host_bell.force_wake();
        self.guest_bell.force_wake();
        (self.on_close)();
    }

    fn carries_bulk(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{self, FakeBell};
    use std::sync::atomic::AtomicU32;
    use virtsoc_proto::ring::guest_rings;
    use virtsoc_proto::{DeviceId, Opcode, ProtoError};

    struct Shm {
        window: Arc<SharedWindow>,
        link: ShmLink,
        host_bell: FakeBell,
        guest_bell: FakeBell,
        hung_up: Arc<AtomicU32>,
    }

    /// A ShmLink over a memfd window (8-entry rings) with fake doorbells.
    fn shm() -> Shm {
        let window = testkit::window();
        let (host_bell, guest_bell) = (FakeBell::default(), FakeBell::default());
        let hung_up = Arc::new(AtomicU32::new(0));
        let h = hung_up.clone();
        let link = ShmLink::new(
            window.clone(),
            Box::new(host_bell.clone()),
            Box::new(guest_bell.clone()),
            Box::new(move || {
                h.fetch_add(1, Ordering::SeqCst);
            }),
        );
        Shm {
            window,
            link,
            host_bell,
            guest_bell,
            hung_up,
        }
    }

    fn nop(seq: u64) -> Request {
        Request::new(seq, Opcode::Nop, DeviceId::CPU, [seq; 6])
    }

    fn word(w: &SharedWindow, at: u64) -> &std::sync::atomic::AtomicU32 {
        w.atomic_u32(CONTROL_OFFSET + at).unwrap()
    }

    #[test]
    fn shm_requests_come_in_order_and_completions_reach_the_guest() {
        let s = shm();
        let (mut sq, mut cq) = guest_rings(&s.window);
        for seq in 1..=3 {
            assert!(sq.push(nop(seq)).unwrap());
        }
        for seq in 1..=3 {
            let inc = s.link.next().unwrap().unwrap();
            assert_eq!(inc.req, nop(seq), "copied out whole, in order");
            assert!(inc.payload.is_empty());
        }
        s.link.post(Completion::ok(2, [5; 6]), Vec::new()).unwrap();
        assert_eq!(s.guest_bell.notified(), 1, "the guest is rung");
        let c = cq.pop().unwrap().unwrap();
        assert_eq!((c.seq, c.values), (2, [5; 6]));
        assert_eq!(
            c.queue_depth, 2,
            "two more requests taken and not completed"
        );
        assert!(cq.pop().unwrap().is_none());
    }

    /// Requests in flight hold no completion slot: the host takes more than the completion
    /// ring holds, parks their completions until the guest makes room, and stops taking only
    /// while a ring's worth of completions waits unread.
    #[test]
    fn shm_completions_beyond_the_ring_wait_in_order_and_bound_what_is_taken() {
        let s = shm();
        let (mut sq, mut cq) = guest_rings(&s.window);
        let n = s.window.layout().cq_entries as u64;
        let sq_n = s.window.layout().sq_entries as u64;
        // Twice the completion ring's requests in flight (parked behind a fence wait, say):
        // every one is taken.
        let mut next = 0;
        for _ in 0..2 {
            for _ in 0..n {
                while !sq.push(nop(next)).unwrap() {}
                assert!(s.link.can_take().unwrap(), "request {next} not taken");
                assert_eq!(s.link.next().unwrap().unwrap().req.seq, next);
                next += 1;
            }
        }
        assert!(sq_n >= 1);
        // They complete: the ring fills, the rest waits in order.
        for seq in 0..2 * n {
            s.link
                .post(Completion::ok(seq, [0; 6]), Vec::new())
                .unwrap();
        }
        assert!(sq.push(nop(next)).unwrap());
        assert!(
            !s.link.can_take().unwrap(),
            "a ring's worth of completions waits unread"
        );
        // `next` would sleep (FakeBell panics rather than sleep) instead of taking it.
        let took = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.link.next()));
        assert!(took.is_err(), "a request was taken past the bound");
        // The guest reads one: the first waiting completion moves in, the host takes again.
        assert_eq!(cq.pop().unwrap().unwrap().seq, 0);
        assert!(s.link.can_take().unwrap());
        assert_eq!(s.link.next().unwrap().unwrap().req.seq, next);
        let mut seen = vec![];
        while let Some(c) = cq.pop().unwrap() {
            seen.push(c.seq);
            s.link.can_take().unwrap();
        }
        assert_eq!(seen, (1..2 * n).collect::<Vec<_>>(), "in order, none lost");
    }

    #[test]
    fn shm_hostile_submission_tail_is_a_violation() {
        let s = shm();
        let (mut sq, _) = guest_rings(&s.window);
        assert!(sq.push(nop(1)).unwrap());
        s.link.next().unwrap().unwrap();
        // A tail more than a ring ahead of the host's head.
        word(&s.window, ctl::SQ_TAIL).store(1 + 9, Ordering::SeqCst);
        assert!(matches!(
            s.link.next(),
            Err(LinkError::Ring(ProtoError::RingViolation(_)))
        ));
        // A tail behind the host's head is as far out of range.
        word(&s.window, ctl::SQ_TAIL).store(0, Ordering::SeqCst);
        assert!(matches!(
            s.link.next(),
            Err(LinkError::Ring(ProtoError::RingViolation(_)))
        ));
    }

    #[test]
    fn shm_hostile_completion_head_is_a_violation() {
        let s = shm();
        word(&s.window, ctl::CQ_HEAD).store(3, Ordering::SeqCst);
        assert!(matches!(
            s.link.post(Completion::ok(1, [0; 6]), Vec::new()),
            Err(LinkError::Ring(ProtoError::RingViolation(_)))
        ));
        assert!(matches!(
            s.link.can_take(),
            Err(LinkError::Ring(ProtoError::RingViolation(_)))
        ));
        assert_eq!(s.guest_bell.notified(), 0);
    }

    /// Posting past the completion ring's room is no violation: the completion waits for the
    /// guest to make room, and the guest hears of it once it is in the ring.
    #[test]
    fn shm_post_with_full_completion_ring_waits_for_room() {
        let s = shm();
        let (_, mut cq) = guest_rings(&s.window);
        let n = s.window.layout().cq_entries as u64;
        for seq in 0..=n {
            s.link
                .post(Completion::ok(seq, [0; 6]), Vec::new())
                .unwrap();
        }
        assert_eq!(
            s.guest_bell.notified() as u64,
            n,
            "only what reached the ring"
        );
        assert_eq!(cq.pop().unwrap().unwrap().seq, 0);
        s.link.can_take().unwrap();
        assert_eq!(s.guest_bell.notified() as u64, n + 1);
        let rest: Vec<u64> = std::iter::from_fn(|| cq.pop().unwrap().map(|c| c.seq)).collect();
        assert_eq!(rest, (1..=n).collect::<Vec<_>>());
    }

    #[test]
    fn shm_close_tells_the_guest_and_wakes_everyone_once() {
        let s = shm();
        let (mut sq, _) = guest_rings(&s.window);
        assert!(sq.push(nop(1)).unwrap());
        s.link.close();
        s.link.close();
        assert_eq!(word(&s.window, ctl::HOST_STATE).load(Ordering::SeqCst), 1);
        assert_eq!(s.host_bell.forced(), 1);
        assert_eq!(s.guest_bell.forced(), 1);
        assert_eq!(
            s.hung_up.load(Ordering::SeqCst),
            1,
            "the side channel hung up once"
        );
        assert!(
            s.link.next().unwrap().is_none(),
            "a closed link takes nothing"
        );
        assert!(!s.link.carries_bulk());
    }
}
