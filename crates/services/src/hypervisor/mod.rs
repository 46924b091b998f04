//! The service hypervisor: the registered services, the policy, the channel table and the
//! service instances.
//!
//! A service declares its calls ([`CallInfo`], as devices declare their commands) and runs
//! them on an [`Input`] and an [`Output`]. A guest opens a channel to a service by name (the
//! policy decides); every call names the channel, which must be one of that guest's, and a
//! call the service declares. A call that panics kills its instance: the hypervisor drops
//! it, counts a restart, answers [`ServiceError::ServiceDied`], and the next call gets a
//! fresh instance; the other instances and channels go on.
//!
//! Services come from two places: modules linked into the daemon ([`Hypervisor::register`],
//! the built-in ones), and host programs that register over the daemon's services socket
//! ([`Hypervisor::register_external`], [`crate::external`]). Both are held to the same
//! rules: the policy, the admission gate, the call's deadline, the checks of their answers.

use std::borrow::Cow;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde_json::{json, Value};

use crate::gate::Gate;
use crate::payload::{Input, Output};
use crate::policy::{Instances, ServicePolicy};
use crate::{Result, ServiceError};
use virtsoc_sync::{LockExt, RwLockExt};

/// How long a call may take when the policy sets no `call_timeout_ms` (built-in services
/// answer in time by construction; the deadline is what an external program is held to).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// One call a service declares.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CallInfo {
    /// Its number on the channel.
    pub call: u32,
    /// Its name.
    pub name: Cow<'static, str>,
    /// What it does, its input, output and values.
    #[serde(default)]
    pub doc: Cow<'static, str>,
}

/// Who is calling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallCtx {
    /// The calling guest.
    pub guest: u64,
    /// The channel the call came on.
    pub channel: u64,
    /// How long the call may take (the policy's `call_timeout_ms`).
    pub timeout: Duration,
}

impl CallCtx {
    /// A call of `guest` on `channel` with the default deadline (tests, direct calls).
    pub fn new(guest: u64, channel: u64) -> Self {
        CallCtx {
            guest,
            channel,
            timeout: CALL_TIMEOUT,
        }
    }
}

/// What a call answers: `len` bytes written to the output, and four values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reply {
    /// Bytes written to the output.
    pub len: usize,
    /// Result values.
    pub values: [u64; 4],
}

/// A host service.
pub trait Service: Send + Sync {
    /// Its name (what guests open).
    fn name(&self) -> &str;
    /// The calls it declares.
    fn calls(&self) -> Vec<CallInfo>;
    /// Runs call `call` (one it declares) on `input`, writing to `out`.
    fn call(
        &self,
        cx: &CallCtx,
        call: u32,
        input: &dyn Input,
        out: &mut dyn Output,
    ) -> Result<Reply>;
    /// Runs host control operation `op` (from the control API).
    fn control(&self, op: &str, _args: &Value) -> Result<Value> {
        Err(ServiceError::BadArgument(format!(
            "service {} has no control operation {op:?}",
            self.name()
        )))
    }
    /// A guest went away: forget what it set.
    fn guest_gone(&self, _guest: u64) {}
    /// Migration: what this instance keeps for `guest` (its rates, cursors, counters), to
    /// be handed to the target daemon's instance; `None` when it keeps nothing.
    fn export_guest(&self, _guest: u64) -> Option<Value> {
        None
    }
    /// Migration: takes over what [`export_guest`](Self::export_guest) of another daemon's
    /// instance kept for a guest, now `guest` here (untrusted input: validate it).
    fn import_guest(&self, _guest: u64, _state: &Value) -> Result<()> {
        Ok(())
    }
    /// The sink of call `call` for an input of `total` bytes, when the call can take its
    /// input packet by packet in any order, in place ([`InputSink`]; `None`, the default:
    /// the call needs its input whole, reassembled).
    fn sink(&self, _cx: &CallCtx, _call: u32, _total: u64) -> Option<Box<dyn InputSink>> {
        None
    }
    /// Whether the service can take calls now (an external program that went away cannot,
    /// until it registers again).
    fn available(&self) -> bool {
        true
    }
    /// What the control API's listing shows of the service besides its calls and counters.
    fn status(&self) -> Value {
        Value::Null
    }
}

