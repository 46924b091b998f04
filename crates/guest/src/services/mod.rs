//! Host services from the guest: channels to the services the daemon hosts (issue 29,
//! after virtio-vapp), and typed clients for the emulator's services.
//!
//! [`ServiceChannel::open`] allocates a blob region, opens a CPU access on it for the
//! channel's life, lays the channel's rings and slots out there
//! ([`virtsoc_services::chan`]) and asks the daemon's `service` device to open a channel to
//! the named service on it. Calls then go through the channel's own rings, not the
//! connection's: inline (input up to one 64 KiB slot, output back in the slot), on regions
//! read and written in place by the service ([`ServiceChannel::call_region`]), or as a
//! transfer of 64 KiB packets ([`ServiceChannel::send`]: pipelined over the slots, committed
//! with the packet count, revoked on error; [`ServiceChannel::send_checked`] adds a CRC-32
//! of the payload, checked by the host).
//!
//! A channel follows its session when it migrates (`moved.rs`): with the connection's
//! auto-reconnect on, a call in progress or the next one finds the channel moved, takes the
//! answers the old daemon left, resumes the channel (same id) on the new daemon and sends
//! its unanswered requests again; each request runs once.
//!
//! Clients: [`Geo`] (location), [`Sensors`], [`Clipboard`], [`Bulk`] (echo / sink).

mod clients;
mod moved;

use std::collections::VecDeque;
use std::time::Duration;

use virtsoc_devapi::service as api;
use virtsoc_proto::{AccessMode, DeviceId, Opcode, Status};
use virtsoc_services::chan::{kind, ChannelLayout, Entry, GuestEnd};
use virtsoc_services::packet::{PacketHeader, PACKET_SIZE};
use virtsoc_services::payload::{Input, Output};
use virtsoc_services::ServiceError;

pub use clients::{Bulk, Clipboard, Geo, GeoFix, SensorValue, Sensors, Sink};
pub use virtsoc_services::builtin::{bulk, clipboard, geo, sensors};
pub use virtsoc_services::{chan, packet, payload};

use crate::{Connection, GuestError, RegionId, Result};

/// Ring entries (and 64 KiB slots) of a channel opened by [`ServiceChannel::open`].
pub const DEFAULT_ENTRIES: u32 = 8;
/// Spins of the guest's end before it sleeps on its doorbell.
const SPINS: u32 = 4096;
/// Longest [`ServiceChannel::close`] waits for a call still running on the host before it
/// frees the channel's region (a call's deadline is 10 s unless the policy says otherwise).
pub const CLOSE_WAIT: Duration = Duration::from_secs(12);
/// How long a wait for an answer goes before it checks that the connection did not move
/// to another daemon under it (the old daemon's memory, its `MOVED` mark with it, may be
/// released before the wait looks).
const MOVE_CHECK: Duration = Duration::from_secs(1);
/// Most times one transfer starts again because its channel moved.
const MAX_RESTARTS: u32 = 4;

/// What a call answered.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CallReply {
    /// The call's result values.
    pub values: [u64; 4],
    /// The bytes it wrote to the slot (inline and packet calls; empty for region output).
    pub output: Vec<u8>,
    /// Bytes it wrote to its output.
    pub len: usize,
}

fn svc_err(e: ServiceError) -> GuestError {
    match e {
        ServiceError::Closed => GuestError::Closed,
        e => GuestError::Status {
            op: Opcode::DeviceCmd,
            status: e.status(),
            reason: Some(e.to_string()),
        },
    }
}

/// A response, and its slot's bytes when it was taken off a ring the channel left.
struct Response {
    e: Entry,
    kept: Option<Vec<u8>>,
}

/// A channel to a host service, on connection `'c`.
pub struct ServiceChannel<'c> {
    conn: &'c Connection,
    id: u64,
    region: RegionId,
    base: u64,
    service: String,
    end: GuestEnd,
    seq: u64,
    next_transfer: u32,
    /// Requests posted and not answered yet, in order, with an inline call's input: what a
    /// move sends again.
    outstanding: VecDeque<(Entry, Vec<u8>)>,
    /// Answers taken off the ring of the daemon the channel left, not read yet.
    ready: VecDeque<Response>,
    /// Moves followed so far.
    moves: u64,
}

impl std::fmt::Debug for ServiceChannel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceChannel")
            .field("id", &self.id)
            .field("service", &self.service)
            .field("region", &self.region)
            .finish()
    }
}

impl<'c> ServiceChannel<'c> {
    /// Opens a channel to `service` with [`DEFAULT_ENTRIES`] entries.
    pub fn open(conn: &'c Connection, service: &str) -> Result<Self> {
        Self::open_with(conn, service, DEFAULT_ENTRIES)
    }

