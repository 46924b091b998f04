//! Host services in the daemon (issue 29, after virtio-vapp): the `service` device, through
//! which a guest opens channels to the services the hypervisor hosts
//! ([`virtsoc_services`]), and the threads that serve those channels.
//!
//! A guest lays a channel out at the start of a blob region it holds a CPU access on
//! (`virtsoc_services::chan`), then sends `service::open` with the service's name and the
//! region. The device checks the region (the guest's, with a window replica, large enough
//! for the layout it finds there), asks the hypervisor (the services policy decides by the
//! guest's handshake name), and starts the channel's thread ([`channel`]). From then on the
//! guest and that thread talk through the channel's own rings; the device ring carries only
//! opens and closes. Control operations (`geo.fix`, `sensor.set`, `clipboard.get`,
//! `services.policy`, ...) come from the control API through [`Device::control`]. Host
//! programs register services of their own on the services socket ([`external`]).

pub mod channel;
pub mod external;
mod handover;
mod quiesce;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;

use serde_json::Value;
use virtsoc_control::ControlError;
use virtsoc_devapi::service::{CloseReply, Command, OpenReply};
use virtsoc_proto::Status;
use virtsoc_services::chan::{closed, Closer, HostEnd};
use virtsoc_services::hypervisor::Hypervisor;
use virtsoc_services::policy::ServicePolicy;
use virtsoc_services::ServiceError;
use virtsoc_svm::{GuestId, RegionId};
use virtsoc_sync::LockExt;

use crate::device::{Device, DeviceCtx, DeviceResult};
use crate::Daemon;

/// Channels one guest may have open at once.
pub const MAX_CHANNELS: usize = 16;
/// Spins of a channel thread before it sleeps on its doorbell.
const SPINS: u32 = 4096;

/// A channel of a guest.
struct Open {
    guest: GuestId,
    service: String,
    /// The guest's region its rings live in.
    region: u64,
    /// Its thread; `None` while the channel waits for its guest to resume it (it came with
    /// the guest's session from another daemon: `handover.rs`).
    serving: Option<Serving>,
    /// Answers to post first when the guest resumes it (from the daemon it came from).
    replay: Vec<virtsoc_services::hypervisor::handover::KeptAnswer>,
}

/// A served channel's thread and its handles.
struct Serving {
    closer: Closer,
    ctl: Arc<quiesce::Control>,
    _thread: JoinHandle<()>,
}

impl Serving {
    /// Closes the channel with `code` and ends its thread at its next pass (nobody waits
    /// for it: a hung service must not hold up other guests' opens and closes).
    fn end(&self, code: u32) {
        self.closer.close(code);
        self.ctl.stop();
    }
}

/// The `service` device.
pub struct ServiceDevice {
    hv: Arc<Hypervisor>,
    channels: Mutex<HashMap<u64, Open>>,
    held: Mutex<HashMap<GuestId, Arc<AtomicU64>>>,
    daemon: OnceLock<Weak<Daemon>>,
    policy_file: Option<std::path::PathBuf>,
}

impl ServiceDevice {
    /// The device with the built-in services, under the policy in `policy_file` (every
    /// guest may use every service without one).
    pub fn new(policy_file: Option<&Path>) -> crate::Result<Self> {
        let policy = match policy_file {
            Some(p) => read_policy(p)?,
            None => ServicePolicy::default(),
        };
        let hv = Arc::new(Hypervisor::new(policy));
        virtsoc_services::builtin::register_all(&hv);
        Ok(ServiceDevice {
            hv,
            channels: Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
            daemon: OnceLock::new(),
            policy_file: policy_file.map(Path::to_path_buf),
        })
    }

    /// The hypervisor.
    pub fn hypervisor(&self) -> &Arc<Hypervisor> {
        &self.hv
    }

    /// Lets the device find guests' names (for the policy) in `daemon`'s sessions.
    pub fn attach_daemon(&self, daemon: &Arc<Daemon>) {
        let _ = self.daemon.set(Arc::downgrade(daemon));
    }

    fn guest_name(&self, guest: GuestId) -> String {
        self.daemon
            .get()
            .and_then(Weak::upgrade)
            .and_then(|d| {
                d.sessions()
                    .into_iter()
                    .find(|s| s.guest_id() == guest)
                    .map(|s| s.name().to_string())
            })
            .unwrap_or_default()
    }

