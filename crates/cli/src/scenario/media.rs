//! Test media for the scenarios, generated at run time with the `ffmpeg` CLI and cached in a
//! data directory (`$VIRTSOC_DATA`, else `~/.cache/virtsoc/media`): H.264 elementary streams
//! with access-unit delimiters, so every packet is one picture ([`Clip`]: the cheapest
//! H.264 there is, or a realistic one with CABAC, deblocking and B-frames).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::CliError;

/// Where generated media are cached.
pub fn data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("VIRTSOC_DATA") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache/virtsoc/media")
}

/// How a clip is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Clip {
    /// `-preset ultrafast -tune zerolatency`, no B-frames: no CABAC, no deblocking (the
    /// cheapest H.264 to decode).
    Cheap,
    /// `-preset medium` (CABAC, deblocking, three B-frames) at a high bitrate
    /// ([`REALISTIC_BITS_PER_PIXEL`]) of a moving test pattern with temporal noise (texture
    /// that costs bits in every frame).
    Realistic,
}

/// The realistic clip's bitrate per pixel per frame: about 150 Mbit/s at UHD and 60 fps,
/// 37 at 1080p60 (the paper plays UHD at 300).
pub const REALISTIC_BITS_PER_PIXEL: f64 = 0.3;

impl Clip {
    /// The default clip of a scenario: realistic for `uhd-video`, cheap elsewhere.
    pub fn default_for(scenario: &str) -> Clip {
        match scenario {
            "uhd-video" => Clip::Realistic,
            _ => Clip::Cheap,
        }
    }
}

/// A clip of `kind` (see [`clip`]) encoded as `c` says: the cheap one 4 s long, the
/// realistic one 2 s (its encode at UHD takes a minute on a busy machine).
pub fn clip_of(
    c: Clip,
    kind: &str,
    width: u32,
    height: u32,
    fps: u32,
) -> Result<PathBuf, CliError> {
    match c {
        Clip::Cheap => clip(kind, width, height, fps, 4),
        Clip::Realistic => realistic_clip(kind, width, height, fps, 2),
    }
}

/// The ffmpeg source filter of clip kind `kind`.
fn source(kind: &str, width: u32, height: u32, fps: u32) -> Result<String, CliError> {
    match kind {
        "flat" => Ok(format!("testsrc2=size={width}x{height}:rate={fps}")),
        "equirect" => Ok(format!("mandelbrot=size={width}x{height}:rate={fps}")),
        other => Err(CliError::Usage(format!("unknown clip kind {other}"))),
    }
}

/// A realistic clip (see [`Clip::Realistic`]), cached like [`clip`].
pub fn realistic_clip(
    kind: &str,
    width: u32,
    height: u32,
    fps: u32,
    seconds: u32,
) -> Result<PathBuf, CliError> {
    let dir = data_dir();
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!(
        "{kind}-{width}x{height}-{fps}fps-{seconds}s-medium.h264"
    ));
    if path.exists() {
        return Ok(path);
    }
    let src = format!("{},noise=alls=12:allf=t", source(kind, width, height, fps)?);
    let bits = width as f64 * height as f64 * fps as f64 * REALISTIC_BITS_PER_PIXEL;
    let kbit = format!("{}k", (bits / 1000.0).round() as u64);
    let buf = format!("{}k", (bits / 500.0).round() as u64);
    let gop = fps.to_string();
    let secs = seconds.to_string();
    let args: Vec<&str> = vec![
        "-t",
        &secs,
        "-c:v",
        "libx264",
        "-preset",
        "medium",
        "-b:v",
        &kbit,
        "-maxrate",
        &kbit,
        "-bufsize",
        &buf,
        "-x264-params",
        "aud=1:bframes=3:cabac=1",
        "-pix_fmt",
        "yuv420p",
        "-g",
        &gop,
    ];
    encode(&src, &args, &path)?;
    Ok(path)
}

