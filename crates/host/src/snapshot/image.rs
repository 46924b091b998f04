//! A guest session's image: what a snapshot holds and how it is encoded in sections.
//!
//! Sections, in this order: one [`GUEST`] (name, protocol, the id it had, the next region
//! id, how many regions follow), one [`FENCES`] (the fence table's state), one [`REGION`]
//! per region in increasing id order (metadata, then its bytes unless it was never written),
//! one [`DEVICES`] (the device records, JSON). Decoding validates every count, length, id
//! and value before returning an image: nothing is restored from a file that fails.

use virtsoc_fence::{FenceId, FenceTableImage, SlotImage, PAGE_SLOTS};
use virtsoc_proto::wire::Format;
use virtsoc_svm::{RegionImage, RegionMeta, SvmManager};

use super::devices::DeviceRecords;
use super::format::{err, Buf, Cursor, Section};
use crate::Result;

/// Section kind: the guest record.
pub const GUEST: u32 = 1;
/// Section kind: the fence table.
pub const FENCES: u32 = 2;
/// Section kind: one region.
pub const REGION: u32 = 3;
/// Section kind: the device records.
pub const DEVICES: u32 = 4;

/// Longest guest name kept.
const MAX_NAME: usize = 256;
/// Largest device-records section.
const MAX_DEVICES_JSON: usize = 1 << 20;

/// Who the session belonged to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestRecord {
    /// The guest's name from its hello.
    pub name: String,
    /// The coherence protocol its regions ran (restored with the same one).
    pub protocol: String,
    /// The guest id it had in the daemon it was saved from.
    pub source_guest: u64,
    /// The id the guest's next allocation gets (never below any region's).
    pub next_region_id: u64,
    /// The secret a reconnecting guest presents to resume this session (empty: none).
    pub resume: String,
}

/// Everything a snapshot holds about one guest.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionImage {
    /// Who the session belonged to.
    pub guest: GuestRecord,
    /// The guest's virtual fences, with their ids and states.
    pub fences: FenceTableImage,
    /// Every region: its id, description and the bytes of its freshest replica.
    pub regions: Vec<RegionImage>,
    /// Per device, the record of the commands that made and configured its objects.
    pub devices: DeviceRecords,
}

impl SessionImage {
    /// Bytes of region contents held.
    pub fn region_bytes(&self) -> u64 {
        self.regions
            .iter()
            .map(|r| r.bytes.as_ref().map_or(0, |b| b.len() as u64))
            .sum()
    }
}

pub(crate) fn encode_guest(g: &GuestRecord, regions: u64) -> Vec<u8> {
    let mut b = Buf::default();
    b.string(&g.name)
        .string(&g.protocol)
        .u64(g.source_guest)
        .u64(g.next_region_id)
        .u64(regions)
        .string(&g.resume);
    b.0
}

pub(crate) fn encode_fences(f: &FenceTableImage) -> Vec<u8> {
    let mut b = Buf::default();
    b.u32(f.slots.len() as u32);
    for &(generation, state) in &f.slots {
        b.u32(generation).u8(state.to_u8());
    }
    b.u32(f.overflow.len() as u32);
    for id in &f.overflow {
        b.u64(id.to_u64());
    }
    b.u64(f.overflow_next).u64(f.created).u64(f.recycled);
    b.0
}

/// A region section's header (its bytes follow it in the section).
pub(crate) fn encode_region_header(r: &RegionImage) -> Vec<u8> {
    let m = &r.meta;
    let mut b = Buf::default();
    b.u64(r.id)
        .u64(m.size)
        .u32(m.width)
        .u32(m.height)
        .u32(m.stride)
        .u32(m.format as u32)
        .u32(m.usage)
        .u8(r.bytes.is_some() as u8);
    b.0
}

pub(crate) fn encode_devices(d: &DeviceRecords) -> Result<Vec<u8>> {
    serde_json::to_vec(d).map_err(|e| err(format!("device records: {e}")))
}

pub(crate) fn decode_guest(p: &[u8]) -> Result<(GuestRecord, u64)> {
    let mut c = Cursor::new(p, "guest record");
    let g = GuestRecord {
        name: c.string(MAX_NAME)?,
        protocol: c.string(64)?,
        source_guest: c.u64()?,
        next_region_id: c.u64()?,
        resume: String::new(),
    };
    let regions = c.u64()?;
    if g.next_region_id == 0 || g.next_region_id > 1 << 62 {
        return Err(err(format!(
            "guest record: next region id {} out of range",
            g.next_region_id
        )));
    }
    let g = GuestRecord {
        resume: c.string(64)?,
        ..g
    };
    c.end()?;
    Ok((g, regions))
}

