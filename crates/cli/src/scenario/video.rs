//! The video scenarios (`uhd-video`, `video-360`): decode (codec) -> [projection (GPU)] ->
//! composite with a UI layer -> display.
//!
//! Pictures carry their own identity: every unit is decoded with its index as its pts, the
//! time its unit was written is kept per pts ([`Stamps`]), and a picture the decoder
//! delivers is presented with the stamp of the pts the decoder returns with it (with frame
//! threads or B-frames the picture `receive_frame` delivers after unit *i* is an earlier
//! unit's). A picture is presented only once it exists: the guest waits for
//! `receive_frame`'s answer before queuing the present, so a present never names a region the
//! decoder did not fill (`got` 0 is counted as held back, and nothing is presented).

use std::collections::BTreeMap;
use std::time::Duration;

use virtsoc_guest::devices::{self as api, LayerRecord};
use virtsoc_guest::Format;

use super::media::{self, Clip};
use super::pipe::{self, Pipe};
use super::show::{layer_blob, screen_layer, Show};
use super::{images, now_ns, pace, ui_pixels, Common, RunOpts};
use crate::bench_svm::OrderingMode;
use crate::CliError;
use virtsoc_devapi::{HandleId, RegionId};

/// Stamps kept at most (pictures the decoder never delivers are forgotten oldest first).
const MAX_STAMPS: usize = 256;

/// When each unit was written into the bitstream slot, by the pts it was decoded with.
#[derive(Debug, Default)]
pub(crate) struct Stamps {
    at: BTreeMap<u64, u64>,
}

impl Stamps {
    /// Unit `pts` was written at `ns`.
    pub(crate) fn written(&mut self, pts: u64, ns: u64) {
        self.at.insert(pts, ns);
        while self.at.len() > MAX_STAMPS {
            self.at.pop_first();
        }
    }

    /// The stamp of the picture the decoder delivered with `pts` (taken: a picture is
    /// delivered once); `None` for a pts no unit was decoded with.
    pub(crate) fn take(&mut self, pts: u64) -> Option<u64> {
        self.at.remove(&pts)
    }
}

/// The stamp of the picture `got` delivered: `None` when it delivered none (nothing is
/// presented), an error for a pts no unit was decoded with.
pub(crate) fn picture(
    got: &api::codec::ReceiveFrameReply,
    stamps: &mut Stamps,
) -> Result<Option<u64>, CliError> {
    if got.got == 0 {
        return Ok(None);
    }
    stamps.take(got.pts).map(Some).ok_or_else(|| {
        CliError::Usage(format!(
            "the decoder delivered pts {} that no unit was decoded with",
            got.pts
        ))
    })
}

/// Most pictures taken at once to reach the newest.
const MAX_CATCH_UP: u64 = 8;

/// Receives the pictures still waiting after `got` (`ready` waited before it was taken) into
/// `frame`, each replacing the one before; returns the newest and how many it replaced
/// (their stamps forgotten: they are never presented).
fn newest(
    p: &mut Pipe<'_>,
    (handle, frame): (HandleId, RegionId),
    mut got: api::codec::ReceiveFrameReply,
    ready: u64,
    stamps: &mut Stamps,
) -> Result<(api::codec::ReceiveFrameReply, u64), CliError> {
    let mut skipped = 0;
    for _ in 1..ready.min(MAX_CATCH_UP) {
        if got.got == 0 {
            break;
        }
        let t = p.run(&api::codec::ReceiveFrame { handle, frame })?;
        let next = p.result(t)?;
        if next.got == 0 {
            break;
        }
        stamps.take(got.pts);
        skipped += 1;
        got = next;
    }
    Ok((got, skipped))
}

/// The clip for a video scenario.
fn load_clip(o: &RunOpts, clip: Clip, (cw, ch): (u32, u32)) -> Result<Vec<Vec<u8>>, CliError> {
    let kind = if o.scenario == "video-360" {
        "equirect"
    } else {
        "flat"
    };
    let path = media::clip_of(clip, kind, cw, ch, o.fps)?;
    let units = media::load_units(&path)?;
    if units.is_empty() {
        return Err(CliError::Usage("the clip has no frames".into()));
    }
    Ok(units)
}

