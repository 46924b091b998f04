//! `Mutex`, `RwLock` and `Condvar` with the daemon's poison policy built in (see the crate
//! docs): the guard of a poisoned lock is recovered, so locking never returns a `Result`.
//! Modelled on crosvm's `sync::Mutex`, which wraps `std`'s the same way (crosvm panics on
//! poison; virtsoc recovers, for the reasons the crate docs give).

use std::fmt;
use std::sync::{
    MutexGuard, PoisonError, RwLockReadGuard, RwLockWriteGuard, TryLockError, WaitTimeoutResult,
};
use std::time::Duration;

/// A mutual exclusion lock whose [`lock`](Mutex::lock) recovers a poisoned lock's guard.
#[derive(Default)]
pub struct Mutex<T: ?Sized> {
    std: std::sync::Mutex<T>,
}

impl<T> Mutex<T> {
    /// A new unlocked mutex holding `value`.
    pub const fn new(value: T) -> Self {
        Mutex {
            std: std::sync::Mutex::new(value),
        }
    }

    /// The value, the mutex consumed.
    pub fn into_inner(self) -> T {
        self.std
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Locks, waiting for the lock; a poisoned lock's guard is recovered.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.std.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Locks if nobody holds the lock now; `None` if somebody does.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.std.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The value, through the only reference to the mutex.
    pub fn get_mut(&mut self) -> &mut T {
        self.std.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> From<T> for Mutex<T> {
    fn from(value: T) -> Self {
        Mutex::new(value)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.std, f)
    }
}

/// A reader-writer lock whose [`read`](RwLock::read) and [`write`](RwLock::write) recover a
/// poisoned lock's guard.
#[derive(Default)]
pub struct RwLock<T: ?Sized> {
    std: std::sync::RwLock<T>,
}

impl<T> RwLock<T> {
    /// A new unlocked lock holding `value`.
    pub const fn new(value: T) -> Self {
        RwLock {
            std: std::sync::RwLock::new(value),
        }
    }

    /// The value, the lock consumed.
    pub fn into_inner(self) -> T {
        self.std
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Locks for reading (shared with other readers).
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.std.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Locks for writing (alone).
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.std.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value, through the only reference to the lock.
    pub fn get_mut(&mut self) -> &mut T {
        self.std.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> From<T> for RwLock<T> {
    fn from(value: T) -> Self {
        RwLock::new(value)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.std, f)
    }
}

/// A condition variable for [`Mutex`]'s guards whose waits recover a poisoned lock's guard.
#[derive(Debug, Default)]
pub struct Condvar {
    std: std::sync::Condvar,
}

impl Condvar {
    /// A new condition variable.
    pub const fn new() -> Self {
        Condvar {
            std: std::sync::Condvar::new(),
        }
    }

    /// Sleeps until notified (or woken spuriously), the lock released meanwhile.
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.std.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    /// Sleeps while `condition` holds.
    pub fn wait_while<'a, T, F>(&self, guard: MutexGuard<'a, T>, condition: F) -> MutexGuard<'a, T>
    where
        F: FnMut(&mut T) -> bool,
    {
        self.std
            .wait_while(guard, condition)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Sleeps until notified or for at most `timeout`.
    pub fn wait_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        self.std
            .wait_timeout(guard, timeout)
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes one waiter.
    pub fn notify_one(&self) {
        self.std.notify_one();
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        self.std.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Panics on another thread while holding `m`'s lock.
    fn poison<T: Send + 'static>(m: &Arc<Mutex<T>>) {
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock();
            panic!("poison it");
        })
        .join();
        assert!(m.std.is_poisoned());
    }

    #[test]
    fn a_poisoned_mutex_still_locks() {
        let m = Arc::new(Mutex::new(5));
        poison(&m);
        *m.lock() += 1;
        assert_eq!(*m.lock(), 6);
        assert_eq!(m.try_lock().map(|g| *g), Some(6));
    }

    #[test]
    fn try_lock_is_none_while_held() {
        let m = Mutex::new(1);
        let g = m.lock();
        assert!(m.try_lock().is_none());
        drop(g);
        assert!(m.try_lock().is_some());
    }

    #[test]
    fn a_poisoned_rwlock_still_reads_and_writes() {
        let l = Arc::new(RwLock::new(1));
        let l2 = l.clone();
        let _ = std::thread::spawn(move || {
            let _g = l2.write();
            panic!("poison it");
        })
        .join();
        assert!(l.std.is_poisoned());
        *l.write() = 2;
        assert_eq!(*l.read(), 2);
        assert_eq!(Arc::try_unwrap(l).ok().map(RwLock::into_inner), Some(2));
    }

    #[test]
    fn condvar_waits_on_a_poisoned_lock() {
        let m = Arc::new(Mutex::new(0));
        poison(&m);
        let cv = Condvar::new();
        let (g, r) = cv.wait_timeout(m.lock(), Duration::ZERO);
        assert!(r.timed_out());
        assert_eq!(*g, 0);
        let g = cv.wait_while(g, |v| *v != 0);
        assert_eq!(*g, 0, "a condition already false does not wait");
    }
}
