//! The decoder in a worker process: the same pictures as in process, and a worker killed
//! mid-stream (as a crash in libavcodec would end it) is a decode error for that decoder
//! alone, never for the process that owns it.
//!
//! The worker is this test binary run again with the `worker_main` filter and a socket as
//! stdin: `worker_main` serves the decoder then and passes trivially otherwise.

mod common;

use std::path::PathBuf;

use common::{gen_clip, TempDir};
use virtsoc_media::codec::{serve_decoder, EncodedPacket};
use virtsoc_media::{
    CodecKind, DecodedFrame, DecoderBackend, DecoderPool, Demuxer, EncoderBackend, EncoderPreset,
    FfmpegDecoder, FfmpegEncoder, FrameLayout, FrameRef, MediaError, PixelFormat, ProcessDecoder,
    ProcessEncoder,
};

#[test]
fn worker_main() {
    if common::stdin_is_socket() {
        common::exit_with(serve_decoder());
    }
}

/// Run again with `VIRTSOC_SANDBOX_PROBE` set: enters the sandbox, then tries what it
/// forbids (`1`: files and a socket; else one thing a compromised worker would try).
#[test]
fn sandbox_probe() {
    let Some(what) = std::env::var("VIRTSOC_SANDBOX_PROBE").ok() else {
        return;
    };
    // The daemon is the parent (asked before the sandbox, which does not allow asking).
    let parent = rustix::process::getppid().map_or(1, |p| p.as_raw_nonzero().get());
    virtsoc_media::codec::sandbox::enter().unwrap();
    // Threads, as libavcodec starts them, still work.
    std::thread::spawn(|| eprintln!("thread ran"))
        .join()
        .unwrap();
    eprintln!("uid {}", rustix::process::geteuid().as_raw());
    let me = std::process::id() as i32;
    match what.as_str() {
        "fork" => {
            // SAFETY: a raw system call with integer arguments (null pointers where it takes
            // any); it touches no memory of this process.
            let r = unsafe { libc::fork() };
            eprintln!("fork answered {r}");
        }
        "clone-process" => {
            // SAFETY: a raw system call with integer arguments (null pointers where it takes
            // any); it touches no memory of this process.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_clone,
                    libc::SIGCHLD as u64,
                    0u64,
                    0u64,
                    0u64,
                    0u64,
                )
            };
            eprintln!("clone of a process answered {r}");
        }
        "prctl" => {
            // SAFETY: a raw system call with integer arguments (null pointers where it takes
            // any); it touches no memory of this process.
            let r = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1u64, 0u64, 0u64, 0u64) };
            let e = std::io::Error::last_os_error();
            eprintln!("prctl answered {r} ({e})");
        }
        "kill" => {
            // Signal 0 checks permission only: nothing is delivered if it were allowed.
            // SAFETY: a raw system call with integer arguments (null pointers where it takes
            // any); it touches no memory of this process.
            let r = unsafe { libc::kill(parent, 0) };
            eprintln!("kill answered {r}");
        }
        "tgkill-own" => {
            // SAFETY: a raw system call with integer arguments (null pointers where it takes
            // any); it touches no memory of this process.
            let r = unsafe { libc::syscall(libc::SYS_tgkill, me, me, 0) };
            eprintln!("tgkill of its own thread answered {r}");
        }
        "tgkill" => {
            // SAFETY: a raw system call with integer arguments (null pointers where it takes
            // any); it touches no memory of this process.
            let r = unsafe { libc::syscall(libc::SYS_tgkill, parent, parent, 0) };
            eprintln!("tgkill answered {r}");
        }
        "ptrace" => {
            // SAFETY: a raw system call with integer arguments (null pointers where it takes
            // any); it touches no memory of this process.
            let r = unsafe {
                libc::ptrace(
                    libc::PTRACE_PEEKDATA,
                    parent,
                    std::ptr::null_mut::<libc::c_void>(),
                    std::ptr::null_mut::<libc::c_void>(),
                )
            };
            eprintln!("ptrace answered {r}");
        }
        _ => {
            match std::fs::File::open("/etc/hostname") {
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    eprintln!("open refused")
                }
                other => eprintln!("open answered {other:?}"),
            }
            if !rustix::process::geteuid().is_root() {
                eprintln!("not root");
            }
            // A socket: the filter kills the process here.
            let _ = std::net::UdpSocket::bind("127.0.0.1:0");
            eprintln!("socket allowed");
        }
    }
    // Leave without exit handlers: the sandboxed process ran one of them into a SIGSEGV once
    // (a fresh-clone make test, after "prctl answered -1"), and what the probe reports is on
    // stderr already (unbuffered).
    // SAFETY: _exit ends the process at once; nothing runs after it.
    unsafe { libc::_exit(0) }
}