    /// The guest's transport (`unix`, `vm`, `tcp`), when the daemon is known.
    fn transport(&self, guest: GuestId) -> Option<&'static str> {
        let d = self.daemon.get().and_then(Weak::upgrade)?;
        d.guest_meta(guest).map(|(t, _)| t)
    }

    fn open(&self, cx: &DeviceCtx<'_>, name: [u64; 2], region: u64) -> DeviceResult {
        let service = virtsoc_services::unpack_name(name)
            .ok_or_else(|| cx.fail(Status::BadArgument, "service name: 1-16 ASCII characters"))?;
        let guest = cx.guest;
        if self.transport(guest) == Some("tcp") {
            // A remote guest's window is a copy the transport keeps in step at its accesses'
            // ends: the channel's rings and slots, written while the access stays open, would
            // need to travel both ways on their own (see docs/services.md).
            return Err(cx.fail(
                Status::NotSupported,
                "host service channels need a process or VM guest: a remote (tcp) guest's \
                 window is a copy, and the remote transport does not carry a channel's rings \
                 and slots",
            ));
        }
        let n = self
            .channels
            .lock_or_recover()
            .values()
            .filter(|o| o.guest == guest)
            .count();
        if n >= MAX_CHANNELS {
            return Err(cx.fail(
                Status::OutOfMemory,
                format!("at most {MAX_CHANNELS} channels per guest"),
            ));
        }
        let end = self.attach(cx, region)?;
        let entries = end.layout().entries;
        let id = self
            .hv
            .open(guest.0, &self.guest_name(guest), &service)
            .map_err(|e| fail(cx, &e))?;
        self.channels.lock_or_recover().insert(
            id,
            Open {
                guest,
                service,
                region,
                serving: None,
                replay: Vec::new(),
            },
        );
        if let Err(st) = self.start(cx, id, region, end) {
            self.channels.lock_or_recover().remove(&id);
            let _ = self.hv.close(guest.0, id);
            return Err(st);
        }
        Ok(OpenReply {
            channel: id,
            entries: u64::from(entries),
        }
        .to_values())
    }

    /// The host's end of the channel the guest laid out at the start of its region
    /// `region` (its own, with a window replica, large enough for the layout found there).
    fn attach(&self, cx: &DeviceCtx<'_>, region: u64) -> Result<HostEnd, Status> {
        let (guest, region) = (cx.guest, RegionId(region));
        let meta = cx.meta(region)?;
        let at = cx
            .svm
            .window_offset(guest, region)
            .ok()
            .flatten()
            .ok_or_else(|| {
                cx.fail(
                    Status::BadArgument,
                    "channel region: begin a CPU access first",
                )
            })?;
        let win = cx
            .svm
            .guest_window(guest)
            .map_err(|_| cx.fail(Status::Internal, "no window for this guest"))?;
        let end = match self.vm_port(guest) {
            Some(port) => port
                .channel_bells(at, SPINS)
                .and_then(|bells| HostEnd::attach_with(win, at, meta.size, bells)),
            None if self.transport(guest) == Some("vm") => {
                return Err(cx.fail(Status::Closed, "this VM guest's port is not served here"))
            }
            None => HostEnd::attach(win, at, meta.size, SPINS),
        };
        end.map_err(|e| fail(cx, &e))
    }

    /// A VM guest's port (its channels ring over it), `None` for other guests.
    fn vm_port(&self, guest: GuestId) -> Option<Arc<crate::vm::GuestPort>> {
        let d = self.daemon.get().and_then(Weak::upgrade)?;
        d.restart().vm_ports.guest_port(guest)
    }

    /// Starts the thread of channel `id` (in the table, not served yet) on `end`.
    fn start(&self, cx: &DeviceCtx<'_>, id: u64, region: u64, end: HostEnd) -> Result<(), Status> {
        let guest = cx.guest;
        let win = cx
            .svm
            .guest_window(guest)
            .map_err(|_| cx.fail(Status::Internal, "no window for this guest"))?;
        let at = cx
            .svm
            .window_offset(guest, RegionId(region))
            .ok()
            .flatten()
            .ok_or(Status::Internal)?;
        let held = self
            .held
            .lock_or_recover()
            .entry(guest)
            .or_default()
            .clone();
        let ctl = Arc::new(quiesce::Control::default());
        let ccx = channel::ChannelCtx {
            id,
            guest,
            win: win.clone(),
            svm: cx.svm.clone(),
            hv: self.hv.clone(),
            guest_held: held,
            ctl: ctl.clone(),
        };
        let service = self.hv.channel_service(guest.0, id).unwrap_or_default();
        let thread = std::thread::Builder::new()
            .name(format!("svc-{service}-{id}"))
            .spawn(move || channel::serve(ccx, end))
            .map_err(|_| cx.fail(Status::OutOfMemory, "cannot start the channel's thread"))?;
        match self.channels.lock_or_recover().get_mut(&id) {
            Some(o) => {
                let closer = match self.vm_port(guest) {
                    Some(port) => Closer::new(win, at).ringing(port.ringer(at)),
                    None => Closer::new(win, at),
                };
                o.serving = Some(Serving {
                    closer,
                    ctl,
                    _thread: thread,
                })
            }
            None => {
                // Closed meanwhile (its guest went): the thread ends at once.
                Closer::new(win, at).close(closed::GUEST_GONE);
                ctl.stop();
            }
        }
        Ok(())
    }

    fn close(&self, cx: &DeviceCtx<'_>, id: u64) -> DeviceResult {
        let mut chans = self.channels.lock_or_recover();
        match chans.get(&id) {
            Some(o) if o.guest == cx.guest => {}
            _ => {
                return Err(cx.fail(
                    Status::BadArgument,
                    format!("no channel {id} of this guest"),
                ))
            }
        }
        let o = chans.remove(&id).ok_or(Status::Internal)?;
        drop(chans);
        match o.serving {
            Some(sv) => sv.end(closed::BY_GUEST),
            // A channel that was never resumed has no thread to end.
            None => {
                let _ = self.hv.close(cx.guest.0, id);
            }
        }
        Ok(CloseReply {}.to_values())
    }
}

