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
//! with the packet count and CRC-32, revoked on error).
//!
//! Clients: [`Geo`] (location), [`Sensors`], [`Clipboard`], [`Bulk`] (echo / sink).

use std::time::Duration;

use virtsoc_devapi::service as api;
use virtsoc_proto::{AccessMode, DeviceId, Opcode, Status};
use virtsoc_services::chan::{kind, ChannelLayout, Entry, GuestEnd};
use virtsoc_services::packet::{PacketHeader, PACKET_SIZE};
use virtsoc_services::payload::{Input, Output};
use virtsoc_services::ServiceError;

pub use virtsoc_services::builtin::{bulk, clipboard, geo, sensors};
pub use virtsoc_services::{chan, packet, payload};

use crate::{Connection, GuestError, Result};

/// Ring entries (and 64 KiB slots) of a channel opened by [`ServiceChannel::open`].
pub const DEFAULT_ENTRIES: u32 = 8;
/// Spins of the guest's end before it sleeps on its doorbell.
const SPINS: u32 = 4096;

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

/// A channel to a host service.
pub struct ServiceChannel {
    id: u64,
    region: u64,
    base: u64,
    service: String,
    end: GuestEnd,
    seq: u64,
    next_transfer: u32,
}

impl std::fmt::Debug for ServiceChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceChannel")
            .field("id", &self.id)
            .field("service", &self.service)
            .field("region", &self.region)
            .finish()
    }
}

impl ServiceChannel {
    /// Opens a channel to `service` with [`DEFAULT_ENTRIES`] entries.
    pub fn open(conn: &Connection, service: &str) -> Result<Self> {
        Self::open_with(conn, service, DEFAULT_ENTRIES)
    }

