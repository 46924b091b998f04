//! The sharing policy: what each guest, named as it names itself at the handshake (a VM
//! guest by its VM name), may use and how much of each device it gets.
//!
//! ```toml
//! [default]            # guests not listed below (every field optional)
//! shares = 100
//!
//! [guest.video]
//! shares = 400                          # weight under wfq / fixed-rate / aimd
//! class = "multimedia"                  # or "batch" (the default)
//! devices = ["codec", "display", "gpu"] # devices it may use (absent: all)
//! commands = ["gpu.composite", "codec.*"] # device commands it may send (absent: all)
//! rate_cap = 500                        # requests per second on each device (commands and accesses)
//! memory_limit = 268435456              # bytes its replicas may hold
//! codec_threads = 8                     # codec threads it may hold (absent: the daemon's share)
//! codec_sessions = 4                    # decoders + encoders (worker processes) it may hold
//! fence_wait_ms = 10000                 # longest a device queue of its waits on a fence
//! ```
//!
//! The same in JSON (`{"default": {...}, "guest": {"video": {...}}}`) is accepted too. A file
//! that does not parse, has an unknown field, or a value out of range is an error naming its
//! line. The policy is declarative on purpose: the checks it makes (a set lookup per command,
//! a weight, a token bucket) need no program, so there is nothing to verify or sandbox as
//! AvA's eBPF router programs are, and a guest cannot make it loop or allocate.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::{Result, SchedError, DEFAULT_SHARE};

/// A guest's class: multimedia guests behind their desired frame rate go ahead of batch ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// Presents frames at a rate it needs (video, camera, games): steered by the feedback loop
    /// and boosted when behind its desired frame rate.
    Multimedia,
    #[default]
    /// Throughput work without a frame rate; served after multimedia guests that are behind.
    Batch,
}

/// What one guest may do.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestPolicy {
    #[serde(default = "default_shares")]
    /// Weight of the guest's device time (and CPU weight) against other guests' (default 100).
    pub shares: u32,
    #[serde(default)]
    /// Multimedia or batch.
    pub class: Class,
    /// Devices it may use; `None`: every device.
    #[serde(default)]
    pub devices: Option<Vec<String>>,
    /// Device commands it may send, as `device.command` or `device.*`; `None`: every one.
    #[serde(default)]
    pub commands: Option<Vec<String>>,
    /// Requests (device commands and the accesses bracketing them) per second on each
    /// device.
    #[serde(default)]
    pub rate_cap: Option<f64>,
    /// Bytes its replicas may hold.
    #[serde(default)]
    pub memory_limit: Option<u64>,
    /// Codec threads (decoders' frame threads, encoders' fixed count) it may hold at once;
    /// `None`: the daemon's `--limit-codec-threads-per-guest`. The daemon's own capacity
    /// (`--limit-codec-threads`) still bounds every guest together.
    #[serde(default)]
    pub codec_threads: Option<u32>,
    /// Codec sessions (decoders and encoders, each a worker process of its own) it may hold
    /// at once; `None`: the daemon's `--limit-codec-sessions`. The daemon's
    /// `--limit-codec-sessions-total` still bounds every guest together.
    #[serde(default)]
    pub codec_sessions: Option<u32>,
    /// The longest one of its device queues waits on a fence (`eglWaitSync`, a
    /// `FenceWait`) before the wait is given up and the work behind it runs: a fence that is
    /// never signaled must not hold the queue forever, as a GPU driver's job timeout does not.
    /// `None`: [`DEFAULT_FENCE_WAIT_MS`].
    #[serde(default)]
    pub fence_wait_ms: Option<u64>,
}

/// Largest per-guest `codec_threads` a policy may name.
pub const MAX_CODEC_THREADS: u32 = 1024;
/// Largest per-guest `codec_sessions` a policy may name.
pub const MAX_CODEC_SESSIONS: u32 = 1024;
/// How long a device queue waits on a fence by default (as long as Linux GPU drivers' job
/// timeouts, 10 s).
pub const DEFAULT_FENCE_WAIT_MS: u64 = 10_000;
/// Longest `fence_wait_ms` a policy may name (one hour).
pub const MAX_FENCE_WAIT_MS: u64 = 3_600_000;

fn default_shares() -> u32 {
    DEFAULT_SHARE
}

impl Default for GuestPolicy {
    fn default() -> Self {
        GuestPolicy {
            shares: DEFAULT_SHARE,
            class: Class::Batch,
            devices: None,
            commands: None,
            rate_cap: None,
            memory_limit: None,
            codec_threads: None,
            codec_sessions: None,
            fence_wait_ms: None,
        }
    }
}

