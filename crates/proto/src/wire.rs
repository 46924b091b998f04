//! Fixed-size ring entries and the numbers carried in them.
//!
//! A [`Request`] travels guest -> host on the submission ring, a [`Completion`] host -> guest
//! on the completion ring; both are 64 bytes, `repr(C)`, little-endian, and read out of shared
//! memory by value before they are looked at.

use vm_memory::ByteValued;

/// One submission ring entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Request {
    /// Guest-chosen sequence number, echoed in the completion.
    pub seq: u64,
    /// An [`Opcode`] value.
    pub opcode: u32,
    /// A [`DeviceId`] value: the device whose queue runs this request.
    pub device: u32,
    /// Opcode-specific arguments.
    pub args: [u64; 6],
}

// SAFETY: plain old data made of integers, no padding (8 + 4 + 4 + 48 bytes).
unsafe impl ByteValued for Request {}

/// Flag in `args[4]` of an `EndAccess`: the guest waits for the completion and blocks for the
/// prefetch compensation it carries. Without it (a detached end_access, fence ordering), the
/// host holds the writer's next fence signal until the prefetch copies are done instead.
pub const ACCESS_COMPENSATES: u64 = 1;

/// Flag in `args[4]` of a CPU `EndAccess` of a write: a posted write. The guest wrote the
/// range in its window without a begin_access (it knows where the region lies from an
/// earlier one) and the host begins and ends the write in one step. Refused
/// (`BadArgument`, nothing published: the window's range is marked stale, so the bytes
/// written there are never read as the region's) when a device wrote the region since the
/// guest's CPU did or a copy into the window is in flight; on a device's queue, refused.
pub const ACCESS_BEGINS: u64 = 2;

impl Request {
    /// Size of an entry in the ring.
    pub const SIZE: usize = 64;

    /// Builds a request.
    pub fn new(seq: u64, opcode: Opcode, device: DeviceId, args: [u64; 6]) -> Self {
        Request {
            seq,
            opcode: opcode as u32,
            device: device.0,
            args,
        }
    }
}

/// One completion ring entry.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Completion {
    /// Sequence number of the request this completes.
    pub seq: u64,
    /// A [`Status`] value (0 = ok).
    pub status: u32,
    /// Number of requests still queued on the host for this guest when it was posted (a
    /// flow-control hint).
    pub queue_depth: u32,
    /// Opcode-specific results.
    pub values: [u64; 6],
}

// SAFETY: plain old data made of integers, no padding (8 + 4 + 4 + 48 bytes).
unsafe impl ByteValued for Completion {}

impl Completion {
    /// Size of an entry in the ring.
    pub const SIZE: usize = 64;

    /// A successful completion.
    pub fn ok(seq: u64, values: [u64; 6]) -> Self {
        Completion {
            seq,
            status: Status::Ok as u32,
            queue_depth: 0,
            values,
        }
    }

    /// A failed completion.
    pub fn err(seq: u64, status: Status) -> Self {
        Completion {
            seq,
            status: status as u32,
            queue_depth: 0,
            values: [0; 6],
        }
    }

    /// A failed completion carrying the device's reason: up to [`REASON_BYTES`] bytes of
    /// UTF-8 in the values (NUL-padded; a longer reason is cut at a character boundary and
    /// ends with "..."), which a failed completion otherwise leaves zero.
    pub fn err_with_reason(seq: u64, status: Status, reason: &str) -> Self {
        let mut bytes = [0u8; REASON_BYTES];
        if reason.len() <= REASON_BYTES {
            bytes[..reason.len()].copy_from_slice(reason.as_bytes());
        } else {
            let mut end = REASON_BYTES - 3;
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            bytes[..end].copy_from_slice(&reason.as_bytes()[..end]);
            bytes[end..end + 3].copy_from_slice(b"...");
        }
        let mut c = Completion::err(seq, status);
        for (v, chunk) in c.values.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            *v = u64::from_le_bytes(w);
        }
        c
    }

    /// The reason a failed completion carries, `None` for a success or an empty reason. The
    /// bytes come from the host: invalid UTF-8 and control characters are replaced.
    pub fn reason(&self) -> Option<String> {
        if self.status == Status::Ok as u32 {
            return None;
        }
        let bytes: Vec<u8> = self.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let len = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
        let text: String = String::from_utf8_lossy(&bytes[..len])
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        (!text.is_empty()).then_some(text)
    }
}

/// Bytes of a reason a failed [`Completion`] carries at most.
pub const REASON_BYTES: usize = 48;

