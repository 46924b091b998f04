//! Unit tests of `daemon`.

use super::*;

#[test]
fn token_comparison() {
    assert!(constant_time_eq(b"secret", b"secret"));
    assert!(!constant_time_eq(b"secret", b"secreT"));
    assert!(!constant_time_eq(b"secret", b"secret2"));
    assert!(!constant_time_eq(b"", b"x"));
}

#[test]
fn guest_names_are_sanitized() {
    assert_eq!(sanitize_name("camera-app"), "camera-app");
    assert_eq!(
        sanitize_name("x\r\nFAKE LOG LINE\u{1b}[31m"),
        "x\\r\\nFAKE LOG LINE\\u{1b}[31m"
    );
    assert!(!sanitize_name("a\u{202e}b").contains('\u{202e}'));
    let long = sanitize_name(&"é".repeat(1000));
    assert_eq!(long, format!("{}...", "é".repeat(MAX_NAME_CHARS)));
}

fn hello(name: &str) -> Hello {
    Hello {
        protocol: PROTOCOL_VERSION,
        name: name.into(),
        window_size: 1 << 20,
        sq_entries: 8,
        cq_entries: 8,
        token: None,
        coherence: None,
        resume: None,
    }
}

/// A connection whose thread cannot start is refused; the daemon keeps serving.
#[test]
fn a_failed_thread_start_refuses_only_that_connection() {
    let dir = std::env::temp_dir().join(format!("virtsoc-daemon-ut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("d.sock");
    let _ = std::fs::remove_file(&socket);
    let daemon = Daemon::new(DaemonConfig {
        socket: socket.clone(),
        devices: crate::device::registry::DeviceConfig {
            gpu: crate::device::registry::GpuBackendKind::Null,
            isp: crate::device::registry::IspBackendKind::Null,
            ..Default::default()
        },
        ..DaemonConfig::default()
    })
    .unwrap();
    let listener = UnixListener::bind(&socket).unwrap();
    let (stop_rx, stop_tx) = UnixStream::pair().unwrap();
    let server = {
        let d = daemon.clone();
        std::thread::spawn(move || d.serve(listener, None, OwnedFd::from(stop_rx)))
    };
    FAIL_SPAWNS.store(1, Ordering::SeqCst);
    let s = UnixStream::connect(&socket).unwrap();
    send_json(&s, &hello("first"), None).unwrap();
    let (reply, _): (Reply, _) = virtsoc_proto::handshake::recv_json(&s).unwrap();
    assert!(
        matches!(&reply, Reply::Refused { reason } if reason.contains("thread")),
        "{reply:?}"
    );
    // A guest whose session thread cannot start hears why, instead of a welcome followed by
    // a hang-up.
    FAIL_SESSION_SPAWNS.store(1, Ordering::SeqCst);
    let s = UnixStream::connect(&socket).unwrap();
    send_json(&s, &hello("no-session"), None).unwrap();
    let (reply, _): (Reply, _) = virtsoc_proto::handshake::recv_json(&s).unwrap();
    assert!(
        matches!(&reply, Reply::Refused { reason } if reason.contains("session thread")),
        "{reply:?}"
    );
    let s = UnixStream::connect(&socket).unwrap();
    send_json(&s, &hello("second"), None).unwrap();
    let (reply, fd): (Reply, _) = virtsoc_proto::handshake::recv_json(&s).unwrap();
    assert!(matches!(reply, Reply::Welcome { .. }), "{reply:?}");
    assert!(fd.is_some());
    drop((s, fd));
    rustix::io::write(&stop_tx, b"x").unwrap();
    server.join().unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while daemon.connection_count() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(daemon.connection_count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A refused guest reads these words in its `Refused` reply (and `hardening` tests match
/// on them): the typed refusal keeps the texts the daemon sent as strings before.
#[test]
fn refusals_read_as_before() {
    assert_eq!(
        AdmitError::Protocol { asked: 1 }.to_string(),
        format!("protocol 1 not supported (daemon speaks {PROTOCOL_VERSION})")
    );
    assert_eq!(
        AdmitError::TooManyConnections { max: 3 }.to_string(),
        "too many connections: the daemon serves at most 3 guests at once"
    );
    let window = virtsoc_proto::ProtoError::Handshake("x".into());
    assert_eq!(
        AdmitError::Window(window).to_string(),
        "cannot create window: bad handshake: x"
    );
    let svm = virtsoc_svm::SvmError::BadArgument("y".into());
    assert_eq!(AdmitError::Coherence(svm).to_string(), "bad argument: y");
    assert_eq!(AdmitError::Resume("z".into()).to_string(), "z");
    assert_eq!(
        AdmitError::Moved.to_string(),
        "this session moved to another daemon with the VM's port"
    );
}
