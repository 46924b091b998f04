//! EGLImages of SVM regions (`EGL_VIRTSOC_REGION`, `include/EGL/eglext_virtsoc.h`) and the
//! few region calls a program needs to fill one on the library's own connection.
//!
//! - `eglCreateImageKHR(dpy, EGL_NO_CONTEXT, EGL_VIRTSOC_REGION, NULL, attribs)`: the
//!   layout (format, size, stride, plane offsets) defaults from the region's metadata and
//!   is checked against its size here; the host makes the image (`CREATE_IMAGE`, a round
//!   trip) and the region is imported at once.
//! - **Imports** travel through the SVM, not the stream: the stream is flushed, then
//!   `gles::import` runs bracketed by a read access of the region *from the gles device*
//!   (`Connection::command_with_access`), so the region's coherence protocol copies it
//!   into the gles domain (a copy on the ledger only when the gles replica is stale) and
//!   the daemon hands the bytes to the render worker. The daemon skips an import when the
//!   region's write generation has not moved since the image's last one.
//! - `glEGLImageTargetTexture2DOES` (`target_texture`) imports again (the latch point,
//!   as Android's `SurfaceTexture.updateTexImage`), then binds the bound texture to the
//!   image on the host (`IMAGE_TARGET_TEXTURE`). A region rewritten since is thus seen by
//!   the next draw after the next `glEGLImageTargetTexture2DOES`. The latch's import is
//!   queued on the gles device without waiting (`import_queued`): behind an
//!   `eglWaitSyncKHR` on a decode's fence it runs once the decode is done, and the program
//!   does not wait for either.
//!
//! Region ids are per guest (per connection): the id of another guest's region names
//! nothing here (or one of this connection's own regions).

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::{Arc, Mutex};

use virtsoc_devapi::gles as gapi;
use virtsoc_devapi::DeviceCommand;
use virtsoc_gles_stream::egl as wire;
use virtsoc_guest::GuestError;
use virtsoc_proto::wire::Format;
use virtsoc_proto::{AccessMode, DeviceId, Opcode, Status};

use super::api::{
    display, guard, pairs, post, put, round_trip, EglAttrib, EglBool, EglInt, Handle,
};
use super::consts::*;
use super::state::{from_handle, table, to_handle};
use crate::rt::{self, Stream};
use crate::transport::Transport;
use virtsoc_devapi::RegionId;
use virtsoc_sync::LockExt;

/// `EGL_IMAGE_PRESERVED_KHR` (accepted: an import always preserves nothing but the
/// region's pixels, which it copies whole).
const EGL_IMAGE_PRESERVED_KHR: i32 = 0x30D2;
/// The target of `eglCreateImageKHR` for SVM regions.
pub const EGL_VIRTSOC_REGION: u32 = 0x7A00;
/// Attribute: the region id's low 32 bits (required).
pub const EGL_VIRTSOC_REGION_ID_LO: i32 = 0x7A01;
/// Attribute: the region id's high 32 bits (default 0).
pub const EGL_VIRTSOC_REGION_ID_HI: i32 = 0x7A02;
/// Attribute: the layout, one of the `EGL_VIRTSOC_FORMAT_*` (default: the region's format).
pub const EGL_VIRTSOC_FORMAT: i32 = 0x7A03;
/// Attribute: bytes per row of the RGBA or luma plane (default: the region's stride).
pub const EGL_VIRTSOC_STRIDE: i32 = 0x7A04;
/// Attribute: offset of the first chroma plane (default: `stride * height`).
pub const EGL_VIRTSOC_PLANE1_OFFSET: i32 = 0x7A05;
/// Attribute: offset of the second chroma plane (YUV 4:2:0; default: after the first).
pub const EGL_VIRTSOC_PLANE2_OFFSET: i32 = 0x7A06;
/// Layout: RGBA8.
pub const EGL_VIRTSOC_FORMAT_RGBA8: i32 = 0x7A10;
/// Layout: NV12.
pub const EGL_VIRTSOC_FORMAT_NV12: i32 = 0x7A11;
/// Layout: YUV 4:2:0 planar.
pub const EGL_VIRTSOC_FORMAT_YUV420: i32 = 0x7A12;
/// `eglCreateRegionVIRTSOC` only: untyped bytes (`width * height` of them; no image
/// layout until an image names one).
pub const EGL_VIRTSOC_FORMAT_BLOB: i32 = 0x7A13;

