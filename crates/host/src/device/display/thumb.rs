//! Small pictures of presented frames for viewers (the live view), made the way a display
//! controller scans planes out: each picture pixel takes the nearest source texel of each
//! plane that covers it, blended in order, in full-range YUV 4:2:0 (what JPEG encoders take,
//! so no conversion or scaling pass follows). The texels are taken where the plane's current
//! contents are cheapest to read: in host memory in place (the display's replica, or the
//! writer's when a CPU device such as the ISP wrote the frame), else from GPU memory by one
//! compute dispatch that packs the grid's texels into a small buffer
//! ([`virtsoc_gpu::WgpuBackend::sample_plane`]). RGB planes whose
//! content does not change between view frames (a UI layer written once) are sampled once
//! and blended from memory after that ([`StaticPlanes`]), opaque runs copied.
//!
//! Planes are drawn a picture row at a time ([`rows`]): the row's texels gathered first, then
//! converted in loops the compiler vectorizes. For a 1080p RGBA camera frame shown at
//! 480x270, reading the 270 source rows (2 MB that another core just wrote, every cache line
//! of them) is most of what a picture costs.

use virtsoc_display::ViewPicture as Picture;
use virtsoc_gpu::{PixelFormat, PlaneInfo, Rect, SampleAxis};
use virtsoc_svm::Backing;
use virtsoc_svm::RegionId;
use virtsoc_sync::LockExt;

use super::planes::{Ledger, Plane};
use crate::device::gpu::memory::GpuMemory;
use rows::{chroma_row, every_other, luma_row, mix, rgb_to_luma, rgb_to_yuv, Samples};

mod rows;

/// Limited-range (BT.601, 16..235 / 16..240) luma and chroma to full range.
struct RangeLut {
    luma: [u8; 256],
    chroma: [u8; 256],
}

impl RangeLut {
    fn new() -> Self {
        let map = |v: usize, lo: f32, span: f32, centre: bool| {
            let x = if centre {
                (v as f32 - 128.0) * 255.0 / span + 128.0
            } else {
                (v as f32 - lo) * 255.0 / span
            };
            x.round().clamp(0.0, 255.0) as u8
        };
        RangeLut {
            luma: std::array::from_fn(|v| map(v, 16.0, 219.0, false)),
            chroma: std::array::from_fn(|v| map(v, 16.0, 224.0, true)),
        }
    }
}

/// Where one plane lands in the picture: the luma (or RGB) grid over its crop, clipped to
/// the picture, and the picture position of the grid's first sample.
struct Placement {
    x: SampleAxis,
    y: SampleAxis,
    x0: usize,
    y0: usize,
}

/// The samples of `crop_len` texels from `crop0` over `dst_len` picture pixels from `dst0`,
/// clipped to `0..limit`; with the picture position of the first.
fn axis(
    crop0: i32,
    crop_len: u32,
    dst0: i32,
    dst_len: u32,
    limit: u32,
) -> Option<(SampleAxis, usize)> {
    let first = (-i64::from(dst0)).max(0);
    let last = (i64::from(limit) - i64::from(dst0)).min(i64::from(dst_len));
    (first < last && crop_len > 0).then(|| {
        let a = SampleAxis {
            origin: crop0.max(0) as u32,
            size: crop_len,
            samples: dst_len,
            first: first as u32,
            count: (last - first) as u32,
            step: 1,
            shift: 0,
        };
        (a, (i64::from(dst0) + first) as usize)
    })
}

/// The chroma samples of luma grid `a` whose first sample is at picture position `out0`: the
/// ones at even picture positions, each reading the half-size plane under it; with the
/// picture chroma position of the first.
fn chroma_axis(a: SampleAxis, out0: usize) -> Option<(SampleAxis, usize)> {
    let skip = (out0 % 2) as u32;
    (a.count > skip).then(|| {
        let c = SampleAxis {
            first: a.first + skip,
            count: (a.count - skip).div_ceil(2),
            step: 2,
            shift: 1,
            ..a
        };
        (c, (out0 + skip as usize) / 2)
    })
}

impl Placement {
    /// `crop` of the source shown at `dst` in a `w` x `h` picture, clipped to it.
    fn new(crop: Rect, dst: Rect, (w, h): (u32, u32)) -> Option<Self> {
        let (x, x0) = axis(crop.x, crop.width, dst.x, dst.width, w)?;
        let (y, y0) = axis(crop.y, crop.height, dst.y, dst.height, h)?;
        Some(Placement { x, y, x0, y0 })
    }
}

