//! Picture buffers a worker shares with its parent, so a picture crosses the process
//! boundary without being copied through the socket.
//!
//! Every buffer is a [`Buffer`]: a memfd sealed against shrinking and growing, so the side
//! that did not make it can map it without fearing that the other truncates it under the
//! mapping (a read past a file's end faults). The ISP's parent makes its own buffers (a
//! source it fills, a destination the worker writes) and hands them over; a decoder worker
//! makes its buffers and introduces them to its parent, as follows.
//!
//! The decoder worker owns the buffers ([`Slots`]): each is a memfd of one picture's size, sealed
//! against shrinking and growing, mapped read-write in the worker. libavcodec decodes into a
//! free buffer (or the worker copies or converts a picture into one) and the worker names the
//! buffer in its answer; a buffer's
//! descriptor travels once, with the first answer that uses it. The parent ([`Mapped`])
//! maps each buffer read-only, after checking that it is a sealed memfd at least as large as
//! the picture it carries (a worker that shrank a buffer could otherwise make the parent
//! fault on reading it). A picture holds its buffer ([`SharedPicture`]) until the parent is
//! done with it (a picture lent as a region's replica holds it as long as the region does);
//! the parent then counts the picture done on its [`ReleasePage`] (a page it made and the
//! worker maps read-only, a counter per buffer) and the worker may write into the buffer
//! again: it sees the count the next time it looks for a free buffer, not with the parent's
//! next call, which waits behind the packets already queued to it (with 4 in flight its
//! decoder wrote 5 buffers in turn instead of 3, and libavcodec took about 7% more CPU per
//! 1080p picture: `docs/results.md`, stop 48). Without a page (a parent that sent none) the
//! numbers of the buffers it is done with go with its next call. What the parent reads is
//! only pixels: a worker that writes into a buffer the parent is reading garbles that
//! picture, nothing else; the worker reads nothing of the parent's but the page's counts.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

pub(crate) use super::release::{ReleasePage, CELLS};
use super::wire::bad;
use crate::error::{MediaError, Result};
use crate::frame::{FrameLayout, FrameMut, FrameRef};
use virtsoc_sync::LockExt;

/// Most picture buffers one worker may share (its decoder's queue, frame threads and
/// reordering need far fewer).
pub(crate) const MAX_SLOTS: usize = 48;

/// A memory mapping of a whole file, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
    /// The mapped file's inode (to find the mapping in `/proc/self/maps`).
    inode: u64,
}

// SAFETY: the mapping is plain shared memory; who writes it is governed by its owners.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only gives out shared reads of the parent's read-only map.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(fd: BorrowedFd<'_>, len: usize, writable: bool) -> std::io::Result<Mapping> {
        let prot = match writable {
            true => ProtFlags::READ | ProtFlags::WRITE,
            false => ProtFlags::READ,
        };
        // SAFETY: a fresh mapping of `len` bytes of `fd` at an address the kernel chooses;
        // nothing else refers to that range.
        let ptr =
            unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0)? };
        let inode = rustix::fs::fstat(fd).map_or(0, |st| st.st_ino);
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
            inode,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the range this value mapped, referenced by nothing after it is dropped.
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
    }
}

/// A sealed memfd and this process's mapping of all of it.
pub(crate) struct Buffer {
    fd: OwnedFd,
    map: Mapping,
}

impl Buffer {
    /// A new buffer of `size` bytes (zeroed), sealed against shrinking, growing and further
    /// seals, mapped read-write.
    pub(crate) fn new(size: usize) -> Result<Buffer> {
        let io = |e: rustix::io::Errno| MediaError::Resources(format!("shared buffer: {e}"));
        let fd = rustix::fs::memfd_create(
            "virtsoc-picture",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(io)?;
        rustix::fs::ftruncate(&fd, size as u64).map_err(io)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(io)?;
        let map = Mapping::new(fd.as_fd(), size, true)
            .map_err(|e| MediaError::Resources(format!("mapping a shared buffer: {e}")))?;
        Ok(Buffer { fd, map })
    }

    /// Makes `buf` a buffer for `n` bytes: a new one when it is none, smaller, or over four
    /// times larger. True when it is new (its descriptor must go to the other side).
    pub(crate) fn fit(buf: &mut Option<Buffer>, n: usize) -> Result<bool> {
        match buf {
            Some(b) if b.len() >= n && b.len() / 4 <= n => Ok(false),
            _ => {
                *buf = Some(Buffer::new(n.max(1))?);
                Ok(true)
            }
        }
    }

    /// Maps a buffer the other side made, after checking that it is sealed against
    /// shrinking and holds 1..=`max` bytes.
    pub(crate) fn open(fd: OwnedFd, max: usize, writable: bool) -> Result<Buffer> {
        let map = map_sealed(fd.as_fd(), max, writable)?;
        Ok(Buffer { fd, map })
    }

    /// Its descriptor, to send.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Its size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.map.len
    }

