//! Display planes, as the display controller of a phone or TV has them (the hardware that
//! Android's hardware composer hands layers to): each plane scans out one source region
//! directly, with a crop, a position and size on the screen (scaling within limits), a plane
//! alpha and blending. Sources stay where they are, in the display's memory domain (which is
//! the GPU's): presenting copies nothing. What a plane cannot do (rotation, projection,
//! scaling past [`virtsoc_devapi::display_plane::MAX_SCALE`], more than [`MAX_PLANES`]
//! layers) answers `NotSupported`, and the guest's composition policy sends those layers to
//! the GPU instead.
//!
//! A headless display, like a display controller, reads only what it needs: the capture-time
//! stamp for motion-to-photon latency (a grid of 32 x 160 samples of one plane); with the
//! consuming sink (`--display-sink crc`) every byte of every plane is read once per
//! scanned-out frame ([`vd::FrameHandle::consume`]). The full screen is composed
//! (on the CPU, from the planes) only when something needs pixels: a snapshot, `--verify`,
//! a window without a GPU. A window on the wgpu device composes the planes on the GPU where
//! they are ([`PlaneSet::present_in_window`]); host-memory planes are uploaded for it once
//! per write. Those copies of frame bytes go on the guest's ledger.

use std::sync::{Arc, OnceLock};
use std::time::Instant;
use virtsoc_svm::{GuestId, RegionId};

use virtsoc_display as vd;
use virtsoc_gpu::{
    CpuBackend, FrameLayout, FrameRef, GpuBackend, GpuImage, ImageLayer, Layer, OwnedFrame,
    PixelFormat, Rect, Rotation, SampleAxis, WgpuBackend,
};
#[cfg(feature = "window")]
use virtsoc_gpu::{SurfaceOutcome, SurfacePresenter};
use virtsoc_media::camera::timestamp as ts;
use virtsoc_proto::Status;
use virtsoc_svm::{Backing, DomainId, SvmManager};

use super::{thumb, Answer};
use crate::device::gpu::memory::GpuMemory;
use crate::device::layers::{crop_inside, LayerSpec};

/// Planes one frame may use.
pub const MAX_PLANES: usize = 4;

/// One plane of a presented frame.
pub(super) struct Plane {
    /// The source region's replica in the display's domain.
    pub(super) backing: Backing,
    /// The source region and its write generation when presented.
    pub(super) region: RegionId,
    pub(super) generation: u64,
    pub(super) layout: FrameLayout,
    pub(super) crop: Rect,
    pub(super) dst: Rect,
    pub(super) alpha: f32,
    pub(super) blend: bool,
}

impl Plane {
    /// A plane for `spec` over `backing`, or `NotSupported` for what planes cannot do.
    pub(super) fn new(spec: &LayerSpec, layout: FrameLayout, backing: Backing) -> Answer<Self> {
        if !crop_inside(spec.crop, &layout) {
            return Err(Status::BadArgument);
        }
        let within = virtsoc_devapi::display_plane::scales;
        if spec.rotation != Rotation::R0
            || !within(spec.crop.width, spec.dst.width)
            || !within(spec.crop.height, spec.dst.height)
        {
            return Err(Status::NotSupported);
        }
        Ok(Plane {
            backing,
            region: spec.src,
            generation: 0,
            layout,
            crop: spec.crop,
            dst: spec.dst,
            alpha: spec.alpha,
            blend: spec.blend,
        })
    }

    /// The same plane, its source at write generation `generation`.
    pub(super) fn at_generation(mut self, generation: u64) -> Self {
        self.generation = generation;
        self
    }

    /// Bytes `[0, n)` of the plane's frame: host memory is read in place by `f`; device memory
    /// is read back first (counted as a copy in the domain).
    fn with_bytes<T>(&self, n: usize, ledger: &Ledger, f: impl FnOnce(&[u8]) -> T) -> Option<T> {
        self.read_bytes(n, ledger, &mut Vec::new(), f)
    }

    /// [`Self::with_bytes`] reading device memory back into `scratch` (grown as needed,
    /// kept by the caller from frame to frame).
    fn read_bytes<T>(
        &self,
        n: usize,
        ledger: &Ledger,
        scratch: &mut Vec<u8>,
        f: impl FnOnce(&[u8]) -> T,
    ) -> Option<T> {
        match &self.backing {
            Backing::Host(buf) => {
                let b = buf.read();
                Some(f(b.get(..n)?))
            }
            Backing::Device(mem) => {
                let t0 = Instant::now();
                if scratch.len() < n {
                    scratch.resize(n, 0);
                }
                let bytes = &mut scratch[..n];
                mem.read(0, bytes).ok()?;
                ledger.count(n, t0);
                Some(f(bytes))
            }
            Backing::Window { .. } => None,
        }
    }

