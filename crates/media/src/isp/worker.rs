//! libswscale in a worker process ([`crate::worker`]): [`ProcessIsp`] implements
//! [`IspBackend`] by sending each conversion to a sandboxed worker that runs a
//! [`SwscaleIsp`] ([`serve_isp`]), so a crash or a hang of libswscale fails that conversion
//! only: the worker is ended, the caller gets [`MediaError::Worker`] with the reason, and the
//! next conversion takes a fresh worker.
//!
//! **Buffers.** The parent makes both buffers of a conversion: a source it fills and a
//! destination the worker writes, each a sealed memfd ([`Buffer`]) kept for the next
//! conversion while it is large enough; a buffer's descriptor travels with the first call
//! that uses it. The worker never hands the parent a descriptor, so the parent maps nothing
//! the worker made and no worker can make it fault. A conversion therefore costs two copies
//! more than in process: the source's bytes into the shared source, the converted frame out
//! of the shared destination into the caller's.
//!
//! **Answers.** The worker answers with the destination layout it wrote and its byte count
//! (which must be exactly those of the call) or with an error (its kind and reason); anything
//! else, trailing bytes or descriptors included, ends the worker as if it had crashed.
//! Same-format, same-size conversions are plain copies in the parent (as [`SwscaleIsp`]
//! makes them) and reach no worker.

use std::collections::VecDeque;
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::sync::{Arc, Mutex};

use super::{IspBackend, SwscaleIsp};
use crate::error::{MediaError, Result};
use crate::frame::{copy_frame, FrameLayout, FrameMut, FrameRef};
use crate::worker::shared::Buffer;
use crate::worker::wire::{bad, In, Out, MAX_TEXT};
use crate::worker::{
    deadline_for, io_error, read_answer, serve, write_error, WorkerPool, WorkerProcess,
};

/// The argument a program's `main` takes to run [`serve_isp`] (`virtsocd --isp-worker`).
pub const ISP_WORKER_ARG: &str = "--isp-worker";

const CONVERT: u8 = b'C';
/// Flags of a call: the source, the destination buffer come with it.
const NEW_SRC: u8 = 1;
const NEW_DST: u8 = 2;

/// Largest call (it carries two layouts and flags; frames travel in buffers).
const MAX_CALL: usize = 64;
/// Largest answer: an error's reason and a little more.
const MAX_ANSWER: usize = MAX_TEXT as usize + 64;
/// Idle workers a [`ProcessIsp`] keeps for the next conversions (of all tenants together;
/// the least recently used goes beyond).
const MAX_IDLE: usize = 8;

/// Reads an answer to a conversion into `dst`: `Err` when it is malformed (the caller ends
/// the worker), else the conversion's own result.
fn parse_answer(a: &mut In, dst: &FrameLayout) -> Result<Result<()>> {
    let wrote = |a: &mut In| {
        let (layout, bytes) = (a.layout()?, a.u64()?);
        if layout != *dst || bytes != dst.size() as u64 {
            return Err(bad("a frame of another layout or size"));
        }
        Ok(())
    };
    read_answer(a, wrote, |why| {
        MediaError::Worker(format!("isp worker: {why}"))
    })
}

/// Parses `bytes` as a worker's answer to a conversion into `dst` (no descriptors), as
/// [`ProcessIsp`] does: for the fuzzer and the tests. Returns whether it was accepted
/// (a well-formed error answer is accepted).
#[doc(hidden)]
pub fn check_isp_answer(bytes: &[u8], dst: &FrameLayout) -> bool {
    parse_answer(&mut In::from_bytes(bytes.to_vec()), dst).is_ok()
}

/// One worker and the buffers it has mapped.
struct IspWorker {
    process: WorkerProcess,
    src: Option<Buffer>,
    dst: Option<Buffer>,
}

impl IspWorker {
    fn start(started: (Child, UnixStream)) -> Result<IspWorker> {
        let process = WorkerProcess::new(
            started,
            "isp-worker".into(),
            "swscale process",
            "the next conversion starts another",
            MediaError::Worker,
        )?;
        Ok(IspWorker {
            process,
            src: None,
            dst: None,
        })
    }