    /// The first byte of its mapping (valid for `len` bytes as long as `self`).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.map.ptr
    }

    /// Its bytes. The other side may write them at any time: what is read is pixels only.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping covers `len` bytes of a sealed memfd (it cannot shrink under
        // it) for as long as `self` lives; a write by the other side changes values only.
        unsafe { std::slice::from_raw_parts(self.map.ptr, self.map.len) }
    }

    /// Its bytes, to write (the buffer must have been mapped writable).
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only reference this process has
        // to the mapping, which was made writable (`new`, or `open` with `writable`).
        unsafe { std::slice::from_raw_parts_mut(self.map.ptr, self.map.len) }
    }
}

/// Maps `fd` whole, after checking that it is sealed against shrinking and holds 1..=`max`
/// bytes.
fn map_sealed(fd: BorrowedFd<'_>, max: usize, writable: bool) -> Result<Mapping> {
    let seals = rustix::fs::fcntl_get_seals(fd).map_err(|_| bad("not a memfd"))?;
    if !seals.contains(SealFlags::SHRINK) {
        return Err(bad("an unsealed picture buffer"));
    }
    let len = rustix::fs::fstat(fd)
        .map_err(|_| bad("buffer size"))?
        .st_size;
    let len = usize::try_from(len)
        .ok()
        .filter(|l| *l > 0 && *l <= max)
        .ok_or_else(|| bad("buffer size"))?;
    Mapping::new(fd, len, writable)
        .map_err(|e| MediaError::Resources(format!("mapping a shared buffer: {e}")))
}

/// A decoded picture in a buffer shared with the worker: readable until dropped, after
/// which the worker may reuse the buffer.
#[derive(Clone)]
pub struct SharedPicture {
    map: Arc<Mapping>,
    /// Held for its drop, which hands the buffer back.
    _lease: Arc<Lease>,
}

/// The parent's hold on a buffer: counts the picture done on the release page (else hands
/// the buffer's number back for the next call) when the last picture using it is dropped.
struct Lease {
    id: u32,
    cell: u32,
    page: Option<Arc<ReleasePage>>,
    released: Arc<Mutex<Vec<u32>>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        match &self.page {
            Some(page) => page.release(self.cell),
            None => self.released.lock_or_recover().push(self.id),
        }
    }
}

impl SharedPicture {
    /// The picture's pixels as `layout` (which must fit the buffer).
    pub(crate) fn frame(&self, layout: FrameLayout) -> Result<FrameRef<'_>> {
        // SAFETY: the buffer is a sealed memfd at least `map.len` bytes long (checked when
        // it was mapped), mapped for as long as `self` lives; the worker may write it
        // concurrently, which changes pixel values but never the mapping.
        let bytes = unsafe { std::slice::from_raw_parts(self.map.ptr, self.map.len) };
        let bytes = bytes
            .get(..layout.size())
            .ok_or_else(|| bad("picture larger than its buffer"))?;
        Ok(FrameRef::new(layout, bytes)?)
    }

    /// The whole buffer's bytes (the worker may write them concurrently: pixels only).
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: as in `frame`.
        unsafe { std::slice::from_raw_parts(self.map.ptr, self.map.len) }
    }

    /// Whether both are the same buffer.
    pub(crate) fn same_buffer(&self, other: &SharedPicture) -> bool {
        Arc::ptr_eq(&self.map, &other.map)
    }
}

/// The parent's side: the worker's buffers it has mapped, and the numbers of those it is
/// done with.
pub(crate) struct Mapped {
    /// Each buffer's mapping and release cell, by number.
    slots: HashMap<u32, (Arc<Mapping>, u32)>,
    /// Where pictures are counted done (none: their numbers go with the next call).
    page: Option<Arc<ReleasePage>>,
    released: Arc<Mutex<Vec<u32>>>,
    /// Largest buffer accepted.
    max_len: usize,
}

