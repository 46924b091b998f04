//! One channel's host thread: takes the guest's requests off the channel's own ring, runs
//! them on the service through the hypervisor (payloads read and written in place in the
//! guest's window), reassembles packet transfers and answers. A channel has its own thread
//! and ring, so a slow call holds up only its own channel.
//!
//! Everything in the ring and the slots is the guest's and is checked: kinds, slots,
//! lengths, regions and ranges, packet headers. A request that fails answers an error status
//! with the reason in its slot; a ring violation (an index out of range) closes the channel.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use virtsoc_proto::AccessMode;
use virtsoc_proto::SharedWindow;
use virtsoc_services::chan::{closed, flags, kind, Entry, HostEnd};
use virtsoc_services::hypervisor::{Hypervisor, Reply, SinkCall};
use virtsoc_services::packet::PacketHeader;
use virtsoc_services::payload::{Input, Output, WindowBytes};
use virtsoc_services::reassembly::Reassembler;
use virtsoc_services::{Result, ServiceError};
use virtsoc_svm::{AccessSpec, DomainId, GuestId, MemoryCharge, RegionId, SvmManager};

/// How long a transfer may go without a packet before it is dropped (unless the services
/// policy sets `transfer_timeout_ms`).
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of unfinished transfers one channel may hold.
pub const CHANNEL_BUDGET: u64 = 256 << 20;
/// Bytes of unfinished transfers all of one guest's channels may hold together.
pub const GUEST_BUDGET: u64 = 512 << 20;
/// Longest wait with no transfer open (a close wakes the thread at once).
const IDLE_WAIT: Duration = Duration::from_secs(3600);

/// What a channel's thread needs.
pub struct ChannelCtx {
    /// The channel id.
    pub id: u64,
    /// The guest.
    pub guest: GuestId,
    /// The guest's window.
    pub win: Arc<SharedWindow>,
    /// To resolve the guest's regions.
    pub svm: Arc<SvmManager>,
    /// The hypervisor.
    pub hv: Arc<Hypervisor>,
    /// Bytes of unfinished transfers this guest's channels hold.
    pub guest_held: Arc<AtomicU64>,
    /// Pauses the thread between requests.
    pub ctl: Arc<super::quiesce::Control>,
}

/// A channel's transfers: the reassembler, the transfers that timed out lately (a commit
/// of one answers `TimedOut`), each open transfer's charge against the guest's memory
/// limit ([`SvmManager::charge`]), and the service's sink of each streamed transfer.
struct Transfers {
    reasm: Reassembler,
    timed_out: VecDeque<u32>,
    charges: Vec<(u32, MemoryCharge)>,
    sinks: HashMap<u32, SinkCall>,
}

impl Transfers {
    /// Transfer `t` is closed: its memory goes back to the guest, its sink (if any) goes.
    fn release(&mut self, t: u32) {
        self.charges.retain(|(x, _)| *x != t);
        self.sinks.remove(&t);
    }

    /// Drops the transfers past their deadline (remembered, for their commit's answer).
    fn expire(&mut self, cx: &ChannelCtx) {
        for t in self.reasm.expire(crate::clock::now_ns()) {
            self.release(t);
            log::info!(
                "guest {} channel {}: transfer {t} timed out",
                cx.guest.0,
                cx.id
            );
            if self.timed_out.len() == 64 {
                self.timed_out.pop_front();
            }
            self.timed_out.push_back(t);
        }
    }
}