    fn convert(&mut self, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<()> {
        let (sn, dn) = (src.layout.size(), dst.layout.size());
        let mut fit = || -> Result<u8> {
            let mut flags = 0;
            if Buffer::fit(&mut self.src, sn)? {
                flags |= NEW_SRC;
            }
            if Buffer::fit(&mut self.dst, dn)? {
                flags |= NEW_DST;
            }
            Ok(flags)
        };
        let flags = match fit() {
            Ok(flags) => flags,
            Err(e) => {
                // A buffer made now but never sent must not pass for one the worker has:
                // the next call makes and sends both anew.
                (self.src, self.dst) = (None, None);
                return Err(e);
            }
        };
        let (Some(sbuf), Some(dbuf)) = (self.src.as_mut(), self.dst.as_ref()) else {
            return Err(MediaError::Resources("isp worker: no buffers".into()));
        };
        let from = src.data.get(..sn).ok_or_else(|| bad("source"))?;
        // Copy 1 of 2: the source into the buffer the worker reads.
        sbuf.bytes_mut()
            .get_mut(..sn)
            .ok_or_else(|| bad("source buffer"))?
            .copy_from_slice(from);
        let mut m = Out::default();
        m.u8(CONVERT)
            .layout(&src.layout)
            .layout(&dst.layout)
            .u8(flags);
        let mut fds = Vec::new();
        if flags & NEW_SRC != 0 {
            fds.push(sbuf.fd());
        }
        if flags & NEW_DST != 0 {
            fds.push(dbuf.fd());
        }
        let pixels = u64::from(src.layout.width) * u64::from(src.layout.height)
            + u64::from(dst.layout.width) * u64::from(dst.layout.height);
        self.process.set_deadline(deadline_for(pixels));
        let mut a = self.process.call(&m, &fds, MAX_ANSWER)?;
        match parse_answer(&mut a, &dst.layout) {
            Err(e) => Err(self.process.end(&e.to_string())),
            Ok(Err(e)) => Err(e),
            Ok(Ok(())) => {
                // Copy 2 of 2: the converted frame out of the buffer the worker wrote (a
                // worker writing it still garbles pixels, nothing else).
                let out = dbuf.bytes().get(..dn).ok_or_else(|| bad("frame buffer"))?;
                dst.data
                    .get_mut(..dn)
                    .ok_or_else(|| bad("destination"))?
                    .copy_from_slice(out);
                Ok(())
            }
        }
    }
}

/// The swscale ISP in sandboxed worker processes: each conversion runs in a worker that a
/// crash or a hang ends alone (see the module docs). A worker serves one tenant (guest,
/// [`IspBackend::convert_for`]) only: it is kept between that tenant's conversions, never
/// handed to another, so a guest whose frames took over a worker sees no other guest's
/// frames through it.
pub struct ProcessIsp {
    pool: Arc<WorkerPool>,
    /// Workers between conversions and whose they are, least recently used first.
    idle: Mutex<VecDeque<(u64, IspWorker)>>,
}

impl ProcessIsp {
    /// Converts in workers of `pool` (a program that runs [`serve_isp`]).
    pub fn new(pool: Arc<WorkerPool>) -> ProcessIsp {
        ProcessIsp {
            pool,
            idle: Mutex::default(),
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, IspWorker)>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The process ids of the workers waiting between conversions.
    pub fn idle_pids(&self) -> Vec<u32> {
        self.idle().iter().map(|(_, w)| w.process.pid()).collect()
    }

    /// A worker of `tenant`'s that is still running: an idle one, else a fresh one from the
    /// pool (started now when the one waiting there has died).
    fn worker(&self, tenant: u64) -> Result<IspWorker> {
        loop {
            let mut idle = self.idle();
            let Some(i) = idle.iter().rposition(|(t, _)| *t == tenant) else {
                break;
            };
            let Some((_, mut w)) = idle.remove(i) else {
                break;
            };
            drop(idle);
            if w.process.running() {
                return Ok(w);
            }
            log::warn!("{}", w.process.end("waiting"));
        }
        let mut w = IspWorker::start(self.pool.take()?)?;
        if !w.process.running() {
            log::warn!("{}", w.process.end("waiting"));
            w = IspWorker::start(self.pool.start()?)?;
        }
        Ok(w)
    }
}

impl IspBackend for ProcessIsp {
    fn name(&self) -> &str {
        "swscale-worker"
    }

