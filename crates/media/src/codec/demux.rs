//! libavformat-backed [`Demuxer`]: the best video stream of a file, packet by packet.

use std::path::{Path, PathBuf};

use ffmpeg_next as ff;

use super::{CodecKind, FfmpegDecoder};
use crate::error::{MediaError, Result};
use crate::frame::PixelFormat;

/// What a [`Demuxer`] found about the video stream it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamInfo {
    /// Index of the stream inside the container.
    pub stream_index: usize,
    /// The codec, if it is one of ours.
    pub codec: Option<CodecKind>,
    /// FFmpeg's codec name (also for codecs outside [`CodecKind`]).
    pub codec_name: String,
    /// Coded width in pixels.
    pub width: u32,
    /// Coded height in pixels.
    pub height: u32,
    /// Average frame rate as (numerator, denominator), if the container tells.
    pub frame_rate: Option<(i32, i32)>,
    /// Time base of packet timestamps as (numerator, denominator) seconds.
    pub time_base: (i32, i32),
    /// Frame count, if the container tells.
    pub frames: Option<u64>,
    /// Codec extradata (e.g. avcC / hvcC), empty for Annex-B streams.
    pub extradata: Vec<u8>,
}

impl StreamInfo {
    /// Frame rate in frames per second, if known.
    pub fn fps(&self) -> Option<f64> {
        self.frame_rate
            .filter(|&(n, d)| n > 0 && d > 0)
            .map(|(n, d)| n as f64 / d as f64)
    }
}

/// One compressed packet of the video stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemuxedPacket {
    /// The packet's bytes, as the container stores them (length-prefixed NAL units for MP4).
    pub data: Vec<u8>,
    /// Presentation timestamp in [`StreamInfo::time_base`] units (the dts, or a running count,
    /// when the container gives none).
    pub pts: i64,
    /// Decoding timestamp, if any.
    pub dts: Option<i64>,
    /// True for keyframes.
    pub keyframe: bool,
}

/// Reads the best video stream of a media file.
pub struct Demuxer {
    input: ff::format::context::Input,
    info: StreamInfo,
    path: PathBuf,
    count: i64,
}

impl Demuxer {
    /// Opens `path` and selects its best video stream.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file_err = |reason: String| MediaError::File {
            path: path.clone(),
            reason,
        };
        super::init_ffmpeg();
        let input = ff::format::input(&path).map_err(|e| file_err(e.to_string()))?;
        let stream = input
            .streams()
            .best(ff::media::Type::Video)
            .ok_or_else(|| file_err("no video stream".into()))?;
        let params = stream.parameters();
        // SAFETY: reading plain fields of the stream's codec parameters.
        let (width, height, extradata) = unsafe {
            let p = params.as_ptr();
            let extra = if (*p).extradata.is_null() || (*p).extradata_size <= 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts((*p).extradata, (*p).extradata_size as usize).to_vec()
            };
            ((*p).width.max(0) as u32, (*p).height.max(0) as u32, extra)
        };
        let id = params.id();
        let rate = stream.avg_frame_rate();
        let tb = stream.time_base();
        let info = StreamInfo {
            stream_index: stream.index(),
            codec: CodecKind::from_av_id(id),
            codec_name: format!("{id:?}").to_lowercase(),
            width,
            height,
            frame_rate: (rate.numerator() > 0 && rate.denominator() > 0)
                .then(|| (rate.numerator(), rate.denominator())),
            time_base: (tb.numerator(), tb.denominator()),
            frames: (stream.frames() > 0).then(|| stream.frames() as u64),
            extradata,
        };
        Ok(Demuxer {
            input,
            info,
            path,
            count: 0,
        })
    }

    /// The selected video stream.
    pub fn info(&self) -> &StreamInfo {
        &self.info
    }

    /// The file being read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next packet of the video stream, `None` at end of file. A damaged container gives
    /// `Err(MediaError::File)`.
    pub fn read_packet(&mut self) -> Result<Option<DemuxedPacket>> {
        loop {
            let mut pkt = ff::Packet::empty();
            match pkt.read(&mut self.input) {
                Ok(()) => {}
                Err(ff::Error::Eof) => return Ok(None),
                Err(e) => {
                    return Err(MediaError::File {
                        path: self.path.clone(),
                        reason: format!("reading packet: {e}"),
                    })
                }
            }
            if pkt.stream() != self.info.stream_index {
                continue;
            }
            let Some(data) = pkt.data() else { continue };
            self.count += 1;
            return Ok(Some(DemuxedPacket {
                data: data.to_vec(),
                pts: pkt.pts().or(pkt.dts()).unwrap_or(self.count - 1),
                dts: pkt.dts(),
                keyframe: pkt.is_key(),
            }));
        }
    }

    /// Starts over from the first packet (re-opens the file, which works for every container
    /// without relying on seek support).
    pub fn rewind(&mut self) -> Result<()> {
        *self = Demuxer::open(&self.path)?;
        Ok(())
    }

    /// A decoder configured for this stream.
    pub fn decoder(&self, out: PixelFormat, threads: usize) -> Result<FfmpegDecoder> {
        FfmpegDecoder::for_stream(&self.info, out, threads)
    }
}
