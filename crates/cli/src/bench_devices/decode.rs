//! Decoding through the daemon against libavcodec alone, as `bench devices` measures it.
//!
//! The guest keeps the decoder busy as a player would: it writes each packet into one of
//! [`BITSTREAMS`] bitstream regions in turn and queues its `decode` without waiting, and
//! queues a `receive_frame` [`LAG`] packets behind (into one NV12 frame region, as a
//! player's next frame), so several packets are in the daemon and its decoder worker at once
//! and there is no round trip per frame in steady state: the guest waits only before
//! rewriting a bitstream region, for the `decode` that read it [`BITSTREAMS`] packets ago.
//! A packet is written as a posted write (`Connection::write_posted`): into the window, then
//! one request queued without waiting, ahead of the `decode` that reads the packet - no
//! round trip per packet (the first write of each region asks where it lies).
//! At the end it flushes and receives what is left. Each command takes its regions'
//! accesses itself (`DeviceCmdAccess`: one request a command); `--separate-accesses` queues
//! a begin_access and an end_access request around it instead (three), as before.
//!
//! Natively, one libavcodec decoder with the daemon's default threads decodes the same
//! packets in this process, pictures left in its buffers (the worker's model).
//!
//! Both are measured warm, in steady state: each decoder (the daemon's and the native one)
//! is opened once per clip and decodes the clip once untimed, then the timed rounds, with a
//! flush (which resets the decoder) after each pass. Opening a decoder through the daemon
//! takes a waiting worker process and starts its replacement, and that start (about 40 ms of
//! CPU, most of it the dynamic linker binding libavcodec's hundred libraries) would otherwise
//! run on the same two cores during the first timed pass; libavcodec's first pass also makes
//! its threads and picture buffers. What opening costs is reported apart ([`DecodeNumbers`]'
//! `open_ms`, the guest's `open_decoder` round trip; the replacement's start runs after it).
//!
//! A timed pass decodes the clip back to back as many times as make it last about a second
//! ([`repeated`]): a pass of 90 frames at 1080p lasts under 200 ms, and on 2 cores one
//! scheduler burst moved such a pass by 10-30%. Each round is the daemon's pass, then the
//! native one right after it; the ratio is the median of the rounds' ratios (each printed),
//! so a change of the machine's own speed between rounds (libavcodec alone moved from 450
//! to 718 fps within a minute here) moves both sides of a ratio together.
//!
//! Since the stages overlap, the breakdown ([`Stages`]) is in CPU time per frame of each
//! process (the decoder's worker, the daemon, the guest) beside libavcodec's own CPU time,
//! measured from the kernel's per-thread run time. On a machine with `cores` cores the sum
//! over the cores is a floor of the wall time per frame: when it is above 0.9x native's
//! wall time, the target is out of reach on that machine whatever the overlap.

use std::collections::VecDeque;
use std::time::Instant;

use serde::Serialize;
use virtsoc_guest::devices as api;
use virtsoc_guest::{ConnectOptions, Connection, DeviceCommand, Format, Opcode};
use virtsoc_media::{CodecKind, DecoderBackend, FfmpegDecoder, PixelFormat};
use virtsoc_proto::window_layout::{ctl, CONTROL_OFFSET};

use crate::bench_svm::OrderingMode;
use crate::scenario::pipe::{access_args, check_async_errors, check_completion, Pipe};
use crate::stats::{median, percentile};
use crate::CliError;
use virtsoc_devapi::{HandleId, RegionId};

/// Bitstream regions the guest writes packets into in turn.
pub const BITSTREAMS: usize = 6;
/// Packets a `receive_frame` is queued behind its `decode`.
pub const LAG: usize = 3;
/// Threads of the daemon's decoders when `open_decoder` asks for 0 (`virtsocd
/// --codec-threads`' default), also native decoding's.
const DEFAULT_THREADS: usize = 2;

/// Decoding one clip through the daemon and natively.
#[derive(Debug, Clone, Serialize)]
pub struct DecodeNumbers {
    pub clip: String,
    pub frames: u64,
    pub decode_fps: f64,
    pub native_decode_fps: f64,
    /// The median of the rounds' ratios.
    pub ratio: f64,
    /// Each round, in order: the daemon's pass and libavcodec's right after it (a pair that
    /// a change of the machine's speed over minutes moves together).
    pub rounds: Vec<RoundFps>,
    /// Milliseconds of the guest's `open_decoder` round trip (a waiting worker taken and
    /// its decoder opened; the replacement worker starts after the answer).
    pub open_ms: f64,
    pub stages: Stages,
}

