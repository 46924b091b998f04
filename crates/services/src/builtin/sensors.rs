//! `sensor`: the emulated phone's sensors (accelerometer, gyroscope, magnetometer, light,
//! proximity), set by the host (`virtsoc ctl sensor set NAME x:y:z`) and read by guests,
//! once or as samples at a rate the guest asks for.
//!
//! Calls take the sensor's name as their input: `read` answers the current value at once;
//! `rate` (input `NAME:HZ`) sets this guest's rate for that sensor (1..=200 Hz, clamped);
//! `sample` waits for the guest's next sample time at that rate, then answers the value (a
//! channel of its own, so the wait holds up nothing else) and, as its 8 output bytes, the
//! sample's number (1, 2, ... per guest and sensor: a lost or repeated sample shows).
//! Times are Unix time in nanoseconds, so that they run on across a migration; a guest's
//! rates and sample numbers go with it ([`Service::export_guest`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::text;
use std::borrow::Cow;

use crate::hypervisor::{CallCtx, CallInfo, Reply, Service};
use crate::payload::{Input, Output};
use crate::{Result, ServiceError};
use virtsoc_sync::LockExt;

/// The sensors, in order.
pub const NAMES: [&str; 5] = [
    "accelerometer",
    "gyroscope",
    "magnetometer",
    "light",
    "proximity",
];

/// Call numbers.
pub mod call {
    /// Input: sensor name; values: x, y, z (f64 bits), time (Unix time, ns).
    pub const READ: u32 = 1;
    /// Input: `NAME:HZ`; values: the rate granted (Hz).
    pub const RATE: u32 = 2;
    /// Input: sensor name; waits for the next sample at the guest's rate; values as `read`;
    /// output: the sample's number (u64, little-endian).
    pub const SAMPLE: u32 = 3;
}

const CALLS: &[CallInfo] = &[
    CallInfo {
        call: call::READ,
        name: Cow::Borrowed("read"),
        doc: Cow::Borrowed("input: sensor name; values: x, y, z (f64 bits), time ns"),
    },
    CallInfo {
        call: call::RATE,
        name: Cow::Borrowed("rate"),
        doc: Cow::Borrowed("input: NAME:HZ; values: the rate granted (1..=200 Hz)"),
    },
    CallInfo {
        call: call::SAMPLE,
        name: Cow::Borrowed("sample"),
        doc: Cow::Borrowed(
            "input: sensor name; the next sample at the guest's rate; values as read; output: its number (u64)",
        ),
    },
];

/// A guest's sampling of one sensor.
#[derive(Debug, Clone, Copy)]
struct Rate {
    hz: u32,
    /// When its next sample is due.
    next: Instant,
    /// Samples taken so far.
    taken: u64,
}

struct State {
    values: [[f64; 3]; 5],
    /// (guest, sensor) -> its sampling.
    rates: HashMap<(u64, usize), Rate>,
}

/// The sensors.
pub struct Sensors {
    state: Mutex<State>,
}

/// Unix time, ns.
fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl Default for Sensors {
    fn default() -> Self {
        Sensors {
            state: Mutex::new(State {
                // A phone lying still, face up, in an office.
                values: [
                    [0.0, 0.0, 9.81],
                    [0.0; 3],
                    [0.0, 5.9, -48.4],
                    [300.0, 0.0, 0.0],
                    [5.0, 0.0, 0.0],
                ],
                rates: HashMap::new(),
            }),
        }
    }
}

fn index(name: &str) -> Result<usize> {
    NAMES.iter().position(|n| *n == name).ok_or_else(|| {
        ServiceError::BadArgument(format!("no sensor {name:?} ({})", NAMES.join(", ")))
    })
}

/// Parses `x:y:z` (one to three numbers; the rest 0).
pub fn parse_value(s: &str) -> Result<[f64; 3]> {
    let mut v = [0.0; 3];
    let parts: Vec<&str> = s.split(':').collect();
    if parts.is_empty() || parts.len() > 3 {
        return Err(ServiceError::BadArgument(format!(
            "{s:?}: expected x[:y[:z]]"
        )));
    }
    for (i, p) in parts.iter().enumerate() {
        v[i] = p
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .ok_or_else(|| ServiceError::BadArgument(format!("{p:?} is not a number")))?;
    }
    Ok(v)
}

impl Sensors {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock_or_recover()
    }

    fn reply(&self, i: usize) -> Reply {
        let v = self.lock().values[i];
        Reply {
            len: 0,
            values: [v[0].to_bits(), v[1].to_bits(), v[2].to_bits(), unix_ns()],
        }
    }
}

impl Service for Sensors {
    fn name(&self) -> &str {
        "sensor"
    }

    fn calls(&self) -> Vec<CallInfo> {
        CALLS.to_vec()
    }