macro_rules! u32_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $n:expr),* $(,)? }) => {
        $(#[$m])*
        #[repr(u32)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $v = $n),* }

        impl $name {
            /// Every value, in declaration order (the C header generator lists them).
            pub const ALL: &'static [$name] = &[$($name::$v),*];

            /// Decodes a raw value, `None` if unknown.
            pub fn from_u32(v: u32) -> Option<Self> {
                match v { $($n => Some($name::$v),)* _ => None }
            }

            /// The variant's name as declared (`Yuv420p`).
            pub fn name(self) -> &'static str {
                match self { $($name::$v => stringify!($v),)* }
            }
        }
    };
}

u32_enum!(
    /// Requests understood by the host.
    Opcode {
        /// Does nothing; used to measure the round trip.
        Nop = 0,
        /// args: size, width, height, format, usage -> values: id, size, stride.
        Alloc = 1,
        /// args: id.
        Free = 2,
        /// args: id, offset, len, mode -> values: window offset (CPU device only).
        BeginAccess = 3,
        /// args: id, offset, len, mode -> values: compensation ns the guest should block.
        EndAccess = 4,
        /// args: device opcode, then device-defined -> values: device-defined.
        DeviceCmd = 5,
        /// -> values: guest id, regions, bytes held.
        Stats = 6,
        /// args: page -> values: that page of the guest's [`Counters`](crate::counters::Counters)
        /// record, then of its copy ledger (see [`crate::counters`]).
        Counters = 7,
        /// -> values: fence id (packed index and generation).
        FenceCreate = 8,
        /// Queued on `device`: signal `args[0]` once the device's earlier commands completed.
        FenceSignal = 9,
        /// Queued on `device`: hold the device's later commands until `args[0]` is signaled.
        FenceWait = 10,
        /// args: fence id. The guest no longer needs the fence.
        FenceRelease = 11,
        /// args: fence id -> values: 1 if signaled (for fences outside the shared page).
        FenceStatus = 12,
        /// A [`DeviceCmd`](Opcode::DeviceCmd) that takes its own accesses: the device begins
        /// an access to the whole of each region the command names (in the declared mode)
        /// before running it and ends them once it has answered, as a begin_access, the
        /// command and a detached end_access queued on the device would, in one request.
        DeviceCmdAccess = 13,
    }
);

impl Opcode {
    /// Whether the request runs a device command (`args[0]` is the device's opcode).
    pub fn runs_device_command(self) -> bool {
        matches!(self, Opcode::DeviceCmd | Opcode::DeviceCmdAccess)
    }
}

u32_enum!(
    /// Status of a completion. The C ABI returns these negated.
    Status {
        /// Success.
        Ok = 0,
        /// The opcode is neither a core request nor a command of the device.
        UnknownOpcode = 1,
        /// No device has this id.
        UnknownDevice = 2,
        /// The region id is not one of the guest's regions.
        NoSuchRegion = 3,
        /// An offset or length outside the region (or the window).
        OutOfRange = 4,
        /// An argument the host refused (bad format, size, handle, record, ...).
        BadArgument = 5,
        /// The guest's window, memory quota or region limit is exhausted.
        OutOfMemory = 6,
        /// The device cannot take the request now; try again later.
        Busy = 7,
        /// The device's backend failed while running the command.
        DeviceError = 8,
        /// The device or daemon does not support this request or format.
        NotSupported = 9,
        /// The connection is closed (or closing).
        Closed = 10,
        /// An error inside the daemon (a bug, not the guest's fault).
        Internal = 11,
        /// The daemon's policy does not allow this guest the device or command.
        PermissionDenied = 12,
    }
);

impl Status {
    /// A human-readable message for the status.
    pub fn message(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::UnknownOpcode => "unknown opcode",
            Status::UnknownDevice => "unknown device",
            Status::NoSuchRegion => "no such region (or not yours)",
            Status::OutOfRange => "offset or length out of range",
            Status::BadArgument => "bad argument",
            Status::OutOfMemory => "out of memory (window or guest quota exhausted)",
            Status::Busy => "busy, try again",
            Status::DeviceError => "device error",
            Status::NotSupported => "not supported",
            Status::Closed => "connection closed",
            Status::Internal => "internal error",
            Status::PermissionDenied => "permission denied by the daemon's policy",
        }
    }
}

u32_enum!(
    /// How a device accesses a region between begin_access and end_access.
    AccessMode {
        /// The device reads the region's contents.
        Read = 1,
        /// The device overwrites the bytes (their old contents need not be fetched).
        Write = 2,
        /// The device reads and modifies the bytes.
        ReadWrite = 3,
    }
);

