//! A channel's two doorbells, behind [`virtsoc_proto::ring::Doorbell`]: each end sleeps on
//! its own bell and rings the peer's. A process guest shares the host's kernel, so both
//! bells are futex words in the control block ([`Bells::host_futex`],
//! [`Bells::guest_futex`]). A VM guest's kernel cannot wake a futex of the host's (nor the
//! host one of the VM's): its channels ring over the VM's virtio-serial port instead (the
//! bells are made by the daemon's VM endpoint and the guest library's VM transport), with
//! the same words in the control block telling each side whether the other sleeps.

use std::sync::Arc;

use virtsoc_proto::ring::{Doorbell, FutexDoorbell};
use virtsoc_proto::spin::YIELD_EVERY;
use virtsoc_proto::SharedWindow;

use super::ctl;
use crate::Result;

/// The words of one doorbell, as window offsets: the word a futex sleeper waits on and the
/// flag that says it sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BellWords {
    /// The bell's word.
    pub word: u64,
    /// Non-zero while its owner sleeps (or is about to).
    pub sleeping: u64,
}

/// The host's bell (the guest rings it) of the channel whose control block is at `base`.
pub fn host_bell(base: u64) -> BellWords {
    BellWords {
        word: base + ctl::HOST_BELL,
        sleeping: base + ctl::HOST_SLEEPING,
    }
}

/// The guest's bell (the host rings it) of the channel whose control block is at `base`.
pub fn guest_bell(base: u64) -> BellWords {
    BellWords {
        word: base + ctl::GUEST_BELL,
        sleeping: base + ctl::GUEST_SLEEPING,
    }
}

/// One end's doorbells.
pub struct Bells {
    /// The bell this end sleeps on: its `wait` spins, announces the sleep in the bell's
    /// flag and sleeps until the peer rings or the time runs out.
    pub own: Box<dyn Doorbell>,
    /// The peer's bell: `notify` after publishing (rings only when the peer announced
    /// that it sleeps), `force_wake` to wake it whatever it does (a close).
    pub peer: Box<dyn Doorbell>,
}

impl Bells {
    fn futex(win: &Arc<SharedWindow>, own: BellWords, peer: BellWords, spins: u32) -> Result<Self> {
        Ok(Bells {
            // A guest's channels are pairs of threads waiting on each other on the same
            // cores: the spin yields (see `YIELD_EVERY`).
            own: Box::new(
                FutexDoorbell::at(win, own.word, own.sleeping, spins)?.yielding(YIELD_EVERY),
            ),
            peer: Box::new(FutexDoorbell::at(win, peer.word, peer.sleeping, 0)?),
        })
    }

    /// The host end's futex bells of the channel at `base` (a process guest).
    pub fn host_futex(win: &Arc<SharedWindow>, base: u64, spins: u32) -> Result<Self> {
        Self::futex(win, host_bell(base), guest_bell(base), spins)
    }

    /// The guest end's futex bells of the channel at `base` (a process guest).
    pub fn guest_futex(win: &Arc<SharedWindow>, base: u64, spins: u32) -> Result<Self> {
        Self::futex(win, guest_bell(base), host_bell(base), spins)
    }
}
