//! The modem device: a cellular modem per guest, spoken to with AT commands.
//!
//! Each guest (each emulated phone) gets its own [`virtsoc_modem::Modem`] (registration,
//! signal, SMS in text mode, voice calls), created at its first command and dropped when the
//! guest goes away. The modem powers up like a real one: registered on the home network,
//! echo on (a RIL usually starts with `ATE0`).
//!
//! The channel is a byte stream carried by two commands (declared in
//! `virtsoc_devapi::modem`), with bytes packed little-endian into the u64 argument and result
//! words (byte `i` is bits `8*(i%8)..` of word `i/8`):
//! - `write(len, b0..b3)`: feeds `len` bytes (at most [`MAX_WRITE`], else `BadArgument`) and
//!   returns how many were accepted: all of them, or 0 while the guest has left
//!   [`OUTPUT_LIMIT`] bytes of answers unread (read, then write again);
//! - `read()`: takes up to [`MAX_READ`] bytes of the modem's output (`len` 0: nothing
//!   pending); the rest waits for the next read.
//!
//! Timed call progress (dialing, alerting, answered) runs on the daemon's clock, applied at
//! each command.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use virtsoc_svm::GuestId;

use virtsoc_devapi::modem::{Command, ReadReply, WriteReply};
use virtsoc_modem::{Modem as AtModem, ModemConfig};
use virtsoc_proto::Status;
use virtsoc_sync::LockExt;

use super::registry::DeviceConfig;
use super::{Device, DeviceCtx, DeviceResult};
use crate::Result;

/// Most bytes one `write` carries (four u64 words).
pub const MAX_WRITE: usize = 32;
/// Most bytes one `read` returns (five u64 words).
pub const MAX_READ: usize = 40;
/// Unread output at which `write` stops accepting bytes.
pub const OUTPUT_LIMIT: usize = 64 << 10;

/// One guest's modem and the output it has not read yet.
struct GuestModem {
    modem: AtModem,
    out: VecDeque<u8>,
}

impl GuestModem {
    fn new(cfg: ModemConfig) -> Self {
        GuestModem {
            modem: AtModem::new(cfg),
            out: VecDeque::new(),
        }
    }

    /// Moves modem time to now and collects what the modem wrote.
    fn sync(&mut self, now_ns: u64) {
        self.modem.advance(now_ns);
        self.out.extend(self.modem.take_output());
    }

    /// Feeds `bytes`; returns how many were accepted.
    fn write(&mut self, bytes: &[u8], now_ns: u64) -> usize {
        self.sync(now_ns);
        if self.out.len() >= OUTPUT_LIMIT {
            return 0;
        }
        self.modem.feed(bytes);
        self.sync(now_ns);
        bytes.len()
    }

    /// Takes up to [`MAX_READ`] bytes of output.
    fn read(&mut self, now_ns: u64) -> Vec<u8> {
        self.sync(now_ns);
        let n = self.out.len().min(MAX_READ);
        self.out.drain(..n).collect()
    }
}

/// Packs up to `8 * N` bytes little-endian into words.
fn pack<const N: usize>(bytes: &[u8]) -> [u64; N] {
    let mut words = [0u64; N];
    for (i, &b) in bytes.iter().take(8 * N).enumerate() {
        words[i / 8] |= u64::from(b) << (8 * (i % 8));
    }
    words
}

/// The first `len` bytes packed little-endian in `words`.
fn unpack(words: &[u64], len: usize) -> Vec<u8> {
    (0..len.min(8 * words.len()))
        .map(|i| (words[i / 8] >> (8 * (i % 8))) as u8)
        .collect()
}

/// The modem device.
pub struct Modem {
    guests: Mutex<HashMap<GuestId, GuestModem>>,
    /// The network as the host control set it (registration, signal), for modems opened
    /// later; taken inside the `guests` lock.
    network: Mutex<ModemConfig>,
}

impl Modem {
    /// Builds the device from the daemon's configuration.
    pub fn new(_cfg: &DeviceConfig) -> Result<Self> {
        Ok(Modem {
            guests: Mutex::new(HashMap::new()),
            network: Mutex::new(ModemConfig::default()),
        })
    }

    /// The same device within `limits`: each guest's modem keeps at most
    /// [`Limits::sms_sent`](crate::Limits::sms_sent) sent messages.
    pub fn with_limits(self, limits: &crate::Limits) -> Self {
        self.network.lock_or_recover().sent_capacity = limits.sms_sent;
        self
    }

