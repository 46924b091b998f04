//! A host program serving guests: registers the service `upper` with a running daemon and
//! serves it until the daemon goes away.
//!
//! ```text
//! cargo run -p virtsoc-services --example upper -- /tmp/virtsoc.sock.services
//! ```
//!
//! Calls (a guest opens a channel to `upper` and calls them; see `docs/services.md`):
//! - 1 `upper`: the input, ASCII letters in upper case, as the output; values: bytes, the
//!   calls this guest made so far;
//! - 2 `crc`: values: the input's CRC-32 and length (any size: large inputs come in packets
//!   or in a region).
//!
//! Control operation `stats` (`virtsoc ctl services call upper stats`) answers the calls per
//! guest. A migrating guest's count goes with it (export and import).

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::{json, Value};
use virtsoc_services::external::client::{CallMeta, Handler, Options, ServiceHost};
use virtsoc_services::hypervisor::CallInfo;
use virtsoc_services::ServiceError;

#[derive(Default)]
struct Upper {
    calls: HashMap<u64, u64>,
}

impl Handler for Upper {
    fn call(
        &mut self,
        meta: &CallMeta,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<(usize, [u64; 4]), ServiceError> {
        let n = self.calls.entry(meta.guest).or_default();
        *n += 1;
        match meta.call {
            1 => {
                let out = output.get_mut(..input.len()).ok_or_else(|| {
                    ServiceError::BadArgument(format!("no room for {} bytes", input.len()))
                })?;
                out.copy_from_slice(input);
                out.make_ascii_uppercase();
                Ok((input.len(), [input.len() as u64, *n, 0, 0]))
            }
            2 => Ok((
                0,
                [u64::from(crc32fast::hash(input)), input.len() as u64, *n, 0],
            )),
            c => Err(ServiceError::BadArgument(format!("no call {c}"))),
        }
    }

    fn control(&mut self, op: &str, _args: &Value) -> Result<Value, ServiceError> {
        match op {
            "stats" => Ok(json!({ "calls": self.calls })),
            _ => Err(ServiceError::BadArgument(format!(
                "upper: no operation {op:?} (stats)"
            ))),
        }
    }

    fn guest_gone(&mut self, guest: u64) {
        self.calls.remove(&guest);
    }

    fn export_guest(&mut self, guest: u64) -> Option<Value> {
        self.calls.get(&guest).map(|n| json!({ "calls": n }))
    }

    fn import_guest(&mut self, guest: u64, state: &Value) -> Result<(), ServiceError> {
        let n = state["calls"]
            .as_u64()
            .ok_or_else(|| ServiceError::BadArgument("no call count".into()))?;
        self.calls.insert(guest, n);
        Ok(())
    }
}

fn main() {
    let socket = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "/tmp/virtsoc.sock.services".into());
    let calls = [
        CallInfo {
            call: 1,
            name: Cow::Borrowed("upper"),
            doc: Cow::Borrowed("the input in upper case; values: bytes, calls so far"),
        },
        CallInfo {
            call: 2,
            name: Cow::Borrowed("crc"),
            doc: Cow::Borrowed("values: the input's CRC-32, its length, calls so far"),
        },
    ];
    let opts = Options {
        token: std::env::var("VIRTSOC_TOKEN").ok(),
        ..Options::default()
    };
    let mut host = match ServiceHost::register(&socket, "upper", &calls, &opts) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("upper: {e}");
            std::process::exit(1);
        }
    };
    eprintln!("upper: registered on {socket}");
    if let Err(e) = host.serve(&mut Upper::default()) {
        eprintln!("upper: {e}");
        std::process::exit(1);
    }
}
