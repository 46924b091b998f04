//! The daemon's sharing policy (`virtsocd --policy FILE`): per-guest shares, rate caps,
//! allowed devices and commands, class (the model and parser are in
//! [`virtsoc_sched::policy`]).
//!
//! The store holds the current policy behind a lock; device workers read it per command
//! (an `Arc` clone) and re-apply shares when its generation moves. [`PolicyStore::reload`]
//! (on SIGHUP) parses the file again and swaps it in only if it is valid: a bad file keeps the
//! old policy and says why.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use virtsoc_proto::DeviceId;
use virtsoc_sched::policy::{GuestPolicy, Policy};

use crate::{HostError, Result};

/// The current policy and where it came from.
#[derive(Debug)]
pub struct PolicyStore {
    path: Option<PathBuf>,
    current: RwLock<Arc<Policy>>,
    generation: AtomicU64,
}

impl Default for PolicyStore {
    fn default() -> Self {
        PolicyStore {
            path: None,
            current: RwLock::new(Arc::new(Policy::default())),
            generation: AtomicU64::new(0),
        }
    }
}

fn read(path: &Path) -> Result<Policy> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| HostError::Config(format!("policy {}: {e}", path.display())))?;
    Policy::parse(&text).map_err(|e| HostError::Config(format!("policy {}: {e}", path.display())))
}

impl PolicyStore {
    /// The policy in `path`; an error (naming the line) if it does not parse.
    pub fn load(path: &Path) -> Result<Self> {
        Ok(PolicyStore {
            path: Some(path.to_path_buf()),
            current: RwLock::new(Arc::new(read(path)?)),
            generation: AtomicU64::new(0),
        })
    }

    /// Reads the file again; on error the old policy stays and the error says why.
    pub fn reload(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let p = read(path)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(p);
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// The policy now.
    pub fn current(&self) -> Arc<Policy> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Bumped at every successful reload.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}

/// Whether `guest` may send the device command `args[0]` to device `dev` (named `device`).
/// Commands the declaration does not know are left to the device's own validation.
pub fn allows_command(guest: &GuestPolicy, dev: DeviceId, device: &str, op: u64) -> bool {
    if !guest.allows_device(device) {
        return false;
    }
    if guest.commands.is_none() {
        return true;
    }
    virtsoc_devapi::device(dev)
        .and_then(|d| d.commands.iter().find(|c| c.op == op))
        .is_none_or(|c| guest.allows_command(device, c.name))
}
