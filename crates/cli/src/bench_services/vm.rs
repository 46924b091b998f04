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
    let args: Vec<String> = [
        "bench",
        "services",
        "--socket",
        "vm",
        "--channels",
        "1",
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "--round-trips".into(),
        round_trips.to_string(),
        "--size".into(),
        size.to_string(),
        "--reps".into(),
        reps.to_string(),
    ])
    .collect();
    let out = crate::vm::run(&crate::vm::VmRun {
        image: image.to_path_buf(),
        endpoint: None,
        // The payload's region and the ring row's, with room for the channels.
        window_mib: (size * 2 + ROOM).next_power_of_two() >> 20,
        accel: "tcg".into(),
        memory_mib: 512,
        timeout: Duration::from_secs(900),
        args,
        echo: false,
    })?;
    if out.exit != Some(0) {
        return Err(CliError::Usage(format!(
            "VM services run failed:\n{}",
            out.output
        )));
    }
    let r: Report = serde_json::from_str(&out.output)?;
    Ok(r.rows)
}
