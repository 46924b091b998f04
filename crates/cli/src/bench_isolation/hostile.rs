//! The hostile guests of `bench isolation`: each kind's loop, run until its control says
//! stop (or pauses it between blocks).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::time::Duration;

use virtsoc_guest::devices::{self as api, display, gpu, LayerRecord};
use virtsoc_guest::{
    testdev, AccessMode, ConnectOptions, Connection, DeviceCommand, DeviceId, Format, Opcode,
    RegionId,
};

use super::victim::{bitstreams, bytes_of, open_decoder, units_of};
use super::{Ctl, Tally, SVM_SIZE};
use crate::bench_svm::OrderingMode;
use crate::scenario::pipe::{check_completion, Pipe};
use crate::scenario::{full_layer, media};
use crate::CliError;

/// A hostile guest's connection.
pub(super) fn open(
    target: &str,
    name: &str,
    window: u64,
    coherence: &str,
) -> Result<Connection, CliError> {
    Ok(Connection::open(
        target,
        &ConnectOptions {
            name: name.into(),
            window_size: window,
            coherence: Some(coherence.into()),
            ..ConnectOptions::default()
        },
    )?)
}

/// Runs hostile guest `kind` until `stop`.
pub(super) fn hostile(
    kind: &str,
    (target, slow): (&str, (u32, u32)),
    ctl: &Ctl,
    t: &Tally,
) -> Result<(), CliError> {
    let name = format!("hostile-{kind}");
    match kind {
        "prefetch-abuser" => prefetch_abuser(target, &name, ctl, t),
        "composite-64x4096" => composite(target, &name, 64, ctl, t),
        "composite-3x4096" => composite(target, &name, 3, ctl, t),
        "slow-decoder" => slow_decoder(target, &name, (slow, 0), ctl, t),
        "slow-decoder-1" => slow_decoder(target, &name, (slow, 1), ctl, t),
        "slow-encoder" => slow_encoder(target, &name, slow, ctl, t),
        "slow-isp" => slow_isp(target, &name, slow, ctl, t),
        "region-flood" => {
            let c = open(target, &name, 64 << 20, "write-invalidate")?;
            while ctl.go() {
                let mut held = Vec::new();
                while held.len() < 1 << 17 && ctl.go() {
                    match t.op(c.alloc_blob(4096))? {
                        Some(r) => held.push(r.id),
                        None => break,
                    }
                }
                for id in held {
                    t.op(c.free(id))?;
                }
            }
            Ok(())
        }
        "fence-flood" => {
            let c = open(target, &name, 16 << 20, "write-invalidate")?;
            while ctl.go() {
                let mut held = Vec::new();
                while held.len() < 1 << 17 && ctl.go() {
                    match t.op(c.fence_create())? {
                        Some(f) => held.push(f),
                        None => break,
                    }
                }
                for f in held {
                    t.op(c.fence_release(f))?;
                }
            }
            Ok(())
        }
        "queue-flood" => queue_flood(target, &name, ctl, t),
        "snapshot-spam" => {
            let c = open(target, &name, 16 << 20, "write-invalidate")?;
            while ctl.go() {
                t.op(c.command(&display::Snapshot::default()))?;
            }
            Ok(())
        }
        "handshake-trickle" => trickle(target, ctl, t),
        "session-churn" => {
            // Opens a decoder (its worker taken from the daemon's pool) and closes it, again.
            let c = open(target, &name, 16 << 20, "write-invalidate")?;
            let open = api::codec::OpenDecoder {
                kind: api::codec_kind::H264,
                format: Format::Nv12 as u64,
                threads: 1,
            };
            while ctl.go() {
                if let Some(r) = t.op(c.command(&open))? {
                    t.op(c.command(&api::codec::Close { handle: r.handle }))?;
                }
            }
            Ok(())
        }
        other => Err(CliError::Usage(format!("unknown hostile kind {other}"))),
    }
}

