//! The daemon's services socket (`<socket>.services`, `virtsocd --services-socket`): host
//! programs connect there to register services
//! ([`virtsoc_services::external::serve_connection`]; the protocol is in
//! `docs/services.md`). One thread accepts; each connection has a thread of its own for as
//! long as its program stays. Who may register is decided per connection by the socket's
//! peer credentials (the daemon's user or root) or the daemon's token; the socket file's
//! permissions (the process umask) are the first gate.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use virtsoc_services::external::{serve_connection, Trust};
use virtsoc_services::hypervisor::Hypervisor;

use crate::{HostError, Result};

/// Programs connected at once (registered or registering); more are turned away.
pub const MAX_PROGRAMS: usize = 32;

/// The services socket of the daemon listening on `socket`: `<socket>.services`.
pub fn default_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".services");
    PathBuf::from(p)
}

/// The listening socket; its file is removed when this is dropped.
pub struct ServicesSocket {
    path: PathBuf,
}

impl ServicesSocket {
    /// Where it listens.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ServicesSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens on `path` for host programs registering services with `hv`, trusting the
/// daemon's user, root, and holders of `token`. A stale socket file is replaced.
pub fn start(hv: Arc<Hypervisor>, path: &Path, token: Option<String>) -> Result<ServicesSocket> {
    if std::fs::symlink_metadata(path).is_ok() {
        if UnixStream::connect(path).is_ok() {
            return Err(HostError::Config(format!(
                "another daemon is listening on {}",
                path.display()
            )));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    let trust = Arc::new(Trust {
        uid: rustix::process::geteuid().as_raw(),
        token,
    });
    let live = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("services-socket".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(sock) = conn else { continue };
                if live.fetch_add(1, Ordering::SeqCst) >= MAX_PROGRAMS {
                    live.fetch_sub(1, Ordering::SeqCst);
                    log::warn!("services socket: {MAX_PROGRAMS} programs already connected");
                    continue;
                }
                let (hv, trust, left) = (hv.clone(), trust.clone(), live.clone());
                let spawned = std::thread::Builder::new()
                    .name("service-program".into())
                    .spawn(move || {
                        match serve_connection(sock, &hv, &trust) {
                            Ok(name) => log::info!("service {name:?}: its program left"),
                            Err(e) => log::warn!("services socket: registration refused: {e}"),
                        }
                        left.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    live.fetch_sub(1, Ordering::SeqCst);
                    log::warn!("services socket: cannot start a thread for a program");
                }
            }
        })?;
    Ok(ServicesSocket {
        path: path.to_path_buf(),
    })
}