impl Mapped {
    /// No buffers yet; the worker's may hold at most `max_len` bytes each.
    pub(crate) fn new(max_len: usize) -> Mapped {
        Mapped {
            slots: HashMap::new(),
            page: None,
            released: Arc::default(),
            max_len,
        }
    }

    /// [`new`](Self::new), counting pictures done on `page` (which the worker maps).
    pub(crate) fn with_page(max_len: usize, page: Arc<ReleasePage>) -> Mapped {
        Mapped {
            page: Some(page),
            ..Mapped::new(max_len)
        }
    }

    /// Maps a buffer the worker introduced as `id` with release cell `cell`, after checking
    /// it. (A worker naming one cell for two buffers only confuses its own reuse of them.)
    pub(crate) fn add(&mut self, id: u32, fd: OwnedFd, cell: u32) -> Result<()> {
        if self.slots.len() >= MAX_SLOTS || self.slots.contains_key(&id) || cell >= CELLS {
            return Err(bad("picture buffer"));
        }
        let map = map_sealed(fd.as_fd(), self.max_len, false)?;
        self.slots.insert(id, (Arc::new(map), cell));
        Ok(())
    }

    /// Forgets a buffer the worker dropped (pictures still using it keep it mapped).
    pub(crate) fn remove(&mut self, id: u32) {
        self.slots.remove(&id);
    }

    /// Forgets every buffer (the worker is gone): each stays mapped only while a picture in
    /// it is held, and is unmapped with the last one.
    pub(crate) fn clear(&mut self) {
        self.slots.clear();
    }

    /// The inodes of the buffers this side has mapped, for tests.
    pub(crate) fn inodes(&self) -> Vec<u64> {
        self.slots.values().map(|(m, _)| m.inode).collect()
    }

    /// A picture in buffer `id`.
    pub(crate) fn picture(&self, id: u32) -> Result<SharedPicture> {
        let (map, cell) = self
            .slots
            .get(&id)
            .ok_or_else(|| bad("unknown picture buffer"))?;
        Ok(SharedPicture {
            map: map.clone(),
            _lease: Arc::new(Lease {
                id,
                cell: *cell,
                page: self.page.clone(),
                released: self.released.clone(),
            }),
        })
    }

    /// The buffers the parent is done with since the last call (none with a page).
    pub(crate) fn take_released(&self) -> Vec<u32> {
        std::mem::take(&mut *self.released.lock_or_recover())
    }
}

/// One buffer on the worker's side.
struct Slot {
    id: u32,
    buf: Buffer,
    /// libavcodec holds it (a picture being decoded into it, or a reference picture).
    codec: bool,
    /// Pictures in it handed to the parent (one per answer that named it), less those
    /// handed back by number (wrapping).
    held: u32,
    /// Its cell on the release page, and the cell's count when the buffer was made.
    cell: u32,
    base: u32,
    /// Its descriptor has been sent to the parent.
    sent: bool,
}

impl Slot {
    /// Pictures in it the parent has not counted done or handed back yet.
    fn outstanding(&self, page: Option<&ReleasePage>) -> u32 {
        let counted = page.map_or(0, |p| p.count(self.cell).wrapping_sub(self.base));
        self.held.wrapping_sub(counted)
    }

    /// Nobody reads or writes it: the worker may write a new picture into it.
    fn free(&self, page: Option<&ReleasePage>) -> bool {
        !self.codec && self.outstanding(page) == 0
    }
}

/// The worker's buffers as its decoder's frame threads share them (libavcodec takes and
/// gives back buffers on its own threads).
pub(crate) type SharedSlots = Arc<Mutex<Slots>>;

/// Locks the worker's buffers (a panic elsewhere leaves them consistent: every change is
/// one field).
pub(crate) fn lock(slots: &SharedSlots) -> std::sync::MutexGuard<'_, Slots> {
    slots.lock_or_recover()
}

/// The worker's side: its buffers and which of them the parent holds.
#[derive(Default)]
pub(crate) struct Slots {
    slots: Vec<Slot>,
    next_id: u32,
    /// Buffers dropped since the last answer (the parent forgets them).
    dropped: Vec<u32>,
    /// Where the parent counts pictures done, once it sent one.
    page: Option<Arc<ReleasePage>>,
}

