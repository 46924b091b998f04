//! Getting a frame's layers onto the screen, as Android's composer does it: the guest's
//! composition policy asks the display for planes (`present_layers`), and only when the
//! display cannot show the layers as planes (or `--composition gpu` forces it) composes them
//! on the GPU into an output at the screen's size and presents that.

use virtsoc_guest::devices::{self as api, LayerRecord};
use virtsoc_guest::{Connection, Format};

use super::pipe::Pipe;
use crate::CliError;
use virtsoc_devapi::RegionId;

/// How layers reach the screen.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Composition {
    /// Display planes where the display can show the layers, the GPU otherwise.
    Planes,
    /// Always the GPU (the baseline of emulators without overlay planes).
    Gpu,
}

/// A layer showing all of a `w` x `h` source stretched over the `screen`.
pub(crate) fn screen_layer(
    src: RegionId,
    (w, h): (u32, u32),
    screen: (u32, u32),
    blend: bool,
) -> LayerRecord {
    LayerRecord {
        src,
        crop: [0, 0, w, h],
        dst_pos: [0, 0],
        dst_size: [screen.0, screen.1],
        rotation: 0,
        alpha: 1.0,
        blend,
    }
}

/// Writes `layers` into a new blob region; returns its id.
pub(crate) fn layer_blob(p: &Pipe<'_>, layers: &[LayerRecord]) -> Result<RegionId, CliError> {
    let id = p
        .conn
        .alloc_blob((layers.len() * api::LAYER_RECORD) as u64)?
        .id;
    let bytes: Vec<u8> = layers.iter().flat_map(|l| l.to_bytes()).collect();
    p.cpu_write(id, &bytes)?;
    Ok(id)
}

/// GPU composition targets, used in turn.
const TARGETS: usize = 3;

/// The screen and the way frames get onto it.
pub(crate) struct Show {
    pub(crate) composition: Composition,
    /// The display's size.
    pub(crate) screen: (u32, u32),
    /// GPU composition targets (GPU composition only), used in turn.
    outs: Vec<RegionId>,
    next: usize,
    /// Planes the display offers per frame.
    planes: u64,
    /// Frames the display could not show as planes (composed on the GPU instead).
    pub(crate) fallbacks: u64,
    /// Damage of recent frames, so a target holding an earlier frame is redrawn only where
    /// something changed since (buffer age).
    damage: virtsoc_guest::compose::DamageTracker,
    /// The previous frame's layers.
    prev: Vec<LayerRecord>,
    /// Frames shown, and the frame each target last received.
    frames: u64,
    drawn: Vec<Option<u64>>,
}

impl Show {
    /// Asks the display for its mode; allocates GPU composition targets when needed.
    pub(crate) fn new(p: &mut Pipe<'_>, composition: Composition) -> Result<Self, CliError> {
        let mode = p.conn.command(&api::display::Mode::default())?;
        let screen = (mode.width as u32, mode.height as u32);
        let mut show = Show {
            composition,
            screen,
            outs: Vec::new(),
            next: 0,
            planes: mode.planes,
            fallbacks: 0,
            damage: virtsoc_guest::compose::DamageTracker::new(screen, TARGETS),
            prev: Vec::new(),
            frames: 0,
            drawn: Vec::new(),
        };
        if composition == Composition::Gpu {
            show.outs = Self::targets(p.conn, screen)?;
        }
        Ok(show)
    }

    fn targets(conn: &Connection, screen: (u32, u32)) -> Result<Vec<RegionId>, CliError> {
        super::images(conn, TARGETS, screen, Format::Rgba8)
    }

    /// The composition policy (the guest library's, Android's "validate" step): whether the
    /// display's planes can show `layers`.
    pub(crate) fn planes_can_show(&self, layers: &[LayerRecord]) -> bool {
        virtsoc_guest::compose::planes_can_show(self.planes, layers)
    }

    /// Shows `records` (already written into blob `layers`), whose sources are `sources`
    /// (those in `changed` rewritten since the last frame), as captured or decoded at
    /// `capture_ns` (0: the display reads the stamp in the pixels).
    pub(crate) fn show(
        &mut self,
        p: &mut Pipe<'_>,
        (layers, records): (RegionId, &[LayerRecord]),
        (sources, changed): (&[RegionId], &[RegionId]),
        capture_ns: u64,
    ) -> Result<(), CliError> {
        let count = records.len() as u64;
        let damage =
            virtsoc_guest::compose::frame_damage(&self.prev, records, changed, self.screen);
        self.damage.push(damage);
        self.prev = records.to_vec();
        self.frames += 1;
        if self.composition == Composition::Planes {
            if self.planes_can_show(records) {
                p.run_with(
                    &api::display::PresentLayers {
                        layers,
                        count,
                        capture_ns,
                    },
                    sources,
                )?;
                return Ok(());
            }
            self.fallbacks += 1;
            if self.outs.is_empty() {
                self.outs = Self::targets(p.conn, self.screen)?;
            }
        }
        let dst = self.outs[self.next];
        self.drawn.resize(self.outs.len(), None);
        // The target holds the frame it last received: only what changed since is drawn.
        let age = self.drawn[self.next].map_or(0, |f| (self.frames - f) as usize);
        self.drawn[self.next] = Some(self.frames);
        self.next = (self.next + 1) % self.outs.len();
        match self.damage.for_age(age) {
            Some([x, y, w, h]) => p
                .run_with(
                    &api::gpu::CompositeDamage {
                        layers,
                        count,
                        dst,
                        damage: api::pack_damage(x as u16, y as u16, w as u16, h as u16),
                    },
                    sources,
                )
                .map(drop)?,
            None => p
                .run_with(&api::gpu::Composite { layers, count, dst }, sources)
                .map(drop)?,
        };
        p.run(&api::display::Present {
            frame: dst,
            capture_ns,
        })?;
        Ok(())
    }
}