pub(crate) fn decode_fences(p: &[u8]) -> Result<FenceTableImage> {
    let mut c = Cursor::new(p, "fence table");
    let n = c.u32()?;
    if n != PAGE_SLOTS {
        return Err(err(format!(
            "fence table: {n} slots, the page has {PAGE_SLOTS}"
        )));
    }
    let mut slots = Vec::with_capacity(n as usize);
    for i in 0..n {
        let generation = c.u32()?;
        let state = SlotImage::from_u8(c.u8()?)
            .ok_or_else(|| err(format!("fence table: slot {i} has an unknown state")))?;
        slots.push((generation, state));
    }
    let m = c.u32()? as usize;
    if m > c.left() / 8 {
        return Err(err(format!("fence table: {m} overflow fences cut short")));
    }
    let mut overflow = Vec::with_capacity(m);
    for _ in 0..m {
        overflow.push(FenceId::from_u64(c.u64()?));
    }
    let img = FenceTableImage {
        slots,
        overflow,
        overflow_next: c.u64()?,
        created: c.u64()?,
        recycled: c.u64()?,
    };
    c.end()?;
    img.validate().map_err(|e| err(e.to_string()))?;
    Ok(img)
}

pub(crate) fn decode_region(mut p: Vec<u8>) -> Result<RegionImage> {
    let mut c = Cursor::new(&p, "region");
    let id = c.u64()?;
    let size = c.u64()?;
    let (width, height, stride) = (c.u32()?, c.u32()?, c.u32()?);
    let format = c.u32()?;
    let format = Format::from_u32(format)
        .ok_or_else(|| err(format!("region {id}: unknown format {format}")))?;
    let usage = c.u32()?;
    let has_bytes = match c.u8()? {
        0 => false,
        1 => true,
        v => return Err(err(format!("region {id}: bad contents flag {v}"))),
    };
    let header = p.len() - c.left();
    let rest = c.left() as u64;
    if (has_bytes && rest != size) || (!has_bytes && rest != 0) {
        return Err(err(format!(
            "region {id}: {rest} bytes of contents for a region of {size}"
        )));
    }
    let bytes = has_bytes.then(|| {
        p.drain(..header);
        p
    });
    let img = RegionImage {
        id,
        meta: RegionMeta {
            size,
            width,
            height,
            stride,
            format,
            usage,
        },
        bytes,
    };
    SvmManager::validate_image(&img).map_err(|e| err(format!("region {id}: {e}")))?;
    Ok(img)
}

/// Decodes and validates the sections of a file into an image.
pub fn decode(sections: Vec<Section>) -> Result<SessionImage> {
    let mut it = sections.into_iter();
    let mut next = |want: u32, what: &str| -> Result<Section> {
        match it.next() {
            Some(s) if s.kind == want => Ok(s),
            Some(s) => Err(err(format!(
                "expected the {what} section, found kind {}",
                s.kind
            ))),
            None => Err(err(format!("the {what} section is missing"))),
        }
    };
    let (guest, count) = decode_guest(&next(GUEST, "guest")?.payload)?;
    let fences = decode_fences(&next(FENCES, "fence table")?.payload)?;
    let mut regions: Vec<RegionImage> = Vec::new();
    for _ in 0..count {
        let r = decode_region(next(REGION, "region")?.payload)?;
        if regions.last().is_some_and(|l| l.id >= r.id) {
            return Err(err(format!("region {} out of order or repeated", r.id)));
        }
        if r.id >= guest.next_region_id {
            return Err(err(format!(
                "region {} is not below the next region id {}",
                r.id, guest.next_region_id
            )));
        }
        regions.push(r);
    }
    let d = next(DEVICES, "device records")?;
    if d.payload.len() > MAX_DEVICES_JSON {
        return Err(err("device records over 1 MiB"));
    }
    let devices: DeviceRecords =
        serde_json::from_slice(&d.payload).map_err(|e| err(format!("device records: {e}")))?;
    if let Some(s) = it.next() {
        return Err(err(format!("unexpected section of kind {}", s.kind)));
    }
    Ok(SessionImage {
        guest,
        fences,
        regions,
        devices,
    })
}
