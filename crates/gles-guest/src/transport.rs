//! The vendor library's [`Channel`] to the daemon: batches travel in SVM regions as
//! `gles::exec` device commands on a virtsoc connection (`$VIRTSOC_SOCKET`; without it, the
//! VM transport inside a VM guest that has the daemon's virtio-serial port, else
//! `/tmp/virtsoc.sock`: [`default_target`]).
//!
//! - **Double-buffered streams**: two stream regions take turns. A flush writes its batch
//!   into the next one (a posted CPU write), then queues the device's read access, the
//!   `exec` and the access's end without waiting; only when that region comes round again
//!   does the library wait for its batch (long done by then in a steady state). A failure
//!   of a batch nobody waited for surfaces at the next waited batch.
//! - **Waited batches** (calls with results) also give `exec` the reply region (a device
//!   write access around it), wait for the `exec` only, and read the answers out (answers
//!   of at most 32 bytes come in its result words; the accesses' ends are waited for when
//!   the regions are next read or used). Answers larger than the reply region are held by
//!   the daemon: the region grows and `read_reply` fetches them.
//! - **Spinning**: the connection's waits spin [`SPINS`] iterations before they sleep, and
//!   the library asks the daemon's waits for its requests to do the same
//!   (`ctl::HOST_SPINS`).
//! - **Size**: a stream region grows (to [`MAX_REGION`]) to hold a large batch; a batch
//!   larger than that is split at packet boundaries.
//! - **Loss**: a closed connection and a gone render worker (`DeviceError` with a reason
//!   starting "context lost") are [`ChannelError::Lost`] for good.

use std::sync::{Mutex, MutexGuard};

use virtsoc_devapi::gles as api;
use virtsoc_devapi::DeviceCommand;
use virtsoc_gles_stream::Reader;
use virtsoc_guest::conn::{ConnectOptions, Connection, RegionInfo};
use virtsoc_guest::GuestError;
use virtsoc_proto::ops::{self, CoreOp};
use virtsoc_proto::window_layout::{ctl, CONTROL_OFFSET};
use virtsoc_proto::wire::Format;
use virtsoc_proto::{AccessMode, DeviceId, Opcode, Status};

use crate::rt::{Channel, ChannelError};
use virtsoc_devapi::RegionId;
use virtsoc_sync::LockExt;

/// First size of each stream region.
pub const STREAM_REGION: u64 = 1 << 20;
/// First size of the reply region.
pub const REPLY_REGION: u64 = 1 << 20;
/// Largest stream or reply region (the daemon runs batches of at most this many bytes).
pub const MAX_REGION: u64 = 64 << 20;
/// The daemon's socket when `$VIRTSOC_SOCKET` is not set.
pub const DEFAULT_SOCKET: &str = "/tmp/virtsoc.sock";
/// Spin iterations of this connection's doorbell waits before they sleep (the guest
/// library's default is 4096, some 200 us here). Most of what the library waits for is a
/// waited batch, which runs the host's GL for as long as the frame takes (milliseconds):
/// a spin then only takes a core from the host's driver (llvmpipe's threads on a CPU
/// host). The short waits after it (the batch's access ends) are answered within a few
/// microseconds, which this many iterations still catch.
pub const SPINS: u32 = 256;

const CPU: DeviceId = DeviceId::CPU;

/// One stream region and the batch last sent in it.
struct Slot {
    region: RegionInfo,
    /// Requests of the batch last sent in it that nobody waited for yet (its `exec` and
    /// access ends; a waited batch leaves only its ends).
    pending: Vec<u64>,
}

/// The display frames of one window surface: a few RGBA8 image regions taking turns.
struct Frames {
    size: (u32, u32),
    regions: Vec<RegionInfo>,
    /// The display's end_access of each region's last frame.
    pending: Vec<Option<u64>>,
    next: usize,
    /// With a swap interval of 1: the fence the display signals at the vsync after the
    /// previous frame was queued (the next swap waits for it).
    vsync: Option<virtsoc_guest::Fence>,
}