/// What an RGB plane puts on the picture: runs of covered pixels, each pixel's full-range
/// Y and coverage (0..=255, the pixel's alpha times the plane's), and the U and V of the
/// pixels at even positions of even rows. A run is opaque (every coverage 255: copied) or not
/// (blended).
#[derive(Debug, Default)]
pub(super) struct Coverage {
    runs: Vec<Run>,
}

#[derive(Debug, Default)]
struct Run {
    y: usize,
    x0: usize,
    luma: Vec<u8>,
    /// Empty when the run is opaque.
    cover: Vec<u8>,
    /// The pixels at even positions (even rows only): U, V, coverage (empty when opaque).
    u: Vec<u8>,
    v: Vec<u8>,
    chroma_cover: Vec<u8>,
}

/// `src` over `dst`, one each: copied when `cover` is empty (opaque), else mixed by it.
fn put(dst: &mut [u8], src: &[u8], cover: &[u8]) {
    if cover.is_empty() {
        dst.copy_from_slice(src);
    } else {
        for ((d, &s), &a) in dst.iter_mut().zip(src).zip(cover) {
            mix(d, s, u32::from(a));
        }
    }
}

impl Coverage {
    /// Blends the covered pixels into `pic` (chroma from the pixels at even positions).
    fn apply(&self, pic: &mut Picture) {
        let width = pic.width as usize;
        let (py, pu, pv) = pic.planes_mut();
        for run in &self.runs {
            put(
                &mut py[run.y * width + run.x0..][..run.luma.len()],
                &run.luma,
                &run.cover,
            );
            if !run.u.is_empty() {
                let crow = run.y / 2 * (width / 2) + run.x0.div_ceil(2);
                let n = run.u.len();
                put(&mut pu[crow..][..n], &run.u, &run.chroma_cover);
                put(&mut pv[crow..][..n], &run.v, &run.chroma_cover);
            }
        }
    }

    /// The covered pixels of an RGB plane placed `at`, from its samples, with the plane's
    /// alpha when it blends.
    fn of_samples(at: &Placement, samples: &Samples<'_>, alpha: Option<u32>) -> Self {
        let mut cov = Coverage::default();
        let mut row = Vec::with_capacity(at.x.count as usize);
        for j in 0..at.y.count as usize {
            let y = at.y0 + j;
            samples.gather(j, &mut row);
            // Opacity of the open run, if any.
            let mut open: Option<bool> = None;
            for (i, &p) in row.iter().enumerate() {
                let a = alpha.map_or(255, |alpha| rows::cover(p, alpha));
                if a == 0 {
                    open = None;
                    continue;
                }
                let x = at.x0 + i;
                if open != Some(a == 255) {
                    cov.runs.push(Run {
                        y,
                        x0: x,
                        ..Run::default()
                    });
                    open = Some(a == 255);
                }
                let Some(run) = cov.runs.last_mut() else {
                    continue;
                };
                let [r, g, b, _] = p.to_le_bytes();
                run.luma.push(rgb_to_luma(r, g, b));
                if a < 255 {
                    run.cover.push(a as u8);
                }
                // Chroma is only taken from pixels at even positions (4:2:0).
                if y.is_multiple_of(2) && x.is_multiple_of(2) {
                    let (_, u, v) = rgb_to_yuv(r, g, b);
                    run.u.push(u);
                    run.v.push(v);
                    if a < 255 {
                        run.chroma_cover.push(a as u8);
                    }
                }
            }
        }
        cov
    }
}

/// What identifies a plane's picture: its source region's content (write generation) and
/// where and how it is shown.
#[derive(Clone, Copy, Debug, PartialEq)]
struct StaticKey {
    region: RegionId,
    generation: u64,
    crop: Rect,
    dst: Rect,
    size: (u32, u32),
    alpha: f32,
    blend: bool,
}

/// Pictures of RGB planes whose content stays the same from one view frame to the next (a
/// UI layer written once): made once, blended from memory after that. One per guest.
#[derive(Debug, Default)]
pub(crate) struct StaticPlanes {
    state: std::sync::Mutex<StaticState>,
}

