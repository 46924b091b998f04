//! The GPU's own memory under the SVM: replicas of image regions in the GPU's domain are
//! resident wgpu images ([`GpuImage`]). The copy engine fills them by uploads and empties them
//! by readbacks through [`DeviceMemory`], so those copies are measured, routed, prefetched and
//! counted like any other; GPU commands draw from and into them directly.

use std::sync::Arc;

use virtsoc_gpu::{
    FrameError, FrameLayout, GpuError, GpuImage, PixelFormat, SampleAxis, WgpuBackend,
};
use virtsoc_svm::{DeviceAllocator, DeviceMemory, RegionMeta, SvmError};

/// One replica in GPU memory.
pub(crate) struct GpuMemory {
    pub(crate) image: GpuImage,
    backend: Arc<WgpuBackend>,
}

impl std::fmt::Debug for GpuMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuMemory")
            .field("image", &self.image)
            .finish()
    }
}

fn gpu_error(e: virtsoc_gpu::GpuError) -> SvmError {
    match e {
        virtsoc_gpu::GpuError::InvalidLayout(_) | virtsoc_gpu::GpuError::InvalidParameter(_) => {
            SvmError::OutOfRange
        }
        e => SvmError::Internal(format!("gpu memory: {e}")),
    }
}

impl GpuMemory {
    /// Samples plane `plane` of the image on a nearest-neighbour grid on the GPU (see
    /// [`WgpuBackend::sample_plane`]).
    pub(crate) fn sample_plane(
        &self,
        plane: usize,
        grid: (SampleAxis, SampleAxis),
        sink: impl FnOnce(&[u8]),
    ) -> virtsoc_svm::Result<()> {
        self.backend
            .sample_plane(&self.image, plane, grid, sink)
            .map_err(gpu_error)
    }
}

impl DeviceMemory for GpuMemory {
    fn write(&self, offset: u64, src: &[u8]) -> virtsoc_svm::Result<()> {
        let off = usize::try_from(offset).map_err(|_| SvmError::OutOfRange)?;
        self.backend
            .write_image(&self.image, off, src)
            .map_err(gpu_error)
    }

    fn read(&self, offset: u64, dst: &mut [u8]) -> virtsoc_svm::Result<()> {
        let off = usize::try_from(offset).map_err(|_| SvmError::OutOfRange)?;
        self.backend
            .read_image(&self.image, off, dst)
            .map_err(gpu_error)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Places image regions' replicas in GPU memory; blobs (command records) stay in host memory.
pub(crate) struct GpuAllocator {
    pub(crate) backend: Arc<WgpuBackend>,
}

impl DeviceAllocator for GpuAllocator {
    fn alloc(&self, meta: &RegionMeta) -> virtsoc_svm::Result<Option<Arc<dyn DeviceMemory>>> {
        let Ok(format) = PixelFormat::try_from(meta.format) else {
            return Ok(None);
        };
        let layout = match FrameLayout::with_stride(format, meta.width, meta.height, meta.stride) {
            Ok(l) if l.size() as u64 <= meta.size => l,
            _ => return Ok(None),
        };
        let image = self.backend.create_image(layout).map_err(|e| match e {
            GpuError::Frame(FrameError::TooLarge { .. }) => SvmError::OutOfMemory,
            e => gpu_error(e),
        })?;
        Ok(Some(Arc::new(GpuMemory {
            image,
            backend: self.backend.clone(),
        })))
    }
}