/// Runs ffmpeg on lavfi source `src` with encoder `args` into `path` (written under a
/// temporary name first, so an interrupted encode leaves no clip behind).
fn encode(src: &str, args: &[&str], path: &Path) -> Result<(), CliError> {
    let tmp = path.with_extension("tmp.h264");
    let out = Command::new("ffmpeg")
        .args([
            "-nostdin",
            "-loglevel",
            "error",
            "-y",
            "-f",
            "lavfi",
            "-i",
            src,
        ])
        .args(args)
        .args(["-bsf:v", "h264_mp4toannexb", "-f", "h264"])
        .arg(&tmp)
        .output()
        .map_err(|e| {
            CliError::Usage(format!(
                "cannot run ffmpeg (scripts/install-deps.sh installs it): {e}"
            ))
        })?;
    if !out.status.success() {
        return Err(CliError::Usage(format!(
            "ffmpeg failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// A test clip: `kind` is `flat` (a moving test pattern) or `equirect` (a 2:1 panorama).
pub fn clip(
    kind: &str,
    width: u32,
    height: u32,
    fps: u32,
    seconds: u32,
) -> Result<PathBuf, CliError> {
    let dir = data_dir();
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{kind}-{width}x{height}-{fps}fps-{seconds}s.h264"));
    if path.exists() {
        return Ok(path);
    }
    let src = source(kind, width, height, fps)?;
    let gop = fps.to_string();
    let secs = seconds.to_string();
    let args = [
        "-t",
        &secs,
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-tune",
        "zerolatency",
        "-x264-params",
        "aud=1:bframes=0",
        "-pix_fmt",
        "yuv420p",
        "-g",
        &gop,
    ];
    encode(&src, &args, &path)?;
    Ok(path)
}

/// NAL unit types: access-unit delimiter, filler data.
pub const NAL_AUD: u8 = 9;
pub const NAL_FILLER: u8 = 12;

/// Splits an Annex-B byte stream into access units, as the bytes arrive: a unit starts at an
/// access-unit delimiter and ends at the next one, or earlier at a filler-data NAL unit (the
/// end marker the livestream guest appends, so a unit is complete without waiting for the next). Bytes
/// outside units (before the first delimiter, the markers) are dropped.
#[derive(Debug, Default)]
pub struct AuSplitter {
    buf: Vec<u8>,
    /// Positions before this were searched.
    scan: usize,
    /// Whether `buf` starts with a unit (at its delimiter) that has not ended yet.
    open: bool,
}

impl AuSplitter {
    /// Adds bytes; returns the units they completed.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        self.buf.extend_from_slice(bytes);
        let mut units = Vec::new();
        let mut i = self.scan;
        while i + 4 <= self.buf.len() {
            let b = &self.buf[i..i + 4];
            let nal = (b[0] == 0 && b[1] == 0 && b[2] == 1).then_some(b[3] & 0x1f);
            if let Some(t @ (NAL_AUD | NAL_FILLER)) = nal {
                // A four-byte start code's leading zero belongs to the new NAL unit.
                let start = if i > 0 && self.buf[i - 1] == 0 {
                    i - 1
                } else {
                    i
                };
                if start > 0 {
                    if self.open {
                        units.push(self.buf[..start].to_vec());
                    }
                    self.buf.drain(..start);
                }
                self.open = t == NAL_AUD;
                i = i - start + 4;
            } else {
                i += 1;
            }
        }
        self.scan = i;
        units
    }

    /// The last unit, at the end of the stream.
    pub fn finish(self) -> Option<Vec<u8>> {
        (self.open && !self.buf.is_empty()).then_some(self.buf)
    }
}

/// Reads a clip and splits it.
pub fn load_units(path: &Path) -> Result<Vec<Vec<u8>>, CliError> {
    let bytes = std::fs::read(path)?;
    let mut sp = AuSplitter::default();
    let mut units = sp.push(&bytes);
    units.extend(sp.finish());
    Ok(units)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The livestream guest's end marker: a one-byte filler-data NAL unit (what ends a unit
    /// at once) and an access-unit delimiter.
    const END_MARKER: [u8; 13] = [0, 0, 0, 1, 12, 0xff, 0x80, 0, 0, 0, 1, 9, 0xf0];

    /// Junk, then three units: an IDR with an end marker, a P picture with an end marker, and
    /// a P picture without one.
    fn stream() -> (Vec<u8>, Vec<Vec<u8>>) {
        let units = vec![
            vec![0, 0, 0, 1, 9, 0xf0, 0, 0, 1, 0x65, 7, 8],
            vec![0, 0, 1, 9, 0xf0, 0, 0, 0, 1, 0x41, 5],
            vec![0, 0, 0, 1, 9, 0xf0, 0, 0, 1, 0x41, 6],
        ];
        let mut s = vec![0, 0, 0, 1, 0x67, 1, 2];
        s.extend_from_slice(&units[0]);
        s.extend_from_slice(&END_MARKER[..7]);
        s.extend_from_slice(&units[1]);
        s.extend_from_slice(&END_MARKER[..7]);
        s.extend_from_slice(&units[2]);
        (s, units)
    }

    #[test]
    fn splits_access_units_in_any_chunking() {
        let (s, expect) = stream();
        for chunk in [1, 2, 3, 5, 7, s.len()] {
            let mut sp = AuSplitter::default();
            let mut got: Vec<Vec<u8>> = s.chunks(chunk).flat_map(|c| sp.push(c)).collect();
            got.extend(sp.finish());
            assert_eq!(got, expect, "chunks of {chunk}");
        }
        assert_eq!(AuSplitter::default().finish(), None);
    }

    #[test]
    fn an_end_marker_completes_a_unit_at_once() {
        let (_, units) = stream();
        let mut sp = AuSplitter::default();
        assert!(sp.push(&units[0]).is_empty());
        assert_eq!(sp.push(&END_MARKER), vec![units[0].clone()]);
        // Without markers, units end at the next delimiter.
        let mut sp = AuSplitter::default();
        assert!(sp.push(&units[1]).is_empty());
        assert_eq!(sp.push(&units[2]), vec![units[1].clone()]);
        assert_eq!(sp.finish(), Some(units[2].clone()));
    }
}
