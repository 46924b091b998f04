//! The daemon's side of the control API ([`virtsoc_control`]): listings from the session
//! table, the SVM manager and the devices; device operations through
//! [`Device::control`](crate::device::Device::control); closing a guest. Everything here
//! takes short locks only.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use virtsoc_svm::GuestId;

use serde_json::Value;
use virtsoc_control::budget::ViewBudget;
use virtsoc_control::{
    Backend, ControlError, DeviceInfo, DeviceUse, GuestInfo, LinkCopies, ViewFrame, ViewReport,
};
use virtsoc_svm::DomainId;
use virtsoc_sync::LockExt;

use crate::session::Session;
use crate::Daemon;

/// The control API's view of a daemon, the latest report of each live-view page, the
/// live view's encoders and its CPU budget.
pub struct ControlBackend(
    pub Arc<Daemon>,
    Mutex<BTreeMap<u64, ViewReport>>,
    crate::live_view::Encoders,
    ViewBudget,
);

impl ControlBackend {
    /// The control API of `daemon`.
    pub fn new(daemon: Arc<Daemon>) -> Self {
        let budget = ViewBudget::new(daemon.config().view_budget_pct);
        ControlBackend(
            daemon,
            Mutex::new(BTreeMap::new()),
            crate::live_view::Encoders::default(),
            budget,
        )
    }
}

impl ControlBackend {
    fn domain_name(&self, id: u32) -> String {
        self.0
            .svm()
            .engine()
            .topology()
            .info(DomainId(id))
            .map(|i| i.name.clone())
            .unwrap_or_else(|| format!("domain{id}"))
    }

    fn info(&self, s: &Session) -> Option<GuestInfo> {
        let d = &self.0;
        let id = s.guest_id();
        let svm = d.svm();
        let c = svm.guest_counters(id).ok()?;
        let (regions, bytes) = svm.guest_usage(id).unwrap_or((0, 0));
        let (transport, protocol) = d.guest_meta(id).unwrap_or(("unknown", d.config().protocol));
        let links = svm
            .guest_ledger(id)
            .unwrap_or_default()
            .into_iter()
            .map(|((src, dst), l)| LinkCopies {
                src: self.domain_name(src),
                dst: self.domain_name(dst),
                copies: l.copies,
                bytes: l.bytes,
                ns: l.ns,
            })
            .collect();
        let commands: BTreeMap<String, u64> = s
            .commands()
            .into_iter()
            .map(|(dev, n)| {
                let name = d
                    .devices()
                    .get(virtsoc_proto::DeviceId(dev))
                    .map(|slot| slot.device.name().to_string())
                    .unwrap_or_else(|| format!("device{dev}"));
                (name, n)
            })
            .collect();
        let device_use: BTreeMap<String, DeviceUse> = d
            .devices()
            .iter()
            .filter_map(|slot| {
                let u = slot.usage().get(&id).copied()?;
                Some((
                    slot.device.name().to_string(),
                    DeviceUse {
                        requests: u.requests,
                        device_ns: u.device_ns,
                        denied: u.denied,
                        queued: slot.depth_of(id) as u64,
                    },
                ))
            })
            .collect();
        let cpu_weight = d
            .config()
            .sharing
            .cgroups
            .as_ref()
            .and_then(|cg| cg.weight(id));
        Some(GuestInfo {
            device_use,
            cpu_weight,
            id: id.0,
            name: s.name().to_string(),
            transport: transport.to_string(),
            protocol: protocol.name().to_string(),
            regions,
            bytes,
            counters: c,
            links,
            commands,
            paced: {
                let p = s.paced();
                virtsoc_control::Paced {
                    bytes: p.bytes,
                    wait_ns: p.wait_ns,
                }
            },
            abandoned_waits: s.abandoned_waits(),
        })
    }
}

impl Backend for ControlBackend {
    fn guests(&self) -> Vec<GuestInfo> {
        let mut out: Vec<GuestInfo> = self
            .0
            .sessions()
            .iter()
            .filter(|s| !s.is_closed())
            .filter_map(|s| self.info(s))
            .collect();
        out.sort_by_key(|g| g.id);
        out
    }

    fn guest(&self, id: u64) -> Option<GuestInfo> {
        let s = self
            .0
            .sessions()
            .into_iter()
            .find(|s| s.guest_id() == GuestId(id))?;
        if s.is_closed() {
            return None;
        }
        self.info(&s)
    }

    fn devices(&self) -> Vec<DeviceInfo> {
        self.0
            .devices()
            .iter()
            .map(|s| DeviceInfo {
                id: s.id.0,
                name: s.device.name().to_string(),
                backend: s.device.backend(),
                domain: self.domain_name(s.domain.0),
                queued: s.depth() as u64,
            })
            .collect()
    }

    fn device_control(&self, device: &str, op: &str, args: &Value) -> Result<Value, ControlError> {
        let slot = self
            .0
            .devices()
            .iter()
            .find(|s| s.device.name() == device)
            .cloned()
            .ok_or_else(|| ControlError::NotFound(format!("no device {device:?}")))?;
        slot.device.control(op, args)
    }

