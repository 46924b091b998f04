//! `livestream`: camera -> codec (H.264 encode) -> the guest hands the packets to an RTMP push
//! to a local nginx -> pulled back -> codec (decode) -> GPU composite with a UI layer ->
//! display (vSoC Table 1's live streaming workload, with a real network hop on loopback).
//!
//! Each frame period the guest captures into an NV12 region (the camera stamps the capture
//! time into the pixels), encodes it into a blob region, waits for the encoder (in `fence`
//! mode too, through a fence the codec signals after its end_access: this is the guest handing
//! data to the network), reads the packet through a CPU begin_access and queues it for the
//! stdin of an `ffmpeg ... -f flv rtmp://...` push process. A second `ffmpeg` plays the stream
//! back as Annex-B with access-unit delimiters; a reader thread splits its stdout into access
//! units ([`AuSplitter`]) and hands them over a channel. Until the next capture is due the
//! guest waits on that channel and decodes what arrives as it arrives (at most
//! [`MAX_DECODES_PER_FRAME`] at once, all but the newest counted as late drops), composites the
//! newest picture over a UI layer and presents it with `capture_ns` 0: the display reads the
//! stamped capture time, so motion-to-photon latency covers capture, encode, the RTMP round
//! trip, decode, composite and scan-out.
//!
//! Before the measured run the scenario streams without presenting until frames come back
//! ([`warm_up`]): the run measures the steady state, not the start of nginx and `ffmpeg`.
//!
//! The server is nginx with its RTMP module ([`Relay`]), started on a free loopback port in a
//! private directory and killed with both `ffmpeg` processes when the scenario ends, also on
//! errors. Every wait is bounded: nginx's port ([`SERVER_START_TIMEOUT`]), the pull's `play`
//! ([`PLAY_TIMEOUT`]), the encoder's fence ([`FENCE_TIMEOUT`]), the first pulled unit
//! ([`FIRST_FRAME_TIMEOUT`]), the channel until the next capture; the push queue is bounded
//! ([`PUSH_QUEUE`]).
//!
//! Latency (measured here: without these the loopback round trip took two seconds, then two
//! frame periods; with them it is about a millisecond when the machine is idle):
//! - `-probesize 32 -analyzeduration 1` keep both `ffmpeg`s from buffering input to analyse
//!   it. `-fflags nobuffer` must not be used: it discards the analysed packets, first keyframe
//!   included, and stream copy then drops everything up to the next keyframe.
//! - The guest ends every packet with [`AU_END`]: a filler-data NAL unit, which the pull's
//!   splitter takes as "this unit is complete" (splitting only at delimiters waits for the
//!   next frame), and a delimiter, which makes the push's H.264 parser end the access unit at
//!   once (it too would wait for the next frame).
//! - The pull is started, and seen playing, before the push publishes, so it gets the stream
//!   from its first keyframe (nginx's `wait_key` and the guest's wait for a keyframe cover a
//!   late join).

mod relay;

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{
    self, Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError, TrySendError,
};
use std::time::{Duration, Instant};

use virtsoc_guest::devices::{self as api, LayerRecord};
use virtsoc_guest::{AccessMode, Connection, DeviceCommand, DeviceId, Format};

use super::media::{AuSplitter, NAL_AUD, NAL_FILLER};
use super::pipe::{Pipe, Ticket};
use super::show::{layer_blob, screen_layer, Show};
use super::{pace, ui_pixels, Common, RunOpts};
use crate::bench_svm::OrderingMode;
use crate::CliError;
use relay::Relay;
use virtsoc_devapi::{HandleId, RegionId};

/// Where the RTMP module of Debian's `libnginx-mod-rtmp` (and of common other builds) lives.
const RTMP_MODULE_PATHS: [&str; 4] = [
    "/usr/lib/nginx/modules/ngx_rtmp_module.so",
    "/usr/share/nginx/modules/ngx_rtmp_module.so",
    "/usr/lib64/nginx/modules/ngx_rtmp_module.so",
    "/usr/local/nginx/modules/ngx_rtmp_module.so",
];
/// What to install when nginx or its RTMP module is missing.
const PACKAGES: &str =
    "install the packages nginx-light and libnginx-mod-rtmp (scripts/install-deps.sh does)";