impl GuestPolicy {
    /// Whether the guest may use `device` at all.
    pub fn allows_device(&self, device: &str) -> bool {
        self.devices
            .as_ref()
            .is_none_or(|d| d.iter().any(|x| x == device))
    }

    /// Whether the guest may send `device`'s command `command`.
    pub fn allows_command(&self, device: &str, command: &str) -> bool {
        self.allows_device(device)
            && self.commands.as_ref().is_none_or(|cs| {
                cs.iter().any(|c| match c.split_once('.') {
                    Some((d, "*")) => d == device,
                    Some((d, n)) => d == device && n == command,
                    None => false,
                })
            })
    }

    /// The longest one of its device queues waits on a fence.
    pub fn fence_wait(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.fence_wait_ms.unwrap_or(DEFAULT_FENCE_WAIT_MS))
    }

    fn check(&self) -> std::result::Result<(), InvalidValue> {
        let range = |name, value: u64, max: u64| {
            if (1..=max).contains(&value) {
                Ok(())
            } else {
                Err(InvalidValue::OutOfRange { name, value, max })
            }
        };
        range("shares", u64::from(self.shares), 1_000_000)?;
        if let Some(n) = self.codec_threads {
            range("codec_threads", u64::from(n), u64::from(MAX_CODEC_THREADS))?;
        }
        if let Some(n) = self.codec_sessions {
            range(
                "codec_sessions",
                u64::from(n),
                u64::from(MAX_CODEC_SESSIONS),
            )?;
        }
        if let Some(ms) = self.fence_wait_ms {
            range("fence_wait_ms", ms, MAX_FENCE_WAIT_MS)?;
        }
        if let Some(r) = self.rate_cap {
            if !(r.is_finite() && r > 0.0) {
                return Err(InvalidValue::RateCap(r));
            }
        }
        for c in self.commands.iter().flatten() {
            if c.split_once('.')
                .is_none_or(|(d, n)| d.is_empty() || n.is_empty())
            {
                return Err(InvalidValue::Command(c.clone()));
            }
        }
        Ok(())
    }
}

/// A value of a guest's policy that parses but is not allowed; its text is the message of
/// the [`SchedError::Policy`] the file is refused with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidValue {
    /// A number outside `1..=max`.
    #[error("{name} {value} out of range 1..={max}")]
    OutOfRange {
        /// The field.
        name: &'static str,
        /// Its value.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// A `rate_cap` that is not a positive number.
    #[error("rate_cap {0} is not a positive number")]
    RateCap(f64),
    /// A `commands` entry that is not `device.command` or `device.*`.
    #[error("command {0:?} is not device.command or device.*")]
    Command(String),
}

/// A whole policy file.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(default)]
    /// What guests not named in `guest` get.
    pub default: GuestPolicy,
    #[serde(default)]
    /// Policies by guest name, VM name or token identity.
    pub guest: BTreeMap<String, GuestPolicy>,
}

impl Policy {
    /// Parses a policy: JSON if it starts with `{`, TOML otherwise.
    pub fn parse(text: &str) -> Result<Policy> {
        let p: Policy = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| SchedError::Policy {
                line: e.line(),
                msg: e.to_string(),
            })?
        } else {
            toml::from_str(text).map_err(|e| SchedError::Policy {
                line: e
                    .span()
                    .map_or(1, |s| line_of(text, s.start.min(text.len()))),
                msg: e.message().to_string(),
            })?
        };
        p.default.check().map_err(|msg| SchedError::Policy {
            line: find_line(text, "default"),
            msg: format!("default: {msg}"),
        })?;
        for (name, g) in &p.guest {
            g.check().map_err(|msg| SchedError::Policy {
                line: find_line(text, name),
                msg: format!("guest {name:?}: {msg}"),
            })?;
        }
        Ok(p)
    }

    /// The policy of the guest named `name`.
    pub fn for_guest(&self, name: &str) -> &GuestPolicy {
        self.guest.get(name).unwrap_or(&self.default)
    }
}

fn line_of(text: &str, byte: usize) -> usize {
    text.as_bytes()[..byte]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// The first line naming `key` (a table header or a JSON key), 1 if none.
fn find_line(text: &str, key: &str) -> usize {
    text.lines()
        .position(|l| {
            l.contains(&format!("guest.{key}]"))
                || l.contains(&format!("guest.\"{key}\"]"))
                || l.contains(&format!("[{key}]"))
                || l.contains(&format!("\"{key}\""))
        })
        .map_or(1, |i| i + 1)
}