/// One guest image.
#[derive(Clone, Copy)]
struct Image {
    region: RegionId,
    format: u32,
    size: (u32, u32),
    stride: u32,
    off: [u32; 2],
}

#[derive(Default)]
struct Images {
    next: u32,
    map: HashMap<u32, Image>,
}

static IMAGES: std::sync::LazyLock<Mutex<Images>> =
    std::sync::LazyLock::new(|| Mutex::new(Images::default()));

fn images() -> std::sync::MutexGuard<'static, Images> {
    IMAGES.lock_or_recover()
}

/// The stream and the transport of an initialised display.
fn channel(dpy: Handle) -> Result<(Arc<Mutex<Stream>>, Arc<Transport>), i32> {
    let t = table();
    display(&t, dpy)?;
    match (&t.stream, &t.transport) {
        (Some(s), Some(tr)) => Ok((s.clone(), tr.clone())),
        _ => Err(EGL_NOT_INITIALIZED),
    }
}

/// The wire layout of an attribute token.
fn layout_of(token: i32) -> Option<u32> {
    Some(match token {
        EGL_VIRTSOC_FORMAT_RGBA8 => wire::IMAGE_RGBA8,
        EGL_VIRTSOC_FORMAT_NV12 => wire::IMAGE_NV12,
        EGL_VIRTSOC_FORMAT_YUV420 => wire::IMAGE_YUV420,
        _ => return None,
    })
}

/// The allocation format of an attribute token.
fn format_of(token: i32) -> Option<Format> {
    Some(match token {
        EGL_VIRTSOC_FORMAT_RGBA8 => Format::Rgba8,
        EGL_VIRTSOC_FORMAT_NV12 => Format::Nv12,
        EGL_VIRTSOC_FORMAT_YUV420 => Format::Yuv420p,
        _ => return None,
    })
}

/// The bytes a layout reads, `None` for sizes or strides it cannot have.
fn layout_end(img: &Image) -> Option<u64> {
    let (w, h) = (u64::from(img.size.0), u64::from(img.size.1));
    let s = u64::from(img.stride);
    let max = u64::from(wire::MAX_SURFACE);
    if w == 0 || h == 0 || w > max || h > max {
        return None;
    }
    let plane = |off: u64, stride: u64, rows: u64, row: u64| off + stride * (rows - 1) + row;
    let (o1, o2) = (u64::from(img.off[0]), u64::from(img.off[1]));
    match img.format {
        wire::IMAGE_RGBA8 => (s >= 4 * w).then(|| plane(0, s, h, 4 * w)),
        f => {
            if w % 2 != 0 || h % 2 != 0 || s < w || (f == wire::IMAGE_YUV420 && s % 2 != 0) {
                return None;
            }
            let luma = plane(0, s, h, w);
            Some(if f == wire::IMAGE_NV12 {
                luma.max(plane(o1, s, h / 2, w))
            } else {
                luma.max(plane(o1, s / 2, h / 2, w / 2))
                    .max(plane(o2, s / 2, h / 2, w / 2))
            })
        }
    }
}

/// The EGL error of a failed import.
fn import_error(e: &GuestError) -> i32 {
    log::warn!("virtsoc EGL: image import: {e}");
    match e {
        GuestError::Status {
            status: Status::NoSuchRegion,
            ..
        } => EGL_BAD_PARAMETER,
        GuestError::Status {
            status: Status::BadArgument | Status::OutOfRange,
            ..
        } => EGL_BAD_MATCH,
        GuestError::Status {
            status: Status::DeviceError,
            ..
        } => EGL_CONTEXT_LOST,
        _ => EGL_BAD_ALLOC,
    }
}

/// Imports the region of image `id` (after what the stream holds): `gles::import`
/// bracketed by the gles device's read access of the region.
fn import(
    stream: &Mutex<Stream>,
    tr: &Transport,
    id: u32,
    img: &Image,
    force: bool,
) -> Result<(), i32> {
    {
        let mut s = stream.lock_or_recover();
        s.flush().map_err(|e| {
            log::warn!("virtsoc EGL: {e}");
            EGL_CONTEXT_LOST
        })?;
    }
    let cmd = gapi::Import {
        image: u64::from(id) | u64::from(force) << 63,
        region: img.region,
        size: u64::from(img.size.0) | u64::from(img.size.1) << 32,
        layout: u64::from(img.stride) | u64::from(img.format) << 32,
        planes: u64::from(img.off[0]) | u64::from(img.off[1]) << 32,
    };
    tr.connection()
        .command_with_access(&cmd)
        .map(|_| ())
        .map_err(|e| import_error(&e))
}