/// Where the worker put a picture.
pub(crate) enum Placed {
    /// In buffer `id`.
    Slot(u32),
    /// Where libavcodec decoded it, in buffer `id`: each 4:2:0 plane's offset and stride
    /// (no copy at all in the worker).
    Planes { id: u32, planes: [(u32, u32); 3] },
    /// Nowhere shared (every buffer is held): the picture goes inline in the answer.
    Inline,
}

impl Slots {
    /// From now on the parent counts the pictures it is done with on `page`.
    pub(crate) fn use_page(&mut self, page: Arc<ReleasePage>) {
        for s in &mut self.slots {
            s.base = page.count(s.cell);
        }
        self.page = Some(page);
    }

    /// The parent is done with one picture in each of these buffers (a number twice: two
    /// pictures; unknown numbers, and more than a buffer was handed, are ignored).
    pub(crate) fn release(&mut self, ids: &[u32]) {
        let page = self.page.clone();
        for id in ids {
            if let Some(s) = self.slots.iter_mut().find(|s| s.id == *id) {
                if s.outstanding(page.as_deref()) != 0 {
                    s.held = s.held.wrapping_sub(1);
                }
            }
        }
    }

    /// A free buffer of exactly `size` bytes: one there is, else a new one (free buffers of
    /// other sizes are dropped first); `None` when [`MAX_SLOTS`] are in use.
    fn free_slot(&mut self, size: usize) -> Result<Option<usize>> {
        let page = self.page.clone();
        let page = page.as_deref();
        if let Some(i) = self
            .slots
            .iter()
            .position(|s| s.free(page) && s.buf.len() == size)
        {
            return Ok(Some(i));
        }
        let stale: Vec<u32> = self
            .slots
            .iter()
            .filter(|s| s.free(page) && s.buf.len() != size)
            .map(|s| s.id)
            .collect();
        self.slots.retain(|s| !stale.contains(&s.id));
        self.dropped.extend(stale);
        if self.slots.len() >= MAX_SLOTS {
            return Ok(None);
        }
        // A cell no live buffer has (there are more cells than buffers).
        let cell = (0..CELLS)
            .find(|c| self.slots.iter().all(|s| s.cell != *c))
            .ok_or_else(|| bad("no release cell"))?;
        self.slots.push(Slot {
            id: self.next_id,
            buf: Buffer::new(size)?,
            codec: false,
            held: 0,
            cell,
            base: page.map_or(0, |p| p.count(cell)),
            sent: false,
        });
        self.next_id += 1;
        Ok(Some(self.slots.len() - 1))
    }

    /// A free buffer of `size` bytes for libavcodec to decode into (its `get_buffer2`): its
    /// number and mapping, held by libavcodec until [`codec_done`](Self::codec_done).
    /// `None` when every buffer is in use.
    pub(crate) fn acquire(&mut self, size: usize) -> Result<Option<(u32, *mut u8)>> {
        let Some(i) = self.free_slot(size)? else {
            return Ok(None);
        };
        let s = &mut self.slots[i];
        s.codec = true;
        Ok(Some((s.id, s.buf.map.ptr)))
    }

    /// libavcodec dropped its last reference to buffer `id`.
    pub(crate) fn codec_done(&mut self, id: u32) {
        if let Some(s) = self.slots.iter_mut().find(|s| s.id == id) {
            s.codec = false;
        }
    }

    /// The buffer that holds address `at` (a decoded picture's first plane), now held by the
    /// parent for one more picture: its number, first address and size.
    pub(crate) fn hold_at(&mut self, at: *const u8) -> Option<(u32, *const u8, usize)> {
        let s = self.slots.iter_mut().find(|s| {
            let base = s.buf.map.ptr as usize;
            (base..base + s.buf.len()).contains(&(at as usize))
        })?;
        s.held = s.held.wrapping_add(1);
        Some((s.id, s.buf.map.ptr.cast_const(), s.buf.len()))
    }

