//! The hypervisor's tests.

use super::*;

struct Counter {
    n: AtomicU64,
}

const CALLS: &[CallInfo] = &[
    CallInfo {
        call: 1,
        name: Cow::Borrowed("next"),
        doc: Cow::Borrowed("counts"),
    },
    CallInfo {
        call: 2,
        name: Cow::Borrowed("die"),
        doc: Cow::Borrowed("panics"),
    },
];

impl Service for Counter {
    fn name(&self) -> &str {
        "counter"
    }
    fn calls(&self) -> Vec<CallInfo> {
        CALLS.to_vec()
    }
    fn call(&self, _: &CallCtx, call: u32, _: &dyn Input, _: &mut dyn Output) -> Result<Reply> {
        if call == 2 {
            panic!("service bug");
        }
        Ok(Reply {
            len: 0,
            values: [self.n.fetch_add(1, Ordering::Relaxed) + 1, 0, 0, 0],
        })
    }
}

fn hv(policy: &str) -> Hypervisor {
    let h = Hypervisor::new(ServicePolicy::parse(policy).unwrap());
    h.register(
        Instances::Shared,
        Arc::new(|| {
            Arc::new(Counter {
                n: AtomicU64::new(0),
            }) as Arc<dyn Service>
        }),
    );
    h
}

fn call(h: &Hypervisor, g: u64, ch: u64, c: u32) -> Result<u64> {
    let mut out = Vec::new();
    h.invoke(g, ch, c, &Vec::new(), &mut out)
        .map(|r| r.values[0])
}

