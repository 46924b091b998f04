//! Idle decoders give their worker back: a decoder no command has touched for
//! [`Limits::codec_idle_reap`](crate::Limits::codec_idle_reap) (default 120 s), with no
//! picture waiting for `receive_frame` and no packet in its worker, has its backend (the
//! worker process, or libavcodec's threads in process) closed, its codec threads returned to
//! the guest's share and the daemon's capacity, and its worker's memory uncharged from the
//! guest. The session keeps its handle and what it told the guest (sizes, size changes,
//! unreported failures). The next `decode` on it opens a new backend from the command that
//! opened it, under the same quotas as a new session (`Busy` with the reason when the
//! capacity is gone meanwhile), so decoding resumes at the next key frame the guest sends,
//! as after a migration ([`super::replay`]): a stream resumed after minutes of pause loses
//! the frames up to its next key frame (a player that seeks, as most do on resume, loses
//! nothing).
//!
//! The reaper is a thread of the codec device that sleeps until the oldest idle decoder's
//! time is up (no polling) and ends when no decoder is open; it holds the device's state
//! only while it reaps. Encoders are not reaped: an encoder's buffered frames and rate control
//! cannot be restarted without the guest noticing.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use virtsoc_ids::{GuestId, HandleId};
use virtsoc_media::{
    CodecKind, DecoderBackend, FfmpegDecoder, MediaError, NullDecoder, PixelFormat, ProcessDecoder,
};
use virtsoc_proto::wire::Format;
use virtsoc_proto::Status;

use super::state::{Session, State};
use super::{codec_of, replay, Codec, DeviceCtx};
use virtsoc_sync::LockExt;

impl Codec {
    /// A decoder backend of `kind` writing `out` with `threads` decoding threads: in a worker
    /// process of the pool, or in the daemon's process without one.
    pub(super) fn new_decoder(
        &self,
        kind: CodecKind,
        out: PixelFormat,
        threads: usize,
    ) -> Result<Box<dyn DecoderBackend>, MediaError> {
        match &self.workers {
            Some(pool) => ProcessDecoder::open(pool, kind, out, threads).map(|d| Box::new(d) as _),
            None => FfmpegDecoder::new(kind, out, threads).map(|d| Box::new(d) as _),
        }
    }

    /// Opens a new backend for `cx`'s decoder `handle` if the reaper closed its old one; a
    /// decoder not reaped (or no decoder: the caller answers that) is left as it is.
    ///
    /// The codec's state is not held while the worker starts (until stop 52 it was, and
    /// every other guest's codec commands waited for that start): its codec threads are
    /// taken first, under the lock (the session counted open again, a placeholder for its
    /// backend, marked used now so that the reaper leaves it), and given back if the open
    /// fails. The guest's own queue is held until the answer, so nothing of its own uses
    /// the decoder meanwhile; a session closed meanwhile (the guest gone) drops the new
    /// backend.
    pub(super) fn revive(&self, cx: &DeviceCtx<'_>, handle: HandleId) -> Result<(), Status> {
        let key = (cx.guest, handle);
        let (kind, out, threads) = {
            let mut st = self.state();
            let Some(o) = st.sessions.get(&key) else {
                return Ok(());
            };
            let (replay::Opened::Decoder { kind, .. }, true) = (o.record, o.reaped) else {
                return Ok(());
            };
            let (threads, Session::Decoder(d)) = (o.threads, &o.session) else {
                return Ok(());
            };
            let out = match d.format {
                Format::Nv12 => PixelFormat::Nv12,
                _ => PixelFormat::Yuv420p,
            };
            let limits = self.limits_for(Some(cx));
            let mine = st.guest_threads(cx.guest);
            if mine + threads > limits.codec_threads_per_guest
                || st.threads + threads > limits.codec_threads
            {
                let why = format!(
                    "decoder {handle} was closed after {:?} idle and its {threads} codec \
                     threads are not free now ({} of {} in use): retry later",
                    limits.codec_idle_reap, st.threads, limits.codec_threads
                );
                return Err(cx.fail(Status::Busy, why));
            }
            let o = st.sessions.get_mut(&key).ok_or(Status::Internal)?;
            o.reaped = false;
            o.last_used = Instant::now();
            st.threads += threads;
            (kind, out, threads)
        };
        let opened = (|| {
            let charge = self.worker_charge(cx, "the reopened decoder")?;
            let kind = codec_of(kind).ok_or(Status::Internal)?;
            let mut backend = self.new_decoder(kind, out, threads).map_err(|e| {
                let why = format!("cannot reopen the {} decoder: {e}", kind.name());
                cx.fail(super::status_of(&e), why)
            })?;
            backend.hold_pictures(true);
            Ok((backend, charge))
        })();
        let mut st = self.state();
        let Some(o) = st.sessions.get_mut(&key) else {
            // Closed meanwhile: its threads went back with it; the backend is dropped.
            return Err(Status::BadArgument);
        };
        if o.reaped {
            // Reaped again meanwhile (an idle limit shorter than a worker's start): its
            // threads went back then.
            let why = format!("decoder {handle} was closed idle again while it reopened");
            return Err(cx.fail(Status::Busy, why));
        }
        let (backend, charge) = match opened {
            Ok(x) => x,
            Err(e) => {
                o.reaped = true;
                st.threads -= threads;
                return Err(e);
            }
        };
        if let Session::Decoder(d) = &mut o.session {
            d.decoder = backend;
        }
        o.charge = charge;
        log::info!(
            "codec: guest {} decoder {handle} reopened after it was closed idle; decoding \
             resumes at the next key frame",
            cx.guest
        );
        Ok(())
    }