/// The latch's import: as [`import`], but queued on the gles device without waiting, so a
/// GL queue held by `eglWaitSyncKHR` (a decode not done yet) holds the import too and the
/// program goes on. A region this connection no longer has is refused here; a failure on
/// the host is logged with the connection's other queued errors (the texture keeps its
/// last pixels).
fn import_queued(stream: &Mutex<Stream>, tr: &Transport, id: u32, img: &Image) -> Result<(), i32> {
    {
        let mut s = stream.lock_or_recover();
        s.flush().map_err(|e| {
            log::warn!("virtsoc EGL: {e}");
            EGL_CONTEXT_LOST
        })?;
    }
    let conn = tr.connection();
    let size = conn.region(img.region).ok_or(EGL_BAD_PARAMETER)?.size;
    let cmd = gapi::Import {
        image: u64::from(id),
        region: img.region,
        size: u64::from(img.size.0) | u64::from(img.size.1) << 32,
        layout: u64::from(img.stride) | u64::from(img.format) << 32,
        planes: u64::from(img.off[0]) | u64::from(img.off[1]) << 32,
    };
    let access = |op| {
        conn.submit_detached(
            op,
            gapi::ID,
            [
                u64::from(img.region),
                0,
                size,
                AccessMode::Read as u64,
                0,
                0,
            ],
        )
    };
    // The begin is waited for later (its completion says how long the access took on the
    // host); the rest is detached.
    let begin = conn.submit(
        Opcode::BeginAccess,
        gapi::ID,
        [
            u64::from(img.region),
            0,
            size,
            AccessMode::Read as u64,
            0,
            0,
        ],
    );
    let queued = begin
        .and_then(|seq| {
            note_latch(conn, seq);
            conn.submit_detached(Opcode::DeviceCmd, gapi::ID, cmd.encode())
        })
        .and_then(|_| access(Opcode::EndAccess));
    queued.map(|_| ()).map_err(|e| import_error(&e))
}

/// The latches' region accesses: those in flight (by request) and the host-side durations
/// of those collected (ns), for `eglQueryImportLatencyVIRTSOC`.
#[derive(Default)]
struct Latches {
    pending: std::collections::VecDeque<u64>,
    done: Vec<u64>,
}

/// Latch accesses kept in flight before the oldest is collected.
const LATCHES_IN_FLIGHT: usize = 32;
/// Durations kept at most (older ones are dropped).
const LATCHES_KEPT: usize = 1 << 16;

static LATCHES: std::sync::LazyLock<Mutex<Latches>> =
    std::sync::LazyLock::new(|| Mutex::new(Latches::default()));

fn latches() -> std::sync::MutexGuard<'static, Latches> {
    LATCHES.lock_or_recover()
}

/// Collects the completion of latch access `seq`.
fn collect(conn: &virtsoc_guest::Connection, l: &mut Latches, seq: u64) {
    match conn.wait(seq) {
        Ok(c) if Status::from_u32(c.status) == Some(Status::Ok) => {
            if l.done.len() < LATCHES_KEPT {
                l.done.push(c.values[4]);
            }
        }
        Ok(c) => log::info!("virtsoc EGL: latch access failed: {:?}", c.reason()),
        Err(e) => log::info!("virtsoc EGL: latch access: {e}"),
    }
}

/// Keeps latch access `seq` for later (collecting the oldest beyond a few in flight).
fn note_latch(conn: &virtsoc_guest::Connection, seq: u64) {
    let mut l = latches();
    l.pending.push_back(seq);
    while l.pending.len() > LATCHES_IN_FLIGHT {
        if let Some(old) = l.pending.pop_front() {
            collect(conn, &mut l, old);
        }
    }
}

