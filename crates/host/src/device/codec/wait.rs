//! `receive_frame` and `stream_info` that would wait for a decoder's worker process (no
//! picture ready, packets still in the worker), `decode` and `flush` that would wait for
//! one (below), and `encode` on an encoder in a worker process (its frame handed to the
//! worker, its packets not back yet), wait on the codec's thread at most a grace (none by
//! default, [`DEFAULT_GRACE`]), then go to its waiter thread, which waits on every such
//! worker's socket at once (one `poll`, holding nothing) and answers each command once its
//! worker's answers bring a picture or the end of what was in flight (an encode: its
//! packets). The device's thread goes on serving the other guests meanwhile, whose
//! decoders then run beside it on the host's other cores: one guest's slow pictures (a
//! large or hostile stream, a picture as large as the limits allow) hold another guest's
//! commands for the grace at most in these commands. (Until stop 50 an encode held the
//! codec's thread, and its state, for its whole frame: 100-200 ms a 3840x2160 picture
//! here, up to the encoder's deadline, tens of seconds, for the largest.) A `decode` that
//! would wait for its worker goes the same way (until stop 51 it waited on the codec's
//! thread): with one decoding thread its packet is sent to the worker first and the command
//! reads the packet's answer once it has come; with frame threads and the most packets in
//! flight, the command runs once the oldest one's answer has come. A `flush` is sent behind
//! the packets in flight and answered once all their answers and its own have come. (Opens and closes run on the
//! codec's session thread: `sessions.rs`.)
//! A guest alone on the codec (no other guest has opened a session on it) waits on the
//! codec's thread, as before: nobody is held, and a guest that comes meanwhile waits for that
//! one wait at most. The guest's own queue stays held until the answer (a command still
//! running on the device), so its next command sees the result, as before.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use virtsoc_devapi::codec::Command;
use virtsoc_fence::table::VirtualFenceTable;
use virtsoc_ids::HandleId;
use virtsoc_svm::{DomainId, GuestId, SvmManager};
use virtsoc_sync::LockExt;

use super::Codec;
use crate::device::{Device, DeviceCtx, Reply};

/// How long a command waits for its decoder's worker on the codec's thread before it is
/// handed to the waiter, by default (`DeviceConfig::codec_grace`, `virtsocd
/// --codec-grace-us`): none. While the codec's thread waits no other guest's command
/// starts, so the guests' decoders ran one at a time whatever the host's cores: until stop
/// 53 it waited up to 2 ms (half a turn of the codec's scheduler; most 1080p pictures come
/// within it, and a handed-over command costs the daemon about 40 us more CPU,
/// `docs/results.md` stop 49), and 8 guests decoding together did 0.82-0.98x the work of
/// one guest alone on this machine's two cores; handed over at once, 1.33-1.63x (three
/// runs each, stop 53), and a victim's decodes next to hostile codec guests were as quick
/// or quicker (`bench isolation`).
pub const DEFAULT_GRACE: Duration = Duration::ZERO;

/// The codec's waiter: the commands handed to it, and its thread (started with the first).
#[derive(Default)]
pub(super) struct Waits {
    shared: Arc<Shared>,
    started: OnceLock<bool>,
}

/// What the device's thread and the waiter share.
struct Shared {
    /// Commands handed over and not taken by the waiter yet.
    new: Mutex<Vec<(Waiting, Reply)>>,
    /// Written to wake the waiter (a new command, or the end); `None`: no eventfd.
    wake: Option<OwnedFd>,
    stop: AtomicBool,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            new: Mutex::default(),
            wake: rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).ok(),
            stop: AtomicBool::new(false),
        }
    }
}

impl Shared {
    fn wake(&self) {
        if let Some(fd) = &self.wake {
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }
}

impl Drop for Waits {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake();
    }
}

