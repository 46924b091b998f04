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
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Charge, Charger, IspBackend, SwscaleIsp};
use crate::error::{MediaError, Result};
use crate::frame::{copy_frame, FrameLayout, FrameMut, FrameRef};
use crate::worker::shared::Buffer;
use crate::worker::wire::{bad, In, Out, MAX_TEXT};
use crate::worker::{
    deadline_for, io_error, read_answer, serve, write_error, WorkerPool, WorkerProcess,
    WORKER_RESIDENT,
};
use virtsoc_sync::{CondvarExt, LockExt};

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

/// One worker, the buffers it has mapped, and the charge for them while it is kept.
struct IspWorker {
    process: WorkerProcess,
    src: Option<Buffer>,
    dst: Option<Buffer>,
    /// What it holds, charged to its tenant ([`IspBackend::convert_charged`]).
    charge: Option<Charge>,
    /// The bytes of `charge`.
    charged: u64,
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
            charge: None,
            charged: 0,
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
///
/// **Memory and reaping.** A kept worker holds its process ([`WORKER_RESIDENT`]) and its two
/// buffers; with [`IspBackend::convert_charged`] that much is charged to its tenant for as
/// long as the worker is kept (the charge travels with the worker and goes when it ends).
/// A worker left idle for the idle timeout ([`IDLE_TIMEOUT`] by default) is ended by a
/// reaper thread that sleeps until the oldest idle worker's time is up (no polling), so
/// neither processes nor charges outlive a tenant's use of the ISP.
pub struct ProcessIsp {
    pool: Arc<WorkerPool>,
    idle: Arc<IdleSet>,
}

/// How long a worker may wait between its tenant's conversions before it is ended.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A kept worker: whose it is and since when it waits.
struct Kept {
    tenant: u64,
    since: Instant,
    worker: IspWorker,
}

/// The workers waiting between conversions, least recently used first, and the reaper's
/// wake-up.
struct IdleSet {
    kept: Mutex<IdleState>,
    changed: Condvar,
    timeout: Duration,
}

#[derive(Default)]
struct IdleState {
    workers: VecDeque<Kept>,
    /// The backend is gone: the reaper ends.
    closed: bool,
    /// A reaper thread is running.
    reaper: bool,
}

impl IdleSet {
    fn lock(&self) -> std::sync::MutexGuard<'_, IdleState> {
        self.kept.lock_or_recover()
    }

    /// Ends the workers whose idle time is up; sleeps until the next one's is, or until a
    /// worker is kept or the backend goes. Runs on the reaper thread.
    fn reap(&self) {
        let mut st = self.lock();
        loop {
            if st.closed {
                break;
            }
            let now = Instant::now();
            let mut ended = Vec::new();
            while st
                .workers
                .front()
                .is_some_and(|k| now.duration_since(k.since) >= self.timeout)
            {
                ended.extend(st.workers.pop_front());
            }
            if !ended.is_empty() {
                // Their processes end (and their charges go) outside the lock.
                drop(st);
                drop(ended);
                st = self.lock();
                continue;
            }
            let Some(next) = st.workers.front().map(|k| k.since + self.timeout) else {
                // Nothing kept: the thread ends; the next kept worker starts another.
                st.reaper = false;
                break;
            };
            let wait = next.saturating_duration_since(now);
            st = self.changed.wait_timeout_or_recover(st, wait).0;
        }
    }
}

impl ProcessIsp {
    /// Converts in workers of `pool` (a program that runs [`serve_isp`]).
    pub fn new(pool: Arc<WorkerPool>) -> ProcessIsp {
        Self::with_idle_timeout(pool, IDLE_TIMEOUT)
    }

    /// [`new`](Self::new) with workers ended after `timeout` without a conversion.
    pub fn with_idle_timeout(pool: Arc<WorkerPool>, timeout: Duration) -> ProcessIsp {
        ProcessIsp {
            pool,
            idle: Arc::new(IdleSet {
                kept: Mutex::default(),
                changed: Condvar::new(),
                timeout,
            }),
        }
    }

    /// The process ids of the workers waiting between conversions.
    pub fn idle_pids(&self) -> Vec<u32> {
        self.idle
            .lock()
            .workers
            .iter()
            .map(|k| k.worker.process.pid())
            .collect()
    }

