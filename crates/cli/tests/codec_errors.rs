//! How the codec device reports damage to a guest, through a real daemon, on clips the
//! `ffmpeg` CLI makes at test time (one of them then corrupted here):
//! - a picture decoded with damage concealed comes with `CORRUPT` in `receive_frame`'s flags
//!   (it used to be reported as success);
//! - with frame threads a junk packet's failure is reported with that packet's pts and
//!   sequence number by the later call it surfaces in, which itself succeeds (it used to fail
//!   that later, good packet);
//! - an odd-sized stream is delivered cropped to even and says so: `stream_info` gives both
//!   sizes, `receive_frame` sets `CROPPED` (it used to crop silently);
//! - none of it makes libavcodec write to the daemon's stderr.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{clip_packets, connect, cpu_write, h264_clip, status_of, Daemon, TempDir};
use virtsoc_devapi::HandleId;
use virtsoc_guest::devices::{codec, codec_frame_flag, codec_kind};
use virtsoc_guest::{Connection, Format, RegionInfo, Status};

/// The clip's access units, as FFmpeg's demuxer cuts them.
fn packets(clip: &Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(clip).unwrap();
    clip_packets(clip)
        .into_iter()
        .map(|(pos, size)| bytes[pos..pos + size].to_vec())
        .collect()
}

/// Bytes with no NAL start code: libavcodec's H.264 decoder fails the packet outright.
fn junk() -> Vec<u8> {
    (0..3000u32).map(|x| (x * 7 + 0xa5) as u8 | 0x80).collect()
}

/// One decoder on the daemon and what it reported.
struct Decoder<'a> {
    c: &'a Connection,
    handle: HandleId,
    bitstream: RegionInfo,
    frame: Option<RegionInfo>,
    /// Calls that failed: (packet index, status).
    failed: Vec<(usize, Status)>,
    /// Failures reported by later calls: (index of the call, count, failed_pts, failed_seq);
    /// the flush is index `usize::MAX`.
    later: Vec<(usize, u64, u64, u64)>,
    /// Received pictures: (pts, flags, width, height).
    pictures: Vec<(u64, u64, u64, u64)>,
    /// `stream_info` before each received picture: (width, height, picture_width,
    /// picture_height).
    infos: Vec<(u64, u64, u64, u64)>,
}

