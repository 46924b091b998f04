//! PNG snapshots of frames (8-bit RGBA, whatever the frame's format).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::error::Result;
use crate::frame::PresentedFrame;

/// Encodes `frame` as an RGBA PNG into `w`.
pub fn encode_png<W: Write>(frame: &PresentedFrame, w: W) -> Result<()> {
    let rgba = frame.to_rgba8()?;
    let mut enc = png::Encoder::new(w, frame.width, frame.height);
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header()?;
    writer.write_image_data(&rgba)?;
    writer.finish()?;
    Ok(())
}

/// Writes `frame` as an RGBA PNG file at `path`. The file is written next to
/// `path` first and renamed into place, so readers never see half a PNG.
pub fn write_png(frame: &PresentedFrame, path: &Path) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let result = (|| -> Result<()> {
        let mut out = BufWriter::new(File::create(&tmp)?);
        encode_png(frame, &mut out)?;
        out.flush()?;
        Ok(())
    })();
    match result {
        Ok(()) => {
            std::fs::rename(&tmp, path)?;
            Ok(())
        }
        Err(e) => {
            // Best effort: the encoding error is the one worth reporting.
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}