/// `eglQueryImportLatencyVIRTSOC`: the host-side durations (ns) of the region accesses of
/// the latches (`glEGLImageTargetTexture2DOES`) since the last call, at most `max` of them
/// into `ns` (their count through `count`), the SVM's access latency of the link into the
/// gles domain (a prefetched region is already there). Waits for latches still in flight.
pub extern "C" fn eglQueryImportLatencyVIRTSOC(
    dpy: Handle,
    ns: *mut u64,
    max: EglInt,
    count: *mut EglInt,
) -> EglBool {
    super::set_last_vendor();
    guard(EGL_FALSE, || {
        let (_, tr) = channel(dpy)?;
        let conn = tr.connection();
        let mut l = latches();
        while let Some(seq) = l.pending.pop_front() {
            collect(conn, &mut l, seq);
        }
        let all = std::mem::take(&mut l.done);
        let n = all.len().min(usize::try_from(max).unwrap_or(0));
        if !ns.is_null() {
            for (i, v) in all.iter().take(n).enumerate() {
                put(ns.wrapping_add(i), *v);
            }
        }
        put(count, n as EglInt);
        Ok(EGL_TRUE)
    })
}

fn create_image(dpy: Handle, ctx: Handle, target: u32, attrs: Vec<(i32, i32)>) -> Handle {
    super::set_last_vendor();
    guard(std::ptr::null_mut(), || {
        let (stream, tr) = channel(dpy)?;
        if target != EGL_VIRTSOC_REGION || !ctx.is_null() {
            return Err(EGL_BAD_PARAMETER);
        }
        let (mut lo, mut hi) = (None, 0u32);
        let (mut format, mut w, mut h, mut stride) = (None, None, None, None);
        let (mut off1, mut off2) = (None, None);
        for (a, v) in attrs {
            match a {
                EGL_VIRTSOC_REGION_ID_LO => lo = Some(v as u32),
                EGL_VIRTSOC_REGION_ID_HI => hi = v as u32,
                EGL_VIRTSOC_FORMAT => format = Some(layout_of(v).ok_or(EGL_BAD_PARAMETER)?),
                EGL_WIDTH => w = Some(u32::try_from(v).map_err(|_| EGL_BAD_PARAMETER)?),
                EGL_HEIGHT => h = Some(u32::try_from(v).map_err(|_| EGL_BAD_PARAMETER)?),
                EGL_VIRTSOC_STRIDE => {
                    stride = Some(u32::try_from(v).map_err(|_| EGL_BAD_PARAMETER)?)
                }
                EGL_VIRTSOC_PLANE1_OFFSET => {
                    off1 = Some(u32::try_from(v).map_err(|_| EGL_BAD_PARAMETER)?)
                }
                EGL_VIRTSOC_PLANE2_OFFSET => {
                    off2 = Some(u32::try_from(v).map_err(|_| EGL_BAD_PARAMETER)?)
                }
                EGL_IMAGE_PRESERVED_KHR => {}
                _ => return Err(EGL_BAD_PARAMETER),
            }
        }
        let region = RegionId(u64::from(lo.ok_or(EGL_BAD_PARAMETER)?) | u64::from(hi) << 32);
        let info = tr.connection().region(region).ok_or(EGL_BAD_PARAMETER)?;
        let own = match info.format {
            Format::Rgba8 => Some(wire::IMAGE_RGBA8),
            Format::Nv12 => Some(wire::IMAGE_NV12),
            Format::Yuv420p => Some(wire::IMAGE_YUV420),
            Format::Blob => None,
            _ => return Err(EGL_BAD_MATCH),
        };
        let format = match (format, own) {
            (Some(f), Some(o)) if f != o => return Err(EGL_BAD_MATCH),
            (Some(f), _) | (None, Some(f)) => f,
            (None, None) => return Err(EGL_BAD_PARAMETER),
        };
        let (w, h) = (w.unwrap_or(info.width), h.unwrap_or(info.height));
        // The region's stride when the image is as wide as the region, else a packed one.
        let stride = stride.unwrap_or(if info.stride != 0 && w == info.width {
            info.stride
        } else if format == wire::IMAGE_RGBA8 {
            w.saturating_mul(4)
        } else {
            w
        });
        let off1 = off1.unwrap_or(stride.saturating_mul(h));
        let off2 = off2.unwrap_or(off1.saturating_add((stride / 2).saturating_mul(h / 2)));
        let img = Image {
            region,
            format,
            size: (w, h),
            stride,
            off: [off1, off2],
        };
        let end = layout_end(&img).ok_or(EGL_BAD_PARAMETER)?;
        if end > info.size {
            return Err(EGL_BAD_MATCH);
        }
        let id = {
            let mut im = images();
            im.next = im.next.wrapping_add(1).max(1);
            im.next
        };
        let code = round_trip(&stream, wire::CREATE_IMAGE, &[id, w, h], EGL_CONTEXT_LOST)?;
        if code != wire::SUCCESS {
            return Err(code as i32);
        }
        if let Err(e) = import(&stream, &tr, id, &img, true) {
            post(&stream, wire::DESTROY_IMAGE, &[id]);
            return Err(e);
        }
        images().map.insert(id, img);
        Ok(to_handle(id))
    })
}