    fn snapshot_save(&self, id: u64, path: &str) -> Result<Value, ControlError> {
        let r = crate::snapshot::save(&self.0, GuestId(id), std::path::Path::new(path))
            .map_err(|e| ControlError::Conflict(e.to_string()))?;
        Ok(serde_json::to_value(r).unwrap_or(Value::Null))
    }

    fn migrate(&self, id: u64, to: &str, token: &str) -> Result<Value, ControlError> {
        let r = crate::snapshot::migrate::migrate(&self.0, GuestId(id), to, token)
            .map_err(|e| ControlError::Conflict(e.to_string()))?;
        Ok(serde_json::to_value(r).unwrap_or(Value::Null))
    }

    fn snapshot_load(&self, id: u64, path: &str) -> Result<Value, ControlError> {
        let r = crate::snapshot::load(&self.0, std::path::Path::new(path), GuestId(id))
            .map_err(|e| ControlError::Conflict(e.to_string()))?;
        Ok(serde_json::to_value(r).unwrap_or(Value::Null))
    }

    fn kill(&self, id: u64) -> Result<(), ControlError> {
        if self.0.kill(GuestId(id)) {
            Ok(())
        } else {
            Err(ControlError::NotFound(format!("no guest {id}")))
        }
    }

    fn view_frame(
        &self,
        guest: u64,
        after: u64,
        max: (u32, u32),
        wait: std::time::Duration,
    ) -> Result<Option<ViewFrame>, ControlError> {
        crate::live_view::frame(&self.0, &self.2, GuestId(guest), after, max, wait)
    }

    fn record(
        &self,
        guest: u64,
        seconds: f64,
        fps: u32,
        max: (u32, u32),
    ) -> Result<(Vec<u8>, u64), ControlError> {
        crate::live_view::record(&self.0, GuestId(guest), seconds, fps, max)
    }

    fn view_budget(&self) -> Option<&ViewBudget> {
        (self.3.pct() > 0.0).then_some(&self.3)
    }

    fn note_view(&self, report: ViewReport) {
        let mut views = self.1.lock_or_recover();
        // Only live guests' reports are kept.
        let live: Vec<u64> = self.0.sessions().iter().map(|s| s.guest_id().0).collect();
        views.retain(|g, _| live.contains(g));
        views.insert(report.guest, report);
    }

    fn view_reports(&self) -> Vec<ViewReport> {
        self.1.lock_or_recover().values().cloned().collect()
    }

    fn set_policy(&self, guest: u64, policy: &Value) -> Result<Value, ControlError> {
        let name = self
            .0
            .sessions()
            .iter()
            .find(|s| s.guest_id() == GuestId(guest))
            .map(|s| s.name().to_string())
            .ok_or_else(|| ControlError::NotFound(format!("no guest {guest}")))?;
        let de = policy.clone();
        let p: virtsoc_sched::policy::GuestPolicy =
            serde_path_to_error::deserialize(de).map_err(|e| {
                ControlError::BadRequest(format!("field `{}`: {}", e.path(), e.inner()))
            })?;
        let store = &self.0.config().sharing.policy;
        store
            .set_guest(&name, p)
            .map_err(|e| ControlError::BadRequest(e.to_string()))?;
        log::info!("policy of guests named {name:?} changed through the control API");
        Ok(serde_json::json!({ "guest": guest, "name": name, "generation": store.generation() }))
    }

    fn reload_policy(&self) -> Result<Value, ControlError> {
        let store = &self.0.config().sharing.policy;
        store.reload().map_err(|e| {
            ControlError::Conflict(format!("policy not reloaded, the old one stays: {e}"))
        })?;
        Ok(serde_json::json!({ "generation": store.generation() }))
    }

    fn lingering_sessions(&self) -> u64 {
        let old = std::time::Duration::from_secs(1);
        self.0
            .lingering_sessions()
            .iter()
            .filter(|l| l.ended.elapsed() >= old)
            .count() as u64
    }
}

/// Starts the control API of `daemon` on `unix` and, if given, TCP `tcp` (which needs the
/// daemon's remote-guest token).
pub fn start(
    daemon: &Arc<Daemon>,
    unix: Option<&std::path::Path>,
    tcp: Option<std::net::SocketAddr>,
) -> crate::Result<virtsoc_control::server::ControlServer> {
    if tcp.is_some() && daemon.config().token.is_none() {
        return Err(crate::HostError::Config(
            "the control API on TCP needs a token: give --token-file".into(),
        ));
    }
    Ok(virtsoc_control::server::serve(
        Arc::new(ControlBackend::new(daemon.clone())),
        unix,
        tcp,
        daemon.config().token.clone(),
    )?)
}

/// The control socket of the daemon listening on `socket`: `<socket>.control`.
pub fn default_path(socket: &std::path::Path) -> std::path::PathBuf {
    virtsoc_control::client::control_path(socket)
}
