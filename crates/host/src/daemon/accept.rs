//! The accept loop: both listeners polled together, connections held to the pending budgets
//! of [`admission`](super::admission) until their handshake is read, refusals answered (and
//! kept open briefly so the peer reads them), accept errors backed off per listener.

use super::admission::{unix_peer, Listener, Peer, PendingGuard};
use super::*;
use virtsoc_sync::LockExt;

/// Refused connections kept open at most this long for the peer's hello to arrive, so the
/// refusal is read instead of the guest's write failing on a closed socket.
const LINGER: Duration = Duration::from_secs(1);

/// Most refused connections lingering at once; beyond that they are closed at once.
const MAX_LINGERING: usize = 256;

/// How long a listener is left alone after an accept error (EMFILE, ENOMEM, ...).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A refused connection waiting for the peer's hello (or a hang-up) before it is closed.
struct Lingering {
    fd: OwnedFd,
    until: Instant,
}

/// State of one listener in the accept loop.
#[derive(Default)]
struct ListenerState {
    /// Not polled again before this instant (after an accept error).
    paused_until: Option<Instant>,
    /// An accept error was logged and no connection was accepted since.
    failing: bool,
}

/// One admitted guest counted against `max_connections`; released when dropped.
pub(super) struct ConnSlot(Arc<Daemon>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ListenerState {
    /// Whether the listener is polled now (its back-off, if any, is over).
    fn resume(&mut self, now: Instant) -> bool {
        match self.paused_until {
            Some(t) if t > now => false,
            _ => {
                self.paused_until = None;
                true
            }
        }
    }

    /// Accepts every pending connection. Errors other than "none left", EINTR and
    /// ECONNABORTED (fd or memory exhaustion) are logged once and pause the listener briefly
    /// instead of making the loop spin on a listener that stays readable.
    fn accept_all<S>(
        &mut self,
        what: &str,
        mut accept: impl FnMut() -> std::io::Result<S>,
        mut start: impl FnMut(S),
    ) {
        use std::io::ErrorKind;
        loop {
            match accept() {
                Ok(s) => {
                    if std::mem::take(&mut self.failing) {
                        log::info!("accepting {what} connections again");
                    }
                    start(s);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => {
                    if !std::mem::replace(&mut self.failing, true) {
                        log::warn!(
                            "cannot accept {what} connections: {e}; retrying every {} ms",
                            ACCEPT_BACKOFF.as_millis()
                        );
                    }
                    self.paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }
}

impl Daemon {
    /// Accepts guests on the Unix socket (and on `tcp`, for remote guests) until `stop`
    /// becomes readable, then closes every session.
    pub fn serve(
        self: &Arc<Self>,
        listener: UnixListener,
        tcp: Option<TcpListener>,
        stop: OwnedFd,
    ) -> Result<()> {
        listener.set_nonblocking(true)?;
        if let Some(t) = &tcp {
            if self.cfg.token.is_none() {
                return Err(HostError::Config(
                    "remote guests need a token: give --token-file".into(),
                ));
            }
            t.set_nonblocking(true)?;
            log::info!("virtsocd accepting remote guests on {}", t.local_addr()?);
        }
        log::info!(
            "virtsocd listening on {} (default coherence {})",
            self.cfg.socket.display(),
            self.cfg.protocol
        );
        let mut lingering: Vec<Lingering> = Vec::new();
        let (mut unix_state, mut tcp_state) = (ListenerState::default(), ListenerState::default());
        loop {
            let now = Instant::now();
            // Close refused connections whose time is up.
            lingering.retain(|l| l.until > now);
            let unix_on = unix_state.resume(now);
            let tcp_on = tcp.is_some() && tcp_state.resume(now);
            let wake = lingering
                .iter()
                .map(|l| l.until)
                .chain(unix_state.paused_until)
                .chain(tcp_state.paused_until.filter(|_| tcp.is_some()))
                .min();
            let mut fds = vec![PollFd::new(&stop, PollFlags::IN)];
            if unix_on {
                fds.push(PollFd::new(&listener, PollFlags::IN));
            }
            if let (Some(t), true) = (&tcp, tcp_on) {
                fds.push(PollFd::new(t, PollFlags::IN));
            }
            let first_lingering = fds.len();
            fds.extend(lingering.iter().map(|l| PollFd::new(&l.fd, PollFlags::IN)));
            let timeout = wake.map(|w| {
                let left = w.saturating_duration_since(now) + Duration::from_millis(1);
                rustix::time::Timespec {
                    tv_sec: left.as_secs() as i64,
                    tv_nsec: left.subsec_nanos() as _,
                }
            });
            match poll(&mut fds, timeout.as_ref()) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    // ENOMEM: nothing to do but wait for memory; never exit over it.
                    log::warn!("poll failed: {e}; retrying");
                    drop(fds);
                    std::thread::sleep(ACCEPT_BACKOFF);
                    continue;
                }
            }
            if !fds[0].revents().is_empty() {
                break;
            }
            // A refused peer's hello (or hang-up) arrived: it has the refusal, close.
            let answered: Vec<bool> = fds[first_lingering..]
                .iter()
                .map(|f| !f.revents().is_empty())
                .collect();
            drop(fds);
            let mut i = 0;
            lingering.retain(|_| {
                i += 1;
                !answered.get(i - 1).copied().unwrap_or(false)
            });
            if unix_on {
                unix_state.accept_all(
                    "guest",
                    || listener.accept().map(|(s, _)| s),
                    |stream| {
                        let peer = unix_peer(&stream);
                        self.start_connection(
                            stream,
                            (Listener::Unix, peer),
                            "guest-conn",
                            &mut lingering,
                            |me, s, pending| me.unix_connection(s, pending),
                        )
                    },
                );
            }
            if let (Some(t), true) = (&tcp, tcp_on) {
                tcp_state.accept_all(
                    "remote guest",
                    || t.accept(),
                    |(stream, peer)| {
                        self.start_connection(
                            stream,
                            (Listener::Tcp, Peer::Addr(peer.ip())),
                            "remote-conn",
                            &mut lingering,
                            move |me, s, pending| me.tcp_connection(s, peer, pending),
                        )
                    },
                );
            }
        }
        self.shutdown();
        Ok(())
    }

    /// Answers a hello with a refusal (`reason`'s text) and logs it.
    pub(super) fn refuse(stream: &impl AsFd, reason: impl std::fmt::Display) {
        log::warn!("refusing guest: {reason}");
        let reason = reason.to_string();
        let _ = send_json(stream, &Reply::Refused { reason }, None);
    }

    /// Takes a guest's place for a connection whose handshake was read (see
    /// [`admission`](super::admission)): the place is given back when the slot drops; the
    /// refusal's reason when the daemon serves `max_connections` guests already.
    pub(super) fn take_place(self: &Arc<Self>) -> std::result::Result<ConnSlot, AdmitError> {
        let max = self.cfg.max_connections;
        if self.connections.fetch_add(1, Ordering::SeqCst) >= max {
            self.connections.fetch_sub(1, Ordering::SeqCst);
            return Err(AdmitError::TooManyConnections { max });
        }
        Ok(ConnSlot(self.clone()))
    }

    /// Serves a new connection on its own thread, once it has a place among the connections
    /// pending their handshake ([`admission`](super::admission)); refused at once when it
    /// has none or no thread can be started.
    fn start_connection<S>(
        self: &Arc<Self>,
        stream: S,
        (listener, peer): (Listener, Peer),
        thread: &str,
        lingering: &mut Vec<Lingering>,
        serve: impl FnOnce(Arc<Self>, S, PendingGuard) + Send + 'static,
    ) where
        S: Into<OwnedFd> + AsFd + Send + 'static,
    {
        let Some(pending) = self.pending.enter(&stream, listener, peer) else {
            return Self::refuse_at_once(
                stream.into(),
                format!(
                    "too many connections waiting for their handshake from this peer or \
                     listener (at most {} per peer, {} per listener): retry",
                    admission::PENDING_PER_PEER,
                    admission::PENDING_PER_LISTENER
                ),
                lingering,
            );
        };
        let me = self.clone();
        // The stream goes to the thread once it runs, so a failed start leaves it here.
        let (tx, rx) = std::sync::mpsc::sync_channel::<S>(1);
        let started = spawn_thread(thread, move || {
            if let Ok(stream) = rx.recv() {
                serve(me, stream, pending);
            }
        });
        match started {
            Ok(_) => {
                let _ = tx.send(stream);
            }
            Err(e) => {
                log::warn!("cannot start a thread for a connection: {e}");
                Self::refuse_at_once(
                    stream.into(),
                    format!("daemon overloaded: cannot start a connection thread ({e})"),
                    lingering,
                );
            }
        }
    }

    /// Refuses a connection from the accept loop without blocking it: the refusal is queued
    /// on the fresh socket, which is closed once the peer's hello arrives (or after a second).
    fn refuse_at_once(fd: OwnedFd, reason: String, lingering: &mut Vec<Lingering>) {
        static LAST_LOG: Mutex<Option<(Instant, u64)>> = Mutex::new(None);
        {
            // One log line a second at most: a flood must not flood the log too.
            let mut last = LAST_LOG.lock_or_recover();
            let now = Instant::now();
            match &mut *last {
                Some((at, skipped)) if now.duration_since(*at) < Duration::from_secs(1) => {
                    *skipped += 1
                }
                other => {
                    let skipped = other.map(|(_, n)| n).unwrap_or(0);
                    if skipped > 0 {
                        log::warn!("refusing connection: {reason} (and {skipped} more before)");
                    } else {
                        log::warn!("refusing connection: {reason}");
                    }
                    *other = Some((now, 0));
                }
            }
        }
        let _ = rustix::io::ioctl_fionbio(&fd, true);
        let _ = send_json(&fd, &Reply::Refused { reason }, None);
        if lingering.len() < MAX_LINGERING {
            lingering.push(Lingering {
                fd,
                until: Instant::now() + LINGER,
            });
        }
    }
}
