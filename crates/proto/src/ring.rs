//! Lock-free single-producer/single-consumer rings in the shared window, and doorbells.
//!
//! Each ring has a tail (written only by its producer) and a head (written only by its
//! consumer) in the control page. Each side keeps its own index privately and never trusts
//! the index the peer published beyond a range check: a peer that publishes a tail more than
//! `entries` ahead is a [`ProtoError::RingViolation`].
//!
//! Doorbells follow spin-then-sleep: the waiter spins briefly on the ring (as long as its
//! waits have lately been short: [`crate::spin`]), then announces that it sleeps and sleeps
//! on a futex word; the notifier bumps that word and wakes only when the
//! waiter announced sleep. The guest may cap the host bell's spin (`ctl::HOST_SPINS`: a
//! guest whose requests come far apart, like a GL stream's batches, spares the host's cores
//! the spin). The [`Doorbell`] trait is the seam for other transports (a virtio-serial port
//! for VM guests).

use std::marker::PhantomData;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::ByteValued;

use crate::shared_window::SharedWindow;
use crate::spin::AdaptiveSpin;
use crate::window_layout::{ctl, WindowLayout, CONTROL_OFFSET, SQ_OFFSET};
use crate::wire::{Completion, Request};
use crate::{ProtoError, Result};

/// Where one ring lives in the window.
#[derive(Debug, Clone, Copy)]
struct RingPlace {
    tail: u64,
    head: u64,
    entries_at: u64,
    entries: u32,
    entry_size: u64,
}

impl RingPlace {
    fn sq(l: &WindowLayout) -> Self {
        RingPlace {
            tail: CONTROL_OFFSET + ctl::SQ_TAIL,
            head: CONTROL_OFFSET + ctl::SQ_HEAD,
            entries_at: SQ_OFFSET,
            entries: l.sq_entries,
            entry_size: Request::SIZE as u64,
        }
    }

    fn cq(l: &WindowLayout) -> Self {
        RingPlace {
            tail: CONTROL_OFFSET + ctl::CQ_TAIL,
            head: CONTROL_OFFSET + ctl::CQ_HEAD,
            entries_at: l.cq_offset(),
            entries: l.cq_entries,
            entry_size: Completion::SIZE as u64,
        }
    }

    fn slot(&self, index: u32) -> u64 {
        self.entries_at + (index & (self.entries - 1)) as u64 * self.entry_size
    }
}

/// The producing end of a ring.
pub struct RingProducer<T> {
    win: Arc<SharedWindow>,
    place: RingPlace,
    tail: u32,
    _t: PhantomData<T>,
}

impl<T: ByteValued> RingProducer<T> {
    fn new(win: Arc<SharedWindow>, place: RingPlace) -> Self {
        RingProducer {
            win,
            place,
            tail: 0,
            _t: PhantomData,
        }
    }

    /// Free entries, as published by the consumer (checked).
    pub fn space(&self) -> Result<u32> {
        let head = self
            .win
            .atomic_u32(self.place.head)?
            .load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        if used > self.place.entries {
            return Err(ProtoError::RingViolation("consumer head out of range"));
        }
        Ok(self.place.entries - used)
    }

    /// Entries pushed that the consumer has not taken yet (checked).
    pub fn unconsumed(&self) -> Result<u32> {
        Ok(self.place.entries - self.space()?)
    }

    /// Appends an entry; `Ok(false)` when the ring is full.
    pub fn push(&mut self, v: T) -> Result<bool> {
        if self.space()? == 0 {
            return Ok(false);
        }
        self.win.write_obj(self.place.slot(self.tail), v)?;
        self.tail = self.tail.wrapping_add(1);
        self.win
            .atomic_u32(self.place.tail)?
            .store(self.tail, Ordering::Release);
        Ok(true)
    }
}

/// The consuming end of a ring.
pub struct RingConsumer<T> {
    win: Arc<SharedWindow>,
    place: RingPlace,
    head: u32,
    _t: PhantomData<T>,
}