/// One round of a clip: frames per second through the daemon, then natively, and their
/// ratio.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RoundFps {
    pub decode_fps: f64,
    pub native_decode_fps: f64,
    pub ratio: f64,
}

/// Where a frame's time goes, in microseconds per frame. `total` and `native_decode` are
/// wall time (through the daemon, and libavcodec alone); the rest is CPU time:
/// `worker_cpu` (the decoder's worker process: libavcodec's threads and its messages),
/// `daemon_cpu` (every daemon thread: the codec device, the rings, the SVM and its copies),
/// `guest_cpu` (this process while it drives the daemon: packets written, requests
/// queued), `native_cpu` (libavcodec alone). `cpu_floor` is their sum over `cores`: no
/// overlap can make a frame take less wall time on this machine. `ring_us` is one empty
/// command's round trip (`stream_info`), and `frame_copies` the copies of a frame's bytes
/// per frame on the guest's ledger (the decoder's own write not counted).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stages {
    pub total: f64,
    pub native_decode: f64,
    pub worker_cpu: f64,
    pub daemon_cpu: f64,
    pub guest_cpu: f64,
    pub native_cpu: f64,
    pub cores: usize,
    pub cpu_floor: f64,
    pub ring_us: f64,
    pub frame_copies: f64,
    /// Times per frame a thread of each was put on a CPU (the kernel's count of timeslices
    /// in `schedstat`, every thread): the hand-offs, each a wake-up and a switch.
    pub switches: Switches,
}

/// Timeslices per frame of the decoder's worker, the daemon, the guest, and libavcodec
/// alone ([`Stages::switches`]): through the daemon a frame takes the first three
/// together, alone the fourth.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Switches {
    pub worker: f64,
    pub daemon: f64,
    pub guest: f64,
    pub native: f64,
}

/// Nanoseconds process `pid`'s threads have run and the timeslices they were given (from
/// each thread's `schedstat`; threads that have ended are not counted, so measure over
/// spans in which they live).
fn run_of(pid: u32) -> Ran {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Ran::default();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .map(|s| {
            let mut f = s.split_whitespace().map(|x| x.parse::<u64>().unwrap_or(0));
            let ns = f.next().unwrap_or(0);
            Ran {
                ns,
                slices: f.nth(1).unwrap_or(0),
            }
        })
        .fold(Ran::default(), |a, b| a.plus(b))
}

/// CPU time and timeslices of some threads ([`run_of`]).
#[derive(Debug, Clone, Copy, Default)]
struct Ran {
    ns: u64,
    slices: u64,
}

impl Ran {
    fn plus(self, o: Ran) -> Ran {
        Ran {
            ns: self.ns + o.ns,
            slices: self.slices + o.slices,
        }
    }

    fn since(self, before: Ran) -> Ran {
        Ran {
            ns: self.ns.saturating_sub(before.ns),
            slices: self.slices.saturating_sub(before.slices),
        }
    }
}

/// CPU time and timeslices so far of this process, the daemon and its codec workers.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    guest: Ran,
    daemon: Ran,
    workers: Ran,
}

impl Cpu {
    fn now(daemon: Option<u32>) -> Cpu {
        let (d, w) = match daemon {
            Some(pid) => (
                run_of(pid),
                virtsoc_media::worker_processes(pid, "--codec-worker")
                    .into_iter()
                    .map(run_of)
                    .fold(Ran::default(), Ran::plus),
            ),
            None => (Ran::default(), Ran::default()),
        };
        Cpu {
            guest: run_of(std::process::id()),
            daemon: d,
            workers: w,
        }
    }
}

/// Bytes the guest's ledger counts copied, all links together.
fn copied_bytes(conn: &Connection) -> Result<u64, CliError> {
    Ok(conn.ledger()?.iter().map(|l| l.bytes).sum())
}