/// Runs `sandbox_probe` with `what`: its exit status and what it printed.
fn probe(what: &str) -> (std::process::ExitStatus, String) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "sandbox_probe",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("VIRTSOC_SANDBOX_PROBE", what)
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_sandbox_refuses_files_and_kills_on_sockets() {
    use std::os::unix::process::ExitStatusExt;
    let (status, err) = probe("1");
    assert!(err.contains("open refused"), "{err}");
    assert!(err.contains("not root"), "{err}");
    assert!(!err.contains("socket allowed"), "{err}");
    assert_eq!(status.signal(), Some(libc::SIGSYS), "{status:?}: {err}");
}

/// What a compromised worker would try next - a new process, a changed process attribute,
/// a signal to or a trace of its daemon - is stopped: the worker is killed, or refused.
/// Threads keep working, and a root daemon's workers run as a user of their own.
#[test]
fn a_compromised_worker_cannot_fork_signal_trace_or_reconfigure() {
    use std::os::unix::process::ExitStatusExt;
    for what in ["fork", "clone-process", "kill", "tgkill", "ptrace"] {
        let (status, err) = probe(what);
        assert!(
            err.contains("thread ran"),
            "{what}: threads must work: {err}"
        );
        assert_eq!(
            status.signal(),
            Some(libc::SIGSYS),
            "{what} was not stopped: {status:?}: {err}"
        );
    }
    let (status, err) = probe("prctl");
    assert!(status.success(), "{status:?}: {err}");
    assert!(
        err.contains("prctl answered -1"),
        "prctl(PR_SET_DUMPABLE) allowed: {err}"
    );
    let (status, err) = probe("tgkill-own");
    assert!(status.success(), "{status:?}: {err}");
    assert!(err.contains("answered 0"), "{err}");
    if rustix::process::geteuid().is_root() {
        let want = virtsoc_media::codec::sandbox::worker_uid(std::process::id());
        assert!(err.contains(&format!("uid {want}")), "{err}");
    }
}

fn worker(threads: usize) -> ProcessDecoder {
    worker_for(CodecKind::H264, threads)
}

