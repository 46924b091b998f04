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

use super::pipe::{Pipe, Ticket};
use super::show::{layer_blob, screen_layer, Show};
use super::{pace, ui_pixels, Common, RunOpts};
use crate::bench_svm::OrderingMode;
use crate::CliError;

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
/// NAL unit types: access-unit delimiter, filler data.
const NAL_AUD: u8 = 9;
const NAL_FILLER: u8 = 12;
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
    let (w, h) = (o.width, o.height);
    let conn = p.conn;
    let fence_mode = o.ordering == OrderingMode::Fence;
    let images = |n: usize, format: Format| -> Result<Vec<u64>, CliError> {
        (0..n)
            .map(|_| conn.alloc(0, w, h, format, 0).map(|r| r.id))
            .collect::<Result<_, _>>()
            .map_err(CliError::from)
    };
    // A packet never exceeds a raw frame (the codec device's rule); room for SPS/PPS and AUDs.
    let packet_max = w as u64 * h as u64 * 3 / 2 + 4096;
    let blobs = |n: usize| -> Result<Vec<u64>, CliError> {
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
    let lists: Vec<(u64, Vec<LayerRecord>)> = frames
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

    let mut relay = Relay::start()?;
    let mut sender = Broadcaster {
        encoder,
        cams,
        packets,
        fence_mode,
        next: 0,
    };
    let mut player = Player {
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
        let due = c.t0 + period * i as u32;
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
            player.show(p, show, c, batch, !behind)?;
            p.end_frame(keep)?;
            if Instant::now() >= due {
                break;
            }
        }
        let late = pace(c, i, period);
        c.frames_in += 1;
        // Too late to be worth sending: the stream skips the frame.
        if sender.frame(p, &mut relay, !late)? {
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
         keyframe, {} replaced, {} pulled while behind, {} held by the decoder",
        c.frames_in,
        w.pushed,
        w.shown,
        w.late_captures,
        w.unsynced,
        w.replaced,
        w.behind,
        w.held
    );
    p.run(&api::codec::Close { handle: encoder })?;
    drop(relay);
    Ok(())
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
    encoder: u64,
    /// Camera frames and encoded packets, in turn.
    cams: Vec<u64>,
    packets: Vec<u64>,
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

/// Why captured frames were not shown (for the log; their sum is in `late_drops`).
#[derive(Debug, Default)]
struct Why {
    pushed: u64,
    shown: u64,
    late_captures: u64,
    unsynced: u64,
    replaced: u64,
    behind: u64,
    held: u64,
}

/// The receiving side: decodes pulled access units and shows pictures.
struct Player {
    decoder: u64,
    /// Bitstream blobs the units are written into, in turn.
    bits: Vec<u64>,
    /// Decoded-picture regions, in turn, and their layer lists ([picture, UI]).
    frames: Vec<u64>,
    lists: Vec<(u64, Vec<LayerRecord>)>,
    ui: u64,
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
                show.show(p, (*blob, records), &[self.frames[f], self.ui], 0)?;
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

/// Waits (bounded, reading the shared fence page) until `device` has finished everything this
/// guest queued on it so far.
fn wait_for_device(conn: &Connection, device: DeviceId) -> Result<(), CliError> {
    let f = conn.fence_create()?;
    conn.fence_signal(device, f)?;
    let deadline = Instant::now() + FENCE_TIMEOUT;
    let mut polls = 0u32;
    let done = loop {
        if conn.fence_signaled(f)? {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        polls += 1;
        if polls < 100 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    };
    conn.fence_release(f)?;
    if done {
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
fn read_packet(conn: &Connection, id: u64, len: u64) -> Result<(Vec<u8>, Duration), CliError> {
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

/// Splits an Annex-B byte stream into access units, as the bytes arrive: a unit starts at an
/// access-unit delimiter and ends at the next one, or earlier at a filler-data NAL unit (the
/// end marker of [`AU_END`], so a unit is complete without waiting for the next). Bytes
/// outside units (before the first delimiter, the markers) are dropped.
#[derive(Debug, Default)]
struct AuSplitter {
    buf: Vec<u8>,
    /// Positions before this were searched.
    scan: usize,
    /// Whether `buf` starts with a unit (at its delimiter) that has not ended yet.
    open: bool,
}

impl AuSplitter {
    /// Adds bytes; returns the units they completed.
    fn push(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        self.buf.extend_from_slice(bytes);
        let mut units = Vec::new();
        let mut i = self.scan;
        while i + 4 <= self.buf.len() {
            let b = &self.buf[i..i + 4];
            let nal = (b[0] == 0 && b[1] == 0 && b[2] == 1).then_some(b[3] & 0x1f);
            if let Some(t @ (NAL_AUD | NAL_FILLER)) = nal {
                // A four-byte start code's leading zero belongs to the new NAL unit.
                let start = if i > 0 && self.buf[i - 1] == 0 {
                    i - 1
                } else {
                    i
                };
                if start > 0 {
                    if self.open {
                        units.push(self.buf[..start].to_vec());
                    }
                    self.buf.drain(..start);
                }
                self.open = t == NAL_AUD;
                i = i - start + 4;
            } else {
                i += 1;
            }
        }
        self.scan = i;
        units
    }

    /// The last unit, at the end of the stream.
    fn finish(self) -> Option<Vec<u8>> {
        (self.open && !self.buf.is_empty()).then_some(self.buf)
    }
}

/// The RTMP relay: nginx on a loopback port, the push `ffmpeg` fed by a writer thread, the pull
/// `ffmpeg` read by a splitter thread. Dropping it kills the three processes and removes its
/// directory.
struct Relay {
    dir: PathBuf,
    nginx: Option<Child>,
    pull: Option<Child>,
    push: Option<Child>,
    to_push: Option<SyncSender<Vec<u8>>>,
    pulled: Option<Receiver<Vec<u8>>>,
}

impl Relay {
    /// Starts nginx, then the pull (waiting until nginx saw it play), then the push.
    fn start() -> Result<Relay, CliError> {
        let nginx = find_nginx().ok_or_else(|| {
            CliError::Usage(format!(
                "livestream needs nginx, which was not found: {PACKAGES}"
            ))
        })?;
        let module = RTMP_MODULE_PATHS
            .iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .ok_or_else(|| {
                CliError::Usage(format!(
                    "livestream needs nginx's RTMP module (looked for {}): {PACKAGES}",
                    RTMP_MODULE_PATHS.join(", ")
                ))
            })?;
        remove_stale_dirs();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut relay = Relay {
            dir,
            nginx: None,
            pull: None,
            push: None,
            to_push: None,
            pulled: None,
        };
        let port = relay.start_nginx(&nginx, module)?;
        let url = format!("rtmp://127.0.0.1:{port}/{STREAM}");
        relay.start_pull(&url)?;
        relay.start_push(&url)?;
        Ok(relay)
    }

    /// Starts nginx on a free port (retrying if another process takes the port first).
    fn start_nginx(&mut self, nginx: &Path, module: &Path) -> Result<u16, CliError> {
        let mut last = String::new();
        for _ in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let conf = self.dir.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(module, &self.dir, port))?;
            let err_log = self.dir.join("error.log");
            let mut cmd = Command::new(nginx);
            die_with_parent(&mut cmd);
            let child = cmd
                .arg("-p")
                .arg(format!("{}/", self.dir.display()))
                .arg("-c")
                .arg(&conf)
                .arg("-e")
                .arg(&err_log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(File::create(self.dir.join("nginx.stderr"))?)
                .spawn()
                .map_err(|e| {
                    CliError::Usage(format!("cannot run {}: {e}; {PACKAGES}", nginx.display()))
                })?;
            let child = self.nginx.insert(child);
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let deadline = Instant::now() + SERVER_START_TIMEOUT;
            loop {
                if let Some(st) = child.try_wait()? {
                    last = format!(
                        "nginx exited ({st}){}",
                        tail_of(&[&self.dir.join("nginx.stderr"), &err_log])
                    );
                    break;
                }
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return Ok(port);
                }
                if Instant::now() > deadline {
                    return Err(CliError::Usage(format!(
                        "livestream: nginx did not accept connections on port {port} within {} s{}",
                        SERVER_START_TIMEOUT.as_secs(),
                        tail_of(&[&err_log])
                    )));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            self.nginx = None;
            if !last.contains("in use") {
                break;
            }
        }
        Err(CliError::Usage(format!(
            "livestream: cannot start nginx with its RTMP module: {last}"
        )))
    }

    /// Starts the pull and its reader thread; waits (bounded) until nginx logged its `play`.
    fn start_pull(&mut self, url: &str) -> Result<(), CliError> {
        let mut child = ffmpeg(&self.dir.join("pull.log"))?
            .args(["-probesize", "32", "-analyzeduration", "1", "-i", url])
            .args([
                "-c",
                "copy",
                "-bsf:v",
                "h264_mp4toannexb,h264_metadata=aud=insert",
            ])
            .args(["-flush_packets", "1", "-f", "h264", "pipe:1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(no_ffmpeg)?;
        let out = child.stdout.take();
        self.pull = Some(child);
        let out = out.ok_or_else(|| CliError::Usage("no pull stdout".into()))?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("livestream-pull".into())
            .spawn(move || read_units(out, tx))?;
        self.pulled = Some(rx);
        let deadline = Instant::now() + PLAY_TIMEOUT;
        let err_log = self.dir.join("error.log");
        let needle = format!(
            "play: name='{}'",
            STREAM.rsplit('/').next().unwrap_or(STREAM)
        );
        loop {
            if std::fs::read_to_string(&err_log).is_ok_and(|l| l.contains(&needle)) {
                return Ok(());
            }
            if let Some(Some(st)) = self.pull.as_mut().map(Child::try_wait).transpose()? {
                return Err(CliError::Usage(format!(
                    "livestream: the RTMP pull (ffmpeg) exited ({st}){}",
                    self.logs()
                )));
            }
            if Instant::now() > deadline {
                // Not fatal: the guest waits for a keyframe if the pull joins late.
                log::warn!("livestream: the pull did not start playing within {PLAY_TIMEOUT:?}");
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the push and its writer thread (it publishes once the first packet arrives).
    fn start_push(&mut self, url: &str) -> Result<(), CliError> {
        let mut child = ffmpeg(&self.dir.join("push.log"))?
            .args(["-probesize", "32", "-analyzeduration", "1"])
            .args([
                "-use_wallclock_as_timestamps",
                "1",
                "-f",
                "h264",
                "-i",
                "pipe:0",
            ])
            .args(["-c", "copy", "-f", "flv", url])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .map_err(no_ffmpeg)?;
        let stdin = child.stdin.take();
        self.push = Some(child);
        let stdin = stdin.ok_or_else(|| CliError::Usage("no push stdin".into()))?;
        let (tx, rx) = mpsc::sync_channel(PUSH_QUEUE);
        std::thread::Builder::new()
            .name("livestream-push".into())
            .spawn(move || write_packets(stdin, rx))?;
        self.to_push = Some(tx);
        Ok(())
    }

    /// Queues a packet for the push (never blocks).
    fn push(&mut self, packet: Vec<u8>) -> Result<(), CliError> {
        let Some(tx) = &self.to_push else {
            return Err(CliError::Usage(
                "livestream: the push is not running".into(),
            ));
        };
        match tx.try_send(packet) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(CliError::Usage(format!(
                "livestream: the RTMP push (ffmpeg) stalled with {PUSH_QUEUE} packets queued{}",
                self.logs()
            ))),
            Err(TrySendError::Disconnected(_)) => Err(CliError::Usage(format!(
                "livestream: the RTMP push (ffmpeg) stopped reading{}",
                self.logs()
            ))),
        }
    }

    /// Up to `max` pulled access units that are already there (never blocks).
    fn pull_now(&mut self, max: usize) -> Result<Vec<Vec<u8>>, CliError> {
        let mut units = Vec::new();
        while units.len() < max {
            match self.pull_within(Duration::ZERO)? {
                Some(u) => units.push(u),
                None => break,
            }
        }
        Ok(units)
    }

    /// The next pulled access unit, waiting at most `wait` for it.
    fn pull_within(&mut self, wait: Duration) -> Result<Option<Vec<u8>>, CliError> {
        let Some(rx) = &self.pulled else {
            return Ok(None);
        };
        let got = if wait.is_zero() {
            rx.try_recv().map_err(|e| e == TryRecvError::Disconnected)
        } else {
            rx.recv_timeout(wait)
                .map_err(|e| e == RecvTimeoutError::Disconnected)
        };
        match got {
            Ok(u) => Ok(Some(u)),
            Err(false) => Ok(None),
            Err(true) => Err(CliError::Usage(format!(
                "livestream: the RTMP pull (ffmpeg) ended{}",
                self.logs()
            ))),
        }
    }

    /// The ends of the processes' logs, for error messages.
    fn logs(&self) -> String {
        tail_of(&[
            &self.dir.join("push.log"),
            &self.dir.join("pull.log"),
            &self.dir.join("error.log"),
        ])
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // Closing the queue ends the writer thread once the push is gone.
        self.to_push = None;
        for child in [&mut self.push, &mut self.pull, &mut self.nginx]
            .into_iter()
            .filter_map(Option::take)
        {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// nginx's configuration: one process in the foreground, RTMP on loopback `port`, live
/// streaming without recording; logs and pid in `dir`.
fn nginx_conf(module: &Path, dir: &Path, port: u16) -> String {
    let d = dir.display();
    format!(
        "load_module {};\n\
         daemon off;\n\
         master_process off;\n\
         worker_processes 1;\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/error.log info;\n\
         events {{ worker_connections 64; }}\n\
         rtmp {{\n    server {{\n        listen 127.0.0.1:{port};\n        \
         application live {{ live on; record off; wait_key on; }}\n    }}\n}}\n",
        module.display()
    )
}

/// Removes the directories of runs whose process is gone (killed before its drop ran).
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// nginx on PATH or in the usual sbin directories (often not on a user's PATH).
fn find_nginx() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/usr/local/nginx/sbin"].map(PathBuf::from))
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
}

/// An `ffmpeg` command logging errors to `log`.
fn ffmpeg(log: &Path) -> Result<Command, CliError> {
    let mut cmd = Command::new("ffmpeg");
    cmd.args(["-nostdin", "-hide_banner", "-loglevel", "error"])
        .stderr(File::create(log)?);
    die_with_parent(&mut cmd);
    Ok(cmd)
}

/// Makes the child get SIGKILL when this process dies without running [`Relay`]'s drop (a
/// signal, a crash), so no server or `ffmpeg` outlives the run.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure only makes one async-signal-safe system call (prctl).
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(std::io::Error::from)
        });
    }
}

fn no_ffmpeg(e: std::io::Error) -> CliError {
    CliError::Usage(format!(
        "cannot run ffmpeg (scripts/install-deps.sh installs it): {e}"
    ))
}

/// The last lines of each of `files` that exist and are not empty.
fn tail_of(files: &[&Path]) -> String {
    let mut s = String::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        if lines.is_empty() {
            continue;
        }
        let name = f
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into());
        s += &format!("\n--- {name}:");
        for l in &lines[lines.len().saturating_sub(6)..] {
            s += "\n  ";
            s += l;
        }
    }
    s
}

/// The pull's reader: splits its stdout into access units and sends them until either side
/// goes away.
fn read_units(mut out: impl Read, tx: Sender<Vec<u8>>) {
    let mut splitter = AuSplitter::default();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        match out.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                for unit in splitter.push(&chunk[..n]) {
                    if tx.send(unit).is_err() {
                        return;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if let Some(unit) = splitter.finish() {
        let _ = tx.send(unit);
    }
}

/// The push's writer: copies queued packets to the push's stdin until either side goes away.
fn write_packets(mut stdin: ChildStdin, rx: Receiver<Vec<u8>>) {
    for packet in rx {
        if stdin
            .write_all(&packet)
            .and_then(|()| stdin.flush())
            .is_err()
        {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Junk, then three units: an IDR with an end marker, a P picture with an end marker, and
    /// a P picture without one.
    fn stream() -> (Vec<u8>, Vec<Vec<u8>>) {
        let units = vec![
            vec![0, 0, 0, 1, 9, 0xf0, 0, 0, 1, 0x65, 7, 8],
            vec![0, 0, 1, 9, 0xf0, 0, 0, 0, 1, 0x41, 5],
            vec![0, 0, 0, 1, 9, 0xf0, 0, 0, 1, 0x41, 6],
        ];
        let mut s = vec![0, 0, 0, 1, 0x67, 1, 2];
        s.extend_from_slice(&units[0]);
        s.extend_from_slice(&AU_END[..7]);
        s.extend_from_slice(&units[1]);
        s.extend_from_slice(&AU_END[..7]);
        s.extend_from_slice(&units[2]);
        (s, units)
    }

    #[test]
    fn splits_access_units_in_any_chunking() {
        let (s, expect) = stream();
        for chunk in [1, 2, 3, 5, 7, s.len()] {
            let mut sp = AuSplitter::default();
            let mut got: Vec<Vec<u8>> = s.chunks(chunk).flat_map(|c| sp.push(c)).collect();
            got.extend(sp.finish());
            assert_eq!(got, expect, "chunks of {chunk}");
        }
        assert_eq!(AuSplitter::default().finish(), None);
    }

    #[test]
    fn an_end_marker_completes_a_unit_at_once() {
        let (_, units) = stream();
        let mut sp = AuSplitter::default();
        assert!(sp.push(&units[0]).is_empty());
        assert_eq!(sp.push(&AU_END), vec![units[0].clone()]);
        // Without markers, units end at the next delimiter.
        let mut sp = AuSplitter::default();
        assert!(sp.push(&units[1]).is_empty());
        assert_eq!(sp.push(&units[2]), vec![units[1].clone()]);
        assert_eq!(sp.finish(), Some(units[2].clone()));
    }

    #[test]
    fn finds_idr_slices() {
        let (_, units) = stream();
        assert!(has_idr(&units[0]));
        assert!(!has_idr(&units[1]));
    }

    #[test]
    fn nginx_config_is_loopback_live_only() {
        let c = nginx_conf(
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
