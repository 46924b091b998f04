//! The daemon's two kinds of guest connection: a process guest on the Unix socket (the
//! window passed as a memfd, futex doorbells, the connection thread watching for the
//! hang-up), and a remote guest on TCP (token first, then frames on the stream).

use super::admission::{Awaited, PendingGuard};
use super::*;

impl Daemon {
    /// A process guest: handshake, the window passed as a memfd, futex doorbells; then the
    /// connection thread watches the socket for the hang-up.
    ///
    /// Its hello read, it leaves the `pending` connections and takes a guest's place.
    pub(super) fn unix_connection(self: Arc<Self>, mut stream: UnixStream, pending: PendingGuard) {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_write_timeout(Some(self.cfg.handshake_timeout));
        let deadline = Instant::now() + self.cfg.handshake_timeout;
        let Some(hello) = self.read_hello(&stream, pending, deadline, None) else {
            return;
        };
        let _place = match self.take_place() {
            Ok(p) => p,
            Err(reason) => return Self::refuse(&stream, reason),
        };
        let name = sanitize_name(&hello.name);
        let a = match self.admit(&hello) {
            Ok(a) => a,
            Err(reason) => return Self::refuse(&stream, reason),
        };
        let guest_id = a.guest_id;
        self.note_transport(guest_id, "unix");
        let Some(session) = self.unix_session(&stream, &a, name) else {
            return;
        };
        let Some(runner) = self.start_unix_session(&stream, &session, &a, &hello) else {
            return;
        };
        let _ = stream.set_write_timeout(None);
        // Watch for the hang-up: a crashed guest's socket reads EOF.
        let mut buf = [0u8; 64];
        while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
        session.close();
        let _ = runner.join();
        self.cfg.sharing.detach_cpu(guest_id);
        self.unregister(guest_id);
    }

    /// The admitted process guest's session on a shared-memory link whose hang-up shuts the
    /// socket down; registered, its process given its CPU weight. `None` (the guest
    /// detached) when the socket cannot be cloned.
    fn unix_session(
        &self,
        stream: &UnixStream,
        a: &Admitted,
        name: String,
    ) -> Option<Arc<Session>> {
        let guest_id = a.guest_id;
        let hangup = match stream.try_clone() {
            Ok(s) => s,
            Err(e) => {
                log::warn!("guest {guest_id}: {e}");
                self.svm.detach_guest(guest_id);
                return None;
            }
        };
        let link = ShmLink::new(
            a.window.clone(),
            Box::new(FutexDoorbell::host_bell(&a.window, self.cfg.spins)),
            Box::new(FutexDoorbell::guest_bell(&a.window, self.cfg.spins)),
            Box::new(move || {
                let _ = hangup.shutdown(std::net::Shutdown::Both);
            }),
        );
        log::info!(
            "guest {guest_id} ({name}) connected: window {} MiB, coherence {}",
            a.layout.size >> 20,
            a.kind
        );
        let session = Session::new(
            guest_id,
            name,
            a.window.clone(),
            Arc::new(link),
            &self.cfg.limits,
        );
        // Registered before the guest hears it was admitted, so that anything it does next
        // (or a control request about it) finds its session.
        self.register(&session);
        self.cfg
            .sharing
            .attach_cpu(guest_id, session.name(), crate::cgroup::peer_pid(stream));
        Some(session)
    }

