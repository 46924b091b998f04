//! Reconnecting a process guest to a daemon that restarted (or to the daemon its session
//! moved to): the library connects again on the same socket, presents the session's resume
//! secret (from its welcome), follows a `Moved` answer to the socket of the daemon its session
//! migrated to, maps the new window and carries on. A remote (TCP) guest reconnects to the
//! same address the same way, proving with its secret that it is the same guest (a wrong
//! secret is refused); it does not follow migrations. If the daemon it was sent to is gone or
//! refuses (a migration that did not commit), the library goes back to where the session
//! was, which resumes it. Region ids, fence ids and
//! region contents stay what they were: the daemon restored the saved session into the new
//! connection.
//!
//! With auto-reconnect on, the library keeps every request until its completion arrives. The
//! old daemon quiesced the session before handing it over (nothing taken off the ring after
//! that runs there, and every completion of what ran was posted), so after taking the old
//! ring's last completions the library sends the rest again to the new daemon, under the
//! same sequence numbers: each request runs exactly once and waiters just get their answer.
//! Without it (a [`Connection::reconnect`] on demand), requests in flight when the old
//! daemon went away fail with `Closed`.
//!
//! [`Connection::set_auto_reconnect`] makes the library do this by itself the first time it
//! finds the daemon gone; [`Connection::reconnect`] does it on demand.

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtsoc_proto::{Completion, Request};

use super::Connection;
use crate::link::GuestLink;
use crate::{GuestError, Result};

/// Requests sent and not completed, by sequence number, with the link generation they went
/// out on: what a reconnect sends again.
#[derive(Default)]
pub(super) struct Replay {
    /// Bumped by each reconnect (under this lock, with the link swap).
    epoch: u64,
    requests: BTreeMap<u64, (Request, Vec<u8>)>,
}

/// Pause between two connection attempts while the daemon is away.
const RETRY: Duration = Duration::from_millis(20);
/// Most `Moved` answers followed in one reconnect.
const MAX_REDIRECTS: u32 = 8;
/// Longest a handshake may take once connected.
const HANDSHAKE: Duration = Duration::from_secs(10);

impl Connection {
    /// The secret that resumes this session after a daemon restart, if the daemon gave one.
    pub fn resume_secret(&self) -> Option<String> {
        self.resume.lock().clone()
    }

    /// Reconnect by itself (for at most `within`) when the daemon goes away; `None`: never
    /// (the default: calls fail with `Closed`).
    pub fn set_auto_reconnect(&self, within: Option<Duration>) {
        *self.auto_reconnect.lock() = within;
        self.track.store(within.is_some(), Ordering::SeqCst);
    }

    /// The link to push `req` on; with auto-reconnect on, `req` is kept (before it is pushed,
    /// so a reconnect that swaps the link meanwhile sends it again) and the link generation
    /// returned.
    pub(super) fn keep_for_replay(
        &self,
        req: &Request,
        payload: &[u8],
    ) -> (Arc<dyn GuestLink>, Option<u64>) {
        if !self.track.load(Ordering::SeqCst) {
            return (self.link(), None);
        }
        let mut rp = self.replay.lock();
        rp.requests.insert(req.seq, (*req, payload.to_vec()));
        (self.link(), Some(rp.epoch))
    }

    /// `seq` was not pushed: forgets it, unless a reconnect already sent it again (false).
    pub(super) fn unkeep(&self, seq: u64, epoch: Option<u64>) -> bool {
        let Some(epoch) = epoch else {
            return true;
        };
        let mut rp = self.replay.lock();
        if rp.epoch != epoch {
            return false;
        }
        rp.requests.remove(&seq);
        true
    }

    /// Completed requests are not sent again.
    pub(super) fn forget_replayed(&self, batch: &[Completion]) {
        if batch.is_empty() || !self.track.load(Ordering::SeqCst) {
            return;
        }
        let mut rp = self.replay.lock();
        for c in batch {
            rp.requests.remove(&c.seq);
        }
    }

    /// Reconnects if the daemon is gone and auto-reconnect is on; true when connected again.
    pub(super) fn reconnect_if_allowed(&self) -> Result<bool> {
        if self.user_closed.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let Some(within) = *self.auto_reconnect.lock() else {
            return Ok(false);
        };
        let _one = self.reconnecting.lock();
        if !self.closed.load(Ordering::SeqCst) {
            // Another thread reconnected meanwhile.
            return Ok(true);
        }
        self.reconnect_locked(within)?;
        Ok(true)
    }

    /// Connects again to the daemon's socket (waiting up to `within` for it to come back),
    /// resuming this session there: same region ids, fence ids and bytes, a new window.
    pub fn reconnect(&self, within: Duration) -> Result<()> {
        let _one = self.reconnecting.lock();
        self.reconnect_locked(within)
    }

