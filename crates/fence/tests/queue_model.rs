//! Model-based property test of `OrderedQueue` ordering guarantees.

use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use virtsoc_fence::{
    DoneToken, FenceId, FenceStatus, MemPage, OrderedQueue, QueueItem, TryPop, VirtualFenceTable,
};

/// Fences 0..QUEUE_FENCES are signaled only by `Signal` items; the others
/// only by the test ("another device").
const QUEUE_FENCES: usize = 4;
const FENCES: usize = 8;

#[derive(Debug, Clone)]
enum Op {
    PushCmd,
    PushSignal(usize),
    PushWait(usize),
    SignalExternal(usize),
    Pop,
    Complete(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::PushCmd),
        1 => (0..QUEUE_FENCES).prop_map(Op::PushSignal),
        2 => (0..FENCES).prop_map(Op::PushWait),
        1 => (QUEUE_FENCES..FENCES).prop_map(Op::SignalExternal),
        4 => Just(Op::Pop),
        3 => any::<usize>().prop_map(Op::Complete),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn queue_respects_fences_and_fifo(ops in prop::collection::vec(op(), 0..200)) {
        let table = Arc::new(VirtualFenceTable::new(Arc::new(MemPage::new())));
        let queue: OrderedQueue<u32> = OrderedQueue::new(table.clone());
        let fences: Vec<FenceId> = (0..FENCES).map(|_| table.create().unwrap()).collect();

        // Commands completed so far, and a snapshot of it taken when each
        // queue fence got signaled.
        let done: Arc<Mutex<BTreeSet<u32>>> = Arc::default();
        let snapshots: Arc<Mutex<HashMap<usize, BTreeSet<u32>>>> = Arc::default();
        for (k, &f) in fences.iter().enumerate().take(QUEUE_FENCES) {
            let (done, snapshots) = (done.clone(), snapshots.clone());
            table.on_signal(f, Box::new(move || {
                let snap = done.lock().unwrap().clone();
                snapshots.lock().unwrap().insert(k, snap);
            })).unwrap();
        }

        // Push-order model.
        let mut pushed_cmds = 0u32;
        let mut waits_before_cmd: Vec<Vec<usize>> = Vec::new(); // per cmd
        let mut waits_so_far: Vec<usize> = Vec::new();
        // For each queue fence, commands pushed before its first Signal.
        let mut first_signal_barrier: HashMap<usize, u32> = HashMap::new();
        let mut next_pop = 0u32;
        let mut tokens: Vec<(u32, DoneToken)> = Vec::new();
        let mut forced: HashSet<usize> = HashSet::new();

        let pop_check = |cmd: u32, next_pop: &mut u32, waits: &Vec<Vec<usize>>| -> Result<(), TestCaseError> {
            prop_assert_eq!(cmd, *next_pop, "FIFO order");
            *next_pop += 1;
            for &k in &waits[cmd as usize] {
                prop_assert_eq!(table.status(fences[k]).unwrap(), FenceStatus::Signaled,
                    "cmd {} passed Wait on fence {}", cmd, k);
            }
            Ok(())
        };

        for op in ops {
            match op {
                Op::PushCmd => {
                    queue.push(QueueItem::Cmd(pushed_cmds)).unwrap();
                    waits_before_cmd.push(waits_so_far.clone());
                    pushed_cmds += 1;
                }
                Op::PushSignal(k) => {
                    queue.push(QueueItem::Signal(fences[k])).unwrap();
                    first_signal_barrier.entry(k).or_insert(pushed_cmds);
                }
                Op::PushWait(k) => {
                    queue.push(QueueItem::Wait(fences[k])).unwrap();
                    waits_so_far.push(k);
                }
                Op::SignalExternal(k) => table.signal(fences[k]).unwrap(),
                Op::Pop => match queue.try_pop_ready() {
                    TryPop::Ready(cmd, token) => {
                        pop_check(cmd, &mut next_pop, &waits_before_cmd)?;
                        tokens.push((cmd, token));
                    }
                    TryPop::Blocked(f) => {
                        prop_assert_eq!(table.status(f).unwrap(), FenceStatus::Pending);
                    }
                    TryPop::Empty => prop_assert_eq!(next_pop, pushed_cmds),
                    TryPop::Closed => prop_assert!(false, "queue closed"),
                },
                Op::Complete(i) if !tokens.is_empty() => {
                    let (cmd, token) = tokens.swap_remove(i % tokens.len());
                    done.lock().unwrap().insert(cmd);
                    token.done();
                }
                Op::Complete(_) => {}
            }
            prop_assert_eq!(queue.in_flight(), tokens.len());
            // A queue fence is only signaled with every command before its
            // first Signal completed.
            for (k, snap) in snapshots.lock().unwrap().iter() {
                if forced.contains(k) {
                    continue;
                }
                let barrier = first_signal_barrier.get(k).copied();
                prop_assert!(barrier.is_some(), "fence {} signaled without a Signal item", k);
                for c in 0..barrier.unwrap() {
                    prop_assert!(snap.contains(&c), "fence {} signaled before cmd {} completed", k, c);
                }
            }
        }

        // Drain: complete everything, force fences nobody will signal.
        for (cmd, token) in tokens.drain(..) {
            done.lock().unwrap().insert(cmd);
            token.done();
        }
        for &f in &fences[QUEUE_FENCES..] {
            table.signal(f).unwrap();
        }
        loop {
            match queue.try_pop_ready() {
                TryPop::Ready(cmd, token) => {
                    pop_check(cmd, &mut next_pop, &waits_before_cmd)?;
                    done.lock().unwrap().insert(cmd);
                    token.done();
                }
                TryPop::Blocked(f) => {
                    let k = fences.iter().position(|&x| x == f).unwrap();
                    forced.insert(k);
                    table.signal(f).unwrap();
                }
                TryPop::Empty => break,
                TryPop::Closed => prop_assert!(false, "queue closed"),
            }
        }
        prop_assert_eq!(next_pop, pushed_cmds, "every command came out");
        for &k in first_signal_barrier.keys() {
            prop_assert_eq!(table.status(fences[k]).unwrap(), FenceStatus::Signaled);
        }
    }
}