/// The regions a video scenario plays through: two bitstream slots, three decoded
/// pictures (and, for a 360-degree video, three projections of them), the UI overlay, and
/// one layer list per picture slot.
struct Surfaces {
    bits: Vec<RegionId>,
    frames: Vec<RegionId>,
    projected: Vec<RegionId>,
    ui: RegionId,
    lists: Vec<(RegionId, Vec<LayerRecord>)>,
}

/// Allocates the [`Surfaces`] for pictures of `cw` x `ch` on `screen`, bitstream units of at
/// most `max_unit` bytes; the UI drawn and the layer lists written.
fn surfaces(
    p: &mut Pipe<'_>,
    screen: (u32, u32),
    (cw, ch): (u32, u32),
    max_unit: u64,
    is360: bool,
) -> Result<Surfaces, CliError> {
    let conn = p.conn;
    let bits: Vec<RegionId> = (0..2)
        .map(|_| conn.alloc_blob(max_unit).map(|r| r.id))
        .collect::<Result<_, _>>()?;
    let frames = images(conn, 3, (cw, ch), Format::Nv12)?;
    // The projection renders the view at the screen's size.
    let projected: Vec<RegionId> = if is360 {
        images(conn, 3, screen, Format::Rgba8)?
    } else {
        Vec::new()
    };
    let ui = conn.alloc(0, screen.0, screen.1, Format::Rgba8, 0)?.id;
    p.cpu_write(ui, &ui_pixels(screen.0, screen.1))?;
    // One layer list per slot, written once: [video or projection, UI].
    let lists: Vec<(RegionId, Vec<LayerRecord>)> = (0..3)
        .map(|k| -> Result<_, CliError> {
            let base = if is360 {
                screen_layer(projected[k], screen, screen, false)
            } else {
                screen_layer(frames[k], (cw, ch), screen, false)
            };
            let records = vec![base, screen_layer(ui, screen, screen, true)];
            Ok((layer_blob(p, &records)?, records))
        })
        .collect::<Result<_, _>>()?;
    Ok(Surfaces {
        bits,
        frames,
        projected,
        ui,
        lists,
    })
}

