//! A host service packet header decoded from arbitrary bytes
//! (`virtsoc_services::packet::PacketHeader::from_bytes`, and the ring words the channel
//! carries, `from_words`): anything that decodes validates, round-trips through its encoding
//! and names a place inside its transfer. Every error is fine; a panic is not.

#![no_main]

use libfuzzer_sys::fuzz_target;
use virtsoc_services::packet::{PacketHeader, PACKET_SIZE};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = PacketHeader::from_bytes(data) {
        assert!(h.validate().is_ok());
        assert_eq!(PacketHeader::from_bytes(&h.to_bytes()), Ok(h));
        assert!(h.offset() + u64::from(h.len) <= h.total);
        assert!(h.len <= PACKET_SIZE && h.len > 0);
    }
    if data.len() >= 28 {
        let w =
            |i: usize| u64::from_le_bytes(data[4 + 8 * i..12 + 8 * i].try_into().unwrap_or([0; 8]));
        let call = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        if let Ok(h) = PacketHeader::from_words(call, [w(0), w(1), w(2)]) {
            assert_eq!(PacketHeader::from_words(call, h.to_words()), Ok(h));
        }
    }
});