#[derive(Debug, Default)]
struct StaticState {
    /// The kept pictures, least recently used first.
    kept: Vec<(StaticKey, std::sync::Arc<Coverage>)>,
    /// Regions and generations of the planes of the previous view frame.
    last_seen: Vec<(RegionId, u64)>,
    seen: Vec<(RegionId, u64)>,
}

/// Pictures kept per guest.
const STATIC_KEPT: usize = 4;

impl StaticPlanes {
    fn state(&self) -> std::sync::MutexGuard<'_, StaticState> {
        self.state.lock_or_recover()
    }

    fn get(&self, key: &StaticKey) -> Option<std::sync::Arc<Coverage>> {
        let mut st = self.state();
        st.seen.push((key.region, key.generation));
        let i = st.kept.iter().position(|(k, _)| k == key)?;
        let hit = st.kept.remove(i);
        let cov = hit.1.clone();
        st.kept.push(hit);
        Some(cov)
    }

    /// Whether the plane of `key` had the same content in the previous view frame (so it
    /// may well keep it).
    fn worth_keeping(&self, key: &StaticKey) -> bool {
        self.state()
            .last_seen
            .contains(&(key.region, key.generation))
    }

    /// Keeps `cov`, the picture of the plane of `key`.
    fn keep(&self, key: StaticKey, cov: &std::sync::Arc<Coverage>) {
        let mut st = self.state();
        if st.kept.len() >= STATIC_KEPT {
            st.kept.remove(0);
        }
        st.kept.push((key, cov.clone()));
    }

    /// Ends a view frame.
    fn frame_done(&self) {
        let mut st = self.state();
        st.last_seen = std::mem::take(&mut st.seen);
    }
}

/// Composes `planes` (bottom first) into `pic`, each at its `dst` rectangle in picture
/// coordinates, blending RGB planes whose content did not change from `statics`. Rows read
/// from device memory are counted on `ledger`.
pub(super) fn compose(
    pic: &mut Picture,
    planes: &[(&Plane, Rect)],
    statics: &StaticPlanes,
    ledger: &Ledger,
) -> Option<()> {
    let lut = RangeLut::new();
    let size = (pic.width, pic.height);
    let done = planes.iter().try_for_each(|&(plane, dst)| {
        let Some(at) = Placement::new(plane.crop, dst, size) else {
            return Some(()); // off the picture
        };
        if !plane.layout.format.is_rgb() {
            return draw_yuv(pic, plane, &at, &lut, ledger);
        }
        let key = StaticKey {
            region: plane.region,
            generation: plane.generation,
            crop: plane.crop,
            dst,
            size,
            alpha: plane.alpha,
            blend: plane.blend,
        };
        if let Some(cov) = statics.get(&key) {
            cov.apply(pic);
        } else if statics.worth_keeping(&key) {
            let cov = std::sync::Arc::new(rgb_coverage(plane, &at, ledger)?);
            statics.keep(key, &cov);
            cov.apply(pic);
        } else {
            draw_rgb(pic, plane, &at, ledger)?;
        }
        Some(())
    });
    statics.frame_done();
    done
}

