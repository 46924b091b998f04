//! Tells the crate which libavcodec it builds against, from what `ffmpeg-sys-next` found:
//! `virtsoc_thread_safe_callbacks` where libavcodec is older than 60 (FFmpeg 6), whose
//! frame threads hand a custom `get_buffer2` to the decoding call's thread unless the
//! context says the callback is thread-safe (`src/codec/worker/direct.rs`).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(virtsoc_thread_safe_callbacks)");
    println!("cargo::rerun-if-env-changed=DEP_FFMPEG_FFMPEG_6_0");
    // `ffmpeg-sys-next` sets `ffmpeg_6_0` to "true" from FFmpeg 6 on, empty before.
    let six = std::env::var("DEP_FFMPEG_FFMPEG_6_0").unwrap_or_default();
    if six != "true" {
        println!("cargo::rustc-cfg=virtsoc_thread_safe_callbacks");
    }
}
