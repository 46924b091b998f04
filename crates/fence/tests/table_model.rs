//! Model-based property test of `VirtualFenceTable` (with its page mirror).

use proptest::prelude::*;
use std::collections::HashSet;
use std::sync::Arc;
use virtsoc_fence::{
    is_page_backed, FenceError, FenceId, FenceStatus, MemPage, VirtualFenceTable, PAGE_SLOTS,
};

#[derive(Debug, Clone)]
enum Op {
    Create,
    Signal(usize),
    Release(usize),
    Status(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::Create),
        2 => any::<usize>().prop_map(Op::Signal),
        1 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Status),
    ]
}

#[derive(Debug, Default, Clone, Copy)]
struct Model {
    signaled: bool,
    released: bool,
}

fn check(table: &VirtualFenceTable, page: &MemPage, id: FenceId, m: Model) {
    let status = table.status(id).expect("issued id has a status");
    let page_status = page.status(id);
    if m.signaled {
        assert_eq!(status, FenceStatus::Signaled, "{id:?} signaled before");
        if let Some(s) = page_status {
            assert_eq!(s, FenceStatus::Signaled, "page for {id:?}");
        }
    } else {
        assert_eq!(status, FenceStatus::Pending, "unsignaled {id:?}");
        if let Some(s) = page_status {
            assert_eq!(s, FenceStatus::Pending, "page for {id:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn table_matches_model(ops in prop::collection::vec(op(), 0..4000)) {
        let page = Arc::new(MemPage::new());
        let table = VirtualFenceTable::new(page.clone());
        let mut ids: Vec<FenceId> = Vec::new();
        let mut model: Vec<Model> = Vec::new();
        let mut issued: HashSet<FenceId> = HashSet::new();
        for op in ops {
            match op {
                Op::Create => {
                    let id = table.create().unwrap();
                    prop_assert!(issued.insert(id), "id {:?} handed out twice", id);
                    if is_page_backed(id) {
                        // Must not alias the slot of a fence still holding it
                        // unsignaled.
                        for (other, m) in ids.iter().zip(&model) {
                            prop_assert!(
                                other.index != id.index || m.signaled,
                                "{:?} reuses the slot of pending {:?}", id, other
                            );
                        }
                    } else {
                        let pending_page = ids
                            .iter()
                            .zip(&model)
                            .filter(|(i, m)| is_page_backed(**i) && !m.signaled)
                            .map(|(i, _)| i.index)
                            .collect::<HashSet<_>>()
                            .len();
                        prop_assert_eq!(pending_page, PAGE_SLOTS as usize, "overflow while slots remain");
                    }
                    ids.push(id);
                    model.push(Model::default());
                    check(&table, &page, id, Model::default());
                }
                Op::Signal(i) if !ids.is_empty() => {
                    let i = i % ids.len();
                    let r = table.signal(ids[i]);
                    if model[i].signaled {
                        prop_assert!(
                            r.is_ok() || r == Err(FenceError::StaleFence(ids[i])),
                            "re-signal: {:?}", r
                        );
                    } else {
                        prop_assert_eq!(r, Ok(()));
                    }
                    model[i].signaled = true;
                    check(&table, &page, ids[i], model[i]);
                }
                Op::Release(i) if !ids.is_empty() => {
                    let i = i % ids.len();
                    prop_assert_eq!(table.release(ids[i]), Ok(()));
                    model[i].released = true;
                    check(&table, &page, ids[i], model[i]);
                }
                Op::Status(i) if !ids.is_empty() => {
                    let i = i % ids.len();
                    check(&table, &page, ids[i], model[i]);
                }
                _ => {}
            }
        }
        // Every fence, signaled or not, still reads as the model says.
        for (&id, &m) in ids.iter().zip(&model) {
            check(&table, &page, id, m);
        }
        let stats = table.stats();
        let pending = model.iter().filter(|m| !m.signaled).count();
        prop_assert_eq!(stats.live, pending);
        prop_assert_eq!(stats.created, ids.len() as u64);
    }
}