    /// Resumes or starts the process guest's saved state, starts its session's thread and
    /// welcomes it; `None` when it was refused or the handshake failed (its session closed
    /// and the guest detached then).
    fn start_unix_session(
        self: &Arc<Self>,
        stream: &UnixStream,
        session: &Arc<Session>,
        a: &Admitted,
        hello: &Hello,
    ) -> Option<std::thread::JoinHandle<()>> {
        let guest_id = a.guest_id;
        let mut welcome = self.welcome(a);
        match self.restart.admit(self, session, hello.resume.as_deref()) {
            Ok(secret) => {
                if let Reply::Welcome { resume, .. } = &mut welcome {
                    *resume = Some(secret);
                }
            }
            Err(refusal) => {
                self.cfg.sharing.detach_cpu(guest_id);
                // Answered before the session's close hangs the socket up.
                match refusal {
                    crate::snapshot::restart::Refusal::Refused(reason) => {
                        Self::refuse(stream, reason)
                    }
                    crate::snapshot::restart::Refusal::Moved(socket) => {
                        let _ = send_json(stream, &Reply::Moved { socket }, None);
                    }
                }
                self.drop_session(session, None);
                return None;
            }
        }
        // The session's thread starts before the guest hears it was admitted: a daemon that
        // cannot start one (a process limit) refuses with the reason instead of welcoming a
        // guest it then drops.
        let runner = {
            let (s, svm, dev) = (session.clone(), self.svm.clone(), self.devices.clone());
            spawn_thread(&format!("guest-{guest_id}"), move || s.run(svm, dev))
        };
        let runner = match runner {
            Ok(r) => r,
            Err(e) => {
                log::warn!("guest {guest_id}: cannot start session: {e}");
                Self::refuse(
                    stream,
                    format!("daemon overloaded: cannot start the guest's session thread ({e})"),
                );
                self.cfg.sharing.detach_cpu(guest_id);
                self.drop_session(session, None);
                return None;
            }
        };
        if let Err(e) = send_json(stream, &welcome, Some(a.window.fd())) {
            log::warn!("guest {guest_id}: handshake failed: {e}");
            self.cfg.sharing.detach_cpu(guest_id);
            self.drop_session(session, Some(runner));
            return None;
        }
        Some(runner)
    }

    /// Undoes a registered session whose guest was not welcomed: unregistered, closed, its
    /// thread (when one started) joined, the guest detached.
    fn drop_session(&self, session: &Session, runner: Option<std::thread::JoinHandle<()>>) {
        let guest_id = session.guest_id();
        self.unregister(guest_id);
        session.close();
        if let Some(r) = runner {
            let _ = r.join();
        }
        self.svm.detach_guest(guest_id);
    }

    /// A remote guest: the token is checked before anything is allocated; then requests,
    /// completions and CPU-access bytes travel as frames on the stream.
    ///
    /// Its hello and token read, it leaves the `pending` connections and takes a guest's
    /// place.
    pub(super) fn tcp_connection(
        self: Arc<Self>,
        stream: TcpStream,
        peer: std::net::SocketAddr,
        pending: PendingGuard,
    ) {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_write_timeout(Some(self.cfg.handshake_timeout));
        // The hello, token included, must be complete by the deadline.
        let deadline = Instant::now() + self.cfg.handshake_timeout;
        let Some(hello) = self.read_hello(&stream, pending, deadline, Some(peer)) else {
            return;
        };
        let authorized = match (&self.cfg.token, &hello.token) {
            (Some(want), Some(got)) => constant_time_eq(want.as_bytes(), got.as_bytes()),
            _ => false,
        };
        if !authorized {
            return Self::refuse(
                &stream,
                format!("remote guest {peer}: bad or missing token"),
            );
        }
        let _place = match self.take_place() {
            Ok(p) => p,
            Err(reason) => return Self::refuse(&stream, reason),
        };
        let name = sanitize_name(&hello.name);
        let a = match self.admit(&hello) {
            Ok(a) => a,
            Err(reason) => return Self::refuse(&stream, reason),
        };
        let guest_id = a.guest_id;
        self.note_transport(guest_id, "tcp");
        // The welcome goes out on a clone before the link's first frame (the link only
        // writes completions, which need requests, which need the welcome).
        let (hello_stream, link) = match self.remote_link(stream, &a) {
            Ok(v) => v,
            Err(e) => {
                log::warn!("guest {guest_id}: handshake failed: {e}");
                self.svm.detach_guest(guest_id);
                return;
            }
        };
        let session = Session::new(
            guest_id,
            name.clone(),
            a.window.clone(),
            Arc::new(link),
            &self.cfg.limits,
        );
        self.register(&session);
        if !self.welcome_remote(&hello_stream, &session, &a, &hello) {
            self.drop_session(&session, None);
            return;
        }
        log::info!(
            "remote guest {guest_id} ({name}) connected from {peer}, coherence {}",
            a.kind
        );
        session.run(self.svm.clone(), self.devices.clone());
        self.unregister(guest_id);
    }

