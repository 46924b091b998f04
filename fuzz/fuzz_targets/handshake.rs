//! The hello parser and its framing (crates/proto/src/handshake.rs): arbitrary bytes arrive on
//! a Unix socket as the daemon reads a guest's first message, with `recv_json_until`, then
//! whatever parsed goes through what the daemon does with a hello before it admits a guest
//! (the name sanitized for logs, the window layout validated). Errors are fine; a panic, a
//! hang or an allocation beyond the frame limit is not.

#![no_main]

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use virtsoc_proto::handshake::{recv_json_until, Hello, Reply, MAX_FRAME};
use virtsoc_proto::WindowLayout;

fuzz_target!(|data: &[u8]| {
    // The first byte picks what the socket carries: the raw bytes (length prefix included),
    // or a well-formed frame around the rest (to reach the JSON parser with every input).
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let wire: Vec<u8> = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let mut v = (rest.len() as u32).to_le_bytes().to_vec();
        v.extend_from_slice(rest);
        v
    };
    if wire.len() > MAX_FRAME + 64 {
        return;
    }
    let (mut a, b) = UnixStream::pair().expect("socketpair");
    // The socket buffer holds a whole frame; the writer hangs up so a short frame reads EOF.
    let _ = a.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = a.write_all(&wire);
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(5);
    if mode & 2 == 0 {
        if let Ok((hello, fd)) = recv_json_until::<Hello>(&b, deadline) {
            assert!(fd.is_none(), "no descriptor was sent");
            let name = virtsoc_host::daemon::sanitize_name(&hello.name);
            assert!(!name.contains('\n'), "a sanitized name is one log line");
            let _ = WindowLayout::new(hello.window_size, hello.sq_entries, hello.cq_entries)
                .map(|l| l.data_size());
            // What a host answers must parse back on the guest side.
            let echo = serde_json::to_vec(&hello).expect("serialize");
            let back: Hello = serde_json::from_slice(&echo).expect("round trip");
            assert_eq!(back.name, hello.name);
        }
    } else if let Ok((Reply::Welcome { layout, .. }, _)) = recv_json_until::<Reply>(&b, deadline) {
        // The guest's side of the handshake parses the daemon's answer.
        let _ = layout.validate().map(|_| layout.data_size());
    }
});
