//! The GPU guest of `virtsoc bench sharing`: compositions of one size, `depth` of them queued
//! on the daemon at a time.
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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;

use virtsoc_guest::devices as api;
use virtsoc_guest::{AccessMode, DeviceCommand, Format, Opcode};

use crate::scenario::full_layer;
use crate::scenario::pipe::Pipe;
use crate::CliError;

/// Compositions a fairness guest keeps queued (within the guest library's smallest flow
/// control window, four requests, so submitting never blocks on it).
pub(super) const BACKLOG: usize = 4;

/// Runs until `stop`: compositions of `(w, h)`, `depth` queued, each answered one counted in
/// `done`; while `gate` (if any) is false, it lets its queue drain and waits.
#[allow(clippy::too_many_arguments)]
pub(super) fn guest(
    target: &str,
    name: &str,
    (w, h): (u32, u32),
    depth: usize,
    gate: Option<&AtomicBool>,
    warm: &Barrier,
    stop: &AtomicBool,
    done: &AtomicU64,
) -> Result<(), CliError> {
    let setup = || -> Result<_, CliError> {
        let conn = super::open_guest(target, name, w as u64 * h as u64 * 4 * 3 + (16 << 20))?;
        let src = conn.alloc(0, w, h, Format::Rgba8, 0)?.id;
        let dst = conn.alloc(0, w, h, Format::Rgba8, 0)?.id;
        let layers = conn.alloc_blob(api::LAYER_RECORD as u64)?.id;
        Ok((conn, src, dst, layers))
    };
    let (conn, src, dst, layers) = match setup() {
        Ok(x) => x,
        Err(e) => {
            warm.wait();
            return Err(e);
        }
    };
    let cmd = api::gpu::Composite {
        layers,
        count: 1,
        dst,
    };
    let dev = api::gpu::Composite::DEVICE;
    let mut regions = cmd.regions();
    regions.push((src, AccessMode::Read));
    let args = |id: u64, mode: AccessMode| -> Result<[u64; 6], CliError> {
        let size = conn
            .region(id)
            .map(|r| r.size)
            .ok_or_else(|| CliError::Usage(format!("region {id} not allocated here")))?;
        Ok([id, 0, size, mode as u64, 0, 0])
    };
    let access = |op: Opcode| -> Result<(), CliError> {
        for (id, mode) in &regions {
            conn.submit_detached(op, dev, args(*id, *mode)?)?;
        }
        Ok(())
    };
    // Held for the whole run by a backlogged guest, per composition by a closed loop.
    let hold = depth > 1;
    let submit = |held: bool| -> Result<u64, CliError> {
        if !held {
            access(Opcode::BeginAccess)?;
        }
        let seq = conn.submit(Opcode::DeviceCmd, dev, cmd.encode())?;
        if !held {
            access(Opcode::EndAccess)?;
        }
        Ok(seq)
    };
    let answered = |seq: u64| -> Result<(), CliError> {
        let c = conn.wait(seq)?;
        if c.status != 0 {
            let st = virtsoc_guest::Status::from_u32(c.status)
                .unwrap_or(virtsoc_guest::Status::Internal);
            return Err(CliError::Usage(format!(
                "composition failed: {}",
                st.message()
            )));
        }
        if let Some((seq, st)) = conn.take_async_errors().first() {
            return Err(CliError::Usage(format!(
                "request {seq} failed: {}",
                st.message()
            )));
        }
        Ok(())
    };
    let warmed = (|| -> Result<(), CliError> {
        let p = Pipe::new(&conn, crate::bench_svm::OrderingMode::Atomic);
        p.cpu_write(src, &vec![0x80u8; (w * h * 4) as usize])?;
        p.cpu_write(layers, &full_layer(src, w, h, false).to_bytes())?;
        for _ in 0..3 {
            answered(submit(false)?)?;
        }
        if hold {
            access(Opcode::BeginAccess)?;
        }
        Ok(())
    })();
    warm.wait();
    warmed?;
    let mut queued = VecDeque::with_capacity(depth);
    while !stop.load(Ordering::Relaxed) {
        if gate.is_some_and(|g| !g.load(Ordering::Relaxed)) {
            while let Some(seq) = queued.pop_front() {
                answered(seq)?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
            continue;
        }
        while queued.len() < depth.max(1) {
            queued.push_back(submit(hold)?);
        }
        if let Some(seq) = queued.pop_front() {
            answered(seq)?;
            done.fetch_add(1, Ordering::Relaxed);
        }
    }
    for seq in queued {
        answered(seq)?;
    }
    if hold {
        access(Opcode::EndAccess)?;
        conn.drain()?;
        if let Some((seq, st)) = conn.take_async_errors().first() {
            return Err(CliError::Usage(format!(
                "request {seq} failed: {}",
                st.message()
            )));
        }
    }
    Ok(())
}