impl<T: ByteValued> RingConsumer<T> {
    fn new(win: Arc<SharedWindow>, place: RingPlace) -> Self {
        RingConsumer {
            win,
            place,
            head: 0,
            _t: PhantomData,
        }
    }

    /// Entries available, as published by the producer (checked).
    pub fn available(&self) -> Result<u32> {
        let tail = self
            .win
            .atomic_u32(self.place.tail)?
            .load(Ordering::Acquire);
        let avail = tail.wrapping_sub(self.head);
        if avail > self.place.entries {
            return Err(ProtoError::RingViolation("producer tail out of range"));
        }
        Ok(avail)
    }

    /// Takes the next entry (copied out of shared memory), `None` when empty.
    pub fn pop(&mut self) -> Result<Option<T>> {
        if self.available()? == 0 {
            return Ok(None);
        }
        let v = self.win.read_obj(self.place.slot(self.head))?;
        self.head = self.head.wrapping_add(1);
        self.win
            .atomic_u32(self.place.head)?
            .store(self.head, Ordering::Release);
        Ok(Some(v))
    }
}

/// Host end: consumes requests, produces completions.
pub fn host_rings(win: &Arc<SharedWindow>) -> (RingConsumer<Request>, RingProducer<Completion>) {
    let l = win.layout();
    (
        RingConsumer::new(win.clone(), RingPlace::sq(&l)),
        RingProducer::new(win.clone(), RingPlace::cq(&l)),
    )
}

/// Guest end: produces requests, consumes completions.
pub fn guest_rings(win: &Arc<SharedWindow>) -> (RingProducer<Request>, RingConsumer<Completion>) {
    let l = win.layout();
    (
        RingProducer::new(win.clone(), RingPlace::sq(&l)),
        RingConsumer::new(win.clone(), RingPlace::cq(&l)),
    )
}

/// Wakes a peer that waits for ring activity.
pub trait Doorbell: Send + Sync {
    /// Called after publishing: wakes the peer if it announced that it sleeps.
    fn notify(&self);
    /// Wakes the peer unconditionally (shutdown, disconnect).
    fn force_wake(&self);
    /// Waits until `ready()` returns true (`true`) or `timeout` passes (`false`): spins a
    /// little, then sleeps until notified.
    fn wait(&self, ready: &mut dyn FnMut() -> bool, timeout: Option<Duration>) -> bool;
    /// [`wait`](Self::wait), where `behind()` tells whether the peer has not yet taken what
    /// this side gave it: a spinning bell then yields its core now and then
    /// ([`AdaptiveSpin::spin_behind`]). Bells that do not spin ignore it.
    fn wait_behind(
        &self,
        ready: &mut dyn FnMut() -> bool,
        behind: &mut dyn FnMut() -> bool,
        timeout: Option<Duration>,
    ) -> bool {
        let _ = behind;
        self.wait(ready, timeout)
    }
}

/// Whether the side whose sleeping flag is control-page word `word` (`ctl::HOST_SLEEPING`,
/// `ctl::GUEST_SLEEPING`) says it sleeps on its doorbell.
pub fn peer_sleeps(win: &SharedWindow, word: u64) -> bool {
    win.atomic_u32(CONTROL_OFFSET + word)
        .is_ok_and(|w| w.load(Ordering::Relaxed) != 0)
}

/// A doorbell made of two words in the shared window, slept on with a futex.
pub struct FutexDoorbell {
    win: Arc<SharedWindow>,
    word: u64,
    sleeping: u64,
    spin: AdaptiveSpin,
    /// The control word where the peer may cap this bell's spins (`ctl::HOST_SPINS` for
    /// the host's bell).
    spin_cap: Option<u64>,
}