/// Writes with the producer, reads with the consumer, the second consumer and the CPU in
/// turn, on 4 buffers of 1 MiB, without pause.
fn prefetch_abuser(target: &str, name: &str, ctl: &Ctl, t: &Tally) -> Result<(), CliError> {
    let c = open(target, name, 64 << 20, "prefetch")?;
    let ring: Vec<RegionId> = (0..4)
        .map(|_| c.alloc_blob(SVM_SIZE).map(|r| r.id))
        .collect::<Result<_, _>>()?;
    let readers = [DeviceId::CONSUMER, DeviceId::CONSUMER2, DeviceId::CPU];
    let (w, r) = (AccessMode::Write, AccessMode::Read);
    let mut i = 0u64;
    while ctl.go() {
        let id = ring[i as usize % ring.len()];
        t.op(c.begin_access(id, DeviceId::PRODUCER, 0, SVM_SIZE, w))?;
        t.op(c.device_cmd(
            DeviceId::PRODUCER,
            [testdev::WRITE_PATTERN, u64::from(id), i, 0, 0, 0],
        ))?;
        t.op(c.end_access(id, DeviceId::PRODUCER, 0, SVM_SIZE, w))?;
        // A different reader each time: no flow the predictor learns holds for long.
        let dev = readers[(i as usize / ring.len() + i as usize) % readers.len()];
        t.op(c.begin_access(id, dev, 0, SVM_SIZE, r))?;
        if dev != DeviceId::CPU {
            t.op(c.device_cmd(dev, [testdev::CHECKSUM, u64::from(id), 0, 0, 0, 0]))?;
        }
        t.op(c.end_access(id, dev, 0, SVM_SIZE, r))?;
        i += 1;
    }
    Ok(())
}

/// `layers` full layers of a 4096x4096 source composited into a 4096x4096 target, back to
/// back.
fn composite(
    target: &str,
    name: &str,
    layers: usize,
    ctl: &Ctl,
    t: &Tally,
) -> Result<(), CliError> {
    const SIDE: u32 = 4096;
    let bytes = SIDE as u64 * SIDE as u64 * 4;
    let c = open(target, name, 2 * bytes + (64 << 20), "write-invalidate")?;
    let src = c.alloc(0, SIDE, SIDE, Format::Rgba8, 0)?;
    let dst = c.alloc(0, SIDE, SIDE, Format::Rgba8, 0)?;
    let records: Vec<LayerRecord> = (0..layers)
        .map(|_| full_layer(src.id, SIDE, SIDE, true))
        .collect();
    let blob: Vec<u8> = records.iter().flat_map(|l| l.to_bytes()).collect();
    let b = c.alloc_blob(blob.len() as u64)?;
    let n = blob.len() as u64;
    let a = c.begin_access(b.id, DeviceId::CPU, 0, n, AccessMode::Write)?;
    let ptr = a
        .ptr
        .ok_or_else(|| CliError::Usage("no CPU pointer".into()))?;
    // SAFETY: the window maps `n` bytes at `ptr` until end_access.
    unsafe { std::ptr::copy_nonoverlapping(blob.as_ptr(), ptr.as_ptr(), blob.len()) };
    c.end_access(b.id, DeviceId::CPU, 0, n, AccessMode::Write)?;
    // The layers' source is read by the GPU for as long as the guest composites.
    c.begin_access(src.id, gpu::ID, 0, src.size, AccessMode::Read)?;
    while ctl.go() {
        t.op(c.command_with_access(&gpu::Composite {
            layers: b.id,
            count: layers as u64,
            dst: dst.id,
        }))?;
    }
    c.end_access(src.id, gpu::ID, 0, src.size, AccessMode::Read)?;
    Ok(())
}

