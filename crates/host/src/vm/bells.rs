//! The host's doorbells toward a VM guest: a byte on the VM's port rings the guest
//! ([`PortRinger`], for its session ring and for each of its service channels), and the
//! guest's doorbell bytes wake the host's end of its session ring and of each of its
//! channels ([`GuestPort`]).
//!
//! A channel's host thread sleeps on the channel's futex word in the window as it does for a
//! process guest (the daemon's threads share its mapping of the VM's memory file); the VM's
//! kernel cannot wake that futex, so the port's reader ([`super::serve_vm`]) does it on the
//! guest's behalf: every `MSG_BELL` wakes the session thread and each channel of the guest
//! whose host end announced that it sleeps. What the guest does with its bytes costs only
//! its own port thread: a flood of bells is a flood of flag checks (at most
//! [`crate::services::MAX_CHANNELS`] per byte) and wake-ups of its own threads.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use virtsoc_proto::ring::{Doorbell, FutexDoorbell};
use virtsoc_proto::SharedWindow;
use virtsoc_services::chan::{bells, Bells};
use virtsoc_sync::LockExt;

use super::MSG_BELL;

/// The guest's bell seen from the host: a byte on the port when the guest sleeps (its flag
/// at `sleeping` in the window is set).
pub(super) struct PortRinger {
    pub(super) window: Arc<SharedWindow>,
    pub(super) port: Arc<Mutex<UnixStream>>,
    pub(super) sleeping: u64,
}

impl PortRinger {
    fn ring(&self) {
        let _ = self.port.lock_or_recover().write_all(&[MSG_BELL]);
    }
}

impl Doorbell for PortRinger {
    fn notify(&self) {
        fence(Ordering::SeqCst);
        let sleeping = self
            .window
            .atomic_u32(self.sleeping)
            .map(|f| f.load(Ordering::SeqCst) != 0)
            .unwrap_or(true);
        if sleeping {
            self.ring();
        }
    }

    fn force_wake(&self) {
        self.ring();
    }

    fn wait(&self, ready: &mut dyn FnMut() -> bool, _timeout: Option<Duration>) -> bool {
        // The host never sleeps on the guest's bell.
        ready()
    }
}

/// A VM guest's port as its service channels use it (`crate::services`): where the host
/// rings the guest, and the host bells of the guest's open channels, which the port's
/// reader wakes on each of the guest's doorbells (`GuestPort::wake_channels`).
pub struct GuestPort {
    writer: Arc<Mutex<UnixStream>>,
    window: Arc<SharedWindow>,
    /// The host bells of the guest's channels, by registration key.
    channels: Mutex<HashMap<u64, bells::BellWords>>,
    next_key: Mutex<u64>,
}

impl GuestPort {
    pub(super) fn new(writer: Arc<Mutex<UnixStream>>, window: Arc<SharedWindow>) -> Arc<Self> {
        Arc::new(GuestPort {
            writer,
            window,
            channels: Mutex::new(HashMap::new()),
            next_key: Mutex::new(0),
        })
    }

    /// Wakes the host end of each of the guest's channels that announced it sleeps (the
    /// guest rang: one of its channels, or its session ring, has something new).
    pub(super) fn wake_channels(&self) {
        fence(Ordering::SeqCst);
        for w in self.channels.lock_or_recover().values() {
            let asleep = self
                .window
                .atomic_u32(w.sleeping)
                .is_ok_and(|f| f.load(Ordering::SeqCst) != 0);
            if !asleep {
                continue;
            }
            if let Ok(word) = self.window.atomic_u32(w.word) {
                word.fetch_add(1, Ordering::SeqCst);
                let _ = rustix::thread::futex::wake(
                    word,
                    rustix::thread::futex::Flags::empty(),
                    u32::MAX,
                );
            }
        }
    }

    /// Channels whose host bells the port's reader wakes.
    pub fn channels(&self) -> usize {
        self.channels.lock_or_recover().len()
    }

