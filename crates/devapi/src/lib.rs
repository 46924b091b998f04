//! Every virtsoc device's command set, declared once (AvA's idea, with Rust's own macros).
//!
//! A declaration names each command, its arguments (plain values, device handles, and SVM
//! regions with how the command uses them) and its results. From it come:
//! - the typed command and reply structs the guest library sends ([`DeviceCommand`]);
//! - the host's `Command` enum that decodes and validates the wire words;
//! - the metadata behind `virtsoc devices` ([`DeviceInfo`], [`ALL`]);
//! - the C header with one inline stub per command ([`c_header`]).
//!
//! Adding a device means adding its declaration here and its backend in the daemon.

#[doc(hidden)]
pub use paste;
pub use virtsoc_ids::{HandleId, RegionId};
pub use virtsoc_proto::{AccessMode, DeviceId, Status};

mod cheader;
mod macros;

pub use cheader::c_header;

/// A device command as the guest sends it.
pub trait DeviceCommand: Copy {
    /// The device that runs it.
    const DEVICE: DeviceId;
    /// Its opcode (first request word).
    const OP: u64;
    /// Its name.
    const NAME: &'static str;
    /// What it returns.
    type Reply;
    /// Request words: the opcode, then the arguments in declaration order.
    fn encode(&self) -> [u64; 6];
    /// The regions it names and how it uses them.
    fn regions(&self) -> Vec<(RegionId, AccessMode)>;
    /// Decodes the completion values.
    fn reply(values: &[u64; 6]) -> Self::Reply;
}

/// What an argument carries (declared as `u64`, `handle`, `region_r`, `region_w` or
/// `region_rw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    /// A plain value (`u64`).
    Value,
    /// A handle of an object this guest opened on the device (`handle`).
    Handle,
    /// The id of an SVM region the command reads, writes or both (`region_r`, `region_w`,
    /// `region_rw`).
    Region(AccessMode),
}

impl ArgKind {
    /// The access a region argument needs; `None` for values and handles.
    pub fn region(self) -> Option<AccessMode> {
        match self {
            ArgKind::Region(m) => Some(m),
            _ => None,
        }
    }

    /// The kind as declared.
    pub fn name(self) -> &'static str {
        match self {
            ArgKind::Value => "u64",
            ArgKind::Handle => "handle",
            ArgKind::Region(AccessMode::Read) => "region_r",
            ArgKind::Region(AccessMode::Write) => "region_w",
            ArgKind::Region(AccessMode::ReadWrite) => "region_rw",
        }
    }
}

/// One argument in a declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgInfo {
    /// Argument name, as declared.
    pub name: &'static str,
    /// What it carries.
    pub kind: ArgKind,
}

/// One command in a declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandInfo {
    /// Command name, as declared (also the stub's name in the C header).
    pub name: &'static str,
    /// Opcode: the first request word.
    pub op: u64,
    /// The declaration's doc comment, one line per `///` line.
    pub doc: &'static str,
    /// Arguments in declaration order (at most five).
    pub args: &'static [ArgInfo],
    /// Result names in declaration order (at most six completion values).
    pub results: &'static [&'static str],
}

impl CommandInfo {
    /// The regions that request words `args` (the opcode first) of this command name, with
    /// how it uses them: the same decoding as the generated `regions()`, for code that has
    /// the declaration rather than the command's type.
    pub fn regions(&self, args: &[u64; 6]) -> Vec<(RegionId, AccessMode)> {
        self.args
            .iter()
            .zip(&args[1..])
            .filter_map(|(a, w)| a.kind.region().map(|m| (RegionId(*w), m)))
            .collect()
    }
}

/// One device's declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name (the module name, e.g. `gpu`, `codec`).
    pub name: &'static str,
    /// Device id in requests.
    pub id: DeviceId,
    /// The declaration's doc comment, one line per `///` line.
    pub doc: &'static str,
    /// Its commands in declaration order.
    pub commands: &'static [CommandInfo],
}

