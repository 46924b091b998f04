//! Physical fence tables: per physical device timelines (vSoC §3.4).
//!
//! Host devices such as GPUs are asynchronous to the CPU: a command handed
//! to them has not *completed* when the submitting call returns. Each such
//! device (or ring/engine of it) gets a [`PhysicalFenceTable`], a timeline of
//! sequence numbers in the manner of rutabaga_gfx's per-ring fences. The
//! device backend takes a seqno per submission ([`next_seqno`]), attaches
//! the virtual fences that must follow it ([`attach`]) and reports
//! completion (from a `glFenceSync`/`vkFence`/... poller or callback) with
//! [`complete`] / [`complete_up_to`], which signals the attached virtual
//! fences in the shared [`VirtualFenceTable`], in seqno order.
//!
//! This module owns only the timeline bookkeeping; the device-specific
//! synchronization primitive stays in the device backend.
//!
//! [`next_seqno`]: PhysicalFenceTable::next_seqno
//! [`attach`]: PhysicalFenceTable::attach
//! [`complete`]: PhysicalFenceTable::complete
//! [`complete_up_to`]: PhysicalFenceTable::complete_up_to

use crate::error::{FenceError, Result};
use crate::table::{FenceId, VirtualFenceTable};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use virtsoc_sync::LockExt;

struct Inner {
    /// Next seqno to hand out (seqnos start at 1; 0 is "nothing").
    next: u64,
    /// Every seqno `<= last_completed` has completed.
    last_completed: u64,
    /// Seqnos `> last_completed + 1` completed out of order.
    completed_ahead: BTreeSet<u64>,
    /// Virtual fences waiting on a seqno, in attach order.
    attached: BTreeMap<u64, Vec<FenceId>>,
}

impl Inner {
    fn is_completed(&self, seqno: u64) -> bool {
        seqno <= self.last_completed || self.completed_ahead.contains(&seqno)
    }

    fn check_issued(&self, name: &str, seqno: u64) -> Result<()> {
        if seqno >= self.next {
            return Err(FenceError::SeqnoNotIssued {
                timeline: name.to_owned(),
                seqno,
                next: self.next,
            });
        }
        Ok(())
    }

    fn advance_watermark(&mut self) {
        while self.completed_ahead.remove(&(self.last_completed + 1)) {
            self.last_completed += 1;
        }
    }
}

/// One physical device timeline.
pub struct PhysicalFenceTable {
    name: String,
    table: Arc<VirtualFenceTable>,
    inner: Mutex<Inner>,
}

impl PhysicalFenceTable {
    /// A timeline named `name` (for logs and errors) that signals virtual
    /// fences of `table`.
    pub fn new(name: impl Into<String>, table: Arc<VirtualFenceTable>) -> Self {
        Self {
            name: name.into(),
            table,
            inner: Mutex::new(Inner {
                next: 1,
                last_completed: 0,
                completed_ahead: BTreeSet::new(),
                attached: BTreeMap::new(),
            }),
        }
    }

    /// The timeline's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Allocates the seqno of a new submission (1, 2, 3, ...).
    pub fn next_seqno(&self) -> u64 {
        let mut inner = self.inner.lock_or_recover();
        let seqno = inner.next;
        inner.next += 1;
        seqno
    }

    /// Signals `fence` when `seqno` completes; right away if it already has.
    /// Fails for a seqno not issued yet.
    pub fn attach(&self, seqno: u64, fence: FenceId) -> Result<()> {
        let mut inner = self.inner.lock_or_recover();
        inner.check_issued(&self.name, seqno)?;
        if inner.is_completed(seqno) {
            drop(inner);
            self.signal_all([fence]);
        } else {
            inner.attached.entry(seqno).or_default().push(fence);
        }
        Ok(())
    }

    /// Marks the single submission `seqno` completed (for devices that may
    /// retire out of order) and signals its fences. Returns the number of
    /// virtual fences signaled.
    pub fn complete(&self, seqno: u64) -> Result<usize> {
        let mut inner = self.inner.lock_or_recover();
        inner.check_issued(&self.name, seqno)?;
        if inner.is_completed(seqno) {
            return Ok(0);
        }
        inner.completed_ahead.insert(seqno);
        inner.advance_watermark();
        let fences = inner.attached.remove(&seqno).unwrap_or_default();
        drop(inner);
        Ok(self.signal_all(fences))
    }

    /// Marks every submission `<= seqno` completed and signals their fences
    /// in seqno order (attach order within a seqno). Returns the number of
    /// virtual fences signaled.
    pub fn complete_up_to(&self, seqno: u64) -> Result<usize> {
        let mut inner = self.inner.lock_or_recover();
        inner.check_issued(&self.name, seqno)?;
        if seqno <= inner.last_completed {
            return Ok(0);
        }
        inner.last_completed = seqno;
        inner.completed_ahead = inner.completed_ahead.split_off(&(seqno + 1));
        inner.advance_watermark();
        let later = inner.attached.split_off(&(seqno + 1));
        let done = std::mem::replace(&mut inner.attached, later);
        drop(inner);
        Ok(self.signal_all(done.into_values().flatten()))
    }

    /// Highest seqno such that it and every earlier one have completed
    /// (0 before the first completion).
    pub fn last_completed(&self) -> u64 {
        self.inner.lock_or_recover().last_completed
    }

