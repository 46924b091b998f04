//! The guest's composition policy, as Android's hardware composer "validate" step: which
//! layers the display's planes can show by themselves, so that only the rest go to the GPU.
//!
//! The display (its `mode` command) says how many planes a frame may use; a plane does not
//! rotate and scales by at most [`MAX_PLANE_SCALE`] either way (the display's rule,
//! `virtsoc_devapi::display_plane`). A HAL asks [`planes_can_show`] before each frame and sends
//! `display::present_layers` when it says yes, `gpu::composite` + `display::present`
//! otherwise.
//!
//! When it composes on the GPU into a target that still holds an earlier frame (a target
//! `age` frames old, as EGL's buffer age), only what changed since needs drawing: a
//! [`DamageTracker`] keeps each frame's damage ([`frame_damage`]: the screen rectangles of
//! layers that moved or whose source changed) and gives the union over the target's age,
//! which `gpu::composite_damage` draws; `None` means "compose everything".

use virtsoc_devapi::{LayerRecord, RegionId};

/// Largest scaling of a display plane, up or down, per axis.
pub use virtsoc_devapi::display_plane::MAX_SCALE as MAX_PLANE_SCALE;

/// Whether a display offering `planes` planes per frame can show `layers` without the GPU.
pub fn planes_can_show(planes: u64, layers: &[LayerRecord]) -> bool {
    let within = virtsoc_devapi::display_plane::scales;
    !layers.is_empty()
        && layers.len() as u64 <= planes
        && layers.iter().all(|l| {
            l.rotation == 0 && within(l.crop[2], l.dst_size[0]) && within(l.crop[3], l.dst_size[1])
        })
}

/// A rectangle on the screen, `[x, y, width, height]`.
pub type ScreenRect = [u32; 4];

/// The screen rectangle `l` covers on a `screen`-sized display (clipped), if any.
fn covered(l: &LayerRecord, screen: (u32, u32)) -> Option<ScreenRect> {
    let clip = |pos: i32, len: u32, size: u32| {
        let a = i64::from(pos).clamp(0, i64::from(size));
        let b = (i64::from(pos) + i64::from(len)).clamp(0, i64::from(size));
        (b > a).then_some((a as u32, (b - a) as u32))
    };
    let (x, w) = clip(l.dst_pos[0], l.dst_size[0], screen.0)?;
    let (y, h) = clip(l.dst_pos[1], l.dst_size[1], screen.1)?;
    Some([x, y, w, h])
}

/// The smallest rectangle holding `a` and `b`.
fn union(a: ScreenRect, b: ScreenRect) -> ScreenRect {
    let (x0, y0) = (a[0].min(b[0]), a[1].min(b[1]));
    let x1 = (a[0] + a[2]).max(b[0] + b[2]);
    let y1 = (a[1] + a[3]).max(b[1] + b[3]);
    [x0, y0, x1 - x0, y1 - y0]
}

/// What changed on a `screen`-sized display from the frame of layers `prev` to `cur`, whose
/// sources in `changed` were rewritten since: the union of the rectangles of layers added,
/// removed or changed (geometry, alpha, blending, or a changed source), old and new place.
/// `None` when nothing changed.
pub fn frame_damage(
    prev: &[LayerRecord],
    cur: &[LayerRecord],
    changed: &[RegionId],
    screen: (u32, u32),
) -> Option<ScreenRect> {
    let mut damage: Option<ScreenRect> = None;
    let mut add = |l: &LayerRecord| {
        if let Some(r) = covered(l, screen) {
            damage = Some(damage.map_or(r, |d| union(d, r)));
        }
    };
    for i in 0..prev.len().max(cur.len()) {
        match (prev.get(i), cur.get(i)) {
            (Some(a), Some(b)) if a == b && !changed.contains(&b.src) => {}
            (a, b) => {
                a.into_iter().chain(b).for_each(&mut add);
            }
        }
    }
    damage
}

/// Damage per frame, for composing into targets that hold earlier frames (buffer age).
#[derive(Debug, Clone)]
pub struct DamageTracker {
    screen: (u32, u32),
    /// Damage of the most recent frames, newest last; `None` entries changed nothing.
    history: std::collections::VecDeque<Option<ScreenRect>>,
    /// Frames kept (the oldest target age that can be drawn partially).
    depth: usize,
}