/// 200 checksums queued on the consumer behind a fence wait whose fence the producer
/// signals after writing 16 MiB; again. (The fence is signaled by queued work: the guest
/// library's flow control may hold a submission until earlier ones complete, so a fence
/// only the guest would signal later could block the guest itself.)
fn queue_flood(target: &str, name: &str, ctl: &Ctl, t: &Tally) -> Result<(), CliError> {
    const BIG: u64 = 16 << 20;
    let c = open(target, name, 64 << 20, "write-invalidate")?;
    let r = c.alloc_blob(4096)?;
    let big = c.alloc_blob(BIG)?;
    c.begin_access(r.id, DeviceId::CONSUMER, 0, 4096, AccessMode::Read)?;
    c.begin_access(big.id, DeviceId::PRODUCER, 0, BIG, AccessMode::Write)?;
    let mut i = 0;
    while ctl.go() {
        let f = c.fence_create()?;
        c.submit_detached(
            Opcode::DeviceCmd,
            DeviceId::PRODUCER,
            [testdev::WRITE_PATTERN, u64::from(big.id), i, 0, 0, 0],
        )?;
        c.fence_signal(DeviceId::PRODUCER, f)?;
        c.fence_wait(DeviceId::CONSUMER, f)?;
        for _ in 0..200 {
            t.op(c.submit_detached(
                Opcode::DeviceCmd,
                DeviceId::CONSUMER,
                [testdev::CHECKSUM, u64::from(r.id), 0, 0, 0, 0],
            ))?;
        }
        c.drain()?;
        let refused = c.take_async_errors().len() as u64;
        t.refused.fetch_add(refused, Ordering::Relaxed);
        c.fence_release(f)?;
        i += 1;
    }
    c.end_access(big.id, DeviceId::PRODUCER, 0, BIG, AccessMode::Write)?;
    c.end_access(r.id, DeviceId::CONSUMER, 0, 4096, AccessMode::Read)?;
    Ok(())
}