fn worker_pool() -> std::sync::Arc<DecoderPool> {
    let exe: PathBuf = std::env::current_exe().unwrap();
    let args: Vec<String> = [
        "--exact",
        "worker_main",
        "--nocapture",
        "--test-threads",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    DecoderPool::new(&exe, &args, 0)
}

fn worker_for(kind: CodecKind, threads: usize) -> ProcessDecoder {
    ProcessDecoder::open(&worker_pool(), kind, PixelFormat::Nv12, threads).unwrap()
}

/// What a picture is, pixels included, wherever its bytes are.
fn seen(f: &DecodedFrame) -> (FrameLayout, i64, bool, (u32, u32), Vec<u8>) {
    (
        f.layout,
        f.pts,
        f.corrupt,
        f.picture_size,
        f.as_frame().data.to_vec(),
    )
}

fn packets(dir: &TempDir) -> Vec<(Vec<u8>, i64)> {
    let p = gen_clip(
        dir.path(),
        "w.h264",
        320,
        240,
        20,
        &["-c:v", "libx264", "-pix_fmt", "yuv420p", "-f", "h264"],
    );
    let mut d = Demuxer::open(&p).unwrap();
    let mut out = Vec::new();
    while let Some(p) = d.read_packet().unwrap() {
        out.push((p.data, p.pts));
    }
    out
}

#[test]
fn a_worker_decodes_what_the_process_decodes() {
    let dir = TempDir::new("worker-same");
    let pkts = packets(&dir);
    let mut local = FfmpegDecoder::new(CodecKind::H264, PixelFormat::Nv12, 2).unwrap();
    let mut remote = worker(2);
    assert!(
        remote.name().starts_with("worker-h264"),
        "{}",
        remote.name()
    );
    let (mut a, mut b) = (Vec::new(), Vec::new());
    assert_eq!(
        local.cpu_ns(),
        None,
        "a decoder in this process is not metered apart"
    );
    let mut cpu = remote.cpu_ns().unwrap();
    for (p, pts) in &pkts {
        a.extend(local.decode(p, *pts).unwrap());
        b.extend(remote.decode(p, *pts).unwrap());
        // The worker's CPU time so far, as the kernel counts it: it only grows.
        let now = remote.cpu_ns().unwrap();
        assert!(now >= cpu, "{now} < {cpu}");
        cpu = now;
    }
    a.extend(local.flush().unwrap());
    b.extend(remote.flush().unwrap());
    assert!(
        remote.cpu_ns().unwrap() > 0,
        "20 pictures decoded in no CPU time"
    );
    assert_eq!(a.len(), 20);
    assert!(
        b.iter().all(|f| !f.is_held() && f.data.is_empty()),
        "pictures come in shared buffers"
    );
    let a: Vec<_> = a.iter().map(seen).collect();
    let b: Vec<_> = b.iter().map(seen).collect();
    assert!(a == b, "the same pictures, flags and sizes");
}

/// Packets fed without waiting for their pictures (several in the worker at once) give
/// the same pictures, in the same order, as packets decoded one call at a time; never more
/// than `MAX_IN_FLIGHT` are in flight. Each is fed through the packet ring and, again, in
/// the calls themselves. The second clip is lossless noise: its packets are larger than
/// the socket takes at once (about 200 KiB), so in a call a packet's rest is sent after the
/// answers due are read.
#[test]
fn packets_in_flight_give_the_pictures_of_one_at_a_time() {
    let dir = TempDir::new("worker-in-flight");
    in_flight_matches_one_at_a_time(&packets(&dir), 20);
    let big = gen_clip(
        dir.path(),
        "lossless.h264",
        1280,
        720,
        8,
        &[
            "-vf",
            "noise=alls=60:allf=t",
            "-c:v",
            "libx264",
            "-qp",
            "0",
            "-pix_fmt",
            "yuv420p",
            "-f",
            "h264",
        ],
    );
    let mut d = Demuxer::open(&big).unwrap();
    let mut pkts = Vec::new();
    while let Some(p) = d.read_packet().unwrap() {
        pkts.push((p.data, p.pts));
    }
    assert!(
        pkts.iter().all(|(p, _)| p.len() > 512 << 10),
        "packets larger than a socket's buffer: {:?}",
        pkts.iter().map(|(p, _)| p.len()).collect::<Vec<_>>()
    );
    in_flight_matches_one_at_a_time(&pkts, 8);
}

fn in_flight_matches_one_at_a_time(pkts: &[(Vec<u8>, i64)], n: usize) {
    let mut one = worker(2);
    let mut a = Vec::new();
    for (p, pts) in pkts {
        a.extend(one.decode(p, *pts).unwrap());
    }
    a.extend(one.flush().unwrap());
    assert_eq!(a.len(), n);
    let a: Vec<_> = a.iter().map(seen).collect();
    for ring in [true, false] {
        let mut piped = worker(2);
        if !ring {
            piped.packets_in_calls();
        }
        let (mut b, mut most) = (Vec::new(), 0);
        for (p, pts) in pkts {
            b.extend(piped.submit(p, *pts).unwrap());
            assert!(piped.in_flight() <= virtsoc_media::MAX_IN_FLIGHT);
            most = most.max(piped.packets_in_ring());
        }
        while piped.in_flight() > 0 {
            b.extend(piped.collect(true).unwrap());
        }
        b.extend(piped.flush().unwrap());
        let b: Vec<_> = b.iter().map(seen).collect();
        assert!(
            a == b,
            "the same pictures, in the same order (ring: {ring})"
        );
        assert!(piped.take_failures().is_empty());
        // Through the ring, libavcodec lets packets go as it decodes them: at the end no more
        // are held than its frame threads keep.
        assert_eq!(most > 0, ring, "packets in the ring: {most}");
        assert!(
            piped.packets_in_ring() <= 3,
            "{} held",
            piped.packets_in_ring()
        );
    }
}

#[test]
fn a_killed_worker_is_an_error_for_its_decoder_only() {
    let dir = TempDir::new("worker-kill");
    let pkts = packets(&dir);
    let mut d = worker(1);
    for (p, pts) in &pkts[..5] {
        d.decode(p, *pts).unwrap();
    }
    // A crash: the worker ends without a word.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &d.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    for (p, pts) in &pkts[5..8] {
        match d.decode(p, *pts) {
            Err(MediaError::Decode(why)) => {
                assert!(why.contains("decoder process"), "{why}")
            }
            other => panic!("a dead worker answered {other:?}"),
        }
    }
    assert!(matches!(d.flush(), Err(MediaError::Decode(_))));
    assert_eq!(
        d.cpu_ns(),
        None,
        "a reaped worker's clock is not read (its pid may be another process's)"
    );
    // This process goes on: a new worker decodes the stream.
    let mut again = worker(1);
    let mut n = 0;
    for (p, pts) in &pkts {
        n += again.decode(p, *pts).unwrap().len();
    }
    n += again.flush().unwrap().len();
    assert_eq!(n, 20);
}