impl FutexDoorbell {
    /// The bell the host sleeps on (the guest notifies it).
    pub fn host_bell(win: &Arc<SharedWindow>, spins: u32) -> Self {
        FutexDoorbell {
            win: win.clone(),
            word: CONTROL_OFFSET + ctl::HOST_BELL,
            sleeping: CONTROL_OFFSET + ctl::HOST_SLEEPING,
            spin: AdaptiveSpin::new(spins),
            spin_cap: Some(CONTROL_OFFSET + ctl::HOST_SPINS),
        }
    }

    /// The bell the guest sleeps on (the host notifies it).
    pub fn guest_bell(win: &Arc<SharedWindow>, spins: u32) -> Self {
        FutexDoorbell {
            win: win.clone(),
            word: CONTROL_OFFSET + ctl::GUEST_BELL,
            sleeping: CONTROL_OFFSET + ctl::GUEST_SLEEPING,
            spin: AdaptiveSpin::new(spins),
            spin_cap: None,
        }
    }

    /// A bell of two words at window offsets `word` and `sleeping` (checked to lie in the
    /// window), with no spin cap: the doorbells of a host service channel
    /// (`virtsoc_services::chan`), whose control block is wherever the guest laid it out.
    pub fn at(win: &Arc<SharedWindow>, word: u64, sleeping: u64, spins: u32) -> Result<Self> {
        win.atomic_u32(word)?;
        win.atomic_u32(sleeping)?;
        Ok(FutexDoorbell {
            win: win.clone(),
            word,
            sleeping,
            spin: AdaptiveSpin::new(spins),
            spin_cap: None,
        })
    }

    /// This bell's spin yields the core every `every` iterations
    /// ([`AdaptiveSpin::yielding`]).
    pub fn yielding(mut self, every: u32) -> Self {
        self.spin = AdaptiveSpin::yielding(self.spin.max(), every);
        self
    }

    fn words(&self) -> (&AtomicU32, &AtomicU32) {
        // The offsets are constants inside the control page, which every valid layout has,
        // or were checked by `at`.
        (
            self.win
                .atomic_u32(self.word)
                .expect("control page in window"),
            self.win
                .atomic_u32(self.sleeping)
                .expect("control page in window"),
        )
    }

    /// The sleeping half of [`Doorbell::wait`].
    fn sleep(&self, ready: &mut dyn FnMut() -> bool, timeout: Option<Duration>) -> bool {
        let (word, sleeping) = self.words();
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let seen = word.load(Ordering::SeqCst);
            sleeping.store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if ready() {
                sleeping.store(0, Ordering::SeqCst);
                return true;
            }
            let ts = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        sleeping.store(0, Ordering::SeqCst);
                        return false;
                    }
                    Some(rustix::thread::futex::Timespec {
                        tv_sec: left.as_secs() as i64,
                        tv_nsec: left.subsec_nanos() as i64,
                    })
                }
                None => None,
            };
            // EAGAIN (word changed), EINTR and ETIMEDOUT all lead back to the checks above.
            let _ = rustix::thread::futex::wait(
                word,
                rustix::thread::futex::Flags::empty(),
                seen,
                ts.as_ref(),
            );
            sleeping.store(0, Ordering::SeqCst);
            if ready() {
                return true;
            }
        }
    }
}

