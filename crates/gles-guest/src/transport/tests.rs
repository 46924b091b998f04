//! Unit tests of the transport: batch splitting and lost-worker errors.

use super::*;
use virtsoc_gles_stream::Encoder;

#[test]
fn splits_at_packet_boundaries() {
    let mut e = Encoder::new();
    for i in 0..10u32 {
        e.packet(i).bytes(&[0u8; 100]);
    }
    let b = e.as_bytes();
    let pieces = split(b, 250);
    assert!(pieces.len() >= 5);
    assert_eq!(pieces.iter().map(|p| p.len()).sum::<usize>(), b.len());
    for p in &pieces {
        let mut r = Reader::new(p);
        while let Some(x) = r.next_packet() {
            assert!(x.is_ok());
        }
    }
}

#[test]
fn lost_worker_reasons_are_lost() {
    let e = GuestError::Status {
        op: Opcode::DeviceCmd,
        status: Status::DeviceError,
        reason: Some("context lost: render worker killed".into()),
    };
    assert!(matches!(channel_error(e), ChannelError::Lost(_)));
    assert!(matches!(
        channel_error(GuestError::Closed),
        ChannelError::Lost(_)
    ));
}
