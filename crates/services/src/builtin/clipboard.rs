//! `clipboard`: one text clipboard shared by the host and its guests. A guest reads and
//! sets it through its channel; the host through the control API (`virtsoc ctl clipboard
//! get|set`). Each change bumps its version, so a guest can tell whether it changed.

use std::sync::Mutex;

use serde_json::{json, Value};

use super::{put, text};
use std::borrow::Cow;

use crate::hypervisor::{CallCtx, CallInfo, Reply, Service};
use crate::payload::{Input, Output};
use crate::{Result, ServiceError};
use virtsoc_sync::LockExt;

/// Longest clipboard text (1 MiB).
pub const MAX_TEXT: usize = 1 << 20;

/// Call numbers.
pub mod call {
    /// Output: the text; values: its version, its length.
    pub const GET: u32 = 1;
    /// Input: the new text; values: the new version.
    pub const SET: u32 = 2;
}

const CALLS: &[CallInfo] = &[
    CallInfo {
        call: call::GET,
        name: Cow::Borrowed("get"),
        doc: Cow::Borrowed("output: the text; values: version, length"),
    },
    CallInfo {
        call: call::SET,
        name: Cow::Borrowed("set"),
        doc: Cow::Borrowed("input: the new text (UTF-8, at most 1 MiB); values: the new version"),
    },
];

/// The clipboard.
#[derive(Default)]
pub struct Clipboard {
    state: Mutex<(String, u64)>,
}

impl Clipboard {
    fn set(&self, t: String) -> u64 {
        let mut s = self.state.lock_or_recover();
        s.0 = t;
        s.1 += 1;
        s.1
    }

    fn get(&self) -> (String, u64) {
        self.state.lock_or_recover().clone()
    }
}

impl Service for Clipboard {
    fn name(&self) -> &str {
        "clipboard"
    }

    fn calls(&self) -> Vec<CallInfo> {
        CALLS.to_vec()
    }

    fn call(&self, _: &CallCtx, c: u32, input: &dyn Input, out: &mut dyn Output) -> Result<Reply> {
        if c == call::SET {
            let v = self.set(text(input, MAX_TEXT)?);
            return Ok(Reply {
                len: 0,
                values: [v, 0, 0, 0],
            });
        }
        let (t, v) = self.get();
        let n = put(out, t.as_bytes())?;
        Ok(Reply {
            len: n,
            values: [v, n as u64, 0, 0],
        })
    }

    fn control(&self, op: &str, args: &Value) -> Result<Value> {
        match op {
            "set" => {
                let t = args["text"]
                    .as_str()
                    .ok_or_else(|| ServiceError::BadArgument("field `text`: a string".into()))?;
                if t.len() > MAX_TEXT {
                    return Err(ServiceError::BadArgument("field `text`: over 1 MiB".into()));
                }
                Ok(json!({ "version": self.set(t.to_string()) }))
            }
            "get" => {
                let (t, v) = self.get();
                Ok(json!({ "text": t, "version": v }))
            }
            _ => Err(ServiceError::BadArgument(format!(
                "clipboard: no operation {op:?} (get, set)"
            ))),
        }
    }
}
