//! Unit tests of `table`.

use super::*;
use crate::page::{slot_status, unpack_word, MemPage};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Barrier};
use std::thread;
use virtsoc_sync::LockExt;

fn table() -> (Arc<MemPage>, Arc<VirtualFenceTable>) {
    let page = Arc::new(MemPage::new());
    let table = Arc::new(VirtualFenceTable::new(page.clone()));
    (page, table)
}

#[test]
fn id_packing_roundtrip() {
    let id = FenceId {
        index: 0xdead_beef,
        generation: 0x1234_5678,
    };
    assert_eq!(FenceId::from_u64(id.to_u64()), id);
    assert_eq!(id.to_u64(), 0x1234_5678_dead_beef);
}

#[test]
fn overflow_id_mapping_roundtrip() {
    for seq in [
        0,
        1,
        OVERFLOW_RANGE - 1,
        OVERFLOW_RANGE,
        5 * OVERFLOW_RANGE + 7,
    ] {
        let id = overflow_id(seq);
        assert!(!is_page_backed(id));
        assert_eq!(overflow_seq(id), Some(seq));
    }
}

#[test]
fn page_mirrors_create_and_signal() {
    let (page, table) = table();
    let id = table.create().unwrap();
    assert!(is_page_backed(id));
    assert_eq!(
        unpack_word(page.load_slot(id.index)),
        (id.generation, false)
    );
    assert_eq!(page.status(id), Some(FenceStatus::Pending));
    table.signal(id).unwrap();
    assert_eq!(unpack_word(page.load_slot(id.index)), (id.generation, true));
    assert_eq!(page.status(id), Some(FenceStatus::Signaled));
    // A guest-side view of an older generation of the same slot.
    let older = FenceId {
        index: id.index,
        generation: id.generation - 1,
    };
    page.store_slot(id.index, pack_word(id.generation, false));
    assert_eq!(
        slot_status(page.load_slot(id.index), older),
        FenceStatus::Signaled
    );
}

#[test]
fn host_state_ignores_guest_scribbles() {
    let (page, table) = table();
    let a = table.create().unwrap();
    let b = table.create().unwrap();
    table.signal(b).unwrap();
    // The guest scribbles the opposite of the truth onto the page.
    page.store_slot(a.index, pack_word(a.generation, true));
    page.store_slot(b.index, pack_word(b.generation, false));
    assert_eq!(table.status(a).unwrap(), FenceStatus::Pending);
    assert_eq!(table.status(b).unwrap(), FenceStatus::Signaled);
    // The next host write restores the truth.
    table.signal(a).unwrap();
    assert_eq!(page.status(a), Some(FenceStatus::Signaled));
}

#[test]
fn signal_is_idempotent_and_rejects_unknown_and_stale() {
    let (_page, table) = table();
    let id = table.create().unwrap();
    table.signal(id).unwrap();
    table.signal(id).unwrap();
    let never = FenceId {
        index: id.index,
        generation: id.generation + 1,
    };
    assert_eq!(table.signal(never), Err(FenceError::UnknownFence(never)));
    assert_eq!(table.status(never), Err(FenceError::UnknownFence(never)));
    let never_overflow = overflow_id(0);
    assert_eq!(
        table.signal(never_overflow),
        Err(FenceError::UnknownFence(never_overflow))
    );
    table.release(id).unwrap();
    assert_eq!(table.signal(id), Err(FenceError::StaleFence(id)));
    assert_eq!(table.status(id).unwrap(), FenceStatus::Signaled);
}

#[test]
fn recycling_reuses_indices_without_aliasing_live_fences() {
    let (page, table) = table();
    // A set of fences that stay pending throughout.
    let live: Vec<FenceId> = (0..100).map(|_| table.create().unwrap()).collect();
    let live_indices: HashSet<u32> = live.iter().map(|id| id.index).collect();
    let mut old = Vec::new();
    let mut seen = HashSet::new();
    let total = 10 * PAGE_SLOTS as usize;
    for _ in 0..total {
        let id = table.create().unwrap();
        assert!(is_page_backed(id), "no overflow needed: {id:?}");
        assert!(
            !live_indices.contains(&id.index),
            "recycled a live fence's slot: {id:?}"
        );
        assert!(seen.insert(id), "duplicate id {id:?}");
        table.signal(id).unwrap();
        old.push(id); // never released: only recycling frees these
    }
    let stats = table.stats();
    assert!(stats.recycled > 0, "{stats:?}");
    let distinct: HashSet<u32> = old.iter().map(|id| id.index).collect();
    assert!(distinct.len() < total, "indices were reused");
    for &id in &old {
        assert_eq!(table.status(id).unwrap(), FenceStatus::Signaled, "{id:?}");
        assert_eq!(page.status(id), Some(FenceStatus::Signaled), "{id:?}");
    }
    for &id in &live {
        assert_eq!(table.status(id).unwrap(), FenceStatus::Pending);
        assert_eq!(page.status(id), Some(FenceStatus::Pending));
    }
}