/// Serves the channel until it closes.
pub fn serve(cx: ChannelCtx, mut end: HostEnd) {
    end.set_interrupt(cx.ctl.interrupt());
    let timeout = cx
        .hv
        .policy()
        .transfer_timeout_ms
        .map_or(TRANSFER_TIMEOUT, Duration::from_millis);
    let mut st = Transfers {
        reasm: Reassembler::new(CHANNEL_BUDGET, timeout.as_nanos() as u64),
        timed_out: VecDeque::new(),
        charges: Vec::new(),
        sinks: HashMap::new(),
    };
    // The last responses posted (a ring's worth): those the guest has not read when the
    // channel pauses are kept for a migration's hand-over.
    let mut log: VecDeque<Entry> = VecDeque::new();
    let ring = end.layout().entries as usize;
    while cx.ctl.hold(|| super::quiesce::unread(&end, &log)) {
        let now = crate::clock::now_ns();
        let wait = st
            .reasm
            .next_deadline()
            .map_or(IDLE_WAIT, |d| Duration::from_nanos(d.saturating_sub(now)));
        let before = st.reasm.used();
        match end.next(wait) {
            Ok(Some(e)) => {
                // A request that comes after a deadline finds its transfer gone.
                st.expire(&cx);
                let resp = handle(&cx, &end, &mut st, e);
                if let Err(err) = end.respond(resp) {
                    log::warn!("guest {} channel {}: {err}; closing", cx.guest.0, cx.id);
                    end.close(closed::VIOLATION);
                    break;
                }
                if log.len() == ring {
                    log.pop_front();
                }
                log.push_back(resp);
            }
            Ok(None) => st.expire(&cx),
            Err(ServiceError::Closed) => break,
            Err(err) => {
                log::warn!("guest {} channel {}: {err}; closing", cx.guest.0, cx.id);
                end.close(closed::VIOLATION);
                break;
            }
        }
        account(&cx, before, st.reasm.used());
    }
    account(&cx, st.reasm.used(), 0);
    let _ = cx.hv.close(cx.guest.0, cx.id);
    // The last touch of the channel's memory: the guest may free its region now.
    end.finish();
}

fn account(cx: &ChannelCtx, before: u64, after: u64) {
    if after > before {
        cx.guest_held.fetch_add(after - before, Ordering::Relaxed);
    } else {
        cx.guest_held.fetch_sub(before - after, Ordering::Relaxed);
    }
}

/// Runs one request; the response to post.
fn handle(cx: &ChannelCtx, end: &HostEnd, st: &mut Transfers, e: Entry) -> Entry {
    let mut resp = Entry {
        seq: e.seq,
        slot: e.slot,
        ..Entry::default()
    };
    match run(cx, end, st, &e) {
        Ok(r) => {
            resp.len = r.len as u32;
            resp.args[..4].copy_from_slice(&r.values);
        }
        Err(err) => {
            resp.code = err.status() as u32;
            let text = err.to_string();
            let text = &text.as_bytes()[..text.len().min(512)];
            if let Ok(mut s) = end.slot(e.slot) {
                if s.write_at(0, text).is_ok() {
                    resp.len = text.len() as u32;
                }
            }
        }
    }
    resp
}

