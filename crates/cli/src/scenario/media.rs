//! Test media for the scenarios, generated at run time with the `ffmpeg` CLI and cached in a
//! data directory (`$VIRTSOC_DATA`, else `~/.cache/virtsoc/media`): H.264 elementary streams
//! with access-unit delimiters and no B-frames, so every packet decodes to one frame.

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
    let src = match kind {
        "flat" => format!("testsrc2=size={width}x{height}:rate={fps}"),
        "equirect" => format!("mandelbrot=size={width}x{height}:rate={fps}"),
        other => return Err(CliError::Usage(format!("unknown clip kind {other}"))),
    };
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
            &src,
        ])
        .args([
            "-t",
            &seconds.to_string(),
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
        ])
        .args(["-tune", "zerolatency", "-x264-params", "aud=1:bframes=0"])
        .args(["-pix_fmt", "yuv420p", "-g", &fps.to_string()])
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
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Splits an Annex-B H.264 stream into access units at its access-unit delimiters.
pub fn access_units(stream: &[u8]) -> Vec<&[u8]> {
    let mut starts = Vec::new();
    let mut i = 0;
    while i + 4 <= stream.len() {
        if stream[i] == 0 && stream[i + 1] == 0 && stream[i + 2] == 1 {
            let nal = stream.get(i + 3).copied().unwrap_or(0) & 0x1f;
            if nal == 9 {
                // Include a leading zero of a four-byte start code.
                starts.push(if i > 0 && stream[i - 1] == 0 {
                    i - 1
                } else {
                    i
                });
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    if starts.first() != Some(&0) {
        starts.insert(0, 0);
    }
    let mut units = Vec::with_capacity(starts.len());
    for w in starts.windows(2) {
        units.push(&stream[w[0]..w[1]]);
    }
    if let Some(&last) = starts.last() {
        units.push(&stream[last..]);
    }
    units.retain(|u| !u.is_empty());
    units
}

/// Reads a clip and splits it.
pub fn load_units(path: &Path) -> Result<Vec<Vec<u8>>, CliError> {
    let bytes = std::fs::read(path)?;
    Ok(access_units(&bytes)
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_delimiters() {
        let s = [
            0, 0, 0, 1, 9, 0xf0, 0, 0, 1, 0x67, 1, 2, 0, 0, 0, 1, 9, 0xf0, 0, 0, 1, 0x65, 7,
        ];
        let u = access_units(&s);
        assert_eq!(u.len(), 2);
        assert_eq!(u[0], &s[..12]);
        assert_eq!(u[1], &s[12..]);
        assert!(access_units(&[]).is_empty());
    }
}
