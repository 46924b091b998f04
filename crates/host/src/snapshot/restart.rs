//! Sessions that survive a daemon restart (`virtsocd --state-dir DIR`).
//!
//! Every admitted process or remote (TCP) guest gets a *resume secret* in its welcome (128
//! random bits); a remote guest proves with it that it is the same guest. On SIGTERM
//! the daemon saves every session to `DIR/session-<prefix>.snap` (quiesced, and left paused
//! so nothing the guest sends afterwards is lost silently: it is refused with the hang-up)
//! before closing them. On start it reads and validates every such file; a file that fails
//! is logged and left alone (never restored partially). A guest that reconnects with its
//! secret (`Hello::resume`) gets its session restored into its new connection, with the
//! same region ids, fence ids and bytes, and the file is removed; unclaimed sessions stay
//! parked (and on disk) until claimed.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use virtsoc_svm::GuestId;

use super::image::SessionImage;
use super::migrate::Confirm;
use crate::session::Session;
use crate::Daemon;
use virtsoc_sync::LockExt;

/// A saved session waiting for its guest.
struct Parked {
    /// Its file in the state directory (none: only in memory).
    path: Option<PathBuf>,
    img: SessionImage,
    /// An incoming migration's candidate: the source must confirm it before the guest runs.
    confirm: Option<Arc<Confirm>>,
}

/// Resume secrets of live sessions and the saved sessions waiting for their guest.
#[derive(Default)]
pub struct Restart {
    /// Guest id -> its resume secret.
    tokens: Mutex<HashMap<GuestId, String>>,
    /// Resume secret -> the saved session.
    parked: Mutex<HashMap<String, Parked>>,
    /// Resume secret -> the Unix socket of the daemon the session migrated to.
    moved: Mutex<HashMap<String, String>>,
    /// The port of each VM guest served here (a VM guest's migration moves it).
    pub(crate) vm_ports: crate::vm::VmPorts,
}

/// Why a guest is not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Refused, for this reason.
    Refused(String),
    /// Its session lives in the daemon on this socket now.
    Moved(String),
}

/// A fresh resume secret: 128 bits from the kernel's CSPRNG, in hex.
pub fn new_secret() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn file_for(dir: &Path, secret: &str) -> PathBuf {
    // Only a prefix of the secret names the file (the rest stays secret to listings).
    dir.join(format!("session-{}.snap", &secret[..secret.len().min(12)]))
}

