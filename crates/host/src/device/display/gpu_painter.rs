//! The window's GPU painter: with `--display-backend window` and a wgpu GPU, presented frames
//! (display planes) are composed on the GPU and presented through a surface on the window
//! ([`virtsoc_gpu::SurfacePresenter`]): planes resident in the GPU's memory are drawn from
//! where they are and never read back; planes in host memory are uploaded once per write.
//! When the adapter cannot present to the window, or a frame is not display planes, the
//! CPU painter shows the frame's composed pixels instead.

use std::sync::Arc;

use virtsoc_display as vd;
use virtsoc_gpu::{SurfacePresenter, WgpuBackend};

use super::planes::{PlaneSet, WindowUploads};

/// Paints frames on the GPU (see the module docs).
pub(super) struct GpuPainter {
    gpu: Arc<WgpuBackend>,
    presenter: Option<SurfacePresenter>,
    /// Set when the surface could not be made: the CPU painter shows every frame.
    unavailable: bool,
    /// Whether a frame the GPU could not show was logged.
    told: bool,
    uploads: WindowUploads,
    cpu: vd::CpuPainter,
}

impl GpuPainter {
    pub(super) fn new(gpu: Arc<WgpuBackend>) -> Self {
        GpuPainter {
            gpu,
            presenter: None,
            unavailable: false,
            told: false,
            uploads: WindowUploads::default(),
            cpu: vd::CpuPainter::default(),
        }
    }

    /// Makes the presenter on `target`'s window on first use, and keeps it at the window's
    /// size.
    fn ensure_presenter(&mut self, target: &vd::WindowTarget<'_>) {
        if self.presenter.is_none() && !self.unavailable {
            let (w, h) = target.size();
            let made = target
                .handles()
                .map_err(|e| e.to_string())
                .and_then(|(d, win)| {
                    // SAFETY: the handles are the window's, and the window backend drops this
                    // painter (and so the presenter) before the window.
                    unsafe { self.gpu.create_presenter(d, win, w, h) }.map_err(|e| e.to_string())
                });
            match made {
                Ok(p) => self.presenter = Some(p),
                Err(e) => {
                    log::warn!(
                        "window: cannot present on the GPU ({e}); frames painted on the CPU"
                    );
                    self.unavailable = true;
                }
            }
        }
        if let Some(p) = &mut self.presenter {
            let (w, h) = target.size();
            self.gpu.resize_presenter(p, w, h);
        }
    }
}

impl vd::WindowPainter for GpuPainter {
    fn paint(
        &mut self,
        target: &mut vd::WindowTarget<'_>,
        frame: &vd::PresentedFrame,
    ) -> vd::Result<()> {
        let set = match &frame.data {
            vd::FrameData::Handle(h) => h.as_any().and_then(|a| a.downcast_ref::<PlaneSet>()),
            vd::FrameData::Bytes(_) => None,
        };
        if let Some(set) = set {
            self.ensure_presenter(target);
            let shown = self
                .presenter
                .as_mut()
                .and_then(|p| set.present_in_window(&self.gpu, p, &mut self.uploads));
            match shown {
                Some(Ok(_)) => return Ok(()),
                Some(Err(e)) => return Err(vd::DisplayError::Backend(e.to_string())),
                None => {}
            }
        }
        if !self.told && !self.unavailable {
            log::info!(
                "window: frame {} is not display planes in GPU or host memory; \
                 painted on the CPU",
                frame.id
            );
            self.told = true;
        }
        self.cpu.paint(target, frame)
    }

    fn name(&self) -> &'static str {
        "gpu"
    }
}