    /// A worker of `tenant`'s that is still running: an idle one, else a fresh one from the
    /// pool (started now when the one waiting there has died).
    fn worker(&self, tenant: u64) -> Result<IspWorker> {
        loop {
            let mut st = self.idle.lock();
            let Some(i) = st.workers.iter().rposition(|k| k.tenant == tenant) else {
                break;
            };
            let Some(k) = st.workers.remove(i) else {
                break;
            };
            drop(st);
            let mut w = k.worker;
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

    /// Keeps `w` for `tenant`'s next conversion (the least recently used beyond
    /// [`MAX_IDLE`] ends), with a reaper thread running to end it when idle too long.
    fn keep(&self, tenant: u64, worker: IspWorker) {
        let mut st = self.idle.lock();
        st.workers.push_back(Kept {
            tenant,
            since: Instant::now(),
            worker,
        });
        let mut over = Vec::new();
        while st.workers.len() > MAX_IDLE {
            over.extend(st.workers.pop_front());
        }
        if !st.reaper {
            let idle = self.idle.clone();
            let started = std::thread::Builder::new()
                .name("isp-reaper".into())
                .spawn(move || idle.reap());
            // Without a thread now, the next kept worker tries again.
            st.reaper = started.is_ok();
        }
        drop(st);
        self.idle.changed.notify_all();
        // Their workers end here, outside the lock.
        drop(over);
    }
}

impl Drop for ProcessIsp {
    fn drop(&mut self) {
        let kept = {
            let mut st = self.idle.lock();
            st.closed = true;
            std::mem::take(&mut st.workers)
        };
        self.idle.changed.notify_all();
        drop(kept);
    }
}

/// What a worker keeps between conversions of `src` and `dst` bytes: its process and its
/// two buffers as [`Buffer::fit`] will size them.
fn kept_bytes(w: &IspWorker, src: usize, dst: usize) -> u64 {
    let fit = |b: &Option<Buffer>, n: usize| match b {
        Some(b) if b.len() >= n && b.len() / 4 <= n => b.len(),
        _ => n.max(1),
    };
    WORKER_RESIDENT + fit(&w.src, src) as u64 + fit(&w.dst, dst) as u64
}

impl IspBackend for ProcessIsp {
    fn name(&self) -> &str {
        "swscale-worker"
    }

    fn convert(&self, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<()> {
        self.convert_for(0, src, dst)
    }

    fn convert_for(&self, tenant: u64, src: FrameRef<'_>, dst: FrameMut<'_>) -> Result<()> {
        self.convert_charged(tenant, src, dst, &|_| Ok(Box::new(())))
    }

    fn convert_charged(
        &self,
        tenant: u64,
        src: FrameRef<'_>,
        dst: FrameMut<'_>,
        charge: Charger<'_>,
    ) -> Result<()> {
        if super::same_picture(&src, &dst)? {
            // A copy needs no native code (as `SwscaleIsp` does it).
            return copy_frame(src, dst);
        }
        let mut w = self.worker(tenant)?;
        let need = kept_bytes(&w, src.layout.size(), dst.layout.size());
        if need != w.charged {
            // The old charge goes first, so the two never count at once.
            w.charge = None;
            w.charged = 0;
            match charge(need) {
                Ok(c) => (w.charge, w.charged) = (Some(c), need),
                // Nothing is kept: the worker ends here, and with it its buffers.
                Err(why) => {
                    return Err(MediaError::OverLimit(format!(
                        "an isp worker with its buffers ({} MiB): {why}",
                        need >> 20
                    )))
                }
            }
        }
        let r = w.convert(src, dst);
        if w.process.running() {
            self.keep(tenant, w);
        }
        r
    }

    fn forget(&self, tenant: u64) {
        let gone: VecDeque<_> = {
            let mut st = self.idle.lock();
            let (gone, kept) = std::mem::take(&mut st.workers)
                .into_iter()
                .partition(|k| k.tenant == tenant);
            st.workers = kept;
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
    serve("isp worker", MAX_CALL, In::recv, |mut m, sock| {
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
