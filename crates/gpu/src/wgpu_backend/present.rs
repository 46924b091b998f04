//! Presenting resident images in a window: a [`SurfacePresenter`] holds a wgpu surface on
//! a native window (X11, Wayland, Win32, ... whatever wgpu supports there) and a screen
//! image of the window's size. [`WgpuBackend::present_layers`] composes image layers into
//! the screen image on the GPU (the composition pass of [`ops`](super::ops), black where no
//! layer draws) and copies it into the surface's next texture, GPU to GPU: the frame's bytes
//! never come back to the CPU. On lavapipe the driver's window system integration then puts
//! the pixels on the X server; on a real GPU the swapchain image is scanned out.
//!
//! Presenting holds the device's queue (Vulkan requires presents and submissions to a queue
//! to be serialised, and wgpu holds its submission lock across the driver's present). A GPU's
//! present is a flip and returns at once; a CPU adapter's (lavapipe) copies the image to the
//! X server inside the call, 25-120 ms for 1080p on Xvfb, while every submission of the
//! device waits. [`AdapterSummary::is_cpu`](super::AdapterSummary::is_cpu) lets the caller
//! choose another way there.
//!
//! The surface texture is a copy destination rather than a render target so that one
//! composition pipeline (which needs an RGBA or BGRA `GpuImage` it can also sample, store
//! and read back) serves windows, snapshots and guests alike; the copy costs one GPU-side
//! blit per presented frame.

use std::time::Instant;

use virtsoc_sync::LockExt;

use super::{image::GpuImage, ops::ImageLayer, WgpuBackend};
use crate::{FrameLayout, GpuError, PixelFormat, Result};

/// A window's surface and the screen image presented into it. Made by
/// [`WgpuBackend::create_presenter`]; use it with the backend that made it.
pub struct SurfacePresenter {
    surface: wgpu::Surface<'static>,
    config: wgpu::SurfaceConfiguration,
    /// The composed screen, the window's size, in a format copyable into the surface.
    screen: Option<GpuImage>,
    /// The screen's pixel format (the surface's, without sRGB).
    screen_format: PixelFormat,
    owner: u64,
    presented: u64,
}

impl std::fmt::Debug for SurfacePresenter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SurfacePresenter")
            .field("format", &self.config.format)
            .field("width", &self.config.width)
            .field("height", &self.config.height)
            .field("presented", &self.presented)
            .finish()
    }
}

impl SurfacePresenter {
    /// The surface's size in pixels.
    pub fn size(&self) -> (u32, u32) {
        (self.config.width, self.config.height)
    }

    /// Frames presented so far.
    pub fn presented(&self) -> u64 {
        self.presented
    }

    /// The pixel format of the surface's textures.
    pub fn format(&self) -> wgpu::TextureFormat {
        self.config.format
    }
}

/// What one [`WgpuBackend::present_layers`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SurfaceOutcome {
    /// The frame was composed and handed to the window system.
    Presented,
    /// The window cannot show a frame now (occluded, or its surface was being remade);
    /// nothing was drawn.
    Skipped,
}

/// The non-sRGB RGBA or BGRA format among `formats` (sRGB ones copy the same bytes), and the
/// screen image's matching pixel format.
fn pick_format(formats: &[wgpu::TextureFormat]) -> Option<(wgpu::TextureFormat, PixelFormat)> {
    use wgpu::TextureFormat as F;
    let of = |f: F| match f.remove_srgb_suffix() {
        F::Bgra8Unorm => Some(PixelFormat::Bgra8),
        F::Rgba8Unorm => Some(PixelFormat::Rgba8),
        _ => None,
    };
    let linear = formats.iter().find(|f| !f.is_srgb() && of(**f).is_some());
    let any = formats.iter().find(|f| of(**f).is_some());
    linear.or(any).and_then(|f| of(*f).map(|p| (*f, p)))
}

