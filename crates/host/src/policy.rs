//! The daemon's sharing policy (`virtsocd --policy FILE`): per-guest shares, rate caps,
//! allowed devices and commands, class (the model and parser are in
//! [`virtsoc_sched::policy`]).
//!
//! The store holds the current policy behind a lock; device workers read it per command
//! (an `Arc` clone) and re-apply shares when its generation moves. [`PolicyStore::reload`]
//! (on SIGHUP) parses the file again and swaps it in only if it is valid: a bad file keeps the
//! old policy and says why. What is not read per command (the guests' CPU weights) follows
//! through [`PolicyStore::on_change`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use virtsoc_proto::DeviceId;
use virtsoc_sched::policy::{GuestPolicy, Policy};
use virtsoc_sync::{LockExt, RwLockExt};

use crate::{HostError, Result};

/// Why a policy (a file, or one guest's through the control API) was refused beyond what
/// [`Policy::parse`] checks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A guest's policy was given without a guest name.
    #[error("a guest name is needed")]
    NoGuestName,
    /// A `device.command` names a declared device but none of its commands.
    #[error("line {line}: {device} has no command {command:?} (it has {known})")]
    UnknownCommand {
        /// Line of the policy text it is on (1 when there is no text).
        line: usize,
        /// The device.
        device: String,
        /// The command it does not have.
        command: String,
        /// The commands it has, comma-separated.
        known: String,
    },
}

/// Called with the new policy after every change.
type Watcher = Box<dyn Fn(&Policy) + Send + Sync>;

/// The current policy and where it came from.
pub struct PolicyStore {
    path: Option<PathBuf>,
    current: RwLock<Arc<Policy>>,
    generation: AtomicU64,
    watchers: Mutex<Vec<Watcher>>,
}

impl std::fmt::Debug for PolicyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyStore")
            .field("path", &self.path)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl Default for PolicyStore {
    fn default() -> Self {
        PolicyStore {
            path: None,
            current: RwLock::new(Arc::new(Policy::default())),
            generation: AtomicU64::new(0),
            watchers: Mutex::new(Vec::new()),
        }
    }
}