/// Longest a paced swap waits for the display's vsync (a display that stopped ticking does
/// not hang the program).
const VSYNC_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Frames of one surface in flight to the display at most.
const FRAMES: usize = 3;

struct Inner {
    slots: Vec<Slot>,
    next: usize,
    reply: RegionInfo,
    /// The reply region's device write access end of the last waited batch, when nobody
    /// waited for it (its answers came in the result words): waited for before the region
    /// is read or used again.
    reply_pending: Option<u64>,
    /// Display frames by guest surface.
    frames: std::collections::HashMap<u32, Frames>,
    /// `FenceCreate` requests submitted ahead for the presents (see `Transport::fence`).
    fences_ahead: Vec<u64>,
    /// A failure of a batch nobody waited for, for the next waited batch.
    deferred: Option<ChannelError>,
    lost: Option<String>,
}

/// The channel to the daemon's `gles` device.
pub struct Transport {
    conn: Connection,
    inner: Mutex<Inner>,
}

fn gles_id() -> DeviceId {
    api::ID
}

/// The channel error of a failed guest call.
fn channel_error(e: GuestError) -> ChannelError {
    match e {
        GuestError::Status {
            status: Status::DeviceError,
            reason,
            ..
        } => {
            let why = reason.unwrap_or_else(|| "render worker failed".into());
            if why.starts_with("context lost") {
                ChannelError::Lost(why)
            } else {
                ChannelError::Refused(why)
            }
        }
        GuestError::Status {
            status: Status::Closed,
            ..
        }
        | GuestError::Closed
        | GuestError::Connect { .. }
        | GuestError::Refused(_)
        | GuestError::Moved(_) => ChannelError::Lost(format!("daemon connection: {e}")),
        e => ChannelError::Refused(e.to_string()),
    }
}

/// The daemon the library connects to: `$VIRTSOC_SOCKET` (a socket path, `tcp:HOST:PORT`,
/// `vm` or `vm:PORT`, as `Connection::open` takes them); without it, inside a VM guest whose
/// daemon's virtio-serial port ([`virtsoc_guest::vm::DEFAULT_PORT`]) is present, the VM
/// transport (`vm`: the ivshmem BAR and the port); else [`DEFAULT_SOCKET`].
pub fn default_target() -> String {
    if let Ok(t) = std::env::var("VIRTSOC_SOCKET") {
        return t;
    }
    if virtsoc_guest::vm::port_present(virtsoc_guest::vm::DEFAULT_PORT) {
        return "vm".into();
    }
    DEFAULT_SOCKET.into()
}

impl Transport {
    /// The connection (its regions: EGLImages of SVM regions, `crate::egl::image`).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Connects to the daemon at [`default_target`] and allocates the regions.
    pub fn connect() -> Result<Transport, ChannelError> {
        Self::open(&default_target())
    }

