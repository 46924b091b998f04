//! A guest's service sessions across a migration (or a snapshot, a restart):
//!
//! 1. **Quiesce** ([`ServiceDevice::pause_guest`], from [`crate::snapshot::quiesce`]): each
//!    of the guest's channel threads answers the request it is running and then takes no
//!    more; the guest may keep posting, nothing is taken.
//! 2. **Hand-over record** ([`ServiceDevice::export_record`], the device's snapshot record):
//!    the channels (id, service, region) and each service's state for the guest (sensor
//!    rates and sample counts, bulk counters, a host program's own).
//! 3. **Moved** ([`ServiceDevice::moved`], at the hand-over): the channels are closed with
//!    [`closed::MOVED`], which wakes the guest; it takes the answers left in the old rings
//!    (every request taken was answered), and keeps the requests without an answer (never
//!    taken, so never run) to send again.
//! 4. **Take-over** ([`ServiceDevice::import_record`], on the daemon the session lands in):
//!    the channels come back under the same ids, waiting; each service takes its state.
//! 5. **Resume** (`service::resume`, from the guest once its connection moved): the guest
//!    lays the channel out afresh in its region in the new window; the channel's thread
//!    starts on it, and the guest sends its unanswered requests again (same sequence
//!    numbers). Each request runs exactly once.
//!
//! A migration that fails before the hand-over resumes the paused threads
//! ([`ServiceDevice::resume_guest`]); one that fails after it brings the session back here
//! through the same take-over and resume.

use std::time::Duration;

use serde_json::{json, Value};
use virtsoc_devapi::service::ResumeReply;
use virtsoc_proto::Status;
use virtsoc_services::chan::closed;
use virtsoc_services::hypervisor::handover::{check_channels, ChannelRecord};
use virtsoc_services::payload::Output;
use virtsoc_svm::GuestId;
use virtsoc_sync::LockExt;

use super::{Open, ServiceDevice};
use crate::device::RecordError;

/// Most bytes of answers a guest's channels may leave unread for a migration to carry
/// (the hand-over record travels as one section of at most 2 MiB).
pub const MAX_KEPT_BYTES: usize = 512 << 10;

/// Why a guest's channels could not be paused ([`ServiceDevice::pause_guest`]); every one
/// was resumed.
#[derive(Debug, thiserror::Error)]
pub enum PauseError {
    /// A channel did not answer its call in progress in time.
    #[error("channel {channel} of guest {guest} did not finish its call within {timeout:?}")]
    Busy {
        /// The channel.
        channel: u64,
        /// Its guest.
        guest: GuestId,
        /// How long it was given.
        timeout: Duration,
    },
    /// The answers the guest has not read are too many to go with a migration.
    #[error(
        "guest {guest} leaves {kept} bytes of answers unread in its channels (at most \
         {MAX_KEPT_BYTES} go with a migration)"
    )]
    Unread {
        /// The guest.
        guest: GuestId,
        /// The bytes of its unread answers.
        kept: usize,
    },
}
use crate::device::{DeviceCtx, DeviceResult};

impl ServiceDevice {
    /// Pauses every channel of `guest` once its request in progress is answered; on a
    /// channel that does not pause within `timeout` every one is resumed and this fails.
    pub fn pause_guest(&self, guest: GuestId, timeout: Duration) -> Result<(), PauseError> {
        let chans = self.channels.lock_or_recover();
        let mine: Vec<_> = chans
            .iter()
            .filter(|(_, o)| o.guest == guest)
            .filter_map(|(id, o)| {
                o.serving
                    .as_ref()
                    .map(|s| (*id, s.ctl.clone(), s.closer.clone()))
            })
            .collect();
        drop(chans);
        let undo = || {
            for (_, c, _) in &mine {
                c.resume();
            }
        };
        let mut kept = 0;
        for (id, ctl, closer) in &mine {
            if !ctl.pause(closer, timeout) {
                undo();
                return Err(PauseError::Busy {
                    channel: *id,
                    guest,
                    timeout,
                });
            }
            kept += ctl.unread().iter().map(|a| a.out.len() / 2).sum::<usize>();
        }
        if kept > MAX_KEPT_BYTES {
            undo();
            return Err(PauseError::Unread { guest, kept });
        }
        Ok(())
    }

    /// Lets `guest`'s paused channels take requests again (a quiesce that is undone).
    pub fn resume_guest(&self, guest: GuestId) {
        for o in self.channels.lock_or_recover().values() {
            if let (true, Some(s)) = (o.guest == guest, &o.serving) {
                s.ctl.resume();
            }
        }
    }

