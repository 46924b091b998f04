//! The GLES render worker's decoder on arbitrary command streams: each input runs as one
//! batch of a guest on a context of a real host EGL/GLES (Mesa llvmpipe here) made current
//! on a small surface, EGL packets included. GL errors and refused batches are fine; a
//! panic, a crash in the driver reached through an unchecked length, or an abort is not.
//!
//! [`RECYCLE`] inputs in a row run on one context, as a guest's batches do, before it is
//! destroyed (with what they made) and a fresh one made. Making and destroying an llvmpipe
//! context costs about 13 ms under ASan (its allocations, zeroed, faulted in and unmapped
//! again), so a fresh context per input ran 43-75 inputs a second against about 5,000.
//! The price: an input found crashing may need some of the inputs before it since its
//! context was made (state it did not set up itself); libFuzzer saves only the last, so
//! replay the work directory with `-runs` when the artifact alone does not crash.

#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use virtsoc_gles_stream::{egl, Encoder};
use virtsoc_render::worker::Renderer;

/// Inputs run on one context before it is destroyed and a fresh one made.
const RECYCLE: u32 = 256;

/// The renderer, the packets that make and destroy the inputs' context, and the inputs run
/// on the context now current.
struct Fuzzed {
    renderer: Renderer,
    framing: (Vec<u8>, Vec<u8>),
    since: u32,
}

thread_local! {
    // The host EGL's objects belong to the thread that made them (libFuzzer runs inputs on
    // one thread).
    static RENDERER: RefCell<Option<Fuzzed>> = const { RefCell::new(None) };
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
        let f = guard.get_or_insert_with(|| Fuzzed {
            renderer: Renderer::new().expect("host EGL (Mesa) for the fuzzer"),
            framing: framing(),
            since: RECYCLE,
        });
        if f.since == RECYCLE {
            // The context of the last RECYCLE inputs (if any) destroyed, a fresh one made.
            let mut reply = Encoder::new();
            let _ = f.renderer.run(&f.framing.1, &mut reply, false);
            let mut reply = Encoder::new();
            f.renderer
                .run(&f.framing.0, &mut reply, false)
                .expect("set-up batch");
            f.since = 0;
        }
        f.since += 1;
        let mut reply = Encoder::new();
        let _ = f.renderer.run(data, &mut reply, false);
    })
});