/// Codec kinds of `codec::open_decoder` (`enum virtsoc_codec_kind` in the C header).
pub mod codec_kind {
    /// H.264 / AVC.
    pub const H264: u64 = 0;
    /// H.265 / HEVC.
    pub const HEVC: u64 = 1;
    /// VP9.
    pub const VP9: u64 = 2;
    /// AV1.
    pub const AV1: u64 = 3;

    /// Every kind with its name, for listings and the C header.
    pub const ALL: &[(&str, u64)] = &[("H264", H264), ("HEVC", HEVC), ("VP9", VP9), ("AV1", AV1)];
}

/// Bits of `codec::receive_frame`'s `flags` (`enum virtsoc_codec_frame_flag` in the C
/// header).
pub mod codec_frame_flag {
    /// The picture was decoded with errors: libavcodec concealed damaged or missing data
    /// (a corrupt packet, a missing reference, a stream joined before its recovery point).
    /// Its pixels are a best effort; later pictures may recover.
    pub const CORRUPT: u64 = 1;
    /// The stream codes an odd width or height; the picture was cropped to even (its last
    /// column or row dropped, 4:2:0 needs even sizes). `stream_info` tells both sizes.
    pub const CROPPED: u64 = 2;

    /// Every flag with its name, for the C header.
    pub const ALL: &[(&str, u64)] = &[("CORRUPT", CORRUPT), ("CROPPED", CROPPED)];
}

/// What a display plane can do (`display::present_layers`), the one rule the display and a
/// guest's composition policy both apply.
pub mod display_plane {
    /// Largest scaling of a plane, up or down, per axis.
    pub const MAX_SCALE: u64 = 4;

    /// Whether a plane can scale `from` source pixels to `to` screen pixels on one axis.
    pub fn scales(from: u32, to: u32) -> bool {
        u64::from(to) * MAX_SCALE >= u64::from(from) && u64::from(to) <= u64::from(from) * MAX_SCALE
    }
}

/// Size of one layer record in the blob passed to `gpu::composite`.
pub const LAYER_RECORD: usize = 64;
/// Size of one marker record in the blob passed to `gpu::markers`.
pub const MARKER_RECORD: usize = 16;

/// One layer of `gpu::composite`, as a 64-byte little-endian record:
/// `src u64 | crop x,y,w,h u32 | dst x,y i32, w,h u32 | rotation u32 (0, 90, 180, 270) |
/// alpha f32 | blend u32 | 12 bytes zero`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerRecord {
    /// Source region (this guest's; the GPU must have begun reading it).
    pub src: RegionId,
    /// Source rectangle `[x, y, width, height]` in source pixels; must lie inside the source.
    pub crop: [u32; 4],
    /// Destination position `[x, y]` in destination pixels (may be negative; clipped).
    pub dst_pos: [i32; 2],
    /// Destination size `[width, height]` in pixels; non-zero.
    pub dst_size: [u32; 2],
    /// Clockwise rotation in degrees: 0, 90, 180 or 270 (anything else is `BadArgument`).
    pub rotation: u32,
    /// Plane alpha in [0, 1], multiplied with the source alpha.
    pub alpha: f32,
    /// Blend over the layers below (straight alpha) instead of replacing them.
    pub blend: bool,
}