    fn guests(&self) -> MutexGuard<'_, HashMap<GuestId, GuestModem>> {
        self.guests.lock_or_recover()
    }

    /// Feeds `bytes` to `guest`'s modem; returns how many were accepted.
    fn write(&self, guest: GuestId, bytes: &[u8]) -> usize {
        let now = crate::clock::now_ns();
        self.guests()
            .entry(guest)
            .or_insert_with(|| self.new_guest_modem())
            .write(bytes, now)
    }

    /// Takes up to [`MAX_READ`] bytes of `guest`'s modem output.
    fn read(&self, guest: GuestId) -> Vec<u8> {
        let now = crate::clock::now_ns();
        self.guests()
            .entry(guest)
            .or_insert_with(|| self.new_guest_modem())
            .read(now)
    }
}

impl Device for Modem {
    fn name(&self) -> &str {
        "modem"
    }

    fn backend(&self) -> String {
        "AT modem (registration, signal, SMS, voice calls)".into()
    }

    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult {
        match Command::decode(args)? {
            Command::Write(w) => {
                let len = usize::try_from(w.len).map_err(|_| Status::BadArgument)?;
                if len > MAX_WRITE {
                    return Err(Status::BadArgument);
                }
                let bytes = unpack(&[w.b0, w.b1, w.b2, w.b3], len);
                let accepted = self.write(cx.guest, &bytes) as u64;
                Ok(WriteReply { accepted }.to_values())
            }
            Command::Read(_) => {
                let bytes = self.read(cx.guest);
                let [b0, b1, b2, b3, b4] = pack::<5>(&bytes);
                Ok(ReadReply {
                    len: bytes.len() as u64,
                    b0,
                    b1,
                    b2,
                    b3,
                    b4,
                }
                .to_values())
            }
        }
    }

    fn guest_gone(&self, guest: GuestId) {
        self.guests().remove(&guest);
    }

    fn export_guest(&self, guest: GuestId) -> Option<serde_json::Value> {
        let guests = self.guests();
        let m = &guests.get(&guest)?.modem;
        let sms: Vec<serde_json::Value> = m
            .stored_messages()
            .map(|s| serde_json::json!({ "from": s.from, "text": s.text }))
            .collect();
        let sig = m.signal();
        Some(serde_json::json!({
            "registration": m.registration().code(),
            "signal": [sig.rssi, sig.ber],
            "echo": m.echo(),
            "sms": sms,
        }))
    }

    fn import_guest(
        &self,
        guest: GuestId,
        record: &serde_json::Value,
    ) -> std::result::Result<(), super::RecordError> {
        snapshot::import(self, guest, record)
    }

    fn control(
        &self,
        op: &str,
        args: &serde_json::Value,
    ) -> std::result::Result<serde_json::Value, virtsoc_control::ControlError> {
        self.control_op(op, args)
    }
}

/// Snapshots: a guest's modem as a record (registration, signal, echo, stored SMS) and back.
/// A call in progress and the read/unread state of stored messages are not kept: restored
/// messages are unread, at indices from 1 in their original order.
mod snapshot {
    use serde::Deserialize;
    use virtsoc_modem::{RegState, Signal};

    use super::super::RecordError;
    use super::{GuestId, GuestModem, Modem};

