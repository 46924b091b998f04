//! `virtsoc debug keep`: a guest that holds regions and checks them while its session moves
//! (daemon restarts, live migrations; inside a VM too): it fills regions from the CPU, then
//! reads them back every 100 ms, following the session by itself, and reports what it saw.

use std::time::{Duration, Instant};

use virtsoc_guest::{AccessMode, ConnectOptions, Connection, DeviceId};

use crate::CliError;

/// Bytes of region `k` (differ per region and per offset).
fn pattern(n: usize, k: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(37) ^ (k as u8).wrapping_mul(101) ^ (i >> 9) as u8)
        .collect()
}

fn cpu(c: &Connection, id: u64, len: u64, mode: AccessMode) -> Result<*mut u8, CliError> {
    let a = c.begin_access(id, DeviceId::CPU, 0, len, mode)?;
    Ok(a.ptr
        .ok_or_else(|| CliError::Usage("no CPU pointer".into()))?
        .as_ptr())
}

/// Runs the check; prints `READY <guest id>` once the regions are written, and a JSON line
/// at the end.
pub fn run(socket: &str, regions: usize, size: u64, seconds: f64) -> Result<(), CliError> {
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
        })
    );
    std::io::stdout().flush()?;
    if bad > 0 || regions_now != regions as u64 {
        return Err(CliError::Usage(format!(
            "{bad} checks found other bytes; {regions_now} regions of {regions}"
        )));
    }
    Ok(())
}
