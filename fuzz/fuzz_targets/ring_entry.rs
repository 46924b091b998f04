//! Ring entries decoded from arbitrary bytes and run the way the daemon runs them: CPU-side
//! requests through `virtsoc_host::dispatch::inline`, accesses on a device's queue through
//! `SvmManager::begin_access` / `end_access` with the device's domain (as the device worker
//! does), against a real SVM manager with one attached guest over a memfd window.
//!
//! The input is a sequence of 64-byte `Request`s (the first byte of the input picks the
//! coherence protocol). A region id below 16 stands for the guest's n-th live region, so
//! the fuzzer reaches regions that exist; every other id is used as it is. Every status is
//! fine; a panic is not.

#![no_main]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use virtsoc_host::dispatch;
use virtsoc_proto::{Opcode, Request, SharedWindow, WindowLayout};
use virtsoc_svm::{DomainId, ProtocolKind, SvmManager, Topology};
use vm_memory::ByteValued;

struct World {
    svm: SvmManager,
    windows: Vec<Arc<SharedWindow>>,
    domains: Vec<DomainId>,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let mut t = Topology::new();
        let producer = t.add_device_domain("producer");
        let consumer = t.add_device_domain("consumer");
        let windows = ProtocolKind::ALL
            .iter()
            .map(|_| {
                let layout = WindowLayout::new(4 << 20, 16, 16).expect("layout");
                Arc::new(SharedWindow::create_memfd("fuzz", layout).expect("memfd"))
            })
            .collect();
        World {
            svm: SvmManager::new(t),
            windows,
            domains: vec![producer, consumer, DomainId::HOST_RAM],
        }
    })
}

/// Bytes a fuzzed guest may hold: small, so that a run stays fast (its time goes to the
/// copies and page faults of its regions: 350 executions a second under ASan with 16 MiB),
/// and twice the SVM's largest size threshold (2 MiB: huge-page backing, streamed copies),
/// so that every path stays reachable.
const GUEST_LIMIT: u64 = 4 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let w = world();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let guest = virtsoc_svm::GuestId(NEXT.fetch_add(1, Ordering::Relaxed));
    let which = pick as usize % ProtocolKind::ALL.len();
    let kind = ProtocolKind::ALL[which];
    w.svm
        .attach_guest(
            guest,
            w.windows[which].clone(),
            w.svm.protocol(kind),
            GUEST_LIMIT,
        )
        .expect("attach");
    let mut live: Vec<u64> = Vec::new();
    for chunk in rest.chunks(Request::SIZE).take(64) {
        let mut req = Request::default();
        let n = chunk.len().min(Request::SIZE);
        req.as_mut_slice()[..n].copy_from_slice(&chunk[..n]);
        let op = Opcode::from_u32(req.opcode);
        if matches!(
            op,
            Some(Opcode::Free | Opcode::BeginAccess | Opcode::EndAccess)
        ) && req.args[0] < 16
            && !live.is_empty()
        {
            req.args[0] = live[req.args[0] as usize % live.len()];
        }
        // The device field routes an access: 0 is the CPU (inline), others a device domain.
        let on_device =
            req.device != 0 && matches!(op, Some(Opcode::BeginAccess | Opcode::EndAccess));
        let out = if on_device {
            let domain = w.domains[req.device as usize % w.domains.len()];
            match virtsoc_host::status::access_spec(&req, domain) {
                Ok((id, spec)) => {
                    let r = if op == Some(Opcode::BeginAccess) {
                        w.svm.begin_access(guest, id, &spec)
                    } else {
                        w.svm.end_access(guest, id, &spec).map(|e| e.report)
                    };
                    r.map(|r| virtsoc_host::status::access_values(&r))
                        .map_err(|e| virtsoc_host::status::status_of(&e))
                }
                Err(st) => Err(st),
            }
        } else {
            dispatch::inline(&w.svm, guest, &req)
        };
        match (op, out) {
            (Some(Opcode::Alloc), Ok(v)) => live.push(v[0]),
            (Some(Opcode::Free), Ok(_)) => live.retain(|&id| id != req.args[0]),
            _ => {}
        }
    }
    // A guest that leaves frees everything it held.
    let regions = w.svm.guest_usage(guest).map(|(r, _)| r).unwrap_or(0);
    assert_eq!(
        regions as usize,
        live.len(),
        "region count matches the allocations"
    );
    assert_eq!(w.svm.detach_guest(guest), live.len());
});
