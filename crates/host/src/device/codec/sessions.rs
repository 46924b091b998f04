//! The codec's session thread: `open_decoder`, `open_encoder` and `close` of a guest that is
//! not alone on the codec, with decoders and encoders in worker processes, and the `decode`
//! that reopens a decoder the reaper closed (`reap.rs`; until stop 52 on the codec's thread),
//! run on a thread of their own, so that a worker's start and end hold no other guest's
//! commands. Opening
//! takes a worker from the pool and waits for its answer to the open call (a worker taken
//! just after it was started first loads its libraries and enters the sandbox, and a guest
//! that opens and closes sessions back to back takes every spare worker as it starts);
//! closing kills the worker and reaps it. Until stop 51 these ran on the codec's thread:
//! next to a guest doing nothing else (`bench isolation --hostile session-churn`), a
//! victim's 640x360 pictures took 13.5-15.1 ms at the median and 46-51 ms at p99 against
//! 0.6-0.8 / 1.3-2.2 ms alone; on this thread, 1.0-1.3 / 6.7-8.1 ms (`docs/results.md`,
//! stop 51).
//!
//! The thread runs one command at a time, in the order handed over: one guest's opens can
//! delay another guest's open or close, never its other commands. The session table stays
//! the codec's (`state.rs`): an open admits its session against the quotas before it
//! starts the worker and again when it adds it (`State::open`), so opens running beside
//! other guests' commands never pass a quota. A guest alone on the codec, and decoders in
//! the daemon's process, run these commands on the codec's thread as before; the guest's own
//! queue stays held until the answer either way.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use virtsoc_devapi::codec::Command;
use virtsoc_sync::LockExt;

use super::wait::Deferred;
use super::Codec;
use crate::device::{DeviceCtx, Reply};

/// The codec's session thread: the commands handed to it, and the thread (started with the
/// first).
#[derive(Default)]
pub(super) struct Sessions {
    shared: Arc<Shared>,
    started: OnceLock<bool>,
}

#[derive(Default)]
struct Shared {
    jobs: Mutex<VecDeque<(Deferred, Reply)>>,
    more: Condvar,
    stop: AtomicBool,
}

impl Drop for Sessions {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _jobs = self.shared.jobs.lock_or_recover();
        self.shared.more.notify_all();
    }
}

/// Hands `args` of `cx`'s guest to the session thread when it opens or closes a session
/// of a guest not alone on the codec, with workers: `None` then (the thread answers
/// through `reply`); else gives `reply` back, to run the command here.
pub(super) fn hand_over(
    codec: &Codec,
    cx: &DeviceCtx<'_>,
    args: &[u64; 6],
    reply: Reply,
) -> Option<Reply> {
    let session_change = match Command::decode(args) {
        Ok(Command::OpenDecoder(_) | Command::OpenEncoder(_) | Command::Close(_)) => true,
        Ok(Command::Decode(d)) => codec.reaped(cx.guest, d.handle),
        _ => false,
    };
    if !session_change || codec.workers.is_none() || !codec.state().others_than(cx.guest) {
        return Some(reply);
    }
    let sessions = &codec.sessions;
    let running = *sessions.started.get_or_init(|| {
        let shared = sessions.shared.clone();
        std::thread::Builder::new()
            .name("codec-sessions".into())
            .spawn(move || serve(&shared))
            .is_ok()
    });
    if !running {
        return Some(reply);
    }
    let mut jobs = sessions.shared.jobs.lock_or_recover();
    jobs.push_back((Deferred::of(codec, cx, args), reply));
    sessions.shared.more.notify_one();
    None
}

