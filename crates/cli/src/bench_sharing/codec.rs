//! The codec guest of `virtsoc bench sharing`: H.264 decode into NV12 regions, one packet
//! and one frame at a time, looping over a generated clip of its size.
//!
//! Each frame is received into the next of [`ROTATION`] frame regions, a pool of video
//! buffers as a player has, not into one region that one guest alone would find in the
//! CPU's caches from its previous frame (the GPU guests' reason, see `super::gpu`). Its input is fresh already: the clip's access units in turn; the decoder's
//! own reference frames are per session, one guest's alone and each guest's together, as a
//! real guest's are.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;

use virtsoc_guest::devices as api;
use virtsoc_guest::{ConnectOptions, Connection, Format};

use super::gpu::ROTATION;
use crate::bench_svm::OrderingMode;
use crate::scenario::media;
use crate::scenario::pipe::Pipe;
use crate::CliError;

/// Decodes until `stop`, counting decode + receive pairs in `done`; while `gate` (if any) is
/// false, it waits instead.
pub(super) fn guest(
    target: &str,
    name: &str,
    (w, h): (u32, u32),
    gate: Option<&AtomicBool>,
    warm: &Barrier,
    stop: &AtomicBool,
    done: &AtomicU64,
) -> Result<(), CliError> {
    let setup = || -> Result<_, CliError> {
        let units = media::load_units(&media::clip("flat", w, h, 30, 2)?)?;
        if units.is_empty() {
            return Err(CliError::Usage(format!(
                "no access units in the {w}x{h} clip"
            )));
        }
        let conn = Connection::open(
            target,
            &ConnectOptions {
                name: name.to_string(),
                window_size: w as u64 * h as u64 * 2 * ROTATION as u64 + (32 << 20),
                ..ConnectOptions::default()
            },
        )?;
        let bits = conn
            .alloc_blob(units.iter().map(Vec::len).max().unwrap_or(1) as u64)?
            .id;
        let frames = (0..ROTATION)
            .map(|_| Ok(conn.alloc(0, w, h, Format::Nv12, 0)?.id))
            .collect::<Result<Vec<u64>, CliError>>()?;
        Ok((units, conn, bits, frames))
    };
    let (units, conn, bits, frames) = match setup() {
        Ok(x) => x,
        Err(e) => {
            warm.wait();
            return Err(e);
        }
    };
    let mut p = Pipe::new(&conn, OrderingMode::Atomic);
    let mut next = 0usize;
    let mut one = |p: &mut Pipe, handle: u64| -> Result<(), CliError> {
        let unit = &units[next % units.len()];
        let frame = frames[next % frames.len()];
        next += 1;
        p.cpu_write(bits, unit)?;
        p.run(&api::codec::Decode {
            handle,
            bitstream: bits,
            len: unit.len() as u64,
            pts: 0,
        })?;
        let t = p.run(&api::codec::ReceiveFrame { handle, frame })?;
        p.result(t)?;
        Ok(())
    };
    let opened = (|| -> Result<u64, CliError> {
        let t = p.run(&api::codec::OpenDecoder {
            kind: api::codec_kind::H264,
            format: Format::Nv12 as u64,
            threads: 1,
        })?;
        let handle = p.result(t)?.handle;
        for _ in 0..ROTATION.max(3) {
            one(&mut p, handle)?;
        }
        Ok(handle)
    })();
    warm.wait();
    let handle = opened?;
    while !stop.load(Ordering::Relaxed) {
        if gate.is_some_and(|g| !g.load(Ordering::Relaxed)) {
            std::thread::sleep(std::time::Duration::from_millis(1));
            continue;
        }
        one(&mut p, handle)?;
        done.fetch_add(1, Ordering::Relaxed);
    }
    p.run(&api::codec::Close { handle })?;
    Ok(())
}