impl WgpuBackend {
    /// A presenter on the native window `window` of `display`, `width` x `height` pixels.
    ///
    /// Fails with [`GpuError::Backend`] when this adapter cannot present to that window
    /// (no surface support, no RGBA/BGRA format, or the surface cannot be a copy
    /// destination); the caller then shows frames another way.
    ///
    /// # Safety
    ///
    /// `display` and `window` must be valid handles of a live window, and stay valid until
    /// the returned presenter is dropped.
    pub unsafe fn create_presenter(
        &self,
        display: wgpu::rwh::RawDisplayHandle,
        window: wgpu::rwh::RawWindowHandle,
        width: u32,
        height: u32,
    ) -> Result<SurfacePresenter> {
        let target = wgpu::SurfaceTargetUnsafe::RawHandle {
            raw_display_handle: Some(display),
            raw_window_handle: window,
        };
        // SAFETY: the caller keeps both handles valid until the presenter (which owns the
        // surface) is dropped.
        let surface = unsafe { self.wgpu_instance.create_surface_unsafe(target) }
            .map_err(|e| GpuError::Backend(format!("cannot make a surface on the window: {e}")))?;
        let caps = surface.get_capabilities(&self.adapter);
        let (format, screen_format) = pick_format(&caps.formats).ok_or_else(|| {
            GpuError::Backend(format!(
                "the window's surface offers no RGBA/BGRA format ({:?})",
                caps.formats
            ))
        })?;
        if !caps.usages.contains(wgpu::TextureUsages::COPY_DST) {
            return Err(GpuError::Backend(
                "the window's surface cannot be a copy destination".into(),
            ));
        }
        // The display's vsync thread already paces frames: present without waiting. (On
        // lavapipe under X11, Immediate takes 25-45 ms a 1080p present, Mailbox 60-120 ms, and
        // Fifo never returned a second image on Xvfb.)
        let present_mode = [wgpu::PresentMode::Immediate, wgpu::PresentMode::Mailbox]
            .into_iter()
            .find(|m| caps.present_modes.contains(m))
            .unwrap_or(wgpu::PresentMode::Fifo);

        let config = wgpu::SurfaceConfiguration {
            usage: wgpu::TextureUsages::COPY_DST,
            format,
            width: width.clamp(1, self.max_dim),
            height: height.clamp(1, self.max_dim),
            present_mode,
            desired_maximum_frame_latency: 1,
            alpha_mode: caps
                .alpha_modes
                .first()
                .copied()
                .unwrap_or(wgpu::CompositeAlphaMode::Auto),
            view_formats: Vec::new(),
            color_space: wgpu::SurfaceColorSpace::Auto,
        };
        surface.configure(&self.device, &config);
        self.check_errors()?;
        log::info!(
            "virtsoc-gpu: presenting {}x{} {format:?} ({present_mode:?}) on {}",
            config.width,
            config.height,
            self.info
        );
        Ok(SurfacePresenter {
            surface,
            config,
            screen: None,
            screen_format,
            owner: self.instance,
            presented: 0,
        })
    }

    /// Resizes `p`'s surface to `width` x `height` (a resized window); the next frame is
    /// composed at that size.
    pub fn resize_presenter(&self, p: &mut SurfacePresenter, width: u32, height: u32) {
        let (w, h) = (width.clamp(1, self.max_dim), height.clamp(1, self.max_dim));
        if (w, h) == p.size() {
            return;
        }
        p.config.width = w;
        p.config.height = h;
        p.screen = None;
        p.surface.configure(&self.device, &p.config);
    }

    /// Composes `layers` (destination rectangles in the surface's pixels) over black and
    /// presents the result in `p`'s window. The layers' images stay where they are; the only
    /// copy is the GPU-side one of the composed screen into the surface texture.
    pub fn present_layers(
        &self,
        p: &mut SurfacePresenter,
        layers: &[ImageLayer<'_>],
    ) -> Result<SurfaceOutcome> {
        if p.owner != self.instance {
            return Err(GpuError::Backend(
                "the presenter belongs to another GPU device".into(),
            ));
        }
        let (w, h) = p.size();
        let screen = match &p.screen {
            Some(s) => s.clone(),
            None => {
                let s = self.create_image(FrameLayout::packed(p.screen_format, w, h)?)?;
                p.screen = Some(s.clone());
                s
            }
        };
        self.check_image_layers(layers, &screen)?;
        let frame = match p.surface.get_current_texture() {
            wgpu::CurrentSurfaceTexture::Success(t)
            | wgpu::CurrentSurfaceTexture::Suboptimal(t) => t,
            wgpu::CurrentSurfaceTexture::Timeout | wgpu::CurrentSurfaceTexture::Occluded => {
                return Ok(SurfaceOutcome::Skipped)
            }
            other => {
                log::info!("virtsoc-gpu: surface {other:?}; configuring it again");
                p.surface.configure(&self.device, &p.config);
                return Ok(SurfaceOutcome::Skipped);
            }
        };
        let t0 = Instant::now();
        let mut st = self.state.lock_or_recover();
        self.composite_locked(&mut st, layers, &screen, Some([0, 0, 0, 255]), None);
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("present"),
            });
        encoder.copy_texture_to_texture(
            screen.target().as_image_copy(),
            frame.texture.as_image_copy(),
            wgpu::Extent3d {
                width: w,
                height: h,
                depth_or_array_layers: 1,
            },
        );
        self.submit(&mut st, encoder.finish());
        drop(st);
        self.queue.present(frame);
        self.check_errors()?;
        p.presented += 1;
        log::trace!("virtsoc-gpu: presented in {:?}", t0.elapsed());
        Ok(SurfaceOutcome::Presented)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wgpu::TextureFormat as F;

    #[test]
    fn picks_a_linear_rgba_or_bgra_format() {
        assert_eq!(
            pick_format(&[F::Bgra8UnormSrgb, F::Bgra8Unorm]),
            Some((F::Bgra8Unorm, PixelFormat::Bgra8))
        );
        assert_eq!(
            pick_format(&[F::Rgb10a2Unorm, F::Rgba8Unorm]),
            Some((F::Rgba8Unorm, PixelFormat::Rgba8))
        );
        // Only an sRGB one: its bytes are copied as they are.
        assert_eq!(
            pick_format(&[F::Bgra8UnormSrgb]),
            Some((F::Bgra8UnormSrgb, PixelFormat::Bgra8))
        );
        assert_eq!(pick_format(&[F::Rgb10a2Unorm]), None);
    }
}