/// Makes a fresh instance of a service.
pub type Factory = Arc<dyn Fn() -> Arc<dyn Service> + Send + Sync>;

struct Registered {
    default_instances: Instances,
    make: Factory,
    calls: Vec<CallInfo>,
    /// Registered by a host program (not linked into the daemon).
    external: bool,
    shared: Mutex<Option<Arc<dyn Service>>>,
    per_guest: Mutex<HashMap<u64, Arc<dyn Service>>>,
    restarts: AtomicU64,
    calls_served: AtomicU64,
}

#[derive(Debug, Clone)]
struct ChannelRec {
    guest: u64,
    guest_name: String,
    service: String,
}

/// The service hypervisor.
pub struct Hypervisor {
    services: RwLock<HashMap<String, Arc<Registered>>>,
    policy: RwLock<ServicePolicy>,
    channels: Mutex<HashMap<u64, ChannelRec>>,
    next_channel: AtomicU64,
    denied: AtomicU64,
    /// The admission gate of each service the policy limits.
    gates: RwLock<HashMap<String, Arc<Gate>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock_or_recover()
}

impl Default for Hypervisor {
    fn default() -> Self {
        Self::new(ServicePolicy::default())
    }
}

impl Hypervisor {
    /// A hypervisor with no services, under `policy`.
    pub fn new(policy: ServicePolicy) -> Self {
        let h = Hypervisor {
            services: RwLock::new(HashMap::new()),
            policy: RwLock::new(ServicePolicy::default()),
            channels: Mutex::new(HashMap::new()),
            next_channel: AtomicU64::new(handover::channel_id_base()),
            denied: AtomicU64::new(0),
            gates: RwLock::new(HashMap::new()),
        };
        h.set_policy(policy);
        h
    }

    /// Registers a service made by `make` (replacing one of the same name).
    pub fn register(&self, default_instances: Instances, make: Factory) {
        self.insert(default_instances, make, false);
    }

    /// Registers service `svc` of a host program: one instance serves every guest (the
    /// program sees the guest of each call). Refused when a built-in service has the name,
    /// or another program's registration of it is still available; a registration whose
    /// program went away is replaced (its open channels go on with the new one).
    pub fn register_external(&self, svc: Arc<dyn Service>) -> Result<()> {
        let name = svc.name().to_string();
        if name == "services" {
            // The control API's own operations (`services.list`, `services.policy`).
            return Err(ServiceError::BadArgument(
                "the name \"services\" is reserved".into(),
            ));
        }
        let mut services = self.services.write_or_recover();
        if let Some(old) = services.get(&name) {
            let live = lock(&old.shared).as_ref().is_some_and(|s| s.available());
            if !old.external || live {
                return Err(ServiceError::BadArgument(format!(
                    "service {name:?} is already registered{}",
                    if old.external {
                        " by a live program"
                    } else {
                        " (built in)"
                    }
                )));
            }
        }
        let make: Factory = {
            let svc = svc.clone();
            Arc::new(move || svc.clone())
        };
        services.insert(
            name,
            Arc::new(Self::registered(Instances::Shared, make, true)),
        );
        Ok(())
    }

    fn insert(&self, default_instances: Instances, make: Factory, external: bool) {
        let r = Self::registered(default_instances, make, external);
        let name = lock(&r.shared)
            .as_ref()
            .map(|s| s.name().to_string())
            .unwrap_or_default();
        self.services.write_or_recover().insert(name, Arc::new(r));
    }

    fn registered(default_instances: Instances, make: Factory, external: bool) -> Registered {
        let probe = make();
        Registered {
            default_instances,
            calls: probe.calls(),
            external,
            make,
            shared: Mutex::new(Some(probe)),
            per_guest: Mutex::new(HashMap::new()),
            restarts: AtomicU64::new(0),
            calls_served: AtomicU64::new(0),
        }
    }

    fn service(&self, name: &str) -> Result<Arc<Registered>> {
        self.services
            .read_or_recover()
            .get(name)
            .cloned()
            .ok_or_else(|| ServiceError::NoSuchService(name.to_string()))
    }

