//! Integration tests of the codec device through a real daemon: a clip made at test time by
//! the `ffmpeg` CLI is fed packet by packet from a blob region and every decoded frame is
//! checked against FFmpeg's own decode, then errors, bounds and the encoder.
//!
//! Packets: `ffprobe -show_entries packet=pos,size` lists the access units FFmpeg's raw H.264
//! demuxer (with its parser) cuts the Annex-B file into, i.e. exactly what a demuxer in the
//! guest would feed the device; the test slices the file at those offsets. Golden checksums:
//! `ffmpeg -f framecrc` gives an Adler-32 (FFmpeg's variant, seeded with 0) of each decoded
//! YUV420P frame, recomputed here over the frames read back from the regions (NV12 frames are
//! deinterleaved to YUV420P first).

mod common;

use std::path::{Path, PathBuf};

use common::{
    clip_packets, connect, cpu_read, cpu_write, h264_clip, run_tool, status_of, Daemon, TempDir,
};
use virtsoc_devapi::{HandleId, RegionId};
use virtsoc_guest::devices::{codec, codec_kind};
use virtsoc_guest::{Connection, Format, GuestError, RegionInfo, Status};

const W: u32 = 320;
const H: u32 = 240;
const FRAMES: usize = 30;

/// A 320x240, 30-frame H.264 Annex-B clip (x264 defaults: B-frames, so output is reordered).
fn make_clip(dir: &Path) -> PathBuf {
    h264_clip(
        dir,
        "clip.h264",
        &format!("{W}x{H}"),
        FRAMES as u32,
        "",
        &["-pix_fmt", "yuv420p", "-bsf:v", "h264_mp4toannexb"],
    )
}

/// The clip's access units, as FFmpeg's demuxer cuts them.
fn packets(clip: &Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(clip).unwrap();
    let mut out = Vec::new();
    let mut next = 0usize;
    for (pos, size) in clip_packets(clip) {
        assert_eq!(pos, next, "packets tile the file");
        out.push(bytes[pos..pos + size].to_vec());
        next = pos + size;
    }
    assert_eq!(next, bytes.len(), "packets cover the whole file");
    assert_eq!(out.len(), FRAMES);
    out
}

/// FFmpeg's per-frame checksums of its own YUV420P decode, in presentation order.
fn golden(clip: &Path) -> Vec<u32> {
    let out = run_tool(
        "ffmpeg",
        &[
            "-hide_banner",
            "-loglevel",
            "error",
            "-i",
            clip.to_str().unwrap(),
            "-pix_fmt",
            "yuv420p",
            "-f",
            "framecrc",
            "-",
        ],
    );
    out.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let hex = l.rsplit(',').next().unwrap().trim();
            u32::from_str_radix(hex.trim_start_matches("0x"), 16).unwrap()
        })
        .collect()
}

/// Adler-32 as FFmpeg's framecrc computes it (`av_adler32_update(0, ...)`).
fn adler32(data: &[u8]) -> u32 {
    const MOD: u32 = 65521;
    let (mut a, mut b) = (0u32, 0u32);
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += x as u32;
            b += a;
        }
        a %= MOD;
        b %= MOD;
    }
    (b << 16) | a
}

/// A frame read back from a region, as packed YUV420P.
fn as_yuv420p(frame: &RegionInfo, bytes: &[u8]) -> Vec<u8> {
    let (w, h, s) = (
        frame.width as usize,
        frame.height as usize,
        frame.stride as usize,
    );
    let mut y = Vec::with_capacity(w * h * 3 / 2);
    for row in 0..h {
        y.extend_from_slice(&bytes[row * s..row * s + w]);
    }
    match frame.format {
        Format::Yuv420p => {
            let cs = s / 2;
            let (u0, v0) = (s * h, s * h + cs * h / 2);
            for base in [u0, v0] {
                for row in 0..h / 2 {
                    y.extend_from_slice(&bytes[base + row * cs..base + row * cs + w / 2]);
                }
            }
        }
        Format::Nv12 => {
            let uv = &bytes[s * h..];
            for plane in 0..2 {
                for row in 0..h / 2 {
                    y.extend(uv[row * s..row * s + w].iter().skip(plane).step_by(2));
                }
            }
        }
        f => panic!("not a YUV frame: {f:?}"),
    }
    y
}

struct Session<'a> {
    c: &'a Connection,
    handle: HandleId,
    bitstream: RegionInfo,
    frame: RegionInfo,
}