    /// Opens a channel to `service` with `entries` ring entries and slots (a power of two,
    /// at most 64).
    pub fn open_with(conn: &'c Connection, service: &str, entries: u32) -> Result<Self> {
        let name = virtsoc_services::pack_name(service)
            .ok_or_else(|| GuestError::BadArgument(format!("service name {service:?}")))?;
        let layout = ChannelLayout::new(entries).map_err(svc_err)?;
        let region = conn.alloc_blob(layout.size())?.id;
        let open = || -> Result<Self> {
            let (base, end) = lay_out(conn, region, layout)?;
            let r = conn.command(&api::Open {
                name0: name[0],
                name1: name[1],
                ring: u64::from(region),
            })?;
            Ok(ServiceChannel {
                conn,
                id: r.channel,
                region,
                base,
                service: service.to_string(),
                end,
                seq: 1,
                next_transfer: 1,
                outstanding: VecDeque::new(),
                ready: VecDeque::new(),
                moves: 0,
            })
        };
        open().inspect_err(|_| {
            let _ = conn.free(region);
        })
    }

    /// The channel id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Offset of the channel's memory in the connection's window (its control block).
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The service's name.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// Moves to another daemon the channel followed (see the module docs).
    pub fn moves(&self) -> u64 {
        self.moves
    }

    /// Slots (and ring entries) of the channel.
    pub fn entries(&self) -> u32 {
        self.end.layout().entries
    }

    /// Closes the channel and frees its region (once the host's thread is done with it,
    /// waiting at most [`CLOSE_WAIT`] for a call in progress on the host).
    pub fn close(self) -> Result<()> {
        let conn = self.conn;
        let r = conn.command(&api::Close { channel: self.id });
        self.end.close();
        if r.is_ok() {
            self.end.wait_host_done(CLOSE_WAIT);
        }
        let size = self.end.layout().size();
        let _ = conn.end_access(self.region, DeviceId::CPU, 0, size, AccessMode::ReadWrite);
        conn.free(self.region)?;
        r.map(|_| ())
    }

    /// Posts `e` (an inline call's `input` already in its slot) and returns its sequence
    /// number.
    fn post(&mut self, mut e: Entry, input: &[u8]) -> Result<u64> {
        e.seq = self.seq;
        self.seq += 1;
        let input = if e.code == kind::CALL {
            input.to_vec()
        } else {
            Vec::new()
        };
        let moved = self.moves;
        if self.moved_away() {
            self.follow_move()?;
        }
        let posted = if self.moves == moved {
            self.end.post(e)
        } else {
            Err(ServiceError::Closed)
        };
        match posted {
            Ok(true) => self.outstanding.push_back((e, input)),
            // Full: more requests posted than responses read (the caller's pipelining).
            Ok(false) => return Err(GuestError::BadArgument("channel ring full".into())),
            Err(err) if self.moves == moved && !self.moved_after_all() => return Err(svc_err(err)),
            Err(_) => {
                if self.moves == moved {
                    self.follow_move()?;
                }
                if e.code != kind::CALL && e.code != kind::CALL_REGION {
                    // A piece of a transfer the move cut: the transfer starts again.
                    return Err(moved::restart_error());
                }
                self.repost(e, input)?;
            }
        }
        Ok(e.seq)
    }

    /// The next response (waits as long as it takes; `Closed` when the channel closes).
    fn response(&mut self) -> Result<Response> {
        loop {
            if self.ready.is_empty() && self.moved_away() {
                self.follow_move()?;
            }
            let r = match self.ready.pop_front() {
                Some(r) => r,
                None => match self.end.next(MOVE_CHECK) {
                    Ok(Some(e)) => Response { e, kept: None },
                    Ok(None) => continue,
                    Err(_) if self.moved_after_all() => {
                        self.follow_move()?;
                        continue;
                    }
                    Err(e) => return Err(svc_err(e)),
                },
            };
            self.outstanding.retain(|(o, _)| o.seq != r.e.seq);
            return Ok(r);
        }
    }

    fn answer(&self, r: Response, want_output: bool) -> Result<CallReply> {
        let e = &r.e;
        if e.code == moved::RESTART {
            return Err(moved::restart_error());
        }
        let text = match r.kept {
            Some(bytes) => bytes,
            None => {
                let slot = self.end.slot(e.slot).map_err(svc_err)?;
                let len = (e.len as usize).min(slot.capacity());
                let mut text = vec![0u8; len];
                if want_output || e.code != 0 {
                    slot.read_at(0, &mut text).map_err(svc_err)?;
                }
                text
            }
        };
        if e.code != 0 {
            return Err(GuestError::Status {
                op: Opcode::DeviceCmd,
                status: Status::from_u32(e.code).unwrap_or(Status::Internal),
                reason: Some(String::from_utf8_lossy(&text).into_owned()),
            });
        }
        let mut values = [0u64; 4];
        values.copy_from_slice(&e.args[..4]);
        Ok(CallReply {
            values,
            output: if want_output { text } else { Vec::new() },
            len: e.len as usize,
        })
    }

