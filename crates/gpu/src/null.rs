//! The null backend: validates arguments exactly like the real backends and
//! fills the destination pixels with a constant colour.

use crate::{
    check_layers, check_markers, check_rgb_dst, check_view, Clear, FrameMut, FrameRef, GpuBackend,
    GpuStats, Layer, Marker, PixelFormat, Result, View,
};

/// Validates, then fills every destination pixel (not the row padding) with
/// `fill` (RGBA order, written in the destination's byte order).
#[derive(Clone, Debug)]
pub struct NullBackend {
    fill: [u8; 4],
}

impl Default for NullBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl NullBackend {
    /// Fills with opaque mid grey `[128, 128, 128, 255]`.
    pub fn new() -> Self {
        NullBackend {
            fill: [128, 128, 128, 255],
        }
    }

    /// Fills with `fill`, an RGBA colour (R, G, B, A order whatever the destination byte order).
    pub fn with_fill(fill: [u8; 4]) -> Self {
        NullBackend { fill }
    }

    /// The RGBA colour this backend fills destinations with.
    pub fn fill_color(&self) -> [u8; 4] {
        self.fill
    }

    fn fill(&self, dst: FrameMut<'_>) {
        let l = dst.layout;
        let f = self.fill;
        let px = if l.format == PixelFormat::Bgra8 {
            [f[2], f[1], f[0], f[3]]
        } else {
            f
        };
        let row_bytes = l.width as usize * 4;
        for row in dst
            .data
            .chunks_mut(l.stride as usize)
            .take(l.height as usize)
        {
            for p in row[..row_bytes].chunks_exact_mut(4) {
                p.copy_from_slice(&px);
            }
        }
    }
}

impl GpuBackend for NullBackend {
    fn name(&self) -> &str {
        "null"
    }

    fn composite_with(
        &self,
        layers: &[Layer<'_>],
        dst: FrameMut<'_>,
        _clear: Clear,
    ) -> Result<GpuStats> {
        check_rgb_dst("composite", &dst.layout, dst.data.len())?;
        check_layers(layers)?;
        self.fill(dst);
        Ok(GpuStats::default())
    }

    fn project_equirect(
        &self,
        src: FrameRef<'_>,
        view: View,
        dst: FrameMut<'_>,
    ) -> Result<GpuStats> {
        check_rgb_dst("project_equirect", &dst.layout, dst.data.len())?;
        src.layout.check_buffer(src.data.len())?;
        check_view(&view)?;
        self.fill(dst);
        Ok(GpuStats::default())
    }

    fn draw_markers(&self, markers: &[Marker], dst: FrameMut<'_>) -> Result<GpuStats> {
        check_rgb_dst("draw_markers", &dst.layout, dst.data.len())?;
        check_markers(markers)?;
        self.fill(dst);
        Ok(GpuStats::default())
    }

    fn convert(&self, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<GpuStats> {
        check_rgb_dst("convert", &dst.layout, dst.data.len())?;
        src.layout.check_buffer(src.data.len())?;
        self.fill(dst);
        Ok(GpuStats::default())
    }
}
