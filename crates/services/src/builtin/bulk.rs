//! `bulk`: the benchmark's service. `echo` copies its input to its output; `sink` reads its
//! input once and answers its CRC-32 and length.

use crate::hypervisor::{CallCtx, CallInfo, Reply, Service};
use crate::payload::{self, Input, Output};
use crate::Result;

/// Call numbers.
pub mod call {
    /// Copies the input to the output; values: bytes.
    pub const ECHO: u32 = 1;
    /// Reads the input; values: CRC-32, bytes.
    pub const SINK: u32 = 2;
    /// Reads every byte of the input once into the service's buffer (no checksum: what
    /// the benchmark times); values: bytes.
    pub const DRAIN: u32 = 3;
}

const CALLS: &[CallInfo] = &[
    CallInfo {
        call: call::ECHO,
        name: "echo",
        doc: "copies the input to the output; values: bytes",
    },
    CallInfo {
        call: call::SINK,
        name: "sink",
        doc: "reads the input once; values: CRC-32, bytes",
    },
    CallInfo {
        call: call::DRAIN,
        name: "drain",
        doc: "reads every byte of the input once into the service's buffer; values: bytes",
    },
];

/// The bulk service (stateless).
pub struct Bulk;

impl Service for Bulk {
    fn name(&self) -> &'static str {
        "bulk"
    }

    fn calls(&self) -> &'static [CallInfo] {
        CALLS
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
            let n = payload::drain(input)?;
            return Ok(Reply {
                len: 0,
                values: [n as u64, 0, 0, 0],
            });
        }
        let crc = payload::crc(input)?;
        Ok(Reply {
            len: 0,
            values: [u64::from(crc), input.len() as u64, 0, 0],
        })
    }
}