    /// Replaces the policy (channels already open are checked again at their next call).
    pub fn set_policy(&self, p: ServicePolicy) {
        // A checked policy always names a known scheduler.
        let kind = p.scheduler_kind().unwrap_or_default();
        let gates = p
            .concurrency
            .iter()
            .map(|(s, n)| (s.clone(), Arc::new(Gate::new(kind, *n))))
            .collect();
        *self.gates.write_or_recover() = gates;
        *self.policy.write_or_recover() = p;
    }

    /// The gate of `service` and the share of `guest_name`, if the policy limits it.
    fn gate(&self, service: &str, guest_name: &str) -> Option<(Arc<Gate>, Option<u32>)> {
        let gate = self.gates.read_or_recover().get(service).cloned()?;
        let share = self
            .policy
            .read_or_recover()
            .shares
            .get(guest_name)
            .copied();
        Some((gate, share))
    }

    /// How long a call may take (the policy's `call_timeout_ms`, else [`CALL_TIMEOUT`]).
    pub fn call_timeout(&self) -> Duration {
        self.policy
            .read_or_recover()
            .call_timeout_ms
            .map_or(CALL_TIMEOUT, Duration::from_millis)
    }

    /// The policy.
    pub fn policy(&self) -> ServicePolicy {
        self.policy.read_or_recover().clone()
    }

    fn check(&self, guest_name: &str, service: &str) -> Result<()> {
        if self.policy.read_or_recover().allows(guest_name, service) {
            return Ok(());
        }
        self.denied.fetch_add(1, Ordering::Relaxed);
        Err(ServiceError::Denied {
            guest: guest_name.to_string(),
            service: service.to_string(),
        })
    }

    /// Opens a channel of `guest` (named `guest_name`) to `service`.
    pub fn open(&self, guest: u64, guest_name: &str, service: &str) -> Result<u64> {
        self.service(service)?;
        self.check(guest_name, service)?;
        let id = self.next_channel.fetch_add(1, Ordering::Relaxed);
        lock(&self.channels).insert(
            id,
            ChannelRec {
                guest,
                guest_name: guest_name.to_string(),
                service: service.to_string(),
            },
        );
        Ok(id)
    }

    /// Closes channel `channel` of `guest`.
    pub fn close(&self, guest: u64, channel: u64) -> Result<()> {
        let mut ch = lock(&self.channels);
        match ch.get(&channel) {
            Some(c) if c.guest == guest => {
                ch.remove(&channel);
                Ok(())
            }
            _ => Err(ServiceError::NoSuchChannel(channel)),
        }
    }

    /// The service a channel of `guest` is open to.
    pub fn channel_service(&self, guest: u64, channel: u64) -> Result<String> {
        match lock(&self.channels).get(&channel) {
            Some(c) if c.guest == guest => Ok(c.service.clone()),
            _ => Err(ServiceError::NoSuchChannel(channel)),
        }
    }

    fn instance(&self, r: &Registered, name: &str, guest: u64) -> Arc<dyn Service> {
        let mode = self
            .policy
            .read_or_recover()
            .instances(name, r.default_instances);
        match mode {
            Instances::Shared => lock(&r.shared).get_or_insert_with(|| (r.make)()).clone(),
            Instances::PerGuest => lock(&r.per_guest)
                .entry(guest)
                .or_insert_with(|| (r.make)())
                .clone(),
        }
    }

    /// The channel record, the service and its instance for call `call` of channel
    /// `channel` of `guest`: the channel must be the guest's, the policy must allow the
    /// service, and the service must declare the call.
    fn resolve(
        &self,
        guest: u64,
        channel: u64,
        call: u32,
    ) -> Result<(ChannelRec, Arc<Registered>, Arc<dyn Service>)> {
        let rec = match lock(&self.channels).get(&channel) {
            Some(c) if c.guest == guest => c.clone(),
            _ => return Err(ServiceError::NoSuchChannel(channel)),
        };
        self.check(&rec.guest_name, &rec.service)?;
        let r = self.service(&rec.service)?;
        if !r.calls.iter().any(|c| c.call == call) {
            return Err(ServiceError::NoSuchCall {
                service: rec.service,
                call,
            });
        }
        let inst = self.instance(&r, &rec.service, guest);
        Ok((rec, r, inst))
    }