    /// One request (an inline call's `input` in its slot), one response.
    fn round_trip(&mut self, e: Entry, input: &[u8], want_output: bool) -> Result<CallReply> {
        let seq = self.post(e, input)?;
        let r = self.response()?;
        if r.e.seq != seq {
            return Err(GuestError::Proto(virtsoc_proto::ProtoError::RingViolation(
                "service response out of order",
            )));
        }
        self.answer(r, want_output)
    }

    /// Calls `call` with `input` (a transfer of packets when it exceeds one slot); the
    /// output comes back in [`CallReply::output`].
    pub fn call(&mut self, call: u32, input: &[u8]) -> Result<CallReply> {
        if input.len() > PACKET_SIZE as usize {
            return self.send(call, input);
        }
        self.write_slot(0, input)?;
        self.round_trip(
            Entry {
                code: kind::CALL,
                call,
                slot: 0,
                len: input.len() as u32,
                ..Entry::default()
            },
            input,
            true,
        )
    }

    /// Writes `bytes` at the start of slot `slot`.
    fn write_slot(&mut self, slot: u32, bytes: &[u8]) -> Result<()> {
        let mut s = self.end.slot(slot).map_err(svc_err)?;
        s.write_at(0, bytes).map_err(svc_err)
    }

    /// Calls `call` on `in_len` bytes at `in_off` of region `input`, read in place by the
    /// service, writing its output in place at `out_off` of region `output` (`None`: into
    /// the slot, returned in [`CallReply::output`]). The service brackets the ranges with an
    /// access of its own: whatever wrote the regions last (the CPU, a device), it reads
    /// their current bytes, and its write is seen by the next reader.
    pub fn call_region(
        &mut self,
        call: u32,
        input: (RegionId, u64, u64),
        output: Option<(RegionId, u64)>,
    ) -> Result<CallReply> {
        // The entry's words: region 0 says "into the slot".
        let (out, out_off) = output.map_or((0, 0), |(r, off)| (u64::from(r), off));
        self.round_trip(
            Entry {
                code: kind::CALL_REGION,
                call,
                slot: 0,
                args: [u64::from(input.0), input.1, input.2, out, out_off],
                ..Entry::default()
            },
            &[],
            out == 0,
        )
    }

    /// Sends `data` as a transfer of 64 KiB packets (pipelined over every slot), commits it
    /// and returns the call's answer on the reassembled input. A refused packet revokes the
    /// transfer and returns the refusal. A transfer cut by a move of the channel starts
    /// again on the daemon the channel moved to (its call runs once).
    ///
    /// The commit carries no checksum: the host's completion bitmap and packet checks catch a
    /// lost, duplicated or overlapping packet, and a CRC would only check this process's own
    /// memory, at a pass over the payload on each side.
    pub fn send(&mut self, call: u32, data: &[u8]) -> Result<CallReply> {
        self.send_with(call, data, false)
    }

    /// [`send`](Self::send), with the payload's CRC-32 in the commit, which the host checks
    /// on the reassembled bytes (`Incomplete` when they differ).
    pub fn send_checked(&mut self, call: u32, data: &[u8]) -> Result<CallReply> {
        self.send_with(call, data, true)
    }

    fn send_with(&mut self, call: u32, data: &[u8], checked: bool) -> Result<CallReply> {
        let mut restarts = 0;
        loop {
            match self.send_once(call, data, checked) {
                Err(e) if moved::is_restart(&e) && restarts < MAX_RESTARTS => restarts += 1,
                r => return r,
            }
        }
    }

    /// One try of [`send`](Self::send): a transfer on the daemon the channel is on; the
    /// restart error when the channel moved meanwhile (every packet posted answered first).
    fn send_once(&mut self, call: u32, data: &[u8], checked: bool) -> Result<CallReply> {
        let t = self.next_transfer;
        self.next_transfer = self.next_transfer.wrapping_add(1).max(1);
        let packets = virtsoc_services::reassembly::split(t, call, data);
        let slots = self.entries() as usize;
        let moves = self.moves;
        let flags = if checked { 0 } else { chan::flags::NO_CRC };
        let mut in_flight = 0usize;
        let mut failure: Option<GuestError> = None;
        for (i, (h, bytes)) in packets.iter().enumerate() {
            if in_flight == slots {
                let r = self.response()?;
                in_flight -= 1;
                if let Err(e) = self.answer(r, false) {
                    failure = Some(e);
                    break;
                }
            }
            if self.moves != moves {
                break;
            }
            match self.post_packet_with(h, bytes, (i % slots) as u32, flags) {
                Ok(_) => in_flight += 1,
                Err(e) if moved::is_restart(&e) => break,
                Err(e) => return Err(e),
            }
        }
        for _ in 0..in_flight {
            let r = self.response()?;
            if let (Err(e), None) = (self.answer(r, false), &failure) {
                failure = Some(e);
            }
        }
        if self.moves != moves {
            // Packets went to two daemons: the transfer starts again on this one.
            let _ = self.revoke(t);
            return Err(moved::restart_error());
        }
        if let Some(e) = failure {
            let _ = self.revoke(t);
            return Err(e);
        }
        let sent = packets.len() as u32;
        if checked {
            self.commit(t, sent, crc32fast::hash(data))
        } else {
            self.commit_with(t, sent, 0, flags)
        }
    }