impl Doorbell for FutexDoorbell {
    fn notify(&self) {
        let (word, sleeping) = self.words();
        fence(Ordering::SeqCst);
        if sleeping.load(Ordering::SeqCst) != 0 {
            word.fetch_add(1, Ordering::SeqCst);
            let _ =
                rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), u32::MAX);
        }
    }

    fn force_wake(&self) {
        let (word, _) = self.words();
        word.fetch_add(1, Ordering::SeqCst);
        let _ = rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), u32::MAX);
    }

    fn wait(&self, ready: &mut dyn FnMut() -> bool, timeout: Option<Duration>) -> bool {
        self.wait_behind(ready, &mut || false, timeout)
    }

    fn wait_behind(
        &self,
        ready: &mut dyn FnMut() -> bool,
        behind: &mut dyn FnMut() -> bool,
        timeout: Option<Duration>,
    ) -> bool {
        let cap = self
            .spin_cap
            .and_then(|at| self.win.atomic_u32(at).ok())
            .map_or(0, |w| w.load(Ordering::Relaxed));
        if cap == 0 {
            return self
                .spin
                .wait_behind(ready, behind, |ready| self.sleep(ready, timeout));
        }
        // The peer asked for shorter spins: at most that many (and never more than this
        // bell's own count), with no learning from the waits meanwhile.
        if AdaptiveSpin::new(cap.min(self.spin.limit())).spin_behind(ready, behind) {
            return true;
        }
        self.sleep(ready, timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{DeviceId, Opcode};

    fn window() -> Arc<SharedWindow> {
        let l = WindowLayout::new(1 << 16, 4, 4).unwrap();
        Arc::new(SharedWindow::create_memfd("ring", l).unwrap())
    }

    #[test]
    fn the_guest_caps_the_host_bells_spin() {
        let w = window();
        let host = FutexDoorbell::host_bell(&w, 4096);
        let checks = |bell: &FutexDoorbell| {
            let mut n = 0u32;
            let woke = bell.wait(
                &mut || {
                    n += 1;
                    false
                },
                Some(Duration::from_millis(1)),
            );
            assert!(!woke);
            n
        };
        assert!(checks(&host) > 4096);
        w.atomic_u32(CONTROL_OFFSET + ctl::HOST_SPINS)
            .unwrap()
            .store(8, Ordering::Relaxed);
        // 8 spins, then the sleep's own checks (a few, around its futex waits).
        assert!(checks(&host) < 100);
        // The guest's bell takes no cap from that word.
        let guest = FutexDoorbell::guest_bell(&w, 64);
        assert!(checks(&guest) > 64);
    }

    #[test]
    fn requests_flow_in_order_and_ring_fills() {
        let w = window();
        let (mut gp, _gc) = guest_rings(&w);
        let (mut hc, _hp) = host_rings(&w);
        for i in 0..4 {
            assert!(gp
                .push(Request::new(i, Opcode::Nop, DeviceId::CPU, [0; 6]))
                .unwrap());
        }
        assert!(
            !gp.push(Request::default()).unwrap(),
            "fifth push must report full"
        );
        assert_eq!(gp.unconsumed().unwrap(), 4);
        for i in 0..4 {
            assert_eq!(hc.pop().unwrap().unwrap().seq, i);
            assert_eq!(gp.unconsumed().unwrap(), 3 - i as u32, "what the host took");
        }
        assert!(hc.pop().unwrap().is_none());
        assert!(gp
            .push(Request::new(9, Opcode::Nop, DeviceId::CPU, [0; 6]))
            .unwrap());
        assert_eq!(hc.pop().unwrap().unwrap().seq, 9);
    }

    #[test]
    fn hostile_tail_is_a_violation() {
        let w = window();
        let (mut hc, _) = host_rings(&w);
        w.atomic_u32(CONTROL_OFFSET + ctl::SQ_TAIL)
            .unwrap()
            .store(1000, Ordering::SeqCst);
        assert!(matches!(hc.pop(), Err(ProtoError::RingViolation(_))));
    }

    #[test]
    fn hostile_head_is_a_violation() {
        let w = window();
        let (_, mut hp) = host_rings(&w);
        w.atomic_u32(CONTROL_OFFSET + ctl::CQ_HEAD)
            .unwrap()
            .store(77, Ordering::SeqCst);
        assert!(hp.push(Completion::ok(1, [0; 6])).is_err());
    }

    #[test]
    fn doorbell_wait_times_out_and_sees_ready() {
        let w = window();
        let bell = FutexDoorbell::host_bell(&w, 10);
        assert!(!bell.wait(&mut || false, Some(Duration::from_millis(1))));
        assert!(bell.wait(&mut || true, None));
    }
}
