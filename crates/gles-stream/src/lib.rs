//! The GLES command stream between the guest's vendor library and the host's render worker:
//! packet framing, a writer ([`Encoder`]) and a bounds-checked reader ([`Reader`]), and the
//! opcodes of the EGL and virtsoc commands that travel beside the GL calls ([`egl`]).
//! `docs/gles.md` ("The stream") is the format's definition; the GL opcodes are generated
//! from the Khronos registry by `virtsoc-gles-gen`.
//!
//! Everything the host reads is untrusted: every read is bounds-checked and a malformed
//! packet is a [`StreamError`], never a panic.

pub mod egl;

/// The GL opcodes (1..=`COUNT`), one constant per command named as the command, generated
/// by `virtsoc-gles-gen` from the registry and `crates/gles-gen/gles.annot`.
#[allow(non_upper_case_globals)]
pub mod gl_ops {
    include!(concat!(env!("OUT_DIR"), "/gl_ops.rs"));
}

/// Kinds of GL objects whose names the guest makes and the host translates (each kind a
/// namespace of its own on the host; the guest's library gives programs and shaders names
/// from one counter, as GL does). The generated code of both sides names them (`Kind::Buffer`);
/// `virtsoc-gles-gen` parses them from the annotations' `name(KIND)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Buffer objects.
    Buffer = 0,
    /// Textures.
    Texture = 1,
    /// Framebuffer objects.
    Framebuffer = 2,
    /// Renderbuffers.
    Renderbuffer = 3,
    /// Programs.
    Program = 4,
    /// Shaders.
    Shader = 5,
    /// Query objects (GLES 3).
    Query = 6,
    /// Sampler objects (GLES 3).
    Sampler = 7,
    /// Vertex array objects (GLES 3).
    VertexArray = 8,
    /// Transform feedback objects (GLES 3).
    TransformFeedback = 9,
    /// Program pipeline objects (GLES 3.1).
    ProgramPipeline = 10,
}

/// How many kinds there are (the last one's number, plus one): `kind as usize` indexes
/// tables of this size.
pub const KINDS: usize = Kind::ProgramPipeline as usize + 1;

/// Marker of a null pointer in place of an array's byte length.
pub const NULL_ARRAY: u32 = u32::MAX;
/// Bytes of a packet header (`u32 op | u32 len`).
pub const HEADER: usize = 8;

/// What is wrong with a stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// A packet's payload was read past its end.
    #[error("packet {op:#x}: payload ends after {len} bytes, {need} more needed")]
    Short {
        /// The packet's opcode.
        op: u32,
        /// Its payload length.
        len: usize,
        /// Bytes missing.
        need: usize,
    },
    /// A packet header announces more bytes than the stream holds.
    #[error("packet {op:#x} announces {len} bytes, {left} left in the stream")]
    Truncated {
        /// The packet's opcode.
        op: u32,
        /// The announced payload length.
        len: usize,
        /// Bytes left after the header.
        left: usize,
    },
    /// The stream ends inside a packet header.
    #[error("stream ends inside a packet header ({0} bytes left)")]
    PartialHeader(usize),
    /// A packet length that is not a multiple of 4.
    #[error("packet {op:#x}: length {len} is not a multiple of 4")]
    Unaligned {
        /// The packet's opcode.
        op: u32,
        /// Its payload length.
        len: usize,
    },
    /// An opcode nobody knows.
    #[error("unknown opcode {0:#x}")]
    UnknownOp(u32),
    /// A value out of the range its command allows.
    #[error("packet {op:#x}: {what}")]
    Bad {
        /// The packet's opcode.
        op: u32,
        /// What is wrong.
        what: String,
    },
}

/// Appends packets to a byte buffer.
#[derive(Debug, Default, Clone)]
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    /// An empty stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty stream with room for `n` bytes.
    pub fn with_capacity(n: usize) -> Self {
        Encoder {
            buf: Vec::with_capacity(n),
        }
    }

    /// Bytes encoded so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing is encoded.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The encoded packets.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Forgets every packet (after a flush); keeps the allocation.
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    /// Starts a packet of opcode `op`; its length is written when the [`Packet`] drops.
    pub fn packet(&mut self, op: u32) -> Packet<'_> {
        let start = self.buf.len();
        self.buf.extend_from_slice(&op.to_le_bytes());
        self.buf.extend_from_slice(&0u32.to_le_bytes());
        Packet {
            buf: &mut self.buf,
            start,
        }
    }
}

/// One packet being written ([`Encoder::packet`]).
pub struct Packet<'a> {
    buf: &'a mut Vec<u8>,
    start: usize,
}

impl Packet<'_> {
    /// A 32-bit scalar.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A signed 32-bit scalar.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.u32(v as u32)
    }

    /// A float.
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.u32(v.to_bits())
    }

    /// A 64-bit scalar (`GLintptr`, `GLsizeiptr`, offsets).
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// An input array: its byte length, then the bytes padded to 4.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        let n = u32::try_from(b.len()).unwrap_or(NULL_ARRAY - 1);
        self.u32(n);
        self.buf.extend_from_slice(&b[..n as usize]);
        self.pad();
        self
    }

    /// A null pointer in place of an array.
    pub fn null(&mut self) -> &mut Self {
        self.u32(NULL_ARRAY)
    }

    /// An optional array: [`bytes`](Self::bytes) or [`null`](Self::null).
    pub fn opt_bytes(&mut self, b: Option<&[u8]>) -> &mut Self {
        match b {
            Some(b) => self.bytes(b),
            None => self.null(),
        }
    }

    fn pad(&mut self) {
        while (self.buf.len() - self.start) % 4 != 0 {
            self.buf.push(0);
        }
    }
}