impl<'a> Decoder<'a> {
    fn open(c: &'a Connection, threads: u64) -> Decoder<'a> {
        let handle = c
            .command(&codec::OpenDecoder {
                kind: codec_kind::H264,
                format: Format::Yuv420p as u64,
                threads,
            })
            .unwrap()
            .handle;
        Decoder {
            c,
            handle,
            bitstream: c.alloc_blob(256 << 10).unwrap(),
            frame: None,
            failed: Vec::new(),
            later: Vec::new(),
            pictures: Vec::new(),
            infos: Vec::new(),
        }
    }

    fn feed(&mut self, index: usize, packet: &[u8], pts: u64) {
        cpu_write(self.c, self.bitstream.id, packet);
        let r = self.c.command_with_access(&codec::Decode {
            handle: self.handle,
            bitstream: self.bitstream.id,
            len: packet.len() as u64,
            pts,
        });
        match r {
            Ok(r) => {
                if r.failed > 0 {
                    self.later
                        .push((index, r.failed, r.failed_pts, r.failed_seq));
                }
            }
            Err(e) => self.failed.push((index, status_of::<()>(Err(e)))),
        }
        self.receive_all();
    }

    fn flush(&mut self) {
        let r = self
            .c
            .command(&codec::Flush {
                handle: self.handle,
            })
            .unwrap();
        if r.failed > 0 {
            self.later
                .push((usize::MAX, r.failed, r.failed_pts, r.failed_seq));
        }
        self.receive_all();
    }

    fn receive_all(&mut self) {
        loop {
            let info = self
                .c
                .command(&codec::StreamInfo {
                    handle: self.handle,
                })
                .unwrap();
            let (w, h) = (info.width as u32, info.height as u32);
            if w == 0 {
                return;
            }
            if self.frame.is_none_or(|f| (f.width, f.height) != (w, h)) {
                if let Some(f) = self.frame.take() {
                    self.c.free(f.id).unwrap();
                }
                self.frame = Some(self.c.alloc(0, w, h, Format::Yuv420p, 0).unwrap());
            }
            let frame = self.frame.unwrap();
            let r = self
                .c
                .command_with_access(&codec::ReceiveFrame {
                    handle: self.handle,
                    frame: frame.id,
                })
                .unwrap();
            if r.got == 0 {
                return;
            }
            self.infos.push((
                info.width,
                info.height,
                info.picture_width,
                info.picture_height,
            ));
            self.pictures.push((r.pts, r.flags, r.width, r.height));
        }
    }

    fn corrupt_pts(&self) -> Vec<u64> {
        self.pictures
            .iter()
            .filter(|p| p.1 & codec_frame_flag::CORRUPT != 0)
            .map(|p| p.0)
            .collect()
    }
}

/// libavcodec's own log lines look like `[h264 @ 0x55d0c0a0b2c0] ...`.
fn assert_no_libav_lines(d: &mut Daemon) {
    d.terminate();
    let lines = d.drain_log(Duration::from_secs(5));
    let libav: Vec<&String> = lines.iter().filter(|l| l.contains(" @ 0x")).collect();
    assert!(libav.is_empty(), "libavcodec wrote to stderr: {libav:?}");
}

#[test]
fn damage_is_reported_per_picture_and_per_packet() {
    let dir = TempDir::new("codecerr-damage");
    // No B-frames and one key frame: one picture per packet, in order.
    let clip = h264_clip(
        &dir.0,
        "ipp.h264",
        "320x240",
        30,
        "",
        &["-pix_fmt", "yuv420p", "-bf", "0", "-g", "1000"],
    );
    let pkts = packets(&clip);
    assert_eq!(pkts.len(), 30);
    // The corrupted clip: the last two thirds of packet 10 overwritten.
    let mut damaged = pkts.clone();
    let p = &mut damaged[10];
    let from = p.len() / 3;
    for (i, b) in p.iter_mut().enumerate().skip(from) {
        *b = (i * 31) as u8;
    }
    let mut d = Daemon::start(&[]);
    let c = connect(&d);
    for threads in [1, 3] {
        // Clean: nothing flagged.
        let mut dec = Decoder::open(&c, threads);
        for (i, p) in pkts.iter().enumerate() {
            dec.feed(i, p, i as u64);
        }
        dec.flush();
        assert_eq!(dec.pictures.len(), 30);
        assert!(dec.corrupt_pts().is_empty(), "threads {threads}");
        assert!(dec.failed.is_empty() && dec.later.is_empty());

        // Concealed damage: every picture delivered, picture 10 (and maybe pictures
        // predicted from it) flagged, none before it, no packet failed.
        let mut dec = Decoder::open(&c, threads);
        for (i, p) in damaged.iter().enumerate() {
            dec.feed(i, p, i as u64);
        }
        dec.flush();
        assert_eq!(dec.pictures.len(), 30, "threads {threads}");
        let corrupt = dec.corrupt_pts();
        assert!(corrupt.contains(&10), "threads {threads}: {corrupt:?}");
        assert!(corrupt.iter().all(|&p| p >= 10), "{corrupt:?}");
        assert!(dec.failed.is_empty() && dec.later.is_empty());
    }

    // Junk (pts 1000) as the 16th packet and junk (pts 2000) just before the flush.
    let mut fed: Vec<(Vec<u8>, u64)> = pkts.iter().cloned().zip(0..).collect();
    fed.insert(15, (junk(), 1000));
    fed.push((junk(), 2000));
    let last = fed.len() - 1;
    // One thread: the junk packets' own calls fail.
    let mut dec = Decoder::open(&c, 1);
    for (i, (p, pts)) in fed.iter().enumerate() {
        dec.feed(i, p, *pts);
    }
    dec.flush();
    assert_eq!(
        dec.failed,
        [(15, Status::DeviceError), (last, Status::DeviceError)]
    );
    assert!(dec.later.is_empty(), "{:?}", dec.later);
    assert_eq!(dec.pictures.len(), 30);
    // Three frame threads: a packet's result comes out two packets later, and with packets
    // in flight in the worker (a decode does not wait for its answer) the call that reports
    // it may come a few later still. No good packet fails; a later call reports the junk
    // packet by its pts and number (the 16th).
    let mut dec = Decoder::open(&c, 3);
    for (i, (p, pts)) in fed.iter().enumerate() {
        dec.feed(i, p, *pts);
    }
    dec.flush();
    assert!(
        dec.failed.is_empty(),
        "good packets failed: {:?}",
        dec.failed
    );
    assert_eq!(dec.later.len(), 2, "{:?}", dec.later);
    let (at, n, pts, seq) = dec.later[0];
    assert!(
        (17..=17 + virtsoc_media::MAX_IN_FLIGHT).contains(&at),
        "{:?}",
        dec.later
    );
    assert_eq!((n, pts, seq), (1, 1000, 16));
    assert_eq!(dec.later[1], (usize::MAX, 1, 2000, last as u64 + 1));
    assert_eq!(dec.pictures.len(), 30);
    assert!(dec.corrupt_pts().is_empty());
    assert_no_libav_lines(&mut d);
}

#[test]
fn odd_sizes_are_reported_with_the_crop() {
    let dir = TempDir::new("codecerr-odd");
    // 4:4:4, since x264 codes odd sizes only without chroma subsampling.
    let odd = h264_clip(
        &dir.0,
        "odd.h264",
        "322x242",
        4,
        "format=yuv444p,crop=321:241:0:0",
        &[],
    );
    let even = h264_clip(
        &dir.0,
        "even.h264",
        "320x240",
        2,
        "",
        &["-pix_fmt", "yuv420p"],
    );
    let mut d = Daemon::start(&[]);
    let c = connect(&d);
    let mut dec = Decoder::open(&c, 1);
    for (i, p) in packets(&odd).iter().enumerate() {
        dec.feed(i, p, i as u64);
    }
    dec.flush();
    assert_eq!(dec.pictures.len(), 4);
    for (p, info) in dec.pictures.iter().zip(&dec.infos) {
        assert_eq!((p.2, p.3), (320, 240), "delivered cropped to even");
        assert_eq!(p.1, codec_frame_flag::CROPPED, "{p:?}");
        assert_eq!(*info, (320, 240, 321, 241), "stream_info: both sizes");
    }
    let mut dec = Decoder::open(&c, 1);
    for (i, p) in packets(&even).iter().enumerate() {
        dec.feed(i, p, i as u64);
    }
    dec.flush();
    assert_eq!(dec.pictures.len(), 2);
    for (p, info) in dec.pictures.iter().zip(&dec.infos) {
        assert_eq!(p.1, 0, "{p:?}");
        assert_eq!(*info, (320, 240, 320, 240));
    }
    assert_no_libav_lines(&mut d);
}

/// The daemon's codec workers (its child processes started with `--codec-worker`, not the
/// ISP's).
fn children(pid: u32) -> Vec<u32> {
    virtsoc_media::worker_processes(pid, "--codec-worker")
}

#[test]
fn a_crashed_decoder_process_ends_that_decoder_alone() {
    let dir = TempDir::new("codecerr-process");
    let clip = h264_clip(
        &dir.0,
        "p.h264",
        "320x240",
        30,
        "",
        &["-pix_fmt", "yuv420p", "-bf", "0"],
    );
    let pkts = packets(&clip);
    // No workers started ahead, so each decoder's worker is the daemon's only new child.
    let mut d = Daemon::start(&["--decoder-spares", "0"]);
    let pid = d.child.id();
    let (ca, cb) = (connect(&d), connect(&d));
    let mut a = Decoder::open(&ca, 1);
    let a_worker = children(pid);
    assert_eq!(a_worker.len(), 1, "one worker per decoder: {a_worker:?}");
    let mut b = Decoder::open(&cb, 2);
    assert_eq!(children(pid).len(), 2);
    for (i, p) in pkts.iter().enumerate().take(10) {
        a.feed(i, p, i as u64);
        b.feed(i, p, i as u64);
    }
    // Guest A's libavcodec "crashes": its worker dies without a word.
    let killed = Command::new("kill")
        .args(["-KILL", &a_worker[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    for (i, p) in pkts.iter().enumerate().skip(10) {
        a.feed(i, p, i as u64);
        b.feed(i, p, i as u64);
    }
    b.flush();
    assert!(b.failed.is_empty(), "{:?}", b.failed);
    assert_eq!(b.pictures.len(), 30, "the other guest's decoder goes on");
    assert_eq!(
        a.failed.len(),
        20,
        "every later packet of the dead decoder fails"
    );
    assert!(a.failed.iter().all(|(_, s)| *s == Status::DeviceError));
    cpu_write(&ca, a.bitstream.id, &pkts[10]);
    let e = ca
        .command_with_access(&codec::Decode {
            handle: a.handle,
            bitstream: a.bitstream.id,
            len: pkts[10].len() as u64,
            pts: 10,
        })
        .unwrap_err();
    assert!(e.to_string().contains("decoder process"), "{e}");
    // Guest A reopens and decodes the stream from the start; the daemon never stopped.
    ca.command(&codec::Close { handle: a.handle }).unwrap();
    let mut again = Decoder::open(&ca, 1);
    for (i, p) in pkts.iter().enumerate() {
        again.feed(i, p, i as u64);
    }
    again.flush();
    assert_eq!(again.pictures.len(), 30);
    assert!(d.alive());
    drop((a, b, again));
    assert_no_libav_lines(&mut d);
}
