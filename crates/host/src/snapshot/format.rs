//! The on-disk container of a snapshot: a header, then sections, each with its own CRC-32.
//!
//! ```text
//! header  (24 bytes)  magic "VSOCSNAP" | version u32 | sections u32 | reserved u32 | crc32 u32
//! section (20 bytes + len)  kind u32 | len u64 | reserved u32 | crc32 u32 | payload
//!     (the crc covers the section's first 16 bytes and its payload)
//! trailer (16 bytes)  "VSOCEND\0" | crc32 u32 of every section crc | reserved u32
//! ```
//!
//! All integers are little-endian. A file is written to a temporary file next to its
//! destination, flushed and `fsync`ed, renamed over the destination and the directory
//! `fsync`ed ([`SnapshotWriter`]): a crash (`kill -9`) at any point leaves either the
//! previous file or the new one, never a mix. Reading ([`read_sections`]) checks the magic,
//! the version, the header's checksum, every section length against what the file holds
//! (before allocating), every section's checksum and the trailer, and only then returns
//! anything: a truncated, corrupted or other-version file is an error naming what is wrong.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::{HostError, Result};

/// First bytes of every snapshot file.
pub const MAGIC: &[u8; 8] = b"VSOCSNAP";
/// Last section-level bytes of every snapshot file.
pub const TRAILER: &[u8; 8] = b"VSOCEND\0";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Most sections a file may declare.
pub const MAX_SECTIONS: u32 = 1 << 20;

const HEADER_LEN: usize = 24;
const SECTION_HEADER_LEN: usize = 20;
const TRAILER_LEN: usize = 16;

pub(crate) fn err(msg: impl Into<String>) -> HostError {
    HostError::Snapshot(msg.into())
}

/// One section read back: its kind and payload (checksum verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// What the section holds (one of the `SECTION_*` kinds; unknown kinds are refused).
    pub kind: u32,
    /// The section's bytes, its CRC-32 already checked.
    pub payload: Vec<u8>,
}

/// Writes a snapshot file atomically (see the module docs). Dropped without
/// [`finish`](Self::finish), it removes its temporary file and leaves the destination as it
/// was.
pub struct SnapshotWriter {
    out: Option<BufWriter<File>>,
    tmp: PathBuf,
    dest: PathBuf,
    declared: u32,
    written: u32,
    crcs: crc32fast::Hasher,
    bytes: u64,
}

impl SnapshotWriter {
    /// Starts a file at `dest` that will hold exactly `sections` sections.
    pub fn create(dest: &Path, sections: u32) -> Result<Self> {
        if sections > MAX_SECTIONS {
            return Err(err(format!("{sections} sections is over {MAX_SECTIONS}")));
        }
        let name = dest
            .file_name()
            .ok_or_else(|| err(format!("{} names no file", dest.display())))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".tmp.{}", std::process::id()));
        let tmp = dest.with_file_name(tmp_name);
        use std::os::unix::fs::OpenOptionsExt;
        // Guest memory (and a resume secret): readable by the daemon's user only.
        let file = std::fs::OpenOptions::new()
            .mode(0o600)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        let mut w = SnapshotWriter {
            out: Some(BufWriter::with_capacity(1 << 20, file)),
            tmp,
            dest: dest.to_path_buf(),
            declared: sections,
            written: 0,
            crcs: crc32fast::Hasher::new(),
            bytes: 0,
        };
        let mut h = Vec::with_capacity(HEADER_LEN);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&sections.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        let crc = crc32fast::hash(&h);
        h.extend_from_slice(&crc.to_le_bytes());
        w.put(&h)?;
        Ok(w)
    }

    fn put(&mut self, b: &[u8]) -> Result<()> {
        let out = self.out.as_mut().ok_or_else(|| err("writer finished"))?;
        out.write_all(b)?;
        self.bytes += b.len() as u64;
        Ok(())
    }

    /// Appends a section whose payload is `parts` concatenated (so a region's header and its
    /// bytes need not be copied into one buffer).
    pub fn section(&mut self, kind: u32, parts: &[&[u8]]) -> Result<()> {
        if self.written >= self.declared {
            return Err(err("more sections than declared"));
        }
        let h = section_header(kind, parts);
        let crc = u32_at(&h, 16);
        self.put(&h)?;
        for p in parts {
            self.put(p)?;
        }
        self.crcs.update(&crc.to_le_bytes());
        self.written += 1;
        Ok(())
    }

    /// Writes the trailer, syncs the file, renames it over the destination and syncs the
    /// directory. Returns the file's size.
    pub fn finish(mut self) -> Result<u64> {
        if self.written != self.declared {
            return Err(err(format!(
                "{} sections written, {} declared",
                self.written, self.declared
            )));
        }
        let mut t = Vec::with_capacity(TRAILER_LEN);
        t.extend_from_slice(TRAILER);
        t.extend_from_slice(&self.crcs.clone().finalize().to_le_bytes());
        t.extend_from_slice(&0u32.to_le_bytes());
        self.put(&t)?;
        let out = self.out.take().ok_or_else(|| err("writer finished"))?;
        let file = out
            .into_inner()
            .map_err(|e| HostError::Io(e.into_error()))?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&self.tmp, &self.dest)?;
        let dir = match self.dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        File::open(&dir)?.sync_all()?;
        Ok(self.bytes)
    }
}