/// Every codec decodes in the sandbox (its seccomp filter kills a worker on any system call
/// it does not allow) with frame threads, and gives the pixels decoding in process gives,
/// converted ones (4:2:2 and 10-bit to NV12) included.
#[test]
fn every_codec_decodes_in_the_sandboxed_worker() {
    let dir = TempDir::new("worker-codecs");
    let mut clips = vec![
        (
            CodecKind::H264,
            "a.h264",
            vec!["-c:v", "libx264", "-pix_fmt", "yuv422p"],
        ),
        (
            CodecKind::Hevc,
            "b.hevc",
            vec!["-c:v", "libx265", "-pix_fmt", "yuv420p10le", "-f", "hevc"],
        ),
    ];
    if common::has_encoder("libvpx-vp9") {
        clips.push((
            CodecKind::Vp9,
            "c.webm",
            vec!["-c:v", "libvpx-vp9", "-deadline", "realtime"],
        ));
    }
    if common::has_encoder("libsvtav1") {
        clips.push((
            CodecKind::Av1,
            "d.ivf",
            vec!["-c:v", "libsvtav1", "-preset", "12", "-pix_fmt", "yuv420p"],
        ));
    }
    for (kind, file, args) in clips {
        let clip = gen_clip(dir.path(), file, 320, 240, 12, &args);
        let mut demux = Demuxer::open(&clip).unwrap();
        let mut local = FfmpegDecoder::new(kind, PixelFormat::Nv12, 2).unwrap();
        let mut remote = worker_for(kind, 2);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        while let Some(p) = demux.read_packet().unwrap() {
            a.extend(local.decode(&p.data, p.pts).unwrap());
            b.extend(remote.decode(&p.data, p.pts).unwrap());
        }
        a.extend(local.flush().unwrap());
        b.extend(remote.flush().unwrap());
        assert_eq!(a.len(), 12, "{kind:?}");
        let a: Vec<_> = a.iter().map(seen).collect();
        let b: Vec<_> = b.iter().map(seen).collect();
        assert!(a == b, "{kind:?}: the same pictures");
    }
}

/// A worker that cannot be started is a resource error for that decoder (the codec device
/// answers `Busy`), not a failure of the process.
#[test]
fn a_worker_that_cannot_start_is_a_resource_error() {
    let pool = DecoderPool::new(std::path::Path::new("/nonexistent/virtsocd"), &[], 1);
    assert_eq!(pool.waiting(), 0);
    match ProcessDecoder::open(&pool, CodecKind::H264, PixelFormat::Nv12, 1) {
        Err(MediaError::Resources(why)) => assert!(why.contains("cannot start"), "{why}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a decoder without a worker"),
    }
}

/// A moving NV12 test frame `i` of 320x240.
fn nv12_frame(i: usize) -> (FrameLayout, Vec<u8>) {
    let l = FrameLayout::packed(PixelFormat::Nv12, 320, 240).unwrap();
    let data = (0..l.size())
        .map(|k| ((k % 320 + k / 320 + 3 * i) & 0xff) as u8)
        .collect();
    (l, data)
}