    fn reconnect_locked(&self, within: Duration) -> Result<()> {
        if self.user_closed.load(Ordering::SeqCst) {
            return Err(GuestError::Closed);
        }
        let origin = self.origin.lock().clone();
        let (path, opts) = origin.ok_or_else(|| {
            GuestError::BadArgument("this connection cannot reconnect (no origin)".into())
        })?;
        let secret = self.resume_secret().ok_or_else(|| {
            GuestError::Refused("the daemon gave this session no resume secret".into())
        })?;
        // The old transport is done with: hang it up so its daemon (if still there) lets go.
        self.link().close();
        // Become the reaper, so nothing takes completions off the old link meanwhile, and
        // take the old ring's last completions before saying hello again: a VM's new
        // session starts over in the same memory.
        {
            let mut r = self.reaped.lock();
            while r.reaping {
                r.waiters += 1;
                r = self.reaped_cv.wait_timeout(r, RETRY).0;
                r.waiters -= 1;
            }
            r.reaping = true;
        }
        self.take_last_completions();
        let result = self
            .handshake_again(path, &opts, &secret, within)
            .and_then(|(h, path)| {
                *self.origin.lock() = Some((path, opts));
                self.switch(h)
            });
        self.reaped.lock().reaping = false;
        self.reaped_cv.notify_all();
        result
    }

    /// The completions the old daemon posted before it went.
    fn take_last_completions(&self) {
        let old = self.link();
        let mut posted = Vec::new();
        while let Ok(batch) = old.reap(Duration::ZERO) {
            if batch.is_empty() {
                break;
            }
            posted.extend(batch.into_iter().map(|(c, _)| c));
        }
        let mut r = self.reaped.lock();
        self.absorb(&mut r, &posted);
    }

    /// Says hello again, resuming with `secret`: at `path` (a Unix socket, `tcp:ADDR` or
    /// `vm:PORT`), following `Moved` answers, for at most `within`. Returns the handshake
    /// and where it succeeded.
    fn handshake_again(
        &self,
        mut path: std::path::PathBuf,
        opts: &super::ConnectOptions,
        secret: &str,
        within: Duration,
    ) -> Result<(super::handshake::Handshake, std::path::PathBuf)> {
        let deadline = Instant::now() + within;
        // Where the session lived: a daemon it was sent to that is gone or refuses (a
        // migration that did not commit) sends the library back here, where it resumes.
        let home = path.clone();
        let vm_port = self.vm_port.lock().clone();
        let mut redirects = 0;
        loop {
            let resume = Some(secret.to_string());
            let target = path.to_str().unwrap_or("");
            let attempt = if let Some(addr) = target.strip_prefix("tcp:") {
                Self::handshake_tcp(addr, opts, resume, Some(HANDSHAKE))
            } else if let (true, Some(port)) = (target.starts_with("vm:"), &vm_port) {
                crate::vm::handshake(port, opts, resume, Some(HANDSHAKE))
            } else {
                UnixStream::connect(&path)
                    .map_err(|source| GuestError::Connect {
                        path: path.display().to_string(),
                        source,
                    })
                    .and_then(|sock| {
                        sock.set_read_timeout(Some(HANDSHAKE))
                            .map_err(GuestError::Io)?;
                        let dup = sock.try_clone().map_err(GuestError::Io)?;
                        let h = Self::handshake_unix(dup, opts, resume)?;
                        sock.set_read_timeout(None).map_err(GuestError::Io)?;
                        Ok(h)
                    })
            };
            match attempt {
                Ok(h) => return Ok((h, path)),
                // The session migrated: resume it at the daemon it went to.
                Err(GuestError::Moved(to)) if redirects < MAX_REDIRECTS => {
                    redirects += 1;
                    path = std::path::PathBuf::from(to);
                }
                // Refused at home: the daemon is there and said no (no such saved session).
                Err(e @ GuestError::Refused(_)) if path == home && !target.starts_with("vm:") => {
                    return Err(e)
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                // Not there yet, an old daemon hanging up while it stops, a daemon it was
                // sent to that is gone or refused, or a VM port whose daemon is changing
                // hands: try again from home.
                Err(_) => {
                    path = home.clone();
                    redirects = 0;
                    std::thread::sleep(RETRY);
                }
            }
        }
    }

    /// Swaps in the new link and window (the old ring's completions were taken), and sends
    /// every request still in flight again (the old daemon stopped taking
    /// requests before it handed the session over, so each runs exactly once).
    fn switch(&self, h: super::handshake::Handshake) -> Result<()> {
        let mut rp = self.replay.lock();
        let old_window = {
            let mut w = self.window.write();
            std::mem::replace(&mut *w, h.window)
        };
        // Pointers from begin_access into the old window stay mapped until the connection goes.
        self.retired.lock().push(old_window);
        let link: Arc<dyn GuestLink> = Arc::from(h.link);
        *self.link.write() = link.clone();
        rp.epoch += 1;
        self.guest_id.store(h.guest_id, Ordering::SeqCst);
        if let Some(r) = h.resume {
            *self.resume.lock() = Some(r);
        }
        self.cpu_offsets.lock().clear();
        if self.track.load(Ordering::SeqCst) {
            for (req, payload) in rp.requests.values() {
                if !link.push(req, payload)? {
                    return Err(GuestError::BadArgument(
                        "more requests in flight than the new ring holds".into(),
                    ));
                }
            }
        } else {
            // Nothing kept: requests in flight on the old daemon will never complete.
            let mut r = self.reaped.lock();
            r.detached.clear();
            self.completed
                .store(self.submitted.load(Ordering::SeqCst), Ordering::SeqCst);
        }
        drop(rp);
        self.reaped_cv.notify_all();
        self.closed.store(false, Ordering::SeqCst);
        Ok(())
    }
}