impl Drop for SnapshotWriter {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn read_exact(r: &mut impl Read, buf: &mut [u8], what: &str) -> Result<()> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => err(format!("truncated file: {what} is cut short")),
        _ => HostError::Io(e),
    })
}

/// Reads and checks a whole snapshot file (see the module docs): its sections, in order.
pub fn read_sections(path: &Path) -> Result<Vec<Section>> {
    let file = File::open(path)?;
    let total = file.metadata()?.len();
    let mut r = std::io::BufReader::with_capacity(1 << 20, file);
    if total < (HEADER_LEN + TRAILER_LEN) as u64 {
        return Err(err(format!(
            "truncated file: {total} bytes is shorter than a header and a trailer"
        )));
    }
    let mut h = [0u8; HEADER_LEN];
    read_exact(&mut r, &mut h, "the header")?;
    if &h[..8] != MAGIC {
        return Err(err("not a virtsoc snapshot (bad magic)"));
    }
    let version = u32_at(&h, 8);
    if version != VERSION {
        return Err(err(format!(
            "snapshot format version {version}: this virtsocd reads version {VERSION} only"
        )));
    }
    if crc32fast::hash(&h[..20]) != u32_at(&h, 20) {
        return Err(err("corrupted header (checksum mismatch)"));
    }
    let count = u32_at(&h, 12);
    if count > MAX_SECTIONS {
        return Err(err(format!("{count} sections is over {MAX_SECTIONS}")));
    }
    let mut left = total - HEADER_LEN as u64;
    let mut sections = Vec::new();
    let mut crcs = crc32fast::Hasher::new();
    for i in 0..count {
        let what = format!("section {i} of {count}");
        if left < (SECTION_HEADER_LEN + TRAILER_LEN) as u64 {
            return Err(err(format!("truncated file: {what} is missing")));
        }
        let mut sh = [0u8; SECTION_HEADER_LEN];
        read_exact(&mut r, &mut sh, &what)?;
        left -= SECTION_HEADER_LEN as u64;
        let (kind, len, crc) = (u32_at(&sh, 0), u64_at(&sh, 4), u32_at(&sh, 16));
        if u32_at(&sh, 12) != 0 {
            return Err(err(format!("corrupted file: {what} has a bad header")));
        }
        if len > left.saturating_sub(TRAILER_LEN as u64) {
            return Err(err(format!(
                "truncated or corrupted file: {what} declares {len} bytes, {} left",
                left.saturating_sub(TRAILER_LEN as u64)
            )));
        }
        let n = usize::try_from(len).map_err(|_| err(format!("{what}: too large")))?;
        let mut payload = Vec::new();
        payload
            .try_reserve_exact(n)
            .map_err(|_| err(format!("{what}: {len} bytes do not fit in memory")))?;
        payload.resize(n, 0);
        read_exact(&mut r, &mut payload, &what)?;
        left -= len;
        let mut h = crc32fast::Hasher::new();
        h.update(&sh[..16]);
        h.update(&payload);
        if h.finalize() != crc {
            return Err(err(format!(
                "corrupted file: {what} (kind {kind}) fails its checksum"
            )));
        }
        crcs.update(&crc.to_le_bytes());
        sections.push(Section { kind, payload });
    }
    let mut t = [0u8; TRAILER_LEN];
    read_exact(&mut r, &mut t, "the trailer")?;
    if &t[..8] != TRAILER || u32_at(&t, 8) != crcs.finalize() || u32_at(&t, 12) != 0 {
        return Err(err("corrupted file: bad trailer"));
    }
    if left != TRAILER_LEN as u64 {
        return Err(err(format!(
            "corrupted file: {} bytes after the trailer",
            left - TRAILER_LEN as u64
        )));
    }
    Ok(sections)
}