impl Restart {
    /// Reads every saved session in `dir` (creating it, mode 0700, if missing).
    pub fn load(dir: &Path) -> crate::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let named = |what: &str, e: std::io::Error| {
            crate::HostError::Config(format!(
                "--state-dir {}: cannot {what} it: {e}",
                dir.display()
            ))
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| named("create", e))?;
        let r = Restart::default();
        let mut parked = r.parked.lock_or_recover();
        let entries = std::fs::read_dir(dir).map_err(|e| named("read", e))?;
        for e in entries.filter_map(|e| e.ok()) {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("session-") && name.ends_with(".snap")) {
                continue;
            }
            match super::read_image(&path) {
                Ok(img) if img.guest.resume.len() >= 32 => {
                    log::info!(
                        "saved session of guest {} ({}) from {}: {} regions, waiting for its guest",
                        img.guest.source_guest,
                        img.guest.name,
                        path.display(),
                        img.regions.len()
                    );
                    parked.insert(
                        img.guest.resume.clone(),
                        Parked {
                            path: Some(path),
                            img,
                            confirm: None,
                        },
                    );
                }
                Ok(_) => log::error!("{}: no resume secret; not restored", path.display()),
                Err(e) => log::error!("{}: {e}; not restored", path.display()),
            }
        }
        drop(parked);
        Ok(r)
    }

    /// Sessions waiting for their guest.
    pub fn parked(&self) -> usize {
        self.parked.lock_or_recover().len()
    }

    /// The resume secret of guest `id`.
    pub fn secret_of(&self, id: GuestId) -> Option<String> {
        self.tokens.lock_or_recover().get(&id).cloned()
    }

    /// Parks an incoming migration's session until its guest arrives with its secret; the
    /// guest is welcomed only once `confirm` got the source's commit.
    pub fn park_candidate(&self, secret: String, img: SessionImage, confirm: Arc<Confirm>) {
        self.moved.lock_or_recover().remove(&secret);
        self.parked.lock_or_recover().insert(
            secret,
            Parked {
                path: None,
                img,
                confirm: Some(confirm),
            },
        );
    }

    /// Drops the candidate parked with `confirm` (its source gave up) unless its guest took
    /// it meanwhile; true if dropped.
    pub fn drop_candidate(&self, secret: &str, confirm: &Arc<Confirm>) -> bool {
        let mut parked = self.parked.lock_or_recover();
        let ours = parked
            .get(secret)
            .and_then(|p| p.confirm.as_ref())
            .is_some_and(|c| Arc::ptr_eq(c, confirm));
        if ours {
            parked.remove(secret);
            confirm.abandon();
        }
        ours
    }

    /// The confirmation of the incoming migration parked under `secret`, if any.
    pub fn candidate(&self, secret: &str) -> Option<Arc<Confirm>> {
        self.parked
            .lock_or_recover()
            .get(secret)
            .and_then(|p| p.confirm.clone())
    }

    /// A migration of this daemon's session did not commit: parks the session it kept, so
    /// the guest resumes it here, and stops sending the guest to the target (in this order,
    /// so a guest reconnecting meanwhile is either sent away or finds it).
    pub fn park_returned(&self, secret: String, img: SessionImage) {
        self.parked.lock_or_recover().insert(
            secret.clone(),
            Parked {
                path: None,
                img,
                confirm: None,
            },
        );
        self.moved.lock_or_recover().remove(&secret);
    }

    /// Records that the session with `secret` moved to the daemon on `socket`.
    pub fn moved(&self, secret: &str, socket: &str) {
        self.moved
            .lock_or_recover()
            .insert(secret.to_string(), socket.to_string());
    }

    /// Forgets guest `id`'s secret (its session ended).
    pub fn forget(&self, id: GuestId) {
        self.tokens.lock_or_recover().remove(&id);
    }

    /// Admits `session` (registered, not yet welcomed): with `resume`, restores the parked
    /// session it names into it; returns the secret for its welcome. `Err` is the refusal.
    pub fn admit(
        &self,
        daemon: &Daemon,
        session: &Arc<Session>,
        resume: Option<&str>,
    ) -> Result<String, Refusal> {
        let id = session.guest_id();
        let secret = match resume {
            None => new_secret()
                .map_err(|e| Refusal::Refused(format!("cannot make a resume secret: {e}")))?,
            Some(want) => {
                let found = self.parked.lock_or_recover().remove(want);
                let Some(Parked { path, img, confirm }) = found else {
                    if let Some(to) = self.moved.lock_or_recover().get(want) {
                        return Err(Refusal::Moved(to.clone()));
                    }
                    return Err(Refusal::Refused(
                        "unknown resume secret: no saved session for it here (a wrong secret, or a \
                         session already resumed)"
                            .into(),
                    ));
                };
                match super::restore(daemon, id, &img) {
                    Ok(r) => {
                        if let Some(c) = &confirm {
                            if let Err(e) = c.confirm() {
                                // Not committed: the source keeps the session and resumes it.
                                c.abandon();
                                for slot in daemon.devices().iter() {
                                    slot.device.guest_gone(id);
                                }
                                daemon.svm().detach_guest(id);
                                log::warn!("guest {id}: incoming migration not committed: {e}");
                                return Err(Refusal::Refused(format!(
                                    "the migration of this session did not commit ({e}); it \
                                     resumes on its source"
                                )));
                            }
                        }
                        if let Some(path) = &path {
                            let _ = std::fs::remove_file(path);
                        }
                        // The secret is the guest's before anyone hears it resumed (a
                        // migration asked for right after needs it).
                        self.tokens.lock_or_recover().insert(id, want.to_string());
                        log::info!(
                            "guest {id} resumed the session of guest {} ({} regions)",
                            img.guest.source_guest,
                            r.regions
                        );
                        want.to_string()
                    }
                    Err(e) => {
                        let msg = format!("saved session not restored: {e}");
                        self.parked
                            .lock_or_recover()
                            .insert(want.to_string(), Parked { path, img, confirm });
                        return Err(Refusal::Refused(msg));
                    }
                }
            }
        };
        self.tokens.lock_or_recover().insert(id, secret.clone());
        Ok(secret)
    }

    /// Saves every live session to `dir`, leaving each paused (the daemon is stopping).
    /// Returns how many were saved; a session that fails is logged and lost alone.
    pub fn save_all(&self, daemon: &Daemon, dir: &Path) -> usize {
        let mut saved = 0;
        // Sessions whose guest has not come back yet after a migration that did not commit
        // live only in memory (a migration's uncommitted candidate belongs to its source).
        for (secret, p) in self.parked.lock_or_recover().iter() {
            let (path, img) = (&p.path, &p.img);
            if path.is_none() && p.confirm.is_none() {
                let file = file_for(dir, secret);
                match super::write_image(&file, img) {
                    Ok(_) => saved += 1,
                    Err(e) => log::error!("{}: parked session not saved: {e}", file.display()),
                }
            }
        }
        for s in daemon.sessions() {
            if s.is_closed() {
                continue;
            }
            let id = s.guest_id();
            let Some(secret) = self.secret_of(id) else {
                continue;
            };
            let path = file_for(dir, &secret);
            match super::save_session(daemon, &s, &path, &secret, false) {
                Ok(r) => {
                    log::info!(
                        "guest {id}: session saved to {} ({} regions, {} bytes)",
                        path.display(),
                        r.regions,
                        r.file_bytes
                    );
                    saved += 1;
                }
                Err(e) => log::error!("guest {id}: session not saved: {e}"),
            }
        }
        saved
    }
}