    /// `guest`'s session moved to another daemon (or is saved for the next one): its
    /// channels are closed with [`closed::MOVED`] (the guest resumes them where the session
    /// lands) and forgotten here.
    pub fn moved(&self, guest: GuestId) {
        let mut chans = self.channels.lock_or_recover();
        let ids: Vec<u64> = chans
            .iter()
            .filter(|(_, o)| o.guest == guest)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(sv) = chans.remove(&id).and_then(|o| o.serving) {
                sv.end(closed::MOVED);
            }
            let _ = self.hv.close(guest.0, id);
        }
    }

    /// The hand-over record of `guest`'s sessions (`None` when it has no channel and no
    /// service keeps anything for it).
    pub fn export_record(&self, guest: GuestId) -> Option<Value> {
        let channels: Vec<ChannelRecord> = {
            let chans = self.channels.lock_or_recover();
            let mut v: Vec<ChannelRecord> = chans
                .iter()
                .filter(|(_, o)| o.guest == guest)
                .map(|(id, o)| ChannelRecord {
                    id: *id,
                    service: o.service.clone(),
                    region: o.region,
                    answers: o
                        .serving
                        .as_ref()
                        .map(|s| s.ctl.unread())
                        .unwrap_or_default(),
                })
                .collect();
            v.sort_by_key(|c| c.id);
            v
        };
        let services = self.hv.export_guest(guest.0);
        let empty = services.as_object().is_none_or(|m| m.is_empty());
        if channels.is_empty() && empty {
            return None;
        }
        Some(json!({ "channels": channels, "services": services }))
    }

    /// Takes over a hand-over record (another daemon's, untrusted) for `guest`: its
    /// channels wait for the guest to resume them, its services' states go to the services.
    /// A channel whose service is not here or whose id is taken is left out (logged).
    pub fn import_record(&self, guest: GuestId, record: &Value) -> Result<(), RecordError> {
        let channels: Vec<ChannelRecord> =
            serde_json::from_value(record["channels"].clone()).map_err(RecordError::Part)?;
        check_channels(&channels)?;
        let room = super::MAX_CHANNELS.saturating_sub(
            self.channels
                .lock_or_recover()
                .values()
                .filter(|o| o.guest == guest)
                .count(),
        );
        if channels.len() > room {
            return Err(RecordError::TooManyChannels {
                channels: channels.len(),
                room,
            });
        }
        let name = self.guest_name(guest);
        for c in channels {
            if let Err(e) = self.hv.adopt(guest.0, &name, c.id, &c.service) {
                log::warn!(
                    "guest {guest}: channel {} ({}) not taken over: {e}",
                    c.id,
                    c.service
                );
                continue;
            }
            self.channels.lock_or_recover().insert(
                c.id,
                Open {
                    guest,
                    service: c.service,
                    region: c.region,
                    serving: None,
                    replay: c.answers,
                },
            );
        }
        if let Some(states) = record.get("services") {
            for (service, e) in self.hv.import_guest(guest.0, states) {
                log::warn!("guest {guest}: service {service:?} refused its state: {e}");
            }
        }
        Ok(())
    }

    /// `service::resume`: channel `id` of this guest, waiting since it came with the
    /// session, starts again on the channel laid out afresh in its region `ring`.
    pub(super) fn resume_channel(&self, cx: &DeviceCtx<'_>, id: u64, ring: u64) -> DeviceResult {
        let waiting = matches!(
            self.channels.lock_or_recover().get(&id),
            Some(o) if o.guest == cx.guest && o.serving.is_none() && o.region == ring
        );
        if !waiting {
            return Err(cx.fail(
                Status::BadArgument,
                format!("no channel {id} of this guest waiting to resume in region {ring}"),
            ));
        }
        let mut end = self.attach(cx, ring)?;
        let entries = end.layout().entries;
        // Two resumes of one channel at once: the second finds it served.
        let replay = match self.channels.lock_or_recover().get_mut(&id) {
            Some(o) if o.serving.is_none() => std::mem::take(&mut o.replay),
            _ => return Err(cx.fail(Status::BadArgument, format!("channel {id} resumed already"))),
        };
        // The answers the guest may not have read on the old daemon, first.
        let answers = replay.len() as u64;
        for a in &replay {
            let posted = a.decode(entries).and_then(|(e, bytes)| {
                end.slot(e.slot)?.write_at(0, &bytes)?;
                end.respond(e)
            });
            posted.map_err(|e| cx.fail(Status::BadArgument, format!("kept answer: {e}")))?;
        }
        self.start(cx, id, ring, end)?;
        Ok(ResumeReply {
            entries: u64::from(entries),
            answers,
        }
        .to_values())
    }
}