impl LayerRecord {
    /// Encodes the record.
    pub fn to_bytes(&self) -> [u8; LAYER_RECORD] {
        let mut b = [0u8; LAYER_RECORD];
        b[0..8].copy_from_slice(&u64::from(self.src).to_le_bytes());
        for (i, v) in self.crop.iter().enumerate() {
            b[8 + 4 * i..12 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        b[24..28].copy_from_slice(&self.dst_pos[0].to_le_bytes());
        b[28..32].copy_from_slice(&self.dst_pos[1].to_le_bytes());
        b[32..36].copy_from_slice(&self.dst_size[0].to_le_bytes());
        b[36..40].copy_from_slice(&self.dst_size[1].to_le_bytes());
        b[40..44].copy_from_slice(&self.rotation.to_le_bytes());
        b[44..48].copy_from_slice(&self.alpha.to_le_bytes());
        b[48..52].copy_from_slice(&u32::from(self.blend).to_le_bytes());
        b
    }

    /// Decodes a record (no validation beyond the layout: the GPU checks the values).
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let b: &[u8; LAYER_RECORD] = b.get(..LAYER_RECORD)?.try_into().ok()?;
        let u = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        Some(LayerRecord {
            src: RegionId(u64::from_le_bytes(b[0..8].try_into().ok()?)),
            crop: [u(8), u(12), u(16), u(20)],
            dst_pos: [u(24) as i32, u(28) as i32],
            dst_size: [u(32), u(36)],
            rotation: u(40),
            alpha: f32::from_bits(u(44)),
            blend: u(48) != 0,
        })
    }
}

/// One marker of `gpu::markers`, as a 16-byte little-endian record: `x i32 | y i32 |
/// size u32 | rgba u32` (r in the low byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkerRecord {
    /// Centre x in destination pixels (absolute value at most 65536).
    pub x: i32,
    /// Centre y in destination pixels (absolute value at most 65536).
    pub y: i32,
    /// Side of the square in pixels, 1..=65536.
    pub size: u32,
    /// Colour as R, G, B, A bytes (straight alpha).
    pub rgba: [u8; 4],
}

impl MarkerRecord {
    /// Encodes the record.
    pub fn to_bytes(&self) -> [u8; MARKER_RECORD] {
        let mut b = [0u8; MARKER_RECORD];
        b[0..4].copy_from_slice(&self.x.to_le_bytes());
        b[4..8].copy_from_slice(&self.y.to_le_bytes());
        b[8..12].copy_from_slice(&self.size.to_le_bytes());
        b[12..16].copy_from_slice(&self.rgba);
        b
    }

    /// Decodes a record.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let b: &[u8; MARKER_RECORD] = b.get(..MARKER_RECORD)?.try_into().ok()?;
        Some(MarkerRecord {
            x: i32::from_le_bytes(b[0..4].try_into().ok()?),
            y: i32::from_le_bytes(b[4..8].try_into().ok()?),
            size: u32::from_le_bytes(b[8..12].try_into().ok()?),
            rgba: [b[12], b[13], b[14], b[15]],
        })
    }
}