/// `eglCreateImageKHR`: only `EGL_VIRTSOC_REGION` with `EGL_NO_CONTEXT`.
pub extern "C" fn eglCreateImageKHR(
    dpy: Handle,
    ctx: Handle,
    target: u32,
    _buffer: *mut c_void,
    attribs: *const EglInt,
) -> Handle {
    create_image(dpy, ctx, target, pairs(attribs))
}

/// `eglCreateImage` (EGL 1.5): as [`eglCreateImageKHR`].
pub extern "C" fn eglCreateImage(
    dpy: Handle,
    ctx: Handle,
    target: u32,
    _buffer: *mut c_void,
    attribs: *const EglAttrib,
) -> Handle {
    create_image(dpy, ctx, target, pairs(attribs))
}

/// `eglDestroyImageKHR` / `eglDestroyImage`: textures bound to the image keep its pixels.
pub extern "C" fn eglDestroyImageKHR(dpy: Handle, image: Handle) -> EglBool {
    super::set_last_vendor();
    guard(EGL_FALSE, || {
        let (stream, _) = channel(dpy)?;
        let id = from_handle(image);
        images().map.remove(&id).ok_or(EGL_BAD_PARAMETER)?;
        post(&stream, wire::DESTROY_IMAGE, &[id]);
        Ok(EGL_TRUE)
    })
}

/// `glEGLImageTargetTexture2DOES` (the GL half calls this): imports the image's region if
/// it changed since, then makes the texture bound to `target` of the current context a
/// sibling of the image. Errors are the context's GL errors.
pub(crate) fn target_texture(target: u32, image: *mut c_void) {
    const GL_TEXTURE_2D: u32 = 0x0DE1;
    const GL_TEXTURE_EXTERNAL_OES: u32 = 0x8D65;
    let Some(ctx) = rt::current() else { return };
    let id = from_handle(image);
    let img = images().map.get(&id).copied();
    let error = |e| ctx.gl().error(e);
    if target != GL_TEXTURE_2D && target != GL_TEXTURE_EXTERNAL_OES {
        return error(crate::gl::GL_INVALID_ENUM);
    }
    let Some(img) = img else {
        return error(crate::gl::GL_INVALID_VALUE);
    };
    let tr = table().transport.clone();
    let Some(tr) = tr else {
        return error(crate::gl::GL_INVALID_OPERATION);
    };
    if import_queued(&ctx.stream, &tr, id, &img).is_err() {
        return error(crate::gl::GL_INVALID_OPERATION);
    }
    let mut s = ctx.stream();
    s.encoder(ctx.id)
        .packet(wire::IMAGE_TARGET_TEXTURE)
        .u32(target)
        .u32(id);
}

/// `eglCreateRegionVIRTSOC`: allocates a `width` x `height` image region of `format` (an
/// `EGL_VIRTSOC_FORMAT_*`) on the library's connection.
pub extern "C" fn eglCreateRegionVIRTSOC(
    dpy: Handle,
    format: EglInt,
    width: EglInt,
    height: EglInt,
    region: *mut u64,
) -> EglBool {
    super::set_last_vendor();
    guard(EGL_FALSE, || {
        let (_, tr) = channel(dpy)?;
        let w = u32::try_from(width).map_err(|_| EGL_BAD_PARAMETER)?;
        let h = u32::try_from(height).map_err(|_| EGL_BAD_PARAMETER)?;
        let conn = tr.connection();
        let made = if format == EGL_VIRTSOC_FORMAT_BLOB {
            conn.alloc_blob(u64::from(w) * u64::from(h))
        } else {
            let f = format_of(format).ok_or(EGL_BAD_PARAMETER)?;
            conn.alloc(0, w, h, f, 0)
        };
        let info = made.map_err(|e| {
            log::warn!("virtsoc EGL: region: {e}");
            EGL_BAD_ALLOC
        })?;
        put(region, u64::from(info.id));
        Ok(EGL_TRUE)
    })
}

