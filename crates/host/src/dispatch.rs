//! Decoding and execution of ring requests.
//!
//! Every field of a request came from guest memory: opcodes, devices, modes, ids, offsets and
//! lengths are all checked here or in the SVM manager, and anything wrong becomes a status in
//! the completion.

use virtsoc_proto::counters::{Counters, LedgerEntry, LEDGER_PAGE};
use virtsoc_proto::ops::{AllocReply, CoreRequest, FreeReply, NopReply, StatsReply};
use virtsoc_proto::{Opcode, Request, Status};
use virtsoc_svm::{AllocDesc, DomainId, GuestId, RegionId, SvmError, SvmManager};

/// The one status mapping ([`crate::status`]), under the name some devices still call.
pub use crate::status::status_of;
use crate::status::{access_spec, access_values};

/// Result values or an error status.
pub type Outcome = std::result::Result<[u64; 6], Status>;

fn svm<T>(guest: GuestId, r: Result<T, SvmError>) -> Result<T, Status> {
    r.map_err(|e| {
        log::debug!("guest {guest}: {e}");
        status_of(&e)
    })
}

/// A CPU access (the guest window's domain), run on the session's thread: a begin_access
/// waits there for copies in flight, holding up only this guest.
fn access(svm_mgr: &SvmManager, guest: GuestId, req: &Request, begin: bool) -> Outcome {
    let (id, spec) = access_spec(req, DomainId::GUEST_WINDOW)?;
    let r = if begin {
        svm_mgr.begin_access(guest, id, &spec)
    } else if posted(req) {
        svm_mgr.posted_write(guest, id, &spec).map(|e| e.report)
    } else {
        svm_mgr.end_access(guest, id, &spec).map(|e| e.report)
    };
    Ok(access_values(&svm(guest, r)?))
}

/// Whether `req` (an access) is a posted write ([`virtsoc_proto::wire::ACCESS_BEGINS`]).
pub fn posted(req: &Request) -> bool {
    Opcode::from_u32(req.opcode) == Some(Opcode::EndAccess)
        && req.args[4] & virtsoc_proto::wire::ACCESS_BEGINS != 0
}

/// Runs a request that needs no device: allocation, CPU accesses, queries. Its words are
/// decoded by the core requests' declaration ([`virtsoc_proto::ops`]).
pub fn inline(svm_mgr: &SvmManager, guest: GuestId, req: &Request) -> Outcome {
    if Opcode::from_u32(req.opcode).is_some_and(Opcode::runs_device_command) {
        return Err(Status::UnknownDevice); // a device command on the CPU
    }
    match CoreRequest::decode(req.opcode, &req.args)? {
        CoreRequest::Nop(_) => Ok(NopReply {}.to_values()),
        CoreRequest::Alloc(a) => {
            let desc = AllocDesc {
                size: a.size,
                width: a.width,
                height: a.height,
                format: a.format,
                usage: a.usage,
            };
            let (id, meta) = svm(guest, svm_mgr.alloc(guest, desc))?;
            let reply = AllocReply {
                id: id.0,
                size: meta.size,
                stride: meta.stride as u64,
            };
            Ok(reply.to_values())
        }
        CoreRequest::Free(f) => {
            svm(guest, svm_mgr.free(guest, RegionId(f.id)))?;
            Ok(FreeReply {}.to_values())
        }
        CoreRequest::BeginAccess(_) => access(svm_mgr, guest, req, true),
        CoreRequest::EndAccess(_) => access(svm_mgr, guest, req, false),
        CoreRequest::Stats(_) => {
            let (regions, bytes) = svm(guest, svm_mgr.guest_usage(guest))?;
            Ok(StatsReply {
                guest: guest.0,
                regions,
                bytes,
            }
            .to_values())
        }
        CoreRequest::Counters(c) => counters_page(svm_mgr, guest, c.page),
        // Handled by the session, which owns the fence table.
        CoreRequest::FenceCreate(_)
        | CoreRequest::FenceSignal(_)
        | CoreRequest::FenceWait(_)
        | CoreRequest::FenceRelease(_)
        | CoreRequest::FenceStatus(_) => Err(Status::Internal),
    }
}

/// The guest's own counters (its metadata, its ledger): page `n` of the `Counters` request,
/// the record's pages first, then one ledger link per page.
fn counters_page(svm_mgr: &SvmManager, guest: GuestId, n: u64) -> Outcome {
    let ledger = svm(guest, svm_mgr.guest_ledger(guest))?;
    if n >= LEDGER_PAGE {
        let i = usize::try_from(n - LEDGER_PAGE).map_err(|_| Status::BadArgument)?;
        let ((src, dst), l) = ledger.get(i).ok_or(Status::BadArgument)?;
        let entry = LedgerEntry {
            src: *src,
            dst: *dst,
            copies: l.copies,
            bytes: l.bytes,
            ns: l.ns,
        };
        return Ok(entry.to_values());
    }
    let record = Counters {
        metadata_bytes: svm_mgr.metadata_bytes(guest),
        ledger_links: ledger.len() as u64,
        ..svm(guest, svm_mgr.guest_counters(guest))?
    };
    record.page(n).ok_or(Status::BadArgument)
}