/// Queues `cmd` on its device, the whole of each region it names accessed in the declared
/// mode (queued, not waited for); the command's sequence number. The command takes its own
/// accesses (one request), or, `separate`, is queued between a begin_access and an
/// end_access request of each region.
fn queue<C: DeviceCommand + 'static>(
    conn: &Connection,
    cmd: &C,
    separate: bool,
) -> Result<u64, CliError> {
    if !separate {
        return Ok(conn.submit_with_access(cmd)?);
    }
    let dev = C::DEVICE;
    for (id, mode) in cmd.regions() {
        conn.submit_detached(Opcode::BeginAccess, dev, access_args(conn, id, mode)?)?;
    }
    let seq = conn.submit(Opcode::DeviceCmd, dev, cmd.encode())?;
    for (id, mode) in cmd.regions() {
        conn.submit_detached(Opcode::EndAccess, dev, access_args(conn, id, mode)?)?;
    }
    Ok(seq)
}

/// The pictures `receive_frame` `seq` delivered.
fn got(conn: &Connection, seq: u64) -> Result<u64, CliError> {
    let c = conn.wait(seq)?;
    check_completion(&c, "receive_frame")?;
    Ok(api::codec::ReceiveFrame::reply(&c.values).got)
}

/// Spin iterations of the player's doorbell waits (and of the daemon's waits for its
/// requests) before they sleep: most of its waits are for the decoder (milliseconds), which
/// no spin catches and which a spin would take a core from; a few hundred iterations still
/// catch the short ones (an access's answer). As `virtsoc-gles-guest`'s transport.
const SPINS: u32 = 256;

/// Decodes `units` of `clip` at `w` x `h` through the daemon at `target` (see the module's
/// notes) and natively, `rounds` times each, in turn; the median round of each, with the
/// stages of a frame. `daemon` is the daemon's process id, when known (for its CPU time and
/// its workers'). `separate`: the player queues each region's accesses as requests of
/// their own ([`queue`]).
pub fn decode_clip(
    target: &str,
    daemon: Option<u32>,
    clip: &str,
    units: &[Vec<u8>],
    (w, h): (u32, u32),
    (rounds, separate): (usize, bool),
) -> Result<DecodeNumbers, CliError> {
    let conn = Connection::open(
        target,
        &ConnectOptions {
            name: format!("bench-decode-{clip}-{w}x{h}"),
            coherence: Some("prefetch".into()),
            window_size: (u64::from(w) * u64::from(h) * 2 + (64 << 20)).min(1 << 30),
            spins: SPINS,
            ..ConnectOptions::default()
        },
    )?;
    if let Ok(word) = conn.window().atomic_u32(CONTROL_OFFSET + ctl::HOST_SPINS) {
        word.store(SPINS, std::sync::atomic::Ordering::Relaxed);
    }
    let frame = conn.alloc(0, w, h, Format::Nv12, 0)?.id;
    let mut p = Pipe::new(&conn, OrderingMode::Atomic);
    let largest = units.iter().map(Vec::len).max().unwrap_or(1) as u64;
    let bits = (0..BITSTREAMS)
        .map(|_| conn.alloc_blob(largest).map(|r| r.id))
        .collect::<Result<Vec<_>, _>>()?;
    let t_open = Instant::now();
    let t = p.run(&api::codec::OpenDecoder {
        kind: api::codec_kind::H264,
        format: Format::Nv12 as u64,
        threads: 0,
    })?;
    let handle = p.result(t)?.handle;
    let open_ms = t_open.elapsed().as_secs_f64() * 1e3;
    let player = Player {
        conn: &conn,
        handle,
        bits: &bits,
        frame,
        separate,
    };
    let media = |e: virtsoc_media::MediaError| CliError::Usage(format!("native decode: {e}"));
    let mut native = FfmpegDecoder::new(CodecKind::H264, PixelFormat::Yuv420p, DEFAULT_THREADS)
        .map_err(media)?;
    native.hold_pictures(true);
    // The warm-up pass of each (see the module's notes), untimed; it also tells how many
    // times the clip is decoded in a timed pass.
    let warm = player.pass(units, daemon)?;
    native_decode(&mut native, units)?;
    let timed = repeated(units, warm.fps);
    let (mut runs, mut natives) = (Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        runs.push(player.pass(&timed, daemon)?);
        natives.push(native_decode(&mut native, &timed)?);
    }
    drop(native);
    let mut ring = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let r = p.run(&api::codec::StreamInfo { handle })?;
        p.result(r)?;
        ring.push(t.elapsed().as_secs_f64() * 1e6);
    }
    p.run(&api::codec::Close { handle })?;
    for id in bits {
        conn.free(id)?;
    }
    let rounds: Vec<RoundFps> = runs
        .iter()
        .zip(&natives)
        .map(|(r, n)| RoundFps {
            decode_fps: r.fps,
            native_decode_fps: n.0,
            ratio: r.fps / n.0.max(1e-9),
        })
        .collect();
    let ratio = median(&rounds.iter().map(|r| r.ratio).collect::<Vec<_>>());
    runs.sort_by(|a, b| a.fps.total_cmp(&b.fps));
    natives.sort_by(|a, b| a.0.total_cmp(&b.0));
    let run = runs.swap_remove(runs.len() / 2);
    let (native_fps, native_cpu, native_slices) = natives[natives.len() / 2];
    let mut stages = run.stages;
    stages.native_decode = 1e6 / native_fps.max(1e-9);
    stages.native_cpu = native_cpu;
    stages.switches.native = native_slices;
    stages.ring_us = percentile(&ring, 50.0);
    Ok(DecodeNumbers {
        clip: clip.to_string(),
        frames: run.frames,
        decode_fps: run.fps,
        native_decode_fps: native_fps,
        ratio,
        rounds,
        open_ms,
        stages,
    })
}