/// Runs `args` of `cx`'s guest on `codec` and answers through `reply`: at once, or, for a
/// command that would wait for its decoder's worker, by the waiter once the worker answers.
pub(super) fn execute_async(codec: &Codec, cx: &DeviceCtx<'_>, args: &[u64; 6], reply: Reply) {
    let Some(reply) = super::sessions::hand_over(codec, cx, args, reply) else {
        return;
    };
    let Some((handle, fd, deadline)) = would_wait(codec, cx, args) else {
        return answer(codec, cx, args, reply);
    };
    if readable_within(&fd, codec.grace) && !still_waits(codec, cx.guest, handle, args) {
        return answer(codec, cx, args, reply);
    }
    let waits = &codec.waits;
    let running = *waits.started.get_or_init(|| {
        let shared = waits.shared.clone();
        shared.wake.is_some()
            && std::thread::Builder::new()
                .name("codec-wait".into())
                .spawn(move || serve(&shared))
                .is_ok()
    });
    if !running {
        // No waiter: wait here, as before.
        return answer(codec, cx, args, reply);
    }
    let w = Waiting {
        run: Deferred::of(codec, cx, args),
        handle,
        fd,
        deadline: Instant::now() + deadline,
    };
    waits.shared.new.lock_or_recover().push((w, reply));
    waits.shared.wake();
}

/// Runs the command and answers it.
pub(super) fn answer(codec: &Codec, cx: &DeviceCtx<'_>, args: &[u64; 6], mut reply: Reply) {
    let result = codec.execute(cx, args);
    if let Some(ns) = cx.take_busy() {
        reply.busy_for(ns);
    }
    reply.send_because(result, cx.take_reason());
}

/// The decoder a `receive_frame` or `stream_info` of `cx`'s guest would wait for, or the
/// encoder an `encode` started a frame on ([`start_encode`]), a descriptor that becomes
/// readable when its worker answers, and how long its worker has; `None` to run it at once
/// (any other command, a picture ready, nothing in flight, a decoder or an encoder in this
/// process, or no other guest on the codec to hold: handing over costs the daemon CPU,
/// `docs/results.md` stop 49).
fn would_wait(
    codec: &Codec,
    cx: &DeviceCtx<'_>,
    args: &[u64; 6],
) -> Option<(HandleId, OwnedFd, Duration)> {
    let guest = cx.guest;
    let handle = match Command::decode(args).ok()? {
        Command::ReceiveFrame(c) => c.handle,
        Command::StreamInfo(c) => c.handle,
        Command::Encode(c) => return start_encode(codec, cx, c),
        Command::Decode(c) => return start_decode(codec, cx, c),
        Command::Flush(c) => return start_flush(codec, cx.guest, c.handle),
        _ => return None,
    };
    let mut st = codec.state();
    if !st.others_than(guest) {
        return None;
    }
    let s = st.decoder(guest, handle).ok()?;
    if !s.gather() {
        return None;
    }
    let fd = s.decoder.answers_fd()?.try_clone_to_owned().ok()?;
    Some((handle, fd, virtsoc_media::CALL_DEADLINE))
}

/// Hands `c`'s frame to its encoder's worker without waiting for the packets (the one copy
/// of the frame into the buffer the worker reads, as `encode` makes); the command, run
/// later ([`Codec::encode`]), reads them. `None` when the encoder cannot start a frame (in
/// this process), when a check fails (the command then reports it) or when no other guest
/// uses the codec: the command runs at once, as before.
fn start_encode(
    codec: &Codec,
    cx: &DeviceCtx<'_>,
    c: virtsoc_devapi::codec::Encode,
) -> Option<(HandleId, OwnedFd, Duration)> {
    let layout = super::frame_layout(&cx.meta(c.frame).ok()?).ok()?;
    cx.meta(c.out).ok()?;
    let mut st = codec.state();
    if !st.others_than(cx.guest) {
        return None;
    }
    let s = st.encoder(cx.guest, c.handle).ok()?;
    if !layout.format.is_yuv() || (layout.width, layout.height) != (s.width, s.height) {
        return None;
    }
    let encoder = &mut s.encoder;
    let started = cx.with_source(c.frame, |bytes| {
        virtsoc_media::FrameRef::new(layout, bytes)
            .map_err(virtsoc_media::MediaError::from)
            .and_then(|f| encoder.start(f, c.pts as i64))
    });
    // Not started (or it failed: the command's own encode reports why).
    if !matches!(started, Ok(Ok(true))) {
        return None;
    }
    let pixels = u64::from(layout.width) * u64::from(layout.height);
    let fd = encoder.answers_fd()?.try_clone_to_owned().ok()?;
    Some((c.handle, fd, virtsoc_media::deadline_for(pixels)))
}

