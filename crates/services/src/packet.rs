//! The header of one packet of a large transfer (virtio-vapp's Algorithm 2).
//!
//! A transfer of `total` bytes is cut into `count = ceil(total / PACKET_SIZE)` packets;
//! packet `index` carries bytes `[index * PACKET_SIZE, ...)`, [`PACKET_SIZE`] of them except
//! the last, which carries the rest. Its place follows from its index, so a packet whose
//! length is not the one its index implies would overlap a neighbour (or leave a hole) and is
//! refused. The header is 32 little-endian bytes:
//! `magic u32 | transfer u32 | index u32 | count u32 | len u32 | call u32 | total u64`.

use crate::{Result, ServiceError};

/// Bytes one packet carries at most (64 KiB).
pub const PACKET_SIZE: u32 = 64 << 10;
/// Size of an encoded header.
pub const HEADER_SIZE: usize = 32;
/// The header's first word ("VPKT").
pub const MAGIC: u32 = 0x544b_5056;
/// Largest transfer (1 GiB): anything larger is refused before any memory is reserved.
pub const MAX_TRANSFER: u64 = 1 << 30;

/// One packet's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PacketHeader {
    /// The transfer it belongs to (chosen by the sender, unique among its open transfers).
    pub transfer: u32,
    /// Its index in the transfer.
    pub index: u32,
    /// Packets in the transfer.
    pub count: u32,
    /// Bytes it carries.
    pub len: u32,
    /// The service call the whole transfer is the input of.
    pub call: u32,
    /// Bytes of the whole transfer.
    pub total: u64,
}

/// Packets a transfer of `total` bytes is cut into.
pub fn packets_for(total: u64) -> u64 {
    total.div_ceil(u64::from(PACKET_SIZE))
}

/// The length packet `index` of a transfer of `total` bytes carries.
pub fn packet_len(total: u64, index: u32) -> u64 {
    let start = u64::from(index) * u64::from(PACKET_SIZE);
    total.saturating_sub(start).min(u64::from(PACKET_SIZE))
}

impl PacketHeader {
    /// The header of packet `index` of a transfer of `total` bytes.
    pub fn new(transfer: u32, call: u32, total: u64, index: u32) -> Self {
        PacketHeader {
            transfer,
            index,
            count: packets_for(total) as u32,
            len: packet_len(total, index) as u32,
            call,
            total,
        }
    }

    /// Byte offset of this packet in the transfer.
    pub fn offset(&self) -> u64 {
        u64::from(self.index) * u64::from(PACKET_SIZE)
    }

    /// Checks the header on its own: total within [`MAX_TRANSFER`] and non-zero, count the
    /// one total implies, index within count, length the one the index implies.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ServiceError::BadPacket(m));
        if self.total == 0 || self.total > MAX_TRANSFER {
            return bad(format!(
                "total {} outside 1..={MAX_TRANSFER} bytes",
                self.total
            ));
        }
        if u64::from(self.count) != packets_for(self.total) {
            return bad(format!(
                "count {} but {} bytes make {} packets",
                self.count,
                self.total,
                packets_for(self.total)
            ));
        }
        if self.index >= self.count {
            return bad(format!(
                "index {} outside a transfer of {} packets",
                self.index, self.count
            ));
        }
        if u64::from(self.len) != packet_len(self.total, self.index) {
            return Err(ServiceError::Overlap {
                transfer: self.transfer,
                index: self.index,
                len: self.len,
            });
        }
        Ok(())
    }

    /// The 32-byte encoding.
    pub fn to_bytes(&self) -> [u8; HEADER_SIZE] {
        let mut b = [0u8; HEADER_SIZE];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.transfer.to_le_bytes());
        b[8..12].copy_from_slice(&self.index.to_le_bytes());
        b[12..16].copy_from_slice(&self.count.to_le_bytes());
        b[16..20].copy_from_slice(&self.len.to_le_bytes());
        b[20..24].copy_from_slice(&self.call.to_le_bytes());
        b[24..32].copy_from_slice(&self.total.to_le_bytes());
        b
    }

    /// Decodes and validates a header (untrusted bytes).
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        let b: &[u8; HEADER_SIZE] = b
            .get(..HEADER_SIZE)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| ServiceError::BadPacket(format!("header under {HEADER_SIZE} bytes")))?;
        let u = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        if u(0) != MAGIC {
            return Err(ServiceError::BadPacket(format!("magic {:#x}", u(0))));
        }
        let mut t = [0u8; 8];
        t.copy_from_slice(&b[24..32]);
        let h = PacketHeader {
            transfer: u(4),
            index: u(8),
            count: u(12),
            len: u(16),
            call: u(20),
            total: u64::from_le_bytes(t),
        };
        h.validate()?;
        Ok(h)
    }

    /// The header as three ring words: `transfer | index << 32`, `count | len << 32`,
    /// `total`; the call travels in the entry's own call field.
    pub fn to_words(&self) -> [u64; 3] {
        [
            u64::from(self.transfer) | u64::from(self.index) << 32,
            u64::from(self.count) | u64::from(self.len) << 32,
            self.total,
        ]
    }

    /// Decodes and validates the words of [`to_words`](Self::to_words).
    pub fn from_words(call: u32, w: [u64; 3]) -> Result<Self> {
        let h = PacketHeader {
            transfer: w[0] as u32,
            index: (w[0] >> 32) as u32,
            count: w[1] as u32,
            len: (w[1] >> 32) as u32,
            call,
            total: w[2],
        };
        h.validate()?;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_lengths_follow_the_index() {
        let total = 3 * u64::from(PACKET_SIZE) + 10;
        for i in 0..4 {
            let h = PacketHeader::new(7, 2, total, i);
            assert_eq!(PacketHeader::from_bytes(&h.to_bytes()), Ok(h));
            assert_eq!(PacketHeader::from_words(2, h.to_words()), Ok(h));
        }
        assert_eq!(PacketHeader::new(7, 2, total, 3).len, 10);
        assert_eq!(PacketHeader::new(7, 2, total, 0).len, PACKET_SIZE);
        assert_eq!(PacketHeader::new(7, 2, total, 3).offset(), 3 << 16);
    }

    #[test]
    fn bad_headers_are_refused() {
        let ok = PacketHeader::new(1, 0, 200_000, 1);
        let mut h = ok;
        h.len += 1;
        assert!(matches!(h.validate(), Err(ServiceError::Overlap { .. })));
        let mut h = ok;
        h.index = 9;
        assert!(matches!(h.validate(), Err(ServiceError::BadPacket(_))));
        let mut h = ok;
        h.count = 2;
        assert!(matches!(h.validate(), Err(ServiceError::BadPacket(_))));
        let mut h = ok;
        h.total = MAX_TRANSFER + 1;
        assert!(h.validate().is_err());
        let mut b = ok.to_bytes();
        b[0] ^= 1;
        assert!(PacketHeader::from_bytes(&b).is_err());
        assert!(PacketHeader::from_bytes(&b[..10]).is_err());
    }
}