pub(super) fn video(
    p: &mut Pipe<'_>,
    show: &mut Show,
    (o, clip): (&RunOpts, Clip),
    period: Duration,
    c: &mut Common,
) -> Result<(), CliError> {
    let (w, h) = (o.width, o.height);
    let screen = show.screen;
    let is360 = o.scenario == "video-360";
    let (cw, ch) = if is360 { (w, w / 2) } else { (w, h) };
    let units = load_clip(o, clip, (cw, ch))?;
    let max_unit = units.iter().map(Vec::len).max().unwrap_or(1) as u64;
    let Surfaces {
        bits,
        frames,
        projected,
        ui,
        lists,
    } = surfaces(p, screen, (cw, ch), max_unit, is360)?;
    let dec = p.run(&api::codec::OpenDecoder {
        kind: api::codec_kind::H264,
        format: Format::Nv12 as u64,
        threads: 0,
    })?;
    let handle = p.result(dec)?.handle;
    p.end_frame(0)?;
    // The decode still reading each bitstream slot: a slot is rewritten only after the codec
    // read it (fence ordering keeps decodes in flight).
    let mut decodes: Vec<Option<pipe::Ticket<api::codec::DecodeReply>>> = vec![None, None];
    let mut stamps = Stamps::default();
    c.start(p.conn)?; // setup (clip generation, allocation) is not part of the run
    let mut i = 0u64;
    while c.t0.elapsed().as_secs_f64() < o.seconds {
        let late = pace(c, p.conn, i, period)?;
        let unit = &units[(i as usize) % units.len()];
        let k = (i % 3) as usize;
        let slot = (i % 2) as usize;
        if let Some(t) = decodes[slot].take() {
            p.result(t)?;
        }
        stamps.written(i, now_ns());
        p.cpu_write(bits[slot], unit)?;
        decodes[slot] = Some(p.run(&api::codec::Decode {
            handle,
            bitstream: bits[slot],
            len: unit.len() as u64,
            pts: i,
        })?);
        let got = p.run(&api::codec::ReceiveFrame {
            handle,
            frame: frames[k],
        })?;
        // The picture must exist before anything presents it: wait for the decoder's answer.
        let got = p.result(got)?;
        // Pictures the decoder holds beyond this one (it fell behind, then caught up) are
        // older than the newest: take them all and show the newest, as a player's renderer
        // drops late pictures, so that a backlog does not add its length to every later
        // picture's latency. (The decode ran before the receive on the codec's queue: its
        // answer is there.)
        let ready = match decodes[slot].take() {
            Some(t) => p.result(t)?.frames_ready,
            None => 0,
        };
        let (got, skipped) = newest(p, (handle, frames[k]), got, ready, &mut stamps)?;
        c.late_drops += skipped;
        c.frames_in += 1;
        match picture(&got, &mut stamps)? {
            // The decoder held the picture back (frame threads, B-frame reordering).
            None => c.late_drops += 1,
            Some(_) if late => c.late_drops += 1,
            Some(decoded_at) => {
                if is360 {
                    let yaw = ((i as f64 * 0.02).sin() * 1e6) as i64;
                    p.run(&api::gpu::Project {
                        src: frames[k],
                        dst: projected[k],
                        yaw: yaw as u64,
                        pitch: 0,
                        fov: 1_200_000,
                    })?;
                }
                let video_layer = if is360 { projected[k] } else { frames[k] };
                let (blob, records) = &lists[k];
                show.show(
                    p,
                    (*blob, records),
                    (&[video_layer, ui], &[video_layer]),
                    decoded_at,
                )?;
            }
        }
        p.end_frame(if o.ordering == OrderingMode::Fence {
            2
        } else {
            0
        })?;
        i += 1;
    }
    for t in decodes.into_iter().flatten() {
        p.result(t)?;
    }
    let _ = p.run(&api::codec::Close { handle });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{picture, Stamps};
    use virtsoc_guest::devices::codec::ReceiveFrameReply;

    fn reply(got: u64, pts: u64) -> ReceiveFrameReply {
        ReceiveFrameReply {
            got,
            pts,
            ..ReceiveFrameReply::default()
        }
    }

    /// A decoder behind (frame threads) that also reorders (B-frames): each delivered picture
    /// is stamped with the time of its own unit, never with the time of the unit just
    /// written; before the first picture nothing is presented.
    #[test]
    fn a_picture_is_stamped_with_its_own_units_time() {
        let mut s = Stamps::default();
        // Units are fed in decode order with their index as pts (I0 P1 B2 B3 P4 B5 B6); the
        // decoder delivers them in display order (0 2 3 1 5 6 4), two units late.
        let order = [0u64, 2, 3, 1, 5, 6, 4];
        let lag = 2;
        for i in 0..(order.len() + lag) as u64 {
            s.written(i, 1000 * (i + 1));
            let delivered = (i as usize).checked_sub(lag).map(|k| order[k]);
            let got = match delivered {
                None => reply(0, 0),
                Some(pts) => reply(1, pts),
            };
            let stamp = picture(&got, &mut s).expect("a known pts");
            // Never the stamp of the unit just written (i): the picture's own unit's.
            assert_eq!(
                stamp,
                delivered.map(|pts| 1000 * (pts + 1)),
                "after unit {i}"
            );
        }
        // A pts no unit was decoded with is an error; a picture is stamped once.
        assert!(picture(&reply(1, 99), &mut s).is_err());
        s.written(7, 5);
        assert_eq!(picture(&reply(1, 7), &mut s).ok(), Some(Some(5)));
        assert!(picture(&reply(1, 7), &mut s).is_err());
    }

    #[test]
    fn old_stamps_are_forgotten() {
        let mut s = Stamps::default();
        let n = super::MAX_STAMPS as u64 + 10;
        for i in 0..n {
            s.written(i, i);
        }
        assert_eq!(s.take(0), None);
        assert_eq!(s.take(n - 1), Some(n - 1));
    }
}