impl Drop for Packet<'_> {
    fn drop(&mut self) {
        self.pad();
        let len = (self.buf.len() - self.start - HEADER) as u32;
        self.buf[self.start + 4..self.start + 8].copy_from_slice(&len.to_le_bytes());
    }
}

/// Reads packets out of a stream, or values out of one packet's payload.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    op: u32,
}

impl<'a> Reader<'a> {
    /// A reader of the packets in `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Reader {
            data,
            pos: 0,
            op: 0,
        }
    }

    /// The opcode of the packet this reader reads the payload of (0 for a stream reader).
    pub fn op(&self) -> u32 {
        self.op
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    /// The next packet: its opcode and a reader of its payload; `None` at the end.
    pub fn next_packet(&mut self) -> Option<Result<(u32, Reader<'a>), StreamError>> {
        let left = self.remaining();
        if left == 0 {
            return None;
        }
        if left < HEADER {
            self.pos = self.data.len();
            return Some(Err(StreamError::PartialHeader(left)));
        }
        let word = |o: usize| {
            let b = &self.data[o..o + 4];
            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
        };
        let (op, len) = (word(self.pos), word(self.pos + 4) as usize);
        let body = self.pos + HEADER;
        if len > left - HEADER {
            self.pos = self.data.len();
            return Some(Err(StreamError::Truncated {
                op,
                len,
                left: left - HEADER,
            }));
        }
        if len % 4 != 0 {
            self.pos = self.data.len();
            return Some(Err(StreamError::Unaligned { op, len }));
        }
        self.pos = body + len;
        Some(Ok((
            op,
            Reader {
                data: &self.data[body..body + len],
                pos: 0,
                op,
            },
        )))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], StreamError> {
        if self.remaining() < n {
            return Err(StreamError::Short {
                op: self.op,
                len: self.data.len(),
                need: n - self.remaining(),
            });
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// A 32-bit scalar.
    pub fn u32(&mut self) -> Result<u32, StreamError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A signed 32-bit scalar.
    pub fn i32(&mut self) -> Result<i32, StreamError> {
        self.u32().map(|v| v as i32)
    }

    /// A float.
    pub fn f32(&mut self) -> Result<f32, StreamError> {
        self.u32().map(f32::from_bits)
    }

    /// A 64-bit scalar.
    pub fn u64(&mut self) -> Result<u64, StreamError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// An input array: `None` for a null pointer.
    pub fn bytes(&mut self) -> Result<Option<&'a [u8]>, StreamError> {
        let n = self.u32()?;
        if n == NULL_ARRAY {
            return Ok(None);
        }
        let n = n as usize;
        let b = self.take(n)?;
        let pad = (4 - n % 4) % 4;
        self.take(pad.min(self.remaining()))?;
        Ok(Some(b))
    }

    /// A bad value in this packet, as an error.
    pub fn bad(&self, what: impl Into<String>) -> StreamError {
        StreamError::Bad {
            op: self.op,
            what: what.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_round_trip_with_padding_and_nulls() {
        let mut e = Encoder::new();
        e.packet(7)
            .u32(1)
            .i32(-2)
            .f32(0.5)
            .u64(1 << 40)
            .bytes(b"abc")
            .null();
        e.packet(9);
        let mut r = Reader::new(e.as_bytes());
        let (op, mut p) = r.next_packet().unwrap().unwrap();
        assert_eq!(op, 7);
        assert_eq!(p.u32().unwrap(), 1);
        assert_eq!(p.i32().unwrap(), -2);
        assert_eq!(p.f32().unwrap(), 0.5);
        assert_eq!(p.u64().unwrap(), 1 << 40);
        assert_eq!(p.bytes().unwrap(), Some(&b"abc"[..]));
        assert_eq!(p.bytes().unwrap(), None);
        assert_eq!(p.remaining(), 0);
        let (op, p) = r.next_packet().unwrap().unwrap();
        assert_eq!((op, p.remaining()), (9, 0));
        assert!(r.next_packet().is_none());
    }

    #[test]
    fn truncated_and_lying_packets_are_errors() {
        let mut e = Encoder::new();
        e.packet(7).u32(1).bytes(&[1, 2, 3, 4, 5]);
        let full = e.as_bytes().to_vec();
        for cut in 1..full.len() {
            let mut r = Reader::new(&full[..cut]);
            assert!(matches!(r.next_packet(), Some(Err(_))), "cut at {cut}");
        }
        // An array length larger than the payload.
        let mut e = Encoder::new();
        e.packet(7).u32(100);
        let mut r = Reader::new(e.as_bytes());
        let (_, mut p) = r.next_packet().unwrap().unwrap();
        assert!(matches!(p.bytes(), Err(StreamError::Short { .. })));
        // A payload length that is not a multiple of 4.
        let mut bad = 7u32.to_le_bytes().to_vec();
        bad.extend_from_slice(&3u32.to_le_bytes());
        bad.extend_from_slice(&[0, 0, 0]);
        assert!(matches!(
            Reader::new(&bad).next_packet(),
            Some(Err(StreamError::Unaligned { .. }))
        ));
    }
}
