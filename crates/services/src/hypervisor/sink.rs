//! Calls whose input is taken packet by packet where each packet lies (a channel's slot):
//! no reassembly buffer and no copy of the payload on the host.
//!
//! A streamed transfer is copied twice on its way to a service that needs it whole: the
//! guest's write of each slot and the host's copy of the slot into the transfer's buffer.
//! A call whose work folds over its input in any order (a sum, a sink, a store at the
//! packet's offset) does not need it whole: the service offers an [`InputSink`] for it
//! ([`Service::sink`]), the channel's thread hands it each packet in place as it comes, and
//! the commit ends it ([`InputSink::finish`]). The guest's write is then the only copy.
//!
//! The rules of a call still hold: the channel must be the guest's, the policy must allow
//! the service (checked at the first packet and again at the commit), the service must
//! declare the call, a panic in the sink kills the instance (`ServiceDied`), and the
//! commit's [`InputSink::finish`] passes the admission gate as a call does. The packets'
//! checks (header, bitmap, duplicates, overlaps, a commit that does not add up) are the
//! reassembler's, as for a buffered transfer.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{lock, CallCtx, Hypervisor, Registered, Reply, Service};
use crate::payload::{Input, Output};
use crate::{Result, ServiceError};

/// A call's input taken packet by packet, in whatever order the packets come, each once.
pub trait InputSink: Send {
    /// The bytes at `offset` of the input (one packet: `offset` a multiple of
    /// [`crate::packet::PACKET_SIZE`]), in place in guest memory.
    fn packet(&mut self, offset: u64, bytes: &dyn Input) -> Result<()>;
    /// Every packet came: the call's answer, its output written to `out`.
    fn finish(self: Box<Self>, cx: &CallCtx, out: &mut dyn Output) -> Result<Reply>;
}

/// A call of a channel whose input goes to the service's [`InputSink`]
/// ([`Hypervisor::open_sink`]).
pub struct SinkCall {
    guest: u64,
    channel: u64,
    call: u32,
    guest_name: String,
    service: String,
    registered: Arc<Registered>,
    inst: Arc<dyn Service>,
    sink: Box<dyn InputSink>,
}

impl std::fmt::Debug for SinkCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkCall")
            .field("channel", &self.channel)
            .field("service", &self.service)
            .field("call", &self.call)
            .finish()
    }
}

impl Hypervisor {
    /// The sink of call `call` of channel `channel` of `guest` for an input of `total`
    /// bytes, when the service takes that call's input packet by packet (`None`: it needs
    /// the input whole). Checked as a call is: the channel, the policy, the call.
    pub fn open_sink(
        &self,
        guest: u64,
        channel: u64,
        call: u32,
        total: u64,
    ) -> Result<Option<SinkCall>> {
        let (rec, r, inst) = self.resolve(guest, channel, call)?;
        let cx = CallCtx {
            guest,
            channel,
            timeout: self.call_timeout(),
        };
        let sink = match catch_unwind(AssertUnwindSafe(|| inst.sink(&cx, call, total))) {
            Ok(s) => s,
            Err(_) => return Err(self.died(&r, &inst, &rec.service, call)),
        };
        Ok(sink.map(|sink| SinkCall {
            guest,
            channel,
            call,
            guest_name: rec.guest_name,
            service: rec.service,
            registered: r,
            inst,
            sink,
        }))
    }

    /// Hands packet bytes at `offset` to the call's sink.
    pub fn sink_packet(&self, s: &mut SinkCall, offset: u64, bytes: &dyn Input) -> Result<()> {
        match catch_unwind(AssertUnwindSafe(|| s.sink.packet(offset, bytes))) {
            Ok(r) => r,
            Err(_) => Err(self.died(&s.registered, &s.inst, &s.service, s.call)),
        }
    }

    /// Every packet came: the call's answer (the policy checked again, through the gate).
    pub fn finish_sink(&self, s: SinkCall, out: &mut dyn Output) -> Result<Reply> {
        match lock(&self.channels).get(&s.channel) {
            Some(c) if c.guest == s.guest => {}
            _ => return Err(ServiceError::NoSuchChannel(s.channel)),
        }
        self.check(&s.guest_name, &s.service)?;
        let cx = CallCtx {
            guest: s.guest,
            channel: s.channel,
            timeout: self.call_timeout(),
        };
        let gate = self.gate(&s.service, &s.guest_name);
        let _pass = gate.as_ref().map(|(g, share)| {
            if let Some(v) = share {
                g.set_share(s.guest, *v);
            }
            g.enter(s.guest)
        });
        let SinkCall {
            registered,
            inst,
            sink,
            service,
            call,
            ..
        } = s;
        match catch_unwind(AssertUnwindSafe(|| sink.finish(&cx, out))) {
            Ok(res) => {
                registered.calls_served.fetch_add(1, Ordering::Relaxed);
                res
            }
            Err(_) => Err(self.died(&registered, &inst, &service, call)),
        }
    }

    /// Instance `inst` of `service` panicked in call `call`: it is dropped (the next call
    /// makes a fresh one); the error the guest gets.
    pub(super) fn died(
        &self,
        r: &Registered,
        inst: &Arc<dyn Service>,
        service: &str,
        call: u32,
    ) -> ServiceError {
        log::error!("service {service} died in call {call}; restarting it");
        self.restart(r, inst);
        ServiceError::ServiceDied(service.to_string())
    }
}
