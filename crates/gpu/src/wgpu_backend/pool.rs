//! Pools of idle textures (for the byte API's temporary images) and buffers
//! (readback, storage), keyed by (format, size, usage), with fixed caps so
//! repeated frames of equal sizes reuse them and the pool never grows without
//! bound. Returning a resource right after a submission is safe: later uses
//! are ordered after it on the queue.

/// Idle textures kept for reuse.
const MAX_POOLED_TEXTURES: usize = 24;
/// Idle buffers (readback, storage) kept for reuse.
const MAX_POOLED_BUFFERS: usize = 6;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct TexKey {
    pub format: wgpu::TextureFormat,
    pub width: u32,
    pub height: u32,
    pub usage: wgpu::TextureUsages,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct BufKey {
    pub size: u64,
    pub usage: wgpu::BufferUsages,
}

impl BufKey {
    pub(super) fn readback(size: u64) -> Self {
        BufKey {
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        }
    }
}

#[derive(Default)]
pub(super) struct Pool {
    textures: Vec<(TexKey, wgpu::Texture)>,
    buffers: Vec<(BufKey, wgpu::Buffer)>,
}

pub(super) fn create_texture(device: &wgpu::Device, key: TexKey, label: &str) -> wgpu::Texture {
    device.create_texture(&wgpu::TextureDescriptor {
        label: Some(label),
        size: wgpu::Extent3d {
            width: key.width,
            height: key.height,
            depth_or_array_layers: 1,
        },
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format: key.format,
        usage: key.usage,
        view_formats: &[],
    })
}

impl Pool {
    pub(super) fn take_texture(&mut self, device: &wgpu::Device, key: TexKey) -> wgpu::Texture {
        if let Some(i) = self.textures.iter().position(|(k, _)| *k == key) {
            return self.textures.remove(i).1;
        }
        create_texture(device, key, "virtsoc-pooled")
    }

    pub(super) fn give_texture(&mut self, key: TexKey, tex: wgpu::Texture) {
        self.textures.push((key, tex));
        while self.textures.len() > MAX_POOLED_TEXTURES {
            self.textures.remove(0);
        }
    }

    pub(super) fn take_buffer(&mut self, device: &wgpu::Device, key: BufKey) -> wgpu::Buffer {
        if let Some(i) = self.buffers.iter().position(|(k, _)| *k == key) {
            return self.buffers.remove(i).1;
        }
        device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("virtsoc-pooled"),
            size: key.size,
            usage: key.usage,
            mapped_at_creation: false,
        })
    }

    pub(super) fn give_buffer(&mut self, key: BufKey, buf: wgpu::Buffer) {
        self.buffers.push((key, buf));
        while self.buffers.len() > MAX_POOLED_BUFFERS {
            self.buffers.remove(0);
        }
    }

    /// (idle textures, idle buffers).
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.textures.len(), self.buffers.len())
    }
}