/// Every packet of `n` frames and the flush.
fn encode_all(e: &mut dyn EncoderBackend, n: usize) -> Vec<EncodedPacket> {
    let mut out = Vec::new();
    for i in 0..n {
        let (l, data) = nv12_frame(i);
        out.extend(
            e.encode(FrameRef::new(l, &data).unwrap(), i as i64)
                .unwrap(),
        );
    }
    out.extend(e.flush().unwrap());
    out
}

fn encoder(pool: &std::sync::Arc<DecoderPool>) -> ProcessEncoder {
    ProcessEncoder::open(pool, (320, 240), (30, 400_000), EncoderPreset::Veryfast).unwrap()
}

/// libx264 in the sandboxed worker gives the packets it gives in process, byte for byte.
#[test]
fn a_worker_encodes_what_the_process_encodes() {
    let mut here =
        FfmpegEncoder::new_h264_with(320, 240, 30, 400_000, EncoderPreset::Veryfast).unwrap();
    let mut there = encoder(&worker_pool());
    assert_eq!(
        EncoderBackend::name(&there),
        format!("worker-{}", here.name())
    );
    let (a, b) = (encode_all(&mut here, 12), encode_all(&mut there, 12));
    assert_eq!(a.len(), 12);
    assert!(a[0].keyframe);
    assert!(a == b, "the same packets in process and in the worker");
}

#[test]
fn a_killed_encoder_worker_is_an_error_for_its_encoder_only() {
    let pool = worker_pool();
    let mut e = encoder(&pool);
    let (l, data) = nv12_frame(0);
    e.encode(FrameRef::new(l, &data).unwrap(), 0).unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &e.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    for pts in 1..3 {
        match e.encode(FrameRef::new(l, &data).unwrap(), pts) {
            Err(MediaError::Encode(why)) => assert!(why.contains("encoder process"), "{why}"),
            other => panic!("a dead worker answered {other:?}"),
        }
    }
    // A frame of another size is refused in the parent, a new encoder works.
    let small = FrameLayout::packed(PixelFormat::Nv12, 16, 16).unwrap();
    let mut fresh = encoder(&pool);
    assert!(matches!(
        fresh.encode(FrameRef::new(small, &vec![0; small.size()]).unwrap(), 0),
        Err(MediaError::InvalidLayout(_))
    ));
    assert_eq!(encode_all(&mut fresh, 3).len(), 3);
}

/// A frame started in the worker (`start`, the codec device's waiter path) and finished
/// later gives the packets `encode` gives; while it is out, the worker's socket is there to
/// wait on and a second frame is refused.
#[test]
fn frames_started_and_finished_give_what_encode_gives() {
    let mut here =
        FfmpegEncoder::new_h264_with(320, 240, 30, 400_000, EncoderPreset::Veryfast).unwrap();
    let mut there = encoder(&worker_pool());
    assert!(there.finish().unwrap().is_empty(), "nothing started");
    let mut started = Vec::new();
    for i in 0..12 {
        let (l, data) = nv12_frame(i);
        let frame = FrameRef::new(l, &data).unwrap();
        assert!(there.start(frame, i as i64).unwrap());
        assert!(there.started() && there.answers_fd().is_some());
        assert!(there.start(frame, i as i64).is_err(), "one frame at a time");
        started.extend(there.finish().unwrap());
        assert!(!there.started() && there.answers_fd().is_none());
    }
    started.extend(there.flush().unwrap());
    assert!(encode_all(&mut here, 12) == started, "the same packets");
}

