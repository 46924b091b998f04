//! Resident images ([`GpuImage`]): creation (long-lived, or temporary from the
//! texture pool for the byte API), and the byte-range uploads and readbacks
//! the SVM copy engine uses ([`WgpuBackend::write_image`],
//! [`WgpuBackend::read_image`]) over the frame's linear layout.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use virtsoc_sync::LockExt;

use super::pool::{BufKey, TexKey};
use super::{align_up, State, WgpuBackend};
use crate::{FrameLayout, GpuError, PixelFormat, Result};

/// One plane of an image: its texture and where it lives in the linear layout.
pub(super) struct Plane {
    pub key: TexKey,
    pub tex: wgpu::Texture,
    /// Bytes per texel.
    pub bpp: usize,
    /// Offset and row pitch of the plane in the linear layout.
    pub offset: usize,
    pub stride: usize,
}

impl Plane {
    /// Bytes of pixels in one row (the rest of `stride` is padding).
    fn row_bytes(&self) -> usize {
        self.key.width as usize * self.bpp
    }

    /// The plane's bytes in the linear layout.
    fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.stride * self.key.height as usize
    }
}

pub(super) struct ImageInner {
    id: u64,
    pub owner: u64,
    pub layout: FrameLayout,
    pub size: usize,
    pub planes: Vec<Plane>,
    /// Views of planes 0..3 (a dummy for planes the format lacks).
    pub views: [wgpu::TextureView; 3],
    /// Source mode of the shaders: 0 packed RGB, 1 NV12, 2 YUV420P.
    pub mode: u32,
}

/// A long-lived GPU image holding one frame in `layout`: NV12 = R8 luma + RG8
/// chroma textures; YUV420P = three R8 textures; RGBA8/BGRA8 = one
/// Rgba8Unorm/Bgra8Unorm texture usable as render target, sampled texture,
/// copy source and destination (and storage for RGBA8). Cheap to clone (the
/// textures are shared); `Send + Sync`.
#[derive(Clone)]
pub struct GpuImage {
    pub(super) inner: Arc<ImageInner>,
}

impl GpuImage {
    /// The frame layout (format, size, stride of the linear byte layout that
    /// [`WgpuBackend::write_image`] and [`WgpuBackend::read_image`] use).
    pub fn layout(&self) -> FrameLayout {
        self.inner.layout
    }

    /// Unique per image (never reused within the process).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Bytes of the frame in its linear layout (`layout.size_bytes()`).
    pub fn bytes(&self) -> usize {
        self.inner.size
    }

    pub(super) fn is_rgb(&self) -> bool {
        self.inner.layout.format.is_rgb()
    }

    /// The texture of the packed RGB plane (the render target).
    pub(super) fn target(&self) -> &wgpu::Texture {
        &self.inner.planes[0].tex
    }
}

impl std::fmt::Debug for GpuImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuImage")
            .field("id", &self.inner.id)
            .field("layout", &self.inner.layout)
            .finish()
    }
}

/// Texture usage of every plane of an image of `format`.
fn usage(format: PixelFormat) -> wgpu::TextureUsages {
    use wgpu::TextureUsages as U;
    let base = U::TEXTURE_BINDING | U::COPY_SRC | U::COPY_DST;
    match format {
        PixelFormat::Rgba8 => base | U::RENDER_ATTACHMENT | U::STORAGE_BINDING,
        PixelFormat::Bgra8 => base | U::RENDER_ATTACHMENT,
        PixelFormat::Nv12 | PixelFormat::Yuv420p => base,
    }
}

/// Texture format, width, height, bytes per texel, (offset, stride) of a plane.
type PlaneSpec = (wgpu::TextureFormat, u32, u32, usize, (usize, usize));

/// A rectangle of texel rows of one plane to read back.
#[derive(Clone, Copy, Debug)]
pub(super) struct RowReq {
    pub plane: usize,
    pub x: u32,
    pub width: u32,
    pub y: u32,
    pub rows: u32,
}

impl WgpuBackend {
    /// Creates a resident image for frames of `layout` (validated, and checked
    /// against the device limits).
    pub fn create_image(&self, layout: FrameLayout) -> Result<GpuImage> {
        self.new_image(layout, None)
    }