    /// The admitted remote guest's link on `stream` (charging its buffered bytes to the
    /// guest's memory, placing CPU-access bytes in its window) and a clone of the stream
    /// for the welcome.
    fn remote_link(
        &self,
        stream: TcpStream,
        a: &Admitted,
    ) -> std::io::Result<(TcpStream, StreamLink)> {
        let guest_id = a.guest_id;
        let w = stream.try_clone()?;
        let svm = self.svm.clone();
        let link = StreamLink::new(
            stream,
            a.layout.size,
            self.cfg.limits.remote_bytes_in_flight,
        )?
        .charging(Box::new(move |len| svm.charge(guest_id, len)))
        .placing(a.window.clone(), {
            let svm = self.svm.clone();
            Box::new(move |req, len| crate::session::remote_write_target(&svm, guest_id, req, len))
        });
        Ok((w, link))
    }

    /// Resumes or starts the remote guest's saved state and welcomes it; false when it was
    /// refused or the welcome could not be sent.
    ///
    /// A remote guest resumes its session (after a restart) with the secret it got in its
    /// welcome, like a process guest; it cannot follow a migration (only process and VM
    /// guests migrate).
    fn welcome_remote(
        self: &Arc<Self>,
        hello_stream: &TcpStream,
        session: &Arc<Session>,
        a: &Admitted,
        hello: &Hello,
    ) -> bool {
        let guest_id = a.guest_id;
        let mut welcome = self.welcome(a);
        let refusal = match self.restart.admit(self, session, hello.resume.as_deref()) {
            Ok(secret) => {
                if let Reply::Welcome { resume, .. } = &mut welcome {
                    *resume = Some(secret);
                }
                None
            }
            Err(crate::snapshot::restart::Refusal::Refused(reason)) => Some(reason),
            Err(crate::snapshot::restart::Refusal::Moved(socket)) => Some(format!(
                "this session moved to the daemon on {socket}, which a remote guest cannot \
                 follow"
            )),
        };
        if let Some(reason) = refusal {
            Self::refuse(hello_stream, reason);
            return false;
        }
        match send_json(hello_stream, &welcome, None)
            .map_err(|e| e.to_string())
            .and_then(|_| {
                hello_stream
                    .set_write_timeout(None)
                    .map_err(|e| e.to_string())
            }) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("guest {guest_id}: handshake failed: {e}");
                false
            }
        }
    }

    /// Reads a pending connection's hello by `deadline`; `None` when the connection was
    /// refused (answered here) or hung up. `peer`: a remote guest's address, named in the
    /// refusals and logs.
    fn read_hello(
        &self,
        stream: &impl AsFd,
        pending: PendingGuard,
        deadline: Instant,
        peer: Option<std::net::SocketAddr>,
    ) -> Option<Hello> {
        let closed = || match peer {
            Some(peer) => log::debug!("remote connection from {peer} closed before its hello"),
            None => log::debug!("connection closed before its hello"),
        };
        if let Err(refusal) = self.await_hello(stream, pending, deadline) {
            match (refusal, peer) {
                (Some(reason), Some(peer)) => {
                    Self::refuse(stream, format!("remote guest {peer}: {reason}"))
                }
                (Some(reason), None) => Self::refuse(stream, reason),
                (None, _) => closed(),
            }
            return None;
        }
        match recv_json_until(stream, deadline) {
            Ok((h, _)) => Some(h),
            Err(virtsoc_proto::ProtoError::Closed) => {
                closed();
                None
            }
            Err(e) => {
                let reason = match peer {
                    Some(peer) => format!("bad hello from {peer}: {e}"),
                    None => format!("bad hello: {e}"),
                };
                Self::refuse(stream, reason);
                None
            }
        }
    }

    /// Waits for a pending connection's complete hello (nothing read yet) and takes it out
    /// of the pending ones; `Err(Some(reason))` to refuse it, `Err(None)` when the peer hung
    /// up.
    fn await_hello(
        &self,
        stream: &impl AsFd,
        pending: PendingGuard,
        deadline: Instant,
    ) -> std::result::Result<(), Option<String>> {
        let reason = self.pending.cut_reason();
        match pending.await_hello(stream, deadline) {
            Awaited::Ready => Ok(()),
            Awaited::Cut => Err(Some(reason)),
            Awaited::Closed => Err(None),
            Awaited::TimedOut => Err(Some("bad hello: handshake timed out".into())),
        }
    }
}
