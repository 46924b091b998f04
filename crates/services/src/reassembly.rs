//! Reassembling large transfers from their packets (virtio-vapp's Algorithm 2).
//!
//! Each open transfer has a buffer of its total size (reserved from the channel's memory
//! budget when its first packet arrives) and a completion bitmap of one bit per packet.
//! Packets land at the offset their index names, in any order; a packet seen twice, one whose
//! header disagrees with the transfer's, or one whose length would overlap a neighbour is
//! refused without touching the buffer. The sender ends a transfer with a commit naming how
//! many packets it sent and the CRC-32 of the whole payload: the bitmap must be full and the
//! counts and checksum must add up, or the transfer is dropped with the packets missing
//! named. The sender may revoke a transfer at any time; a transfer that sees no packet for
//! the timeout is dropped by [`Reassembler::expire`]. Pure logic: every call takes the time.
//!
//! **The checksum is the sender's choice** (`crc` of [`Reassembler::commit`]): the bitmap and
//! the header checks already catch a lost, duplicated, overlapping or forged packet, so what a
//! CRC adds is only a check on the sender's own memory (a guest that rewrote a slot while the
//! host read it spoils nothing but its own transfer). It costs a pass over the payload on
//! each side (crc32fast, about 10 GB/s here, beside a copy's 4-5 GB/s); the guest library
//! sends none unless asked ([`crate::chan::flags`]).
//!
//! **Buffers are reused.** A committed transfer's buffer comes back
//! ([`Reassembler::recycle`]) and the next transfer's opens in it: a fresh buffer of many
//! megabytes costs a page fault every 4 KiB on its first write, which made the copy into it
//! 1.5-2x slower than the copy itself. Only one spare of at most [`MAX_SPARE`] bytes is kept
//! per channel (it goes with the channel). The spare's old bytes are never seen: a transfer
//! commits only when every packet of it landed, i.e. every byte was written again.

use std::collections::HashMap;

use crate::packet::{PacketHeader, PACKET_SIZE};
use crate::{Result, ServiceError};

/// Transfers open at once per channel at most.
pub const MAX_OPEN: usize = 64;
/// Largest committed buffer kept for the next transfer.
pub const MAX_SPARE: usize = 64 << 20;

/// One transfer being reassembled.
#[derive(Debug)]
struct Transfer {
    call: u32,
    total: u64,
    count: u32,
    bitmap: Vec<u64>,
    received: u32,
    data: Vec<u8>,
    /// Its packets go on where they lie; `data` is empty.
    streamed: bool,
    last_ns: u64,
}

impl Transfer {
    /// Bytes it holds.
    fn held(&self) -> u64 {
        self.data.len() as u64
    }

    fn mark(&mut self, index: u32, now_ns: u64) {
        self.bitmap[(index / 64) as usize] |= 1 << (index % 64);
        self.received += 1;
        self.last_ns = now_ns;
    }

    fn has(&self, index: u32) -> bool {
        self.bitmap[(index / 64) as usize] & (1 << (index % 64)) != 0
    }

    fn missing(&self, at_most: usize) -> Vec<u32> {
        (0..self.count)
            .filter(|&i| !self.has(i))
            .take(at_most)
            .collect()
    }
}

/// A transfer that is complete and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// The transfer id.
    pub transfer: u32,
    /// The call its payload is the input of.
    pub call: u32,
    /// The payload (empty for a streamed transfer, [`Reassembler::mark`]).
    pub data: Vec<u8>,
}

/// The open transfers of one channel, within a memory budget.
#[derive(Debug)]
pub struct Reassembler {
    open: HashMap<u32, Transfer>,
    budget: u64,
    used: u64,
    timeout_ns: u64,
    /// A committed transfer's buffer, for the next transfer (all its `len` bytes
    /// initialised; none of them ever read before a packet overwrote them).
    spare: Vec<u8>,
}

impl Reassembler {
    /// Transfers holding at most `budget` bytes at once, each dropped after `timeout_ns`
    /// without a packet.
    pub fn new(budget: u64, timeout_ns: u64) -> Self {
        Reassembler {
            open: HashMap::new(),
            budget,
            used: 0,
            timeout_ns,
            spare: Vec::new(),
        }
    }

    /// Gives back a committed transfer's buffer ([`Completed::data`]) for the next transfer
    /// to open in (kept when it is at most [`MAX_SPARE`] bytes and larger than the spare).
    pub fn recycle(&mut self, data: Vec<u8>) {
        if data.len() <= MAX_SPARE && data.len() > self.spare.len() {
            self.spare = data;
        }
    }

    /// A buffer of `n` bytes: the spare when it is large enough (its bytes as they are:
    /// every one is overwritten before the transfer can commit), else a fresh one.
    fn buffer(&mut self, n: usize) -> Vec<u8> {
        if self.spare.len() >= n {
            let mut b = std::mem::take(&mut self.spare);
            b.truncate(n);
            b
        } else {
            vec![0; n]
        }
    }