impl<'a> Session<'a> {
    fn open(c: &'a Connection, format: Format, threads: u64) -> Session<'a> {
        let handle = c
            .command(&codec::OpenDecoder {
                kind: codec_kind::H264,
                format: format as u64,
                threads,
            })
            .unwrap()
            .handle;
        Session {
            c,
            handle,
            bitstream: c.alloc_blob(256 << 10).unwrap(),
            frame: c.alloc(0, W, H, format, 0).unwrap(),
        }
    }

    fn decode(&self, packet: &[u8], pts: u64) -> Result<u64, GuestError> {
        cpu_write(self.c, self.bitstream.id, packet);
        self.c
            .command_with_access(&codec::Decode {
                handle: self.handle,
                bitstream: self.bitstream.id,
                len: packet.len() as u64,
                pts,
            })
            .map(|r| r.frames_ready)
    }

    /// Receives every ready frame: (pts, checksum of the frame as YUV420P).
    fn receive_all(&self, out: &mut Vec<(u64, u32)>) {
        loop {
            let r = self
                .c
                .command_with_access(&codec::ReceiveFrame {
                    handle: self.handle,
                    frame: self.frame.id,
                })
                .unwrap();
            if r.got == 0 {
                return;
            }
            assert_eq!((r.width, r.height), (W as u64, H as u64));
            let bytes = cpu_read(self.c, self.frame.id, self.frame.size as usize);
            out.push((r.pts, adler32(&as_yuv420p(&self.frame, &bytes))));
        }
    }

    fn flush(&self, out: &mut Vec<(u64, u32)>) {
        self.c
            .command(&codec::Flush {
                handle: self.handle,
            })
            .unwrap();
        self.receive_all(out);
    }
}

fn check_against_golden(got: &[(u64, u32)], golden: &[u32]) {
    assert_eq!(got.len(), golden.len(), "frame count");
    for (i, ((_, sum), want)) in got.iter().zip(golden).enumerate() {
        assert_eq!(
            sum, want,
            "frame {i}: checksum {sum:#010x}, FFmpeg {want:#010x}"
        );
    }
    let mut pts: Vec<u64> = got.iter().map(|(p, _)| *p).collect();
    pts.sort();
    assert_eq!(
        pts,
        (0..golden.len() as u64).collect::<Vec<_>>(),
        "every pts once"
    );
}

#[test]
fn decodes_h264_bit_exact_in_both_formats() {
    let dir = TempDir::new("devcodec-exact");
    let clip = make_clip(&dir.0);
    let (pkts, golden) = (packets(&clip), golden(&clip));
    assert_eq!(golden.len(), FRAMES);
    let d = Daemon::start(&["--codec-threads", "2"]);
    let c = connect(&d);
    // YUV420P with frame threads; NV12 with the daemon's default thread count.
    for (format, threads) in [(Format::Yuv420p, 3), (Format::Nv12, 0), (Format::Nv12, 1)] {
        let s = Session::open(&c, format, threads);
        let mut got = Vec::new();
        for (i, p) in pkts.iter().enumerate() {
            s.decode(p, i as u64).unwrap();
            s.receive_all(&mut got);
        }
        s.flush(&mut got);
        check_against_golden(&got, &golden);
        c.command(&codec::Close { handle: s.handle }).unwrap();
    }
}

/// An idle decoder gives its worker process back (`--codec-idle-reap-ms`), and its next
/// decode starts another: the stream decodes on from its key frame, bit exact.
#[test]
fn an_idle_decoder_gives_its_worker_back_and_decodes_on() {
    let dir = TempDir::new("devcodec-reap");
    let clip = make_clip(&dir.0);
    let (pkts, golden) = (packets(&clip), golden(&clip));
    let d = Daemon::start(&["--codec-idle-reap-ms", "1000"]);
    let c = connect(&d);
    let s = Session::open(&c, Format::Nv12, 1);
    let mut first = Vec::new();
    s.decode(&pkts[0], 0).unwrap();
    s.receive_all(&mut first);
    s.flush(&mut first);
    assert_eq!(first.len(), 1, "the key frame decoded");
    d.expect_log(&format!("decoder {} idle for", s.handle));
    let mut got = Vec::new();
    for (i, p) in pkts.iter().enumerate() {
        s.decode(p, i as u64).unwrap();
        s.receive_all(&mut got);
    }
    s.flush(&mut got);
    d.expect_log(&format!("decoder {} reopened", s.handle));
    check_against_golden(&got, &golden);
}

#[test]
fn a_corrupt_packet_fails_alone() {
    let dir = TempDir::new("devcodec-corrupt");
    let clip = make_clip(&dir.0);
    let (pkts, golden) = (packets(&clip), golden(&clip));
    let d = Daemon::start(&[]);
    let c = connect(&d);
    let s = Session::open(&c, Format::Yuv420p, 1);
    let mut got = Vec::new();
    for (i, p) in pkts.iter().enumerate() {
        if i == FRAMES / 2 {
            // Bytes without a single NAL unit: libavcodec rejects the packet.
            let junk: Vec<u8> = (0..3000u32).map(|x| (x * 7 + 0xa5) as u8 | 0x80).collect();
            let e = s.decode(&junk, 1000).unwrap_err();
            // The decoder's reason comes with the status.
            assert!(e.to_string().contains("device error: h264"), "{e}");
            assert_eq!(status_of::<()>(Err(e)), Status::DeviceError);
        }
        s.decode(p, i as u64).unwrap();
        s.receive_all(&mut got);
    }
    s.flush(&mut got);
    // The junk was no part of the stream: every real frame still decodes exactly.
    check_against_golden(&got, &golden);
}

#[test]
fn handles_regions_and_bounds_are_checked() {
    let dir = TempDir::new("devcodec-bounds");
    let clip = make_clip(&dir.0);
    let pkts = packets(&clip);
    let d = Daemon::start(&[]);
    let c = connect(&d);
    let other = connect(&d);
    let s = Session::open(&c, Format::Nv12, 1);

    // Unknown handles, and another guest's handle.
    let junk_handle = Session {
        handle: HandleId(999),
        c: &c,
        bitstream: s.bitstream,
        frame: s.frame,
    };
    assert_eq!(
        status_of(junk_handle.decode(&pkts[0], 0)),
        Status::BadArgument
    );
    let theirs = Session {
        handle: s.handle,
        c: &other,
        bitstream: other.alloc_blob(256 << 10).unwrap(),
        frame: other.alloc(0, W, H, Format::Nv12, 0).unwrap(),
    };
    assert_eq!(status_of(theirs.decode(&pkts[0], 0)), Status::BadArgument);
    assert_eq!(
        status_of(other.command_with_access(&codec::ReceiveFrame {
            handle: s.handle,
            frame: theirs.frame.id,
        })),
        Status::BadArgument
    );
    assert_eq!(
        status_of(other.command(&codec::Close { handle: s.handle })),
        Status::BadArgument
    );
    // Region ids are per guest: this one names none of ours.
    assert_eq!(
        status_of(c.device_cmd(
            codec::ID,
            virtsoc_guest::DeviceCommand::encode(&codec::ReceiveFrame {
                handle: s.handle,
                frame: RegionId(1 << 20),
            })
        )),
        Status::NoSuchRegion
    );

    // len beyond the region.
    cpu_write(&c, s.bitstream.id, &pkts[0]);
    assert_eq!(
        status_of(c.command_with_access(&codec::Decode {
            handle: s.handle,
            bitstream: s.bitstream.id,
            len: s.bitstream.size + 1,
            pts: 0,
        })),
        Status::OutOfRange
    );

    // Feed without receiving: the queue is bounded.
    let mut busy_at = None;
    for (i, p) in pkts.iter().enumerate() {
        match s.decode(p, i as u64) {
            Ok(n) => assert!(n <= 16, "{n} frames queued"),
            Err(e) => {
                assert_eq!(status_of::<()>(Err(e)), Status::Busy);
                busy_at = Some(i);
                break;
            }
        }
    }
    let busy_at = busy_at.expect("decode turns Busy once 16 frames wait");

    // Wrong destinations leave the frame queued.
    let small = c.alloc(0, W / 2, H / 2, Format::Nv12, 0).unwrap();
    let planar = c.alloc(0, W, H, Format::Yuv420p, 0).unwrap();
    let rgba = c.alloc(0, W, H, Format::Rgba8, 0).unwrap();
    let blob = c.alloc_blob(W as u64 * H as u64 * 2).unwrap();
    for (region, want) in [
        (small.id, Status::BadArgument),
        (planar.id, Status::BadArgument),
        (rgba.id, Status::NotSupported),
        (blob.id, Status::NotSupported),
    ] {
        assert_eq!(
            status_of(c.command_with_access(&codec::ReceiveFrame {
                handle: s.handle,
                frame: region,
            })),
            want,
            "region {region}"
        );
    }
    let e = c
        .command_with_access(&codec::ReceiveFrame {
            handle: s.handle,
            frame: small.id,
        })
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("picture Nv12 320x240, region Nv12 160x120"),
        "the reason names both sizes: {e}"
    );
    let mut got = Vec::new();
    s.receive_all(&mut got);
    assert!(got.len() >= 16);
    for (i, p) in pkts.iter().enumerate().skip(busy_at) {
        s.decode(p, i as u64).unwrap();
        s.receive_all(&mut got);
    }
    s.flush(&mut got);
    assert_eq!(got.len(), FRAMES, "nothing lost to the errors");

