//! The victim guest's workloads in `virtsoc bench isolation`: its SVM pipeline, its decoder
//! and its camera scenario (see the module above for how each is compared alone and next to
//! a hostile guest).

use std::time::{Duration, Instant};

use virtsoc_guest::devices as api;
use virtsoc_guest::{testdev, AccessMode, Connection, DeviceCommand, DeviceId, Format, RegionId};

use super::hostile::open;
use super::SVM_SIZE;
use crate::bench_svm::OrderingMode;
use crate::scenario::pipe::{check_completion, Pipe};
use crate::scenario::{self, media, show::Composition, RunOpts};
use crate::CliError;
use virtsoc_devapi::HandleId;

/// The victim's SVM pipeline, `virtsoc bench svm`'s (prefetch protocol, atomic ordering, one
/// reader, 2 ms of slack, 4 buffers of [`SVM_SIZE`]), on one connection kept for a whole
/// row: its alone and next-to measurements then differ only by the hostile guest. (With a
/// fresh connection, ring and predictor per measurement, the p50 alone moved by 2x from one
/// measurement to the next.)
pub(super) struct SvmVictim {
    conn: Connection,
    ring: Vec<RegionId>,
    frame: u64,
}

impl SvmVictim {
    /// Frames run (not measured) after connecting: the predictor learns the flow.
    const WARMUP: usize = 20;
    /// The producer's write to the consumer's read.
    const SLACK: Duration = Duration::from_millis(2);

    pub(super) fn open(target: &str) -> Result<SvmVictim, CliError> {
        let conn = open(target, "victim-svm", 8 * SVM_SIZE + (64 << 20), "prefetch")?;
        let ring = (0..4)
            .map(|_| conn.alloc_blob(SVM_SIZE).map(|r| r.id))
            .collect::<Result<_, _>>()?;
        let mut v = SvmVictim {
            conn,
            ring,
            frame: 0,
        };
        v.measure(Self::WARMUP)?;
        Ok(v)
    }

    /// Runs `frames` frames: (the consumer's begin_access times on the host in us, frames
    /// whose read checksum differed from the written one).
    pub(super) fn measure(&mut self, frames: usize) -> Result<(Vec<f64>, usize), CliError> {
        let (c, size) = (&self.conn, SVM_SIZE);
        let (w, r) = (AccessMode::Write, AccessMode::Read);
        let mut us = Vec::with_capacity(frames);
        let mut corrupt = 0;
        for _ in 0..frames {
            let id = self.ring[self.frame as usize % self.ring.len()];
            c.begin_access(id, DeviceId::PRODUCER, 0, size, w)?;
            let crc_w = c.device_cmd(
                DeviceId::PRODUCER,
                [testdev::WRITE_PATTERN, u64::from(id), self.frame, 0, 0, 0],
            )?[0];
            c.end_access(id, DeviceId::PRODUCER, 0, size, w)?;
            std::thread::sleep(Self::SLACK);
            let b = c.begin_access(id, DeviceId::CONSUMER, 0, size, r)?;
            us.push(b.host_elapsed.as_secs_f64() * 1e6);
            let crc_r = c.device_cmd(
                DeviceId::CONSUMER,
                [testdev::CHECKSUM, u64::from(id), 0, 0, 0, 0],
            )?[0];
            corrupt += usize::from(crc_r != crc_w);
            c.end_access(id, DeviceId::CONSUMER, 0, size, r)?;
            self.frame += 1;
        }
        Ok((us, corrupt))
    }
}

/// The camera scenario at 720p, 30 fps: presented frames per second.
pub(super) fn camera(target: &str, pid: Option<u32>, seconds: f64) -> Result<f64, CliError> {
    let r = scenario::run(
        target,
        pid,
        &RunOpts {
            scenario: "camera".into(),
            protocol: "prefetch".into(),
            ordering: OrderingMode::Fence,
            seconds,
            width: 1280,
            height: 720,
            fps: 30,
            composition: Composition::Planes,
            pacing: crate::scenario::Pacing::default(),
        },
    )?;
    Ok(r.presented_fps)
}