    /// The bells of the host's end of the guest's channel at window offset `base`: it
    /// sleeps on its futex word, registered here so that the guest's doorbell bytes wake it
    /// (until the end drops its bell: [`virtsoc_services::chan::HostEnd::finish`]), and
    /// rings the guest over the port.
    pub fn channel_bells(
        self: &Arc<Self>,
        base: u64,
        spins: u32,
    ) -> virtsoc_services::Result<Bells> {
        let words = bells::host_bell(base);
        // A channel's spin yields, as a process guest's does (`virtsoc_services::chan::Bells`).
        let own = FutexDoorbell::at(&self.window, words.word, words.sleeping, spins)?
            .yielding(virtsoc_proto::spin::YIELD_EVERY);
        let key = {
            let mut k = self.next_key.lock_or_recover();
            *k += 1;
            *k
        };
        self.channels.lock_or_recover().insert(key, words);
        Ok(Bells {
            own: Box::new(Registered {
                bell: own,
                port: self.clone(),
                key,
            }),
            peer: Box::new(self.port_ringer(base)),
        })
    }

    /// The guest's bell of its channel at window offset `base`, as the host rings it.
    pub fn ringer(&self, base: u64) -> Arc<dyn Doorbell> {
        Arc::new(self.port_ringer(base))
    }

    fn port_ringer(&self, base: u64) -> PortRinger {
        PortRinger {
            window: self.window.clone(),
            port: self.writer.clone(),
            sleeping: bells::guest_bell(base).sleeping,
        }
    }
}

/// A channel's host bell registered with its guest's port (dropping it unregisters it).
struct Registered {
    bell: FutexDoorbell,
    port: Arc<GuestPort>,
    key: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.port.channels.lock_or_recover().remove(&self.key);
    }
}

impl Doorbell for Registered {
    fn notify(&self) {
        self.bell.notify();
    }

    fn force_wake(&self) {
        self.bell.force_wake();
    }

    fn wait(&self, ready: &mut dyn FnMut() -> bool, timeout: Option<Duration>) -> bool {
        self.bell.wait(ready, timeout)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::sync::atomic::AtomicBool;

    use virtsoc_proto::WindowLayout;

    use super::*;

    /// The guest's port reader wakes a channel's host end asleep on its futex word (the
    /// guest's kernel cannot), the host end rings the guest over the port only when the
    /// guest sleeps, and a channel whose host end is done is no longer touched.
    #[test]
    fn a_guest_bell_wakes_its_sleeping_channels_and_only_registered_ones() {
        let l = WindowLayout::new(1 << 20, 4, 4).unwrap();
        let w = Arc::new(SharedWindow::create_memfd("vm-bells", l).unwrap());
        let (host, mut guest) = UnixStream::pair().unwrap();
        let port = GuestPort::new(Arc::new(Mutex::new(host)), w.clone());
        let base = 64 << 10;
        let b = port.channel_bells(base, 0).unwrap();
        assert_eq!(port.channels(), 1);
        let go = Arc::new(AtomicBool::new(false));
        let (tx, woke) = std::sync::mpsc::channel();
        let sleeper = std::thread::spawn({
            let go = go.clone();
            move || {
                // No time limit: only a wake-up ends the wait.
                let r = b.own.wait(&mut || go.load(Ordering::SeqCst), None);
                let _ = tx.send(r);
                b
            }
        });
        let flag = w.atomic_u32(bells::host_bell(base).sleeping).unwrap();
        while flag.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        go.store(true, Ordering::SeqCst);
        port.wake_channels();
        // Far longer than a wake-up takes: still asleep then, it slept through it.
        assert_eq!(woke.recv_timeout(Duration::from_secs(30)), Ok(true));
        let b = sleeper.join().unwrap();
        // The host rings the guest's bell only while the guest sleeps.
        b.peer.notify();
        w.atomic_u32(bells::guest_bell(base).sleeping)
            .unwrap()
            .store(1, Ordering::SeqCst);
        b.peer.notify();
        let mut byte = [0u8; 1];
        guest.read_exact(&mut byte).unwrap();
        assert_eq!(byte[0], MSG_BELL);
        guest.set_nonblocking(true).unwrap();
        assert!(guest.read(&mut byte).is_err(), "one byte, not two");
        // Done with: unregistered; the guest's bells touch nothing of it.
        drop(b);
        assert_eq!(port.channels(), 0);
        let word = w.atomic_u32(bells::host_bell(base).word).unwrap();
        let before = word.load(Ordering::SeqCst);
        flag.store(1, Ordering::SeqCst);
        port.wake_channels();
        assert_eq!(word.load(Ordering::SeqCst), before);
    }
}
