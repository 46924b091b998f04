//! FFmpeg is initialized (error strings, log level) by the crate itself, before the first
//! codec or demuxer opens: errors carry FFmpeg's reason and libav* stays quiet on stderr.
//! Its own test binary, so nothing else in the process has initialized FFmpeg first.

use virtsoc_media::{CodecKind, Demuxer, FfmpegDecoder, MediaError, PixelFormat};

#[test]
fn a_garbage_file_is_refused_with_ffmpegs_reason() {
    let path = std::env::temp_dir().join(format!("virtsoc-garbage-{}.mp4", std::process::id()));
    let garbage: Vec<u8> = (0..64 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&path, garbage).unwrap();
    let r = Demuxer::open(&path);
    let _ = std::fs::remove_file(&path);
    match r {
        Err(MediaError::File { reason, .. }) => {
            assert!(
                !reason.trim().is_empty(),
                "FFmpeg's error text is empty: was ffmpeg_next::init() called?"
            );
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("garbage opened as a media file"),
    }
}

#[test]
fn opening_a_decoder_quiets_ffmpeg() {
    // The level is process-wide; it must be set by the constructor, not by the caller.
    match FfmpegDecoder::new(CodecKind::H264, PixelFormat::Yuv420p, 1) {
        Ok(_) => {}
        Err(MediaError::Unsupported(why)) => {
            assert!(
                std::env::var_os("VIRTSOC_REQUIRE_ALL").is_none(),
                "no H.264 decoder ({why}) and VIRTSOC_REQUIRE_ALL is set"
            );
            return eprintln!("skipped: {why}");
        }
        Err(e) => panic!("{e}"),
    }
    assert_eq!(
        ffmpeg_next::util::log::get_level().ok(),
        Some(ffmpeg_next::util::log::Level::Fatal)
    );
}
