//! `virtsoc-fence`: virtual command fences (vSoC, SOSP'24, §3.4 and §4).
//!
//! Guest drivers attach *virtual fences* to the commands they queue on
//! virtual devices, so that happens-before relations between commands on
//! different devices are enforced by the host alone, without the guest
//! waiting for the host:
//!
//! * a `Signal(f)` item in a device queue signals `f` once every command
//!   queued before it on that device has completed;
//! * a `Wait(f)` item blocks that device queue (and only that queue) until
//!   `f` is signaled. Several queues may wait on one fence.
//!
//! This crate owns the host side of that mechanism:
//!
//! * [`page`]: the layout of the one 4 KiB page through which the guest
//!   reads fence status without a round trip, the [`FencePageSink`] trait
//!   through which the host mirrors status into it, and guest-side readers;
//! * [`table`]: the authoritative [`VirtualFenceTable`] (allocation,
//!   recycling of signaled slots, host-only overflow fences, signal, wait,
//!   callbacks, teardown);
//! * [`physical`]: per physical device timelines ([`PhysicalFenceTable`])
//!   whose completed sequence numbers signal attached virtual fences;
//! * [`queue`]: [`OrderedQueue`], the per-device FIFO that executes
//!   `Signal`/`Wait` items in order for one device worker thread;
//! * [`flow`]: [`MimdPacer`], the MIMD flow control window the guest
//!   library uses so that asynchronous submission does not pile commands up
//!   in host queues.
//!
//! There is no global state: everything hangs off values the caller owns
//! (typically an `Arc<VirtualFenceTable>` per guest).

pub mod error;
pub mod flow;
pub mod page;
pub mod physical;
pub mod queue;
pub mod table;

pub use error::{FenceError, Result};
pub use flow::MimdPacer;
pub use page::{FencePageSink, MemPage, PAGE_SIZE, PAGE_SLOTS};
pub use physical::PhysicalFenceTable;
pub use queue::{DoneToken, OrderedQueue, QueueItem, TryPop};
pub use table::{
    is_page_backed, FenceId, FenceStats, FenceStatus, FenceTableImage, SlotImage, VirtualFenceTable,
};