/// How long nginx may take to accept connections.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the pull may take to reach nginx's `play` (it then waits for the publisher).
const PLAY_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the encoder's completion fence may take.
const FENCE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the first pulled unit may take (a keyframe: twice as long).
const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(6);
/// How long the warm-up goes on once frames come back.
const WARM_UP: Duration = Duration::from_millis(300);
/// Packets queued for the push process before it counts as stalled.
const PUSH_QUEUE: usize = 120;
/// Pulled access units decoded at once; all but the newest count as late drops.
const MAX_DECODES_PER_FRAME: usize = 2;
/// Bitstream regions the pulled units are written into, in turn.
const BITSTREAM_SLOTS: usize = 4;
/// Decoded-picture regions, in turn (each with its layer list).
const FRAME_SLOTS: usize = 6;
/// What the guest appends to every packet it pushes: a one-byte filler-data NAL unit (allowed
/// after a picture's slices, kept by every hop) that tells the pull's splitter the unit is
/// complete, and an access-unit delimiter (primary_pic_type 7: any slice type) that makes the
/// push's H.264 parser end the access unit at once instead of waiting for the next frame.
const AU_END: [u8; 13] = [
    0, 0, 0, 1, NAL_FILLER, 0xff, 0x80, 0, 0, 0, 1, NAL_AUD, 0xf0,
];
/// Name prefix of a run's directory (followed by the process id).
const DIR_PREFIX: &str = "virtsoc-livestream-";
/// The stream's path on the server.
const STREAM: &str = "live/virtsoc";

/// Runs the scenario (see the module documentation).
pub fn livestream(
    p: &mut Pipe<'_>,
    show: &mut Show,
    o: &RunOpts,
    period: Duration,
    c: &mut Common,
) -> Result<(), CliError> {
    let conn = p.conn;
    let fence_mode = o.ordering == OrderingMode::Fence;
    let (mut sender, mut player) = set_up(p, show, o)?;
    let mut relay = Relay::start()?;
    let keep = if fence_mode { 2 } else { 0 };
    warm_up(p, show, &mut relay, &mut sender, &mut player, c, period)?;
    c.frames_in = 0;
    c.late_drops = 0;
    player.why = Why::default();
    p.end_frame(0)?;
    p.access_us.clear();
    c.start(conn)?; // setup (devices, nginx, ffmpeg, warm-up) is not part of the run
    let mut i = 0u64;
    while c.t0.elapsed().as_secs_f64() < o.seconds {
        // Until frame i is due: decode what comes back as it comes, show the newest.
        let due = c.anchor + period * i as u32;
        loop {
            let mut batch = relay.pull_now(MAX_DECODES_PER_FRAME)?;
            if batch.is_empty() {
                let Some(wait) = due.checked_duration_since(Instant::now()) else {
                    break;
                };
                match relay.pull_within(wait)? {
                    Some(unit) => batch.push(unit),
                    None => break,
                }
            }
            // More than a frame behind the schedule: decode only (a newer frame is coming).
            let behind = Instant::now() > due + period;
            let pulled = Instant::now();
            player.show(p, show, c, batch, !behind)?;
            player.why.show_ms.push(ms_since(pulled));
            p.end_frame(keep)?;
            if Instant::now() >= due {
                break;
            }
        }
        let late = pace(c, p.conn, i, period)?;
        c.frames_in += 1;
        let captured = Instant::now();
        // Too late to be worth sending: the stream skips the frame.
        let sent = sender.frame(p, &mut relay, !late)?;
        player.why.send_ms.push(ms_since(captured));
        if sent {
            player.why.pushed += 1;
        } else if late {
            c.late_drops += 1;
            player.why.late_captures += 1;
        }
        p.end_frame(keep)?;
        i += 1;
    }
    player.finish(p, c)?;
    let w = &player.why;
    log::info!(
        "livestream: {} captured, {} pushed, {} shown; not shown: {} late captures, {} before a \
         keyframe, {} replaced, {} pulled while behind, {} held by the decoder; guest time p50: \
         capture + encode + push {:.1} ms, decode + show {:.1} ms",
        c.frames_in,
        w.pushed,
        w.shown,
        w.late_captures,
        w.unsynced,
        w.replaced,
        w.behind,
        w.held,
        p50(&w.send_ms),
        p50(&w.show_ms)
    );
    p.run(&api::codec::Close {
        handle: sender.encoder,
    })?;
    drop(relay);
    Ok(())
}

