//! The live view's frames and recordings of the control API: a guest's latest presented
//! frames (from the display), on the control request's own thread, never on a device worker.
//! View frames of display planes are sampled straight into a small YUV picture (see the
//! display's `thumb` module) and encoded as JPEG by a kept encoder; other frames, and
//! recordings, are composed into RGBA and scaled by the encoder. Reading the planes' memory
//! is counted on the guest's ledger like the display's own copies.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use virtsoc_svm::GuestId;

use virtsoc_control::budget::thread_cpu;
use virtsoc_control::{ControlError, ViewFrame};
use virtsoc_display::{PresentedFrame, ViewPicture};
use virtsoc_media::{JpegEncoder, Mp4Recorder, YuvJpegEncoder};
use virtsoc_sync::LockExt;

use crate::device::DeviceSlot;
use crate::Daemon;

/// JPEG quantizer of view frames (2 best .. 31 worst).
const VIEW_QUALITY: u8 = 6;
/// How long a recording waits for the guest's first frame.
const FIRST_FRAME_WAIT: Duration = Duration::from_secs(2);

fn internal(e: impl std::fmt::Display) -> ControlError {
    ControlError::Internal(e.to_string())
}

fn display(daemon: &Daemon) -> Result<&Arc<DeviceSlot>, ControlError> {
    daemon
        .devices()
        .iter()
        .find(|s| s.device.name() == "display")
        .ok_or_else(|| ControlError::NotFound("this daemon has no display".into()))
}

fn rgba(f: &PresentedFrame) -> Result<Vec<u8>, ControlError> {
    f.to_rgba8().map_err(internal)
}

/// JPEG encoders of view pictures kept between frames, by size (opening one costs about as
/// much as encoding a small picture). MJPEG frames are independent, so any viewer of any
/// guest may use any encoder of the right size.
#[derive(Default)]
pub struct Encoders(Mutex<Vec<YuvJpegEncoder>>);

/// Encoders kept.
const ENCODERS_KEPT: usize = 4;

impl Encoders {
    /// Encodes `pic` with a kept encoder of its size (or a new one, kept afterwards).
    fn encode(&self, pic: &ViewPicture) -> Result<Vec<u8>, ControlError> {
        let size = (pic.width, pic.height);
        let kept = {
            let mut v = self.0.lock_or_recover();
            v.iter()
                .position(|e| e.size() == size)
                .map(|i| v.swap_remove(i))
        };
        let mut enc = match kept {
            Some(e) => e,
            None => YuvJpegEncoder::new(size.0, size.1, VIEW_QUALITY).map_err(internal)?,
        };
        let jpeg = enc.encode(&pic.data).map_err(internal)?;
        let mut v = self.0.lock_or_recover();
        if v.len() >= ENCODERS_KEPT {
            v.remove(0);
        }
        v.push(enc);
        Ok(jpeg)
    }
}