    /// Runs call `call` of channel `channel` of `guest`.
    pub fn invoke(
        &self,
        guest: u64,
        channel: u64,
        call: u32,
        input: &dyn Input,
        out: &mut dyn Output,
    ) -> Result<Reply> {
        let (rec, r, inst) = self.resolve(guest, channel, call)?;
        let cx = CallCtx {
            guest,
            channel,
            timeout: self.call_timeout(),
        };
        let gate = self.gate(&rec.service, &rec.guest_name);
        let _pass = gate.as_ref().map(|(g, share)| {
            if let Some(s) = share {
                g.set_share(guest, *s);
            }
            g.enter(guest)
        });
        match catch_unwind(AssertUnwindSafe(|| inst.call(&cx, call, input, out))) {
            Ok(res) => {
                r.calls_served.fetch_add(1, Ordering::Relaxed);
                res
            }
            Err(_) => Err(self.died(&r, &inst, &rec.service, call)),
        }
    }

    /// Drops a dead instance so that the next call makes a fresh one.
    fn restart(&self, r: &Registered, dead: &Arc<dyn Service>) {
        r.restarts.fetch_add(1, Ordering::Relaxed);
        let mut shared = lock(&r.shared);
        if shared.as_ref().is_some_and(|s| Arc::ptr_eq(s, dead)) {
            *shared = None;
        }
        drop(shared);
        lock(&r.per_guest).retain(|_, s| !Arc::ptr_eq(s, dead));
    }

    /// Runs control operation `op` on `service`'s shared instance.
    pub fn control(&self, service: &str, op: &str, args: &Value) -> Result<Value> {
        let r = self.service(service)?;
        let inst = lock(&r.shared).get_or_insert_with(|| (r.make)()).clone();
        match catch_unwind(AssertUnwindSafe(|| inst.control(op, args))) {
            Ok(v) => v,
            Err(_) => {
                self.restart(&r, &inst);
                Err(ServiceError::ServiceDied(service.to_string()))
            }
        }
    }

    /// A guest went away: its channels and per-guest instances go.
    pub fn guest_gone(&self, guest: u64) {
        lock(&self.channels).retain(|_, c| c.guest != guest);
        let all: Vec<Arc<Registered>> = self.services.read_or_recover().values().cloned().collect();
        for r in all {
            lock(&r.per_guest).remove(&guest);
            if let Some(s) = lock(&r.shared).clone() {
                s.guest_gone(guest);
            }
        }
    }

    /// Channels open, all guests.
    pub fn channel_count(&self) -> usize {
        lock(&self.channels).len()
    }

    /// The services, their calls and counters, the policy (the control API's listing).
    pub fn describe(&self) -> Value {
        let services = self.services.read_or_recover();
        let chans = lock(&self.channels);
        let mut names: Vec<&String> = services.keys().collect();
        names.sort();
        let list: Vec<Value> = names
            .into_iter()
            .map(|n| {
                let r = &services[n];
                json!({
                    "name": n,
                    "instances": self.policy().instances(n, r.default_instances),
                    "calls": r.calls.iter().map(|c| json!({"call": c.call, "name": c.name, "doc": c.doc})).collect::<Vec<_>>(),
                    "channels": chans.values().filter(|c| &c.service == n).count(),
                    "calls_served": r.calls_served.load(Ordering::Relaxed),
                    "restarts": r.restarts.load(Ordering::Relaxed),
                    "per_guest_instances": lock(&r.per_guest).len(),
                    "external": r.external,
                    "status": lock(&r.shared).as_ref().map_or(Value::Null, |s| s.status()),
                })
            })
            .collect();
        json!({
            "services": list,
            "policy": self.policy(),
            "denied": self.denied.load(Ordering::Relaxed),
        })
    }
}

pub mod handover;
mod sink;
pub use sink::{InputSink, SinkCall};
#[cfg(test)]
mod tests;
