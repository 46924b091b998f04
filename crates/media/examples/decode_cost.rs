//! Where decoding through a worker process loses against libavcodec alone, without the
//! daemon or a guest: one clip decoded back to back (repeated to about 600 frames a pass)
//! by three decoders with the same threads, in turn each round so that a change of the
//! machine's speed hits all three alike:
//!
//! - `inproc`: libavcodec in this process, pictures left in its own buffers;
//! - `shared`: libavcodec in this process writing into shared memfd buffers through the
//!   `get_buffer2` a decoder worker installs ([`FfmpegDecoder::new_shared_buffers`]);
//! - `worker`: a [`ProcessDecoder`] in a sandboxed worker of this program, packets
//!   submitted up to `IN_FLIGHT` ahead ([`MAX_IN_FLIGHT`], as the codec device does, unless
//!   given), every picture collected. The worker learns that a picture's buffer is free
//!   with the next packet it reads, so the deeper the queue, the more buffers its decoder
//!   writes in turn (with 2 threads at 1080p: 3 with 2 in flight, 5 with 4).
//!
//! Per pass: frames per second, CPU time per frame (this process, plus the worker's for
//! `worker`) and context switches per frame (voluntary + involuntary, every thread); at the
//! end each mode's median rate and its ratio to `inproc`.
//!
//! `cargo run --release -p virtsoc-media --example decode_cost -- CLIP.h264 [ROUNDS] [THREADS]
//! [IN_FLIGHT]`
//! (the example is also its own worker: `decode_cost --codec-worker`).

use std::time::Instant;

use virtsoc_media::codec::serve_decoder;
use virtsoc_media::{
    DecoderBackend, Demuxer, FfmpegDecoder, PixelFormat, ProcessDecoder, WorkerPool, MAX_IN_FLIGHT,
};

const CODEC_WORKER_ARG: &str = "--codec-worker";

/// About how many frames a pass decodes (the clip repeated, at most 16 times).
const PASS_FRAMES: usize = 600;

/// CPU time (ns) of process `pid`, every thread, from `/proc/PID/stat`.
fn cpu_ns(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let ticks: u64 = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks * 1_000_000_000 / hz
}

/// Context switches (voluntary + involuntary) of every thread of process `pid`.
fn switches(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    let mut total = 0;
    for e in dir.flatten() {
        let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        total += status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    total
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One pass of `packets` through `dec`: (frames out, seconds).
fn pass(
    dec: &mut dyn DecoderBackend,
    packets: &[&[u8]],
    in_flight: usize,
) -> Result<(usize, f64), Box<dyn std::error::Error>> {
    let t = Instant::now();
    let mut frames = 0;
    for (i, p) in packets.iter().enumerate() {
        frames += dec.submit(p, i as i64)?.len();
        if dec.in_flight() >= in_flight {
            frames += dec.collect(true)?.len();
        }
    }
    frames += dec.flush()?.len();
    Ok((frames, t.elapsed().as_secs_f64()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(CODEC_WORKER_ARG) {
        return Ok(serve_decoder()?);
    }
    let clip = args
        .first()
        .ok_or("usage: decode_cost CLIP.h264 [ROUNDS] [THREADS] [IN_FLIGHT]")?;
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let threads: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2);
    let in_flight: usize = args
        .get(3)
        .and_then(|a| a.parse().ok())
        .unwrap_or(MAX_IN_FLIGHT)
        .clamp(1, MAX_IN_FLIGHT);
    let mut demux = Demuxer::open(clip)?;
    let mut units = Vec::new();
    while let Some(p) = demux.read_packet()? {
        units.push(p.data);
    }
    let repeats = PASS_FRAMES.div_ceil(units.len().max(1)).clamp(1, 16);
    let packets: Vec<&[u8]> = (0..repeats)
        .flat_map(|_| units.iter().map(Vec::as_slice))
        .collect();
    let kind = demux.info().codec.ok_or("not a codec virtsoc decodes")?;
    let exe = std::env::current_exe()?;
    let pool = WorkerPool::new(&exe, &[CODEC_WORKER_ARG.to_string()], 1);
    let mut worker = ProcessDecoder::open(&pool, kind, PixelFormat::Nv12, threads)?;
    let wpid = worker.pid();
    let mut inproc = FfmpegDecoder::for_stream(demux.info(), PixelFormat::Nv12, threads)?;
    inproc.hold_pictures(true);
    let mut shared = FfmpegDecoder::new_shared_buffers(kind, PixelFormat::Nv12, threads)?;
    shared.hold_pictures(true);
    let me = std::process::id();
    // (name, decoder, whether its work is in the worker)
    let mut decs: Vec<(&str, &mut dyn DecoderBackend, bool)> = vec![
        ("inproc", &mut inproc, false),
        ("shared", &mut shared, false),
        ("worker", &mut worker, true),
    ];
    for (_, d, _) in decs.iter_mut() {
        pass(&mut **d, &packets, in_flight)?;
    }
    let load = || std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{} frames a pass, {threads} threads, {in_flight} in flight; load {}",
        packets.len(),
        load().trim()
    );
    println!("per pass: fps, CPU us per frame, context switches per frame");
    let mut fps = vec![Vec::new(); decs.len()];
    for r in 0..rounds {
        let mut line = format!("round {r:2}");
        for (k, (name, d, in_worker)) in decs.iter_mut().enumerate() {
            let other = if *in_worker { wpid } else { 0 };
            let (c0, w0, s0, t0) = (cpu_ns(me), cpu_ns(other), switches(me), switches(other));
            let (n, secs) = pass(&mut **d, &packets, in_flight)?;
            let (c1, w1, s1, t1) = (cpu_ns(me), cpu_ns(other), switches(me), switches(other));
            let per = |x: u64| x as f64 / n.max(1) as f64;
            line += &format!(
                "  {name} {:6.1} {:5.0} {:4.1}",
                n as f64 / secs,
                per(c1 - c0 + w1 - w0) / 1e3,
                per(s1 - s0 + t1 - t0),
            );
            fps[k].push(n as f64 / secs);
        }
        println!("{line}");
    }
    let m: Vec<f64> = fps.into_iter().map(median).collect();
    println!(
        "median fps: inproc {:.1}, shared {:.1} ({:.3}x), worker {:.1} ({:.3}x); load {}",
        m[0],
        m[1],
        m[1] / m[0],
        m[2],
        m[2] / m[0],
        load().trim()
    );
    Ok(())
}
