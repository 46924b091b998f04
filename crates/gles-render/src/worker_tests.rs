//! Tests of the render worker's loop: EGL packets and their answers, the daemon-only
//! READBACK, malformed batches.

use super::*;
use virtsoc_sync::LockExt;

/// The answers of a batch: `(op, first word)` each.
fn answers(reply: &Encoder) -> Vec<(u32, u32)> {
    let mut r = Reader::new(reply.as_bytes());
    let mut out = Vec::new();
    while let Some(Ok((op, mut p))) = r.next_packet() {
        out.push((op, p.u32().unwrap_or(u32::MAX)));
    }
    out
}

#[test]
fn contexts_surfaces_and_bad_ids_on_the_host() {
    let _one = crate::egl::HOST_EGL_TESTS.lock_or_recover();
    let Ok(mut r) = Renderer::new() else {
        eprintln!("SKIPPED: no host EGL");
        return;
    };
    let mut e = Encoder::new();
    e.packet(egl::CREATE_CONTEXT).u32(1).u32(0).u32(2);
    e.packet(egl::CREATE_CONTEXT).u32(2).u32(1).u32(2); // shares with 1
    e.packet(egl::CREATE_CONTEXT).u32(3).u32(99).u32(2); // unknown share
    e.packet(egl::CREATE_CONTEXT).u32(4).u32(0).u32(1); // ES 1: refused
    e.packet(egl::CREATE_SURFACE).u32(7).u32(16).u32(8).u32(1);
    e.packet(egl::CREATE_SURFACE).u32(8).u32(0).u32(8).u32(1); // empty
    e.packet(egl::CREATE_SURFACE).u32(9).u32(16).u32(8).u32(999); // no such config
    e.packet(egl::MAKE_CURRENT).u32(1).u32(7).u32(7);
    e.packet(egl::MAKE_CURRENT).u32(1).u32(77).u32(7); // unknown surface
    e.packet(egl::SWAP).u32(7);
    e.packet(egl::FINISH);
    let mut reply = Encoder::new();
    r.run(e.as_bytes(), &mut reply, false).unwrap();
    assert_eq!(
        answers(&reply),
        [
            (egl::CREATE_CONTEXT, egl::SUCCESS),
            (egl::CREATE_CONTEXT, egl::SUCCESS),
            (egl::CREATE_CONTEXT, egl::BAD_CONTEXT),
            (egl::CREATE_CONTEXT, egl::BAD_MATCH),
            (egl::CREATE_SURFACE, egl::SUCCESS),
            (egl::CREATE_SURFACE, egl::BAD_PARAMETER),
            (egl::CREATE_SURFACE, egl::BAD_CONFIG),
            (egl::MAKE_CURRENT, egl::SUCCESS),
            (egl::MAKE_CURRENT, egl::BAD_SURFACE),
            (egl::FINISH, u32::MAX),
        ]
    );

    // A guest may not ask for a readback; the daemon may.
    let mut e = Encoder::new();
    e.packet(egl::READBACK).u32(7);
    let mut reply = Encoder::new();
    assert!(r.run(e.as_bytes(), &mut reply, false).is_err());
    let mut reply = Encoder::new();
    r.run(e.as_bytes(), &mut reply, true).unwrap();
    let mut rd = Reader::new(reply.as_bytes());
    let (op, mut p) = rd.next_packet().unwrap().unwrap();
    assert_eq!(op, egl::READBACK);
    assert_eq!((p.u32().unwrap(), p.u32().unwrap()), (16, 8));
    assert_eq!(p.bytes().unwrap().map(<[u8]>::len), Some(16 * 8 * 4));

    // Malformed packets end the batch with an error, never a panic.
    for bad in [
        &[0x00, 0x00, 0x01, 0x00, 0x08][..], // partial header
        &[0x05, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00][..], // MAKE_CURRENT, no payload
        &[0x77, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00][..], // unknown EGL op
    ] {
        let mut reply = Encoder::new();
        assert!(r.run(bad, &mut reply, false).is_err());
    }
    // Destroying what is current, then using the ids, is harmless.
    let mut e = Encoder::new();
    e.packet(egl::DESTROY_SURFACE).u32(7);
    e.packet(egl::DESTROY_CONTEXT).u32(1);
    e.packet(egl::SET_CONTEXT).u32(1);
    e.packet(egl::SWAP).u32(7);
    e.packet(egl::RESIZE_SURFACE).u32(7).u32(32).u32(32);
    let mut reply = Encoder::new();
    r.run(e.as_bytes(), &mut reply, false).unwrap();
    assert!(answers(&reply).is_empty());
}
