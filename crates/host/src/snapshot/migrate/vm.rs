//! The VM guest's part of a migration: its port (the doorbell connection QEMU holds, and
//! the memory file) moves from the source to the target at the hand-over, and back into the
//! source's hands if the migration does not commit.

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use virtsoc_proto::handshake::recv_json;

use crate::session::Session;
use crate::snapshot::format::err;
use crate::snapshot::image::SessionImage;
use crate::vm::{Current, VmPort};
use crate::{Daemon, Result};

/// How long the source waits for the target to take a VM's port.
const PORT_TIMEOUT: Duration = Duration::from_secs(10);

/// A VM guest's port on its way to the target.
pub(super) struct Moving {
    /// The source's own descriptor of the connection, kept until the commit.
    port: VmPort,
    /// The session as it was at the hand-over (the target writes the same window).
    image: SessionImage,
    /// The session the port served, until the caller has closed it.
    pub(super) current: Option<Current>,
}

impl Moving {
    /// The migration did not commit: parks the session's image under its resume secret and
    /// reads the port again; the guest's next hello resumes the session here.
    pub(super) fn resume_here(self, daemon: &Arc<Daemon>, s: &Session) {
        let secret = self.image.guest.resume.clone();
        daemon.restart().park_returned(secret, self.image);
        s.release(daemon.svm(), daemon.devices());
        log::warn!(
            "VM guest {}: migration not committed; the guest resumes here",
            s.guest_id()
        );
        crate::vm::serve_again(daemon.clone(), self.port, None);
    }
}

/// Stops serving VM guest `s`'s port, keeps the session's image, and passes the port to the
/// target's port socket `to` (presenting `token`, naming the session by `secret`). On a
/// failure the port is served here again with its session.
pub(super) fn hand_over(
    daemon: &Arc<Daemon>,
    s: &Arc<Session>,
    to: &str,
    token: &str,
    secret: &str,
) -> Result<Moving> {
    let handed = crate::vm::take(daemon, s.guest_id())?;
    let sent = super::super::capture(daemon, s).and_then(|mut image| {
        image.guest.resume = secret.to_string();
        let sock = UnixStream::connect(to)?;
        sock.set_read_timeout(Some(PORT_TIMEOUT))?;
        sock.set_write_timeout(Some(PORT_TIMEOUT))?;
        let header = serde_json::json!({
            "token": token,
            "secret": secret,
            "name": handed.port.name(),
        });
        crate::vm::send_port(&sock, &header, &handed.port)?;
        let (answer, _): (serde_json::Value, _) = recv_json(&sock)?;
        if answer["ok"] != serde_json::Value::Bool(true) {
            return Err(err(format!(
                "the target did not take the VM's port: {}",
                answer["error"].as_str().unwrap_or("no reason")
            )));
        }
        Ok(image)
    });
    match sent {
        Ok(image) => Ok(Moving {
            port: handed.port,
            image,
            current: handed.current,
        }),
        Err(e) => {
            crate::vm::serve_again(daemon.clone(), handed.port, handed.current);
            Err(e)
        }
    }
}
