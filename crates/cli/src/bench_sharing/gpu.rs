//! The GPU guest of `virtsoc bench sharing`: compositions of one size, `depth` of them queued
//! on the daemon at a time, each from the next of its `rotation` source images into the next
//! of its destinations.
//!
//! With a depth above one the guest is continuously backlogged, as the fairness measure
//! assumes: its next composition (the begin_access of its regions, the command, the
//! end_access) is already in its queue on the daemon when the previous one answers, so the
//! scheduler always sees it wanting the device, not only when its thread has come round to
//! submitting again. Everything goes on the GPU's queue, whose order is the guest's order, so
//! no fence is needed. A depth of one is a closed loop (the hogs of the multimedia part).
//!
//! A backlogged guest (a depth above one) takes its regions' accesses (begin_access) once
//! and keeps them until it stops, as a guest streaming into buffers it holds does: each
//! composition is then one request, not five (two begin_access, the command, two
//! end_access). The guest library's flow control lets as few as four requests be in flight
//! once the device's queue is deep (8 guests' backlogs): with five requests a composition,
//! a guest then had less than one composition queued between two answers, its queue ran dry
//! whenever its thread was late (a loaded machine), and the scheduler rightly stopped
//! counting it as wanting the device - a window the bench then called unfair.

//!
//! A fairness guest rotates through [`ROTATION`] (source, destination) pairs, as a guest
//! composing into a swapchain or decoding video into a pool of buffers does: each command
//! reads and writes images its previous one did not. With one pair reused (before stop 19)
//! one guest alone recomposed an image that was still in the CPU's caches from its last
//! composition (the GPU is lavapipe, a CPU driver), while guests taking turns each brought
//! their own images, so the overhead against one guest alone measured the caches more than
//! the sharing (docs/results.md, stops 18 and 19). With the rotation, the alone rates, the
//! floor of that overhead, are measured under the same cache conditions as the guests
//! together: streaming. Before the run each guest checks that every destination holds its
//! own source's fill, so a rotation that did not rotate fails the bench.
use std::sync::Barrier;

use virtsoc_guest::devices as api;
use virtsoc_guest::{AccessMode, DeviceCommand, DeviceId, Format, Opcode};

use super::backlog::{self, Control};
use crate::scenario::full_layer;
use crate::scenario::pipe::Pipe;
use crate::CliError;
use virtsoc_devapi::RegionId;

/// Compositions a fairness guest keeps queued (within the guest library's smallest flow
/// control window, four requests, so submitting never blocks on it).
pub(super) const BACKLOG: usize = 4;

/// (Source, destination) image pairs a fairness guest rotates through. Enough that one guest
/// alone streams as the guests together do: this machine's cores have 1 MiB of L2 each
/// (lavapipe's two rasterizer threads split a composition between them, 2 MiB together) and
/// share a 32 MiB L3. The smallest guest, 320x180 (450 KiB a pair), then works on 3.5 MiB,
/// past both L2s; 640x360 on 14 MiB; 960x540 on 32 MiB, the whole L3. The 8 guests together
/// work on 116 MiB (2, 4 and 8 guests: 18, 53 and 116 MiB), against 15 MiB with one pair
/// each, which fitted the L3. `cache_probe --rotate R` (no daemon) measured 8 guests in
/// turn losing about 20% against each size alone with one pair each, about 3% with 8 pairs
/// and the same with 32 (so the L3 is not what remains; docs/results.md, stop 19).
pub(super) const ROTATION: usize = 8;

/// What a GPU guest runs: compositions of `size`, `depth` queued, rotating through
/// `rotation` image pairs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Load {
    pub size: (u32, u32),
    pub depth: usize,
    pub rotation: usize,
}

impl Load {
    /// A fairness guest: continuously backlogged, rotating through [`ROTATION`] pairs.
    pub(super) fn backlogged(size: (u32, u32)) -> Self {
        Load {
            size,
            depth: BACKLOG,
            rotation: ROTATION,
        }
    }

    /// A hog of the multimedia part: one composition at a time, one pair reused.
    pub(super) fn closed_loop(size: (u32, u32)) -> Self {
        Load {
            size,
            depth: 1,
            rotation: 1,
        }
    }
}

/// The fill of source `r` (distinct per pair, so a destination shows which source it got).
fn fill(r: usize) -> u8 {
    0x20 + (r as u8).wrapping_mul(0x1d)
}