devices! {
    /// Test device: writes a seeded pattern into a region.
    device producer = 1 {
        /// Fills `region` with the pattern of `seed`; returns its CRC-32.
        fn write_pattern(region: region_w, seed: u64) -> (crc) = 1;
    }

    /// Test device: checksums a region.
    device consumer = 2 {
        /// CRC-32 of `region`.
        fn checksum(region: region_r) -> (crc) = 2;
    }

    /// A second checksum device, for multi-reader flows.
    device consumer2 = 3 {
        /// CRC-32 of `region`.
        fn checksum(region: region_r) -> (crc) = 2;
    }

    /// Video decoder and encoder (libavcodec).
    device codec = 10 {
        /// Opens a decoder for `kind` (see `codec_kind`) producing frames in `format`
        /// (NV12 or YUV420P) with `threads` decoding threads.
        fn open_decoder(kind: u64, format: u64, threads: u64) -> (handle: handle) = 1;
        /// Feeds one packet: the first `len` bytes of `bitstream`, presented at `pts`. A packet
        /// is exactly one access unit (H.264/HEVC: every NAL unit of one picture, with their
        /// Annex-B start codes), as a demuxer cuts it; not a whole stream. Packets are numbered
        /// 1, 2, ... per decoder in the order `decode` accepts them. Returns the pictures
        /// waiting for `receive_frame`. `Busy` while too many wait (receive them, then retry);
        /// `DeviceError` when this packet failed (the decoder's reason comes with it; the
        /// decoder stays usable). With frame threads (`threads` > 1) a packet's result is
        /// known only `threads - 1` packets later: a later call then succeeds (its own packet
        /// was taken) and reports the earlier failure: `failed` packets failed since the last
        /// report, the last of them given with `failed_pts` (its pts) and `failed_seq` (its
        /// number). A damaged packet whose pictures libavcodec conceals does not fail: they
        /// come out marked `VIRTSOC_CODEC_FRAME_FLAG_CORRUPT` instead.
        fn decode(handle: handle, bitstream: region_r, len: u64, pts: u64) -> (frames_ready, failed, failed_pts, failed_seq) = 2;
        /// Moves the next decoded picture into `frame` (`got` 1) or answers `got` 0 when none
        /// waits. `frame` is an image region of the decoder's format and exactly the size
        /// `stream_info` reports (else `BadArgument`); its rows may be padded. `flags`
        /// (`codec_frame_flag`): `CORRUPT` for a picture decoded with errors concealed,
        /// `CROPPED` for an odd-sized picture delivered cropped to even.
        fn receive_frame(handle: handle, frame: region_w) -> (got, pts, width, height, flags) = 3;
        /// Drains the decoder at the end of the stream; failures of the packets still in the
        /// decoder are reported as by `decode`.
        fn flush(handle: handle) -> (frames_ready, failed, failed_pts, failed_seq) = 4;
        /// Opens an H.264 encoder.
        fn open_encoder(width: u64, height: u64, fps: u64, bitrate: u64) -> (handle: handle) = 5;
        /// Encodes `frame` (NV12 or YUV420P) presented at `pts`; the packet(s) go to `out`.
        fn encode(handle: handle, frame: region_r, pts: u64, out: region_w) -> (bytes, keyframe, out_pts) = 6;
        /// Closes a decoder or encoder.
        fn close(handle: handle) -> () = 7;
        /// A decoder's picture size: `width` x `height` of the picture `receive_frame` delivers
        /// next (the oldest waiting one; with none waiting, the last decoded one; 0 x 0 before
        /// the first), its `format` (the decoder's output format) and `changes`, how many times
        /// the size changed between consecutive decoded pictures up to that one (so it
        /// changes with the picture whose size changed, even when later pictures already
        /// wait behind it). Call it before
        /// `receive_frame` and reallocate the frame region when the size differs.
        /// `picture_width` x `picture_height` is that picture's size as the stream codes it:
        /// an odd width or height is delivered cropped to even (`width` x `height`), so the
        /// two differ exactly when `receive_frame` reports `CROPPED`.
        fn stream_info(handle: handle) -> (width, height, format, changes, picture_width, picture_height) = 8;
    }

    /// Image signal processor: colour conversion and scaling between the regions' formats.
    device isp = 11 {
        /// Converts `src` into `dst` (formats and sizes from the regions' metadata).
        fn convert(src: region_r, dst: region_w) -> () = 1;
    }

    /// Camera: a synthetic moving pattern with the capture time stamped into the pixels.
    device camera = 12 {
        /// Captures the next frame into `frame` (its format and size set the mode).
        fn capture(frame: region_w) -> (index, capture_ns, marker_x, marker_y) = 1;
    }

    /// GPU (wgpu): composition, YUV sampling, 360-degree projection, overlays.
    device gpu = 13 {
        /// Composites `count` layers described by 64-byte records in `layers` into `dst`.
        fn composite(layers: region_r, count: u64, dst: region_w) -> (gpu_us) = 1;
        /// Renders a view of equirectangular `src` into `dst`; angles in microradians
        /// (two's complement).
        fn project(src: region_r, dst: region_w, yaw: u64, pitch: u64, fov: u64) -> (gpu_us) = 2;
        /// Draws `count` markers (16-byte records: x, y, size as u32, rgba) from `markers` onto `dst`.
        fn markers(markers: region_r, count: u64, dst: region_rw) -> (gpu_us) = 3;
        /// Converts `src` into `dst` with a compute shader.
        fn convert(src: region_r, dst: region_w) -> (gpu_us) = 4;
        /// `composite` limited to the damaged rectangle of `dst` packed in `damage` as
        /// `x | y << 16 | width << 32 | height << 48` (see `pack_damage`): the layers are
        /// placed as for the whole of `dst` and drawn only inside the rectangle, over what
        /// `dst` holds there; the pixels outside are left alone (so `dst` is read and
        /// written). `BadArgument` for an empty rectangle or one reaching outside `dst`.
        fn composite_damage(layers: region_r, count: u64, dst: region_rw, damage: u64) -> (gpu_us) = 5;
    }

    /// Display: scan-out paced by a vsync clock; headless unless a window is configured.
    device display = 14 {
        /// Queues `frame` for the next vsync; `capture_ns` (0: none) is when its content was
        /// captured or decoded, for motion-to-photon latency.
        fn present(frame: region_r, capture_ns: u64) -> (frame_id) = 1;
        /// Counters of this guest's frames.
        fn stats() -> (presented, dropped, vsyncs, latency_p50_ns, latency_p99_ns, samples) = 2;
        /// Signals virtual fence `fence` at the next vsync.
        fn signal_at_vsync(fence: u64) -> () = 3;
        /// Writes the last scanned-out frame as a PNG into the daemon's snapshot directory.
        fn snapshot() -> (frame_id) = 4;
        /// Queues the `count` layer records (64 bytes each, as for the GPU's `composite`) in
        /// `layers` as display planes for the next vsync, each scanned out of its source region
        /// (which the guest brackets with a display read access). Planes do not rotate, scale
        /// at most 4x either way, and number at most `planes` of `mode`: anything else answers
        /// `NotSupported` (compose those layers on the GPU). `capture_ns` as for `present`.
        fn present_layers(layers: region_r, count: u64, capture_ns: u64) -> (frame_id) = 5;
        /// The screen: size, refresh rate and how many planes a frame may use.
        fn mode() -> (width, height, refresh_hz, planes) = 6;
        /// With the daemon's `--display-verify`: the CRC-32 of this guest's last presented
        /// frame as the screen shows it (RGBA, composed from its planes); `NotSupported`
        /// otherwise, `Busy` before the first frame.
        fn checksum() -> (frame_id, crc) = 7;
        /// The vsync clock and this guest's pipeline timing, for pacing frames so they reach
        /// the display just before a vsync (as Android's Choreographer phase offsets do):
        /// the last vsync on CLOCK_MONOTONIC (ns, 0 before the first), the refresh period
        /// (ns), and the 90th percentile and the largest capture (or decode) time -> present
        /// over this guest's last frames that had one (`samples` of them, at most 30).
        fn timing() -> (last_vsync_ns, period_ns, ready_p90_ns, samples, ready_max_ns) = 8;
        /// The daemon's consuming display sink (`--display-sink crc`), which reads every byte
        /// of every plane of each scanned-out frame once: whether it is on (`enabled` 1), and
        /// for this guest's frames the frames and bytes it read, the frames it missed (still
        /// busy with earlier ones) and the CRC-32 of the last frame it read.
        fn sink() -> (enabled, frames, bytes, missed, crc) = 9;
    }

    /// Cellular modem: an AT-command channel (registration, signal, SMS, calls).
    device modem = 15 {
        /// Sends `len` (at most 32) bytes packed little-endian in `b0`..`b3`.
        fn write(len: u64, b0: u64, b1: u64, b2: u64, b3: u64) -> (accepted) = 1;
        /// Reads up to 40 bytes of modem output, packed little-endian in `b0`..`b4`.
        fn read() -> (len, b0, b1, b2, b3, b4) = 2;
    }

    /// OpenGL ES: runs a guest's GLES command stream (`docs/gles.md`) in the guest's render
    /// worker process on the host's EGL/GLES.
    device gles = 16 {
        /// Runs the first `len` bytes of `stream` (whole packets) and answers the results of
        /// its calls (`reply_len` bytes): at most 32 bytes come in the result words `inline0`
        /// to `inline3` (little-endian, `held` 2); more are written at the start of region
        /// `reply` (write access begun from this device; 0: none expected; `held` 0), or,
        /// when they exceed it, held for `read_reply` (`held` 1). `DeviceError` with a reason
        /// starting "context lost" once the worker is gone (every later exec too);
        /// `BadArgument` for a malformed stream (the batch stops there).
        fn exec(stream: region_r, len: u64, reply: u64) -> (reply_len, held, inline0, inline1, inline2, inline3) = 1;
        /// Writes the answers `exec` held back into `reply` (which must hold them all).
        fn read_reply(reply: region_w) -> (reply_len) = 2;
        /// Reads guest surface `surface` (the draw surface of the context the stream last
        /// ran on) back into `frame`, an RGBA8 image region of exactly the surface's size
        /// (`BadArgument` with the size in the reason otherwise), for the display.
        fn readback(surface: u64, frame: region_w) -> (width, height) = 3;
        /// Imports region `region` (read access begun from this device, so the SVM's
        /// coherence brought it into the `gles` domain) into guest image `image` (an
        /// EGLImage the guest made in its stream), laid out as `size` (`width | height <<
        /// 32`), `layout` (`stride | format << 32`, format 1 RGBA8, 3 NV12, 4 YUV 4:2:0) and
        /// `planes` (`offset1 | offset2 << 32`): the daemon hands the bytes to the render
        /// worker, which uploads them into the image's texture. Skipped (`imported` 0)
        /// when the region's write generation is the one of this image's last import,
        /// unless bit 63 of `image` (force) is set. `BadArgument` with the reason for a
        /// layout that does not fit the region or an unknown image.
        fn import(image: u64, region: region_r, size: u64, layout: u64, planes: u64) -> (imported, bytes) = 4;
    }

    /// Host services (virtio-vapp): channels to the services the daemon hosts (`geo`,
    /// `sensor`, `clipboard`, `bulk`). A channel's rings and slots live at the start of a blob
    /// region the guest keeps a CPU access open on (laid out as `virtsoc_services::chan`
    /// says); after `open` the guest and the channel's host thread talk through them.
    device service = 17 {
        /// Opens a channel to the service named by `name0`, `name1` (1 to 16 ASCII bytes,
        /// packed little-endian, NUL padded) on the channel laid out in region `ring`.
        /// `PermissionDenied` when the services policy does not let this guest use it,
        /// `NotSupported` for an unknown service, `BadArgument` for a bad layout.
        fn open(name0: u64, name1: u64, ring: u64) -> (channel, entries) = 1;
        /// Closes channel `channel` of this guest (a call in progress finishes on the host;
        /// its answer is not delivered).
        fn close(channel: u64) -> () = 2;
        /// Resumes channel `channel`, which came with this guest's session from another
        /// daemon (a migration, a restart), on the channel laid out afresh at the start of
        /// region `ring` (the region it lived in): same id, new rings. The daemon first posts
        /// the `answers` the guest may not have read on the old daemon (it takes those it
        /// waits for), then the guest sends its calls still unanswered again.
        /// `BadArgument` for a channel that is not waiting to be resumed or another region.
        fn resume(channel: u64, ring: u64) -> (entries, answers) = 3;
    }
}