/// A bounds-checked little-endian reader over one section's payload.
pub struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    /// A cursor over `b`, naming `what` in its errors.
    pub fn new(b: &'a [u8], what: &'static str) -> Self {
        Cursor { b, at: 0, what }
    }

    /// The next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or_else(|| err(format!("{}: record cut short", self.what)))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    /// The next byte (an error at the end of the payload).
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }

    /// The next little-endian u32 (an error past the end of the payload).
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32_at(self.bytes(4)?, 0))
    }

    /// The next little-endian u64 (an error past the end of the payload).
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64_at(self.bytes(8)?, 0))
    }

    /// A length-prefixed (u32) UTF-8 string of at most `max` bytes.
    pub fn string(&mut self, max: usize) -> Result<String> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(err(format!("{}: string of {n} bytes", self.what)));
        }
        String::from_utf8(self.bytes(n)?.to_vec())
            .map_err(|_| err(format!("{}: string is not UTF-8", self.what)))
    }

    /// How many bytes are left.
    pub fn left(&self) -> usize {
        self.b.len() - self.at
    }

    /// Fails unless every byte was consumed.
    pub fn end(&self) -> Result<()> {
        if self.left() != 0 {
            return Err(err(format!(
                "{}: {} trailing bytes",
                self.what,
                self.left()
            )));
        }
        Ok(())
    }
}

/// Little-endian encoding helpers for payloads.
#[derive(Default)]
pub struct Buf(pub Vec<u8>);

impl Buf {
    /// Appends a byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    /// Appends `v` as a little-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends `v` as a little-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends `s` as a u32 length then its UTF-8 bytes.
    pub fn string(&mut self, s: &str) -> &mut Self {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
}

/// A section's 20-byte header (kind, length, checksum of the header and `parts`).
fn section_header(kind: u32, parts: &[&[u8]]) -> [u8; SECTION_HEADER_LEN] {
    let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let mut h = [0u8; SECTION_HEADER_LEN];
    h[..4].copy_from_slice(&kind.to_le_bytes());
    h[4..12].copy_from_slice(&len.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&h[..16]);
    for p in parts {
        crc.update(p);
    }
    h[16..].copy_from_slice(&crc.finalize().to_le_bytes());
    h
}

/// Writes one section to a stream (a migration's connection).
pub fn write_section_to(w: &mut impl Write, kind: u32, parts: &[&[u8]]) -> Result<()> {
    w.write_all(&section_header(kind, parts))?;
    for p in parts {
        w.write_all(p)?;
    }
    Ok(())
}

/// Reads one section from a stream, refusing one longer than `max_len` before allocating
/// and one whose checksum fails.
pub fn read_section_from(r: &mut impl Read, max_len: u64) -> Result<Section> {
    let mut sh = [0u8; SECTION_HEADER_LEN];
    read_exact(r, &mut sh, "a section header")?;
    let (kind, len, crc) = (u32_at(&sh, 0), u64_at(&sh, 4), u32_at(&sh, 16));
    if u32_at(&sh, 12) != 0 || len > max_len {
        return Err(err(format!(
            "bad section header (kind {kind}, {len} bytes, at most {max_len})"
        )));
    }
    let n = usize::try_from(len).map_err(|_| err("section too large"))?;
    let mut payload = Vec::new();
    payload
        .try_reserve_exact(n)
        .map_err(|_| err(format!("{len} bytes do not fit in memory")))?;
    payload.resize(n, 0);
    read_exact(r, &mut payload, "a section")?;
    let mut h = crc32fast::Hasher::new();
    h.update(&sh[..16]);
    h.update(&payload);
    if h.finalize() != crc {
        return Err(err(format!("section of kind {kind} fails its checksum")));
    }
    Ok(Section { kind, payload })
}