    /// Opens a channel to `service` with `entries` ring entries and slots (a power of two,
    /// at most 64).
    pub fn open_with(conn: &Connection, service: &str, entries: u32) -> Result<Self> {
        let name = virtsoc_services::pack_name(service)
            .ok_or_else(|| GuestError::BadArgument(format!("service name {service:?}")))?;
        let layout = ChannelLayout::new(entries).map_err(svc_err)?;
        let size = layout.size();
        let region = conn.alloc_blob(size)?.id;
        let open = || -> Result<Self> {
            let a = conn.begin_access(region, DeviceId::CPU, 0, size, AccessMode::ReadWrite)?;
            let win = conn.window();
            let at = a
                .ptr
                .map(|p| (p.as_ptr() as usize).wrapping_sub(win.base_ptr() as usize) as u64)
                .ok_or_else(|| GuestError::BadArgument("no CPU pointer for the channel".into()))?;
            let end = GuestEnd::create(win, at, layout, SPINS).map_err(svc_err)?;
            let r = conn.command(&api::Open {
                name0: name[0],
                name1: name[1],
                ring: region,
            })?;
            Ok(ServiceChannel {
                id: r.channel,
                region,
                base: at,
                service: service.to_string(),
                end,
                seq: 1,
                next_transfer: 1,
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

    /// Slots (and ring entries) of the channel.
    pub fn entries(&self) -> u32 {
        self.end.layout().entries
    }

    /// Closes the channel and frees its region.
    pub fn close(self, conn: &Connection) -> Result<()> {
        let r = conn.command(&api::Close { channel: self.id });
        self.end.close();
        let size = self.end.layout().size();
        let _ = conn.end_access(self.region, DeviceId::CPU, 0, size, AccessMode::ReadWrite);
        conn.free(self.region)?;
        r.map(|_| ())
    }

    /// Posts `e` (waiting for ring space) and returns its sequence number.
    fn post(&mut self, mut e: Entry) -> Result<u64> {
        e.seq = self.seq;
        self.seq += 1;
        if !self.end.post(e).map_err(svc_err)? {
            // Full: more requests posted than responses read (the caller's pipelining).
            return Err(GuestError::BadArgument("channel ring full".into()));
        }
        Ok(e.seq)
    }

    /// The next response (waits as long as it takes; `Closed` when the channel closes).
    fn response(&mut self) -> Result<Entry> {
        loop {
            if let Some(e) = self.end.next(Duration::from_secs(3600)).map_err(svc_err)? {
                return Ok(e);
            }
        }
    }

    fn answer(&self, e: &Entry, want_output: bool) -> Result<CallReply> {
        let slot = self.end.slot(e.slot).map_err(svc_err)?;
        let len = (e.len as usize).min(slot.capacity());
        let mut text = vec![0u8; len];
        if want_output || e.code != 0 {
            slot.read_at(0, &mut text).map_err(svc_err)?;
        }
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

    /// One request, one response.
    fn round_trip(&mut self, e: Entry, want_output: bool) -> Result<CallReply> {
        let seq = self.post(e)?;
        let r = self.response()?;
        if r.seq != seq {
            return Err(GuestError::Proto(virtsoc_proto::ProtoError::RingViolation(
                "service response out of order",
            )));
        }
        self.answer(&r, want_output)
    }

    /// Calls `call` with `input` (a transfer of packets when it exceeds one slot); the
    /// output comes back in [`CallReply::output`].
    pub fn call(&mut self, call: u32, input: &[u8]) -> Result<CallReply> {
        if input.len() > PACKET_SIZE as usize {
            return self.send(call, input);
        }
        let mut slot = self.end.slot(0).map_err(svc_err)?;
        slot.write_at(0, input).map_err(svc_err)?;
        self.round_trip(
            Entry {
                code: kind::CALL,
                call,
                slot: 0,
                len: input.len() as u32,
                ..Entry::default()
            },
            true,
        )
    }

    /// Calls `call` on `in_len` bytes at `in_off` of region `input`, read in place by the
    /// service, writing its output in place at `out_off` of region `output` (0: into the
    /// slot, returned in [`CallReply::output`]). The regions must have been written from the
    /// CPU (the service reads the guest's window).
    pub fn call_region(
        &mut self,
        call: u32,
        input: (u64, u64, u64),
        output: (u64, u64),
    ) -> Result<CallReply> {
        self.round_trip(
            Entry {
                code: kind::CALL_REGION,
                call,
                slot: 0,
                args: [input.0, input.1, input.2, output.0, output.1],
                ..Entry::default()
            },
            output.0 == 0,
        )
    }

    /// Sends `data` as a transfer of 64 KiB packets (pipelined over every slot), commits it
    /// and returns the call's answer on the reassembled input. A refused packet revokes the
    /// transfer and returns the refusal.
    pub fn send(&mut self, call: u32, data: &[u8]) -> Result<CallReply> {
        let t = self.next_transfer;
        self.next_transfer = self.next_transfer.wrapping_add(1).max(1);
        let packets = virtsoc_services::reassembly::split(t, call, data);
        let slots = self.entries() as usize;
        let mut in_flight = 0usize;
        let mut failure: Option<GuestError> = None;
        for (i, (h, bytes)) in packets.iter().enumerate() {
            if in_flight == slots {
                let r = self.response()?;
                in_flight -= 1;
                if let Err(e) = self.answer(&r, false) {
                    failure = Some(e);
                    break;
                }
            }
            self.post_packet(h, bytes, (i % slots) as u32)?;
            in_flight += 1;
        }
        for _ in 0..in_flight {
            let r = self.response()?;
            if let (Err(e), None) = (self.answer(&r, false), &failure) {
                failure = Some(e);
            }
        }
        if let Some(e) = failure {
            let _ = self.revoke(t);
            return Err(e);
        }
        self.commit(t, packets.len() as u32, crc32fast::hash(data))
    }

    /// Posts one packet from slot `slot` (no response read: for pipelining and tests).
    pub fn post_packet(&mut self, h: &PacketHeader, bytes: &[u8], slot: u32) -> Result<u64> {
        let mut s = self.end.slot(slot).map_err(svc_err)?;
        s.write_at(0, bytes).map_err(svc_err)?;
        let w = h.to_words();
        self.post(Entry {
            code: kind::PACKET,
            call: h.call,
            slot,
            len: bytes.len() as u32,
            args: [w[0], w[1], w[2], 0, 0],
            ..Entry::default()
        })
    }

    /// Commits transfer `transfer` of `sent` packets with the payload's CRC-32; the call's
    /// answer.
    pub fn commit(&mut self, transfer: u32, sent: u32, crc: u32) -> Result<CallReply> {
        self.round_trip(
            Entry {
                code: kind::COMMIT,
                slot: 0,
                args: [u64::from(transfer), u64::from(sent), u64::from(crc), 0, 0],
                ..Entry::default()
            },
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
            false,
        )
        .map(|_| ())
    }

    /// Posts a raw entry and returns the raw response (tests of hostile input).
    pub fn raw(&mut self, e: Entry) -> Result<Entry> {
        let seq = self.post(e)?;
        let r = self.response()?;
        if r.seq != seq {
            return Err(GuestError::Proto(virtsoc_proto::ProtoError::RingViolation(
                "service response out of order",
            )));
        }
        Ok(r)
    }

    /// Reads the next response (after [`post_packet`](Self::post_packet)); its error, if any.
    pub fn reap(&mut self) -> Result<CallReply> {
        let r = self.response()?;
        self.answer(&r, false)
    }
}

/// A location fix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeoFix {
    /// Degrees east.
    pub lon: f64,
    /// Degrees north.
    pub lat: f64,
    /// Metres.
    pub alt: f64,
    /// Unix time of the fix, ms.
    pub time_ms: u64,
}

/// The location service's client.
#[derive(Debug)]
pub struct Geo(pub ServiceChannel);

impl Geo {
    /// Opens a channel to `geo`.
    pub fn open(conn: &Connection) -> Result<Self> {
        ServiceChannel::open_with(conn, "geo", 1).map(Geo)
    }

    /// The current fix (`None` before the host set one).
    pub fn fix(&mut self) -> Result<Option<GeoFix>> {
        let v = self.0.call(geo::call::FIX, &[])?.values;
        Ok((v[3] != 0).then(|| GeoFix {
            lon: f64::from_bits(v[0]),
            lat: f64::from_bits(v[1]),
            alt: f64::from_bits(v[2]),
            time_ms: v[3],
        }))
    }

    /// The current fix as NMEA sentences (GGA, RMC; empty before a fix).
    pub fn nmea(&mut self) -> Result<String> {
        let r = self.0.call(geo::call::NMEA, &[])?;
        String::from_utf8(r.output).map_err(|_| GuestError::BadArgument("NMEA not UTF-8".into()))
    }
}

/// One sensor reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SensorValue {
    /// x (or the only value: lux, cm).
    pub x: f64,
    /// y.
    pub y: f64,
    /// z.
    pub z: f64,
    /// When (ns on the service's clock).
    pub time_ns: u64,
}

/// The sensors' client.
#[derive(Debug)]
pub struct Sensors(pub ServiceChannel);

impl Sensors {
    /// Opens a channel to `sensor`.
    pub fn open(conn: &Connection) -> Result<Self> {
        ServiceChannel::open_with(conn, "sensor", 1).map(Sensors)
    }

    fn value(v: [u64; 4]) -> SensorValue {
        SensorValue {
            x: f64::from_bits(v[0]),
            y: f64::from_bits(v[1]),
            z: f64::from_bits(v[2]),
            time_ns: v[3],
        }
    }

    /// The sensor's current value (`accelerometer`, `gyroscope`, `magnetometer`, `light`,
    /// `proximity`).
    pub fn read(&mut self, name: &str) -> Result<SensorValue> {
        Ok(Self::value(
            self.0.call(sensors::call::READ, name.as_bytes())?.values,
        ))
    }

    /// Asks for samples of `name` at `hz`; the rate granted.
    pub fn set_rate(&mut self, name: &str, hz: u32) -> Result<u32> {
        let r = self
            .0
            .call(sensors::call::RATE, format!("{name}:{hz}").as_bytes())?;
        Ok(r.values[0] as u32)
    }

    /// The next sample of `name` at the rate asked for (waits for it).
    pub fn sample(&mut self, name: &str) -> Result<SensorValue> {
        Ok(Self::value(
            self.0.call(sensors::call::SAMPLE, name.as_bytes())?.values,
        ))
    }
}

/// The clipboard's client.
#[derive(Debug)]
pub struct Clipboard(pub ServiceChannel);

impl Clipboard {
    /// Opens a channel to `clipboard`.
    pub fn open(conn: &Connection) -> Result<Self> {
        ServiceChannel::open_with(conn, "clipboard", 1).map(Clipboard)
    }

    /// The text and its version.
    pub fn get(&mut self) -> Result<(String, u64)> {
        let r = self.0.call(clipboard::call::GET, &[])?;
        let t = String::from_utf8(r.output)
            .map_err(|_| GuestError::BadArgument("clipboard not UTF-8".into()))?;
        Ok((t, r.values[0]))
    }

    /// Sets the text; its new version.
    pub fn set(&mut self, text: &str) -> Result<u64> {
        Ok(self.0.call(clipboard::call::SET, text.as_bytes())?.values[0])
    }
}

/// The bulk service's client.
#[derive(Debug)]
pub struct Bulk(pub ServiceChannel);

impl Bulk {
    /// Opens a channel to `bulk` with `entries` slots.
    pub fn open(conn: &Connection, entries: u32) -> Result<Self> {
        ServiceChannel::open_with(conn, "bulk", entries).map(Bulk)
    }

    /// Echoes `data` (at most one slot).
    pub fn echo(&mut self, data: &[u8]) -> Result<Vec<u8>> {
        Ok(self.0.call(bulk::call::ECHO, data)?.output)
    }

    /// Sends `data` (inline or in packets); the service's CRC-32 and length of it.
    pub fn sink(&mut self, data: &[u8]) -> Result<(u32, u64)> {
        let v = self.0.call(bulk::call::SINK, data)?.values;
        Ok((v[0] as u32, v[1]))
    }

    /// The service reads `len` bytes of region `region` in place; its CRC-32 and length.
    pub fn sink_region(&mut self, region: u64, len: u64) -> Result<(u32, u64)> {
        let v = self
            .0
            .call_region(bulk::call::SINK, (region, 0, len), (0, 0))?
            .values;
        Ok((v[0] as u32, v[1]))
    }
}
