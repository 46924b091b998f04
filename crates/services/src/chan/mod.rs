//! A channel's memory: a control block, a request ring, a response ring and payload slots,
//! laid out at `base` in a guest's window (inside an SVM region the guest allocated), and
//! the two ends that use it.
//!
//! ```text
//! base + 0      control block (256 bytes): magic, version, entries, slot size, the four
//!               ring indices, two doorbells (word + sleeping flag), the closed word
//! base + 256    request ring: `entries` x 64-byte entries (guest produces)
//!               response ring: `entries` x 64-byte entries (host produces)
//! base + data   `entries` payload slots of `slot_size` bytes (4 KiB aligned)
//! ```
//!
//! Request `seq` uses slot `slot` (the guest's choice, checked < entries): an inline call's
//! input is there, and the response's output is written there in place. Each end keeps its
//! own ring index and checks the peer's against the ring size (a peer publishing an index
//! out of range is a protocol violation that closes the channel). Doorbells spin briefly,
//! then sleep ([`bells`]: futex words in the control block for a process guest, the VM's
//! port for a VM guest).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use virtsoc_proto::SharedWindow;

use crate::packet::PACKET_SIZE;
use crate::payload::WindowBytes;
use crate::{Result, ServiceError};

pub mod bells;
mod channel_layout;
pub use bells::{BellWords, Bells};
pub use channel_layout::ChannelLayout;

/// The control block's first word ("VCHN").
pub const MAGIC: u32 = 0x4e48_4356;
/// Layout version.
pub const VERSION: u32 = 1;
/// Bytes of one ring entry.
pub const ENTRY: u64 = 64;
/// Bytes of the control block.
pub const CONTROL: u64 = 256;
/// Most ring entries (and slots) a channel may have.
pub const MAX_ENTRIES: u32 = 64;
/// Bytes of one payload slot: one packet.
pub const SLOT_SIZE: u32 = PACKET_SIZE;

mod ctl {
    pub const MAGIC: u64 = 0;
    pub const VERSION: u64 = 4;
    pub const ENTRIES: u64 = 8;
    pub const SLOT_SIZE: u64 = 12;
    pub const REQ_TAIL: u64 = 16;
    pub const REQ_HEAD: u64 = 20;
    pub const RESP_TAIL: u64 = 24;
    pub const RESP_HEAD: u64 = 28;
    pub const HOST_BELL: u64 = 32;
    pub const HOST_SLEEPING: u64 = 36;
    pub const GUEST_BELL: u64 = 40;
    pub const GUEST_SLEEPING: u64 = 44;
    pub const CLOSED: u64 = 48;
    pub const HOST_DONE: u64 = 52;
}

/// Why a channel was closed: the control block's closed word. The first close wins (a
/// later one does not overwrite the reason).
pub mod closed {
    /// The guest closed it.
    pub const BY_GUEST: u32 = 1;
    /// A ring violation (an index out of range) or a failed answer.
    pub const VIOLATION: u32 = 2;
    /// The guest's session ended.
    pub const GUEST_GONE: u32 = 3;
    /// The guest's session moved to another daemon (migration, restart): the guest lays
    /// the channel out again in its new window and resumes it there with the same id.
    pub const MOVED: u32 = 4;
}

/// Request kinds (the low half of an entry's second word).
pub mod kind {
    /// A call with its input inline in the slot (`len` bytes); output back in the slot.
    pub const CALL: u32 = 1;
    /// A call on SVM regions read and written in place: `args` = input region, input
    /// offset, input length, output region (0: none), output offset.
    pub const CALL_REGION: u32 = 2;
    /// One packet of a large transfer: its bytes in the slot, `args[0..3]` the header words
    /// ([`crate::packet::PacketHeader::to_words`]), `args[3]` the transfer's flags
    /// ([`super::flags`], the same on every packet and the commit).
    pub const PACKET: u32 = 3;
    /// Ends a transfer: `args` = transfer, packets sent, CRC-32, flags ([`super::flags`]);
    /// then runs the call on the reassembled input, output in the slot.
    pub const COMMIT: u32 = 4;
    /// Drops a transfer: `args[0]` = transfer.
    pub const REVOKE: u32 = 5;
}