/// The session thread's loop: runs the commands handed over, oldest first, until the codec
/// is gone and none is left.
fn serve(shared: &Shared) {
    loop {
        let job = {
            let mut jobs = shared.jobs.lock_or_recover();
            loop {
                if let Some(j) = jobs.pop_front() {
                    break Some(j);
                }
                if shared.stop.load(Ordering::SeqCst) {
                    break None;
                }
                jobs = shared
                    .more
                    .wait(jobs)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        };
        match job {
            Some((run, reply)) => run.answer(reply),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};

    use virtsoc_devapi::{codec as api, codec_kind, DeviceCommand};
    use virtsoc_ids::{HandleId, RegionId};
    use virtsoc_media::NullDecoder;
    use virtsoc_proto::wire::Format;
    use virtsoc_svm::{DomainId, GuestId};

    use super::super::state::{DecoderSession, Session};
    use super::super::wait::tests::{held_beside_another, read_bitstream};
    use super::super::{replay, Codec};
    use crate::device::registry::DeviceConfig;
    use crate::device::tests::{reply_for, results};
    use crate::device::{Device, DeviceCtx};
    use crate::testkit::{Core, GUEST};

    /// A codec whose workers are a program in `dir` that sleeps, then exits without
    /// answering (each of an open's two tries fails after it).
    fn slow_workers(dir: &std::path::Path) -> Codec {
        let program = dir.join("slow-worker");
        std::fs::write(&program, "#!/bin/sh\nsleep 0.3\n").unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cfg = DeviceConfig {
            codec_worker: Some(program),
            codec_worker_spares: 0,
            ..DeviceConfig::default()
        };
        Codec::new(&cfg).unwrap()
    }

    /// An open whose worker takes its time to answer ([`slow_workers`]) does not hold the
    /// codec: another guest's command is answered meanwhile, and the open afterwards, with
    /// its failure.
    #[test]
    fn an_open_waiting_for_its_worker_holds_no_other_guest() {
        let dir = tempfile::tempdir().unwrap();
        let codec = slow_workers(dir.path());
        let core = Core::new();
        let cx = |g| DeviceCtx::new(g, &core.svm, DomainId(0), core.session.fences());
        let (cx1, cx2) = (cx(GUEST), cx(GuestId(2)));
        // Another guest with a decoder of its own (in this process).
        let opened = replay::Opened::Decoder {
            kind: codec_kind::H264,
            format: Format::Nv12 as u64,
            threads: 1,
        };
        let null = Box::new(NullDecoder::discarding());
        let session = Session::Decoder(DecoderSession::new(null, Format::Nv12));
        let h2 = codec
            .state()
            .open(&Default::default(), GuestId(2), (session, opened), 1, None)
            .unwrap();

        let open = api::OpenDecoder {
            kind: codec_kind::H264,
            format: Format::Nv12 as u64,
            threads: 1,
        };
        let held = (&cx1, open.encode());
        let answered = held_beside_another(&codec, &core, held, (&cx2, h2), "open");
        answered.recv_timeout(Duration::from_secs(30)).unwrap();
        let got = results(&core);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 7);
        assert!(
            got[0].1.is_err(),
            "a worker that never answered: {:?}",
            got[0].1
        );
        assert!(
            codec.state().decoder(GUEST, HandleId(1)).is_err(),
            "no session left"
        );
    }

    /// The decode that reopens a decoder the reaper closed, whose new worker takes its time
    /// to answer (as above), does not hold the codec: another guest's command is answered
    /// while the reopen waits (its threads taken, its backend not there yet), and the decode
    /// afterwards, with its failure, the threads given back.
    #[test]
    fn a_reopen_waiting_for_its_worker_holds_no_other_guest() {
        let dir = tempfile::tempdir().unwrap();
        let codec = slow_workers(dir.path());
        let mut core = Core::new();
        let (bitstream, domain) = read_bitstream(&mut core);
        let cx = |g| DeviceCtx::new(g, &core.svm, domain, core.session.fences());
        let (cx1, cx2) = (cx(GUEST), cx(GuestId(2)));
        let opened = replay::Opened::Decoder {
            kind: codec_kind::H264,
            format: Format::Nv12 as u64,
            threads: 1,
        };
        let null = || {
            let d = Box::new(NullDecoder::discarding());
            Session::Decoder(DecoderSession::new(d, Format::Nv12))
        };
        let limits = Default::default();
        let h = codec
            .state()
            .open(&limits, GUEST, (null(), opened), 1, None)
            .unwrap();
        drop(codec.state().reap_idle(Instant::now(), Duration::ZERO));
        assert!(codec.reaped(GUEST, h));
        assert_eq!(codec.state().threads, 0);
        let h2 = codec
            .state()
            .open(&limits, GuestId(2), (null(), opened), 1, None)
            .unwrap();

        let decode = api::Decode {
            handle: h,
            bitstream: RegionId(bitstream),
            len: 100,
            pts: 0,
        };
        let (done, answered) = std::sync::mpsc::channel();
        let mut reply = reply_for(&core, 7);
        reply.on_sent = Some(Box::new(move |_| done.send(()).unwrap()));
        codec.execute_async(&cx1, &decode.encode(), reply);
        // Once the reopen has taken its thread (it then waits for its worker)...
        let t0 = Instant::now();
        while codec.reaped(GUEST, h) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!codec.reaped(GUEST, h), "the reopen took its thread");
        assert_eq!(codec.state().threads, 2);
        // ... the other guest's command is answered at once, the reopen still waiting.
        let info = api::StreamInfo { handle: h2 };
        codec.execute_async(&cx2, &info.encode(), reply_for(&core, 8));
        let other = results(&core);
        assert_eq!(other.len(), 1, "{other:?}");
        assert_eq!(other[0].0, 8);
        assert!(other[0].1.is_ok(), "{:?}", other[0].1);
        assert!(answered.try_recv().is_err(), "the reopen still waits");
        answered.recv_timeout(Duration::from_secs(30)).unwrap();
        let got = results(&core);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 7);
        assert!(got[0].1.is_err(), "a worker that never answered: {got:?}");
        assert!(
            codec.reaped(GUEST, h),
            "closed as before, to be reopened later"
        );
        assert_eq!(codec.state().threads, 1, "its thread given back");
    }
}
