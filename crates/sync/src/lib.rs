//! Lock helpers shared by every virtsoc crate: the one place where the daemon's policy on
//! poisoned locks is written down and applied.
//!
//! # Why a poisoned lock is recovered
//!
//! A `std` lock is *poisoned* when a thread panicked while holding it; `lock()` then returns
//! an error carrying the guard. The daemon takes the guard and goes on
//! ([`LockExt::lock_or_recover`] and friends), because:
//!
//! - a panic is a bug, never the answer to guest input (everything from a guest is validated
//!   and becomes a status), and it ends only the thread it happened on: a device worker that
//!   panics stops that device, and every other device, session and guest keeps running (see
//!   `docs/ARCHITECTURE.md`, "Containing native libraries"). Propagating the poison instead
//!   would turn one bug into a panic on every thread that touches the same table (the session
//!   list, a guest's fence table, a region), taking all guests down with it;
//! - the code is written not to hold these locks across work that may panic halfway through
//!   a multi-step update of the state they guard: callbacks (fence signals, copy
//!   completions), device commands and native calls run outside them, and the state under
//!   them (tables, counters, queues) is updated in steps that each leave it consistent.
//!
//! It would be the wrong choice for state whose invariant a panic could break between two
//! writes under the lock and that later readers trust without checking; such code must not
//! panic under the lock (and must not use these helpers to hide it if it can).
//!
//! # The types
//!
//! [`Mutex`], [`RwLock`] and [`Condvar`] are `std`'s with the policy built in (as crosvm's
//! `sync` crate wraps them): `lock()`, `read()`, `write()` and the waits return the guard,
//! never a `Result`, so a caller cannot choose another policy by accident (an `unwrap` that
//! panics, or a default returned on poison). New code uses them. The extension traits
//! ([`LockExt`], [`RwLockExt`], [`CondvarExt`]) apply the same policy to `std` locks where a
//! crate still holds those. [`EventCount`] is the wake-up counter device workers and
//! doorbells sleep on.

mod event;
mod types;

pub use event::EventCount;
pub use types::{Condvar, Mutex, RwLock};

use std::sync::PoisonError;
pub use std::sync::{MutexGuard, RwLockReadGuard, RwLockWriteGuard, WaitTimeoutResult};
use std::time::Duration;

/// Locking a `std` [`Mutex`](std::sync::Mutex) under the daemon's poison policy (see the crate docs).
pub trait LockExt<T: ?Sized> {
    /// Locks, recovering the guard of a poisoned lock.
    fn lock_or_recover(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockExt<T> for std::sync::Mutex<T> {
    fn lock_or_recover(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Locking a `std` [`RwLock`](std::sync::RwLock) under the daemon's poison policy (see the crate docs).
pub trait RwLockExt<T: ?Sized> {
    /// Locks for reading, recovering the guard of a poisoned lock.
    fn read_or_recover(&self) -> RwLockReadGuard<'_, T>;
    /// Locks for writing, recovering the guard of a poisoned lock.
    fn write_or_recover(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockExt<T> for std::sync::RwLock<T> {
    fn read_or_recover(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_or_recover(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Waiting on a `std` [`Condvar`](std::sync::Condvar) under the daemon's poison policy (see the crate docs).
pub trait CondvarExt {
    /// Waits, recovering the guard of a poisoned lock.
    fn wait_or_recover<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T>;
    /// Waits at most `timeout`, recovering the guard of a poisoned lock.
    fn wait_timeout_or_recover<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult);
    /// Waits while `condition` holds, at most `timeout`, recovering the guard of a poisoned
    /// lock.
    fn wait_timeout_while_or_recover<'a, T, F: FnMut(&mut T) -> bool>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
        condition: F,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult);
}

impl CondvarExt for std::sync::Condvar {
    fn wait_or_recover<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    fn wait_timeout_or_recover<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        self.wait_timeout(guard, timeout)
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn wait_timeout_while_or_recover<'a, T, F: FnMut(&mut T) -> bool>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
        condition: F,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        self.wait_timeout_while(guard, timeout, condition)
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Condvar, Mutex, RwLock};

    fn poisoned<T: Send + 'static>(v: T) -> Arc<Mutex<T>> {
        let m = Arc::new(Mutex::new(v));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        m
    }

    #[test]
    fn a_poisoned_mutex_is_recovered() {
        let m = poisoned(5);
        *m.lock_or_recover() += 1;
        assert_eq!(*m.lock_or_recover(), 6);
    }

    #[test]
    fn condvar_waits_recover_too() {
        let m = poisoned(0);
        let cv = Condvar::new();
        let (g, r) = cv.wait_timeout_or_recover(m.lock_or_recover(), Duration::ZERO);
        assert!(r.timed_out());
        assert_eq!(*g, 0);
        let (g, r) = cv.wait_timeout_while_or_recover(g, Duration::ZERO, |v| *v == 0);
        assert!(r.timed_out(), "the condition still held at the time-out");
        assert_eq!(*g, 0);
    }

    #[test]
    fn rwlocks_recover() {
        let l = Arc::new(RwLock::new(1));
        let l2 = l.clone();
        let _ = std::thread::spawn(move || {
            let _g = l2.write().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(l.is_poisoned());
        *l.write_or_recover() = 2;
        assert_eq!(*l.read_or_recover(), 2);
    }
}