/// The victim's decoder: the cheap 640x360 clip (`virtsoc bench sharing`'s smallest codec
/// guest's), one picture at a time on a decoder of one thread (so each decode gives its
/// picture at once), each access unit in a bitstream region of its own written before the
/// row, every picture received into one NV12 region; on one connection and one decoder kept
/// for the whole row, as the SVM pipeline's.
pub(super) struct CodecVictim {
    conn: Connection,
    handle: HandleId,
    bits: Vec<(RegionId, u64)>,
    frame: RegionId,
    /// The next access unit (the clip loops: it starts with an IDR picture).
    next: usize,
}

impl CodecVictim {
    /// The picture size.
    const SIZE: (u32, u32) = (640, 360);
    /// Pictures decoded (not measured) after opening.
    const WARMUP: usize = 10;

    pub(super) fn open(target: &str) -> Result<CodecVictim, CliError> {
        let (w, h) = Self::SIZE;
        let units = units_of(&media::clip("flat", w, h, 30, 2)?)?;
        let window = u64::from(w) * u64::from(h) * 2 + bytes_of(&units) + (16 << 20);
        let conn = open(target, "victim-codec", window, "prefetch")?;
        let bits = bitstreams(&conn, &units)?;
        let frame = conn.alloc(0, w, h, Format::Nv12, 0)?.id;
        let handle = open_decoder(&conn, 1)?;
        let mut v = CodecVictim {
            conn,
            handle,
            bits,
            frame,
            next: 0,
        };
        v.measure(Self::WARMUP)?;
        Ok(v)
    }

    /// Decodes `pictures` pictures one after the other: each one's time from its decode's
    /// submission to its `receive_frame`'s answer, in ms.
    pub(super) fn measure(&mut self, pictures: usize) -> Result<Vec<f64>, CliError> {
        let c = &self.conn;
        let mut ms = Vec::with_capacity(pictures);
        for _ in 0..pictures {
            let (bitstream, len) = self.bits[self.next % self.bits.len()];
            let decode = api::codec::Decode {
                handle: self.handle,
                bitstream,
                len,
                pts: self.next as u64,
            };
            let receive = api::codec::ReceiveFrame {
                handle: self.handle,
                frame: self.frame,
            };
            let t0 = Instant::now();
            let d = c.submit_with_access(&decode)?;
            let r = c.submit_with_access(&receive)?;
            check_completion(&c.wait(d)?, "decode")?;
            let got = c.wait(r)?;
            ms.push(t0.elapsed().as_secs_f64() * 1e3);
            check_completion(&got, "receive_frame")?;
            if api::codec::ReceiveFrame::reply(&got.values).got == 0 {
                return Err(CliError::Usage(format!(
                    "the victim's decoder gave no picture for access unit {}",
                    self.next
                )));
            }
            self.next += 1;
        }
        Ok(ms)
    }
}

/// The access units of the clip at `path` (an error when there are none).
pub(super) fn units_of(path: &std::path::Path) -> Result<Vec<Vec<u8>>, CliError> {
    let units = media::load_units(path)?;
    if units.is_empty() {
        return Err(CliError::Usage(format!(
            "no access units in {}",
            path.display()
        )));
    }
    Ok(units)
}

/// The bytes of `units` together.
pub(super) fn bytes_of(units: &[Vec<u8>]) -> u64 {
    units.iter().map(|u| u.len() as u64).sum()
}

/// Each of `units` written into a bitstream region of its own on `conn`: (region, length).
pub(super) fn bitstreams(
    conn: &Connection,
    units: &[Vec<u8>],
) -> Result<Vec<(RegionId, u64)>, CliError> {
    let p = Pipe::new(conn, OrderingMode::Atomic);
    let mut bits = Vec::with_capacity(units.len());
    for u in units {
        let id = conn.alloc_blob(u.len().max(1) as u64)?.id;
        p.cpu_write(id, u)?;
        bits.push((id, u.len() as u64));
    }
    Ok(bits)
}

/// An H.264 decoder into NV12 with `threads` threads (0: the daemon's default) on `conn`.
pub(super) fn open_decoder(conn: &Connection, threads: u64) -> Result<HandleId, CliError> {
    let open = api::codec::OpenDecoder {
        kind: api::codec_kind::H264,
        format: Format::Nv12 as u64,
        threads,
    };
    Ok(conn.command(&open)?.handle)
}

impl Drop for CodecVictim {
    fn drop(&mut self) {
        let _ = self.conn.command(&api::codec::Close {
            handle: self.handle,
        });
    }
}