/// Guest `guest`'s latest frame newer than `after` as a JPEG fitting `max`, waiting up to
/// `wait`.
pub fn frame(
    daemon: &Daemon,
    encoders: &Encoders,
    guest: GuestId,
    after: u64,
    max: (u32, u32),
    wait: Duration,
) -> Result<Option<ViewFrame>, ControlError> {
    let Some(f) = display(daemon)?.device.latest_frame(guest, after, wait) else {
        return Ok(None);
    };
    // Display planes are composed straight into the view's size (a ninth of the work of a
    // 1080p screen for 640x360); other frames are scaled by the encoder.
    let (w, h) = virtsoc_media::codec::fit_within(f.width, f.height, max.0, max.1);
    let t0 = Instant::now();
    let cpu0 = thread_cpu();
    // Display planes are sampled straight into a small YUV picture; other frames are
    // converted to RGBA and scaled by the encoder.
    let (jpeg, (width, height), composed, opened) = match f.view_picture(w, h) {
        Some(pic) => {
            let composed = t0.elapsed();
            let jpeg = encoders.encode(&pic)?;
            (jpeg, (pic.width, pic.height), composed, composed)
        }
        None => {
            let (pixels, size) = match f.rgba_scaled(w, h) {
                Some(px) => (px, (w, h)),
                None => (rgba(&f)?, (f.width, f.height)),
            };
            let composed = t0.elapsed();
            let enc = JpegEncoder::new(size.0, size.1, max.0, max.1, VIEW_QUALITY);
            let mut enc = enc.map_err(internal)?;
            let opened = t0.elapsed();
            let jpeg = enc.encode(&pixels).map_err(internal)?;
            (jpeg, enc.size(), composed, opened)
        }
    };
    log::debug!(
        "view: guest {guest} frame {}: composed {:?}, encoder opened {:?}, encoded {:?}, \
         this thread's CPU {:?}",
        f.id,
        composed,
        opened - composed,
        t0.elapsed() - opened,
        thread_cpu().saturating_sub(cpu0)
    );
    let age_ms = f
        .capture_ns
        .map(|c| crate::clock::now_ns().saturating_sub(c) as f64 / 1e6)
        .unwrap_or(0.0);
    Ok(Some(ViewFrame {
        id: f.id,
        width,
        height,
        jpeg,
        age_ms,
    }))
}

/// Records guest `guest`'s presented frames for `seconds` at `fps` (each tick takes the
/// latest frame; a tick without a new frame repeats the last, so the file plays in real
/// time) into an MP4 fitting `max`; returns its bytes and the distinct frames in it.
pub fn record(
    daemon: &Daemon,
    guest: GuestId,
    seconds: f64,
    fps: u32,
    max: (u32, u32),
) -> Result<(Vec<u8>, u64), ControlError> {
    let slot = display(daemon)?;
    let mut cur = slot
        .device
        .latest_frame(guest, 0, FIRST_FRAME_WAIT)
        .ok_or_else(|| ControlError::Conflict(format!("guest {guest} presents no frames")))?;
    // A file of our own (libavformat seeks back to write the MP4 index), removed when done.
    let file = tempfile::Builder::new()
        .prefix("virtsoc-record-")
        .suffix(".mp4")
        .tempfile()
        .map_err(internal)?;
    let path = file.path().to_path_buf();
    // Planes are composed straight into the recording's size where the frame allows it.
    let (w, h) = virtsoc_media::codec::fit_within(cur.width, cur.height, max.0, max.1);
    let scaled = cur.rgba_scaled(w, h).is_some();
    let pixels_of = |f: &PresentedFrame| match scaled {
        true => f
            .rgba_scaled(w, h)
            .ok_or_else(|| internal("a frame could not be composed")),
        false => rgba(f),
    };
    let size = if scaled {
        (w, h)
    } else {
        (cur.width, cur.height)
    };
    (|| {
        let mut rec = Mp4Recorder::create(&path, size, max, fps).map_err(internal)?;
        let mut pixels = pixels_of(&cur)?;
        let mut distinct = 1u64;
        let period = Duration::from_secs_f64(1.0 / fps as f64);
        let ticks = (seconds * fps as f64).ceil() as u32;
        let start = Instant::now();
        for k in 0..ticks {
            std::thread::sleep((start + period * k).saturating_duration_since(Instant::now()));
            if let Some(f) = slot.device.latest_frame(guest, cur.id, Duration::ZERO) {
                // A frame of another size (the guest changed mode) is left out.
                if (f.width, f.height) == (cur.width, cur.height) {
                    pixels = pixels_of(&f)?;
                    cur = f;
                    distinct += 1;
                }
            }
            rec.push(&pixels).map_err(internal)?;
        }
        rec.finish().map_err(internal)?;
        let bytes = std::fs::read(&path).map_err(internal)?;
        Ok((bytes, distinct))
    })()
}
