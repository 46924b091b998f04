//! Remote (TCP) guests resume their session after a daemon restart (`--state-dir`): each
//! session's welcome carries a random resume secret, which a reconnecting remote guest must
//! present (with the operator's token) to prove it is the same guest; the library reconnects
//! by itself and finds the same region ids, bytes and fence states. A wrong secret is refused
//! with a clear error, and so is a secret without the token.

mod common;

use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use common::{cpu_read, cpu_write, free_port, guest_state, pattern, Daemon};
use virtsoc_guest::{ConnectOptions, Connection, DeviceId};
use virtsoc_proto::handshake::{recv_json, send_json, Hello, Reply, PROTOCOL_VERSION};

const TOKEN: &str = "remote-resume-token-0123456789ab";

fn opts() -> ConnectOptions {
    ConnectOptions {
        token: Some(TOKEN.into()),
        window_size: 32 << 20,
        ..ConnectOptions::default()
    }
}

struct Setup {
    dir: PathBuf,
    token_file: PathBuf,
    addr: String,
    args: Vec<String>,
}

impl Setup {
    fn new(tag: &str) -> Setup {
        let base = std::env::temp_dir().join(format!("virtsoc-rres-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let token_file = base.join("token");
        std::fs::write(&token_file, TOKEN).unwrap();
        let dir = base.join("state");
        let addr = format!("127.0.0.1:{}", free_port());
        let args = [
            "--gpu-backend",
            "null",
            "--isp-backend",
            "null",
            "--listen",
            &addr,
            "--token-file",
            token_file.to_str().unwrap(),
            "--state-dir",
            dir.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec();
        Setup {
            dir,
            token_file,
            addr,
            args,
        }
    }

    fn start(&self, socket: Option<PathBuf>) -> Daemon {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        Daemon::start_with(&[], socket, &args)
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.token_file);
        if let Some(base) = self.dir.parent() {
            let _ = std::fs::remove_dir_all(base);
        }
    }
}

/// A raw hello on TCP presenting `resume` (and `token`); the daemon's answer.
fn hello(addr: &str, token: Option<&str>, resume: &str) -> Reply {
    let sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let h = Hello {
        protocol: PROTOCOL_VERSION,
        name: "impostor".into(),
        window_size: 1 << 20,
        sq_entries: 64,
        cq_entries: 64,
        token: token.map(str::to_string),
        coherence: None,
        resume: Some(resume.into()),
    };
    send_json(&sock, &h, None).unwrap();
    recv_json::<Reply>(&sock).unwrap().0
}

#[test]
fn a_remote_guest_goes_on_across_a_daemon_restart_with_its_secret() {
    let s = Setup::new("restart");
    let mut a = s.start(None);
    let socket = a.socket().to_path_buf();
    let g = Connection::open(&format!("tcp:{}", s.addr), &opts()).unwrap();
    let secret = g
        .resume_secret()
        .expect("a remote guest gets a resume secret");
    assert!(secret.len() >= 32, "{secret}");
    g.set_auto_reconnect(Some(Duration::from_secs(60)));
    let sizes = [1usize << 20, 5000];
    let (ids, done, pending) = guest_state(&g, &sizes, &[0, 1]);

    // A second remote guest's secret is another one.
    let other = Connection::open(&format!("tcp:{}", s.addr), &opts()).unwrap();
    assert_ne!(other.resume_secret().unwrap(), secret);
    drop(other);

    assert!(a.terminate().success());
    drop(a);
    let b = s.start(Some(socket));

    // A wrong secret, and the right one without the token, are refused.
    match hello(&s.addr, Some(TOKEN), &"0".repeat(32)) {
        Reply::Refused { reason } => assert!(reason.contains("resume secret"), "{reason}"),
        r => panic!("a wrong secret was not refused: {r:?}"),
    }
    match hello(&s.addr, None, &secret) {
        Reply::Refused { reason } => assert!(reason.contains("token"), "{reason}"),
        r => panic!("a secret without the token was not refused: {r:?}"),
    }

    // The guest reconnects by itself and finds everything.
    for (i, (&id, &n)) in ids.iter().zip(&sizes).enumerate() {
        assert_eq!(cpu_read(&g, id, n), pattern(n, i as u8), "region {id}");
    }
    assert!(g.fence_signaled(done).unwrap());
    assert!(!g.fence_signaled(pending).unwrap());
    assert_eq!(g.usage().unwrap().0, 2);
    g.fence_signal(DeviceId::CPU, pending).unwrap();
    g.nop().unwrap();
    assert!(g.fence_signaled(pending).unwrap());
    cpu_write(&g, ids[1], &pattern(sizes[1], 77));
    assert_eq!(cpu_read(&g, ids[1], sizes[1]), pattern(sizes[1], 77));

    // The session is claimed: its secret does not resume it a second time.
    let again = g.resume_secret().unwrap();
    match hello(&s.addr, Some(TOKEN), &again) {
        Reply::Refused { reason } => assert!(reason.contains("resume secret"), "{reason}"),
        r => panic!("a claimed session was resumed twice: {r:?}"),
    }
    drop(b);
}