#[test]
fn recycles_oldest_signaled_first_when_low() {
    let (_page, table) = table();
    let all: Vec<FenceId> = (0..PAGE_SLOTS).map(|_| table.create().unwrap()).collect();
    // Signal in a scrambled order; the recycle order must follow it.
    let order: Vec<FenceId> = all.iter().rev().step_by(3).copied().collect();
    for &id in &order {
        table.signal(id).unwrap();
    }
    for &expected in order.iter().take(10) {
        let id = table.create().unwrap();
        assert_eq!(id.index, expected.index);
        assert_eq!(id.generation, expected.generation + 1);
    }
}

#[test]
fn released_signaled_slots_are_reused_before_recycling() {
    let (_page, table) = table();
    let a = table.create().unwrap();
    table.signal(a).unwrap();
    // Plenty of free slots: a's slot stays readable with its own
    // generation until free slots run low.
    let b = table.create().unwrap();
    assert_ne!(b.index, a.index);
    assert_eq!(table.stats().signaled, 1);
    table.release(a).unwrap();
    assert_eq!(table.stats().signaled, 0);
    assert_eq!(table.stats().recycled, 0);
}

#[test]
fn releasing_a_pending_fence_keeps_its_slot_until_signaled() {
    let (_page, table) = table();
    let all: Vec<FenceId> = (0..PAGE_SLOTS).map(|_| table.create().unwrap()).collect();
    table.release(all[0]).unwrap();
    let next = table.create().unwrap();
    assert!(!is_page_backed(next), "slot of a pending fence was reused");
    assert_eq!(table.status(all[0]).unwrap(), FenceStatus::Pending);
    table.signal(all[0]).unwrap();
    let reused = table.create().unwrap();
    assert_eq!(reused.index, all[0].index);
    assert_eq!(table.status(all[0]).unwrap(), FenceStatus::Signaled);
    assert_eq!(table.status(reused).unwrap(), FenceStatus::Pending);
}

#[test]
fn overflow_fences_when_page_is_full() {
    let (_page, table) = table();
    let page_ids: Vec<FenceId> = (0..PAGE_SLOTS).map(|_| table.create().unwrap()).collect();
    assert!(page_ids.iter().all(|id| is_page_backed(*id)));
    let extra: Vec<FenceId> = (0..50).map(|_| table.create().unwrap()).collect();
    assert!(extra.iter().all(|id| !table.is_page_backed(*id)));
    assert_eq!(extra.iter().collect::<HashSet<_>>().len(), extra.len());
    let stats = table.stats();
    assert_eq!(stats.live, PAGE_SLOTS as usize + 50);
    assert_eq!(stats.overflow, 50);
    for &id in &extra {
        assert_eq!(table.status(id).unwrap(), FenceStatus::Pending);
        assert_eq!(
            table.wait(id, Some(Duration::ZERO)).unwrap(),
            FenceStatus::Pending
        );
    }
    // Signal and wait on overflow fences.
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let table = table.clone();
        let id = extra[7];
        thread::spawn(move || {
            tx.send(()).unwrap();
            table.wait(id, None)
        })
    };
    rx.recv().unwrap();
    for &id in &extra {
        table.signal(id).unwrap();
        assert_eq!(table.status(id).unwrap(), FenceStatus::Signaled);
        assert_eq!(table.wait(id, None).unwrap(), FenceStatus::Signaled);
    }
    assert_eq!(waiter.join().unwrap(), Ok(FenceStatus::Signaled));
    assert_eq!(table.stats().overflow, 0);
    // Signaled overflow fences are stale but still read signaled.
    assert_eq!(
        table.signal(extra[0]),
        Err(FenceError::StaleFence(extra[0]))
    );
    assert_eq!(table.status(extra[0]).unwrap(), FenceStatus::Signaled);
    // Freeing page slots stops the overflow.
    table.signal(page_ids[3]).unwrap();
    assert!(is_page_backed(table.create().unwrap()));
}

#[test]
fn many_waiters_wake_on_one_signal() {
    let (_page, table) = table();
    let id = table.create().unwrap();
    let n = 4;
    let barrier = Arc::new(Barrier::new(n + 1));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let table = table.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                table.wait(id, None)
            })
        })
        .collect();
    barrier.wait();
    table.signal(id).unwrap();
    for h in handles {
        assert_eq!(h.join().unwrap(), Ok(FenceStatus::Signaled));
    }
}

#[test]
fn wait_times_out_as_pending() {
    let (_page, table) = table();
    let id = table.create().unwrap();
    assert_eq!(
        table.wait(id, Some(Duration::from_millis(1))).unwrap(),
        FenceStatus::Pending
    );
}