    fn call(&self, cx: &CallCtx, c: u32, input: &dyn Input, out: &mut dyn Output) -> Result<Reply> {
        let arg = text(input, 64)?;
        match c {
            call::RATE => {
                let (name, hz) = arg
                    .split_once(':')
                    .ok_or_else(|| ServiceError::BadArgument("expected NAME:HZ".into()))?;
                let hz: u32 = hz
                    .parse()
                    .map_err(|_| ServiceError::BadArgument(format!("{hz:?} is not a rate")))?;
                let hz = hz.clamp(1, 200);
                let i = index(name)?;
                let mut s = self.lock();
                let r = s.rates.entry((cx.guest, i)).or_insert(Rate {
                    hz,
                    next: Instant::now(),
                    taken: 0,
                });
                r.hz = hz;
                r.next = Instant::now();
                Ok(Reply {
                    len: 0,
                    values: [u64::from(hz), 0, 0, 0],
                })
            }
            call::SAMPLE => {
                let i = index(&arg)?;
                let (wait, n) = {
                    let mut s = self.lock();
                    let now = Instant::now();
                    let r = s.rates.entry((cx.guest, i)).or_insert(Rate {
                        hz: 10,
                        next: now,
                        taken: 0,
                    });
                    let period = Duration::from_secs(1) / r.hz;
                    // A guest late for its sample by more than a period gets it now.
                    let at = if r.next + period < now { now } else { r.next };
                    r.next = at + period;
                    r.taken += 1;
                    (at.saturating_duration_since(now), r.taken)
                };
                std::thread::sleep(wait);
                let mut reply = self.reply(i);
                reply.len = super::put(out, &n.to_le_bytes())?;
                Ok(reply)
            }
            _ => Ok(self.reply(index(&arg)?)),
        }
    }

    fn control(&self, op: &str, args: &Value) -> Result<Value> {
        match op {
            "set" => {
                let name = args["name"]
                    .as_str()
                    .ok_or_else(|| ServiceError::BadArgument("field `name`: a sensor".into()))?;
                let i = index(name)?;
                let v = parse_value(args["value"].as_str().ok_or_else(|| {
                    ServiceError::BadArgument("field `value`: \"x:y:z\"".into())
                })?)?;
                self.lock().values[i] = v;
                Ok(json!({ "name": name, "value": v }))
            }
            "get" => {
                let s = self.lock();
                let m: serde_json::Map<String, Value> = NAMES
                    .iter()
                    .zip(s.values.iter())
                    .map(|(n, v)| (n.to_string(), json!(v)))
                    .collect();
                Ok(Value::Object(m))
            }
            _ => Err(ServiceError::BadArgument(format!(
                "sensor: no operation {op:?} (get, set)"
            ))),
        }
    }

    fn guest_gone(&self, guest: u64) {
        self.lock().rates.retain(|(g, _), _| *g != guest);
    }

    /// Per sensor the guest sampled: `{"NAME": {"hz": N, "taken": N}}`.
    fn export_guest(&self, guest: u64) -> Option<Value> {
        let s = self.lock();
        let m: serde_json::Map<String, Value> = s
            .rates
            .iter()
            .filter(|((g, _), _)| *g == guest)
            .map(|((_, i), r)| (NAMES[*i].to_string(), json!({"hz": r.hz, "taken": r.taken})))
            .collect();
        (!m.is_empty()).then_some(Value::Object(m))
    }

    fn import_guest(&self, guest: u64, state: &Value) -> Result<()> {
        let bad = |m: String| ServiceError::BadArgument(format!("sensor state: {m}"));
        let m = state.as_object().ok_or_else(|| bad("an object".into()))?;
        let mut rates = Vec::new();
        for (name, v) in m {
            let i = index(name)?;
            let hz = v["hz"]
                .as_u64()
                .filter(|h| (1..=200).contains(h))
                .ok_or_else(|| bad(format!("{name}: hz 1..=200")))?;
            let taken = v["taken"]
                .as_u64()
                .ok_or_else(|| bad(format!("{name}: taken")))?;
            rates.push((
                i,
                Rate {
                    hz: hz as u32,
                    next: Instant::now(),
                    taken,
                },
            ));
        }
        let mut s = self.lock();
        for (i, r) in rates {
            s.rates.insert((guest, i), r);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_and_set() {
        assert_eq!(parse_value("1:2.5:-3").unwrap(), [1.0, 2.5, -3.0]);
        assert_eq!(parse_value("7").unwrap(), [7.0, 0.0, 0.0]);
        assert!(parse_value("1:2:3:4").is_err());
        assert!(parse_value("x").is_err());
        assert!(parse_value("nan").is_err());
        let s = Sensors::default();
        s.control("set", &json!({"name": "gyroscope", "value": "0.1:0.2:0.3"}))
            .unwrap();
        let cx = CallCtx::new(1, 1);
        let r = s
            .call(&cx, call::READ, &&b"gyroscope"[..], &mut Vec::new())
            .unwrap();
        assert_eq!(f64::from_bits(r.values[1]), 0.2);
        assert!(s
            .call(&cx, call::READ, &&b"thermometer"[..], &mut Vec::new())
            .is_err());
        let r = s
            .call(&cx, call::RATE, &&b"light:1000"[..], &mut Vec::new())
            .unwrap();
        assert_eq!(r.values[0], 200, "clamped");
        assert!(s.control("set", &json!({"name": "light"})).is_err());
    }
}
