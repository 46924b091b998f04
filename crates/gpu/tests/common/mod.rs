#![allow(dead_code)]

use std::sync::OnceLock;

use virtsoc_gpu::{FrameLayout, OwnedFrame, WgpuBackend};

pub const SKIP: &str = "skipped: no adapter (install mesa-vulkan-drivers)";

/// The lavapipe ICD manifest; when it is installed an adapter must exist.
pub const LAVAPIPE_ICD: &str = "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json";

/// One shared device per test binary (device setup costs 50-120 ms on lavapipe).
pub fn gpu() -> Option<&'static WgpuBackend> {
    static GPU: OnceLock<Option<WgpuBackend>> = OnceLock::new();
    GPU.get_or_init(|| match WgpuBackend::new() {
        Ok(b) => {
            eprintln!("wgpu adapter: {}", b.adapter_info());
            Some(b)
        }
        Err(e @ virtsoc_gpu::GpuError::NoAdapter(_)) => {
            eprintln!("{SKIP}: {e}");
            None
        }
        // An adapter exists but the device could not be set up: a real failure.
        Err(e) => panic!("wgpu backend setup failed: {e}"),
    })
    .as_ref()
}

/// The shared GPU, or returns from the test saying why it is skipped (no adapter).
#[macro_export]
macro_rules! gpu_or_skip {
    () => {
        match common::gpu() {
            Some(g) => g,
            None => {
                assert!(
                    std::env::var_os("VIRTSOC_REQUIRE_ALL").is_none(),
                    "{} and VIRTSOC_REQUIRE_ALL is set",
                    common::SKIP
                );
                println!("{}", common::SKIP);
                return;
            }
        }
    };
}

/// Per-channel differences between two packed 4-byte frames of equal layout
/// (row padding ignored).
#[derive(Debug, Clone, Copy)]
pub struct Diff {
    pub max: u8,
    pub mean: f64,
    /// Fraction of channel values differing by more than 1.
    pub over1: f64,
}

pub fn diff(a: &OwnedFrame, b: &OwnedFrame) -> Diff {
    assert_eq!(a.layout, b.layout);
    let l = a.layout;
    let row = l.width as usize * 4;
    let mut max = 0u8;
    let mut sum = 0u64;
    let mut over1 = 0u64;
    let mut n = 0u64;
    for y in 0..l.height as usize {
        let o = y * l.stride as usize;
        for (x, y) in a.data[o..o + row].iter().zip(&b.data[o..o + row]) {
            let d = x.abs_diff(*y);
            max = max.max(d);
            sum += d as u64;
            over1 += (d > 1) as u64;
            n += 1;
        }
    }
    Diff {
        max,
        mean: sum as f64 / n as f64,
        over1: over1 as f64 / n as f64,
    }
}

/// Asserts `gpu` matches `cpu` within `max`/`mean`, and that the reference is
/// not a flat image (so the comparison means something).
pub fn assert_close(what: &str, gpu: &OwnedFrame, cpu: &OwnedFrame, max: u8, mean: f64) {
    let d = diff(gpu, cpu);
    eprintln!(
        "{what}: max {} mean {:.4} >1: {:.4}%",
        d.max,
        d.mean,
        d.over1 * 100.0
    );
    assert!(
        distinct_values(cpu) > 16,
        "{what}: reference image is nearly flat"
    );
    assert!(
        d.max <= max && d.mean <= mean,
        "{what}: GPU differs from the CPU reference: max {} (limit {max}), mean {:.4} (limit {mean})",
        d.max,
        d.mean
    );
}

pub fn distinct_values(f: &OwnedFrame) -> usize {
    let mut seen = [false; 256];
    for b in &f.data {
        seen[*b as usize] = true;
    }
    seen.iter().filter(|s| **s).count()
}

pub fn frame(layout: FrameLayout) -> OwnedFrame {
    OwnedFrame::new(layout).expect("valid layout")
}