/// Seconds a timed pass lasts at least (as far as [`MAX_REPEATS`] allows): a pass of a few
/// hundred milliseconds moves by 10-30% with a scheduler's burst on 2 cores.
const PASS_SECONDS: f64 = 1.0;
/// Most times a timed pass decodes the clip.
const MAX_REPEATS: usize = 16;

/// `units` (borrowed, not copied) decoded back to back as many times as make a pass of [`PASS_SECONDS`] at `fps`
/// (the warm-up's rate). A clip starts with an IDR picture, so each repetition is a stream
/// of its own that the decoder starts afresh, as after a seek.
fn repeated(units: &[Vec<u8>], fps: f64) -> Vec<&[u8]> {
    let per_pass = units.len().max(1) as f64;
    let reps = (PASS_SECONDS * fps / per_pass).ceil();
    let reps = if reps.is_finite() { reps as usize } else { 1 };
    let n = reps.clamp(1, MAX_REPEATS);
    units
        .iter()
        .cycle()
        .take(units.len() * n)
        .map(Vec::as_slice)
        .collect()
}

/// One decode of a clip through the daemon.
struct Run {
    frames: u64,
    fps: f64,
    stages: Stages,
}

/// A decoder opened through the daemon, its bitstream regions and the NV12 region it
/// receives into.
struct Player<'a> {
    conn: &'a Connection,
    handle: HandleId,
    bits: &'a [RegionId],
    frame: RegionId,
    /// Each region's accesses as requests of their own ([`queue`]).
    separate: bool,
}