    /// A temporary image from the texture pool (give it back with
    /// [`WgpuBackend::recycle_image`]).
    pub(super) fn temp_image(&self, st: &mut State, layout: FrameLayout) -> Result<GpuImage> {
        self.new_image(layout, Some(st))
    }

    pub(super) fn recycle_image(st: &mut State, img: GpuImage) {
        for p in &img.inner.planes {
            st.pool.give_texture(p.key, p.tex.clone());
        }
    }

    fn new_image(&self, layout: FrameLayout, mut pool: Option<&mut State>) -> Result<GpuImage> {
        static IDS: AtomicU64 = AtomicU64::new(1);
        layout.validate()?;
        self.check_size(&layout)?;
        let at = |i| {
            layout
                .plane(i)
                .map(|p| (p.offset, p.stride))
                .unwrap_or_default()
        };
        let (w, h) = (layout.width, layout.height);
        let (cw, ch) = layout.chroma_size();
        use wgpu::TextureFormat as F;
        let specs: Vec<PlaneSpec> = match layout.format {
            PixelFormat::Rgba8 => vec![(F::Rgba8Unorm, w, h, 4, at(0))],
            PixelFormat::Bgra8 => vec![(F::Bgra8Unorm, w, h, 4, at(0))],
            PixelFormat::Nv12 => vec![
                (F::R8Unorm, w, h, 1, at(0)),
                (F::Rg8Unorm, cw, ch, 2, at(1)),
            ],
            PixelFormat::Yuv420p => vec![
                (F::R8Unorm, w, h, 1, at(0)),
                (F::R8Unorm, cw, ch, 1, at(1)),
                (F::R8Unorm, cw, ch, 1, at(2)),
            ],
        };
        let usage = usage(layout.format);
        let planes_v: Vec<Plane> = specs
            .into_iter()
            .map(|(format, width, height, bpp, (offset, stride))| {
                let key = TexKey {
                    format,
                    width,
                    height,
                    usage,
                };
                let tex = match pool.as_deref_mut() {
                    Some(st) => st.pool.take_texture(&self.device, key),
                    None => super::pool::create_texture(&self.device, key, "virtsoc-image"),
                };
                Plane {
                    key,
                    tex,
                    bpp,
                    offset,
                    stride,
                }
            })
            .collect();
        let view = |i: usize| {
            planes_v
                .get(i)
                .map(|p| p.tex.create_view(&Default::default()))
                .unwrap_or_else(|| self.pipes.dummy_view.clone())
        };
        let views = [view(0), view(1), view(2)];
        let mode = match layout.format {
            PixelFormat::Rgba8 | PixelFormat::Bgra8 => 0,
            PixelFormat::Nv12 => 1,
            PixelFormat::Yuv420p => 2,
        };
        Ok(GpuImage {
            inner: Arc::new(ImageInner {
                id: IDS.fetch_add(1, Ordering::Relaxed),
                owner: self.instance,
                layout,
                size: layout.size(),
                planes: planes_v,
                views,
                mode,
            }),
        })
    }

    /// Fails unless `img` was created by this backend.
    pub(super) fn check_owner(&self, img: &GpuImage) -> Result<()> {
        if img.inner.owner != self.instance {
            return Err(GpuError::InvalidParameter(format!(
                "image {} belongs to another GPU backend",
                img.id()
            )));
        }
        Ok(())
    }

    fn check_range(&self, img: &GpuImage, offset: usize, len: usize) -> Result<()> {
        self.check_owner(img)?;
        match offset.checked_add(len) {
            Some(end) if end <= img.bytes() => Ok(()),
            _ => Err(GpuError::InvalidParameter(format!(
                "byte range {offset}+{len} outside the {}-byte frame of image {}",
                img.bytes(),
                img.id()
            ))),
        }
    }