fn read(path: &Path) -> Result<Policy> {
    let bad = |e: String| HostError::Config(format!("policy {}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let p = Policy::parse(&text).map_err(|e| bad(e.to_string()))?;
    check_commands(&p, &text).map_err(|e| bad(e.to_string()))?;
    Ok(p)
}

/// Every `device.command` naming a declared device names one of its commands (a typo would
/// otherwise deny silently).
fn check_commands(p: &Policy, text: &str) -> std::result::Result<(), PolicyError> {
    for g in std::iter::once(&p.default).chain(p.guest.values()) {
        for c in g.commands.iter().flatten() {
            let Some((dev, cmd)) = c.split_once('.') else {
                continue;
            };
            let Some(decl) = virtsoc_devapi::ALL.iter().find(|d| d.name == dev) else {
                continue;
            };
            if cmd != "*" && !decl.commands.iter().any(|x| x.name == cmd) {
                let line = text
                    .lines()
                    .position(|l| l.contains(c.as_str()))
                    .map_or(1, |i| i + 1);
                let known: Vec<&str> = decl.commands.iter().map(|x| x.name).collect();
                return Err(PolicyError::UnknownCommand {
                    line,
                    device: dev.to_string(),
                    command: cmd.to_string(),
                    known: known.join(", "),
                });
            }
        }
    }
    Ok(())
}

impl PolicyStore {
    /// The policy in `path`; an error (naming the line) if it does not parse.
    pub fn load(path: &Path) -> Result<Self> {
        Ok(PolicyStore {
            path: Some(path.to_path_buf()),
            current: RwLock::new(Arc::new(read(path)?)),
            generation: AtomicU64::new(0),
            watchers: Mutex::new(Vec::new()),
        })
    }

    /// Calls `f` with the new policy after every successful change (a reload, on SIGHUP or
    /// from the control API, or a guest's entry set through the control API).
    pub fn on_change(&self, f: impl Fn(&Policy) + Send + Sync + 'static) {
        self.watchers.lock_or_recover().push(Box::new(f));
    }

    fn changed(&self, p: &Policy) {
        for w in self.watchers.lock_or_recover().iter() {
            w(p);
        }
    }

    /// Reads the file again; on error the old policy stays and the error says why.
    pub fn reload(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let p = Arc::new(read(path)?);
        *self.current.write_or_recover() = p.clone();
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.changed(&p);
        Ok(())
    }

    /// Sets the policy of guests named `name` (the control API's change; the file is not
    /// written, so a later reload from it replaces this). Refused, keeping the old policy,
    /// when a command it names is not one of its device's.
    pub fn set_guest(
        &self,
        name: &str,
        guest: GuestPolicy,
    ) -> std::result::Result<(), PolicyError> {
        if name.is_empty() {
            return Err(PolicyError::NoGuestName);
        }
        let mut current = self.current.write_or_recover();
        let mut next = (**current).clone();
        next.guest.insert(name.to_string(), guest);
        check_commands(&next, "")?;
        let next = Arc::new(next);
        *current = next.clone();
        drop(current);
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.changed(&next);
        Ok(())
    }

    /// The policy now.
    pub fn current(&self) -> Arc<Policy> {
        self.current.read_or_recover().clone()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_commands_of_declared_devices_are_errors_with_their_line() {
        let dir = std::env::temp_dir().join(format!("virtsoc-policy-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("p.toml");
        std::fs::write(&f, "[guest.a]\nshares = 5\ncommands = [\"gpu.composit\"]\n").unwrap();
        let e = PolicyStore::load(&f).unwrap_err().to_string();
        assert!(e.contains("line 3") && e.contains("composite"), "{e}");
        std::fs::write(
            &f,
            "[guest.a]\ncommands = [\"gpu.composite\", \"mystery.x\"]\n",
        )
        .unwrap();
        let store = PolicyStore::load(&f).unwrap();
        assert_eq!(store.generation(), 0);
        // A bad reload keeps the policy.
        std::fs::write(&f, "[guest.a]\nshares = -1\n").unwrap();
        assert!(store.reload().is_err());
        assert_eq!(store.generation(), 0);
        assert!(store.current().guest.contains_key("a"));
        std::fs::write(&f, "[guest.b]\n").unwrap();
        store.reload().unwrap();
        assert_eq!(store.generation(), 1);
        assert!(store.current().guest.contains_key("b"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn watchers_hear_of_good_changes_only() {
        let dir = std::env::temp_dir().join(format!("virtsoc-policy-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("p.toml");
        std::fs::write(&f, "[guest.a]\nshares = 100\n").unwrap();
        let store = PolicyStore::load(&f).unwrap();
        let heard = Arc::new(Mutex::new(Vec::new()));
        let h = heard.clone();
        store.on_change(move |p| h.lock().unwrap().push(p.for_guest("a").shares));
        std::fs::write(&f, "[guest.a]\nshares = 300\n").unwrap();
        store.reload().unwrap();
        std::fs::write(&f, "[guest.a]\nshares = -1\n").unwrap();
        assert!(store.reload().is_err());
        let g = GuestPolicy {
            shares: 50,
            ..GuestPolicy::default()
        };
        store.set_guest("a", g).unwrap();
        assert_eq!(*heard.lock().unwrap(), vec![300, 50]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn set_guest_refusals_are_typed_and_keep_the_old_policy() {
        let store = PolicyStore::default();
        assert_eq!(
            store.set_guest("", GuestPolicy::default()),
            Err(PolicyError::NoGuestName)
        );
        let typo = GuestPolicy {
            commands: Some(vec!["codec.decod".into()]),
            ..GuestPolicy::default()
        };
        let e = store.set_guest("a", typo).unwrap_err();
        assert!(
            matches!(&e, PolicyError::UnknownCommand { device, command, .. }
                if device == "codec" && command == "decod"),
            "{e:?}"
        );
        assert!(e
            .to_string()
            .starts_with("line 1: codec has no command \"decod\" (it has "));
        assert_eq!(store.generation(), 0);
        assert!(store.current().guest.is_empty());
    }
}
