//! `bulk`: the benchmark's service. `echo` copies its input to its output; `sink` reads its
//! input once and answers its CRC-32 and length; `drain` reads it once in place.
//!
//! `drain` takes a streamed input packet by packet where each packet lies
//! ([`Service::sink`]: no reassembly buffer, no copy on the host); its sum does not depend on
//! the packets' order.
//!
//! `sink` and `drain` also answer how many of them this guest has had (this one included)
//! and the bytes they read: a transfer lost or run twice shows in the count, which goes
//! with the guest when it migrates ([`Service::export_guest`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::hypervisor::{CallCtx, CallInfo, InputSink, Reply, Service};
use crate::payload::{self, Input, Output};
use crate::{Result, ServiceError};
use virtsoc_sync::LockExt;

/// Call numbers.
pub mod call {
    /// Copies the input to the output; values: bytes.
    pub const ECHO: u32 = 1;
    /// Reads the input; values: CRC-32, bytes, this guest's sinks and drains so far, their
    /// bytes.
    pub const SINK: u32 = 2;
    /// Reads every byte of the input once where it is, keeping no copy (no checksum: what
    /// the benchmark times); values: bytes, the wrapping sum of its 64-bit words
    /// ([`crate::payload::word_sum`]), then as `sink`.
    pub const DRAIN: u32 = 3;
}

const CALLS: &[CallInfo] = &[
    CallInfo {
        call: call::ECHO,
        name: Cow::Borrowed("echo"),
        doc: Cow::Borrowed("copies the input to the output; values: bytes"),
    },
    CallInfo {
        call: call::SINK,
        name: Cow::Borrowed("sink"),
        doc: Cow::Borrowed(
            "reads the input once; values: CRC-32, bytes, sinks and drains so far, their bytes",
        ),
    },
    CallInfo {
        call: call::DRAIN,
        name: Cow::Borrowed("drain"),
        doc: Cow::Borrowed(
            "reads every byte of the input once in place; values: bytes, sum of its 64-bit \
             words, sinks and drains so far, their bytes",
        ),
    },
];

/// Per guest: its sinks and drains and their bytes.
type Counts = Arc<Mutex<HashMap<u64, (u64, u64)>>>;

/// The bulk service: per guest, its sinks and drains and their bytes.
#[derive(Default)]
pub struct Bulk {
    counts: Counts,
}

/// Counts one more sink or drain of `bytes` for `guest`; its counters now.
fn count(counts: &Counts, guest: u64, bytes: u64) -> (u64, u64) {
    let mut c = counts.lock_or_recover();
    let e = c.entry(guest).or_default();
    *e = (e.0 + 1, e.1.wrapping_add(bytes));
    *e
}

/// A `drain` of a streamed input, packet by packet.
struct DrainSink {
    counts: Counts,
    bytes: u64,
    sum: u64,
}

impl InputSink for DrainSink {
    fn packet(&mut self, _offset: u64, bytes: &dyn Input) -> Result<()> {
        // Packets start at multiples of 64 KiB: each one's words are words of the whole,
        // and a short last word is zero-padded as the whole's is.
        let (n, sum) = payload::drain(bytes)?;
        self.bytes += n as u64;
        self.sum = self.sum.wrapping_add(sum);
        Ok(())
    }

    fn finish(self: Box<Self>, cx: &CallCtx, _out: &mut dyn Output) -> Result<Reply> {
        let (n, bytes) = count(&self.counts, cx.guest, self.bytes);
        Ok(Reply {
            len: 0,
            values: [self.bytes, self.sum, n, bytes],
        })
    }
}

impl Service for Bulk {
    fn name(&self) -> &str {
        "bulk"
    }

    fn calls(&self) -> Vec<CallInfo> {
        CALLS.to_vec()
    }

    fn call(&self, cx: &CallCtx, c: u32, input: &dyn Input, out: &mut dyn Output) -> Result<Reply> {
        if c == call::ECHO {
            let n = payload::copy(input, out)?;
            return Ok(Reply {
                len: n,
                values: [n as u64, 0, 0, 0],
            });
        }
        let (a, b) = if c == call::DRAIN {
            let (n, sum) = payload::drain(input)?;
            (n as u64, sum)
        } else {
            (u64::from(payload::crc(input)?), input.len() as u64)
        };
        let (n, bytes) = count(&self.counts, cx.guest, input.len() as u64);
        Ok(Reply {
            len: 0,
            values: [a, b, n, bytes],
        })
    }

    fn sink(&self, _cx: &CallCtx, c: u32, _total: u64) -> Option<Box<dyn InputSink>> {
        (c == call::DRAIN).then(|| {
            Box::new(DrainSink {
                counts: self.counts.clone(),
                bytes: 0,
                sum: 0,
            }) as Box<dyn InputSink>
        })
    }

    fn guest_gone(&self, guest: u64) {
        self.counts.lock_or_recover().remove(&guest);
    }

    /// `{"calls": N, "bytes": N}`: the guest's sinks and drains.
    fn export_guest(&self, guest: u64) -> Option<Value> {
        let c = self.counts.lock_or_recover();
        c.get(&guest)
            .map(|(n, b)| json!({ "calls": n, "bytes": b }))
    }

    fn import_guest(&self, guest: u64, state: &Value) -> Result<()> {
        let (Some(n), Some(b)) = (state["calls"].as_u64(), state["bytes"].as_u64()) else {
            return Err(ServiceError::BadArgument(
                "bulk state: {\"calls\": N, \"bytes\": N}".into(),
            ));
        };
        self.counts.lock_or_recover().insert(guest, (n, b));
        Ok(())
    }
}