    /// Whether `seqno` has completed.
    pub fn is_completed(&self, seqno: u64) -> bool {
        self.inner.lock_or_recover().is_completed(seqno)
    }

    /// Number of virtual fences attached to seqnos not completed yet.
    pub fn attached_count(&self) -> usize {
        self.inner
            .lock_or_recover()
            .attached
            .values()
            .map(Vec::len)
            .sum()
    }

    /// Signals outside our lock; failures (stale fence, cancelled table)
    /// are logged, not fatal, since completion itself did happen.
    fn signal_all(&self, fences: impl IntoIterator<Item = FenceId>) -> usize {
        let mut signaled = 0;
        for id in fences {
            match self.table.signal(id) {
                Ok(()) => signaled += 1,
                Err(e) => log::warn!("timeline {:?}: signal {id:?}: {e}", self.name),
            }
        }
        signaled
    }
}

impl fmt::Debug for PhysicalFenceTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.inner.lock_or_recover();
        f.debug_struct("PhysicalFenceTable")
            .field("name", &self.name)
            .field("next", &inner.next)
            .field("last_completed", &inner.last_completed)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::MemPage;
    use crate::table::{FenceStatus, SignalCallback};

    fn setup() -> (Arc<VirtualFenceTable>, PhysicalFenceTable) {
        let table = Arc::new(VirtualFenceTable::new(Arc::new(MemPage::new())));
        let phys = PhysicalFenceTable::new("gpu-ring0", table.clone());
        (table, phys)
    }

    #[test]
    fn complete_up_to_signals_in_seqno_order() {
        let (table, phys) = setup();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut fences = Vec::new();
        for _ in 0..5 {
            let s = phys.next_seqno();
            let f = table.create().unwrap();
            let o = order.clone();
            table
                .on_signal(
                    f,
                    Box::new(move || o.lock().unwrap().push(s)) as SignalCallback,
                )
                .unwrap();
            fences.push((s, f));
        }
        // Attach in reverse order to make sure order comes from seqnos.
        for &(s, f) in fences.iter().rev() {
            phys.attach(s, f).unwrap();
        }
        assert_eq!(phys.complete_up_to(3).unwrap(), 3);
        assert_eq!(*order.lock().unwrap(), vec![1, 2, 3]);
        assert_eq!(phys.last_completed(), 3);
        assert_eq!(table.status(fences[3].1).unwrap(), FenceStatus::Pending);
        assert_eq!(phys.complete_up_to(5).unwrap(), 2);
        assert_eq!(*order.lock().unwrap(), vec![1, 2, 3, 4, 5]);
        assert_eq!(phys.attached_count(), 0);
        assert_eq!(phys.complete_up_to(4).unwrap(), 0);
    }

    #[test]
    fn out_of_order_complete_and_watermark() {
        let (table, phys) = setup();
        let s1 = phys.next_seqno();
        let s2 = phys.next_seqno();
        let s3 = phys.next_seqno();
        let (f1, f2) = (table.create().unwrap(), table.create().unwrap());
        phys.attach(s1, f1).unwrap();
        phys.attach(s2, f2).unwrap();
        assert_eq!(phys.complete(s2).unwrap(), 1);
        assert_eq!(table.status(f2).unwrap(), FenceStatus::Signaled);
        assert_eq!(table.status(f1).unwrap(), FenceStatus::Pending);
        assert_eq!(phys.last_completed(), 0);
        assert!(phys.is_completed(s2) && !phys.is_completed(s3));
        assert_eq!(phys.complete(s1).unwrap(), 1);
        assert_eq!(phys.last_completed(), s2);
        assert_eq!(phys.complete(s2).unwrap(), 0);
        // complete_up_to over an out-of-order completion.
        let s4 = phys.next_seqno();
        phys.complete(s4).unwrap();
        phys.complete_up_to(s3).unwrap();
        assert_eq!(phys.last_completed(), s4);
    }

    #[test]
    fn attach_to_completed_seqno_signals_now() {
        let (table, phys) = setup();
        let s = phys.next_seqno();
        phys.complete_up_to(s).unwrap();
        let f = table.create().unwrap();
        phys.attach(s, f).unwrap();
        assert_eq!(table.status(f).unwrap(), FenceStatus::Signaled);
    }

    #[test]
    fn unissued_seqnos_are_rejected() {
        let (table, phys) = setup();
        let f = table.create().unwrap();
        assert!(matches!(
            phys.attach(1, f),
            Err(FenceError::SeqnoNotIssued {
                seqno: 1,
                next: 1,
                ..
            })
        ));
        assert!(phys.complete(1).is_err());
        assert!(phys.complete_up_to(1).is_err());
        assert_eq!(phys.name(), "gpu-ring0");
    }

    #[test]
    fn stale_fences_do_not_stop_completion() {
        let (table, phys) = setup();
        let s = phys.next_seqno();
        let (a, b) = (table.create().unwrap(), table.create().unwrap());
        table.signal(a).unwrap();
        table.release(a).unwrap(); // a is now stale
        phys.attach(s, a).unwrap();
        phys.attach(s, b).unwrap();
        assert_eq!(phys.complete_up_to(s).unwrap(), 1);
        assert_eq!(table.status(b).unwrap(), FenceStatus::Signaled);
    }
}
