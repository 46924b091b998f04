//! The channel's tests.

use super::*;
use crate::payload::{Input, Output};
use virtsoc_proto::WindowLayout;

fn window() -> Arc<SharedWindow> {
    let l = WindowLayout::new(8 << 20, 4, 4).unwrap();
    Arc::new(SharedWindow::create_memfd("chan", l).unwrap())
}

#[test]
fn requests_and_responses_flow_through_the_rings() {
    let w = window();
    let lay = ChannelLayout::new(4).unwrap();
    let base = 1 << 20;
    let mut g = GuestEnd::create(w.clone(), base, lay, 0).unwrap();
    let mut h = HostEnd::attach(w.clone(), base, lay.size(), 0).unwrap();
    g.slot(1).unwrap().write_at(0, b"hello").unwrap();
    for s in 0..4u64 {
        let e = Entry {
            seq: s,
            code: kind::CALL,
            slot: 1,
            len: 5,
            ..Entry::default()
        };
        assert!(g.post(e).unwrap());
    }
    assert!(!g.post(Entry::default()).unwrap(), "ring full");
    let e = h.next(Duration::ZERO).unwrap().unwrap();
    assert_eq!((e.seq, e.code, e.len), (0, kind::CALL, 5));
    let mut b = [0u8; 5];
    h.slot(e.slot).unwrap().read_at(0, &mut b).unwrap();
    assert_eq!(&b, b"hello");
    h.respond(Entry {
        seq: 0,
        args: [42, 0, 0, 0, 0],
        ..Entry::default()
    })
    .unwrap();
    assert_eq!(g.next(Duration::ZERO).unwrap().unwrap().args[0], 42);
    assert!(h.slot(4).is_err(), "slot outside the channel");
    g.close();
    for _ in 0..3 {
        h.next(Duration::ZERO).unwrap();
    }
    assert_eq!(h.next(Duration::ZERO), Err(ServiceError::Closed));
}

#[test]
fn hostile_control_blocks_are_refused() {
    let w = window();
    let lay = ChannelLayout::new(2).unwrap();
    assert!(
        HostEnd::attach(w.clone(), 0, 1 << 20, 0).is_err(),
        "no magic"
    );
    let _g = GuestEnd::create(w.clone(), 0, lay, 0).unwrap();
    assert!(
        HostEnd::attach(w.clone(), 0, lay.size() - 1, 0).is_err(),
        "too small"
    );
    w.atomic_u32(ctl::ENTRIES)
        .unwrap()
        .store(3, Ordering::SeqCst);
    assert!(
        HostEnd::attach(w.clone(), 0, 1 << 20, 0).is_err(),
        "entries"
    );
    w.atomic_u32(ctl::ENTRIES)
        .unwrap()
        .store(2, Ordering::SeqCst);
    let mut h = HostEnd::attach(w.clone(), 0, lay.size(), 0).unwrap();
    w.atomic_u32(ctl::REQ_TAIL)
        .unwrap()
        .store(99, Ordering::SeqCst);
    assert!(matches!(
        h.next(Duration::ZERO),
        Err(ServiceError::Memory(_))
    ));
}