    /// Uploads `src` = the bytes `[offset, offset + src.len())` of the frame in
    /// its linear layout (planes at the layout's offsets, rows `stride`
    /// apart). Any range works: it is split into whole-row texture writes plus
    /// partial first/last rows; bytes in row padding are ignored. A range
    /// starting or ending inside a texel (e.g. 2 bytes into an RGBA pixel)
    /// first reads that texel back (blocking). The writes are staged with
    /// `queue.write_texture`, so they are ordered before any later submission;
    /// returns when the data is staged.
    pub fn write_image(&self, img: &GpuImage, offset: usize, src: &[u8]) -> Result<()> {
        self.check_range(img, offset, src.len())?;
        let want = offset..offset + src.len();
        for (pi, p) in img.inner.planes.iter().enumerate() {
            let pr = p.range();
            let (a, b) = (want.start.max(pr.start), want.end.min(pr.end));
            if a >= b {
                continue;
            }
            // Plane-local byte range, and the source index of plane byte 0.
            let (la, lb) = (a - p.offset, b - p.offset);
            let sbase = p.offset as isize - offset as isize;
            let at = |local: usize| (local as isize + sbase) as usize;
            let (ps, rb) = (p.stride, p.row_bytes());
            let (r0, r1) = (la / ps, (lb - 1) / ps);
            let mut r = r0;
            while r <= r1 {
                let row0 = r * ps;
                let c0 = la.saturating_sub(row0);
                let c1 = (lb - row0).min(rb);
                if c0 >= c1 {
                    r += 1;
                    continue;
                }
                if c0 == 0 && c1 == rb && ps % p.bpp == 0 {
                    // A run of whole rows in one write.
                    let mut end = r;
                    while end < r1 && lb - (end + 1) * ps >= rb {
                        end += 1;
                    }
                    let n = end - r + 1;
                    let data = &src[at(row0)..at(end * ps + rb)];
                    self.write_texels(p, 0, r as u32, p.key.width, n as u32, data, ps);
                    r = end + 1;
                    continue;
                }
                let (t0, t1) = (c0 / p.bpp, c1.div_ceil(p.bpp));
                let bytes = &src[at(row0 + c0)..at(row0 + c1)];
                let span = (t1 - t0) as u32;
                if c0 % p.bpp == 0 && c1 % p.bpp == 0 {
                    self.write_texels(p, t0 as u32, r as u32, span, 1, bytes, rb);
                } else {
                    // Partial texels: merge with the current contents.
                    let mut merged = vec![0u8; span as usize * p.bpp];
                    let req = RowReq {
                        plane: pi,
                        x: t0 as u32,
                        width: span,
                        y: r as u32,
                        rows: 1,
                    };
                    self.read_rows(img, &[req], |_, data, _| {
                        let n = merged.len();
                        merged.copy_from_slice(&data[..n]);
                    })?;
                    let skip = c0 - t0 * p.bpp;
                    merged[skip..skip + bytes.len()].copy_from_slice(bytes);
                    self.write_texels(p, t0 as u32, r as u32, span, 1, &merged, rb);
                }
                r += 1;
            }
        }
        // Hand the staged writes to the queue now, as a submission of their own that the
        // poller drives to completion: wgpu frees a write's staging memory only once a
        // submission carrying it has finished, and with no draw after an upload (a display
        // plane scanned out of GPU memory) nothing else would ever submit them.
        let encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("virtsoc-upload"),
            });
        {
            let mut st = self.state.lock_or_recover();
            self.submit(&mut st, encoder.finish());
        }
        self.check_errors()
    }

    /// Stages a write of `w` x `h` texels at (`x`, `y`) of plane `p`; `data`
    /// holds rows `bytes_per_row` apart.
    #[allow(clippy::too_many_arguments)]
    fn write_texels(
        &self,
        p: &Plane,
        x: u32,
        y: u32,
        w: u32,
        h: u32,
        data: &[u8],
        bytes_per_row: usize,
    ) {
        self.queue.write_texture(
            wgpu::TexelCopyTextureInfo {
                texture: &p.tex,
                mip_level: 0,
                origin: wgpu::Origin3d { x, y, z: 0 },
                aspect: wgpu::TextureAspect::All,
            },
            data,
            wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(bytes_per_row as u32),
                rows_per_image: Some(h),
            },
            wgpu::Extent3d {
                width: w,
                height: h,
                depth_or_array_layers: 1,
            },
        );
    }

    /// Reads back `[offset, offset + dst.len())` of the frame in its linear
    /// layout, after all work submitted so far (queue order), and blocks until
    /// done. Row padding bytes in `dst` are left untouched. Only the texture
    /// rows covering the range are copied (reading the top quarter of a frame
    /// costs about a quarter of a full readback).
    pub fn read_image(&self, img: &GpuImage, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range(img, offset, dst.len())?;
        let want = offset..offset + dst.len();
        let mut reqs = Vec::new();
        for (pi, p) in img.inner.planes.iter().enumerate() {
            let pr = p.range();
            let (a, b) = (want.start.max(pr.start), want.end.min(pr.end));
            if a >= b {
                continue;
            }
            let (la, lb) = (a - p.offset, b - p.offset);
            let (r0, r1) = (la / p.stride, (lb - 1) / p.stride);
            reqs.push(RowReq {
                plane: pi,
                x: 0,
                width: p.key.width,
                y: r0 as u32,
                rows: (r1 - r0 + 1) as u32,
            });
        }
        if reqs.is_empty() {
            return Ok(());
        }
        self.read_rows(img, &reqs, |i, data, bpr| {
            let req = reqs[i];
            let p = &img.inner.planes[req.plane];
            let rb = p.row_bytes();
            for k in 0..req.rows as usize {
                let row0 = p.offset + (req.y as usize + k) * p.stride;
                let (a, b) = (want.start.max(row0), want.end.min(row0 + rb));
                if a >= b {
                    continue;
                }
                let src = &data[k * bpr + (a - row0)..k * bpr + (b - row0)];
                dst[a - offset..b - offset].copy_from_slice(src);
            }
        })
    }

    /// Copies the requested texel rows into readback buffers in one
    /// submission, waits, and hands each mapped buffer (rows `bpr` bytes
    /// apart) to `sink` with its request index.
    pub(super) fn read_rows(
        &self,
        img: &GpuImage,
        reqs: &[RowReq],
        mut sink: impl FnMut(usize, &[u8], usize),
    ) -> Result<()> {
        let mut st = self.state.lock_or_recover();
        let mut enc = self.device.create_command_encoder(&Default::default());
        let mut bufs = Vec::with_capacity(reqs.len());
        for r in reqs {
            let p = &img.inner.planes[r.plane];
            let bpr = align_up(
                r.width as u64 * p.bpp as u64,
                wgpu::COPY_BYTES_PER_ROW_ALIGNMENT as u64,
            );
            let key = BufKey::readback(bpr * r.rows as u64);
            let buf = st.pool.take_buffer(&self.device, key);
            enc.copy_texture_to_buffer(
                wgpu::TexelCopyTextureInfo {
                    texture: &p.tex,
                    mip_level: 0,
                    origin: wgpu::Origin3d {
                        x: r.x,
                        y: r.y,
                        z: 0,
                    },
                    aspect: wgpu::TextureAspect::All,
                },
                wgpu::TexelCopyBufferInfo {
                    buffer: &buf,
                    layout: wgpu::TexelCopyBufferLayout {
                        offset: 0,
                        bytes_per_row: Some(bpr as u32),
                        rows_per_image: Some(r.rows),
                    },
                },
                wgpu::Extent3d {
                    width: r.width,
                    height: r.rows,
                    depth_or_array_layers: 1,
                },
            );
            bufs.push((key, buf, bpr as usize));
        }
        let sub = self.submit(&mut st, enc.finish());
        drop(st);
        let refs: Vec<&wgpu::Buffer> = bufs.iter().map(|b| &b.1).collect();
        self.map_read(&refs, (sub.id, &sub.index))?;
        for (i, (_, buf, bpr)) in bufs.iter().enumerate() {
            {
                let view = buf
                    .slice(..)
                    .get_mapped_range()
                    .map_err(|e| GpuError::Backend(format!("readback range: {e}")))?;
                sink(i, &view, *bpr);
            }
            buf.unmap();
        }
        let mut st = self.state.lock_or_recover();
        for (key, buf, _) in bufs {
            st.pool.give_buffer(key, buf);
        }
        drop(st);
        self.check_errors()
    }
}