    fn convert(&self, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<()> {
        self.convert_for(0, src, dst)
    }

    fn convert_for(&self, tenant: u64, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<()> {
        if super::same_picture(&src, &dst)? {
            // A copy needs no native code (as `SwscaleIsp` does it).
            return copy_frame(src, dst);
        }
        let mut w = self.worker(tenant)?;
        let r = w.convert(src, dst);
        if w.process.running() {
            let mut idle = self.idle();
            idle.push_back((tenant, w));
            // Beyond the bound, the least recently used goes (its worker ends on drop).
            while idle.len() > MAX_IDLE {
                idle.pop_front();
            }
        }
        r
    }

    fn forget(&self, tenant: u64) {
        let gone: VecDeque<_> = {
            let mut idle = self.idle();
            let (gone, kept) = idle.drain(..).partition(|(t, _)| *t == tenant);
            *idle = kept;
            gone
        };
        // Their workers end here, outside the lock.
        drop(gone);
    }
}

/// The worker's side: enters the sandbox, then converts with a [`SwscaleIsp`] on stdin (a
/// socket the parent passed) until the parent hangs up. Call it from the worker program's
/// `main` and exit.
pub fn serve_isp() -> Result<()> {
    serve_isp_with(&SwscaleIsp::new())
}

/// [`serve_isp`] with another backend (tests serve one that crashes or hangs on demand).
pub fn serve_isp_with(isp: &dyn IspBackend) -> Result<()> {
    let io = io_error("isp worker");
    let (mut src, mut dst): (Option<Buffer>, Option<Buffer>) = (None, None);
    serve("isp worker", MAX_CALL, |mut m, sock| {
        if m.u8()? != CONVERT {
            return Err(bad("unexpected call"));
        }
        let (sl, dl, flags) = (m.layout()?, m.layout()?, m.u8()?);
        let mut fds = std::mem::take(&mut m.fds).into_iter();
        let mut next = || fds.next().ok_or_else(|| bad("descriptor"));
        if flags & NEW_SRC != 0 {
            src = Some(Buffer::open(next()?, isize::MAX as usize, false)?);
        }
        if flags & NEW_DST != 0 {
            dst = Some(Buffer::open(next()?, isize::MAX as usize, true)?);
        }
        let r = match (src.as_ref(), dst.as_mut()) {
            (Some(s), Some(d)) => FrameRef::new(sl, s.bytes())
                .and_then(|s| Ok((s, FrameMut::new(dl, d.bytes_mut())?)))
                .map_err(MediaError::from)
                .and_then(|(s, d)| isp.convert(s, d)),
            _ => Err(MediaError::Unsupported("no buffers".into())),
        };
        let mut a = Out::default();
        match r {
            Ok(()) => {
                a.u8(0).layout(&dl).u64(dl.size() as u64);
            }
            Err(e) => write_error(a.u8(1), &e),
        }
        a.send(sock, &[]).map_err(&io)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::PixelFormat;

    fn layout() -> FrameLayout {
        FrameLayout::packed(PixelFormat::Rgba8, 16, 8).unwrap()
    }

    fn ok_answer(l: &FrameLayout, bytes: u64) -> Vec<u8> {
        let mut a = Out::default();
        a.u8(0).layout(l).u64(bytes);
        a.0
    }

    #[test]
    fn a_well_formed_answer_is_read() {
        let l = layout();
        let r = parse_answer(&mut In::from_bytes(ok_answer(&l, l.size() as u64)), &l);
        assert!(matches!(r, Ok(Ok(()))));
        let mut a = Out::default();
        write_error(
            a.u8(1),
            &MediaError::Unsupported("no such conversion".into()),
        );
        let r = parse_answer(&mut In::from_bytes(a.0), &l);
        assert!(matches!(r, Ok(Err(MediaError::Unsupported(m))) if m == "no such conversion"));
    }

    #[test]
    fn hostile_answers_are_refused_without_panicking() {
        let l = layout();
        let good = ok_answer(&l, l.size() as u64);
        assert!(check_isp_answer(&good, &l));
        // Another size, another layout, another byte count, trailing bytes.
        let other = FrameLayout::packed(PixelFormat::Rgba8, 16, 10).unwrap();
        assert!(!check_isp_answer(
            &ok_answer(&other, other.size() as u64),
            &l
        ));
        assert!(!check_isp_answer(&ok_answer(&l, other.size() as u64), &l));
        assert!(!check_isp_answer(&ok_answer(&l, l.size() as u64 - 1), &l));
        let strided = FrameLayout::with_stride(PixelFormat::Rgba8, 16, 8, 128).unwrap();
        assert!(!check_isp_answer(&ok_answer(&strided, l.size() as u64), &l));
        let mut long = good.clone();
        long.push(0);
        assert!(!check_isp_answer(&long, &l));
        // Every truncation, and a stream of corruptions.
        for n in 0..good.len() {
            assert!(!check_isp_answer(&good[..n], &l), "truncated to {n}");
        }
        for (i, bad) in crate::worker::wire::corruptions(&good, 20_000) {
            // (A first byte of 1 can make a well-formed error answer of the rest.)
            if bad != good && i != 0 {
                assert!(!check_isp_answer(&bad, &l), "corrupted at {i}");
            }
        }
        // An unknown error kind, an overlong reason.
        let mut a = Out::default();
        a.u8(1).u8(9).text("x");
        assert!(!check_isp_answer(&a.0, &l));
        let mut a = Out::default();
        a.u8(1).u8(2).u32(MAX_TEXT + 1);
        a.0.extend(std::iter::repeat(b'a').take(MAX_TEXT as usize + 1));
        assert!(!check_isp_answer(&a.0, &l));
    }
}