    /// The capture time the camera stamped into the plane's pixels, reading only the samples
    /// the stamp reader takes ([`ts::GRID_ROWS`] x [`ts::GRID_COLUMNS`] of the luma or RGB
    /// plane): in place in host memory; on the GPU by one sampling dispatch and a 20 KB
    /// readback; from other device memory by reading back the top rows through the last
    /// sample.
    pub(super) fn stamped_time(&self, ledger: &Ledger) -> Option<u64> {
        let layout = self.layout;
        layout.validate().ok()?;
        match &self.backing {
            Backing::Host(buf) => {
                let b = buf.read();
                virtsoc_media::read_timestamp_top(&layout, b.get(..layout.size())?)
            }
            Backing::Device(mem) => match mem.as_any().downcast_ref::<GpuMemory>() {
                Some(g) => {
                    let axis = |size, samples, count| SampleAxis {
                        origin: 0,
                        size,
                        samples,
                        first: 0,
                        count,
                        step: 1,
                        shift: 0,
                    };
                    let grid = (
                        axis(layout.width, ts::GRID_COLUMNS, ts::GRID_COLUMNS),
                        axis(layout.height, ts::GRID_ROW_DIVISIONS, ts::GRID_ROWS),
                    );
                    let yuv = layout.format.is_yuv();
                    let t0 = Instant::now();
                    let mut stamp = None;
                    g.sample_plane(0, grid, |packed| {
                        ledger.count(packed.len(), t0);
                        let levels: Vec<u8> = packed
                            .chunks_exact(4)
                            .map(|p| match yuv {
                                true => p[0],
                                false => {
                                    let sum =
                                        u16::from(p[0]) + 2 * u16::from(p[1]) + u16::from(p[2]);
                                    (sum / 4) as u8
                                }
                            })
                            .collect();
                        stamp = ts::read_timestamp_grid(&levels);
                    })
                    .ok()?;
                    stamp
                }
                None => self
                    .with_bytes(ts::strip_bytes(&layout), ledger, |top| {
                        ts::read_timestamp_top(&layout, top)
                    })
                    .flatten(),
            },
            Backing::Window { .. } => None,
        }
    }
}

/// Counts the display's own copies of a guest's frame bytes.
#[derive(Clone)]
pub(super) struct Ledger {
    pub(super) svm: Arc<SvmManager>,
    pub(super) guest: GuestId,
    pub(super) domain: DomainId,
}

impl Ledger {
    pub(super) fn count(&self, bytes: usize, since: Instant) {
        self.svm
            .count_device_copy(self.guest, self.domain, bytes as u64, since.elapsed());
    }
}

/// The planes of one presented frame: the display's frame handle. Its pixels (the screen
/// composed from the planes) are made only when something asks for them.
pub(super) struct PlaneSet {
    width: u32,
    height: u32,
    planes: Vec<Plane>,
    ledger: Ledger,
    composed: OnceLock<Option<Vec<u8>>>,
    /// The GPU the planes live on, when they are its resident images.
    gpu: Option<Arc<WgpuBackend>>,
    /// The guest's view pictures of planes that do not change.
    statics: Arc<thumb::StaticPlanes>,
}

impl PlaneSet {
    /// A `width` x `height` screen of `planes` (bottom first).
    pub(super) fn new(width: u32, height: u32, planes: Vec<Plane>, ledger: Ledger) -> Self {
        PlaneSet {
            width,
            height,
            planes,
            ledger,
            composed: OnceLock::new(),
            gpu: None,
            statics: Arc::default(),
        }
    }

    /// Shares `statics`, the guest's view pictures of planes that do not change, with the
    /// guest's other frames.
    pub(super) fn with_statics(mut self, statics: Arc<thumb::StaticPlanes>) -> Self {
        self.statics = statics;
        self
    }

    /// Composes scaled-down screens of resident planes on `gpu`.
    pub(super) fn with_gpu(mut self, gpu: Option<Arc<WgpuBackend>>) -> Self {
        self.gpu = gpu;
        self
    }