/// The `damage` argument of `gpu::composite` for the rectangle at (`x`, `y`) of `width` x
/// `height` pixels (each at most 65535).
pub fn pack_damage(x: u16, y: u16, width: u16, height: u16) -> u64 {
    u64::from(x) | u64::from(y) << 16 | u64::from(width) << 32 | u64::from(height) << 48
}

/// The rectangle (x, y, width, height) packed by [`pack_damage`]; `None` for 0 (the whole
/// destination).
pub fn unpack_damage(damage: u64) -> Option<[u32; 4]> {
    (damage != 0).then(|| {
        let f = |shift: u32| ((damage >> shift) & 0xffff) as u32;
        [f(0), f(16), f(32), f(48)]
    })
}

/// The declaration of the device with id `id`.
pub fn device(id: DeviceId) -> Option<&'static DeviceInfo> {
    ALL.iter().find(|d| d.id == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_round_trip_through_the_wire() {
        let d = codec::Decode {
            handle: HandleId(7),
            bitstream: RegionId(11),
            len: 1234,
            pts: 99,
        };
        let w = d.encode();
        assert_eq!(w, [2, 7, 11, 1234, 99, 0]);
        assert_eq!(codec::Command::decode(&w), Ok(codec::Command::Decode(d)));
        assert_eq!(d.regions(), vec![(RegionId(11), AccessMode::Read)]);
        let r = codec::ReceiveFrame {
            handle: HandleId(1),
            frame: RegionId(5),
        };
        assert_eq!(r.regions(), vec![(RegionId(5), AccessMode::Write)]);
        assert_eq!(
            codec::Command::decode(&[99, 0, 0, 0, 0, 0]),
            Err(Status::UnknownOpcode)
        );
        let rep = codec::ReceiveFrameReply::from_values(&[1, 2, 3, 4, 0, 0]);
        assert_eq!((rep.got, rep.pts, rep.width, rep.height), (1, 2, 3, 4));
        assert_eq!(rep.to_values(), [1, 2, 3, 4, 0, 0]);
        assert_eq!(gpu::Markers::OP, 3);
        assert_eq!(
            gpu::Markers {
                markers: RegionId(1),
                count: 2,
                dst: RegionId(3)
            }
            .regions(),
            vec![
                (RegionId(1), AccessMode::Read),
                (RegionId(3), AccessMode::ReadWrite)
            ]
        );
    }

    /// The wire keeps its words: a handle and regions are decoded from them into typed ids
    /// (and a handle result too), and encode back to the same words.
    #[test]
    fn handles_and_regions_round_trip_through_the_wire_as_typed_ids() {
        let words = [6, 0xdead_beef, 42, 5, u64::MAX, 0];
        let codec::Command::Encode(e) = codec::Command::decode(&words).unwrap() else {
            panic!("opcode 6 is encode");
        };
        assert_eq!(e.handle, HandleId(0xdead_beef));
        assert_eq!((e.frame, e.out), (RegionId(42), RegionId(u64::MAX)));
        assert_eq!(e.pts, 5);
        assert_eq!(e.encode(), words);
        let typed = vec![
            (RegionId(42), AccessMode::Read),
            (RegionId(u64::MAX), AccessMode::Write),
        ];
        assert_eq!(codec::Command::Encode(e).regions(), typed);
        let decl = codec::INFO.commands.iter().find(|c| c.op == 6).unwrap();
        assert_eq!(
            decl.regions(&words),
            typed,
            "the declaration decodes the same"
        );
        let open = codec::OpenDecoder::reply(&[9, 0, 0, 0, 0, 0]);
        assert_eq!(open.handle, HandleId(9));
        assert_eq!(open.to_values(), [9, 0, 0, 0, 0, 0]);
        let enc = codec::OpenEncoderReply {
            handle: HandleId(u64::MAX),
        };
        assert_eq!(codec::OpenEncoderReply::from_values(&enc.to_values()), enc);
        let c = gpu::CompositeDamage {
            layers: RegionId(1),
            count: 2,
            dst: RegionId(3),
            damage: pack_damage(1, 2, 3, 4),
        };
        assert_eq!(
            gpu::Command::decode(&c.encode()),
            Ok(gpu::Command::CompositeDamage(c))
        );
    }

    #[test]
    fn declarations_are_consistent() {
        let mut ids: Vec<u32> = ALL.iter().map(|d| d.id.0).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), ALL.len(), "device ids are unique");
        for d in ALL {
            let mut ops: Vec<u64> = d.commands.iter().map(|c| c.op).collect();
            ops.sort();
            ops.dedup();
            assert_eq!(
                ops.len(),
                d.commands.len(),
                "{}: opcodes are unique",
                d.name
            );
            assert!(!d.doc.trim().is_empty(), "{} is documented", d.name);
        }
        assert_eq!(device(DeviceId(10)).unwrap().name, "codec");
        assert_eq!(producer::ID, virtsoc_proto::DeviceId::PRODUCER);
        assert_eq!(
            producer::WritePattern::OP,
            virtsoc_proto::wire::testdev::WRITE_PATTERN
        );
        assert_eq!(
            consumer::Checksum::OP,
            virtsoc_proto::wire::testdev::CHECKSUM
        );
    }

    #[test]
    fn records_round_trip() {
        let l = LayerRecord {
            src: RegionId(42),
            crop: [1, 2, 3, 4],
            dst_pos: [-5, 6],
            dst_size: [7, 8],
            rotation: 90,
            alpha: 0.5,
            blend: true,
        };
        assert_eq!(LayerRecord::from_bytes(&l.to_bytes()), Some(l));
        assert_eq!(LayerRecord::from_bytes(&[0u8; 10]), None);
        let m = MarkerRecord {
            x: -1,
            y: 2,
            size: 3,
            rgba: [1, 2, 3, 4],
        };
        assert_eq!(MarkerRecord::from_bytes(&m.to_bytes()), Some(m));
    }

    #[test]
    fn c_header_has_every_command() {
        let h = c_header(ALL);
        assert!(h.contains("    VIRTSOC_DEVICE_CODEC = 10,\n"));
        assert!(h.contains(
            "/* Bracket `bitstream` (VIRTSOC_READ) with virtsoc_begin_access / virtsoc_end_access \
             on\n * VIRTSOC_DEVICE_CODEC. */\nstatic inline int virtsoc_codec_decode("
        ));
        assert!(h.contains("static inline int virtsoc_codec_decode(virtsoc_conn *c, uint64_t handle, uint64_t bitstream, uint64_t len, uint64_t pts, uint64_t *frames_ready_out, uint64_t *failed_out, uint64_t *failed_pts_out, uint64_t *failed_seq_out)"));
        assert!(
            h.contains("static inline int virtsoc_modem_read(virtsoc_conn *c, uint64_t *len_out")
        );
        for d in ALL {
            for c in d.commands {
                assert!(h.contains(&format!("virtsoc_{}_{}(", d.name, c.name)));
            }
        }
    }

    /// The C enums carry the Rust values: every `VIRTSOC_X_Y = n,` line parsed back out of
    /// the generated text equals the Rust definition it came from, and nothing is missing.
    #[test]
    fn c_header_enums_equal_the_rust_values() {
        use virtsoc_proto::wire::Format;
        let h = c_header(ALL);
        let value = |name: &str| -> u64 {
            let line = h
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{name} = ")))
                .unwrap_or_else(|| panic!("{name} missing from the header"));
            line.split('=')
                .nth(1)
                .unwrap()
                .trim()
                .trim_end_matches(',')
                .parse()
                .unwrap()
        };
        assert_eq!(value("VIRTSOC_DEVICE_CPU"), 0);
        for d in ALL {
            let name = format!("VIRTSOC_DEVICE_{}", d.name.to_uppercase());
            assert_eq!(value(&name), u64::from(d.id.0), "{name}");
        }
        assert_eq!(value("VIRTSOC_DEVICE_CODEC"), u64::from(codec::ID.0));
        assert_eq!(value("VIRTSOC_DEVICE_MODEM"), u64::from(modem::ID.0));
        assert_eq!(Format::ALL.len(), 6);
        for f in Format::ALL {
            let name = format!("VIRTSOC_FORMAT_{}", f.name().to_uppercase());
            assert_eq!(value(&name), *f as u64, "{name}");
        }
        assert_eq!(value("VIRTSOC_FORMAT_YUV420P"), Format::Yuv420p as u64);
        assert_eq!(value("VIRTSOC_FORMAT_NV12"), Format::Nv12 as u64);
        assert_eq!(value("VIRTSOC_CODEC_KIND_H264"), codec_kind::H264);
        assert_eq!(value("VIRTSOC_CODEC_KIND_HEVC"), codec_kind::HEVC);
        assert_eq!(value("VIRTSOC_CODEC_KIND_VP9"), codec_kind::VP9);
        assert_eq!(value("VIRTSOC_CODEC_KIND_AV1"), codec_kind::AV1);
        assert_eq!(
            value("VIRTSOC_CODEC_FRAME_FLAG_CORRUPT"),
            codec_frame_flag::CORRUPT
        );
        assert_eq!(
            value("VIRTSOC_CODEC_FRAME_FLAG_CROPPED"),
            codec_frame_flag::CROPPED
        );
        let entries = h.lines().filter(|l| l.starts_with("    VIRTSOC_")).count();
        assert_eq!(
            entries,
            1 + ALL.len() + Format::ALL.len() + codec_kind::ALL.len() + codec_frame_flag::ALL.len()
        );
    }
}