fn run(cx: &ChannelCtx, end: &HostEnd, st: &mut Transfers, e: &Entry) -> Result<Reply> {
    let slot = end.slot(e.slot)?;
    let g = cx.guest.0;
    match e.code {
        kind::CALL => {
            let input = slot.prefix(e.len as usize)?;
            let mut out = slot.clone();
            cx.hv.invoke(g, cx.id, e.call, &input, &mut out)
        }
        kind::CALL_REGION => {
            let [in_r, in_off, in_len, out_r, out_off] = e.args;
            let input = RegionAccess::begin(cx, in_r, in_off, Some(in_len), AccessMode::Read)?;
            let mut output = match out_r {
                0 => None,
                r => Some(RegionAccess::begin(
                    cx,
                    r,
                    out_off,
                    None,
                    AccessMode::ReadWrite,
                )?),
            };
            let mut slot_out = slot.clone();
            let out: &mut dyn Output = match output.as_mut() {
                Some(o) => &mut o.bytes,
                None => &mut slot_out,
            };
            cx.hv.invoke(g, cx.id, e.call, &input.bytes, out)
        }
        kind::PACKET => {
            cx.hv.channel_service(g, cx.id)?;
            let h = PacketHeader::from_words(e.call, [e.args[0], e.args[1], e.args[2]])?;
            if e.len != h.len {
                return Err(ServiceError::BadPacket(format!(
                    "entry carries {} bytes, header {}",
                    e.len, h.len
                )));
            }
            let bytes = slot.prefix(h.len as usize)?;
            if stream_packet(cx, st, &h, &bytes, e.args[3])? {
                return Ok(Reply::default());
            }
            let before = st.reasm.used();
            // Copied once, from the slot in place into the transfer's buffer (a guest
            // writing the slot meanwhile spoils only its own transfer; a CRC in its commit,
            // if it sends one, shows it).
            let now = crate::clock::now_ns();
            let mut put = Err(ServiceError::BadPacket("empty slot".into()));
            bytes.for_each_chunk(&mut |bytes| {
                put = match put {
                    Err(ServiceError::BadPacket(_)) if bytes.len() == h.len as usize => {
                        st.reasm.packet(&h, bytes, now)
                    }
                    _ => Err(ServiceError::BadPacket("a slot read in pieces".into())),
                };
            })?;
            put?;
            // The packet opened its transfer: the transfer's memory counts against this
            // guest's transfers and its memory limit, or the transfer is refused.
            let grew = st.reasm.used().saturating_sub(before);
            if grew > 0 {
                let held = cx.guest_held.load(Ordering::Relaxed);
                let charge = (held.saturating_add(grew) <= GUEST_BUDGET)
                    .then(|| cx.svm.charge(cx.guest, grew).ok())
                    .flatten();
                match charge {
                    Some(c) => st.charges.push((h.transfer, c)),
                    None => {
                        let _ = st.reasm.revoke(h.transfer);
                        return Err(ServiceError::OverBudget {
                            want: h.total,
                            left: GUEST_BUDGET.saturating_sub(held),
                        });
                    }
                }
            }
            Ok(Reply::default())
        }
        kind::COMMIT => {
            let t = e.args[0] as u32;
            let crc = (e.args[3] & flags::NO_CRC == 0).then_some(e.args[2] as u32);
            let committed = st.reasm.commit(t, e.args[1] as u32, crc);
            let sink = st.sinks.remove(&t);
            st.release(t);
            let done = match committed {
                Err(ServiceError::NoSuchTransfer(t)) if st.timed_out.contains(&t) => {
                    st.timed_out.retain(|x| *x != t);
                    return Err(ServiceError::TimedOut(t));
                }
                r => r?,
            };
            let mut out = slot.clone();
            if let Some(sink) = sink {
                return cx.hv.finish_sink(sink, &mut out);
            }
            let r = cx.hv.invoke(g, cx.id, done.call, &done.data, &mut out);
            st.reasm.recycle(done.data);
            r
        }
        kind::REVOKE => {
            let t = e.args[0] as u32;
            st.release(t);
            st.reasm.revoke(t)?;
            Ok(Reply::default())
        }
        k => Err(ServiceError::BadPacket(format!("unknown request kind {k}"))),
    }
}

/// Packet `h` (its bytes `bytes`, in place in its slot) of a streamed transfer: checked and
/// recorded by the reassembler, then handed to the service's sink where it lies, no copy.
/// A transfer is streamed when its first packet says it has no checksum
/// ([`flags::NO_CRC`]) and the service takes the call's input packet by packet
/// ([`Hypervisor::open_sink`]); `Ok(false)`: the packet is one of a buffered transfer. A
/// packet the sink refuses ends its transfer.
fn stream_packet(
    cx: &ChannelCtx,
    st: &mut Transfers,
    h: &PacketHeader,
    bytes: &WindowBytes,
    packet_flags: u64,
) -> Result<bool> {
    let now = crate::clock::now_ns();
    if !st.sinks.contains_key(&h.transfer) {
        if st.reasm.is_open(h.transfer) || packet_flags & flags::NO_CRC == 0 {
            return Ok(false);
        }
        match cx.hv.open_sink(cx.guest.0, cx.id, h.call, h.total)? {
            Some(s) => st.sinks.insert(h.transfer, s),
            None => return Ok(false),
        };
    }
    if let Err(err) = st.reasm.mark(h, now) {
        if !st.reasm.is_open(h.transfer) {
            // The first packet was refused: no transfer, no sink.
            st.sinks.remove(&h.transfer);
        }
        return Err(err);
    }
    let Some(sink) = st.sinks.get_mut(&h.transfer) else {
        return Err(ServiceError::NoSuchTransfer(h.transfer));
    };
    if let Err(err) = cx.hv.sink_packet(sink, h.offset(), bytes) {
        let _ = st.reasm.revoke(h.transfer);
        st.release(h.transfer);
        return Err(err);
    }
    Ok(true)
}

