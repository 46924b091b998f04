//! The codec guest of `virtsoc bench sharing`: H.264 decode into NV12 regions, looping over a
//! generated clip of its size, [`DEPTH`] frames (a decode and a receive each) queued on the
//! daemon at a time.
//!
//! Each frame is received into the next of [`ROTATION`] frame regions, a pool of video
//! buffers as a player has, not into one region that one guest alone would find in the
//! CPU's caches from its previous frame (the GPU guests' reason, see `super::gpu`). Its
//! input is fresh already: the clip's access units in turn, each in a bitstream region of
//! its own, written once before the run; the decoder's own reference frames are per
//! session, one guest's alone and each guest's together, as a real guest's are.
//!
//! Like the GPU guests it is backlogged (`super::backlog`): a player decodes ahead into its
//! pool, and its next frame's decode is on the daemon when the previous one answers. It
//! takes its regions' accesses once, before the run, and holds them until it stops. Until
//! stop 23 it was a closed loop (write the packet, decode, receive, wait: eight round trips
//! a frame, each with the codec waiting), which kept the codec busy 55-65% of the time
//! alone and measured the round trips more than the sharing.

use std::sync::Barrier;

use virtsoc_guest::devices as api;
use virtsoc_guest::{AccessMode, ConnectOptions, Connection, DeviceCommand, Format, Opcode};

use super::backlog::{self, Control};
use super::gpu::ROTATION;
use crate::bench_svm::OrderingMode;
use crate::scenario::media;
use crate::scenario::pipe::Pipe;
use crate::CliError;
use virtsoc_devapi::{HandleId, RegionId};

/// Frames a codec guest keeps queued, two requests each (decode, receive): a player decoding
/// ahead into its pool, so that a turn of the codec's scheduler serves it several pictures
/// in a row. Alone it keeps twice as many (`backlog::DEEP`): 16 requests, as deep as the
/// guest library's flow control lets a guest's own queue on the host grow before it shrinks
/// the guest's window. (Until stop 45: two, so a turn held at most two pictures; eight were
/// measured too, with the same overhead and a slower guest alone.)
const DEPTH: usize = 4;

/// Decodes until `ctl.stop`, counting decode + receive pairs in `ctl.done`; while `ctl.gate`
/// (if any) is false, it lets its queue drain and waits.
pub(super) fn guest(
    target: &str,
    name: &str,
    ((w, h), threads): ((u32, u32), u32),
    warm: &Barrier,
    ctl: Control<'_>,
) -> Result<(), CliError> {
    let setup = || -> Result<_, CliError> {
        let units = media::load_units(&media::clip("flat", w, h, 30, 2)?)?;
        if units.is_empty() {
            return Err(CliError::Usage(format!(
                "no access units in the {w}x{h} clip"
            )));
        }
        let bytes: u64 = units.iter().map(|u| u.len() as u64).sum();
        let conn = Connection::open(
            target,
            &ConnectOptions {
                name: name.to_string(),
                window_size: w as u64 * h as u64 * 2 * ROTATION as u64 + bytes + (32 << 20),
                ..ConnectOptions::default()
            },
        )?;
        let bits = units
            .iter()
            .map(|u| Ok(conn.alloc_blob(u.len().max(1) as u64)?.id))
            .collect::<Result<Vec<RegionId>, CliError>>()?;
        let frames = (0..ROTATION)
            .map(|_| Ok(conn.alloc(0, w, h, Format::Nv12, 0)?.id))
            .collect::<Result<Vec<RegionId>, CliError>>()?;
        Ok((units, conn, bits, frames))
    };
    let (units, conn, bits, frames) = match setup() {
        Ok(x) => x,
        Err(e) => {
            warm.wait();
            return Err(e);
        }
    };
    let dev = api::codec::Decode::DEVICE;
    // The `k`th frame's commands: the decode of unit `k` (looping over the clip) and the
    // receive into frame region `k % ROTATION`.
    let commands = |handle: HandleId, k: u64| {
        let u = (k % units.len() as u64) as usize;
        let decode = api::codec::Decode {
            handle,
            bitstream: bits[u],
            len: units[u].len() as u64,
            pts: 0,
        };
        let receive = api::codec::ReceiveFrame {
            handle,
            frame: frames[(k % frames.len() as u64) as usize],
        };
        (decode, receive)
    };
    let mut held: Vec<(RegionId, AccessMode)> =
        bits.iter().map(|b| (*b, AccessMode::Read)).collect();
    held.extend(frames.iter().map(|f| (*f, AccessMode::Write)));
    let warmed = (|| -> Result<(HandleId, u64), CliError> {
        let mut p = Pipe::new(&conn, OrderingMode::Atomic);
        for (b, u) in bits.iter().zip(&units) {
            p.cpu_write(*b, u)?;
        }
        let t = p.run(&api::codec::OpenDecoder {
            kind: api::codec_kind::H264,
            format: Format::Nv12 as u64,
            threads: u64::from(threads),
        })?;
        let handle = p.result(t)?.handle;
        // Every frame region at least once, each command with its own accesses.
        let mut k = 0;
        while k < ROTATION.max(3) as u64 {
            let (decode, receive) = commands(handle, k);
            p.run(&decode)?;
            let t = p.run(&receive)?;
            p.result(t)?;
            k += 1;
        }
        // Taken before the run starts, as the GPU guests' are.
        backlog::access(&conn, dev, Opcode::BeginAccess, &held)?;
        conn.drain()?;
        Ok((handle, k))
    })();
    warm.wait();
    let (handle, first) = warmed?;
    let submit = |k: u64| -> Result<(u64, u64), CliError> {
        let (decode, receive) = commands(handle, k);
        let d = conn.submit(Opcode::DeviceCmd, dev, decode.encode())?;
        let r = conn.submit(Opcode::DeviceCmd, dev, receive.encode())?;
        Ok((d, r))
    };
    let answered = |(d, r): (u64, u64)| -> Result<(), CliError> {
        backlog::answered(&conn, d, "decode")?;
        backlog::answered(&conn, r, "receive")
    };
    backlog::run(ctl, DEPTH, first, submit, answered)?;
    backlog::release(&conn, dev, &held)?;
    conn.command(&api::codec::Close { handle })?;
    Ok(())
}