/// The samples of plane `k` of `plane`'s frame on `grid`, handed to `f`: read in place from
/// host memory holding the current contents, sampled on the GPU when only GPU memory does.
fn with_samples(
    plane: &Plane,
    k: usize,
    (x, y): (SampleAxis, SampleAxis),
    ledger: &Ledger,
    f: impl FnOnce(&Samples<'_>),
) -> Option<()> {
    plane.layout.validate().ok()?;
    let info: PlaneInfo = plane.layout.plane(k)?;
    let bgra = plane.layout.format == PixelFormat::Bgra8;
    // Host memory holding the same contents (the writer's replica, when a CPU device such as
    // the ISP wrote the frame) is read in place rather than the display's GPU replica.
    let host = match &plane.backing {
        Backing::Device(_) => ledger
            .svm
            .host_replica(ledger.guest, plane.region)
            .ok()
            .flatten()
            .filter(|(_, generation)| *generation == plane.generation)
            .map(|(b, _)| b),
        _ => None,
    };
    match host.as_ref().unwrap_or(&plane.backing) {
        Backing::Host(buf) => f(&Samples::host(&buf.read(), &info, (x, y), bgra)?),
        Backing::Device(mem) => {
            let t0 = std::time::Instant::now();
            let bytes = x.count as usize * y.count as usize * 4;
            if let Some(g) = mem.as_any().downcast_ref::<GpuMemory>() {
                let width = x.count as usize;
                g.sample_plane(k, (x, y), |data| f(&Samples::Packed { data, width }))
                    .ok()?;
            } else {
                // Other device memory is read whole, once.
                let mut all = vec![0u8; plane.layout.size_bytes().ok()?];
                mem.read(0, &mut all).ok()?;
                f(&Samples::host(&all, &info, (x, y), bgra)?);
            }
            ledger.count(bytes, t0);
        }
        Backing::Window { .. } => return None,
    }
    Some(())
}

/// The plane's alpha as coverage (0..=255) when it blends.
fn blend_alpha(plane: &Plane) -> Option<u32> {
    plane
        .blend
        .then(|| (plane.alpha.clamp(0.0, 1.0) * 255.0).round() as u32)
}

/// What an RGB plane puts on the picture.
fn rgb_coverage(plane: &Plane, at: &Placement, ledger: &Ledger) -> Option<Coverage> {
    let mut cov = None;
    with_samples(plane, 0, (at.x, at.y), ledger, |s| {
        cov = Some(Coverage::of_samples(at, s, blend_alpha(plane)));
    })?;
    cov
}

/// Draws an RGB plane into `pic` directly (a plane whose content changes), a row at a time.
fn draw_rgb(pic: &mut Picture, plane: &Plane, at: &Placement, ledger: &Ledger) -> Option<()> {
    let alpha = blend_alpha(plane);
    let width = pic.width as usize;
    let (py, pu, pv) = pic.planes_mut();
    let n = at.x.count as usize;
    // Chroma comes from the samples at even picture positions: from sample `first` on.
    let (first, c0) = (at.x0 % 2, at.x0.div_ceil(2));
    let cn = n.saturating_sub(first).div_ceil(2);
    let (mut row, mut even) = (Vec::with_capacity(n), Vec::with_capacity(cn));
    with_samples(plane, 0, (at.x, at.y), ledger, |samples| {
        for j in 0..at.y.count as usize {
            let y = at.y0 + j;
            samples.gather(j, &mut row);
            luma_row(&row, &mut py[y * width + at.x0..][..n], alpha);
            if y.is_multiple_of(2) {
                let crow = y / 2 * (width / 2) + c0;
                every_other(&row, first, &mut even);
                chroma_row(&even, &mut pu[crow..][..cn], &mut pv[crow..][..cn], alpha);
            }
        }
    })
}

/// Draws a YUV plane (limited range, as the camera and decoders write it) into `pic`.
fn draw_yuv(
    pic: &mut Picture,
    plane: &Plane,
    at: &Placement,
    lut: &RangeLut,
    ledger: &Ledger,
) -> Option<()> {
    let a = blend_alpha(plane).unwrap_or(255);
    let width = pic.width as usize;
    let (py, pu, pv) = pic.planes_mut();
    let mut row = Vec::with_capacity(at.x.count as usize);
    with_samples(plane, 0, (at.x, at.y), ledger, |samples| {
        for j in 0..at.y.count as usize {
            samples.gather(j, &mut row);
            let line = &mut py[(at.y0 + j) * width + at.x0..];
            for (d, &p) in line.iter_mut().zip(&row) {
                mix(d, lut.luma[(p & 0xff) as usize], a);
            }
        }
    })?;
    let (Some((cx, c0)), Some((cy, r0))) = (chroma_axis(at.x, at.x0), chroma_axis(at.y, at.y0))
    else {
        return Some(());
    };
    let cw = width / 2;
    // NV12: one plane of U, V pairs; YUV 4:2:0: a plane of U, then one of V.
    let planes: &[(usize, u32)] = if plane.layout.format == PixelFormat::Nv12 {
        &[(1, 0), (1, 8)]
    } else {
        &[(1, 0), (2, 0)]
    };
    for (n, &(k, shift)) in planes.iter().enumerate() {
        let dst = if n == 0 { &mut *pu } else { &mut *pv };
        with_samples(plane, k, (cx, cy), ledger, |samples| {
            for j in 0..cy.count as usize {
                samples.gather(j, &mut row);
                let line = dst.get_mut((r0 + j) * cw + c0..).unwrap_or_default();
                for (d, &p) in line.iter_mut().zip(&row) {
                    mix(d, lut.chroma[(p >> shift & 0xff) as usize], a);
                }
            }
        })?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_are_clipped_to_the_picture() {
        let p = Placement::new(
            Rect::new(0, 0, 100, 100),
            Rect::new(-5, 90, 10, 20),
            (50, 100),
        )
        .unwrap();
        assert_eq!((p.x0, p.x.first, p.x.count), (0, 5, 5));
        assert_eq!((p.y0, p.y.first, p.y.count), (90, 0, 10));
        assert_eq!(p.x.texel(0), 55); // the sixth of ten cells over 100 texels
        assert!(Placement::new(Rect::new(0, 0, 8, 8), Rect::new(60, 0, 8, 8), (50, 50)).is_none());
    }

    #[test]
    fn chroma_samples_sit_at_even_picture_positions() {
        let (a, out0) = axis(0, 64, 3, 16, 100).unwrap();
        assert_eq!((a.first, a.count, out0), (0, 16, 3));
        let (c, c0) = chroma_axis(a, out0).unwrap();
        // Picture positions 4, 6, ..., 18: chroma columns 2..=9, each under its luma sample.
        assert_eq!((c.first, c.count, c.step, c0), (1, 8, 2, 2));
        for k in 0..c.count {
            assert_eq!(c.texel(k), a.texel(1 + 2 * k) / 2);
        }
        assert!(chroma_axis(SampleAxis { count: 1, ..a }, 3).is_none());
    }

    /// A plane of `layout` in host memory holding `bytes`, shown whole at `dst`.
    fn host_plane(layout: virtsoc_gpu::FrameLayout, bytes: &[u8], dst: Rect, blend: bool) -> Plane {
        let buf = virtsoc_svm::HostBuf::zeroed(bytes.len());
        buf.lock()[..bytes.len()].copy_from_slice(bytes);
        Plane {
            backing: Backing::Host(buf),
            region: RegionId(7),
            generation: 1,
            layout,
            crop: Rect::new(0, 0, layout.width, layout.height),
            dst,
            alpha: 1.0,
            blend,
        }
    }

    /// An NV12 video plane (white left half, black right half, limited range) under an RGBA
    /// UI plane (a red bar over the top quarter, transparent elsewhere), composed at half size
    /// three times: the UI is drawn directly, then kept, then blended from memory; the
    /// picture is the same each time and has the colours of the planes.
    #[test]
    fn planes_compose_into_a_full_range_picture() {
        use virtsoc_gpu::FrameLayout;
        let (w, h) = (64u32, 32u32);
        let mut nv12 = vec![128u8; (w * h * 3 / 2) as usize];
        for y in 0..h as usize {
            for x in 0..w as usize {
                nv12[y * w as usize + x] = if x < 32 { 235 } else { 16 };
            }
        }
        let mut ui = vec![0u8; (w * h * 4) as usize];
        for px in ui.chunks_exact_mut(4).take((w * h / 4) as usize) {
            px.copy_from_slice(&[255, 0, 0, 255]);
        }
        let full = Rect::new(0, 0, w, h);
        let video = host_plane(
            FrameLayout::packed(PixelFormat::Nv12, w, h).unwrap(),
            &nv12,
            full,
            false,
        );
        let bar = host_plane(
            FrameLayout::packed(PixelFormat::Rgba8, w, h).unwrap(),
            &ui,
            full,
            true,
        );
        let ledger = Ledger {
            svm: std::sync::Arc::new(virtsoc_svm::SvmManager::new(virtsoc_svm::Topology::new())),
            guest: virtsoc_svm::GuestId(1),
            domain: virtsoc_svm::DomainId(0),
        };
        let statics = StaticPlanes::default();
        let half = Rect::new(0, 0, w / 2, h / 2);
        let mut pictures = Vec::new();
        for _ in 0..3 {
            let mut pic = Picture::black(w / 2, h / 2);
            compose(&mut pic, &[(&video, half), (&bar, half)], &statics, &ledger).unwrap();
            pictures.push(pic);
        }
        assert_eq!(statics.state().kept.len(), 1, "the UI plane is kept");
        assert_eq!(pictures[0], pictures[1]);
        assert_eq!(pictures[1], pictures[2]);
        let pic = &pictures[0];
        let (pw, luma) = (pic.width as usize, (pic.width * pic.height) as usize);
        let y = |x: usize, row: usize| pic.data[row * pw + x];
        // Below the bar: the video, white on the left, black on the right, grey chroma.
        assert_eq!((y(2, 10), y(30, 10)), (255, 0));
        assert_eq!(pic.data[luma + 5 * (pw / 2) + 1], 128);
        // The bar: red.
        assert_eq!(y(2, 1), 76);
        assert_eq!(pic.data[luma], 85, "U of red");
        assert_eq!(pic.data[luma + luma / 4], 255, "V of red");
    }

    /// A test ledger (no device memory is read).
    fn ledger() -> Ledger {
        Ledger {
            svm: std::sync::Arc::new(virtsoc_svm::SvmManager::new(virtsoc_svm::Topology::new())),
            guest: virtsoc_svm::GuestId(1),
            domain: virtsoc_svm::DomainId(0),
        }
    }

    /// A BGRA plane of varied colours and alpha, blended at 70% and placed at an odd position
    /// and a scale that is no whole number, drawn a row at a time (then from the kept
    /// coverage): each picture pixel is what sampling it alone gives, the nearest texel
    /// mixed over black by its coverage, chroma from even positions only.
    #[test]
    fn rows_draw_what_sampling_each_pixel_gives() {
        use virtsoc_gpu::FrameLayout;
        let (w, h) = (50u32, 30u32);
        // Opaque, transparent, then varied alpha, across each row.
        let texel = |x: u32, y: u32| {
            let a = match x {
                0..10 => 255,
                10..15 => 0,
                _ => (x * 3 + y * 7) as u8,
            };
            [(x * 5) as u8, (y * 8) as u8, (x * y) as u8, a]
        };
        let bytes: Vec<u8> = (0..w * h).flat_map(|k| texel(k % w, k / w)).collect();
        let dst = Rect::new(3, 1, 37, 21);
        let layout = FrameLayout::packed(PixelFormat::Bgra8, w, h).unwrap();
        let (pw, ph) = (44u32, 24u32);
        for plane_alpha in [0.7, 1.0] {
            let mut plane = host_plane(layout, &bytes, dst, true);
            plane.alpha = plane_alpha;
            let statics = StaticPlanes::default();
            let mut pictures = Vec::new();
            for _ in 0..3 {
                let mut pic = Picture::black(pw, ph);
                compose(&mut pic, &[(&plane, dst)], &statics, &ledger()).unwrap();
                pictures.push(pic);
            }
            let mut want = Picture::black(pw, ph);
            let at = Placement::new(plane.crop, dst, (pw, ph)).unwrap();
            let alpha = blend_alpha(&plane).unwrap();
            let (py, pu, pv) = want.planes_mut();
            for j in 0..at.y.count {
                for i in 0..at.x.count {
                    let [b, g, r, a] = texel(at.x.texel(i), at.y.texel(j));
                    let a = u32::from(a) * alpha / 255;
                    let (x, y) = (at.x0 + i as usize, at.y0 + j as usize);
                    let (yy, u, v) = rgb_to_yuv(r, g, b);
                    mix(&mut py[y * pw as usize + x], yy, a);
                    if x % 2 == 0 && y % 2 == 0 {
                        let c = y / 2 * (pw as usize / 2) + x / 2;
                        mix(&mut pu[c], u, a);
                        mix(&mut pv[c], v, a);
                    }
                }
            }
            assert_eq!(statics.state().kept.len(), 1, "the unchanged plane is kept");
            for (k, pic) in pictures.iter().enumerate() {
                assert!(pic == &want, "alpha {plane_alpha}: composition {k} differs");
            }
        }
    }

    #[test]
    fn colours_convert_as_jfif_and_mix_by_coverage() {
        assert_eq!(rgb_to_yuv(255, 255, 255), (255, 128, 128));
        assert_eq!(rgb_to_yuv(0, 0, 0), (0, 128, 128));
        assert_eq!(rgb_to_yuv(255, 0, 0), (76, 85, 255));
        for (r, g, b) in [(255, 255, 255), (0, 0, 0), (255, 0, 0), (12, 200, 99)] {
            assert_eq!(rgb_to_luma(r, g, b), rgb_to_yuv(r, g, b).0);
        }
        let lut = RangeLut::new();
        assert_eq!(
            (lut.luma[16], lut.luma[235], lut.chroma[128]),
            (0, 255, 128)
        );
        let mut d = 100u8;
        mix(&mut d, 200, 0);
        assert_eq!(d, 100);
        mix(&mut d, 200, 128);
        assert_eq!(d, 150);
        mix(&mut d, 7, 255);
        assert_eq!(d, 7);
    }
}