    /// The screen composed at `width` x `height` on the GPU, when every plane is one of its
    /// resident images: only the small result is read back.
    fn compose_on_gpu(&self, width: u32, height: u32) -> Option<Vec<u8>> {
        let gpu = self.gpu.as_ref()?;
        let images: Vec<&GpuImage> = self
            .planes
            .iter()
            .map(|p| match &p.backing {
                Backing::Device(m) => m.as_any().downcast_ref::<GpuMemory>().map(|g| &g.image),
                _ => None,
            })
            .collect::<Option<_>>()?;
        let scale = self.scaler(width, height);
        let layers: Vec<ImageLayer<'_>> = self
            .planes
            .iter()
            .zip(images)
            .map(|(p, image)| ImageLayer {
                src: image,
                crop: p.crop,
                dst_rect: scale(p.dst),
                rotation: Rotation::R0,
                alpha: p.alpha,
                blend: p.blend,
            })
            .collect();
        let t0 = Instant::now();
        let layout = FrameLayout::packed(PixelFormat::Rgba8, width, height).ok()?;
        let dst = gpu.create_image(layout).ok()?;
        gpu.submit_composite_images(&layers, &dst).ok()?;
        let mut out = vec![0u8; width as usize * height as usize * 4];
        gpu.read_image(&dst, 0, &mut out).ok()?;
        self.ledger.count(out.len(), t0);
        Some(out)
    }

    /// Maps a destination rectangle of the screen onto a `width` x `height` one.
    fn scaler(&self, width: u32, height: u32) -> impl Fn(Rect) -> Rect {
        let (sx, sy) = (
            width as f64 / self.width as f64,
            height as f64 / self.height as f64,
        );
        move |r: Rect| {
            Rect::new(
                (r.x as f64 * sx).round() as i32,
                (r.y as f64 * sy).round() as i32,
                ((r.width as f64 * sx).round() as u32).max(1),
                ((r.height as f64 * sy).round() as u32).max(1),
            )
        }
    }

    /// The capture time stamped into the first plane that carries one.
    pub(super) fn stamped_time(&self) -> Option<u64> {
        self.planes
            .iter()
            .find_map(|p| p.stamped_time(&self.ledger))
    }

    /// The screen in RGBA8: black, then every plane in order (the CPU reference's sampling).
    fn compose(&self) -> Option<Vec<u8>> {
        self.compose_at(self.width, self.height)
    }

    /// The screen composed at `width` x `height` (the planes' destinations scaled): the
    /// whole screen when that is its size, a small one for a viewer.
    fn compose_at(&self, width: u32, height: u32) -> Option<Vec<u8>> {
        let mut screen =
            OwnedFrame::new(FrameLayout::packed(PixelFormat::Rgba8, width, height).ok()?).ok()?;
        for px in screen.data.chunks_exact_mut(4) {
            px[3] = 255;
        }
        let scale = self.scaler(width, height);
        let t0 = Instant::now();
        let sources: Vec<Vec<u8>> = self
            .planes
            .iter()
            .map(|p| {
                let n = p.layout.size_bytes().ok()?;
                let t = Instant::now();
                let bytes = p.with_bytes(n, &self.ledger, <[u8]>::to_vec)?;
                if matches!(p.backing, Backing::Host(_)) {
                    self.ledger.count(n, t);
                }
                Some(bytes)
            })
            .collect::<Option<_>>()?;
        let layers: Vec<Layer<'_>> = self
            .planes
            .iter()
            .zip(&sources)
            .map(|(p, bytes)| Layer {
                src: FrameRef {
                    layout: p.layout,
                    data: bytes,
                },
                crop: p.crop,
                dst_rect: scale(p.dst),
                rotation: Rotation::R0,
                alpha: p.alpha,
                blend: p.blend,
            })
            .collect();
        CpuBackend::new().composite(&layers, screen.as_mut()).ok()?;
        self.ledger.count(screen.data.len(), t0);
        Some(screen.data)
    }
}

/// Images a window keeps on the GPU for planes in host memory, per plane index: the upload of
/// a plane whose source has not been written since is reused (a UI layer is uploaded once).
#[cfg(feature = "window")]
#[derive(Default)]
pub(super) struct WindowUploads {
    images: Vec<Option<(RegionId, u64, GpuImage)>>,
}

