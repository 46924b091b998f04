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
        if let Err(refusal) = self.await_hello(&stream, pending, deadline) {
            return match refusal {
                Some(reason) => Self::refuse(&stream, reason),
                None => log::debug!("connection closed before its hello"),
            };
        }
        let hello: Hello = match recv_json_until(&stream, deadline) {
            Ok((h, _)) => h,
            Err(virtsoc_proto::ProtoError::Closed) => {
                return log::debug!("connection closed before its hello")
            }
            Err(e) => return Self::refuse(&stream, format!("bad hello: {e}")),
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
        let hangup = match stream.try_clone() {
            Ok(s) => s,
            Err(e) => {
                log::warn!("guest {guest_id}: {e}");
                self.svm.detach_guest(guest_id);
                return;
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
            .attach_cpu(guest_id, session.name(), crate::cgroup::peer_pid(&stream));
        let mut welcome = self.welcome(&a);
        match self.restart.admit(&self, &session, hello.resume.as_deref()) {
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
                        Self::refuse(&stream, reason)
                    }
                    crate::snapshot::restart::Refusal::Moved(socket) => {
                        let _ = send_json(&stream, &Reply::Moved { socket }, None);
                    }
                }
                self.unregister(guest_id);
                session.close();
                self.svm.detach_guest(guest_id);
                return;
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
                    &stream,
                    format!("daemon overloaded: cannot start the guest's session thread ({e})"),
                );
                self.cfg.sharing.detach_cpu(guest_id);
                self.unregister(guest_id);
                session.close();
                self.svm.detach_guest(guest_id);
                return;
            }
        };
        if let Err(e) = send_json(&stream, &welcome, Some(a.window.fd())) {
            log::warn!("guest {guest_id}: handshake failed: {e}");
            self.cfg.sharing.detach_cpu(guest_id);
            self.unregister(guest_id);
            session.close();
            let _ = runner.join();
            self.svm.detach_guest(guest_id);
            return;
        }
        let _ = stream.set_write_timeout(None);
        // Watch for the hang-up: a crashed guest's socket reads EOF.
        let mut buf = [0u8; 64];
        while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
        session.close();
        let _ = runner.join();
        self.cfg.sharing.detach_cpu(guest_id);
        self.unregister(guest_id);
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
        if let Err(refusal) = self.await_hello(&stream, pending, deadline) {
            return match refusal {
                Some(reason) => Self::refuse(&stream, format!("remote guest {peer}: {reason}")),
                None => log::debug!("remote connection from {peer} closed before its hello"),
            };
        }
        let hello: Hello = match recv_json_until(&stream, deadline) {
            Ok((h, _)) => h,
            Err(virtsoc_proto::ProtoError::Closed) => {
                return log::debug!("remote connection from {peer} closed before its hello")
            }
            Err(e) => return Self::refuse(&stream, format!("bad hello from {peer}: {e}")),
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
        let (hello_stream, link) = match stream.try_clone().and_then(|w| {
            let svm = self.svm.clone();
            let link = StreamLink::new(
                stream,
                a.layout.size,
                self.cfg.limits.remote_bytes_in_flight,
            )?
            .charging(Box::new(move |len| {
                svm.charge(guest_id, len)
                    .map_err(|e| format!("buffering it would pass the guest's memory limit ({e})"))
            }))
            .placing(a.window.clone(), {
                let svm = self.svm.clone();
                Box::new(move |req, len| {
                    crate::session::remote_write_target(&svm, guest_id, req, len)
                })
            });
            Ok((w, link))
        }) {
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
        // A remote guest resumes its session (after a restart) with the secret it got in
        // its welcome, like a process guest; it cannot follow a migration (only process and
        // VM guests migrate).
        let mut welcome = self.welcome(&a);
        let refusal = match self.restart.admit(&self, &session, hello.resume.as_deref()) {
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
        let sent = match refusal {
            Some(reason) => {
                Self::refuse(&hello_stream, reason);
                false
            }
            None => match send_json(&hello_stream, &welcome, None)
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
            },
        };
        if !sent {
            self.unregister(guest_id);
            session.close();
            self.svm.detach_guest(guest_id);
            return;
        }
        log::info!(
            "remote guest {guest_id} ({name}) connected from {peer}, coherence {}",
            a.kind
        );
        session.run(self.svm.clone(), self.devices.clone());
        self.unregister(guest_id);
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
