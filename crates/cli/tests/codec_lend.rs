//! Decoded pictures lent as frame regions' replicas, through a real daemon with decoders in
//! worker processes: a picture received into a region is not copied (the worker's shared
//! buffer libavcodec decoded it into becomes the region's replica in the codec's domain), a
//! lent buffer is never decoded into again while the region holds it, a decoder lends at
//! most `MAX_LENT` buffers (the oldest is moved out, counted), and a worker that dies leaves
//! the lent pictures intact.

mod common;

use std::path::Path;

use common::{clip_packets, connect, cpu_read, cpu_write, h264_clip, Daemon, TempDir};
use virtsoc_guest::devices::codec;
use virtsoc_guest::{Connection, Format, RegionInfo};
use virtsoc_host::device::codec::lend::MAX_LENT;
use virtsoc_media::{CodecKind, DecoderBackend, FfmpegDecoder, PixelFormat};

const W: u32 = 320;
const H: u32 = 240;
const FRAMES: usize = 40;

/// The clip's packets (no B-frames: one picture per packet, in order) and each picture as
/// libavcodec alone decodes it, packed YUV420P.
fn clip(dir: &Path) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let clip = h264_clip(
        dir,
        "lend.h264",
        &format!("{W}x{H}"),
        FRAMES as u32,
        "",
        &["-pix_fmt", "yuv420p", "-bf", "0", "-g", "1000"],
    );
    let bytes = std::fs::read(&clip).unwrap();
    let pkts: Vec<Vec<u8>> = clip_packets(&clip)
        .into_iter()
        .map(|(pos, size)| bytes[pos..pos + size].to_vec())
        .collect();
    let mut d = FfmpegDecoder::new(CodecKind::H264, PixelFormat::Yuv420p, 1).unwrap();
    let mut pics = Vec::new();
    for (i, p) in pkts.iter().enumerate() {
        pics.extend(d.decode(p, i as i64).unwrap());
    }
    pics.extend(d.flush().unwrap());
    let pics: Vec<Vec<u8>> = pics.into_iter().map(|f| f.data).collect();
    assert_eq!(pics.len(), FRAMES);
    (pkts, pics)
}

/// Bytes the guest's ledger counts the codec copying within its own memory (copies into a
/// region, moves out of lent pictures).
fn codec_own_bytes(c: &Connection) -> u64 {
    c.ledger()
        .unwrap()
        .iter()
        .filter(|l| l.src == l.dst && c.domain_name(l.src) == "codec")
        .map(|l| l.bytes)
        .sum()
}

/// Decodes every packet with two frame threads, receiving picture `k` into `regions[k]`
/// (the last region takes every picture past the others); returns the pictures' pts.
fn decode_into(c: &Connection, pkts: &[Vec<u8>], regions: &[RegionInfo]) -> Vec<u64> {
    let handle = c
        .command(&codec::OpenDecoder {
            kind: virtsoc_guest::devices::codec_kind::H264,
            format: Format::Yuv420p as u64,
            threads: 2,
        })
        .unwrap()
        .handle;
    let bits = c.alloc_blob(256 << 10).unwrap();
    let mut pts = Vec::new();
    let receive = |pts: &mut Vec<u64>| loop {
        let r = regions[pts.len().min(regions.len() - 1)];
        let got = c
            .command_with_access(&codec::ReceiveFrame {
                handle,
                frame: r.id,
            })
            .unwrap();
        if got.got == 0 {
            return;
        }
        pts.push(got.pts);
    };
    for (i, p) in pkts.iter().enumerate() {
        cpu_write(c, bits.id, p);
        c.command_with_access(&codec::Decode {
            handle,
            bitstream: bits.id,
            len: p.len() as u64,
            pts: i as u64,
        })
        .unwrap();
        receive(&mut pts);
    }
    c.command(&codec::Flush { handle }).unwrap();
    receive(&mut pts);
    pts
}