/// 300 connections announcing a 1000-byte hello and sending a byte of it every 200 ms; one
/// the daemon cut off is opened again.
fn trickle(target: &str, ctl: &Ctl, t: &Tally) -> Result<(), CliError> {
    let connect = || -> Option<UnixStream> {
        t.ops.fetch_add(1, Ordering::Relaxed);
        let mut s = UnixStream::connect(target).ok()?;
        s.write_all(&1000u32.to_le_bytes()).ok()?;
        s.write_all(b"{").ok()?;
        Some(s)
    };
    let mut socks: Vec<Option<UnixStream>> = (0..300).map(|_| connect()).collect();
    while ctl.go() {
        for slot in socks.iter_mut() {
            use rustix::net::SendFlags;
            let sent = slot
                .as_ref()
                .map(|s| rustix::net::send(s, b" ", SendFlags::DONTWAIT | SendFlags::NOSIGNAL));
            if !matches!(sent, Some(Ok(_))) {
                // Cut off (or never connected): the daemon refused it; try again.
                t.refused.fetch_add(1, Ordering::Relaxed);
                *slot = connect();
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// Pictures the slow decoder keeps queued (a decode and a receive each), as `virtsoc bench
/// sharing`'s codec guests do.
const SLOW_DEPTH: usize = 4;

/// `slow-decoder`: plays the realistic clip of `w` x `h` (3840x2160 by default: `virtsoc run
/// uhd-video`'s) on a decoder of `threads` threads (0: the daemon's default; 1 for
/// `slow-decoder-1`), each access unit in a bitstream region of its own written before it
/// starts, [`SLOW_DEPTH`] pictures queued; a picture received is an operation. Paused, it stops submitting, collects what it queued, flushes its decoder and
/// receives what the flush gives, so that its worker has nothing left to decode while the
/// victim is alone, and starts again from the clip's first picture (an IDR).
fn slow_decoder(
    target: &str,
    name: &str,
    ((w, h), threads): ((u32, u32), u64),
    ctl: &Ctl,
    t: &Tally,
) -> Result<(), CliError> {
    let units = units_of(&media::realistic_clip("flat", w, h, 60, 2)?)?;
    let picture = u64::from(w) * u64::from(h) * 3 / 2;
    let c = open(
        target,
        name,
        2 * picture + bytes_of(&units) + (64 << 20),
        "prefetch",
    )?;
    let bits = bitstreams(&c, &units)?;
    let frames = [
        c.alloc(0, w, h, Format::Nv12, 0)?.id,
        c.alloc(0, w, h, Format::Nv12, 0)?.id,
    ];
    let handle = open_decoder(&c, threads)?;
    let receive = |k: usize| api::codec::ReceiveFrame {
        handle,
        frame: frames[k % frames.len()],
    };
    // Counts the picture a receive delivered: 1 or 0 (none ready yet).
    let got = |seq: u64| -> Result<u64, CliError> {
        let c = c.wait(seq)?;
        check_completion(&c, "receive_frame")?;
        let got = api::codec::ReceiveFrame::reply(&c.values).got;
        t.ops.fetch_add(got, Ordering::Relaxed);
        Ok(got)
    };
    let collect = |(d, r): (u64, u64)| -> Result<u64, CliError> {
        check_completion(&c.wait(d)?, "decode")?;
        got(r)
    };
    let mut queued = std::collections::VecDeque::new();
    let mut k = 0;
    loop {
        if ctl.pause.load(Ordering::Acquire) || ctl.stop.load(Ordering::Relaxed) {
            for q in queued.drain(..) {
                collect(q)?;
            }
            if k > 0 {
                c.command(&api::codec::Flush { handle })?;
                while got(c.submit_with_access(&receive(0))?)? > 0 {}
            }
            k = 0;
        }
        if !ctl.go() {
            break;
        }
        let (bitstream, len) = bits[k % bits.len()];
        let decode = api::codec::Decode {
            handle,
            bitstream,
            len,
            pts: k as u64,
        };
        queued.push_back((
            c.submit_with_access(&decode)?,
            c.submit_with_access(&receive(k))?,
        ));
        k += 1;
        if queued.len() >= SLOW_DEPTH {
            if let Some(q) = queued.pop_front() {
                collect(q)?;
            }
        }
    }
    c.command(&api::codec::Close { handle })?;
    Ok(())
}

/// `slow-encoder`: encodes pictures of `w` x `h` (NV12) back to back with an H.264 encoder of
/// the daemon's, two pictures of noise in turn (so that every one costs libx264 a whole
/// picture's work), one encode at a time; an encode answered is an operation.
fn slow_encoder(
    target: &str,
    name: &str,
    (w, h): (u32, u32),
    ctl: &Ctl,
    t: &Tally,
) -> Result<(), CliError> {
    let picture = u64::from(w) * u64::from(h) * 3 / 2;
    let c = open(target, name, 4 * picture + (64 << 20), "prefetch")?;
    let p = Pipe::new(&c, OrderingMode::Atomic);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = vec![0u8; picture as usize];
    let mut frames = Vec::new();
    for _ in 0..2 {
        for chunk in noise.chunks_mut(8) {
            // xorshift64: cheap bytes no encoder predicts.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let b = seed.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
        let id = c.alloc(0, w, h, Format::Nv12, 0)?.id;
        p.cpu_write(id, &noise)?;
        frames.push(id);
    }
    // As much as the encoder may give for a picture (noise costs more bits than its pixels).
    let out = c.alloc_blob(2 * picture + (1 << 20))?.id;
    let handle = c
        .command(&api::codec::OpenEncoder {
            width: u64::from(w),
            height: u64::from(h),
            fps: 60,
            bitrate: 100_000_000,
        })?
        .handle;
    let mut k = 0;
    while ctl.go() {
        let encode = api::codec::Encode {
            handle,
            frame: frames[k % frames.len()],
            pts: k as u64,
            out,
        };
        check_completion(&c.wait(c.submit_with_access(&encode)?)?, "encode")?;
        t.ops.fetch_add(1, Ordering::Relaxed);
        k += 1;
    }
    c.command(&api::codec::Close { handle })?;
    Ok(())
}

/// `slow-isp`: converts an NV12 picture of `w` x `h` into RGBA8 with the ISP, back to back,
/// one conversion at a time (the victim's camera converts 1280x720 pictures on the same
/// device); a conversion answered is an operation.
fn slow_isp(
    target: &str,
    name: &str,
    (w, h): (u32, u32),
    ctl: &Ctl,
    t: &Tally,
) -> Result<(), CliError> {
    let picture = u64::from(w) * u64::from(h) * 3 / 2;
    let rgba = u64::from(w) * u64::from(h) * 4;
    let c = open(target, name, picture + rgba + (64 << 20), "prefetch")?;
    let p = Pipe::new(&c, OrderingMode::Atomic);
    let src = c.alloc(0, w, h, Format::Nv12, 0)?.id;
    p.cpu_write(src, &vec![128u8; picture as usize])?;
    let dst = c.alloc(0, w, h, Format::Rgba8, 0)?.id;
    while ctl.go() {
        let convert = api::isp::Convert { src, dst };
        check_completion(&c.wait(c.submit_with_access(&convert)?)?, "convert")?;
        t.ops.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}