    /// Connects to the daemon at `target` (see `Connection::open`) and allocates the
    /// regions.
    pub fn open(target: &str) -> Result<Transport, ChannelError> {
        let opts = ConnectOptions {
            // `$VIRTSOC_NAME` names the guest for the daemon's policy (its class, share and
            // allowed devices) and its tools (`virtsoc top`).
            name: std::env::var("VIRTSOC_NAME")
                .ok()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("gles-{}", std::process::id())),
            spins: SPINS,
            coherence: std::env::var("VIRTSOC_COHERENCE").ok(),
            ..ConnectOptions::default()
        };
        let conn = Connection::open(target, &opts)
            .map_err(|e| ChannelError::Lost(format!("cannot reach virtsocd at {target}: {e}")))?;
        // The daemon's waits for this connection's requests spin as briefly: its batches
        // come a frame's work apart, which no spin catches.
        if let Ok(w) = conn.window().atomic_u32(CONTROL_OFFSET + ctl::HOST_SPINS) {
            w.store(SPINS, std::sync::atomic::Ordering::Relaxed);
        }
        if !conn.devices().iter().any(|d| d.name == "gles") {
            log::warn!("virtsoc gles: the daemon lists no gles device");
        }
        let alloc = |n| conn.alloc_blob(n).map_err(channel_error);
        let slots = vec![
            Slot {
                region: alloc(STREAM_REGION)?,
                pending: Vec::new(),
            },
            Slot {
                region: alloc(STREAM_REGION)?,
                pending: Vec::new(),
            },
        ];
        let reply = alloc(REPLY_REGION)?;
        Ok(Transport {
            conn,
            inner: Mutex::new(Inner {
                slots,
                next: 0,
                reply,
                reply_pending: None,
                frames: std::collections::HashMap::new(),
                fences_ahead: Vec::new(),
                deferred: None,
                lost: None,
            }),
        })
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock_or_recover()
    }

    /// Waits for a completion and turns a failure into a channel error.
    fn finish(&self, seq: u64) -> Result<[u64; 6], ChannelError> {
        let c = self.conn.wait(seq).map_err(channel_error)?;
        match Status::from_u32(c.status) {
            Some(Status::Ok) => Ok(c.values),
            st => Err(channel_error(GuestError::Status {
                op: Opcode::DeviceCmd,
                status: st.unwrap_or(Status::Internal),
                reason: c.reason(),
            })),
        }
    }

    /// Waits for the batch in flight in `slot`, keeping its failure for later.
    fn settle(&self, inner: &mut Inner, i: usize) {
        for seq in std::mem::take(&mut inner.slots[i].pending) {
            if let Err(e) = self.finish(seq) {
                inner.deferred.get_or_insert(e);
            }
        }
    }

    /// Waits for the reply region's last write access to end, keeping its failure for
    /// later.
    fn settle_reply(&self, inner: &mut Inner) {
        if let Some(seq) = inner.reply_pending.take() {
            if let Err(e) = self.finish(seq) {
                inner.deferred.get_or_insert(e);
            }
        }
    }

    /// Grows `region` to hold `n` bytes (a fresh region: the old one is freed).
    fn grow(&self, region: &mut RegionInfo, n: u64) -> Result<(), ChannelError> {
        if region.size >= n {
            return Ok(());
        }
        if n > MAX_REGION {
            return Err(ChannelError::Refused(format!(
                "{n} bytes exceed the largest region ({MAX_REGION})"
            )));
        }
        let fresh = self
            .conn
            .alloc_blob(n.next_power_of_two())
            .map_err(channel_error)?;
        let _ = self.conn.free(region.id);
        *region = fresh;
        Ok(())
    }

    /// Copies `bytes` into the start of the slot's region as a posted write
    /// (`Connection::write_posted`: the bytes into the window, then one request queued
    /// without waiting, which the session runs in ring order before the device's read access
    /// queued after it; the region's first write asks where it lies). Only this library's
    /// CPU writes a stream region, so the daemon takes every posted write to one.
    fn write_region(&self, slot: &mut Slot, bytes: &[u8]) -> Result<(), ChannelError> {
        if bytes.len() as u64 > slot.region.size {
            return Err(ChannelError::Refused("batch larger than its region".into()));
        }
        // The batch that last used the region has ended its accesses (`settle`).
        self.conn
            .write_posted(slot.region.id, 0, bytes)
            .map_err(channel_error)
    }

    /// The first `n` bytes of region `id` (a CPU read access).
    fn read_region(&self, id: RegionId, n: u64) -> Result<Vec<u8>, ChannelError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let a = self
            .conn
            .begin_access(id, CPU, 0, n, AccessMode::Read)
            .map_err(channel_error)?;
        let Some(ptr) = a.ptr else {
            return Err(ChannelError::Refused("no CPU pointer for a region".into()));
        };
        let mut out = vec![0u8; n as usize];
        // SAFETY: begin_access checked that `n` bytes from `ptr` lie in the window; the
        // read access holds them until end_access.
        unsafe { std::ptr::copy_nonoverlapping(ptr.as_ptr(), out.as_mut_ptr(), out.len()) };
        self.conn
            .submit_detached(
                Opcode::EndAccess,
                CPU,
                [u64::from(id), 0, n, AccessMode::Read as u64, 0, 0],
            )
            .map_err(channel_error)?;
        Ok(out)
    }

    /// Sends one batch of at most [`MAX_REGION`] bytes.
    fn send(&self, inner: &mut Inner, batch: &[u8], wait: bool) -> Result<Vec<u8>, ChannelError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let i = inner.next;
        inner.next = (i + 1) % inner.slots.len();
        self.settle(inner, i);
        if let Some(ChannelError::Lost(why)) = &inner.deferred {
            return Err(ChannelError::Lost(why.clone()));
        }
        let len = batch.len() as u64;
        self.grow(&mut inner.slots[i].region, len)?;
        let stream = inner.slots[i].region.id;
        self.write_region(&mut inner.slots[i], batch)?;
        let gles = gles_id();
        let read = [u64::from(stream), 0, len, AccessMode::Read as u64, 0, 0];
        let submit = |op, args, detached: bool| {
            if detached {
                self.conn.submit_detached(op, gles, args)
            } else {
                self.conn.submit(op, gles, args)
            }
            .map_err(channel_error)
        };
        submit(Opcode::BeginAccess, read, true)?;
        if !wait {
            let exec = api::Exec {
                stream,
                len,
                reply: 0,
            };
            let e = submit(Opcode::DeviceCmd, exec.encode(), false)?;
            let end = submit(Opcode::EndAccess, read, false)?;
            inner.slots[i].pending = vec![e, end];
            return Ok(Vec::new());
        }
        self.settle_reply(inner);
        let reply = inner.reply;
        let write = [
            u64::from(reply.id),
            0,
            reply.size,
            AccessMode::Write as u64,
            0,
            0,
        ];
        submit(Opcode::BeginAccess, write, true)?;
        let exec = api::Exec {
            stream,
            len,
            reply: u64::from(reply.id),
        };
        let e = submit(Opcode::DeviceCmd, exec.encode(), false)?;
        let end_w = submit(Opcode::EndAccess, write, false)?;
        let end_r = submit(Opcode::EndAccess, read, false)?;
        // The stream region's end is waited for when the slot comes round again; the reply
        // region's only when its bytes are read (below) or it is used again: the program
        // goes on as soon as its batch ran (the ends follow within microseconds, but waiting
        // for them put another wake-up on every glFinish's path).
        inner.slots[i].pending = vec![end_r];
        inner.reply_pending = Some(end_w);
        let values = self.finish(e)?;
        if let Some(d) = inner.deferred.take() {
            return Err(d);
        }
        // Queued accesses that failed (their commands' own answers above say what that
        // did to the batches) and display frames that were not shown: logged only.
        for (seq, st) in self.conn.take_async_errors() {
            log::info!("virtsoc gles: request {seq} failed: {}", st.message());
        }
        let (reply_len, held) = (values[0], values[1]);
        if held != 2 && reply_len > 0 {
            // The answers are in the reply region (or held for it): its write access ends
            // first.
            self.settle_reply(inner);
            if let Some(d) = inner.deferred.take() {
                return Err(d);
            }
        }
        match held {
            0 => return self.read_region(reply.id, reply_len),
            2 => {
                // Small answers came in the result words.
                let n = (reply_len as usize).min(32);
                let bytes: Vec<u8> = values[2..6].iter().flat_map(|w| w.to_le_bytes()).collect();
                return Ok(bytes[..n].to_vec());
            }
            _ => {}
        }
        // The answers did not fit: a larger reply region, and the held answers into it.
        let mut reply = inner.reply;
        self.grow(&mut reply, reply_len)?;
        inner.reply = reply;
        let write = [
            u64::from(reply.id),
            0,
            reply.size,
            AccessMode::Write as u64,
            0,
            0,
        ];
        submit(Opcode::BeginAccess, write, true)?;
        let rr = api::ReadReply { reply: reply.id };
        let s = submit(Opcode::DeviceCmd, rr.encode(), false)?;
        let end_w = submit(Opcode::EndAccess, write, false)?;
        let n = self.finish(s)?[0];
        self.finish(end_w)?;
        self.read_region(reply.id, n)
    }
}

