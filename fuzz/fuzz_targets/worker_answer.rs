//! The daemon's reading of a worker's answer (crates/media/src/worker and its users): a
//! compromised worker sends arbitrary bytes; the daemon must refuse what is malformed and
//! never panic or allocate without bound. Each input is read as a decoder's answer, as an
//! ISP worker's answer to a 16x8 RGBA conversion, and as an encoder's answer for 16x16
//! frames.

#![no_main]

use libfuzzer_sys::fuzz_target;
use virtsoc_media::{FrameLayout, PixelFormat};

fuzz_target!(|data: &[u8]| {
    virtsoc_media::codec::check_worker_answer(data);
    if let Ok(dst) = FrameLayout::packed(PixelFormat::Rgba8, 16, 8) {
        virtsoc_media::isp::check_isp_answer(data, &dst);
    }
    virtsoc_media::codec::check_encoder_answer(data, 16, 16);
});