impl Player<'_> {
    /// Decodes `units` once (see the module's notes), flushing at the end (which resets the
    /// decoder for the next pass); the stages of a frame but native's and the ring's.
    fn pass<U: AsRef<[u8]>>(&self, units: &[U], daemon: Option<u32>) -> Result<Run, CliError> {
        let Player {
            conn,
            handle,
            bits,
            frame,
            separate,
        } = *self;
        let mut p = Pipe::new(conn, OrderingMode::Atomic);
        let p = &mut p;
        let receive = api::codec::ReceiveFrame { handle, frame };
        let (copied0, cpu0) = (copied_bytes(conn)?, Cpu::now(daemon));
        let t0 = Instant::now();
        let mut decodes: VecDeque<u64> = VecDeque::new();
        let mut receives: VecDeque<u64> = VecDeque::new();
        let mut decoded = 0;
        for (i, unit) in units.iter().enumerate() {
            let unit = unit.as_ref();
            let slot = i % BITSTREAMS;
            if decodes.len() >= BITSTREAMS {
                // The decode that read this region: done before it is written again.
                if let Some(seq) = decodes.pop_front() {
                    check_completion(&conn.wait(seq)?, "decode")?;
                }
            }
            conn.write_posted(bits[slot], 0, unit)?;
            decodes.push_back(queue(
                conn,
                &api::codec::Decode {
                    handle,
                    bitstream: bits[slot],
                    len: unit.len() as u64,
                    pts: i as u64,
                },
                separate,
            )?);
            if i >= LAG {
                receives.push_back(queue(conn, &receive, separate)?);
            }
            while receives.len() > 2 * BITSTREAMS {
                if let Some(seq) = receives.pop_front() {
                    decoded += got(conn, seq)?;
                }
            }
        }
        for seq in decodes.drain(..) {
            check_completion(&conn.wait(seq)?, "decode")?;
        }
        for seq in receives.drain(..) {
            decoded += got(conn, seq)?;
        }
        let t = p.run(&api::codec::Flush { handle })?;
        p.result(t)?;
        loop {
            let n = got(conn, queue(conn, &receive, separate)?)?;
            if n == 0 {
                break;
            }
            decoded += n;
        }
        let elapsed = t0.elapsed();
        let (copied1, cpu1) = (copied_bytes(conn)?, Cpu::now(daemon));
        check_async_errors(conn)?;
        let n = decoded.max(1) as f64;
        let per = |ns: u64| ns as f64 / 1e3 / n;
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let frame_bytes = conn.region(frame).map_or(1, |r| r.size).max(1) as f64;
        let (w, d, g) = (
            cpu1.workers.since(cpu0.workers),
            cpu1.daemon.since(cpu0.daemon),
            cpu1.guest.since(cpu0.guest),
        );
        let (worker, daemon_ns, guest) = (per(w.ns), per(d.ns), per(g.ns));
        let slices = |r: Ran| r.slices as f64 / n;
        Ok(Run {
            frames: decoded,
            fps: decoded as f64 / elapsed.as_secs_f64(),
            stages: Stages {
                total: elapsed.as_secs_f64() * 1e6 / n,
                worker_cpu: worker,
                daemon_cpu: daemon_ns,
                guest_cpu: guest,
                cores,
                cpu_floor: (worker + daemon_ns + guest) / cores as f64,
                frame_copies: copied1.saturating_sub(copied0) as f64 / frame_bytes / n,
                switches: Switches {
                    worker: slices(w),
                    daemon: slices(d),
                    guest: slices(g),
                    native: 0.0,
                },
                ..Stages::default()
            },
        })
    }
}

/// libavcodec alone on `units`, as a worker runs it (one H.264 decoder with the daemon's
/// default threads, pictures left in its buffers), flushed at the end (which resets it for
/// the next pass): frames per second, the CPU microseconds per frame its threads ran and
/// their timeslices per frame.
fn native_decode<U: AsRef<[u8]>>(
    d: &mut FfmpegDecoder,
    units: &[U],
) -> Result<(f64, f64, f64), CliError> {
    let media = |e: virtsoc_media::MediaError| CliError::Usage(format!("native decode: {e}"));
    let me = std::process::id();
    let (cpu0, t0) = (run_of(me), Instant::now());
    let mut n = 0;
    for (i, u) in units.iter().enumerate() {
        n += d.decode(u.as_ref(), i as i64).map_err(media)?.len();
    }
    n += d.flush().map_err(media)?.len();
    let fps = n as f64 / t0.elapsed().as_secs_f64();
    let used = run_of(me).since(cpu0);
    let n = n.max(1) as f64;
    Ok((fps, used.ns as f64 / 1e3 / n, used.slices as f64 / n))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU time and timeslices of a process's threads come from `schedstat`: this
    /// process's grow as it spins and sleeps; a process that does not exist has none.
    #[test]
    fn a_process_s_run_time_and_timeslices_come_from_schedstat() {
        let me = std::process::id();
        let a = run_of(me);
        assert!(a.ns > 0 && a.slices > 0, "{a:?}");
        let t = Instant::now();
        while run_of(me).since(a).ns < 2_000_000 {
            assert!(t.elapsed().as_secs() < 10, "no CPU time counted");
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert!(run_of(me).since(a).slices >= 1);
        let none = run_of(u32::MAX);
        assert_eq!((none.ns, none.slices), (0, 0));
    }

    #[test]
    fn a_timed_pass_repeats_the_clip_to_last_a_second_within_bounds() {
        let units = vec![vec![1u8], vec![2u8]];
        // 10 fps, 2 units: 5 repetitions make a second.
        let r = repeated(&units, 10.0);
        assert_eq!(r.len(), 10);
        assert_eq!(r[2], &[1u8][..], "the clip again from its start");
        assert_eq!(repeated(&units, 1.0).len(), 2, "at least once");
        assert_eq!(repeated(&units, 1e9).len(), 2 * MAX_REPEATS);
        assert_eq!(repeated(&units, f64::NAN).len(), 2);
        assert_eq!(repeated(&units, f64::INFINITY).len(), 2);
    }
}