    /// Whether `guest`'s decoder `handle` was reaped (its next decode opens a new backend).
    pub(super) fn reaped(&self, guest: GuestId, handle: HandleId) -> bool {
        self.state()
            .sessions
            .get(&(guest, handle))
            .is_some_and(|o| o.reaped)
    }

    /// Starts the reaper if none runs (with the state locked, after a decoder opened).
    pub(super) fn ensure_reaper(&self, st: &mut State) {
        let idle = self.limits.codec_idle_reap;
        if st.reaper || idle.is_zero() {
            return;
        }
        let state = Arc::downgrade(&self.state);
        let spawned = std::thread::Builder::new()
            .name("codec-reaper".into())
            .spawn(move || reaper(state, idle));
        match spawned {
            Ok(_) => st.reaper = true,
            Err(e) => log::warn!("codec: no reaper thread ({e}): idle decoders stay open"),
        }
    }
}

/// The reaper thread: reaps, then sleeps until the next decoder's idle time is up; ends with
/// the device or when no decoder is open.
fn reaper(state: Weak<Mutex<State>>, idle: Duration) {
    loop {
        let next = {
            let Some(state) = state.upgrade() else { return };
            let mut st = state.lock_or_recover();
            let now = Instant::now();
            // (No cutoff before the clock has run `idle`: nothing can have idled that long.)
            let closed = match now.checked_sub(idle) {
                Some(cutoff) => st.reap_idle(cutoff, idle),
                None => Vec::new(),
            };
            let next = st.next_reap(now, idle);
            if next.is_none() {
                st.reaper = false;
            }
            drop(st);
            // Closed outside the lock: a worker's exit, frame threads joined.
            drop(closed);
            next
        };
        match next {
            Some(at) => std::thread::sleep(at.saturating_duration_since(Instant::now())),
            None => return,
        }
    }
}

impl State {
    /// Closes the backends of the decoders last used at `cutoff` or before that have nothing
    /// pending (no picture waiting, no packet in the worker) and returns them, to be dropped
    /// outside the lock; `idle` is only for the log. Pictures lent as replicas stay valid,
    /// as when the guest closes a decoder: they hold their own mapping of the worker's
    /// buffers.
    pub(super) fn reap_idle(
        &mut self,
        cutoff: Instant,
        idle: Duration,
    ) -> Vec<Box<dyn DecoderBackend>> {
        let mut closed = Vec::new();
        let mut freed = 0;
        for ((guest, handle), o) in self.sessions.iter_mut() {
            let Session::Decoder(d) = &mut o.session else {
                continue;
            };
            if o.reaped || o.last_used > cutoff || !d.ready.is_empty() || d.decoder.in_flight() > 0
            {
                continue;
            }
            closed.push(std::mem::replace(
                &mut d.decoder,
                Box::new(NullDecoder::discarding()),
            ));
            o.reaped = true;
            o.charge = None;
            freed += o.threads;
            log::info!("codec: guest {guest} decoder {handle} idle for {idle:?}: its backend is closed until the next decode");
        }
        self.threads -= freed;
        closed
    }