fn fail(cx: &DeviceCtx<'_>, e: &ServiceError) -> Status {
    cx.fail(e.status(), e.to_string())
}

fn read_policy(p: &Path) -> crate::Result<ServicePolicy> {
    let text = std::fs::read_to_string(p)
        .map_err(|e| crate::HostError::Config(format!("services policy {}: {e}", p.display())))?;
    ServicePolicy::parse(&text)
        .map_err(|e| crate::HostError::Config(format!("{}: {e}", p.display())))
}

fn control_err(e: ServiceError) -> ControlError {
    ControlError::BadRequest(e.to_string())
}

impl Device for ServiceDevice {
    fn name(&self) -> &str {
        "service"
    }

    fn backend(&self) -> String {
        "service hypervisor (geo, sensor, clipboard, bulk, and host programs' services)".into()
    }

    fn execute(&self, cx: &DeviceCtx<'_>, args: &[u64; 6]) -> DeviceResult {
        match Command::decode(args)? {
            Command::Open(o) => self.open(cx, [o.name0, o.name1], o.ring),
            Command::Close(c) => self.close(cx, c.channel),
            Command::Resume(r) => self.resume_channel(cx, r.channel, r.ring),
        }
    }

    /// The guest's channels and its services' states, for a snapshot or a migration
    /// (`handover.rs`).
    fn export_guest(&self, guest: GuestId) -> Option<Value> {
        self.export_record(guest)
    }

    fn import_guest(
        &self,
        guest: GuestId,
        record: &Value,
    ) -> Result<(), crate::device::RecordError> {
        self.import_record(guest, record)
    }

    fn guest_gone(&self, guest: GuestId) {
        let mut chans = self.channels.lock_or_recover();
        let ids: Vec<u64> = chans
            .iter()
            .filter(|(_, o)| o.guest == guest)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(sv) = chans.remove(&id).and_then(|o| o.serving) {
                // The thread ends at its next wake-up; nobody waits for it here.
                sv.end(closed::GUEST_GONE);
            }
        }
        drop(chans);
        self.held.lock_or_recover().remove(&guest);
        self.hv.guest_gone(guest.0);
    }

    /// `services.list`, `services.policy` (a new policy, or `{"reload": true}` for the
    /// file), and `SERVICE.OP` for a service's own operations (`geo.fix`, `sensor.set`,
    /// `clipboard.get`, ...).
    fn control(&self, op: &str, args: &Value) -> Result<Value, ControlError> {
        match op {
            "services.list" => Ok(self.hv.describe()),
            "services.policy" => {
                let p = if args["reload"].as_bool() == Some(true) {
                    let f = self.policy_file.as_ref().ok_or_else(|| {
                        ControlError::BadRequest("the daemon has no --services-policy file".into())
                    })?;
                    read_policy(f).map_err(|e| ControlError::BadRequest(e.to_string()))?
                } else {
                    ServicePolicy::from_value(args).map_err(control_err)?
                };
                self.hv.set_policy(p);
                Ok(self.hv.describe()["policy"].clone())
            }
            _ => {
                let (service, sop) = op.split_once('.').ok_or_else(|| {
                    ControlError::NotFound(format!("service control operation {op:?}"))
                })?;
                self.hv.control(service, sop, args).map_err(|e| match e {
                    ServiceError::NoSuchService(s) => {
                        ControlError::NotFound(format!("service {s}"))
                    }
                    e => control_err(e),
                })
            }
        }
    }
}