/// Flags of a transfer: `args[3]` of its [`kind::PACKET`]s and its [`kind::COMMIT`].
pub mod flags {
    /// No checksum: the commit's `args[2]` is not a CRC-32 and the host computes none (the
    /// completion bitmap and the packet checks still apply; see [`crate::reassembly`]). The
    /// host may then hand each packet in place to a service that takes its input packet by
    /// packet ([`crate::hypervisor::InputSink`]) instead of reassembling it.
    pub const NO_CRC: u64 = 1;
}

/// One ring entry (eight words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry {
    /// Sequence number (the guest's; echoed in the response).
    pub seq: u64,
    /// Request: the kind ([`kind`]). Response: the status (0 ok).
    pub code: u32,
    /// Request: the service's call number. Response: unused.
    pub call: u32,
    /// The slot the payload is in.
    pub slot: u32,
    /// Bytes of payload in the slot (request input, response output or error text).
    pub len: u32,
    /// Request arguments or response values.
    pub args: [u64; 5],
}

impl Entry {
    fn to_bytes(self) -> [u8; ENTRY as usize] {
        let w = [
            self.seq,
            u64::from(self.code) | u64::from(self.call) << 32,
            u64::from(self.slot) | u64::from(self.len) << 32,
            self.args[0],
            self.args[1],
            self.args[2],
            self.args[3],
            self.args[4],
        ];
        let mut b = [0u8; ENTRY as usize];
        for (i, v) in w.iter().enumerate() {
            b[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    fn from_bytes(b: &[u8; ENTRY as usize]) -> Self {
        let w = |i: usize| {
            let mut t = [0u8; 8];
            t.copy_from_slice(&b[8 * i..8 * i + 8]);
            u64::from_le_bytes(t)
        };
        Entry {
            seq: w(0),
            code: w(1) as u32,
            call: (w(1) >> 32) as u32,
            slot: w(2) as u32,
            len: (w(2) >> 32) as u32,
            args: [w(3), w(4), w(5), w(6), w(7)],
        }
    }
}

/// The memory shared by both ends.
#[derive(Clone)]
struct Shared {
    win: Arc<SharedWindow>,
    base: u64,
    layout: ChannelLayout,
}

impl Shared {
    fn word(&self, off: u64) -> Result<&AtomicU32> {
        Ok(self.win.atomic_u32(self.base + off)?)
    }

    fn slot_bytes(&self, slot: u32) -> Result<WindowBytes> {
        if slot >= self.layout.entries {
            return Err(ServiceError::BadPacket(format!(
                "slot {slot} outside a channel of {} slots",
                self.layout.entries
            )));
        }
        WindowBytes::new(
            self.win.clone(),
            self.base + self.layout.slot(slot),
            self.layout.slot_size as usize,
        )
    }

    fn push(
        &self,
        ring: u64,
        tail_off: u64,
        head_off: u64,
        tail: &mut u32,
        e: Entry,
    ) -> Result<bool> {
        let head = self.word(head_off)?.load(Ordering::Acquire);
        let used = tail.wrapping_sub(head);
        if used > self.layout.entries {
            return Err(ServiceError::Memory("peer's ring head out of range".into()));
        }
        if used == self.layout.entries {
            return Ok(false);
        }
        let at = self.base + ring + u64::from(*tail & (self.layout.entries - 1)) * ENTRY;
        self.win.copy_in(at, &e.to_bytes())?;
        *tail = tail.wrapping_add(1);
        self.word(tail_off)?.store(*tail, Ordering::Release);
        Ok(true)
    }

    fn pop(
        &self,
        ring: u64,
        tail_off: u64,
        head_off: u64,
        head: &mut u32,
    ) -> Result<Option<Entry>> {
        let tail = self.word(tail_off)?.load(Ordering::Acquire);
        let avail = tail.wrapping_sub(*head);
        if avail > self.layout.entries {
            return Err(ServiceError::Memory("peer's ring tail out of range".into()));
        }
        if avail == 0 {
            return Ok(None);
        }
        let at = self.base + ring + u64::from(*head & (self.layout.entries - 1)) * ENTRY;
        let mut b = [0u8; ENTRY as usize];
        self.win.copy_out(at, &mut b)?;
        *head = head.wrapping_add(1);
        self.word(head_off)?.store(*head, Ordering::Release);
        Ok(Some(Entry::from_bytes(&b)))
    }

    fn ready(&self, tail_off: u64, head: u32) -> bool {
        self.word(tail_off)
            .map(|t| t.load(Ordering::Acquire) != head)
            .unwrap_or(true)
    }

    /// Marks the channel closed with `code` unless it is closed already.
    fn mark_closed(&self, code: u32) {
        if let Ok(w) = self.word(ctl::CLOSED) {
            let _ = w.compare_exchange(0, code.max(1), Ordering::AcqRel, Ordering::Acquire);
        }
    }

    fn closed_code(&self) -> u32 {
        self.word(ctl::CLOSED)
            .map(|c| c.load(Ordering::Acquire))
            .unwrap_or(closed::VIOLATION)
    }

    fn closed(&self) -> bool {
        self.word(ctl::CLOSED)
            .map(|c| c.load(Ordering::Acquire) != 0)
            .unwrap_or(true)
    }
}

/// The host's end: takes requests, posts responses.
pub struct HostEnd {
    sh: Shared,
    req_head: u32,
    resp_tail: u32,
    bells: Bells,
    interrupt: Option<Arc<AtomicBool>>,
}

impl HostEnd {
    /// The host's end of the channel the guest laid out at window offset `base` in a range
    /// of `len` bytes: the control block is checked (magic, version, layout within `len`).
    /// Its doorbells are futexes (a process guest).
    pub fn attach(win: Arc<SharedWindow>, base: u64, len: u64, spins: u32) -> Result<Self> {
        win.check(base, CONTROL)?;
        let bells = Bells::host_futex(&win, base, spins)?;
        Self::attach_with(win, base, len, bells)
    }

    /// [`attach`](Self::attach) with doorbells of the caller's (a VM guest's port).
    pub fn attach_with(win: Arc<SharedWindow>, base: u64, len: u64, bells: Bells) -> Result<Self> {
        let probe = Shared {
            win: win.clone(),
            base,
            layout: ChannelLayout {
                entries: 1,
                slot_size: SLOT_SIZE,
            },
        };
        win.check(base, CONTROL)?;
        let magic = probe.word(ctl::MAGIC)?.load(Ordering::Acquire);
        let version = probe.word(ctl::VERSION)?.load(Ordering::Acquire);
        if magic != MAGIC || version != VERSION {
            return Err(ServiceError::BadArgument(format!(
                "no channel at the region's start (magic {magic:#x}, version {version})"
            )));
        }
        let layout = ChannelLayout {
            entries: probe.word(ctl::ENTRIES)?.load(Ordering::Acquire),
            slot_size: probe.word(ctl::SLOT_SIZE)?.load(Ordering::Acquire),
        };
        layout.validate()?;
        if layout.size() > len {
            return Err(ServiceError::BadArgument(format!(
                "a channel of {} entries needs {} bytes, the region has {len}",
                layout.entries,
                layout.size()
            )));
        }
        win.check(base, layout.size())?;
        let sh = Shared { win, base, layout };
        // The host starts from the indices as they are (a fresh channel has them at 0);
        // the guest must not have published anything yet.
        let req_head = sh.word(ctl::REQ_HEAD)?.load(Ordering::Acquire);
        let resp_tail = sh.word(ctl::RESP_TAIL)?.load(Ordering::Acquire);
        sh.word(ctl::CLOSED)?.store(0, Ordering::Release);
        Ok(HostEnd {
            sh,
            req_head,
            resp_tail,
            bells,
            interrupt: None,
        })
    }

    /// While `flag` is set, [`next`](Self::next) takes no request and returns `Ok(None)`
    /// at once (a wait in progress ends when the flag is set and the host's doorbell rung,
    /// [`Closer::wake_host`]): how a channel's thread is paused between requests.
    pub fn set_interrupt(&mut self, flag: Arc<AtomicBool>) {
        self.interrupt = Some(flag);
    }

    fn interrupted(&self) -> bool {
        self.interrupt
            .as_ref()
            .is_some_and(|i| i.load(Ordering::Acquire))
    }

    /// The layout.
    pub fn layout(&self) -> ChannelLayout {
        self.sh.layout
    }

    /// The next request, waiting up to `timeout`; `Ok(None)` when none came, `Closed` once
    /// the channel is closed.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Entry>> {
        loop {
            if self.interrupted() {
                return Ok(None);
            }
            if let Some(e) = self.sh.pop(
                self.sh.layout.req_ring(),
                ctl::REQ_TAIL,
                ctl::REQ_HEAD,
                &mut self.req_head,
            )? {
                return Ok(Some(e));
            }
            if self.sh.closed() {
                return Err(ServiceError::Closed);
            }
            let (sh, head, interrupt) = (&self.sh, self.req_head, self.interrupt.as_deref());
            let stop = || interrupt.is_some_and(|i| i.load(Ordering::Acquire));
            let came = self.bells.own.wait(
                &mut || sh.ready(ctl::REQ_TAIL, head) || sh.closed() || stop(),
                Some(timeout),
            );
            if !came {
                return Ok(None);
            }
        }
    }

    /// Slot `slot`'s bytes (checked).
    pub fn slot(&self, slot: u32) -> Result<WindowBytes> {
        self.sh.slot_bytes(slot)
    }

    /// Responses posted that the guest has not taken yet (by the index it published,
    /// clamped to the ring).
    pub fn unread(&self) -> u32 {
        let head = self
            .sh
            .word(ctl::RESP_HEAD)
            .map_or(self.resp_tail, |w| w.load(Ordering::Acquire));
        self.resp_tail
            .wrapping_sub(head)
            .min(self.sh.layout.entries)
    }

    /// Posts a response and rings the guest. A full response ring (a guest that does not
    /// read its responses while its requests keep coming) is a violation.
    pub fn respond(&mut self, e: Entry) -> Result<()> {
        let lay = self.sh.layout;
        if !self.sh.push(
            lay.resp_ring(),
            ctl::RESP_TAIL,
            ctl::RESP_HEAD,
            &mut self.resp_tail,
            e,
        )? {
            return Err(ServiceError::Memory("response ring full".into()));
        }
        self.bells.peer.notify();
        Ok(())
    }

    /// Marks the channel closed with `code` (unless it is closed already) and wakes the
    /// guest.
    pub fn close(&self, code: u32) {
        self.sh.mark_closed(code);
        self.bells.peer.force_wake();
    }

    /// The host is done with the channel's memory (its last touch of it): the guest, waiting
    /// in [`GuestEnd::wait_host_done`], may free the region. The host's own bell goes first
    /// (a VM guest's is registered with the VM's port reader, which must not touch the
    /// region once the guest may reuse it).
    pub fn finish(self) {
        let HostEnd { sh, bells, .. } = self;
        let Bells { own, peer } = bells;
        drop(own);
        if let Ok(w) = sh.word(ctl::HOST_DONE) {
            w.store(1, Ordering::Release);
        }
        peer.force_wake();
    }
}

/// A handle that wakes a host end's thread (to close it from another thread).
#[derive(Clone)]
pub struct Closer {
    sh: Shared,
    /// The guest's bell, rung by a close (a VM guest's port; `None`: the futex word).
    guest: Option<Arc<dyn virtsoc_proto::ring::Doorbell>>,
}

impl Closer {
    /// The closer of the channel at `base` in `win`.
    pub fn new(win: Arc<SharedWindow>, base: u64) -> Self {
        Closer {
            sh: Shared {
                win,
                base,
                layout: ChannelLayout {
                    entries: 1,
                    slot_size: SLOT_SIZE,
                },
            },
            guest: None,
        }
    }

    /// A close also rings `bell`, the guest's (a VM guest's port), besides its futex word.
    pub fn ringing(mut self, bell: Arc<dyn virtsoc_proto::ring::Doorbell>) -> Self {
        self.guest = Some(bell);
        self
    }

    /// Marks the channel closed with `code` (unless it is closed already) and wakes both
    /// ends.
    pub fn close(&self, code: u32) {
        self.sh.mark_closed(code);
        force_wake(&self.sh, ctl::HOST_BELL);
        force_wake(&self.sh, ctl::GUEST_BELL);
        if let Some(b) = &self.guest {
            b.force_wake();
        }
    }

    /// Rings the host's doorbell (its thread re-checks its interrupt flag). The host's end
    /// always sleeps on its futex word, whatever the guest (a VM's port reader rings it too).
    pub fn wake_host(&self) {
        force_wake(&self.sh, ctl::HOST_BELL);
    }
}

/// Bumps the futex word at `bell` and wakes its sleepers.
fn force_wake(sh: &Shared, bell: u64) {
    if let Ok(w) = sh.word(bell) {
        w.fetch_add(1, Ordering::SeqCst);
        let _ = rustix::thread::futex::wake(w, rustix::thread::futex::Flags::empty(), u32::MAX);
    }
}

/// The guest's end: posts requests, takes responses.
pub struct GuestEnd {
    sh: Shared,
    req_tail: u32,
    resp_head: u32,
    bells: Bells,
}

impl GuestEnd {
    /// Lays out a fresh channel at window offset `base` (zeroing its control block and
    /// rings) and returns the guest's end, with futex doorbells (a process guest).
    pub fn create(
        win: Arc<SharedWindow>,
        base: u64,
        layout: ChannelLayout,
        spins: u32,
    ) -> Result<Self> {
        win.check(base, CONTROL)?;
        let bells = Bells::guest_futex(&win, base, spins)?;
        Self::create_with(win, base, layout, bells)
    }

    /// [`create`](Self::create) with doorbells of the caller's (a VM guest's port).
    pub fn create_with(
        win: Arc<SharedWindow>,
        base: u64,
        layout: ChannelLayout,
        bells: Bells,
    ) -> Result<Self> {
        layout.validate()?;
        win.check(base, layout.size())?;
        win.zero(base, layout.data())?;
        let sh = Shared { win, base, layout };
        sh.word(ctl::ENTRIES)?
            .store(layout.entries, Ordering::Relaxed);
        sh.word(ctl::SLOT_SIZE)?
            .store(layout.slot_size, Ordering::Relaxed);
        sh.word(ctl::VERSION)?.store(VERSION, Ordering::Relaxed);
        sh.word(ctl::MAGIC)?.store(MAGIC, Ordering::Release);
        Ok(GuestEnd {
            sh,
            req_tail: 0,
            resp_head: 0,
            bells,
        })
    }

    /// The layout.
    pub fn layout(&self) -> ChannelLayout {
        self.sh.layout
    }

    /// Slot `slot`'s bytes.
    pub fn slot(&self, slot: u32) -> Result<WindowBytes> {
        self.sh.slot_bytes(slot)
    }

    /// Posts a request and rings the host; `Ok(false)` when the ring is full.
    pub fn post(&mut self, e: Entry) -> Result<bool> {
        if self.sh.closed() {
            return Err(ServiceError::Closed);
        }
        let lay = self.sh.layout;
        let ok = self.sh.push(
            lay.req_ring(),
            ctl::REQ_TAIL,
            ctl::REQ_HEAD,
            &mut self.req_tail,
            e,
        )?;
        if ok {
            self.bells.peer.notify();
        }
        Ok(ok)
    }

    /// The next response, waiting up to `timeout` (`Ok(None)`: none came); `Closed` once the
    /// host closed the channel and nothing is left to read.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Entry>> {
        loop {
            let lay = self.sh.layout;
            if let Some(e) = self.sh.pop(
                lay.resp_ring(),
                ctl::RESP_TAIL,
                ctl::RESP_HEAD,
                &mut self.resp_head,
            )? {
                return Ok(Some(e));
            }
            if self.sh.closed() {
                return Err(ServiceError::Closed);
            }
            let (sh, head) = (&self.sh, self.resp_head);
            if !self.bells.own.wait(
                &mut || sh.ready(ctl::RESP_TAIL, head) || sh.closed(),
                Some(timeout),
            ) {
                return Ok(None);
            }
        }
    }

    /// Marks the channel closed and wakes the host.
    pub fn close(&self) {
        self.sh.mark_closed(closed::BY_GUEST);
        self.bells.peer.force_wake();
    }

    /// Why the channel was closed ([`closed`]; 0 while open).
    pub fn closed_code(&self) -> u32 {
        self.sh.closed_code()
    }

    /// Waits (up to `timeout`) until the host is done with the channel's memory
    /// ([`HostEnd::finish`]): after a close, before the region is freed, so that no host
    /// thread still in the channel touches memory the region's range is reused for.
    pub fn wait_host_done(&self, timeout: Duration) -> bool {
        let Ok(done) = self.sh.word(ctl::HOST_DONE) else {
            return false;
        };
        // The host's finish rings this end's bell after setting the word.
        self.bells
            .own
            .wait(&mut || done.load(Ordering::Acquire) != 0, Some(timeout))
    }

    /// The window the channel lives in.
    pub fn window(&self) -> &Arc<SharedWindow> {
        &self.sh.win
    }
}

#[cfg(test)]
mod tests;