    // Closed handles are gone; the daemon is still serving.
    c.command(&codec::Close { handle: s.handle }).unwrap();
    assert_eq!(
        status_of(c.command(&codec::Close { handle: s.handle })),
        Status::BadArgument
    );
    assert_eq!(status_of(s.decode(&pkts[0], 0)), Status::BadArgument);
    assert_eq!(
        status_of(c.command(&codec::OpenDecoder {
            kind: 42,
            format: Format::Nv12 as u64,
            threads: 0,
        })),
        Status::BadArgument
    );
    assert_eq!(
        status_of(c.command(&codec::OpenDecoder {
            kind: codec_kind::H264,
            format: Format::Rgba8 as u64,
            threads: 0,
        })),
        Status::NotSupported
    );
}

#[test]
fn encodes_and_decodes_back() {
    const N: u64 = 10;
    let d = Daemon::start(&[]);
    let c = connect(&d);
    let enc = c
        .command(&codec::OpenEncoder {
            width: W as u64,
            height: H as u64,
            fps: 30,
            bitrate: 1_000_000,
        })
        .unwrap()
        .handle;
    let frame = c.alloc(0, W, H, Format::Nv12, 0).unwrap();
    let out = c.alloc_blob(frame.size).unwrap();
    let tiny = c.alloc_blob(16).unwrap();
    let wrong = c.alloc(0, W / 2, H / 2, Format::Nv12, 0).unwrap();
    let mut stream = Vec::new();
    for i in 0..N {
        // A moving gradient with a neutral-ish colour wash.
        let mut img = vec![0u8; frame.size as usize];
        let (w, h) = (W as usize, H as usize);
        for y in 0..h {
            for x in 0..w {
                img[y * w + x] = ((x + y + 8 * i as usize) % 220 + 16) as u8;
            }
        }
        for (j, b) in img[w * h..].iter_mut().enumerate() {
            *b = 128u8.wrapping_add(((j + i as usize) % 32) as u8);
        }
        cpu_write(&c, frame.id, &img);
        let r = c
            .command_with_access(&codec::Encode {
                handle: enc,
                frame: frame.id,
                pts: i,
                out: out.id,
            })
            .unwrap();
        assert!(r.bytes > 0, "frame {i}: no packet (zero-latency encoder)");
        assert_eq!(r.out_pts, i);
        if i == 0 {
            assert_eq!(r.keyframe, 1, "the stream starts with a keyframe");
        }
        let pkt = cpu_read(&c, out.id, r.bytes as usize);
        assert!(
            pkt.starts_with(&[0, 0, 1]) || pkt.starts_with(&[0, 0, 0, 1]),
            "Annex-B start code"
        );
        stream.push(pkt);
    }
    // Packets that do not fit, frames of the wrong size, a decoder handle.
    assert_eq!(
        status_of(c.command_with_access(&codec::Encode {
            handle: enc,
            frame: frame.id,
            pts: N,
            out: tiny.id,
        })),
        Status::OutOfRange
    );
    assert_eq!(
        status_of(c.command_with_access(&codec::Encode {
            handle: enc,
            frame: wrong.id,
            pts: N,
            out: out.id,
        })),
        Status::BadArgument
    );
    c.command(&codec::Close { handle: enc }).unwrap();

    let s = Session::open(&c, Format::Nv12, 0);
    let mut got = Vec::new();
    for (i, p) in stream.iter().enumerate() {
        s.decode(p, i as u64).unwrap();
        s.receive_all(&mut got);
    }
    s.flush(&mut got);
    assert_eq!(got.len(), N as usize, "every encoded frame decodes");
    assert_eq!(
        got.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        (0..N).collect::<Vec<_>>()
    );
}