/// The broadcaster's and the player's regions, layer lists and codec sessions (an encoder
/// at the stream's rate, a one-thread decoder).
fn set_up(p: &mut Pipe<'_>, show: &Show, o: &RunOpts) -> Result<(Broadcaster, Player), CliError> {
    let (w, h) = (o.width, o.height);
    let conn = p.conn;
    let fence_mode = o.ordering == OrderingMode::Fence;
    let images = |n: usize, format: Format| super::images(conn, n, (w, h), format);
    // A packet never exceeds a raw frame (the codec device's rule); room for SPS/PPS and AUDs.
    let packet_max = w as u64 * h as u64 * 3 / 2 + 4096;
    let blobs = |n: usize| -> Result<Vec<RegionId>, CliError> {
        (0..n)
            .map(|_| conn.alloc_blob(packet_max).map(|r| r.id))
            .collect::<Result<_, _>>()
            .map_err(CliError::from)
    };
    let cams = images(3, Format::Nv12)?;
    let packets = blobs(2)?;
    let bits = blobs(BITSTREAM_SLOTS)?;
    let frames = images(FRAME_SLOTS, Format::Nv12)?;
    let screen = show.screen;
    let ui = conn.alloc(0, screen.0, screen.1, Format::Rgba8, 0)?.id;
    p.cpu_write(ui, &ui_pixels(screen.0, screen.1))?;
    // One layer list per decoded-picture slot, written once: [picture, UI].
    let lists: Vec<(RegionId, Vec<LayerRecord>)> = frames
        .iter()
        .map(|&f| -> Result<_, CliError> {
            let records = vec![
                screen_layer(f, (w, h), screen, false),
                screen_layer(ui, screen, screen, true),
            ];
            Ok((layer_blob(p, &records)?, records))
        })
        .collect::<Result<_, _>>()?;
    let bitrate = (w as u64 * h as u64 * o.fps.max(1) as u64 / 8).clamp(250_000, 40_000_000);
    let t = p.run(&api::codec::OpenEncoder {
        width: w as u64,
        height: h as u64,
        fps: o.fps.max(1) as u64,
        bitrate,
    })?;
    let encoder = p.result(t)?.handle;
    // One decoding thread: frame threads would hold pictures back.
    let t = p.run(&api::codec::OpenDecoder {
        kind: api::codec_kind::H264,
        format: Format::Nv12 as u64,
        threads: 1,
    })?;
    let decoder = p.result(t)?.handle;
    p.end_frame(0)?;

    let sender = Broadcaster {
        encoder,
        cams,
        packets,
        fence_mode,
        next: 0,
    };
    let player = Player {
        decoder,
        bits,
        frames,
        lists,
        ui,
        unit_max: packet_max,
        decodes: (0..BITSTREAM_SLOTS).map(|_| None).collect(),
        receives: VecDeque::new(),
        next_bits: 0,
        next_frame: 0,
        synced: false,
        why: Why::default(),
    };
    Ok((sender, player))
}