#[test]
fn policy_channels_and_forged_ids() {
    let h = hv(r#"{"allow": {"*": ["counter"], "jail": []}}"#);
    assert!(matches!(
        h.open(1, "jail", "counter"),
        Err(ServiceError::Denied { .. })
    ));
    assert!(matches!(
        h.open(1, "a", "nope"),
        Err(ServiceError::NoSuchService(_))
    ));
    let a = h.open(1, "a", "counter").unwrap();
    let b = h.open(2, "b", "counter").unwrap();
    assert_eq!(call(&h, 1, a, 1), Ok(1));
    assert_eq!(call(&h, 2, b, 1), Ok(2), "one shared instance");
    assert_eq!(
        call(&h, 1, b, 1),
        Err(ServiceError::NoSuchChannel(b)),
        "forged"
    );
    assert!(matches!(
        call(&h, 1, a, 9),
        Err(ServiceError::NoSuchCall { .. })
    ));
    assert_eq!(h.close(1, b), Err(ServiceError::NoSuchChannel(b)));
    // The policy changes at run time: open channels are refused at their next call.
    h.set_policy(ServicePolicy::parse(r#"{"allow": {"b": ["counter"]}}"#).unwrap());
    assert!(matches!(
        call(&h, 1, a, 1),
        Err(ServiceError::Denied { .. })
    ));
    assert_eq!(call(&h, 2, b, 1), Ok(3));
    h.guest_gone(2);
    assert_eq!(call(&h, 2, b, 1), Err(ServiceError::NoSuchChannel(b)));
}

#[test]
fn per_guest_instances_and_restart_after_a_panic() {
    let h = hv(r#"{"instances": {"counter": "per-guest"}}"#);
    let a = h.open(1, "a", "counter").unwrap();
    let b = h.open(2, "b", "counter").unwrap();
    assert_eq!(call(&h, 1, a, 1), Ok(1));
    assert_eq!(call(&h, 1, a, 1), Ok(2));
    assert_eq!(call(&h, 2, b, 1), Ok(1), "its own instance");
    assert_eq!(
        call(&h, 1, a, 2),
        Err(ServiceError::ServiceDied("counter".into()))
    );
    assert_eq!(call(&h, 1, a, 1), Ok(1), "a fresh instance");
    assert_eq!(call(&h, 2, b, 1), Ok(2), "the other guest's goes on");
    assert_eq!(h.describe()["services"][0]["restarts"], 1);
}

#[test]
fn a_guests_state_and_channels_are_handed_over() {
    use super::handover::{check_channels, ChannelRecord, KeptAnswer};
    use crate::builtin::bulk;
    let src = Hypervisor::default();
    crate::builtin::register_all(&src);
    let ch = src.open(1, "g", "bulk").unwrap();
    assert!(ch > 1 << 32, "ids start at a random base");
    let mut out = Vec::new();
    for _ in 0..3 {
        src.invoke(1, ch, bulk::call::SINK, &vec![7u8; 10], &mut out)
            .unwrap();
    }
    let state = src.export_guest(1);
    assert_eq!(state["bulk"]["calls"], 3);
    assert_eq!(src.channels_of(1), vec![(ch, "bulk".to_string())]);

    // The target takes the channel under its id and the counter runs on.
    let dst = Hypervisor::default();
    crate::builtin::register_all(&dst);
    dst.adopt(9, "g", ch, "bulk").unwrap();
    assert!(dst.adopt(9, "g", ch, "bulk").is_err(), "id taken");
    assert!(
        dst.adopt(9, "g", ch + 1, "nope").is_err(),
        "no such service"
    );
    assert!(dst.import_guest(9, &state).is_empty());
    let r = dst
        .invoke(9, ch, bulk::call::SINK, &vec![7u8; 10], &mut out)
        .unwrap();
    assert_eq!((r.values[2], r.values[3]), (4, 40));
    let bad = serde_json::json!({"bulk": {"calls": "x"}, "nope": {}});
    assert_eq!(dst.import_guest(9, &bad).len(), 2);

    // Kept answers are checked when decoded; records when read.
    let e = crate::chan::Entry {
        seq: 5,
        slot: 1,
        len: 3,
        ..Default::default()
    };
    let k = KeptAnswer::new(&e, b"abc");
    assert_eq!(k.decode(2).unwrap(), (e, b"abc".to_vec()));
    assert!(k.decode(1).is_err(), "slot outside the ring");
    let mut bad = k.clone();
    bad.out = "zz".into();
    assert!(bad.decode(2).is_err());
    bad.out = "61626364".into();
    assert!(bad.decode(2).is_err(), "more bytes than its length");
    let rec = |id| ChannelRecord {
        id,
        service: "bulk".into(),
        region: 1,
        answers: Vec::new(),
    };
    assert!(check_channels(&[rec(3), rec(4)]).is_ok());
    assert!(check_channels(&[rec(3), rec(3)]).is_err());
    assert!(check_channels(&[rec(0)]).is_err());
}

#[test]
fn a_drain_takes_its_packets_in_place_in_any_order() {
    use crate::builtin::bulk;
    use crate::packet::PACKET_SIZE;
    let h = Hypervisor::default();
    crate::builtin::register_all(&h);
    let ch = h.open(1, "g", "bulk").unwrap();
    let data: Vec<u8> = (0..3 * PACKET_SIZE as usize + 13)
        .map(|i| (i % 251) as u8)
        .collect();
    let mut out = Vec::new();
    let whole = h.invoke(1, ch, bulk::call::DRAIN, &data, &mut out).unwrap();
    let mut s = h
        .open_sink(1, ch, bulk::call::DRAIN, data.len() as u64)
        .unwrap()
        .expect("a drain takes packets");
    let mut packets: Vec<_> = data.chunks(PACKET_SIZE as usize).enumerate().collect();
    packets.reverse();
    packets.swap(0, 2);
    for (i, p) in packets {
        h.sink_packet(&mut s, (i * PACKET_SIZE as usize) as u64, &p)
            .unwrap();
    }
    let r = h.finish_sink(s, &mut out).unwrap();
    assert_eq!(r.values[..2], whole.values[..2], "bytes and word sum");
    assert_eq!(r.values[2], 2, "counted as the guest's second drain");

    // A call that needs its input whole gets no sink; the channel, the call and the policy
    // are checked as for a call.
    assert!(h.open_sink(1, ch, bulk::call::SINK, 10).unwrap().is_none());
    assert_eq!(
        h.open_sink(2, ch, bulk::call::DRAIN, 10).err(),
        Some(ServiceError::NoSuchChannel(ch))
    );
    assert!(matches!(
        h.open_sink(1, ch, 99, 10),
        Err(ServiceError::NoSuchCall { .. })
    ));
    let s = h.open_sink(1, ch, bulk::call::DRAIN, 10).unwrap().unwrap();
    h.set_policy(ServicePolicy::parse(r#"{"allow": {"other": ["*"]}}"#).unwrap());
    assert!(matches!(
        h.finish_sink(s, &mut out),
        Err(ServiceError::Denied { .. })
    ));
}