/// `eglMapRegionVIRTSOC`: begins the CPU's read-write access of the whole region; its
/// bytes' address (until `eglUnmapRegionVIRTSOC`), its stride through `stride`.
pub extern "C" fn eglMapRegionVIRTSOC(
    dpy: Handle,
    region: u64,
    stride: *mut EglInt,
) -> *mut c_void {
    super::set_last_vendor();
    guard(std::ptr::null_mut(), || {
        let (_, tr) = channel(dpy)?;
        let conn = tr.connection();
        let region = RegionId(region);
        let info = conn.region(region).ok_or(EGL_BAD_PARAMETER)?;
        let a = conn
            .begin_access(region, DeviceId::CPU, 0, info.size, AccessMode::ReadWrite)
            .map_err(|e| {
                log::warn!("virtsoc EGL: map region: {e}");
                EGL_BAD_ACCESS
            })?;
        put(stride, info.stride as EglInt);
        a.ptr
            .map(|p| p.as_ptr().cast::<c_void>())
            .ok_or(EGL_BAD_ACCESS)
    })
}

/// `eglUnmapRegionVIRTSOC`: ends the CPU's access (the region's write generation moved).
pub extern "C" fn eglUnmapRegionVIRTSOC(dpy: Handle, region: u64) -> EglBool {
    super::set_last_vendor();
    guard(EGL_FALSE, || {
        let (_, tr) = channel(dpy)?;
        let conn = tr.connection();
        let region = RegionId(region);
        let info = conn.region(region).ok_or(EGL_BAD_PARAMETER)?;
        conn.end_access(region, DeviceId::CPU, 0, info.size, AccessMode::ReadWrite)
            .map_err(|e| {
                log::warn!("virtsoc EGL: unmap region: {e}");
                EGL_BAD_ACCESS
            })?;
        Ok(EGL_TRUE)
    })
}

/// `eglDestroyRegionVIRTSOC`: frees the region (images of it fail their next import).
pub extern "C" fn eglDestroyRegionVIRTSOC(dpy: Handle, region: u64) -> EglBool {
    super::set_last_vendor();
    guard(EGL_FALSE, || {
        let (_, tr) = channel(dpy)?;
        tr.connection().free(RegionId(region)).map_err(|e| {
            log::warn!("virtsoc EGL: free region: {e}");
            EGL_BAD_PARAMETER
        })?;
        Ok(EGL_TRUE)
    })
}

/// `eglQueryLedgerVIRTSOC`: the copies of this connection's bytes from memory domain `src`
/// to `dst` (names as `virtsoc run` prints them, e.g. `guest-window`, `gles`; null: any),
/// summed over the SVM's copy ledger.
pub extern "C" fn eglQueryLedgerVIRTSOC(
    dpy: Handle,
    src: *const c_char,
    dst: *const c_char,
    copies: *mut u64,
    bytes: *mut u64,
) -> EglBool {
    super::set_last_vendor();
    guard(EGL_FALSE, || {
        let (_, tr) = channel(dpy)?;
        let conn = tr.connection();
        let (src, dst) = (super::api::name_of(src), super::api::name_of(dst));
        let links = conn.ledger().map_err(|e| {
            log::warn!("virtsoc EGL: ledger: {e}");
            EGL_BAD_ACCESS
        })?;
        let (mut c, mut b) = (0, 0);
        for l in links {
            let ok = |want: Option<&str>, d| want.map_or(true, |w| conn.domain_name(d) == w);
            if ok(src, l.src) && ok(dst, l.dst) {
                c += l.copies;
                b += l.bytes;
            }
        }
        put(copies, c);
        put(bytes, b);
        Ok(EGL_TRUE)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_measured() {
        let img = |format, w, h, stride, off| Image {
            region: RegionId(1),
            format,
            size: (w, h),
            stride,
            off,
        };
        assert_eq!(
            layout_end(&img(wire::IMAGE_RGBA8, 4, 2, 16, [0, 0])),
            Some(32)
        );
        assert_eq!(layout_end(&img(wire::IMAGE_RGBA8, 4, 2, 8, [0, 0])), None);
        assert_eq!(
            layout_end(&img(wire::IMAGE_NV12, 4, 4, 4, [16, 0])),
            Some(24)
        );
        assert_eq!(layout_end(&img(wire::IMAGE_NV12, 3, 4, 4, [16, 0])), None);
        assert_eq!(
            layout_end(&img(wire::IMAGE_YUV420, 4, 4, 4, [16, 20])),
            Some(24)
        );
        assert_eq!(layout_of(0x1234), None);
    }
}
