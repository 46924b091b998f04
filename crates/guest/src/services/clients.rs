//! Typed clients of the emulator's services and the bulk service, each over a
//! [`ServiceChannel`].

use super::{bulk, clipboard, geo, sensors, ServiceChannel};
use crate::{Connection, GuestError, RegionId, Result};

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
pub struct Geo<'c>(pub ServiceChannel<'c>);

impl<'c> Geo<'c> {
    /// Opens a channel to `geo`.
    pub fn open(conn: &'c Connection) -> Result<Self> {
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
    /// When (Unix time, ns).
    pub time_ns: u64,
    /// The sample's number for this guest and sensor (1, 2, ...; 0 for a `read`).
    pub seq: u64,
}

/// The sensors' client.
#[derive(Debug)]
pub struct Sensors<'c>(pub ServiceChannel<'c>);

impl<'c> Sensors<'c> {
    /// Opens a channel to `sensor`.
    pub fn open(conn: &'c Connection) -> Result<Self> {
        ServiceChannel::open_with(conn, "sensor", 1).map(Sensors)
    }

    fn value(v: [u64; 4]) -> SensorValue {
        SensorValue {
            x: f64::from_bits(v[0]),
            y: f64::from_bits(v[1]),
            z: f64::from_bits(v[2]),
            time_ns: v[3],
            seq: 0,
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

    /// The next sample of `name` at the rate asked for (waits for it), with its number.
    pub fn sample(&mut self, name: &str) -> Result<SensorValue> {
        let r = self.0.call(sensors::call::SAMPLE, name.as_bytes())?;
        let seq = r
            .output
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| GuestError::BadArgument("a sample without its number".into()))?;
        Ok(SensorValue {
            seq,
            ..Self::value(r.values)
        })
    }
}

/// The clipboard's client.
#[derive(Debug)]
pub struct Clipboard<'c>(pub ServiceChannel<'c>);

impl<'c> Clipboard<'c> {
    /// Opens a channel to `clipboard`.
    pub fn open(conn: &'c Connection) -> Result<Self> {
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

/// What the bulk service's `sink` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sink {
    /// CRC-32 of what it read.
    pub crc: u32,
    /// Bytes it read.
    pub len: u64,
    /// This guest's sinks and drains so far, this one included (a transfer lost or run
    /// twice shows here).
    pub nth: u64,
    /// Their bytes.
    pub total_bytes: u64,
}

/// The bulk service's client.
#[derive(Debug)]
pub struct Bulk<'c>(pub ServiceChannel<'c>);

impl<'c> Bulk<'c> {
    /// Opens a channel to `bulk` with `entries` slots.
    pub fn open(conn: &'c Connection, entries: u32) -> Result<Self> {
        ServiceChannel::open_with(conn, "bulk", entries).map(Bulk)
    }

    /// Echoes `data` (at most one slot).
    pub fn echo(&mut self, data: &[u8]) -> Result<Vec<u8>> {
        Ok(self.0.call(bulk::call::ECHO, data)?.output)
    }

    /// Sends `data` (inline or in packets); the service's CRC-32 and length of it.
    pub fn sink(&mut self, data: &[u8]) -> Result<(u32, u64)> {
        let s = self.sink_counted(data)?;
        Ok((s.crc, s.len))
    }

    /// Sends `data` (inline or in packets); what the service saw, with its count of this
    /// guest's sinks.
    pub fn sink_counted(&mut self, data: &[u8]) -> Result<Sink> {
        let v = self.0.call(bulk::call::SINK, data)?.values;
        Ok(Sink {
            crc: v[0] as u32,
            len: v[1],
            nth: v[2],
            total_bytes: v[3],
        })
    }

    /// The service reads `len` bytes of region `region` in place; its CRC-32 and length.
    pub fn sink_region(&mut self, region: RegionId, len: u64) -> Result<(u32, u64)> {
        let v = self
            .0
            .call_region(bulk::call::SINK, (region, 0, len), None)?
            .values;
        Ok((v[0] as u32, v[1]))
    }
}
