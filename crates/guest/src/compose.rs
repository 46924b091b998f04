//! The guest's composition policy, as Android's hardware composer "validate" step: which
//! layers the display's planes can show by themselves, so that only the rest go to the GPU.
//!
//! The display (its `mode` command) says how many planes a frame may use; a plane does not
//! rotate and scales by at most [`MAX_PLANE_SCALE`] either way (the display's rule, see its
//! device documentation). A HAL asks [`planes_can_show`] before each frame and sends
//! `display::present_layers` when it says yes, `gpu::composite` + `display::present`
//! otherwise.

use virtsoc_devapi::LayerRecord;

/// Largest scaling of a display plane, up or down, per axis.
pub const MAX_PLANE_SCALE: u64 = 4;

/// Whether a display offering `planes` planes per frame can show `layers` without the GPU.
pub fn planes_can_show(planes: u64, layers: &[LayerRecord]) -> bool {
    let within = |from: u32, to: u32| {
        u64::from(to) * MAX_PLANE_SCALE >= u64::from(from)
            && u64::from(to) <= u64::from(from) * MAX_PLANE_SCALE
    };
    !layers.is_empty()
        && layers.len() as u64 <= planes
        && layers.iter().all(|l| {
            l.rotation == 0 && within(l.crop[2], l.dst_size[0]) && within(l.crop[3], l.dst_size[1])
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(rotation: u32, crop: u32, dst: u32) -> LayerRecord {
        LayerRecord {
            src: 1,
            crop: [0, 0, crop, crop],
            dst_pos: [0, 0],
            dst_size: [dst, dst],
            rotation,
            alpha: 1.0,
            blend: true,
        }
    }

    #[test]
    fn planes_show_few_unrotated_moderately_scaled_layers() {
        assert!(planes_can_show(
            4,
            &[layer(0, 3840, 1920), layer(0, 100, 400)]
        ));
        assert!(!planes_can_show(4, &[layer(90, 100, 100)]), "rotation");
        assert!(
            !planes_can_show(4, &[layer(0, 100, 401)]),
            "upscale past 4x"
        );
        assert!(
            !planes_can_show(4, &[layer(0, 401, 100)]),
            "downscale past 4x"
        );
        assert!(
            !planes_can_show(1, &[layer(0, 8, 8), layer(0, 8, 8)]),
            "too many"
        );
        assert!(!planes_can_show(4, &[]), "nothing to show");
    }
}
