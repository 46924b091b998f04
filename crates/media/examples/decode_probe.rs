//! What N H.264 decoders taking turns on one thread cost against each alone, with no daemon,
//! guest, ring or scheduler: the codec's part of `virtsoc bench sharing`'s overhead (as
//! `virtsoc-gpu`'s `cache_probe` is the GPU's). Decoder `i` decodes clip `i % clips`, one
//! picture per packet, each picture copied into the next of its `--rotate` NV12 buffers (the
//! bench's guests' frame regions), looping over the clip without a flush as the bench's
//! guests do. Pairs of phases, interleaved: each clip's first decoder alone, then all N in
//! turn; prints each clip's median decode time alone and in turn, and how much longer the
//! decodes in turn took than the same decodes alone (median over the pairs). `--burst B`:
//! each decoder's turn is B decodes in a row (what a scheduler serving a guest several
//! commands at a time would give), so the caches change hands B times less often.
//! `--evict M`: a third phase in each pair, each clip's decoder alone again with M MiB of
//! memory written after each of its turns (the other decoders' work replaced by nothing but
//! a write that evicts the caches): if its decodes cost what they cost in turn, the caches
//! are what sharing costs. In turn, each decode's place in its turn is kept too: the first
//! of a turn pays what the change of decoder costs, if only the first does.
//!
//! `cargo run --release -p virtsoc-media --example decode_probe -- 8 a.h264 b.h264 c.h264`

use std::time::Instant;

use virtsoc_media::{
    DecoderBackend, Demuxer, FfmpegDecoder, FrameLayout, FrameMut, MediaError, PixelFormat,
};

/// One decoder: its clip's packets, where it is in them, its buffers.
struct Stream {
    clip: usize,
    packets: Vec<Vec<u8>>,
    next: usize,
    dec: FfmpegDecoder,
    layout: FrameLayout,
    buffers: Vec<Vec<u8>>,
    turn: usize,
}

impl Stream {
    /// Decodes the next packet into the next buffer: microseconds taken.
    fn step(&mut self) -> Result<f64, MediaError> {
        let t = Instant::now();
        let p = &self.packets[self.next % self.packets.len()];
        self.next += 1;
        for pic in self.dec.decode(p, self.next as i64)? {
            let n = self.buffers.len();
            let buf = &mut self.buffers[self.turn % n];
            self.turn += 1;
            pic.copy_into(FrameMut::new(self.layout, buf)?)?;
        }
        Ok(t.elapsed().as_secs_f64() * 1e6)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage =
        "usage: decode_probe N CLIP.h264 [CLIP ...] [--rotate R] [--pairs P] [--burst B] [--evict M]";
    let n: usize = args.first().and_then(|a| a.parse().ok()).ok_or(usage)?;
    let option = |name: &str, default: usize| -> usize {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1)?.parse().ok())
            .unwrap_or(default)
            .max(1)
    };
    let (rotate, pairs, burst) = (
        option("--rotate", 8),
        option("--pairs", 6),
        option("--burst", 1),
    );
    let evict_mib = args
        .iter()
        .any(|a| a == "--evict")
        .then(|| option("--evict", 32));
    let mut scratch = vec![0u8; evict_mib.unwrap_or(0) << 20];
    let clips: Vec<&String> = args
        .iter()
        .skip(1)
        .take_while(|a| !a.starts_with("--"))
        .collect();
    if n == 0 || clips.is_empty() {
        return Err(usage.into());
    }
    let mut streams = Vec::new();
    for i in 0..n {
        let mut demux = Demuxer::open(clips[i % clips.len()])?;
        let mut packets = Vec::new();
        while let Some(p) = demux.read_packet()? {
            packets.push(p.data);
        }
        let info = demux.info();
        let layout = FrameLayout::packed(PixelFormat::Nv12, info.width, info.height)?;
        let mut dec = FfmpegDecoder::for_stream(info, PixelFormat::Nv12, 1)?;
        dec.hold_pictures(true);
        streams.push(Stream {
            clip: i % clips.len(),
            packets,
            next: 0,
            dec,
            layout,
            buffers: vec![vec![0u8; layout.size()]; rotate],
            turn: 0,
        });
    }
    // Warm every decoder up (its first packets, every buffer).
    for s in &mut streams {
        for _ in 0..rotate.max(3) {
            s.step()?;
        }
    }
    let k = clips.len().min(n);
    let (mut alone, mut together) = (vec![Vec::new(); k], vec![Vec::new(); k]);
    let mut evicted = vec![Vec::new(); k];
    // In turn, by the decode's place in its turn (the first pays the refill, if any).
    let mut placed = vec![vec![Vec::new(); burst]; k];
    let mut overheads = Vec::new();
    // A multiple of the burst: every decoder decodes as many packets in turn as alone.
    let rounds = 60usize.div_ceil(burst) * burst;
    for _ in 0..pairs {
        let mut rate = vec![0.0; k];
        for (c, r) in rate.iter_mut().enumerate() {
            let t = Instant::now();
            for _ in 0..rounds {
                alone[c].push(streams[c].step()?);
            }
            *r = rounds as f64 / t.elapsed().as_secs_f64();
        }
        let t = Instant::now();
        for _ in 0..rounds / burst {
            for s in &mut streams {
                for place in placed[s.clip].iter_mut() {
                    let us = s.step()?;
                    together[s.clip].push(us);
                    place.push(us);
                }
            }
        }
        let secs = t.elapsed().as_secs_f64();
        let alone_secs: f64 = streams.iter().map(|s| rounds as f64 / rate[s.clip]).sum();
        overheads.push((secs / alone_secs - 1.0) * 100.0);
        if evict_mib.is_some() {
            for (c, e) in evicted.iter_mut().enumerate() {
                for turn in 0..rounds / burst {
                    for _ in 0..burst {
                        e.push(streams[c].step()?);
                    }
                    scratch.iter_mut().for_each(|b| *b = turn as u8);
                }
            }
        }
    }
    for c in 0..k {
        let evict = match evict_mib {
            Some(m) => format!(
                ", {:.0} us alone with {m} MiB written after each turn",
                median(evicted[c].clone())
            ),
            None => String::new(),
        };
        let places: Vec<String> = placed[c]
            .iter()
            .map(|v| format!("{:.0}", median(v.clone())))
            .collect();
        println!(
            "{}: {:.0} us a decode alone, {:.0} us in turn with {n} ({} by place in a turn){evict}",
            clips[c],
            median(alone[c].clone()),
            median(together[c].clone()),
            places.join(" / ")
        );
    }
    println!(
        "{n} decoders in turn, {burst} decodes a turn: {:.1}% longer than alone (median of {pairs} pairs)",
        median(overheads)
    );
    Ok(())
}