impl AccessMode {
    /// Whether the access reads existing contents.
    pub fn reads(self) -> bool {
        matches!(self, AccessMode::Read | AccessMode::ReadWrite)
    }

    /// Whether the access modifies contents.
    pub fn writes(self) -> bool {
        matches!(self, AccessMode::Write | AccessMode::ReadWrite)
    }
}

u32_enum!(
    /// Pixel formats a region can be allocated with.
    Format {
        /// Untyped bytes; size given explicitly.
        Blob = 0,
        /// 8-bit R, G, B, A bytes per pixel (straight alpha); stride `width * 4`.
        Rgba8 = 1,
        /// 8-bit B, G, R, A bytes per pixel (straight alpha); stride `width * 4`.
        Bgra8 = 2,
        /// Y plane then interleaved U/V at half resolution; even width and height, stride `width`.
        Nv12 = 3,
        /// Y, U and V planes, chroma at half resolution; even width and height, stride `width`.
        Yuv420p = 4,
        /// Packed 4:2:2, two bytes per pixel (a 3840x2160 frame is 15.8 MiB).
        Yuyv = 5,
    }
);

/// Largest width or height a region may be allocated with (larger than
/// `virtsoc_frame::MAX_DIMENSION`, the most any device reads).
pub const MAX_IMAGE_DIMENSION: u32 = 1 << 15;

impl Format {
    /// Size in bytes and row stride of a packed `width` x `height` image, `None` if the
    /// dimensions do not fit the format (zero, odd where the format halves them, past
    /// [`MAX_IMAGE_DIMENSION`]). The frame formats' sizes are `virtsoc_frame::FrameLayout`'s
    /// (the one plane rule); YUYV, which no device reads, is one plane of two bytes a pixel.
    pub fn image_size(self, width: u32, height: u32) -> Option<(u64, u32)> {
        if self == Format::Yuyv {
            let ok = width != 0 && height != 0 && width.is_multiple_of(2);
            let fits = width <= MAX_IMAGE_DIMENSION && height <= MAX_IMAGE_DIMENSION;
            return (ok && fits).then(|| (u64::from(width) * u64::from(height) * 2, width * 2));
        }
        let format = virtsoc_frame::PixelFormat::try_from(self).ok()?;
        let layout =
            virtsoc_frame::FrameLayout::packed_within(format, width, height, MAX_IMAGE_DIMENSION)
                .ok()?;
        Some((layout.size() as u64, layout.stride))
    }
}

/// The one mapping from the wire's allocation formats to frame formats: the image formats a
/// device reads convert, [`Format::Blob`] (no frame) and [`Format::Yuyv`] (allocated, read by
/// no device) are [`Status::NotSupported`].
impl TryFrom<Format> for virtsoc_frame::PixelFormat {
    type Error = Status;

    fn try_from(f: Format) -> Result<Self, Status> {
        use virtsoc_frame::PixelFormat as P;
        match f {
            Format::Nv12 => Ok(P::Nv12),
            Format::Yuv420p => Ok(P::Yuv420p),
            Format::Rgba8 => Ok(P::Rgba8),
            Format::Bgra8 => Ok(P::Bgra8),
            Format::Blob | Format::Yuyv => Err(Status::NotSupported),
        }
    }
}

/// Usage bits given at allocation (informational, kept in the region metadata).
pub mod usage {
    /// The CPU reads the region.
    pub const CPU_READ: u32 = 1;
    /// The CPU writes the region.
    pub const CPU_WRITE: u32 = 2;
    /// A device reads the region.
    pub const DEVICE_READ: u32 = 4;
    /// A device writes the region.
    pub const DEVICE_WRITE: u32 = 8;
}

/// A virtual device as named in requests: the one definition is in `virtsoc-ids`.
pub use virtsoc_ids::DeviceId;