/// Streams, decoding without presenting, until frames come back and [`WARM_UP`] passed
/// since, so the run measures the steady state rather than the start of nginx and `ffmpeg`
/// (the first packets wait while the push connects and publishes, then arrive in a burst).
fn warm_up(
    p: &mut Pipe<'_>,
    show: &mut Show,
    relay: &mut Relay,
    sender: &mut Broadcaster,
    player: &mut Player,
    c: &mut Common,
    period: Duration,
) -> Result<(), CliError> {
    let keep = if sender.fence_mode { 2 } else { 0 };
    let start = Instant::now();
    let mut back: Option<Instant> = None;
    for i in 0u32.. {
        if let Some(wait) = (start + period * i).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        sender.frame(p, relay, true)?;
        p.end_frame(keep)?;
        let units = relay.pull_now(usize::MAX)?;
        if !units.is_empty() {
            back.get_or_insert_with(Instant::now);
            player.show(p, show, c, units, false)?;
            p.end_frame(keep)?;
        }
        match back {
            Some(t) if t.elapsed() >= WARM_UP && player.synced => break,
            None if start.elapsed() > FIRST_FRAME_TIMEOUT => {
                return Err(CliError::Usage(format!(
                    "livestream: nothing came back from the RTMP server within {} s{}",
                    FIRST_FRAME_TIMEOUT.as_secs(),
                    relay.logs()
                )))
            }
            _ if start.elapsed() > FIRST_FRAME_TIMEOUT * 2 => {
                return Err(CliError::Usage(format!(
                    "livestream: no keyframe came back from the RTMP server within {} s{}",
                    (FIRST_FRAME_TIMEOUT * 2).as_secs(),
                    relay.logs()
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The sending side: captures, encodes, and hands the packets to the network.
struct Broadcaster {
    encoder: HandleId,
    /// Camera frames and encoded packets, in turn.
    cams: Vec<RegionId>,
    packets: Vec<RegionId>,
    fence_mode: bool,
    /// The next frame's number (its presentation time stamp).
    next: u64,
}

impl Broadcaster {
    /// Captures the next frame and, if `send`, encodes it and pushes the packet. Returns
    /// whether a packet was pushed.
    fn frame(&mut self, p: &mut Pipe<'_>, relay: &mut Relay, send: bool) -> Result<bool, CliError> {
        let i = self.next;
        self.next += 1;
        let cam = self.cams[(i % self.cams.len() as u64) as usize];
        p.run(&api::camera::Capture { frame: cam })?;
        if !send {
            return Ok(false);
        }
        let out = self.packets[(i % self.packets.len() as u64) as usize];
        let t = p.run(&api::codec::Encode {
            handle: self.encoder,
            frame: cam,
            pts: i,
            out,
        })?;
        if self.fence_mode {
            // The packet goes to the network: the encoder's write must have ended.
            wait_for_device(p.conn, api::codec::Encode::DEVICE)?;
        }
        let r = p.result(t)?;
        if r.bytes == 0 {
            return Ok(false);
        }
        let (packet, access) = read_packet(p.conn, out, r.bytes)?;
        p.access_us.push(access.as_secs_f64() * 1e6);
        relay.push(packet)?;
        Ok(true)
    }
}

/// Why captured frames were not shown (for the log; their sum is in `late_drops`), and where
/// the guest's time went.
#[derive(Debug, Default)]
struct Why {
    pushed: u64,
    shown: u64,
    late_captures: u64,
    unsynced: u64,
    replaced: u64,
    behind: u64,
    held: u64,
    /// Per frame, ms: capture, encode (waited for in both orderings) and the push.
    send_ms: Vec<f64>,
    /// Per batch of pulled units, ms: decode and show as the guest saw them (submission only
    /// in fence ordering, completion in atomic).
    show_ms: Vec<f64>,
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The median of `v` (0 when empty).
fn p50(v: &[f64]) -> f64 {
    crate::stats::percentile(v, 50.0)
}

/// The receiving side: decodes pulled access units and shows pictures.
struct Player {
    decoder: HandleId,
    /// Bitstream blobs the units are written into, in turn.
    bits: Vec<RegionId>,
    /// Decoded-picture regions, in turn, and their layer lists ([picture, UI]).
    frames: Vec<RegionId>,
    lists: Vec<(RegionId, Vec<LayerRecord>)>,
    ui: RegionId,
    unit_max: u64,
    /// The decode still reading each bitstream blob (fence mode keeps them in flight).
    decodes: Vec<Option<Ticket<api::codec::DecodeReply>>>,
    receives: VecDeque<Ticket<api::codec::ReceiveFrameReply>>,
    next_bits: usize,
    next_frame: usize,
    /// Whether the decoder has seen a keyframe (units before one cannot be decoded).
    synced: bool,
    why: Why,
}

impl Player {
    /// Decodes `units` in order and, if `present`, composites and presents the newest picture.
    fn show(
        &mut self,
        p: &mut Pipe<'_>,
        show: &mut Show,
        c: &mut Common,
        units: Vec<Vec<u8>>,
        present: bool,
    ) -> Result<(), CliError> {
        let mut newest: Option<usize> = None;
        for unit in units {
            if !self.synced && !has_idr(&unit) {
                c.late_drops += 1;
                self.why.unsynced += 1;
                continue;
            }
            if unit.len() as u64 > self.unit_max {
                log::warn!(
                    "livestream: a {} byte unit does not fit; resyncing",
                    unit.len()
                );
                c.late_drops += 1;
                self.synced = false;
                continue;
            }
            self.synced = true;
            let s = self.next_bits;
            self.next_bits = (s + 1) % self.bits.len();
            if let Some(t) = self.decodes[s].take() {
                p.result(t)?;
            }
            p.cpu_write(self.bits[s], &unit)?;
            self.decodes[s] = Some(p.run(&api::codec::Decode {
                handle: self.decoder,
                bitstream: self.bits[s],
                len: unit.len() as u64,
                pts: 0,
            })?);
            let f = self.next_frame;
            self.next_frame = (f + 1) % self.frames.len();
            self.receives.push_back(p.run(&api::codec::ReceiveFrame {
                handle: self.decoder,
                frame: self.frames[f],
            })?);
            if newest.replace(f).is_some() {
                c.late_drops += 1; // a newer picture came with it
                self.why.replaced += 1;
            }
        }
        if let Some(f) = newest {
            if present {
                // capture_ns 0: the display reads the capture time stamped into the pixels.
                let (blob, records) = &self.lists[f];
                show.show(
                    p,
                    (*blob, records),
                    (&[self.frames[f], self.ui], &[self.frames[f]]),
                    0,
                )?;
                self.why.shown += 1;
            } else {
                c.late_drops += 1;
                self.why.behind += 1;
            }
        }
        self.collect(p, c, 4)
    }

    /// Collects the results of all but the last `keep` receive_frame calls.
    fn collect(&mut self, p: &mut Pipe<'_>, c: &mut Common, keep: usize) -> Result<(), CliError> {
        while self.receives.len() > keep {
            let Some(t) = self.receives.pop_front() else {
                break;
            };
            if p.result(t)?.got == 0 {
                c.late_drops += 1; // the decoder held the picture back
                self.why.held += 1;
            }
        }
        Ok(())
    }

    /// Collects every outstanding result and closes the decoder.
    fn finish(&mut self, p: &mut Pipe<'_>, c: &mut Common) -> Result<(), CliError> {
        self.collect(p, c, 0)?;
        for t in self.decodes.iter_mut().filter_map(Option::take) {
            p.result(t)?;
        }
        p.run(&api::codec::Close {
            handle: self.decoder,
        })?;
        Ok(())
    }
}

/// Waits (bounded, asleep on the shared fence page) until `device` has finished everything
/// this guest queued on it so far.
fn wait_for_device(conn: &Connection, device: DeviceId) -> Result<(), CliError> {
    let f = conn.fence_create()?;
    conn.fence_signal(device, f)?;
    let done = conn.fence_wait_cpu(f, FENCE_TIMEOUT);
    conn.fence_release(f)?;
    if done? {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "livestream: device {device:?} did not finish within {} s",
            FENCE_TIMEOUT.as_secs()
        )))
    }
}

/// Reads the `len` packet bytes at the start of blob `id` through a CPU access, followed by an
/// [`AU_END`]; also returns the host's begin_access time.
fn read_packet(conn: &Connection, id: RegionId, len: u64) -> Result<(Vec<u8>, Duration), CliError> {
    let a = conn.begin_access(id, DeviceId::CPU, 0, len, AccessMode::Read)?;
    let ptr = a
        .ptr
        .ok_or_else(|| CliError::Usage("no CPU pointer".into()))?;
    let n = usize::try_from(len).map_err(|_| CliError::Usage("packet length".into()))?;
    let mut packet = Vec::with_capacity(n + AU_END.len());
    // SAFETY: the library bounds-checked [ptr, ptr + len) inside the window, and the access
    // keeps the bytes in place until end_access.
    packet.extend_from_slice(unsafe { std::slice::from_raw_parts(ptr.as_ptr(), n) });
    conn.end_access(id, DeviceId::CPU, 0, len, AccessMode::Read)?;
    packet.extend_from_slice(&AU_END);
    Ok((packet, a.host_elapsed))
}

/// Whether an Annex-B access unit holds an IDR slice.
fn has_idr(unit: &[u8]) -> bool {
    unit.windows(4)
        .any(|w| w[0] == 0 && w[1] == 0 && w[2] == 1 && w[3] & 0x1f == 5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_idr_slices() {
        assert!(has_idr(&[0, 0, 0, 1, 9, 0xf0, 0, 0, 1, 0x65, 7, 8]));
        assert!(!has_idr(&[0, 0, 1, 9, 0xf0, 0, 0, 0, 1, 0x41, 5]));
    }

    #[test]
    fn nginx_config_is_loopback_live_only() {
        let c = relay::nginx_conf(
            Path::new("/m/ngx_rtmp_module.so"),
            Path::new("/tmp/x"),
            1935,
        );
        assert!(c.starts_with("load_module /m/ngx_rtmp_module.so;\n"));
        assert!(c.contains("listen 127.0.0.1:1935;"));
        assert!(c.contains("daemon off;") && c.contains("master_process off;"));
        assert!(c.contains("live on; record off;"));
        assert!(c.contains("pid /tmp/x/nginx.pid;"));
    }
}