    /// Bytes the open transfers hold.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Whether transfer `transfer` is open.
    pub fn is_open(&self, transfer: u32) -> bool {
        self.open.contains_key(&transfer)
    }

    /// Open transfers.
    pub fn open(&self) -> usize {
        self.open.len()
    }

    /// Places one packet (`bytes` its payload, exactly `h.len` long). The transfer opens at
    /// its first packet, whichever index that is.
    pub fn packet(&mut self, h: &PacketHeader, bytes: &[u8], now_ns: u64) -> Result<()> {
        if bytes.len() != h.len as usize {
            return Err(ServiceError::BadPacket(format!(
                "packet {} claims {} bytes, carries {}",
                h.index,
                h.len,
                bytes.len()
            )));
        }
        let t = self.place(h, now_ns, false)?;
        let at = h.offset() as usize;
        let dst = t
            .data
            .get_mut(at..at + bytes.len())
            .ok_or(ServiceError::Overlap {
                transfer: h.transfer,
                index: h.index,
                len: h.len,
            })?;
        dst.copy_from_slice(bytes);
        t.mark(h.index, now_ns);
        Ok(())
    }

    /// Records one packet of a *streamed* transfer, whose bytes the caller hands on where
    /// they lie (a service's [`crate::hypervisor::InputSink`]) instead of keeping them: the
    /// same checks as [`packet`](Self::packet) (header, duplicate, the transfer's size and
    /// call), no buffer. A transfer is streamed or buffered from its first packet on; a
    /// packet of the other kind is refused.
    pub fn mark(&mut self, h: &PacketHeader, now_ns: u64) -> Result<()> {
        self.place(h, now_ns, true)?.mark(h.index, now_ns);
        Ok(())
    }

    /// The open transfer packet `h` belongs to (opened by it if it is the first), checked
    /// against the packet: kind, size, call, not seen yet.
    fn place(&mut self, h: &PacketHeader, now_ns: u64, streamed: bool) -> Result<&mut Transfer> {
        h.validate()?;
        if !self.open.contains_key(&h.transfer) {
            self.begin(h, now_ns, streamed)?;
        }
        let t = self
            .open
            .get_mut(&h.transfer)
            .ok_or(ServiceError::NoSuchTransfer(h.transfer))?;
        if t.total != h.total || t.call != h.call || t.streamed != streamed {
            return Err(ServiceError::BadPacket(format!(
                "packet {} of transfer {} says {} bytes for call {}{}, the transfer {} for call {}",
                h.index,
                h.transfer,
                h.total,
                h.call,
                if streamed { " streamed" } else { "" },
                t.total,
                t.call
            )));
        }
        if t.has(h.index) {
            return Err(ServiceError::Duplicate {
                transfer: h.transfer,
                index: h.index,
            });
        }
        Ok(t)
    }

    fn begin(&mut self, h: &PacketHeader, now_ns: u64, streamed: bool) -> Result<()> {
        if self.open.len() >= MAX_OPEN {
            return Err(ServiceError::OverBudget {
                want: h.total,
                left: 0,
            });
        }
        // A streamed transfer holds no bytes: only its bitmap.
        let size = if streamed { 0 } else { h.total };
        let left = self.budget.saturating_sub(self.used);
        if size > left {
            return Err(ServiceError::OverBudget {
                want: h.total,
                left,
            });
        }
        let words = (h.count as usize).div_ceil(64);
        let data = self.buffer(size as usize);
        self.used += size;
        self.open.insert(
            h.transfer,
            Transfer {
                call: h.call,
                total: h.total,
                count: h.count,
                bitmap: vec![0; words],
                received: 0,
                data,
                streamed,
                last_ns: now_ns,
            },
        );
        Ok(())
    }

    /// Ends `transfer`: the sender sent `sent` packets of a payload whose CRC-32 is `crc`
    /// (`None`: the sender sent no checksum). The transfer is closed either way; `Ok` only
    /// when every packet arrived and the counts (and the checksum, if any) add up.
    pub fn commit(&mut self, transfer: u32, sent: u32, crc: Option<u32>) -> Result<Completed> {
        let t = self
            .open
            .remove(&transfer)
            .ok_or(ServiceError::NoSuchTransfer(transfer))?;
        self.used -= t.held();
        if sent != t.count {
            return Err(ServiceError::Incomplete {
                transfer,
                detail: format!(
                    "sender counts {sent} packets, a {}-byte transfer has {}",
                    t.total, t.count
                ),
            });
        }
        if t.received != t.count {
            return Err(ServiceError::Incomplete {
                transfer,
                detail: format!(
                    "{} of {} packets arrived; missing {:?}{}",
                    t.received,
                    t.count,
                    t.missing(8),
                    if t.count - t.received > 8 { "..." } else { "" }
                ),
            });
        }
        if let (true, Some(_)) = (t.streamed, crc) {
            return Err(ServiceError::Incomplete {
                transfer,
                detail: "a streamed transfer's bytes are not kept: no checksum to check".into(),
            });
        }
        if let Some(crc) = crc {
            let got = crc32fast::hash(&t.data);
            if got != crc {
                return Err(ServiceError::Incomplete {
                    transfer,
                    detail: format!("checksum {got:#010x}, the sender's {crc:#010x}"),
                });
            }
        }
        Ok(Completed {
            transfer,
            call: t.call,
            data: t.data,
        })
    }