    /// Writes a picture of `layout` with `fill` into a free buffer of its size (made when
    /// there is none, dropping free buffers of other sizes first).
    pub(crate) fn place(
        &mut self,
        layout: FrameLayout,
        fill: impl FnOnce(FrameMut<'_>) -> Result<()>,
    ) -> Result<Placed> {
        let Some(i) = self.free_slot(layout.size())? else {
            return Ok(Placed::Inline);
        };
        let s = &mut self.slots[i];
        // The parent does not read a buffer while it is free.
        fill(FrameMut::new(layout, s.buf.bytes_mut())?)?;
        s.held = s.held.wrapping_add(1);
        Ok(Placed::Slot(s.id))
    }

    /// Buffers dropped since the last call, and those not yet sent with their release
    /// cells and the descriptors to send now (marked sent).
    pub(crate) fn take_news(&mut self) -> (Vec<u32>, Vec<(u32, u32, BorrowedFd<'_>)>) {
        let dropped = std::mem::take(&mut self.dropped);
        let new = self
            .slots
            .iter_mut()
            .filter(|s| !s.sent)
            .map(|s| {
                s.sent = true;
                (s.id, s.cell, s.buf.fd())
            })
            .collect();
        (dropped, new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::PixelFormat;

    fn dup(fd: BorrowedFd<'_>) -> OwnedFd {
        fd.try_clone_to_owned().unwrap()
    }

    #[test]
    fn a_picture_crosses_and_its_buffer_comes_back() {
        let layout = FrameLayout::packed(PixelFormat::Nv12, 16, 8).unwrap();
        let mut worker = Slots::default();
        let Placed::Slot(id) = worker
            .place(layout, |f| {
                f.data.fill(9);
                Ok(())
            })
            .unwrap()
        else {
            panic!("placed inline")
        };
        let (dropped, new) = worker.take_news();
        assert!(dropped.is_empty());
        assert_eq!(new.len(), 1);
        let mut parent = Mapped::new(1 << 20);
        parent.add(new[0].0, dup(new[0].2), new[0].1).unwrap();
        let p = parent.picture(id).unwrap();
        assert!(p.frame(layout).unwrap().data.iter().all(|b| *b == 9));
        // Held by the parent: the worker makes a second buffer for the next picture.
        let Placed::Slot(id2) = worker.place(layout, |_| Ok(())).unwrap() else {
            panic!("placed inline")
        };
        assert_ne!(id, id2);
        assert!(parent.take_released().is_empty());
        drop(p);
        let released = parent.take_released();
        assert_eq!(released, vec![id]);
        worker.release(&released);
        let Placed::Slot(id3) = worker.place(layout, |_| Ok(())).unwrap() else {
            panic!("placed inline")
        };
        assert_eq!(id3, id, "the released buffer is reused");
    }

    /// With a release page the worker may write a buffer again the moment the parent drops
    /// its last picture in it: nothing is sent back. Each live buffer has its own cell.
    #[test]
    fn a_buffer_comes_back_through_the_page_as_the_parent_drops_its_picture() {
        let layout = FrameLayout::packed(PixelFormat::Nv12, 16, 8).unwrap();
        let page = Arc::new(ReleasePage::new().unwrap());
        let mut parent = Mapped::with_page(1 << 20, page.clone());
        let mut worker = Slots::default();
        worker.use_page(Arc::new(ReleasePage::open(dup(page.fd())).unwrap()));
        let place = |w: &mut Slots| match w.place(layout, |_| Ok(())).unwrap() {
            Placed::Slot(id) => id,
            _ => panic!("placed inline"),
        };
        // Decoded into x and named twice (a picture shown again); then b, copied.
        let (x, px) = worker.acquire(layout.size()).unwrap().unwrap();
        worker.hold_at(px).unwrap();
        worker.hold_at(px).unwrap();
        worker.codec_done(x);
        let b = place(&mut worker);
        assert_ne!(x, b, "a held buffer was written again");
        let (_, new) = worker.take_news();
        assert_ne!(new[0].1, new[1].1, "two live buffers share a cell");
        for (id, cell, fd) in &new {
            parent.add(*id, dup(*fd), *cell).unwrap();
        }
        let (p1, p2) = (parent.picture(x).unwrap(), parent.picture(x).unwrap());
        drop(p1);
        let c = place(&mut worker);
        assert!(c != x && c != b, "reused with a picture still held");
        drop(p2);
        assert!(parent.take_released().is_empty(), "sent back by number");
        assert_eq!(
            place(&mut worker),
            x,
            "not reused once its pictures were dropped"
        );
        // A number handed back (a parent without a page) frees a buffer too; a second one
        // for the same picture is ignored, not kept for the buffer's next picture.
        worker.release(&[b, b]);
        assert_eq!(place(&mut worker), b);
        assert_ne!(
            place(&mut worker),
            b,
            "a surplus number freed a held buffer"
        );
    }

    #[test]
    fn the_parent_refuses_unsealed_short_and_repeated_buffers() {
        let mut parent = Mapped::new(1 << 20);
        let plain = rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&plain, 4096).unwrap();
        assert!(parent.add(1, plain, 0).is_err(), "unsealed");
        let mut worker = Slots::default();
        let layout = FrameLayout::packed(PixelFormat::Nv12, 16, 8).unwrap();
        worker.place(layout, |_| Ok(())).unwrap();
        let (_, new) = worker.take_news();
        let (id, cell, fd) = new[0];
        assert!(parent.add(id, dup(fd), CELLS).is_err(), "no such cell");
        parent.add(id, dup(fd), cell).unwrap();
        assert!(
            parent.add(id, dup(fd), cell).is_err(),
            "the same number twice"
        );
        let big = FrameLayout::packed(PixelFormat::Nv12, 32, 8).unwrap();
        assert!(
            parent.picture(id).unwrap().frame(big).is_err(),
            "larger than its buffer"
        );
        assert!(parent.picture(id + 1).is_err(), "unknown");
    }

    /// A buffer libavcodec decoded into is written again only once libavcodec dropped it
    /// and the parent handed back every picture it was named for.
    #[test]
    fn a_buffer_is_never_reused_before_the_parent_released_it() {
        let mut w = Slots::default();
        let (a, pa) = w.acquire(4096).unwrap().unwrap();
        // libavcodec still decodes into it: another picture gets another buffer.
        let (b, _) = w.acquire(4096).unwrap().unwrap();
        assert_ne!(a, b);
        // Output twice (a picture shown again), then dropped by libavcodec.
        assert_eq!(w.hold_at(pa.wrapping_add(100)).map(|h| h.0), Some(a));
        assert_eq!(w.hold_at(pa).map(|h| h.0), Some(a));
        w.codec_done(a);
        w.codec_done(b);
        // b is free again; a is still the parent's.
        assert_eq!(w.acquire(4096).unwrap().unwrap().0, b);
        let (c, _) = w.acquire(4096).unwrap().unwrap();
        assert!(c != a && c != b, "a held buffer was handed to the decoder");
        w.codec_done(b);
        w.codec_done(c);
        w.release(&[a]);
        // One of its two pictures is still held.
        for _ in 0..3 {
            let (id, _) = w.acquire(4096).unwrap().unwrap();
            assert_ne!(id, a, "reused with a picture still held");
        }
        let mut w2 = Slots::default();
        let (x, _) = w2.acquire(64).unwrap().unwrap();
        w2.codec_done(x);
        assert_eq!(
            w2.acquire(64).unwrap().unwrap().0,
            x,
            "a free buffer is reused"
        );
        // Nor by the copying path.
        let layout = FrameLayout::packed(PixelFormat::Nv12, 16, 8).unwrap();
        let mut w3 = Slots::default();
        let (y, py) = w3.acquire(layout.size()).unwrap().unwrap();
        w3.hold_at(py);
        w3.codec_done(y);
        let Placed::Slot(z) = w3.place(layout, |_| Ok(())).unwrap() else {
            panic!("placed inline")
        };
        assert_ne!(y, z, "the copying path wrote into a held buffer");
        w3.release(&[y]);
        let Placed::Slot(z2) = w3.place(layout, |_| Ok(())).unwrap() else {
            panic!("placed inline")
        };
        assert_eq!(z2, y);
    }

    #[test]
    fn when_every_buffer_is_held_pictures_go_inline() {
        let layout = FrameLayout::packed(PixelFormat::Nv12, 16, 8).unwrap();
        let mut worker = Slots::default();
        for _ in 0..MAX_SLOTS {
            assert!(matches!(
                worker.place(layout, |_| Ok(())).unwrap(),
                Placed::Slot(_)
            ));
        }
        assert!(matches!(
            worker.place(layout, |_| Ok(())).unwrap(),
            Placed::Inline
        ));
    }
}
