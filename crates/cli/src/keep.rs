//! `virtsoc debug keep`: a guest that holds regions and checks them while its session moves
//! (daemon restarts, live migrations; inside a VM too): it fills regions from the CPU, then
//! reads them back every 100 ms, following the session by itself, and reports what it saw.
//! With `services`, each round also sends a transfer of four packets to the bulk service
//! over a channel of its own (the service's count of this guest's transfers must go up by
//! exactly one each time: none lost or run twice across a move) and reads the location.

use std::time::{Duration, Instant};

use virtsoc_guest::services::{Bulk, Geo};
use virtsoc_guest::{AccessMode, ConnectOptions, Connection, DeviceId, RegionId};

use crate::CliError;

/// Bytes of region `k` (differ per region and per offset).
fn pattern(n: usize, k: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(37) ^ (k as u8).wrapping_mul(101) ^ (i >> 9) as u8)
        .collect()
}

fn cpu(c: &Connection, id: RegionId, len: u64, mode: AccessMode) -> Result<*mut u8, CliError> {
    let a = c.begin_access(id, DeviceId::CPU, 0, len, mode)?;
    Ok(a.ptr
        .ok_or_else(|| CliError::Usage("no CPU pointer".into()))?
        .as_ptr())
}

/// What the service calls of the rounds saw.
#[derive(Default)]
struct ServiceChecks {
    calls: u64,
    bad: u64,
    errors: u64,
    /// The bulk service's count of this guest's transfers after the last call.
    nth: u64,
}

impl ServiceChecks {
    /// One round: a bulk transfer (checked: its CRC and length, and the count one more
    /// than the last) and a location read.
    fn round(&mut self, bulk: &mut Bulk<'_>, geo: &mut Geo<'_>, payload: &[u8]) {
        match bulk.sink_counted(payload) {
            Ok(s) => {
                self.calls += 1;
                let in_order = self.nth == 0 || s.nth == self.nth + 1;
                if !in_order || s.crc != crc32fast::hash(payload) || s.len != payload.len() as u64 {
                    self.bad += 1;
                }
                self.nth = s.nth;
            }
            Err(_) => self.errors += 1,
        }
        match geo.fix() {
            Ok(_) => self.calls += 1,
            Err(_) => self.errors += 1,
        }
    }
}

/// Runs the check; prints `READY <guest id>` once the regions are written, and a JSON line
/// at the end.
pub fn run(
    socket: &str,
    regions: usize,
    size: u64,
    seconds: f64,
    services: bool,
) -> Result<(), CliError> {
    let conn = Connection::open(socket, &ConnectOptions::default())?;
    conn.set_auto_reconnect(Some(Duration::from_secs(60)));
    let mut ids = Vec::new();
    for k in 0..regions {
        let id = conn.alloc_blob(size)?.id;
        let p = cpu(&conn, id, size, AccessMode::Write)?;
        let bytes = pattern(size as usize, k);
        // SAFETY: the pointer covers `size` bytes of the window until end_access.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
        conn.end_access(id, DeviceId::CPU, 0, size, AccessMode::Write)?;
        ids.push((id, crc32fast::hash(&bytes)));
    }
    let mut chans = match services {
        true => Some((Bulk::open(&conn, 4)?, Geo::open(&conn)?)),
        false => None,
    };
    let payload = pattern(4 << 16, 7);
    let mut sv = ServiceChecks::default();
    let mut guests = vec![conn.guest_id()];
    println!("READY {}", conn.guest_id());
    use std::io::Write;
    std::io::stdout().flush()?;
    let t0 = Instant::now();
    let (mut checks, mut bad, mut errors) = (0u64, 0u64, 0u64);
    let mut buf = vec![0u8; size as usize];
    while t0.elapsed().as_secs_f64() < seconds {
        for (id, crc) in &ids {
            let read = cpu(&conn, *id, size, AccessMode::Read).and_then(|p| {
                // SAFETY: the pointer covers `size` bytes of the window until end_access.
                unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), buf.len()) };
                conn.end_access(*id, DeviceId::CPU, 0, size, AccessMode::Read)?;
                Ok(())
            });
            match read {
                Ok(()) => {
                    checks += 1;
                    if crc32fast::hash(&buf) != *crc {
                        bad += 1;
                    }
                }
                // A call that met the hand-over: the library reconnects at the next one.
                Err(_) => errors += 1,
            }
        }
        if let Some((bulk, geo)) = chans.as_mut() {
            sv.round(bulk, geo, &payload);
        }
        if guests.last() != Some(&conn.guest_id()) {
            guests.push(conn.guest_id());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let regions_now = conn.usage()?.0;
    println!(
        "{}",
        serde_json::json!({
            "checks": checks,
            "bad": bad,
            "errors": errors,
            "guest_ids": guests,
            "regions": regions_now,
            "service_calls": sv.calls,
            "service_bad": sv.bad,
            "service_errors": sv.errors,
        })
    );
    std::io::stdout().flush()?;
    // The channels' regions are the guest's too: counted until closed.
    let want = regions as u64 + 2 * u64::from(services);
    if bad > 0 || sv.bad > 0 || regions_now != want {
        return Err(CliError::Usage(format!(
            "{bad} checks found other bytes, {} service calls a wrong answer; {regions_now} \
             regions of {want}",
            sv.bad
        )));
    }
    if let Some((bulk, geo)) = chans {
        bulk.0.close()?;
        geo.0.close()?;
    }
    Ok(())
}