    /// Drops `transfer` (the sender gave up on it).
    pub fn revoke(&mut self, transfer: u32) -> Result<()> {
        let t = self
            .open
            .remove(&transfer)
            .ok_or(ServiceError::NoSuchTransfer(transfer))?;
        self.used -= t.held();
        Ok(())
    }

    /// Drops every transfer that saw no packet for the timeout; returns their ids.
    pub fn expire(&mut self, now_ns: u64) -> Vec<u32> {
        let timeout = self.timeout_ns;
        let dead: Vec<u32> = self
            .open
            .iter()
            .filter(|(_, t)| now_ns.saturating_sub(t.last_ns) >= timeout)
            .map(|(&id, _)| id)
            .collect();
        for id in &dead {
            if let Some(t) = self.open.remove(id) {
                self.used -= t.held();
            }
        }
        dead
    }

    /// When the oldest open transfer times out (`None`: none open).
    pub fn next_deadline(&self) -> Option<u64> {
        self.open
            .values()
            .map(|t| t.last_ns.saturating_add(self.timeout_ns))
            .min()
    }
}

/// Splits `data` into the packets of transfer `transfer` for `call`: (header, bytes).
pub fn split(transfer: u32, call: u32, data: &[u8]) -> Vec<(PacketHeader, &[u8])> {
    data.chunks(PACKET_SIZE as usize)
        .enumerate()
        .map(|(i, c)| {
            (
                PacketHeader::new(transfer, call, data.len() as u64, i as u32),
                c,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn packets_reassemble_in_any_order() {
        let data = payload(5 * PACKET_SIZE as usize + 123);
        let mut r = Reassembler::new(1 << 24, 1_000);
        let mut packets = split(3, 9, &data);
        packets.reverse();
        packets.swap(1, 4);
        for (h, b) in &packets {
            r.packet(h, b, 0).unwrap();
        }
        let done = r.commit(3, 6, Some(crc32fast::hash(&data))).unwrap();
        assert_eq!((done.transfer, done.call), (3, 9));
        assert_eq!(done.data, data);
        assert_eq!(r.used(), 0);
    }

    #[test]
    fn duplicates_overlaps_and_disagreeing_headers_are_refused() {
        let data = payload(3 * PACKET_SIZE as usize);
        let mut r = Reassembler::new(1 << 24, 1_000);
        let p = split(1, 0, &data);
        r.packet(&p[0].0, p[0].1, 0).unwrap();
        assert_eq!(
            r.packet(&p[0].0, p[0].1, 0),
            Err(ServiceError::Duplicate {
                transfer: 1,
                index: 0
            })
        );
        let mut long = p[1].0;
        long.len += 1;
        assert!(matches!(
            r.packet(&long, &data[..long.len as usize], 0),
            Err(ServiceError::Overlap { .. })
        ));
        let mut other = p[1].0;
        other.total += 1;
        other.len = crate::packet::packet_len(other.total, other.index) as u32;
        assert!(matches!(
            r.packet(&other, &data[..other.len as usize], 0),
            Err(ServiceError::BadPacket(_)) | Err(ServiceError::Overlap { .. })
        ));
        assert!(r.packet(&p[1].0, &p[1].1[1..], 0).is_err(), "short body");
        // Nothing of the refused packets landed: the rest still completes.
        r.packet(&p[1].0, p[1].1, 0).unwrap();
        r.packet(&p[2].0, p[2].1, 0).unwrap();
        assert_eq!(
            r.commit(1, 3, Some(crc32fast::hash(&data))).unwrap().data,
            data
        );
    }

    #[test]
    fn lost_packets_and_counts_that_do_not_add_up_fail_the_commit() {
        let data = payload(4 * PACKET_SIZE as usize);
        let crc = Some(crc32fast::hash(&data));
        let p = split(5, 0, &data);
        let mut r = Reassembler::new(1 << 24, 1_000);
        for i in [0, 1, 3] {
            r.packet(&p[i].0, p[i].1, 0).unwrap();
        }
        let e = r.commit(5, 4, crc).unwrap_err();
        assert!(e.to_string().contains("missing [2]"), "{e}");
        assert_eq!(r.used(), 0, "a failed commit frees the transfer");
        for (h, b) in &p {
            r.packet(h, b, 0).unwrap();
        }
        assert!(matches!(
            r.commit(5, 3, crc),
            Err(ServiceError::Incomplete { .. })
        ));
        for (h, b) in &p {
            r.packet(h, b, 0).unwrap();
        }
        assert!(r.commit(5, 4, crc.map(|c| c ^ 1)).is_err(), "checksum");
        assert_eq!(r.commit(5, 4, crc), Err(ServiceError::NoSuchTransfer(5)));
    }

    #[test]
    fn a_committed_buffer_is_reused_and_the_checksum_is_optional() {
        let a = payload(3 * PACKET_SIZE as usize);
        let mut r = Reassembler::new(1 << 24, 1_000);
        for (h, b) in split(1, 0, &a) {
            r.packet(&h, b, 0).unwrap();
        }
        let done = r.commit(1, 3, None).unwrap();
        assert_eq!(done.data, a);
        let at = done.data.as_ptr();
        r.recycle(done.data);
        // A smaller transfer opens in the spare; only its own bytes come out.
        let b: Vec<u8> = payload(PACKET_SIZE as usize + 5)
            .iter()
            .map(|x| !x)
            .collect();
        let p = split(2, 0, &b);
        r.packet(&p[1].0, p[1].1, 0).unwrap();
        assert!(
            r.commit(2, 2, None).is_err(),
            "no checksum: the bitmap still counts"
        );
        for (h, x) in &p {
            r.packet(h, x, 0).unwrap();
        }
        let done = r.commit(2, 2, None).unwrap();
        assert_eq!(done.data, b);
        assert_eq!(done.data.as_ptr(), at, "opened in the spare");
        assert_eq!(r.used(), 0);
    }

    #[test]
    fn streamed_transfers_keep_only_their_bitmap() {
        let data = payload(3 * PACKET_SIZE as usize + 1);
        let mut r = Reassembler::new(u64::from(PACKET_SIZE), 1_000);
        let p = split(4, 2, &data);
        // Over the budget if it were buffered; streamed it holds no bytes.
        r.mark(&p[3].0, 0).unwrap();
        r.mark(&p[0].0, 0).unwrap();
        assert_eq!((r.used(), r.open()), (0, 1));
        assert_eq!(
            r.mark(&p[0].0, 0),
            Err(ServiceError::Duplicate {
                transfer: 4,
                index: 0
            })
        );
        assert!(
            matches!(
                r.packet(&p[1].0, p[1].1, 0),
                Err(ServiceError::BadPacket(_))
            ),
            "a buffered packet of a streamed transfer"
        );
        let mut forged = p[1].0;
        forged.len -= 1;
        assert!(r.mark(&forged, 0).is_err(), "the header is checked");
        assert!(r.commit(4, 4, None).is_err(), "packets 1 and 2 missing");
        for (h, _) in &p {
            r.mark(h, 0).unwrap();
        }
        let crc = Some(crc32fast::hash(&data));
        assert!(r.commit(4, 4, crc).is_err(), "no bytes kept: no checksum");
        for (h, _) in &p {
            r.mark(h, 0).unwrap();
        }
        let done = r.commit(4, 4, None).unwrap();
        assert!(done.data.is_empty());
        // A buffered transfer refuses a streamed packet.
        let q = split(5, 2, &data[..10]);
        r.packet(&q[0].0, q[0].1, 0).unwrap();
        assert!(r.mark(&q[0].0, 0).is_err());
    }

    #[test]
    fn budget_revoke_and_timeout_bound_memory() {
        let big = payload(3 * PACKET_SIZE as usize);
        let mut r = Reassembler::new(4 * u64::from(PACKET_SIZE), 1_000);
        let p = split(1, 0, &big);
        r.packet(&p[0].0, p[0].1, 10).unwrap();
        assert_eq!(r.used(), big.len() as u64);
        let q = split(2, 0, &big);
        assert!(matches!(
            r.packet(&q[0].0, q[0].1, 10),
            Err(ServiceError::OverBudget { .. })
        ));
        r.revoke(1).unwrap();
        assert_eq!(r.used(), 0);
        assert_eq!(r.revoke(1), Err(ServiceError::NoSuchTransfer(1)));
        r.packet(&q[0].0, q[0].1, 100).unwrap();
        assert_eq!(r.next_deadline(), Some(1_100));
        assert!(r.expire(1_099).is_empty());
        assert_eq!(r.expire(1_100), vec![2]);
        assert_eq!((r.used(), r.open()), (0, 0));
    }
}