impl Transport {
    /// Shows surface `surf` (of `size`, just swapped) on the daemon's display: the gles
    /// device reads it back into one of the surface's frame regions, and the display
    /// presents that region once the readback is done (a fence between the two devices).
    /// Nothing waits but, when all frames of the surface are still in flight, the oldest
    /// one's end on the display (the frames go at the display's pace); the fences come from
    /// a pool of requests answered ahead.
    ///
    /// With `interval >= 1` (`eglSwapInterval`, 1 by default) the swaps are paced to the
    /// display's vsync: each queues a display fence signalled at the next vsync and the next
    /// swap waits for the previous one's (one frame in flight behind the scan-out, as a
    /// FIFO swap chain of two); with 0 nothing waits for the vsync.
    pub fn present(&self, surf: u32, size: (u32, u32), interval: i32) -> Result<(), ChannelError> {
        let mut inner = self.inner();
        if let Some(why) = &inner.lost {
            return Err(ChannelError::Lost(why.clone()));
        }
        if inner.frames.get(&surf).is_some_and(|f| f.size != size) {
            if let Some(old) = inner.frames.remove(&surf) {
                self.drop_frames(old);
            }
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = inner.frames.entry(surf) {
            let mut regions = Vec::new();
            for _ in 0..FRAMES {
                let r = self
                    .conn
                    .alloc(0, size.0, size.1, Format::Rgba8, 0)
                    .map_err(channel_error)?;
                regions.push(r);
            }
            slot.insert(Frames {
                size,
                regions,
                pending: vec![None; FRAMES],
                next: 0,
                vsync: None,
            });
        }
        if let Some(f) = inner.frames.get_mut(&surf) {
            if let Some(v) = f.vsync.take() {
                if let Err(e) = self.conn.fence_wait_cpu(v, VSYNC_WAIT) {
                    log::info!("virtsoc gles: waiting for the display's vsync: {e}");
                }
                let _ = self.conn.fence_release(v);
            }
        }
        let Some(f) = inner.frames.get_mut(&surf) else {
            return Ok(());
        };
        let k = f.next;
        f.next = (k + 1) % f.regions.len();
        if let Some(seq) = f.pending[k].take() {
            if let Err(e) = self.finish(seq) {
                log::info!("virtsoc gles: a frame on the display: {e}");
            }
        }
        let frame = f.regions[k];
        let (gles, display) = (gles_id(), virtsoc_devapi::display::ID);
        let word = u64::from(frame.id);
        let write = [word, 0, frame.size, AccessMode::Write as u64, 0, 0];
        let read = [word, 0, frame.size, AccessMode::Read as u64, 0, 0];
        let detached = |dev, op, args| {
            self.conn
                .submit_detached(op, dev, args)
                .map(|_| ())
                .map_err(channel_error)
        };
        let fence = self.fence(&mut inner.fences_ahead)?;
        detached(gles, Opcode::BeginAccess, write)?;
        let rb = api::Readback {
            surface: u64::from(surf),
            frame: frame.id,
        };
        detached(gles, Opcode::DeviceCmd, rb.encode())?;
        detached(gles, Opcode::EndAccess, write)?;
        self.conn.fence_signal(gles, fence).map_err(channel_error)?;
        self.conn
            .fence_wait(display, fence)
            .map_err(channel_error)?;
        self.conn.fence_release(fence).map_err(channel_error)?;
        detached(display, Opcode::BeginAccess, read)?;
        let present = virtsoc_devapi::display::Present {
            frame: frame.id,
            capture_ns: 0,
        };
        detached(display, Opcode::DeviceCmd, present.encode())?;
        let end = self
            .conn
            .submit(Opcode::EndAccess, display, read)
            .map_err(channel_error)?;
        let vsync = if interval >= 1 {
            let v = self.fence(&mut inner.fences_ahead)?;
            let at = virtsoc_devapi::display::SignalAtVsync { fence: v.to_u64() };
            detached(display, Opcode::DeviceCmd, at.encode())?;
            Some(v)
        } else {
            None
        };
        if let Some(f) = inner.frames.get_mut(&surf) {
            f.pending[k] = Some(end);
            f.vsync = vsync;
        }
        for (seq, st) in self.conn.take_async_errors() {
            log::info!(
                "virtsoc gles: request {seq} for the display: {}",
                st.message()
            );
        }
        Ok(())
    }

    /// A fresh fence: the answer of a `FenceCreate` submitted at the previous call (in a
    /// steady state long answered, so a present waits for no round trip to the daemon),
    /// another submitted in its place.
    fn fence(&self, ahead: &mut Vec<u64>) -> Result<virtsoc_guest::Fence, ChannelError> {
        let submit = || {
            self.conn
                .submit(Opcode::FenceCreate, CPU, ops::FenceCreate {}.encode())
                .map_err(channel_error)
        };
        let seq = match ahead.pop() {
            Some(seq) => seq,
            None => submit()?,
        };
        let values = self.finish(seq)?;
        ahead.push(submit()?);
        Ok(virtsoc_guest::Fence::from_u64(
            ops::FenceCreate::reply(&values).fence,
        ))
    }

    /// Frees a surface's frame regions once the display is done with them.
    fn drop_frames(&self, f: Frames) {
        if let Some(v) = f.vsync {
            let _ = self.conn.fence_release(v);
        }
        for seq in f.pending.into_iter().flatten() {
            let _ = self.finish(seq);
        }
        for r in f.regions {
            let _ = self.conn.free(r.id);
        }
    }

    /// Forgets surface `surf`'s display frames (the surface was destroyed).
    pub fn forget_surface(&self, surf: u32) {
        let old = self.inner().frames.remove(&surf);
        if let Some(f) = old {
            self.drop_frames(f);
        }
    }
}

/// `batch` cut at packet boundaries into pieces of at most `max` bytes (a packet larger
/// than `max` is a piece of its own).
fn split(batch: &[u8], max: usize) -> Vec<&[u8]> {
    let mut pieces = Vec::new();
    let (mut start, mut end) = (0, 0);
    let mut r = Reader::new(batch);
    while let Some(Ok((_, p))) = r.next_packet() {
        let next = batch.len() - r.remaining();
        let _ = p;
        if next - start > max && end > start {
            pieces.push(&batch[start..end]);
            start = end;
        }
        end = next;
    }
    if batch.len() > start {
        pieces.push(&batch[start..]);
    }
    pieces
}

impl Channel for Transport {
    fn exec(&self, batch: &[u8], wait: bool) -> Result<Vec<u8>, ChannelError> {
        let mut inner = self.inner();
        if let Some(why) = &inner.lost {
            return Err(ChannelError::Lost(why.clone()));
        }
        let pieces = if batch.len() as u64 > MAX_REGION {
            split(batch, MAX_REGION as usize)
        } else {
            vec![batch]
        };
        let n = pieces.len();
        let mut out = Ok(Vec::new());
        for (k, piece) in pieces.into_iter().enumerate() {
            out = self.send(&mut inner, piece, wait && k + 1 == n);
            if out.is_err() {
                break;
            }
        }
        if let Err(ChannelError::Lost(why)) = &out {
            inner.lost = Some(why.clone());
        }
        out
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.conn.close();
    }
}

#[cfg(test)]
mod tests;
