//! Which guest may use which service, and whether a service runs one instance for all
//! guests or one per guest: the services policy, a JSON document the daemon reads from a
//! file and the control API replaces at run time.
//!
//! ```json
//! { "allow": { "*": ["geo", "sensor", "clipboard"], "bench": ["*"] },
//!   "instances": { "bulk": "per-guest" } }
//! ```
//!
//! A guest gets the list under its name (the name it gave at the handshake), else the list
//! under `"*"`; `"*"` in a list allows every service. With no policy every guest may use
//! every service. Guest names are a claim, as in the sharing policy.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::{Result, ServiceError};

/// Shared or per-guest instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Instances {
    /// One instance serves every guest.
    Shared,
    /// Each guest gets its own instance (its state is its own).
    PerGuest,
}

/// The services policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicePolicy {
    /// Services allowed per guest name (`"*"`: any other guest).
    #[serde(default = "allow_all")]
    pub allow: HashMap<String, Vec<String>>,
    /// Instance mode per service (the service's own default otherwise).
    #[serde(default)]
    pub instances: HashMap<String, Instances>,
    /// Calls a service runs at once, for the services that are limited (unlimited
    /// otherwise): the calls waiting are admitted in the order `scheduler` picks.
    #[serde(default)]
    pub concurrency: HashMap<String, usize>,
    /// The scheduler ordering a limited service's calls between guests (`round-robin`,
    /// `wfq`, `fixed-rate`, `aimd`, as `virtsocd --scheduler`).
    #[serde(default)]
    pub scheduler: Option<String>,
    /// Guests' shares (weights) for that scheduler, by guest name (100 otherwise).
    #[serde(default)]
    pub shares: HashMap<String, u32>,
    /// How long a transfer may go without a packet before the host drops it (for channels
    /// opened from now on; the daemon's default otherwise).
    #[serde(default)]
    pub transfer_timeout_ms: Option<u64>,
    /// How long one call may take before its guest gets an error (10 s otherwise). A host
    /// program that lets a call pass it is taken for hung and disconnected.
    #[serde(default)]
    pub call_timeout_ms: Option<u64>,
}

fn allow_all() -> HashMap<String, Vec<String>> {
    HashMap::from([("*".to_string(), vec!["*".to_string()])])
}

impl Default for ServicePolicy {
    fn default() -> Self {
        ServicePolicy {
            allow: allow_all(),
            instances: HashMap::new(),
            concurrency: HashMap::new(),
            scheduler: None,
            shares: HashMap::new(),
            transfer_timeout_ms: None,
            call_timeout_ms: None,
        }
    }
}

impl ServicePolicy {
    /// Parses a policy (JSON); errors name the field.
    pub fn parse(text: &str) -> Result<Self> {
        let p: Self =
            serde_json::from_str(text).map_err(|e| ServiceError::Policy(e.to_string()))?;
        p.check()
    }

    /// A policy from a JSON value (the control API's body).
    pub fn from_value(v: &serde_json::Value) -> Result<Self> {
        let p: Self =
            serde_json::from_value(v.clone()).map_err(|e| ServiceError::Policy(e.to_string()))?;
        p.check()
    }

    fn check(self) -> Result<Self> {
        self.scheduler_kind()?;
        if let Some((s, _)) = self.concurrency.iter().find(|(_, n)| **n == 0) {
            return Err(ServiceError::Policy(format!(
                "concurrency of {s:?}: at least 1"
            )));
        }
        if self.transfer_timeout_ms == Some(0) {
            return Err(ServiceError::Policy(
                "transfer_timeout_ms: at least 1".into(),
            ));
        }
        if self.call_timeout_ms == Some(0) {
            return Err(ServiceError::Policy("call_timeout_ms: at least 1".into()));
        }
        if let Some((g, _)) = self.shares.iter().find(|(_, n)| **n == 0) {
            return Err(ServiceError::Policy(format!("share of {g:?}: at least 1")));
        }
        Ok(self)
    }

    /// The scheduler of limited services.
    pub fn scheduler_kind(&self) -> Result<virtsoc_sched::Kind> {
        match &self.scheduler {
            None => Ok(virtsoc_sched::Kind::RoundRobin),
            Some(s) => s
                .parse()
                .map_err(|e: virtsoc_sched::SchedError| ServiceError::Policy(e.to_string())),
        }
    }

    /// Whether guest `guest` may use service `service`.
    pub fn allows(&self, guest: &str, service: &str) -> bool {
        self.allow
            .get(guest)
            .or_else(|| self.allow.get("*"))
            .is_some_and(|l| l.iter().any(|s| s == "*" || s == service))
    }

    /// The instance mode of `service`, `default` unless the policy names one.
    pub fn instances(&self, service: &str, default: Instances) -> Instances {
        self.instances.get(service).copied().unwrap_or(default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guests_get_their_list_or_the_default() {
        let p = ServicePolicy::parse(
            r#"{"allow": {"*": ["geo"], "bench": ["*"], "jail": []},
                "instances": {"bulk": "per-guest"}}"#,
        )
        .unwrap();
        assert!(p.allows("anyone", "geo"));
        assert!(!p.allows("anyone", "bulk"));
        assert!(p.allows("bench", "bulk"));
        assert!(!p.allows("jail", "geo"));
        assert_eq!(p.instances("bulk", Instances::Shared), Instances::PerGuest);
        assert!(ServicePolicy::default().allows("x", "y"));
        assert!(ServicePolicy::parse(r#"{"alow": {}}"#).is_err());
        assert!(ServicePolicy::parse(r#"{"instances": {"a": "many"}}"#).is_err());
        let p = ServicePolicy::parse(
            r#"{"concurrency": {"bulk": 1}, "scheduler": "wfq", "shares": {"a": 300}}"#,
        )
        .unwrap();
        assert_eq!(p.scheduler_kind().unwrap(), virtsoc_sched::Kind::Wfq);
        assert!(ServicePolicy::parse(r#"{"scheduler": "lottery"}"#).is_err());
        assert!(ServicePolicy::parse(r#"{"concurrency": {"bulk": 0}}"#).is_err());
    }
}
