//! `bench services --vm-image DIR`: the same comparison from a VM guest (TCG), booted for
//! the run with a daemon of its own, beside the process guest's rows of the run: the
//! guest runs `bench services --socket vm --json` with one channel and its rows (the
//! service and the ring: `"guest": "vm"`) are added to the report.

use std::path::Path;
use std::time::Duration;

use super::{Report, Row};
use crate::CliError;

/// Slots of the streaming channel and spare room in the VM's window, besides the payload.
const ROOM: u64 = 64 << 20;

/// Boots a VM guest from `image` that measures one service channel and its ring.
pub fn vm_rows(
    image: &Path,
    round_trips: usize,
    size: u64,
    reps: usize,
) -> Result<Vec<Row>, CliError> {
    // The payload's region and the ring row's, with room for the channels.
    let window_mib = (size * 2 + ROOM).next_power_of_two() >> 20;
    let out = crate::vm::bench_in_vm(
        image,
        ("services", "1"),
        (round_trips, size, reps),
        window_mib,
        Duration::from_secs(900),
    )?;
    let r: Report = serde_json::from_str(&out)?;
    Ok(r.rows)
}
