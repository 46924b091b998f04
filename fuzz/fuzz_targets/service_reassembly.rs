//! Reassembly of host service transfers driven by arbitrary operations
//! (`virtsoc_services::reassembly::Reassembler`): packets with arbitrary headers (a few
//! transfer ids, sizes up to a few packets, lengths right or wrong), commits with arbitrary
//! counts and checksums, revocations and expiry, on a small budget. The held bytes never
//! exceed the budget and go back to zero once everything is closed; a commit that succeeds
//! returns exactly the bytes its packets carried. Every error is fine; a panic is not.

#![no_main]

use libfuzzer_sys::fuzz_target;
use virtsoc_services::packet::{packet_len, PacketHeader, PACKET_SIZE};
use virtsoc_services::reassembly::Reassembler;

const BUDGET: u64 = 6 * PACKET_SIZE as u64;

fuzz_target!(|data: &[u8]| {
    let mut r = Reassembler::new(BUDGET, 1_000);
    let mut now = 0u64;
    for op in data.chunks(8) {
        let b = |i: usize| u64::from(op.get(i).copied().unwrap_or(0));
        let transfer = (b(1) % 4) as u32;
        match b(0) % 4 {
            0 | 1 => {
                let total = 1 + (b(2) << 8 | b(3)) * 1024 % (4 * u64::from(PACKET_SIZE));
                let index = (b(4) % 5) as u32;
                let mut h = PacketHeader::new(transfer, (b(5) % 3) as u32, total, index);
                if b(6) % 5 == 0 {
                    h.len = h.len.wrapping_add(1);
                }
                let len = if b(7) % 7 == 0 {
                    3
                } else {
                    packet_len(total, index) as usize
                };
                let fill = vec![(index as u8).wrapping_mul(31); len];
                let _ = r.packet(&h, &fill, now);
            }
            2 => {
                // Half the commits carry no checksum: the bitmap alone must still
                // guarantee every byte is its packet's (none left from a reused buffer).
                let crc = (b(3) % 2 == 0).then_some((b(3) * 77) as u32);
                if let Ok(done) = r.commit(transfer, b(2) as u32, crc) {
                    if let Some(c) = crc {
                        assert_eq!(crc32fast::hash(&done.data), c);
                    }
                    for (i, p) in done.data.chunks(PACKET_SIZE as usize).enumerate() {
                        let fill = (i as u8).wrapping_mul(31);
                        assert!(p.iter().all(|&x| x == fill));
                    }
                    r.recycle(done.data);
                }
            }
            _ => {
                let _ = r.revoke(transfer);
                now += b(2) * 10;
                r.expire(now);
            }
        }
        assert!(r.used() <= BUDGET);
    }
    for t in 0..4 {
        let _ = r.revoke(t);
    }
    assert_eq!(r.used(), 0);
});