/// A `decode` that would wait for its decoder's worker: with one decoding thread, its
/// packet is sent now ([`DecoderBackend::start`](virtsoc_media::DecoderBackend::start)) and
/// the command, run later ([`Codec::decode`]), reads the packet's answer; with frame threads
/// and the most packets in flight, it runs once the oldest one's answer has come. `None`
/// when it would not wait, when a check fails (the command then reports it) or when no
/// other guest uses the codec: the command runs at once, as before.
fn start_decode(
    codec: &Codec,
    cx: &DeviceCtx<'_>,
    c: virtsoc_devapi::codec::Decode,
) -> Option<(HandleId, OwnedFd, Duration)> {
    let len = Codec::packet_len(cx, c).ok()?;
    let mut st = codec.state();
    if !st.others_than(cx.guest) {
        return None;
    }
    if st
        .sessions
        .get(&(cx.guest, c.handle))
        .is_some_and(|o| o.reaped)
    {
        // Reopened by the command itself (on the session thread: `sessions.rs`).
        return None;
    }
    let s = st.decoder(cx.guest, c.handle).ok()?;
    if s.full() {
        return None;
    }
    let decoder = &mut s.decoder;
    if !decoder.would_wait() {
        // Only a decoder that would send it reads the packet here (one decoding thread).
        if !decoder.starts() {
            return None;
        }
        let started = cx.with_source(c.bitstream, |bytes| match bytes.get(..len) {
            Some(packet) => decoder.start(packet, c.pts as i64),
            None => Ok(false),
        });
        // Not started (or it failed: the command's own decode reports why).
        if !matches!(started, Ok(Ok(true))) {
            return None;
        }
    }
    let fd = decoder.answers_fd()?.try_clone_to_owned().ok()?;
    Some((c.handle, fd, virtsoc_media::CALL_DEADLINE))
}

/// A `flush` of a decoder in a worker process: sent now, behind the packets in flight
/// ([`DecoderBackend::start_flush`](virtsoc_media::DecoderBackend::start_flush)); the
/// command, run later, reads the answers once they have all come. `None` for a decoder in
/// this process, or when no other guest uses the codec: the command runs at once.
fn start_flush(
    codec: &Codec,
    guest: GuestId,
    handle: HandleId,
) -> Option<(HandleId, OwnedFd, Duration)> {
    let mut st = codec.state();
    if !st.others_than(guest) {
        return None;
    }
    let decoder = &mut st.decoder(guest, handle).ok()?.decoder;
    if !matches!(decoder.start_flush(), Ok(true)) {
        return None;
    }
    let fd = decoder.answers_fd()?.try_clone_to_owned().ok()?;
    Some((handle, fd, virtsoc_media::CALL_DEADLINE))
}

/// Whether `args` (a command of `guest` on `handle`) would still wait for its decoder's
/// worker, once the answers that arrived are read: a `receive_frame` or `stream_info` while
/// no picture is ready and packets are in flight, a `decode` or `flush` while the answers
/// it needs have not all come. False for a decoder gone, and for an encoder: its packets are there once its
/// worker's socket is readable.
fn still_waits(codec: &Codec, guest: GuestId, handle: HandleId, args: &[u64; 6]) -> bool {
    let mut st = codec.state();
    let Ok(s) = st.decoder(guest, handle) else {
        return false;
    };
    match Command::decode(args) {
        Ok(Command::Decode(_) | Command::Flush(_)) => s.decoder.would_wait(),
        _ => s.gather(),
    }
}