impl DamageTracker {
    /// A tracker for a `screen`-sized display whose targets are at most `depth` frames old.
    pub fn new(screen: (u32, u32), depth: usize) -> Self {
        DamageTracker {
            screen,
            history: std::collections::VecDeque::new(),
            depth: depth.max(1),
        }
    }

    /// Records the damage of the frame about to be composed.
    pub fn push(&mut self, damage: Option<ScreenRect>) {
        self.history.push_back(damage);
        while self.history.len() > self.depth {
            self.history.pop_front();
        }
    }

    /// What to draw into a target that holds the frame `age` frames before the one just
    /// pushed (0: a new target, never drawn): the union of the damage of the last `age`
    /// frames, `Some` only when that is smaller than the screen. `None` means compose all.
    pub fn for_age(&self, age: usize) -> Option<ScreenRect> {
        if age == 0 || age > self.history.len() {
            return None;
        }
        let full = [0, 0, self.screen.0, self.screen.1];
        let mut d: Option<ScreenRect> = None;
        for r in self.history.iter().rev().take(age).flatten() {
            d = Some(d.map_or(*r, |d| union(d, *r)));
        }
        // Nothing changed: redraw a minimal rectangle rather than nothing, so the frame is
        // still a composition the display can be handed.
        let d = d.unwrap_or([0, 0, 1.min(self.screen.0), 1.min(self.screen.1)]);
        (d != full).then_some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(src: u64, x: i32, y: i32, w: u32, h: u32) -> LayerRecord {
        LayerRecord {
            src: RegionId(src),
            crop: [0, 0, w, h],
            dst_pos: [x, y],
            dst_size: [w, h],
            rotation: 0,
            alpha: 1.0,
            blend: true,
        }
    }

    #[test]
    fn frame_damage_covers_what_moved_or_changed() {
        let screen = (100, 80);
        let bg = at(1, 0, 0, 100, 80);
        let icon = at(2, 10, 10, 8, 8);
        let prev = [bg, icon];
        assert_eq!(frame_damage(&prev, &prev, &[], screen), None);
        assert_eq!(
            frame_damage(&prev, &prev, &[RegionId(2)], screen),
            Some([10, 10, 8, 8])
        );
        // The icon moved: old and new place.
        let moved = [bg, at(2, 30, 12, 8, 8)];
        assert_eq!(
            frame_damage(&prev, &moved, &[], screen),
            Some([10, 10, 28, 10])
        );
        // A layer partly off screen is clipped; one wholly off adds nothing.
        let off = [bg, icon, at(3, 95, -4, 10, 10), at(4, 200, 0, 5, 5)];
        assert_eq!(frame_damage(&prev, &off, &[], screen), Some([95, 0, 5, 6]));
        // The background's source changed: everything.
        assert_eq!(
            frame_damage(&prev, &prev, &[RegionId(1)], screen),
            Some([0, 0, 100, 80])
        );
    }

    #[test]
    fn a_target_is_redrawn_where_any_frame_since_it_changed() {
        let mut t = DamageTracker::new((100, 80), 3);
        t.push(Some([0, 0, 10, 10]));
        t.push(None);
        t.push(Some([50, 50, 10, 10]));
        assert_eq!(t.for_age(0), None, "a new target: all of it");
        assert_eq!(t.for_age(1), Some([50, 50, 10, 10]));
        assert_eq!(t.for_age(2), Some([50, 50, 10, 10]));
        assert_eq!(t.for_age(3), Some([0, 0, 60, 60]));
        assert_eq!(t.for_age(4), None, "older than the history: all of it");
        t.push(Some([0, 0, 100, 80]));
        assert_eq!(t.for_age(1), None, "the whole screen changed");
        t.push(None);
        assert_eq!(t.for_age(1), Some([0, 0, 1, 1]), "nothing changed");
    }

    fn layer(rotation: u32, crop: u32, dst: u32) -> LayerRecord {
        LayerRecord {
            src: RegionId(1),
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
