//! `bulk`: the benchmark's service. `echo` copies its input to its output; `sink` reads its
//! input once and answers its CRC-32 and length.

use std::borrow::Cow;

use crate::hypervisor::{CallCtx, CallInfo, Reply, Service};
use crate::payload::{self, Input, Output};
use crate::Result;

/// Call numbers.
pub mod call {
    /// Copies the input to the output; values: bytes.
    pub const ECHO: u32 = 1;
    /// Reads the input; values: CRC-32, bytes.
    pub const SINK: u32 = 2;
    /// Reads every byte of the input once where it is, keeping no copy (no checksum: what
    /// the benchmark times); values: bytes, the wrapping sum of its 64-bit words
    /// ([`crate::payload::word_sum`]).
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
        doc: Cow::Borrowed("reads the input once; values: CRC-32, bytes"),
    },
    CallInfo {
        call: call::DRAIN,
        name: Cow::Borrowed("drain"),
        doc: Cow::Borrowed(
            "reads every byte of the input once in place; values: bytes, sum of its 64-bit words",
        ),
    },
];

/// The bulk service (stateless).
pub struct Bulk;

impl Service for Bulk {
    fn name(&self) -> &str {
        "bulk"
    }

    fn calls(&self) -> Vec<CallInfo> {
        CALLS.to_vec()
    }

    fn call(&self, _: &CallCtx, c: u32, input: &dyn Input, out: &mut dyn Output) -> Result<Reply> {
        if c == call::ECHO {
            let n = payload::copy(input, out)?;
            return Ok(Reply {
                len: n,
                values: [n as u64, 0, 0, 0],
            });
        }
        if c == call::DRAIN {
            let (n, sum) = payload::drain(input)?;
            return Ok(Reply {
                len: 0,
                values: [n as u64, sum, 0, 0],
            });
        }
        let crc = payload::crc(input)?;
        Ok(Reply {
            len: 0,
            values: [u64::from(crc), input.len() as u64, 0, 0],
        })
    }
}
