//! The soak's guests, one function per role (good, hostile, crashing, reconnecting), and
//! the checks each makes of the daemon's answers.

use super::*;
use virtsoc_sync::LockExt;

pub(super) fn open(socket: &str, name: &str, coherence: &str) -> Result<Connection, GuestError> {
    Connection::open(
        socket,
        &ConnectOptions {
            name: name.into(),
            window_size: 16 << 20,
            sq_entries: 64,
            cq_entries: 64,
            coherence: Some(coherence.into()),
            ..ConnectOptions::default()
        },
    )
}

const PROTOCOLS: [&str; 3] = ["guest-staging", "write-invalidate", "prefetch"];

pub(super) fn guest(ctx: &Ctx, role: Role, index: usize, deadline: Instant) {
    let t = &ctx.tally;
    let name = format!("soak-{index}");
    match role {
        Role::Good => {
            let c = match open(&ctx.socket, &name, PROTOCOLS[index / 4 % PROTOCOLS.len()]) {
                Ok(c) => c,
                Err(e) => {
                    t.note(format!("{name}: connect: {e}"));
                    return bump(&t.good_errors);
                }
            };
            let mut n = 0u64;
            while Instant::now() < deadline && !ctx.stop.load(Ordering::Relaxed) {
                match good_round(ctx, &c, (index as u64) << 32 | n) {
                    Ok(()) => bump(&t.good_rounds),
                    Err(e) => {
                        t.note(format!("{name}: round {n}: {e}"));
                        bump(&t.good_errors);
                        break;
                    }
                }
                n += 1;
            }
            c.close();
        }
        Role::Hostile => {
            let mut n = 0u64;
            while Instant::now() < deadline && !ctx.stop.load(Ordering::Relaxed) {
                if let Err(e) = hostile_round(ctx, &name, n) {
                    // The daemon may drop a guest that corrupts its ring: not a failure.
                    log::debug!("{name}: {e}");
                }
                bump(&t.hostile_rounds);
                n += 1;
            }
        }
        Role::Crashing => {
            let mut n = 0u64;
            while Instant::now() < deadline && !ctx.stop.load(Ordering::Relaxed) {
                match crash_once(&ctx.socket, n) {
                    Ok(()) => bump(&t.crashes),
                    Err(e) => {
                        t.note(format!("{name}: {e}"));
                        bump(&t.crash_failures);
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
                n += 1;
            }
        }
        Role::Reconnecting => {
            let mut n = 0u64;
            while Instant::now() < deadline && !ctx.stop.load(Ordering::Relaxed) {
                match reconnect_once(ctx, &name, n) {
                    Ok(()) => bump(&t.reconnects),
                    Err(e) => {
                        t.note(format!("{name}: {e}"));
                        bump(&t.reconnect_errors);
                    }
                }
                n += 1;
            }
        }
    }
}

fn soak_err(what: String) -> CliError {
    CliError::Usage(what)
}

/// Copies bytes out of (or into) region `id` through a CPU access.
fn cpu_read(c: &Connection, id: RegionId, len: u64) -> Result<Vec<u8>, CliError> {
    let a = c.begin_access(id, DeviceId::CPU, 0, len, AccessMode::Read)?;
    let ptr = a.ptr.ok_or_else(|| soak_err("no CPU pointer".into()))?;
    let mut out = vec![0u8; len as usize];
    // SAFETY: the window maps `len` bytes at `ptr` until end_access.
    unsafe { std::ptr::copy_nonoverlapping(ptr.as_ptr(), out.as_mut_ptr(), out.len()) };
    c.end_access(id, DeviceId::CPU, 0, len, AccessMode::Read)?;
    Ok(out)
}

fn cpu_write(c: &Connection, id: RegionId, bytes: &[u8]) -> Result<(), CliError> {
    let len = bytes.len() as u64;
    let a = c.begin_access(id, DeviceId::CPU, 0, len, AccessMode::Write)?;
    let ptr = a.ptr.ok_or_else(|| soak_err("no CPU pointer".into()))?;
    // SAFETY: the window maps `len` bytes at `ptr` until end_access.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr(), bytes.len()) };
    c.end_access(id, DeviceId::CPU, 0, len, AccessMode::Write)?;
    Ok(())
}

/// Runs `cmd` on `device` with `id` bracketed by an access of `mode`.
fn on_device(
    c: &Connection,
    device: DeviceId,
    id: RegionId,
    mode: AccessMode,
    args: [u64; 6],
) -> Result<[u64; 6], CliError> {
    c.begin_access(id, device, 0, REGION, mode)?;
    let v = c.device_cmd(device, args)?;
    c.end_access(id, device, 0, REGION, mode)?;
    Ok(v)
}

/// A deterministic byte pattern of `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// One good round: producer -> consumer (and the CPU) agree on the producer's bytes; CPU
/// bytes reach the consumer; a present shows on the screen as sent. Wrong data is counted
/// in the tally, errors are returned.
pub(super) fn good_round(ctx: &Ctx, c: &Connection, seed: u64) -> Result<(), CliError> {
    let t = &ctx.tally;
    let r = c.alloc_blob(REGION)?;
    ctx.others.lock_or_recover().push(r.id);
    // Producer -> consumer, then the CPU reads the same bytes.
    let made = on_device(
        c,
        DeviceId::PRODUCER,
        r.id,
        AccessMode::Write,
        [testdev::WRITE_PATTERN, u64::from(r.id), seed, 0, 0, 0],
    )?[0];
    let seen = on_device(
        c,
        DeviceId::CONSUMER,
        r.id,
        AccessMode::Read,
        [testdev::CHECKSUM, u64::from(r.id), 0, 0, 0, 0],
    )?[0];
    let cpu = crc32fast::hash(&cpu_read(c, r.id, REGION)?) as u64;
    if made != seen || made != cpu {
        bump(&t.good_bad_data);
        t.note(format!(
            "producer crc {made:08x}, consumer {seen:08x}, cpu {cpu:08x}"
        ));
    }
    // CPU write -> device read -> CPU read.
    let bytes = pattern(seed, REGION as usize);
    cpu_write(c, r.id, &bytes)?;
    let want = crc32fast::hash(&bytes) as u64;
    let seen = on_device(
        c,
        DeviceId::CONSUMER2,
        r.id,
        AccessMode::Read,
        [testdev::CHECKSUM, u64::from(r.id), 0, 0, 0, 0],
    )?[0];
    let back = cpu_read(c, r.id, REGION)?;
    if seen != want || back != bytes {
        bump(&t.good_bad_data);
        t.note(format!("cpu wrote {want:08x}, consumer read {seen:08x}"));
    }
    c.free(r.id)?;
    ctx.others.lock_or_recover().retain(|&id| id != r.id);
    // Every fourth round: an opaque full-screen frame, checked against the display's CRC.
    if seed.is_multiple_of(4) {
        present(ctx, c, seed)?;
    }
    Ok(())
}

fn present(ctx: &Ctx, c: &Connection, seed: u64) -> Result<(), CliError> {
    let t = &ctx.tally;
    let (w, h) = SCREEN;
    let f = c.alloc(0, w, h, Format::Rgba8, 0)?;
    let mut px = pattern(seed ^ 0x5eed, f.size as usize);
    for p in px.chunks_exact_mut(4) {
        p[3] = 255;
    }
    // Rows are `stride` bytes; the screen shows `w * 4` of each.
    cpu_write(c, f.id, &px)?;
    let row = (w * 4) as usize;
    let mut shown = Vec::with_capacity(row * h as usize);
    for y in 0..h as usize {
        let at = y * f.stride as usize;
        shown.extend_from_slice(&px[at..at + row]);
    }
    let want = crc32fast::hash(&shown) as u64;
    let id = c
        .command_with_access(&display::Present {
            frame: f.id,
            capture_ns: 0,
        })?
        .frame_id;
    bump(&t.presents);
    match c.command(&display::Checksum::default()) {
        Ok(v) if v.frame_id == id => {
            if v.crc == want {
                bump(&t.presents_verified);
            } else {
                bump(&t.good_bad_data);
                t.note(format!(
                    "present {id}: screen crc {:08x}, sent {want:08x}",
                    v.crc
                ));
            }
        }
        // Not on screen yet, or already replaced: nothing to compare.
        Ok(_) | Err(GuestError::Status { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    c.free(f.id)?;
    Ok(())
}

/// Whether `r` is refused with an error status (what every misuse must get).
fn refused<T>(t: &Tally, what: &str, r: Result<T, GuestError>) -> Result<(), CliError> {
    bump(&t.hostile_requests);
    match r {
        Err(GuestError::Status { .. }) | Err(GuestError::BadArgument(_)) => Ok(()),
        Ok(_) => {
            bump(&t.hostile_accepted);
            t.note(format!("misuse accepted: {what}"));
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// One hostile session: misuses through the API (each must be refused), then a burst of
/// malformed ring entries, then the guest hangs up.
fn hostile_round(ctx: &Ctx, name: &str, n: u64) -> Result<(), CliError> {
    let t = &ctx.tally;
    let c = open(&ctx.socket, name, PROTOCOLS[n as usize % PROTOCOLS.len()])?;
    let own = u64::from(c.alloc_blob(4096)?.id);
    // Out of range, through the raw call (the library would refuse it itself).
    for (off, len) in [(4096, 1), (0, 4097), (u64::MAX, 2), (4000, u64::MAX)] {
        let r = c.call(
            Opcode::BeginAccess,
            DeviceId::CPU,
            [own, off, len, AccessMode::Read as u64, 0, 0],
        );
        refused(t, &format!("access {off}+{len} of a 4096-byte region"), r)?;
    }
    // Posted writes (`ACCESS_BEGINS`): on a device's queue, of a read, out of range, and
    // after a device wrote the region (the producer).
    let posted = virtsoc_proto::wire::ACCESS_BEGINS;
    let w = AccessMode::Write as u64;
    let bad_posts = [
        (
            "on a device queue",
            DeviceId::CONSUMER,
            [own, 0, 4096, w, posted, 0],
        ),
        (
            "of a read",
            DeviceId::CPU,
            [own, 0, 4096, AccessMode::Read as u64, posted, 0],
        ),
        (
            "past the end",
            DeviceId::CPU,
            [own, 4000, 200, w, posted, 0],
        ),
    ];
    for (what, dev, args) in bad_posts {
        let r = c.call(Opcode::EndAccess, dev, args);
        refused(t, &format!("a posted write {what}"), r)?;
    }
    let written = c.alloc_blob(4096)?.id;
    let _ = c.write(written, 0, &[1; 4096]);
    let _ = c.call(
        Opcode::DeviceCmdAccess,
        DeviceId::PRODUCER,
        [testdev::WRITE_PATTERN, u64::from(written), n, 0, 0, 0],
    );
    let r = c.call(
        Opcode::EndAccess,
        DeviceId::CPU,
        [u64::from(written), 0, 4096, w, posted, 0],
    );
    refused(t, "a posted write after a device wrote the region", r)?;
    // Answered with whatever status, as long as the daemon answers.
    let _ = c.call(
        Opcode::EndAccess,
        DeviceId::CONSUMER,
        [own, 0, 4096, AccessMode::Read as u64, 0, 0],
    );
    let _ = c.device_cmd(DeviceId::CONSUMER, [testdev::CHECKSUM, own, 0, 0, 0, 0]);
    let _ = c.call(
        Opcode::DeviceCmdAccess,
        DeviceId::CONSUMER,
        [testdev::CHECKSUM, own, 0, 0, 0, 0],
    );
    // Other guests' region ids (ids are per guest: none of these are this guest's).
    let theirs: Vec<u64> = ctx
        .others
        .lock_or_recover()
        .iter()
        .map(|&id| u64::from(id))
        .filter(|&id| id > own)
        .take(4)
        .collect();
    for id in theirs.into_iter().chain([own + 1000, u64::MAX]) {
        refused(
            t,
            &format!("access to region {id}"),
            c.call(
                Opcode::BeginAccess,
                DeviceId::CPU,
                [id, 0, 16, AccessMode::Read as u64, 0, 0],
            ),
        )?;
        refused(
            t,
            &format!("free of region {id}"),
            c.call(Opcode::Free, DeviceId::CPU, [id, 0, 0, 0, 0, 0]),
        )?;
        refused(
            t,
            &format!("a checksum of region {id} taking its access"),
            c.call(
                Opcode::DeviceCmdAccess,
                DeviceId::CONSUMER,
                [testdev::CHECKSUM, id, 0, 0, 0, 0],
            ),
        )?;
    }
    // Fence misuse: a released fence, double release, forged ids (any status will do).
    let f = c.fence_create()?;
    c.fence_release(f)?;
    let _ = c.fence_release(f);
    let _ = c.call(
        Opcode::FenceStatus,
        DeviceId::CPU,
        [f.to_u64() ^ (1 << 40), 0, 0, 0, 0, 0],
    );
    let _ = c.fence_release(Fence::from_u64(0xdead_beef_0000 + n));
    let _ = c.fence_signal(DeviceId::CONSUMER, Fence::from_u64(0xdead_0000 + n));
    // A fence that is never signaled holds this guest's producer queue only.
    let stuck = c.fence_create()?;
    let _ = c.fence_wait(DeviceId::PRODUCER, stuck);
    if !ctx.raw_bursts {
        c.close();
        return Ok(());
    }
    // Malformed ring entries, sent without waiting; the answers are not read.
    let mut x = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..32u64 {
        let r = next();
        let req = Request {
            seq: 1 << 62 | i,
            opcode: match i % 4 {
                0 => (r % 64) as u32,
                1 => u32::MAX - (r % 4) as u32,
                _ => (r % 14) as u32,
            },
            device: match i % 3 {
                0 => (r >> 8) as u32 % 20,
                1 => (r >> 8) as u32,
                _ => DeviceId::CPU.0,
            },
            args: [
                if i % 2 == 0 { own } else { next() },
                next() % 8192,
                next() % 8192,
                next() % 5,
                next(),
                next(),
            ],
        };
        if c.submit_raw(req).is_err() {
            break;
        }
        bump(&t.hostile_requests);
    }
    std::thread::sleep(Duration::from_millis(20));
    c.close();
    Ok(())
}

/// A `virtsoc debug hold` child holding regions mid-access, killed with SIGKILL.
fn crash_once(socket: &str, n: u64) -> Result<(), CliError> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["debug", "hold", "--socket", socket, "--regions", "3"])
        .args(["--size", &(256u64 << 10).to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    // Killed at varying points: some right after READY, some a little later.
    std::thread::sleep(Duration::from_millis(n % 5 * 20));
    let _ = child.kill();
    let _ = child.wait();
    if line.starts_with("READY") {
        Ok(())
    } else {
        Err(soak_err(format!(
            "debug hold did not get ready: {:?}",
            line.trim()
        )))
    }
}

/// Connects, checks a region round trip, and leaves (freeing it or not, closing or just
/// dropping the connection).
fn reconnect_once(ctx: &Ctx, name: &str, n: u64) -> Result<(), CliError> {
    let c = open(&ctx.socket, name, PROTOCOLS[n as usize % PROTOCOLS.len()])?;
    let r = c.alloc_blob(8192)?;
    let bytes = pattern(n, 8192);
    cpu_write(&c, r.id, &bytes)?;
    if cpu_read(&c, r.id, 8192)? != bytes {
        bump(&ctx.tally.good_bad_data);
        ctx.tally.note(format!("{name}: round trip {n} differs"));
    }
    if n.is_multiple_of(2) {
        c.free(r.id)?;
    }
    if n.is_multiple_of(3) {
        c.close();
    }
    Ok(())
}