    /// Posts one packet from slot `slot` (no response read: for pipelining and tests), of a
    /// transfer committed with a checksum.
    pub fn post_packet(&mut self, h: &PacketHeader, bytes: &[u8], slot: u32) -> Result<u64> {
        self.post_packet_with(h, bytes, slot, 0)
    }

    /// [`post_packet`](Self::post_packet) of a transfer with flags `flags`
    /// ([`chan::flags`]).
    pub fn post_packet_with(
        &mut self,
        h: &PacketHeader,
        bytes: &[u8],
        slot: u32,
        flags: u64,
    ) -> Result<u64> {
        self.write_slot(slot, bytes)?;
        let w = h.to_words();
        self.post(
            Entry {
                code: kind::PACKET,
                call: h.call,
                slot,
                len: bytes.len() as u32,
                args: [w[0], w[1], w[2], flags, 0],
                ..Entry::default()
            },
            &[],
        )
    }

    /// Commits transfer `transfer` of `sent` packets with the payload's CRC-32; the call's
    /// answer.
    pub fn commit(&mut self, transfer: u32, sent: u32, crc: u32) -> Result<CallReply> {
        self.commit_with(transfer, sent, crc, 0)
    }

    /// Commits transfer `transfer` with `flags` ([`chan::flags`]); `crc` unless
    /// [`chan::flags::NO_CRC`].
    pub fn commit_with(
        &mut self,
        transfer: u32,
        sent: u32,
        crc: u32,
        flags: u64,
    ) -> Result<CallReply> {
        self.round_trip(
            Entry {
                code: kind::COMMIT,
                slot: 0,
                args: [
                    u64::from(transfer),
                    u64::from(sent),
                    u64::from(crc),
                    flags,
                    0,
                ],
                ..Entry::default()
            },
            &[],
            true,
        )
    }

    /// Revokes transfer `transfer`.
    pub fn revoke(&mut self, transfer: u32) -> Result<()> {
        self.round_trip(
            Entry {
                code: kind::REVOKE,
                slot: 0,
                args: [u64::from(transfer), 0, 0, 0, 0],
                ..Entry::default()
            },
            &[],
            false,
        )
        .map(|_| ())
    }

    /// Posts a raw entry and returns the raw response (tests of hostile input).
    pub fn raw(&mut self, e: Entry) -> Result<Entry> {
        let seq = self.post(e, &[])?;
        let r = self.response()?;
        if r.e.seq != seq {
            return Err(GuestError::Proto(virtsoc_proto::ProtoError::RingViolation(
                "service response out of order",
            )));
        }
        Ok(r.e)
    }

    /// Reads the next response (after [`post_packet`](Self::post_packet)); its error, if any.
    pub fn reap(&mut self) -> Result<CallReply> {
        let r = self.response()?;
        self.answer(r, false)
    }
}

/// Begins the CPU access of the channel's region `region` (for the channel's life) and lays
/// a fresh channel out at its start; the window offset and the guest's end.
fn lay_out(conn: &Connection, region: RegionId, layout: ChannelLayout) -> Result<(u64, GuestEnd)> {
    let size = layout.size();
    let a = conn.begin_access(region, DeviceId::CPU, 0, size, AccessMode::ReadWrite)?;
    let win = conn.window();
    let at = a
        .ptr
        .map(|p| (p.as_ptr() as usize).wrapping_sub(win.base_ptr() as usize) as u64)
        .ok_or_else(|| GuestError::BadArgument("no CPU pointer for the channel".into()))?;
    // A VM guest's channel rings over its port, whose one reader wakes the channel's waits.
    let port = conn.vm_port.lock().clone();
    let bells = match port {
        Some(port) => port.channel_bells(&win, at, SPINS)?,
        None => chan::Bells::guest_futex(&win, at, SPINS).map_err(svc_err)?,
    };
    let end = GuestEnd::create_with(win, at, layout, bells).map_err(svc_err)?;
    Ok((at, end))
}