    /// Longest SMS text or address kept.
    const MAX_FIELD: usize = 1024;
    /// Most stored messages kept.
    const MAX_SMS: usize = 256;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Sms {
        from: String,
        text: String,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Record {
        registration: u8,
        signal: [u8; 2],
        echo: bool,
        sms: Vec<Sms>,
    }

    fn reg_state(code: u8) -> Result<RegState, RecordError> {
        Ok(match code {
            0 => RegState::NotRegistered,
            1 => RegState::Home,
            2 => RegState::Searching,
            3 => RegState::Denied,
            4 => RegState::Unknown,
            5 => RegState::Roaming,
            c => return Err(RecordError::Invalid(format!("registration state {c}"))),
        })
    }

    pub(super) fn import(
        m: &Modem,
        guest: GuestId,
        v: &serde_json::Value,
    ) -> Result<(), RecordError> {
        let r: Record = serde_json::from_value(v.clone())?;
        let registration = reg_state(r.registration)?;
        let signal = Signal {
            rssi: r.signal[0],
            ber: r.signal[1],
        };
        if !signal.is_valid() {
            return Err(RecordError::Invalid("signal out of range".into()));
        }
        if r.sms.len() > MAX_SMS
            || r.sms
                .iter()
                .any(|s| s.from.len() > MAX_FIELD || s.text.len() > MAX_FIELD)
        {
            return Err(RecordError::Invalid(
                "too many or too long stored messages".into(),
            ));
        }
        let mut cfg = m.new_guest_modem().modem.config().clone();
        cfg.echo = r.echo;
        cfg.registration = RegState::Home;
        cfg.signal = signal;
        let mut gm = GuestModem::new(cfg);
        for s in &r.sms {
            gm.modem
                .deliver_sms(&s.from, &s.text)
                .map_err(|e| RecordError::Invalid(format!("stored message: {e}")))?;
        }
        gm.modem.set_registered(registration);
        // The guest saw these messages arrive before: no new notifications.
        let _ = gm.modem.take_output();
        m.guests().insert(guest, gm);
        Ok(())
    }
}

/// Host control of the modems (the daemon's control API): the network side of the AT
/// channel, as the Android emulator's console drives it. Each operation applies to one
/// guest's modem (`"guest": id`; opened if the guest has not used the modem yet) or to every
/// guest's modem already open; registration and signal also become the network's state for
/// modems opened later.
mod control {
    use serde_json::{json, Value};
    use virtsoc_control::{
        CallRequest, ControlError, HangupRequest, RegistrationRequest, SignalRequest, SmsRequest,
    };
    use virtsoc_modem::{ModemConfig, RegState, Signal};
    use virtsoc_sync::LockExt;

    use super::{GuestId, GuestModem, Modem};

    fn args<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, ControlError> {
        serde_json::from_value(v.clone()).map_err(|e| ControlError::BadRequest(e.to_string()))
    }

    fn reg_state(s: &str) -> Result<RegState, ControlError> {
        Ok(match s {
            "home" => RegState::Home,
            "searching" => RegState::Searching,
            "denied" => RegState::Denied,
            "roaming" => RegState::Roaming,
            "not-registered" => RegState::NotRegistered,
            other => {
                return Err(ControlError::BadRequest(format!(
                    "field `state`: unknown registration state {other:?}"
                )))
            }
        })
    }

    impl Modem {
        pub(super) fn new_guest_modem(&self) -> GuestModem {
            let cfg: ModemConfig = self.network.lock_or_recover().clone();
            GuestModem::new(cfg)
        }

        /// Runs `f` on the modem of `guest`, or of every guest with a modem open; answers
        /// which guests it was done for (a refusal for the one guest named is a conflict).
        fn each(
            &self,
            guest: Option<GuestId>,
            f: impl Fn(&mut virtsoc_modem::Modem) -> virtsoc_modem::Result<()>,
        ) -> Result<Value, ControlError> {
            let now = crate::clock::now_ns();
            let mut guests = self.guests();
            let ids: Vec<GuestId> = match guest {
                Some(g) => {
                    guests.entry(g).or_insert_with(|| self.new_guest_modem());
                    vec![g]
                }
                None => guests.keys().copied().collect(),
            };
            let (mut done, mut refused) = (Vec::new(), serde_json::Map::new());
            for id in ids {
                let Some(m) = guests.get_mut(&id) else {
                    continue;
                };
                m.modem.advance(now);
                match f(&mut m.modem) {
                    Ok(()) => done.push(id),
                    Err(e) if guest.is_some() => {
                        return Err(ControlError::Conflict(format!("guest {id}'s modem: {e}")))
                    }
                    Err(e) => {
                        refused.insert(id.to_string(), json!(e.to_string()));
                    }
                }
                m.out.extend(m.modem.take_output());
            }
            done.sort_unstable();
            Ok(json!({ "delivered": done, "refused": refused }))
        }