/// Packets of a one-thread decoder started in the worker (`start`, the codec device's
/// waiter path) and finished later give the pictures `decode` gives, in the same calls; a
/// packet that fails outright fails its own `finish`, as it fails its own `decode`. While a
/// packet is out the worker's socket is there to wait on, `collect` leaves its answer to
/// `finish`, and a decoder with frame threads starts nothing (its `submit` does not wait).
#[test]
fn packets_started_and_finished_give_what_decode_gives() {
    let dir = TempDir::new("worker-start");
    let mut pkts = packets(&dir);
    // Bytes with no NAL start code, which libavcodec fails outright.
    let junk: Vec<u8> = (0..3000u32).map(|x| (x * 7 + 0xa5) as u8 | 0x80).collect();
    pkts.insert(7, (junk, 1000));
    let mut here = worker(1);
    let mut there = worker(1);
    assert!(there.finish().unwrap().is_empty(), "nothing started");
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let (mut failed_here, mut failed_there) = (Vec::new(), Vec::new());
    for (i, (p, pts)) in pkts.iter().enumerate() {
        match here.decode(p, *pts) {
            Ok(f) => a.push(f),
            Err(_) => {
                a.push(Vec::new());
                failed_here.push(i);
            }
        }
        assert!(there.start(p, *pts).unwrap());
        assert!(there.started() && there.answers_fd().is_some());
        assert_eq!(there.in_flight(), 1);
        assert!(!there.start(p, *pts).unwrap(), "one packet at a time");
        let mut got = there.collect(false).unwrap();
        assert!(there.started(), "collect took the started packet's answer");
        match there.finish() {
            Ok(f) => got.extend(f),
            Err(e) => {
                assert!(e.to_string().contains("Invalid data"), "{e}");
                failed_there.push(i);
            }
        }
        assert!(!there.started() && !there.would_wait());
        b.push(got);
    }
    assert_eq!(failed_here, [7]);
    assert_eq!(failed_there, [7], "the junk packet fails its own finish");
    assert!(there.take_failures().is_empty(), "nothing reported later");
    a.push(here.flush().unwrap());
    b.push(there.flush().unwrap());
    let a: Vec<Vec<_>> = a.iter().map(|c| c.iter().map(seen).collect()).collect();
    let b: Vec<Vec<_>> = b.iter().map(|c| c.iter().map(seen).collect()).collect();
    assert_eq!(a.iter().map(Vec::len).sum::<usize>(), 20);
    assert!(a == b, "the same pictures from the same calls");

    // A caller that waits for pictures meanwhile reads the started packet's answer (its
    // pictures; its failure, were it one, reported later), and nothing is left to finish.
    assert!(there.start(&pkts[1].0, 1).unwrap());
    let _ = there.collect(true).unwrap();
    assert!(!there.started() && there.in_flight() == 0);
    assert!(there.finish().unwrap().is_empty());

    let mut threaded = worker(2);
    assert!(!threaded.start(&pkts[0].0, 0).unwrap(), "frame threads");
    assert!(!threaded.started() && threaded.in_flight() == 0);
}

/// A flush sent behind the packets in flight (`start_flush`, the codec device's waiter
/// path) gives, once `would_wait` says its answers have all come, what `flush` gives, with
/// one decoding thread and with frame threads.
#[test]
fn a_flush_started_and_finished_gives_what_flush_gives() {
    let dir = TempDir::new("worker-flush");
    let pkts = packets(&dir);
    for threads in [1, 3] {
        let (mut here, mut there) = (worker(threads), worker(threads));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for (p, pts) in &pkts {
            a.extend(here.submit(p, *pts).unwrap());
            b.extend(there.submit(p, *pts).unwrap());
        }
        a.extend(here.flush().unwrap());
        assert!(there.start_flush().unwrap());
        assert!(there.started() && there.in_flight() > 0);
        assert!(!there.start_flush().unwrap(), "one call at a time");
        while there.would_wait() {
            let fd = there.answers_fd().expect("answers to wait for");
            let mut fds = [rustix::event::PollFd::from_borrowed_fd(
                fd,
                rustix::event::PollFlags::IN,
            )];
            let t = rustix::time::Timespec {
                tv_sec: 10,
                tv_nsec: 0,
            };
            assert_eq!(rustix::event::poll(&mut fds, Some(&t)).unwrap(), 1);
        }
        b.extend(there.finish().unwrap());
        assert!(!there.started() && there.in_flight() == 0);
        let a: Vec<_> = a.iter().map(seen).collect();
        let b: Vec<_> = b.iter().map(seen).collect();
        assert_eq!(a.len(), 20, "threads {threads}");
        assert!(a == b, "threads {threads}: the same pictures");
        // The decoder takes a new stream afterwards.
        let mut again = there.submit(&pkts[0].0, 0).unwrap();
        again.extend(there.flush().unwrap());
        assert_eq!(again.len(), 1, "threads {threads}");
    }
}