/// Device opcodes of the test devices (first argument of [`Opcode::DeviceCmd`]).
pub mod testdev {
    /// Producer: `args[1]` = region id, `args[2]` = seed -> `values[0]` = crc32 of what was written.
    pub const WRITE_PATTERN: u64 = 1;
    /// Consumer: `args[1]` = region id -> `values[0]` = crc32 of the region.
    pub const CHECKSUM: u64 = 2;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_completions_carry_a_short_reason() {
        let c = Completion::err_with_reason(7, Status::DeviceError, "h264: invalid data");
        assert_eq!((c.seq, c.status), (7, Status::DeviceError as u32));
        assert_eq!(c.reason().as_deref(), Some("h264: invalid data"));
        assert_eq!(Completion::err(7, Status::Busy).reason(), None);
        assert_eq!(Completion::ok(7, [u64::MAX; 6]).reason(), None);
        let fits = "y".repeat(REASON_BYTES);
        let r = Completion::err_with_reason(1, Status::BadArgument, &fits).reason();
        assert_eq!(r.as_ref(), Some(&fits));
        // Cut to 48 bytes, never inside a character.
        let long = format!("{}é and more", "x".repeat(REASON_BYTES - 4));
        let r = Completion::err_with_reason(1, Status::BadArgument, &long).reason();
        assert_eq!(r, Some(format!("{}...", "x".repeat(REASON_BYTES - 4))));
        // Whatever the host sends is made printable.
        let mut c = Completion::err(1, Status::DeviceError);
        c.values[0] = u64::from_le_bytes(*b"a\nb\xff\x01c\0\0");
        assert_eq!(c.reason().as_deref(), Some("a b\u{fffd} c"));
    }

    #[test]
    fn entries_are_64_bytes() {
        assert_eq!(std::mem::size_of::<Request>(), Request::SIZE);
        assert_eq!(std::mem::size_of::<Completion>(), Completion::SIZE);
    }

    #[test]
    fn enums_round_trip_and_reject_unknown() {
        assert_eq!(Opcode::from_u32(3), Some(Opcode::BeginAccess));
        assert_eq!(Opcode::from_u32(999), None);
        assert_eq!(AccessMode::from_u32(0), None);
        assert!(AccessMode::ReadWrite.reads() && AccessMode::ReadWrite.writes());
        assert_eq!(Status::from_u32(3), Some(Status::NoSuchRegion));
    }

    /// The rule `image_size` had before it was derived from `FrameLayout`: the new answers
    /// must be the same for every format and size.
    fn image_size_before(f: Format, width: u32, height: u32) -> Option<(u64, u32)> {
        let (w, h) = (width as u64, height as u64);
        if w == 0 || h == 0 || w > 1 << 15 || h > 1 << 15 {
            return None;
        }
        let (size, stride) = match f {
            Format::Blob => return None,
            Format::Rgba8 | Format::Bgra8 => (w * h * 4, w * 4),
            Format::Yuyv => {
                if w % 2 != 0 {
                    return None;
                }
                (w * h * 2, w * 2)
            }
            Format::Nv12 | Format::Yuv420p => {
                if w % 2 != 0 || h % 2 != 0 {
                    return None;
                }
                (w * h * 3 / 2, w)
            }
        };
        Some((size, stride as u32))
    }

    #[test]
    fn image_sizes_are_the_frame_layouts_and_unchanged() {
        let dims = [
            0,
            1,
            2,
            3,
            15,
            16,
            641,
            1080,
            1920,
            16383,
            16384,
            16385,
            32766,
            32767,
            32768,
            32769,
            65536,
            u32::MAX - 1,
            u32::MAX,
        ];
        let mut accepted = 0;
        for &f in Format::ALL {
            for w in dims {
                for h in dims {
                    let new = f.image_size(w, h);
                    assert_eq!(new, image_size_before(f, w, h), "{f:?} {w}x{h}");
                    accepted += usize::from(new.is_some());
                }
            }
        }
        assert!(
            accepted > 100,
            "the grid must hit accepted sizes too: {accepted}"
        );
    }

    #[test]
    fn image_sizes() {
        assert_eq!(
            Format::Yuyv.image_size(3840, 2160),
            Some((16_588_800, 7680))
        );
        assert_eq!(Format::Nv12.image_size(1920, 1080), Some((3_110_400, 1920)));
        assert_eq!(Format::Nv12.image_size(1921, 1080), None);
        assert_eq!(Format::Rgba8.image_size(0, 10), None);
        assert_eq!(Format::Blob.image_size(1, 1), None);
    }

    #[test]
    fn frame_formats_convert_by_name() {
        use virtsoc_frame::PixelFormat;
        for f in PixelFormat::ALL {
            let wire = Format::ALL
                .iter()
                .find(|w| w.name() == format!("{f:?}"))
                .unwrap();
            assert_eq!(PixelFormat::try_from(*wire), Ok(f));
        }
        assert_eq!(
            PixelFormat::try_from(Format::Blob),
            Err(Status::NotSupported)
        );
        assert_eq!(
            PixelFormat::try_from(Format::Yuyv),
            Err(Status::NotSupported)
        );
    }
}