        pub(super) fn control_op(&self, op: &str, v: &Value) -> Result<Value, ControlError> {
            match op {
                "sms" => {
                    let r: SmsRequest = args(v)?;
                    self.each(r.guest.map(GuestId), |m| {
                        m.deliver_sms(&r.from, &r.text).map(|_| ())
                    })
                }
                "call" => {
                    let r: CallRequest = args(v)?;
                    self.each(r.guest.map(GuestId), |m| m.incoming_call(&r.from))
                }
                "hangup" => {
                    let r: HangupRequest = args(v)?;
                    self.each(r.guest.map(GuestId), |m| m.remote_hangup())
                }
                "signal" => {
                    let r: SignalRequest = args(v)?;
                    let s = Signal {
                        rssi: r.rssi,
                        ber: r.ber,
                    };
                    if !s.is_valid() {
                        return Err(ControlError::BadRequest(format!(
                            "field `rssi`/`ber`: {}/{} out of range",
                            r.rssi, r.ber
                        )));
                    }
                    let out = self.each(r.guest.map(GuestId), |m| m.set_signal(r.rssi, r.ber))?;
                    if r.guest.is_none() {
                        self.network.lock_or_recover().signal = s;
                    }
                    Ok(out)
                }
                "registration" => {
                    let r: RegistrationRequest = args(v)?;
                    let state = reg_state(&r.state)?;
                    let out = self.each(r.guest.map(GuestId), |m| {
                        m.set_registered(state);
                        Ok(())
                    })?;
                    if r.guest.is_none() {
                        self.network.lock_or_recover().registration = state;
                    }
                    Ok(out)
                }
                _ => Err(ControlError::Unsupported(format!("modem operation {op:?}"))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(m: &Modem, guest: GuestId, text: &str) {
        for chunk in text.as_bytes().chunks(MAX_WRITE) {
            assert_eq!(m.write(guest, chunk), chunk.len());
        }
    }

    fn recv(m: &Modem, guest: GuestId) -> String {
        let mut out = Vec::new();
        loop {
            let b = m.read(guest);
            assert!(b.len() <= MAX_READ);
            if b.is_empty() {
                return String::from_utf8(out).unwrap();
            }
            out.extend(b);
        }
    }

    #[test]
    fn bytes_pack_little_endian() {
        let bytes: Vec<u8> = (1..=40).collect();
        let w = pack::<5>(&bytes);
        assert_eq!(w[0], 0x0807_0605_0403_0201);
        assert_eq!(unpack(&w, 40), bytes);
        assert_eq!(unpack(&w, 3), vec![1, 2, 3]);
        assert_eq!(
            unpack(&w[..1], 20),
            bytes[..8].to_vec(),
            "never past the words"
        );
        assert_eq!(pack::<4>(b"AT\r"), [0x0d_54_41, 0, 0, 0]);
    }

    #[test]
    fn each_guest_has_its_own_modem() {
        let m = Modem::new(&DeviceConfig::default()).unwrap();
        send(&m, GuestId(1), "ATE0\r");
        assert!(recv(&m, GuestId(1)).ends_with("\r\nOK\r\n"));
        send(&m, GuestId(1), "AT+CSQ\r");
        assert_eq!(recv(&m, GuestId(1)), "\r\n+CSQ: 20,99\r\n\r\nOK\r\n");
        // Guest 2's modem still echoes: ATE0 went to guest 1's.
        send(&m, GuestId(2), "AT\r");
        assert_eq!(recv(&m, GuestId(2)), "AT\r\r\nOK\r\n");
        // Long output comes out 40 bytes at a time, in order.
        send(&m, GuestId(1), "AT+CGMI;+CGMM;+CGMR;+CGSN;+COPS?\r");
        let long = recv(&m, GuestId(1));
        assert!(
            long.len() > MAX_READ && long.ends_with("OK\r\n"),
            "{long:?}"
        );
        m.guest_gone(GuestId(1));
        send(&m, GuestId(1), "AT\r");
        assert_eq!(
            recv(&m, GuestId(1)),
            "AT\r\r\nOK\r\n",
            "a fresh modem after the guest left"
        );
    }

    #[test]
    fn unread_output_stops_writes() {
        let m = Modem::new(&DeviceConfig::default()).unwrap();
        let line = "AT+CSQ;+CSQ;+CSQ;+CSQ;+CSQ\r";
        let mut refused = false;
        for _ in 0..100_000 {
            if m.write(GuestId(5), line.as_bytes()) == 0 {
                refused = true;
                break;
            }
        }
        assert!(refused, "a guest that never reads is stopped");
        let pending = m.guests().get(&GuestId(5)).unwrap().out.len();
        assert!((OUTPUT_LIMIT..OUTPUT_LIMIT + 4096).contains(&pending));
        while !m.read(GuestId(5)).is_empty() {}
        assert_eq!(m.write(GuestId(5), b"AT\r"), 3, "accepted again once read");
    }
}