/// Runs until `ctl.stop`: compositions of `load`, each answered one counted in `ctl.done`;
/// while `ctl.gate` (if any) is false, it lets its queue drain and waits.
pub(super) fn guest(
    target: &str,
    name: &str,
    load: Load,
    warm: &Barrier,
    ctl: Control<'_>,
) -> Result<(), CliError> {
    let Load {
        size: (w, h),
        depth,
        rotation,
    } = load;
    let rotation = rotation.max(1);
    let image = w as u64 * h as u64 * 4;
    let setup = || -> Result<_, CliError> {
        let window = image * (2 * rotation as u64).max(3) + (16 << 20);
        let conn = super::open_guest(target, name, window)?;
        let mut ring = Vec::with_capacity(rotation);
        for _ in 0..rotation {
            let src = conn.alloc(0, w, h, Format::Rgba8, 0)?.id;
            let dst = conn.alloc(0, w, h, Format::Rgba8, 0)?.id;
            let layers = conn.alloc_blob(api::LAYER_RECORD as u64)?.id;
            ring.push((
                src,
                api::gpu::Composite {
                    layers,
                    count: 1,
                    dst,
                },
            ));
        }
        Ok((conn, ring))
    };
    let (conn, ring) = match setup() {
        Ok(x) => x,
        Err(e) => {
            warm.wait();
            return Err(e);
        }
    };
    let dev = api::gpu::Composite::DEVICE;
    // The regions of pair `r`'s composition: its layers and destination, and its source.
    let regions = |r: usize| -> Vec<(RegionId, AccessMode)> {
        let (src, cmd) = &ring[r];
        let mut v = cmd.regions();
        v.push((*src, AccessMode::Read));
        v
    };
    let all: Vec<(RegionId, AccessMode)> = (0..rotation).flat_map(regions).collect();
    // Held for the whole run by a backlogged guest, per composition by a closed loop.
    let hold = depth > 1;
    // The `k`th composition (pair `k % rotation`).
    let submit = |k: u64, held: bool| -> Result<u64, CliError> {
        let r = (k % rotation as u64) as usize;
        if !held {
            backlog::access(&conn, dev, Opcode::BeginAccess, &regions(r))?;
        }
        let seq = conn.submit(Opcode::DeviceCmd, dev, ring[r].1.encode())?;
        if !held {
            backlog::access(&conn, dev, Opcode::EndAccess, &regions(r))?;
        }
        Ok(seq)
    };
    let answered = |seq: u64| backlog::answered(&conn, seq, "composition");
    let mut k = 0u64;
    let warmed = (|| -> Result<(), CliError> {
        let p = Pipe::new(&conn, crate::bench_svm::OrderingMode::Atomic);
        for (r, (src, cmd)) in ring.iter().enumerate() {
            p.cpu_write(*src, &vec![fill(r); image as usize])?;
            p.cpu_write(cmd.layers, &full_layer(*src, w, h, false).to_bytes())?;
        }
        // Every pair at least once (three compositions at least), then each destination
        // must hold its own source.
        while k < (rotation as u64).max(3) {
            answered(submit(k, false)?)?;
            k += 1;
        }
        for (r, (_, cmd)) in ring.iter().enumerate() {
            check_fill(&conn, cmd.dst, image, fill(r))?;
        }
        if hold {
            // Taken before the run starts: with 8 pairs a guest holds 24 regions, whose
            // accesses queued behind the other guests' compositions would otherwise start
            // it late, in the measured windows.
            backlog::access(&conn, dev, Opcode::BeginAccess, &all)?;
            conn.drain()?;
        }
        Ok(())
    })();
    warm.wait();
    warmed?;
    backlog::run(ctl, depth, k, |k| submit(k, hold), answered)?;
    if hold {
        backlog::release(&conn, dev, &all)?;
    }
    Ok(())
}

/// Reads destination `dst` (`len` bytes) from the CPU: every byte must be `want`, the fill
/// of the source its compositions drew.
fn check_fill(
    conn: &virtsoc_guest::Connection,
    dst: RegionId,
    len: u64,
    want: u8,
) -> Result<(), CliError> {
    let a = conn.begin_access(dst, DeviceId::CPU, 0, len, AccessMode::Read)?;
    let ptr = a
        .ptr
        .ok_or_else(|| CliError::Usage("no CPU pointer".into()))?;
    // SAFETY: the library bounds-checked [ptr, ptr + len) inside the window, and the access
    // keeps devices from writing it until end_access.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len as usize) };
    let wrong = bytes.iter().enumerate().find(|(_, b)| **b != want);
    let wrong = wrong.map(|(at, b)| (at, *b));
    conn.end_access(dst, DeviceId::CPU, 0, len, AccessMode::Read)?;
    match wrong {
        None => Ok(()),
        Some((at, got)) => Err(CliError::Usage(format!(
            "region {dst}: byte {at} is {got:#04x}, not its source's fill {want:#04x}"
        ))),
    }
}