    /// When the reaper looks next: the earliest time an open decoder's idle time is up
    /// (one whose time is up but that had something pending: `idle` after `now`); `None`
    /// when no decoder is open and not reaped.
    pub(super) fn next_reap(&self, now: Instant, idle: Duration) -> Option<Instant> {
        self.sessions
            .values()
            .filter(|o| !o.reaped && matches!(o.session, Session::Decoder(_)))
            .map(|o| match o.last_used + idle {
                due if due > now => due,
                _ => now + idle,
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::super::DeviceConfig;
    use super::*;
    use crate::Limits;
    use virtsoc_devapi::codec as api;
    use virtsoc_devapi::codec_kind;
    use virtsoc_media::{DecodedFrame, FrameLayout};
    use virtsoc_svm::GuestId;

    fn open(codec: &Codec, cx: &DeviceCtx<'_>, threads: u64) -> Result<u64, Status> {
        let c = api::OpenDecoder {
            kind: codec_kind::H264,
            format: Format::Nv12 as u64,
            threads,
        };
        codec.open_decoder_for(cx, c).map(|v| v[0])
    }

    fn backend(codec: &Codec, guest: u64, h: u64) -> String {
        let mut st = codec.state();
        let d = st.decoder(GuestId(guest), HandleId(h)).unwrap();
        d.decoder.name().to_string()
    }

    /// An idle decoder's backend is closed and its threads freed; its next use reopens it
    /// under the quotas of a new session (`Busy` when another session took its threads).
    #[test]
    fn an_idle_decoder_is_closed_and_reopened_by_its_next_decode() {
        let limits = Limits {
            codec_threads: 3,
            ..Limits::default()
        };
        let codec = Codec::new(&DeviceConfig::default())
            .unwrap()
            .with_limits(&limits);
        let core = crate::testkit::Core::new();
        let cx = DeviceCtx::new(
            GuestId(1),
            &core.svm,
            virtsoc_svm::DomainId(0),
            core.session.fences(),
        );
        let idle = open(&codec, &cx, 2).unwrap();
        let busy = open(&codec, &cx, 1).unwrap();
        let pic = FrameLayout::packed(PixelFormat::Nv12, 16, 16).unwrap();
        codec
            .state()
            .decoder(GuestId(1), HandleId(busy))
            .unwrap()
            .queue(vec![DecodedFrame::packed(pic, 0, vec![0; pic.size()])]);
        assert_eq!(
            open(&codec, &cx, 1),
            Err(Status::Busy),
            "3 of 3 threads held"
        );

        let closed = codec.state().reap_idle(Instant::now(), Duration::ZERO);
        assert_eq!(
            closed.len(),
            1,
            "the decoder with a picture waiting stays open"
        );
        drop(closed);
        assert_eq!(backend(&codec, 1, idle), "null");
        assert!(backend(&codec, 1, busy).starts_with("ffmpeg"));
        assert_eq!(
            codec.state().threads,
            1,
            "the closed decoder's 2 threads are free"
        );
        assert!(
            codec
                .state()
                .reap_idle(Instant::now(), Duration::ZERO)
                .is_empty(),
            "once"
        );

        // Reopened by its next decode.
        codec.revive(&cx, HandleId(idle)).unwrap();
        assert!(backend(&codec, 1, idle).starts_with("ffmpeg"));
        assert_eq!(codec.state().threads, 3);

        // Closed again; another session takes the threads; the reopen is refused.
        drop(codec.state().reap_idle(Instant::now(), Duration::ZERO));
        let taker = open(&codec, &cx, 2).unwrap();
        let refused = codec.revive(&cx, HandleId(idle));
        assert_eq!(refused, Err(Status::Busy));
        assert!(cx.take_reason().is_some_and(|r| r.contains("closed after")));
        assert_eq!(
            codec.close(
                GuestId(1),
                api::Close {
                    handle: HandleId(taker)
                }
            ),
            Ok([0; 6])
        );
        codec.revive(&cx, HandleId(idle)).unwrap();
        // Closing a closed decoder frees nothing twice.
        drop(codec.state().reap_idle(Instant::now(), Duration::ZERO));
        assert_eq!(
            codec.close(
                GuestId(1),
                api::Close {
                    handle: HandleId(idle)
                }
            ),
            Ok([0; 6])
        );
        assert_eq!(codec.state().threads, 1);
    }

    /// The reaper wakes when the oldest open decoder's idle time is up, and ends when none is
    /// open.
    #[test]
    fn the_reaper_sleeps_until_the_next_decoder_is_due() {
        let codec = Codec::new(&DeviceConfig::default()).unwrap();
        let core = crate::testkit::Core::new();
        let cx = DeviceCtx::new(
            GuestId(2),
            &core.svm,
            virtsoc_svm::DomainId(0),
            core.session.fences(),
        );
        let now = Instant::now();
        let idle = Duration::from_secs(60);
        assert_eq!(codec.state().next_reap(now, idle), None);
        let h = open(&codec, &cx, 1).unwrap();
        let due = codec.state().next_reap(now, idle).unwrap();
        assert!(due >= now + idle && due <= Instant::now() + idle);
        assert!(
            codec.state().reaper,
            "a reaper runs while a decoder is open"
        );
        drop(codec.state().reap_idle(Instant::now(), idle));
        assert_eq!(
            codec.state().next_reap(now, idle),
            None,
            "nothing left to reap"
        );
        assert_eq!(
            codec.close(
                GuestId(2),
                api::Close {
                    handle: HandleId(h)
                }
            ),
            Ok([0; 6])
        );
    }
}
