//! The codec's encoders: `open_encoder` and `encode` (libx264 in a worker process of the
//! decoders' pool by default, in the daemon's process otherwise). An `encode` whose frame
//! the codec's waiter path handed to the worker already (`wait.rs`) reads its packets here.

use virtsoc_devapi::codec as api;
use virtsoc_ids::HandleId;
use virtsoc_media::{EncoderBackend, FfmpegEncoder, FrameRef, MediaError, ProcessEncoder};
use virtsoc_proto::Status;
use virtsoc_svm::GuestId;

use super::state::{EncoderSession, Session};
use super::{
    frame_layout, media_reason, replay, Codec, ENCODER_THREADS, MAX_DIMENSION, MAX_ENCODE_BITRATE,
    MAX_ENCODE_FPS,
};
use crate::device::{DeviceCtx, DeviceResult};
use crate::status::status_of;

impl Codec {
    pub(super) fn open_encoder_at(
        &self,
        guest: GuestId,
        c: api::OpenEncoder,
        at: Option<HandleId>,
        cx: Option<&DeviceCtx<'_>>,
    ) -> std::result::Result<HandleId, Status> {
        let dim = |v: u64| {
            u32::try_from(v)
                .ok()
                .filter(|v| (16..=MAX_DIMENSION).contains(v) && v % 2 == 0)
        };
        let (Some(width), Some(height)) = (dim(c.width), dim(c.height)) else {
            return Err(Status::BadArgument);
        };
        if !(1..=MAX_ENCODE_FPS).contains(&c.fps) || !(1..=MAX_ENCODE_BITRATE).contains(&c.bitrate)
        {
            return Err(Status::BadArgument);
        }
        // Admitted before its worker starts and again when added (the lock is not held
        // meanwhile, `sessions.rs`).
        self.state()
            .admit(&self.limits_for(cx), guest, ENCODER_THREADS)?;
        let (fps, preset) = (c.fps as u32, self.preset);
        let encoder: std::result::Result<Box<dyn EncoderBackend>, MediaError> = match &self.workers
        {
            // libx264 in a worker of the decoders' pool, like the decoders.
            Some(pool) => ProcessEncoder::open(pool, (width, height), (fps, c.bitrate), preset)
                .map(|e| Box::new(e) as _),
            None => FfmpegEncoder::new_h264_with(width, height, fps, c.bitrate, preset)
                .map(|e| Box::new(e) as _),
        };
        let encoder = encoder.map_err(|e| {
            log::info!("codec: guest {guest}: cannot open H.264 encoder: {e}");
            status_of(&e)
        })?;
        let name = encoder.name().to_string();
        let mut st = self.state();
        let handle = st.open(
            &self.limits_for(cx),
            guest,
            (
                Session::Encoder(EncoderSession {
                    encoder,
                    width,
                    height,
                }),
                replay::Opened::Encoder {
                    width: c.width,
                    height: c.height,
                    fps: c.fps,
                    bitrate: c.bitrate,
                },
            ),
            ENCODER_THREADS,
            at,
        )?;
        log::info!(
            "codec: guest {guest} opened {name} encoder {handle} ({width}x{height} at {} fps, {} bit/s)",
            c.fps,
            c.bitrate
        );
        Ok(handle)
    }

    pub(super) fn encode(&self, cx: &DeviceCtx<'_>, c: api::Encode) -> DeviceResult {
        let mut st = self.state();
        let s = st.encoder(cx.guest, c.handle)?;
        // A frame the codec's waiter path started (`wait.rs`) is this command's: its packets,
        // or, should the command fail before reading them, dropped with it.
        let started = s.encoder.started();
        let checked = (|| {
            let meta = cx.meta(c.frame)?;
            let out_size = cx.meta(c.out)?.size;
            let layout = frame_layout(&meta)?;
            if !layout.format.is_yuv() {
                return Err(Status::NotSupported);
            }
            if (layout.width, layout.height) != (s.width, s.height) {
                return Err(Status::BadArgument);
            }
            Ok((layout, out_size))
        })();
        let (layout, out_size) = match checked {
            Ok(v) => v,
            Err(st) => {
                if started {
                    let _ = s.encoder.finish();
                }
                return Err(st);
            }
        };
        let encoder = &mut s.encoder;
        let packets = if started {
            encoder.finish()
        } else {
            cx.with_source(c.frame, |bytes| {
                FrameRef::new(layout, bytes)
                    .map_err(MediaError::from)
                    .and_then(|f| encoder.encode(f, c.pts as i64))
            })?
        };
        let packets = packets.map_err(|e| {
            log::debug!("codec: guest {}: encoder {}: {e}", cx.guest, c.handle);
            cx.fail(status_of(&e), media_reason(&e))
        })?;
        let total: usize = packets.iter().map(|p| p.data.len()).sum();
        if total as u64 > out_size {
            log::debug!(
                "codec: guest {}: encoder {}: {total} bytes of packets do not fit region {} ({out_size} bytes); dropped",
                cx.guest,
                c.handle,
                c.out
            );
            return Err(Status::OutOfRange);
        }
        if total > 0 {
            cx.with_region(c.out, |bytes| {
                let mut o = 0;
                for p in &packets {
                    let dst = bytes
                        .get_mut(o..o + p.data.len())
                        .ok_or(Status::OutOfRange)?;
                    dst.copy_from_slice(&p.data);
                    o += p.data.len();
                }
                Ok(())
            })??;
        }
        Ok(api::EncodeReply {
            bytes: total as u64,
            keyframe: packets.iter().any(|p| p.keyframe) as u64,
            out_pts: packets.first().map_or(0, |p| p.pts as u64),
        }
        .to_values())
    }
}
