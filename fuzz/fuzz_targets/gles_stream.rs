//! The GLES render worker's decoder on arbitrary command streams: each input runs as one
//! batch of a guest on a fresh context (made current on a small surface first, destroyed
//! after, so objects do not pile up across inputs) of a real host EGL/GLES (Mesa llvmpipe
//! here), EGL packets included. GL errors and refused batches are fine; a panic, a crash in
//! the driver reached through an unchecked length, or an abort is not.

#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use virtsoc_gles_stream::{egl, Encoder};
use virtsoc_render::worker::Renderer;

thread_local! {
    // The host EGL's objects belong to the thread that made them (libFuzzer runs inputs on
    // one thread).
    static RENDERER: RefCell<Option<Renderer>> = const { RefCell::new(None) };
}

/// The packets before and after each input: a context bound to a 64 x 64 surface.
fn framing() -> (Vec<u8>, Vec<u8>) {
    let config = egl::CONFIGS[0].0;
    let mut pre = Encoder::new();
    pre.packet(egl::CREATE_CONTEXT).u32(1).u32(0).u32(2);
    pre.packet(egl::CREATE_SURFACE)
        .u32(1)
        .u32(64)
        .u32(64)
        .u32(config);
    pre.packet(egl::MAKE_CURRENT).u32(1).u32(1).u32(1);
    let mut post = Encoder::new();
    post.packet(egl::MAKE_CURRENT).u32(0).u32(0).u32(0);
    post.packet(egl::DESTROY_CONTEXT).u32(1);
    post.packet(egl::DESTROY_SURFACE).u32(1);
    (pre.as_bytes().to_vec(), post.as_bytes().to_vec())
}

fuzz_target!(|data: &[u8]| {
    RENDERER.with(|cell| {
        let mut guard = cell.borrow_mut();
        let r =
            guard.get_or_insert_with(|| Renderer::new().expect("host EGL (Mesa) for the fuzzer"));
        let (pre, post) = framing();
        let mut reply = Encoder::new();
        r.run(&pre, &mut reply, false).expect("set-up batch");
        let mut reply = Encoder::new();
        let _ = r.run(data, &mut reply, false);
        let mut reply = Encoder::new();
        let _ = r.run(&post, &mut reply, false);
    })
});
