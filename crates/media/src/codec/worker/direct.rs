//! Decoding straight into the worker's shared picture buffers: libavcodec's `get_buffer2`
//! callback ([`install`]) hands each 4:2:0 picture it is about to decode a buffer of the
//! worker's [`Slots`], so the decoder's own write is the only write of a picture in the
//! worker; the answer names the buffer and where each plane lies in it ([`planes_of`]), and
//! the parent copies (NV12: interleaves) it once into the guest's region.
//!
//! A buffer is libavcodec's from `get_buffer2` until its last reference goes (the
//! `av_buffer_create` free callback, on whichever decoder thread drops it), and the
//! parent's from the answer that names it until the parent hands it back; it is written
//! again only when neither holds it ([`Slots`]). Pictures of other formats (10-bit, 4:2:2,
//! 4:4:4) and decoders that allocate on their own (libdav1d) keep libavcodec's default
//! buffers and are copied once into a packed buffer as before.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use ffmpeg_next::ffi;

use crate::worker::shared::{self, SharedSlots, Slots};

/// What `get_buffer2` allocates beyond the planes, as libavcodec's default does (row
/// over-reads of SIMD code), and the alignment of each plane's start.
const PAD: usize = 16 + 64 - 1;
const ALIGN: usize = 64;

/// A buffer libavcodec holds: the pool it goes back to and its number.
struct Ticket {
    slots: SharedSlots,
    id: u32,
}

/// Makes the not yet opened codec context `ctx` decode 4:2:0 pictures into `slots`.
///
/// # Safety
/// `ctx` must be a valid, unopened codec context, and `slots` must outlive it (the decoder
/// keeps an `Arc` of it in a field dropped after the context).
pub(crate) unsafe fn install(ctx: *mut ffi::AVCodecContext, slots: &SharedSlots) {
    // SAFETY: the caller's promise: a valid context nobody else uses yet.
    unsafe {
        (*ctx).get_buffer2 = Some(get_buffer);
        // Before libavcodec 60, a frame thread that needs a buffer from a custom
        // `get_buffer2` not marked thread-safe asks the thread in `avcodec_send_packet` /
        // `avcodec_receive_frame` for it and sleeps until that thread comes back into
        // libavcodec: with the worker's main thread away answering its parent, a frame
        // thread sat idle (1080p H.264 with two threads: 0.80x libavcodec's own buffers
        // through a worker, 0.89x in one process). `get_buffer` and `give_back` lock the
        // slots themselves and may run on any thread.
        #[cfg(virtsoc_thread_safe_callbacks)]
        {
            (*ctx).thread_safe_callbacks = 1;
        }
        (*ctx).opaque = Arc::as_ptr(slots) as *mut c_void;
    }
}

/// Plane offsets and line sizes of a 4:2:0 picture of `width` x `height` as `ctx` needs it,
/// and the bytes of its buffer (libavcodec's own rules: `avcodec_align_dimensions2`, then
/// a width whose every line size meets the codec's alignment).
///
/// # Safety
/// `ctx` must be a valid codec context.
unsafe fn plan(
    ctx: *mut ffi::AVCodecContext,
    width: c_int,
    height: c_int,
) -> Option<([usize; 3], [c_int; 3], usize)> {
    let fmt = ffi::AVPixelFormat::AV_PIX_FMT_YUV420P;
    let (mut w, mut h) = (width, height);
    let mut align = [0 as c_int; ffi::AV_NUM_DATA_POINTERS as usize];
    // SAFETY: a valid context (the caller's promise) and out-parameters of the sizes asked.
    unsafe { ffi::avcodec_align_dimensions2(ctx, &mut w, &mut h, align.as_mut_ptr()) };
    let mut ls = [0 as c_int; 4];
    let mut tries = 0;
    loop {
        // SAFETY: `ls` has the four entries av_image_fill_linesizes writes.
        if w <= 0 || unsafe { ffi::av_image_fill_linesizes(ls.as_mut_ptr(), fmt, w) } < 0 {
            return None;
        }
        w += w & !(w - 1);
        let aligned = (0..4).all(|i| align[i] <= 0 || ls[i] % align[i] == 0);
        tries += 1;
        if aligned {
            break;
        }
        if tries > 32 {
            return None;
        }
    }
    let rows = [
        h as usize,
        (h as usize).div_ceil(2),
        (h as usize).div_ceil(2),
    ];
    let mut offsets = [0usize; 3];
    let mut end = 0usize;
    for i in 0..3 {
        let stride = usize::try_from(ls[i]).ok().filter(|s| *s > 0)?;
        offsets[i] = end.div_ceil(ALIGN) * ALIGN;
        end = offsets[i].checked_add(stride.checked_mul(rows[i])?)? + PAD;
    }
    Some((offsets, [ls[0], ls[1], ls[2]], end))
}