fn frames(c: &Connection, n: usize) -> Vec<RegionInfo> {
    (0..n)
        .map(|_| c.alloc(0, W, H, Format::Yuv420p, 0).unwrap())
        .collect()
}

/// Four regions keep the first four pictures while 36 more are decoded: each still reads
/// as its own picture (a lent buffer decoded into again would show a later one), and no
/// picture was copied into a region.
#[test]
fn a_lent_picture_is_never_decoded_into_and_nothing_is_copied() {
    let dir = TempDir::new("lend-kept");
    let (pkts, pics) = clip(&dir.0);
    let d = Daemon::start(&[]);
    let c = connect(&d);
    let regions = frames(&c, 5);
    let pts = decode_into(&c, &pkts, &regions);
    assert_eq!(pts, (0..FRAMES as u64).collect::<Vec<_>>());
    assert_eq!(
        codec_own_bytes(&c),
        0,
        "a picture was copied into its region"
    );
    for (k, r) in regions.iter().enumerate().take(4) {
        let seen = cpu_read(&c, r.id, r.size as usize);
        assert!(seen == pics[k], "region {k} no longer holds picture {k}");
    }
    let last = regions[4];
    assert!(cpu_read(&c, last.id, last.size as usize) == pics[FRAMES - 1]);
}

/// Eleven regions keep the first eleven pictures: past `MAX_LENT` lent at once the oldest
/// are moved out (copied, counted), and every region still holds its picture.
#[test]
fn a_decoder_lends_at_most_max_lent_pictures() {
    let dir = TempDir::new("lend-bound");
    let (pkts, pics) = clip(&dir.0);
    let d = Daemon::start(&[]);
    let c = connect(&d);
    let kept = MAX_LENT + 3;
    let regions = frames(&c, kept + 1);
    decode_into(&c, &pkts, &regions);
    // The kept regions' pictures, then the last region's first one, each pushed the
    // oldest still lent out once more than MAX_LENT were.
    let moved = (kept + 1 - MAX_LENT) as u64 * regions[0].size;
    assert_eq!(codec_own_bytes(&c), moved);
    for (k, r) in regions.iter().enumerate().take(kept) {
        let seen = cpu_read(&c, r.id, r.size as usize);
        assert!(seen == pics[k], "region {k} no longer holds picture {k}");
    }
}

/// A worker killed after lending pictures: the regions keep them (the buffers stay mapped
/// while a region holds them), and the decoder's next call fails.
#[test]
fn a_dead_worker_leaves_the_lent_pictures_intact() {
    let dir = TempDir::new("lend-dead");
    let (pkts, pics) = clip(&dir.0);
    let d = Daemon::start(&["--decoder-spares", "0"]);
    let c = connect(&d);
    let regions = frames(&c, 2);
    let handle = c
        .command(&codec::OpenDecoder {
            kind: virtsoc_guest::devices::codec_kind::H264,
            format: Format::Yuv420p as u64,
            threads: 1,
        })
        .unwrap()
        .handle;
    let bits = c.alloc_blob(256 << 10).unwrap();
    let feed = |i: usize| {
        cpu_write(&c, bits.id, &pkts[i]);
        c.command_with_access(&codec::Decode {
            handle,
            bitstream: bits.id,
            len: pkts[i].len() as u64,
            pts: i as u64,
        })
    };
    for (i, r) in regions.iter().enumerate() {
        feed(i).unwrap();
        let got = c
            .command_with_access(&codec::ReceiveFrame {
                handle,
                frame: r.id,
            })
            .unwrap();
        assert_eq!(got.got, 1);
    }
    let workers = virtsoc_media::worker_processes(d.child.id(), "--codec-worker");
    assert_eq!(workers.len(), 1, "{workers:?}");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &workers[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(feed(2).is_err(), "a dead worker decoded");
    for (k, r) in regions.iter().enumerate() {
        assert!(cpu_read(&c, r.id, r.size as usize) == pics[k], "region {k}");
    }
}