#[cfg(feature = "window")]
impl PlaneSet {
    /// Presents the screen in `presenter`'s window, composed on `gpu`: the planes that are
    /// its resident images are drawn from where they are; planes in host memory are uploaded
    /// first (counted as copies), once per write of their source. The screen keeps its
    /// aspect ratio in the window (black bars). `None` when a plane is neither (the caller
    /// paints the CPU pixels instead).
    pub(super) fn present_in_window(
        &self,
        gpu: &WgpuBackend,
        presenter: &mut SurfacePresenter,
        uploads: &mut WindowUploads,
    ) -> Option<virtsoc_gpu::Result<SurfaceOutcome>> {
        uploads.images.resize_with(self.planes.len(), || None);
        let mut images = Vec::with_capacity(self.planes.len());
        for (plane, slot) in self.planes.iter().zip(uploads.images.iter_mut()) {
            match &plane.backing {
                Backing::Device(m) => {
                    images.push(m.as_any().downcast_ref::<GpuMemory>()?.image.clone());
                }
                Backing::Host(buf) => {
                    let key = (plane.region, plane.generation);
                    let fresh = match slot {
                        Some((r, g, img)) => (*r, *g) == key && img.layout() == plane.layout,
                        None => false,
                    };
                    if !fresh {
                        let img = match slot.take() {
                            Some((_, _, img)) if img.layout() == plane.layout => img,
                            _ => gpu.create_image(plane.layout).ok()?,
                        };
                        let n = plane.layout.size_bytes().ok()?;
                        let t0 = Instant::now();
                        gpu.write_image(&img, 0, buf.read().get(..n)?).ok()?;
                        self.ledger.count(n, t0);
                        *slot = Some((key.0, key.1, img));
                    }
                    images.push(slot.as_ref()?.2.clone());
                }
                Backing::Window { .. } => return None,
            }
        }
        let place = self.fit(presenter.size());
        let layers: Vec<ImageLayer<'_>> = self
            .planes
            .iter()
            .zip(&images)
            .map(|(p, image)| ImageLayer {
                src: image,
                crop: p.crop,
                dst_rect: place(p.dst),
                rotation: Rotation::R0,
                alpha: p.alpha,
                blend: p.blend,
            })
            .collect();
        Some(gpu.present_layers(presenter, &layers))
    }

    /// Maps a destination rectangle of the screen into a `width` x `height` window that
    /// shows the whole screen at its aspect ratio, centred.
    fn fit(&self, (width, height): (u32, u32)) -> impl Fn(Rect) -> Rect {
        let scale = (width as f64 / self.width as f64).min(height as f64 / self.height as f64);
        let x0 = (width as f64 - self.width as f64 * scale) / 2.0;
        let y0 = (height as f64 - self.height as f64 * scale) / 2.0;
        move |r: Rect| {
            Rect::new(
                (x0 + r.x as f64 * scale).round() as i32,
                (y0 + r.y as f64 * scale).round() as i32,
                ((r.width as f64 * scale).round() as u32).max(1),
                ((r.height as f64 * scale).round() as u32).max(1),
            )
        }
    }
}

impl std::fmt::Debug for PlaneSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlaneSet")
            .field("width", &self.width)
            .field("height", &self.height)
            .field("planes", &self.planes.len())
            .finish()
    }
}

impl vd::FrameHandle for PlaneSet {
    fn view_picture(&self, width: u32, height: u32) -> Option<vd::ViewPicture> {
        let mut pic = vd::ViewPicture::black(width, height);
        let scale = self.scaler(pic.width, pic.height);
        let placed: Vec<(&Plane, Rect)> = self.planes.iter().map(|p| (p, scale(p.dst))).collect();
        thumb::compose(&mut pic, &placed, &self.statics, &self.ledger)?;
        Some(pic)
    }

    fn pixels(&self) -> Option<&[u8]> {
        self.composed.get_or_init(|| self.compose()).as_deref()
    }

    /// Every byte of every plane's source, read where it is: host memory in place, device
    /// memory read back (counted on the guest's ledger as the display's copy).
    fn consume(&self, scratch: &mut Vec<u8>, visit: &mut dyn FnMut(&[u8])) -> bool {
        self.planes.iter().all(|p| {
            let Ok(n) = p.layout.size_bytes() else {
                return false;
            };
            p.read_bytes(n, &self.ledger, scratch, |b| visit(b))
                .is_some()
        })
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn byte_len(&self) -> Option<usize> {
        Some(self.width as usize * self.height as usize * 4)
    }

    fn rgba_scaled(&self, width: u32, height: u32) -> Option<Vec<u8>> {
        if (width, height) == (self.width, self.height) {
            return self.pixels().map(<[u8]>::to_vec);
        }
        self.compose_on_gpu(width, height)
            .or_else(|| self.compose_at(width, height))
    }
}