/// Whether `fd` becomes readable (or hangs up) within `left`.
fn readable_within(fd: &OwnedFd, left: Duration) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    let t = timespec(left);
    matches!(rustix::event::poll(&mut fds, Some(&t)), Ok(n) if n > 0)
}

fn timespec(d: Duration) -> rustix::time::Timespec {
    rustix::time::Timespec {
        tv_sec: d.as_secs() as i64,
        tv_nsec: i64::from(d.subsec_nanos()),
    }
}

/// A command handed to another thread than the codec's, with what it runs with there.
pub(super) struct Deferred {
    codec: Codec,
    guest: GuestId,
    svm: Arc<SvmManager>,
    domain: DomainId,
    fences: Arc<VirtualFenceTable>,
    reads_host: bool,
    args: [u64; 6],
}

impl Deferred {
    pub(super) fn of(codec: &Codec, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> Self {
        Deferred {
            codec: codec.clone(),
            guest: cx.guest,
            svm: cx.svm.clone(),
            domain: cx.domain,
            fences: cx.fences.clone(),
            reads_host: cx.reads_host,
            args: *args,
        }
    }

    /// Runs the command and answers it.
    pub(super) fn answer(self, reply: Reply) {
        let cx = DeviceCtx::new(self.guest, &self.svm, self.domain, &self.fences)
            .reading_host(self.reads_host);
        answer(&self.codec, &cx, &self.args, reply);
    }
}

/// A command waiting for its decoder's worker.
struct Waiting {
    run: Deferred,
    handle: HandleId,
    fd: OwnedFd,
    /// When a silent worker is left to the command itself, which waits for it as before
    /// and ends it when it stays silent ([`CALL_DEADLINE`](virtsoc_media::CALL_DEADLINE)).
    deadline: Instant,
}

impl Waiting {
    /// Whether the worker's answers that arrived settle it (a picture, or nothing left in
    /// flight, or the decoder gone).
    fn settled(&self) -> bool {
        let r = &self.run;
        !still_waits(&r.codec, r.guest, self.handle, &r.args)
    }

    fn answer(self, reply: Reply) {
        self.run.answer(reply);
    }
}

/// The waiter's loop: waits on the wake-up and every waiting command's worker at once;
/// answers each command its worker settled, or whose deadline passed.
fn serve(shared: &Shared) {
    let Some(wake) = &shared.wake else { return };
    let mut waiting: Vec<(Waiting, Reply)> = Vec::new();
    loop {
        waiting.append(&mut shared.new.lock_or_recover());
        if shared.stop.load(Ordering::SeqCst) && waiting.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut i = 0;
        let mut ready = Vec::new();
        {
            let mut fds: Vec<PollFd<'_>> = std::iter::once(wake.as_fd())
                .chain(waiting.iter().map(|(w, _)| w.fd.as_fd()))
                .map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN))
                .collect();
            let next = waiting.iter().map(|(w, _)| w.deadline).min();
            let t = next.map(|d| timespec(d.saturating_duration_since(now)));
            let _ = rustix::event::poll(&mut fds, t.as_ref());
            for (k, fd) in fds.iter().enumerate().skip(1) {
                if !fd.revents().is_empty() {
                    ready.push(k - 1);
                }
            }
        }
        let _ = rustix::io::read(wake, &mut [0u8; 8]);
        let now = Instant::now();
        // Answer what settled, oldest first; keep the rest.
        let mut kept = Vec::with_capacity(waiting.len());
        for (w, reply) in waiting.drain(..) {
            let due = ready.contains(&i) && w.settled() || now >= w.deadline;
            i += 1;
            match due {
                true => w.answer(reply),
                false => kept.push((w, reply)),
            }
        }
        waiting = kept;
    }
}

#[cfg(test)]
#[path = "wait_tests.rs"]
pub(super) mod tests;