/// libavcodec's `get_buffer2`: a 4:2:0 picture goes into a free buffer of the worker's
/// slots; anything else (another format, no buffer free) to libavcodec's default.
unsafe extern "C" fn get_buffer(
    s: *mut ffi::AVCodecContext,
    frame: *mut ffi::AVFrame,
    flags: c_int,
) -> c_int {
    // SAFETY: libavcodec calls this with its valid context and a frame whose format and
    // size it set; `opaque` is the `Arc<Mutex<Slots>>` `install` put there, which the
    // decoder keeps alive for as long as the context.
    unsafe {
        let pool = (*s).opaque as *const std::sync::Mutex<Slots>;
        let yuv420 = (*frame).format == ffi::AVPixelFormat::AV_PIX_FMT_YUV420P as c_int;
        let plan = match yuv420 && !pool.is_null() {
            true => plan(s, (*frame).width, (*frame).height),
            false => None,
        };
        let Some((offsets, strides, size)) = plan else {
            return ffi::avcodec_default_get_buffer2(s, frame, flags);
        };
        Arc::increment_strong_count(pool);
        let slots = Arc::from_raw(pool);
        let got = shared::lock(&slots).acquire(size);
        let Ok(Some((id, base))) = got else {
            return ffi::avcodec_default_get_buffer2(s, frame, flags);
        };
        let ticket = Box::into_raw(Box::new(Ticket { slots, id }));
        let buf = ffi::av_buffer_create(base, size, Some(give_back), ticket.cast(), 0);
        if buf.is_null() {
            let t = Box::from_raw(ticket);
            shared::lock(&t.slots).codec_done(t.id);
            return ffi::AVERROR(ffi::ENOMEM);
        }
        (*frame).buf[0] = buf;
        for i in 0..3 {
            (*frame).data[i] = base.add(offsets[i]);
            (*frame).linesize[i] = strides[i];
        }
        (*frame).extended_data = (*frame).data.as_mut_ptr();
        0
    }
}

/// The free callback of a buffer `get_buffer` made: libavcodec dropped its last reference.
unsafe extern "C" fn give_back(opaque: *mut c_void, _data: *mut u8) {
    // SAFETY: `opaque` is the ticket `get_buffer` boxed for this buffer; libavcodec calls
    // this once, when the buffer's last reference goes.
    let t = unsafe { Box::from_raw(opaque.cast::<Ticket>()) };
    shared::lock(&t.slots).codec_done(t.id);
}

/// Where a decoded 4:2:0 picture (`ptrs`/`strides` of its three planes) lies in the
/// worker's buffers: its buffer (now held for the parent) and each plane's offset and
/// stride in it. `None` when it is not in one (libavcodec's default buffers).
pub(crate) fn planes_of(
    slots: &SharedSlots,
    ptrs: [*const u8; 3],
    strides: [c_int; 3],
) -> Option<(u32, [(u32, u32); 3])> {
    let mut s = shared::lock(slots);
    let (id, base, len) = s.hold_at(ptrs[0])?;
    let mut planes = [(0u32, 0u32); 3];
    for i in 0..3 {
        let off = (ptrs[i] as usize).wrapping_sub(base as usize);
        match (u32::try_from(off), u32::try_from(strides[i])) {
            (Ok(o), Ok(st)) if off < len => planes[i] = (o, st),
            _ => {
                // Not a picture of ours after all: give the hold back.
                s.release(&[id]);
                return None;
            }
        }
    }
    Some((id, planes))
}
