//! The port reader's tests: a Unix socket pair stands in for the virtio-serial port.

use std::os::fd::OwnedFd;

use virtsoc_proto::WindowLayout;

use super::*;

fn reply_frame(body: &[u8]) -> Vec<u8> {
    let mut m = vec![MSG_REPLY];
    m.extend_from_slice(&(body.len() as u32).to_le_bytes());
    m.extend_from_slice(body);
    m
}

/// A hub on one end of a socket pair; the other end plays the host.
fn hub() -> (Arc<PortHub>, UnixStream) {
    let (guest, host) = UnixStream::pair().unwrap();
    let file = File::from(OwnedFd::from(guest));
    (PortHub::start(file).unwrap(), host)
}

fn window() -> Arc<SharedWindow> {
    let l = WindowLayout::new(1 << 16, 4, 4).unwrap();
    Arc::new(SharedWindow::create_memfd("hub", l).unwrap())
}

#[test]
fn the_parser_finds_bells_and_replies_however_the_bytes_are_split() {
    let mut stream = vec![MSG_BELL, 0x7f, MSG_BELL];
    stream.extend(reply_frame(b"{\"a\":1}"));
    stream.push(MSG_BELL);
    stream.extend(reply_frame(b""));
    let mut big = vec![MSG_REPLY];
    big.extend_from_slice(&(MAX_FRAME as u32 + 1).to_le_bytes());
    big.extend(std::iter::repeat_n(MSG_BELL, MAX_FRAME + 1));
    stream.extend(big);
    stream.push(MSG_BELL);
    let want = Arrivals {
        bells: 4,
        replies: vec![Some(b"{\"a\":1}".to_vec()), Some(Vec::new()), None],
    };
    for cut in [1, 2, 3, 5, 7, 4096, stream.len()] {
        let mut p = Parse::default();
        let mut got = Arrivals::default();
        for piece in stream.chunks(cut) {
            p.feed(piece, &mut got);
        }
        assert_eq!(got, want, "pieces of {cut}");
        assert!(matches!(p, Parse::Idle));
    }
}

/// The session ring's reaper and a service channel's wait sleep at once on one connection:
/// one doorbell byte wakes both (two readers of the port would each have stolen the
/// other's bytes; a reader that woke only one sleeper would leave the other asleep).
#[test]
fn one_doorbell_byte_wakes_every_sleeper_of_the_connection() {
    let (hub, mut host) = hub();
    let w = window();
    let go = Arc::new(AtomicBool::new(false));
    let (tx, woke) = std::sync::mpsc::channel();
    let flags = [1024u64, 2048];
    for &f in &flags {
        let bell = hub.own_bell(&w, f, 0).unwrap();
        let (go, tx) = (go.clone(), tx.clone());
        // No time limit: only a wake-up ends the wait.
        std::thread::spawn(move || {
            let _ = tx.send(bell.wait(&mut || go.load(Ordering::SeqCst), None));
        });
    }
    // Both announced their sleep (as the host would see in the window) ...
    let asleep = |f: u64| w.atomic_u32(f).unwrap().load(Ordering::SeqCst) == 1;
    let t0 = Instant::now();
    while !flags.iter().all(|&f| asleep(f)) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "sleepers never slept"
        );
        std::thread::yield_now();
    }
    // ... and one byte rings them all.
    go.store(true, Ordering::SeqCst);
    host.write_all(&[MSG_BELL]).unwrap();
    for _ in flags {
        // Far longer than a wake-up takes: a sleeper still asleep then slept through it.
        let r = woke.recv_timeout(Duration::from_secs(30));
        assert_eq!(r, Ok(true), "a sleeper slept through the bell");
    }
}

#[test]
fn a_request_gets_its_reply_past_stray_bells_and_a_hang_up_ends_it() {
    let (hub, mut host) = hub();
    // A reply of an earlier hello, before the request: dropped.
    host.write_all(&reply_frame(b"old")).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let answer = std::thread::spawn({
        let mut host = host.try_clone().unwrap();
        move || {
            let mut hello = [0u8; 5];
            host.read_exact(&mut hello).unwrap();
            assert_eq!(&hello, b"hello");
            let mut m = vec![MSG_BELL, MSG_BELL];
            m.extend(reply_frame(b"welcome"));
            host.write_all(&m).unwrap();
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    assert_eq!(hub.request(b"hello", Some(deadline)).unwrap(), b"welcome");
    answer.join().unwrap();
    // The guest's rings of the host's bell reach the port.
    let w = window();
    let ringer = hub.host_bell(&w, 64).unwrap();
    ringer.notify(); // the host does not sleep: no byte
    w.atomic_u32(64).unwrap().store(1, Ordering::SeqCst);
    ringer.notify();
    let mut b = [0u8; 1];
    host.read_exact(&mut b).unwrap();
    assert_eq!(b[0], MSG_BELL);
    host.set_nonblocking(true).unwrap();
    assert!(host.read(&mut b).is_err(), "one byte, not two");
    // The host end goes away (the guest still may write): a request with no deadline
    // fails instead of waiting for ever.
    host.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(matches!(hub.request(b"x", None), Err(GuestError::Closed)));
}