/// The service's access to `len` bytes (or the rest) at `off` of the guest's region `id`,
/// in place in the guest's window: an SVM access of the guest window domain, begun before the
/// call and ended after it (on drop), as a device brackets the regions it works on. The
/// begin brings the window's replica of the range up to date (fetching what another device
/// wrote last, and creating the replica if the region has none yet); the end of a writing
/// access records the service's write, so the other replicas are refreshed from the window.
/// Every argument is the guest's and is checked: the region must be the guest's, the range
/// inside it.
struct RegionAccess<'a> {
    cx: &'a ChannelCtx,
    id: RegionId,
    spec: Option<AccessSpec>,
    bytes: WindowBytes,
}

impl<'a> RegionAccess<'a> {
    fn begin(
        cx: &'a ChannelCtx,
        id: u64,
        off: u64,
        len: Option<u64>,
        mode: AccessMode,
    ) -> Result<Self> {
        let bad = |m: String| ServiceError::BadArgument(m);
        let meta = cx
            .svm
            .meta(cx.guest, RegionId(id))
            .map_err(|_| bad(format!("no region {id} of this guest")))?;
        let len = len.unwrap_or(meta.size.saturating_sub(off));
        match off.checked_add(len) {
            Some(e) if e <= meta.size => {}
            _ => {
                return Err(bad(format!(
                    "{len} bytes at {off} outside region {id} of {} bytes",
                    meta.size
                )))
            }
        }
        let n = usize::try_from(len).map_err(|_| bad(format!("{len} bytes")))?;
        if n == 0 {
            // Nothing to read or write: no access (an empty one is refused by the SVM).
            return Ok(RegionAccess {
                cx,
                id: RegionId(id),
                spec: None,
                bytes: WindowBytes::new(cx.win.clone(), 0, 0)?,
            });
        }
        let spec = AccessSpec::new(
            virtsoc_devapi::service::ID.0,
            DomainId::GUEST_WINDOW,
            off,
            len,
            mode,
        );
        let report = cx
            .svm
            .begin_access(cx.guest, RegionId(id), &spec)
            .map_err(|e| bad(format!("region {id}: {e}")))?;
        let access = RegionAccess {
            cx,
            id: RegionId(id),
            spec: Some(spec),
            bytes: WindowBytes::new(cx.win.clone(), 0, 0)?,
        };
        let at = report.window_offset.ok_or_else(|| {
            ServiceError::Memory(format!("region {id} has no place in the guest's window"))
        })?;
        Ok(RegionAccess {
            bytes: WindowBytes::new(cx.win.clone(), at, n)?,
            ..access
        })
    }
}

impl Drop for RegionAccess<'_> {
    fn drop(&mut self) {
        if let Some(spec) = self.spec.take() {
            if let Err(e) = self.cx.svm.end_access(self.cx.guest, self.id, &spec) {
                // The guest freed the region during the call: nothing left to record.
                log::debug!(
                    "guest {} channel {}: end of the service's access to region {}: {e}",
                    self.cx.guest.0,
                    self.cx.id,
                    self.id.0
                );
            }
        }
    }
}