#[test]
fn on_signal_runs_now_or_later_exactly_once() {
    let (_page, table) = table();
    let count = Arc::new(AtomicUsize::new(0));
    let bump = |c: &Arc<AtomicUsize>| {
        let c = c.clone();
        Box::new(move || {
            c.fetch_add(1, Ordering::SeqCst);
        }) as SignalCallback
    };
    let id = table.create().unwrap();
    table.on_signal(id, bump(&count)).unwrap();
    table.on_signal(id, bump(&count)).unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 0);
    table.signal(id).unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 2);
    table.signal(id).unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 2);
    table.on_signal(id, bump(&count)).unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 3);
    let unknown = FenceId {
        index: 500,
        generation: 9,
    };
    assert!(table.on_signal(unknown, bump(&count)).is_err());
    assert_eq!(count.load(Ordering::SeqCst), 3);
}

#[test]
fn callbacks_may_reenter_the_table() {
    let (_page, table) = table();
    let a = table.create().unwrap();
    let b = table.create().unwrap();
    let t2 = table.clone();
    table
        .on_signal(a, Box::new(move || t2.signal(b).unwrap()))
        .unwrap();
    table.signal(a).unwrap();
    assert_eq!(table.status(b).unwrap(), FenceStatus::Signaled);
}

#[test]
fn cancel_all_wakes_waiters_with_cancelled() {
    let (_page, table) = table();
    let pending = table.create().unwrap();
    let done = table.create().unwrap();
    table.signal(done).unwrap();
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let table = table.clone();
        thread::spawn(move || {
            tx.send(()).unwrap();
            table.wait(pending, None)
        })
    };
    rx.recv().unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    table
        .on_signal(
            pending,
            Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .unwrap();
    table.cancel_all();
    assert_eq!(waiter.join().unwrap(), Err(FenceError::Cancelled));
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(table.status(pending), Err(FenceError::Cancelled));
    assert_eq!(table.status(done), Ok(FenceStatus::Signaled));
    assert_eq!(table.create(), Err(FenceError::Cancelled));
    assert_eq!(table.signal(pending), Err(FenceError::Cancelled));
    assert_eq!(table.signal_all(), 0);
    assert!(table.is_cancelled());
}

#[test]
fn signal_all_signals_page_and_overflow_fences() {
    let (page, table) = table();
    let ids: Vec<FenceId> = (0..PAGE_SLOTS + 3)
        .map(|_| table.create().unwrap())
        .collect();
    assert_eq!(table.signal_all(), ids.len());
    for &id in &ids {
        assert_eq!(table.status(id).unwrap(), FenceStatus::Signaled);
        if let Some(s) = page.status(id) {
            assert_eq!(s, FenceStatus::Signaled);
        }
    }
    assert_eq!(table.stats().live, 0);
}

#[test]
fn signaled_fifo_stays_bounded_under_release_churn() {
    let (_page, table) = table();
    for _ in 0..20 * PAGE_SLOTS {
        let id = table.create().unwrap();
        table.signal(id).unwrap();
        table.release(id).unwrap();
    }
    assert!(table.inner.lock_or_recover().signaled_fifo.len() <= 2 * PAGE_SLOTS as usize + 1);
    assert_eq!(table.stats().free_slots, PAGE_SLOTS as usize);
}

#[test]
fn new_table_writes_header_and_clears_slots() {
    let page = Arc::new(MemPage::new());
    page.store_slot(5, 0xffff_ffff);
    page.store_header(0);
    let _table = VirtualFenceTable::new(page.clone());
    assert_eq!(page.header(), PAGE_HEADER);
    assert_eq!(page.load_slot(5), 0);
}

#[test]
fn generation_wraps_skipping_zero() {
    assert_eq!(next_generation(GENERATION_MASK), 1);
    assert_eq!(next_generation(0), 1);
    assert_eq!(next_generation(41), 42);
}

#[test]
fn table_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<VirtualFenceTable>();
    assert_send_sync::<Arc<VirtualFenceTable>>();
}

#[test]
fn live_fences_are_capped_overflow_included() {
    let cap = PAGE_SLOTS as usize + 3;
    let t = VirtualFenceTable::with_limit(Arc::new(MemPage::new()), cap);
    let ids: Vec<_> = (0..cap).map(|_| t.create().unwrap()).collect();
    assert!(!is_page_backed(ids[cap - 1]), "the last ones overflow");
    assert_eq!(t.create(), Err(FenceError::TooMany(cap)));
    assert_eq!(t.stats().live, cap);
    // A signaled fence makes room again.
    t.signal(ids[cap - 1]).unwrap();
    t.create().unwrap();
    assert_eq!(t.create(), Err(FenceError::TooMany(cap)));

    // Under the page's size the page itself is capped.
    let small = VirtualFenceTable::with_limit(Arc::new(MemPage::new()), 2);
    let (a, _b) = (small.create().unwrap(), small.create().unwrap());
    assert_eq!(small.create(), Err(FenceError::TooMany(2)));
    small.signal(a).unwrap();
    small.create().unwrap();
}
