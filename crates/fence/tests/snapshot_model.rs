//! Property test of the fence table's export and import: a random history of creates,
//! signals and releases (some overflowing the page) -> export -> import into a fresh table:
//! every id handed out has the same status in both, in the table and in the page, the
//! image round-trips, and both tables go on handing out fences that collide with no live id.

use proptest::prelude::*;
use std::sync::Arc;
use virtsoc_fence::{
    is_page_backed, FenceError, FenceId, FenceStatus, FenceTableImage, MemPage, SlotImage,
    VirtualFenceTable, PAGE_SLOTS,
};

#[derive(Debug, Clone)]
enum Op {
    Create,
    Signal(usize),
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::Create),
        3 => any::<usize>().prop_map(Op::Signal),
        1 => any::<usize>().prop_map(Op::Release),
    ]
}

fn run(ops: &[Op], prefill: usize) -> (Arc<VirtualFenceTable>, Vec<FenceId>) {
    let table = Arc::new(VirtualFenceTable::new(Arc::new(MemPage::new())));
    let mut ids = Vec::new();
    // Some histories fill the page with pending fences, so overflow fences are exported too.
    for _ in 0..prefill {
        ids.push(table.create().unwrap());
    }
    for op in ops {
        match op {
            Op::Create => ids.push(table.create().unwrap()),
            Op::Signal(i) if !ids.is_empty() => {
                let _ = table.signal(ids[i % ids.len()]);
            }
            Op::Release(i) if !ids.is_empty() => {
                let _ = table.release(ids[i % ids.len()]);
            }
            _ => {}
        }
    }
    (table, ids)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn export_import_keeps_every_id_and_status(
        ops in proptest::collection::vec(op(), 0..400),
        overflow in any::<bool>(),
    ) {
        let prefill = if overflow { PAGE_SLOTS as usize + 3 } else { 0 };
        let (a, ids) = run(&ops, prefill);
        let img = a.export();
        let page = Arc::new(MemPage::new());
        let b = VirtualFenceTable::new(page.clone());
        b.import(&img).unwrap();
        prop_assert_eq!(b.export(), img.clone());
        for &id in &ids {
            let s = a.status(id).unwrap();
            prop_assert_eq!(b.status(id).unwrap(), s, "{:?}", id);
            if is_page_backed(id) {
                prop_assert_eq!(page.status(id), Some(s), "page {:?}", id);
            }
        }
        // Both tables go on: a new fence is pending and is none of the pending ids.
        let pending: Vec<FenceId> = ids
            .iter()
            .copied()
            .filter(|&id| a.status(id) == Ok(FenceStatus::Pending))
            .collect();
        let n = b.create().unwrap();
        prop_assert!(!pending.contains(&n));
        prop_assert_eq!(b.status(n).unwrap(), FenceStatus::Pending);
        for id in pending {
            b.signal(id).unwrap();
            prop_assert_eq!(b.status(id).unwrap(), FenceStatus::Signaled);
        }
    }
}

fn image() -> FenceTableImage {
    let (t, _) = run(&[Op::Create, Op::Create, Op::Signal(0)], 0);
    t.export()
}

#[test]
fn bad_images_are_refused_and_change_nothing() {
    let mut cases = Vec::new();
    let mut i = image();
    i.slots.pop();
    cases.push(i);
    let mut i = image();
    i.slots[5] = (0, SlotImage::Signaled);
    cases.push(i);
    let mut i = image();
    i.slots[5] = (u32::MAX, SlotImage::Free);
    cases.push(i);
    let mut i = image();
    i.overflow.push(FenceId {
        index: PAGE_SLOTS + 1,
        generation: 1,
    });
    cases.push(i);
    let mut i = image();
    i.overflow.push(FenceId {
        index: 3,
        generation: 1,
    });
    i.overflow_next = 10;
    i.created = 10;
    cases.push(i);
    for img in cases {
        let t = VirtualFenceTable::new(Arc::new(MemPage::new()));
        let before = t.export();
        assert!(
            matches!(t.import(&img), Err(FenceError::BadImage(_))),
            "{img:?}"
        );
        assert_eq!(t.export(), before);
    }
}

#[test]
fn import_refuses_a_table_in_use() {
    let t = VirtualFenceTable::new(Arc::new(MemPage::new()));
    let f = t.create().unwrap();
    assert!(t.import(&image()).is_err());
    assert_eq!(t.status(f), Ok(FenceStatus::Pending));
}
