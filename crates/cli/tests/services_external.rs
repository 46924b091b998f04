//! Host programs' services (issue 29, item 1): a separate process registers a service over
//! the daemon's services socket and serves guests' calls (inline, on regions, in packets)
//! under the same policy and deadlines as the built-in services; when it dies, hangs or
//! lies, its guests get errors (not hangs) and the other services go on; registering again
//! resumes service; only trusted programs may register.
//!
//! The programs are this test binary run again with `VIRTSOC_SERVICE_CHILD` set (the
//! `child_program` test), so each can be killed on its own.

mod common;

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use common::{status_of, virtsoc, Daemon, TempDir};
use virtsoc_guest::services::{Geo, ServiceChannel};
use virtsoc_guest::{ConnectOptions, Connection, Status};
use virtsoc_services::external::client::{CallMeta, Handler, Options, ServiceHost};
use virtsoc_services::hypervisor::CallInfo;
use virtsoc_services::ServiceError;

const CHILD: &str = "VIRTSOC_SERVICE_CHILD";

/// The program's calls: 1 upper case, 2 CRC-32, 3 never answers.
struct Upper {
    calls: HashMap<u64, u64>,
}

impl Handler for Upper {
    fn call(
        &mut self,
        meta: &CallMeta,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<(usize, [u64; 4]), ServiceError> {
        let n = self.calls.entry(meta.guest).or_default();
        *n += 1;
        match meta.call {
            1 => {
                let out = output
                    .get_mut(..input.len())
                    .ok_or_else(|| ServiceError::BadArgument("no room".into()))?;
                out.copy_from_slice(input);
                out.make_ascii_uppercase();
                Ok((input.len(), [input.len() as u64, *n, 0, 0]))
            }
            2 => Ok((
                0,
                [u64::from(crc32fast::hash(input)), input.len() as u64, 0, 0],
            )),
            3 => loop {
                std::thread::park();
            },
            _ => Err(ServiceError::BadArgument("no such call".into())),
        }
    }

    fn control(
        &mut self,
        op: &str,
        _: &serde_json::Value,
    ) -> Result<serde_json::Value, ServiceError> {
        match op {
            "stats" => Ok(serde_json::json!({ "guests": self.calls.len() })),
            _ => Err(ServiceError::BadArgument(format!("no operation {op}"))),
        }
    }
}

fn declared() -> Vec<CallInfo> {
    ["upper", "crc", "hang"]
        .iter()
        .enumerate()
        .map(|(i, n)| CallInfo {
            call: i as u32 + 1,
            name: Cow::Borrowed(n),
            doc: Cow::Borrowed(""),
        })
        .collect()
}

/// The program's side: registers (`VIRTSOC_SERVICE_CHILD` = the services socket), says
/// `REGISTERED` or `REFUSED ...` on stdout, and serves (or lies, `VIRTSOC_SERVICE_LIAR`).
#[test]
fn child_program() {
    let Ok(socket) = std::env::var(CHILD) else {
        return;
    };
    if std::env::var("VIRTSOC_SERVICE_LIAR").is_ok() {
        return liar(&socket);
    }
    let opts = Options {
        token: std::env::var("VIRTSOC_SERVICE_TOKEN").ok(),
        ..Options::default()
    };
    match ServiceHost::register(&socket, "upper", &declared(), &opts) {
        Ok(mut host) => {
            println!("REGISTERED");
            let _ = host.serve(&mut Upper {
                calls: HashMap::new(),
            });
        }
        Err(e) => println!("REFUSED {e}"),
    }
}

/// A program speaking the frames by hand (as one in another language would) that answers
/// every call with one byte more output than it was given room for.
fn liar(socket: &str) {
    use virtsoc_proto::handshake::{recv_json, send_json};
    use virtsoc_services::external::{Answer, FromProgram, Registration, ToProgram};
    let sock = std::os::unix::net::UnixStream::connect(socket).unwrap();
    let reg = Registration {
        name: "upper".into(),
        calls: declared(),
        token: None,
        slots: Some(1),
        slot_bytes: Some(1 << 20),
    };
    send_json(&sock, &FromProgram::Register(reg), None).unwrap();
    let (r, fd) = recv_json::<ToProgram>(&sock).unwrap();
    assert!(
        matches!(r, ToProgram::Registered { slots: 1, .. }) && fd.is_some(),
        "{r:?}"
    );
    println!("REGISTERED");
    while let Ok((
        ToProgram::Call {
            id,
            output_capacity,
            ..
        },
        _,
    )) = recv_json(&sock)
    {
        let a = Answer {
            id,
            len: output_capacity + 1,
            ..Answer::default()
        };
        if send_json(&sock, &FromProgram::Reply(a), None).is_err() {
            break;
        }
    }
}

/// A program process, and the first line it said.
struct Program {
    child: Child,
    said: String,
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn program(d: &Daemon, token: Option<&str>, uid: Option<u32>) -> Program {
    program_as(d, token, uid, false)
}

fn program_as(d: &Daemon, token: Option<&str>, uid: Option<u32>, liar: bool) -> Program {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_program",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env(CHILD, services_socket(d))
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    if let Some(t) = token {
        cmd.env("VIRTSOC_SERVICE_TOKEN", t);
    }
    if let Some(u) = uid {
        cmd.uid(u).gid(u);
    }
    if liar {
        cmd.env("VIRTSOC_SERVICE_LIAR", "1");
    }
    let mut child = cmd.spawn().expect("start the program");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut said = String::new();
    loop {
        said.clear();
        if out.read_line(&mut said).unwrap() == 0 {
            break;
        }
        // The harness's "test child_program ... " may lead the line.
        if let Some(at) = said.find("REGISTERED").or_else(|| said.find("REFUSED")) {
            said.drain(..at);
            break;
        }
    }
    Program { child, said }
}

fn services_socket(d: &Daemon) -> String {
    format!("{}.services", d.socket().display())
}

fn guest(d: &Daemon, name: &str) -> Connection {
    Connection::connect(
        d.socket(),
        &ConnectOptions {
            name: name.into(),
            window_size: 64 << 20,
            ..ConnectOptions::default()
        },
    )
    .expect("connect")
}

fn ctl(d: &Daemon, args: &[&str]) -> serde_json::Value {
    let s = d.socket().to_string_lossy().into_owned();
    let mut all = vec!["ctl", "--socket", s.as_str()];
    all.extend_from_slice(args);
    let out = virtsoc(&all);
    // The console's JSON, then "OK".
    serde_json::from_str(out.trim_end().trim_end_matches("OK")).unwrap()
}

fn upper_status(d: &Daemon) -> serde_json::Value {
    ctl(d, &["services"])["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "upper")
        .cloned()
        .expect("upper listed")
}

#[test]
fn a_host_program_serves_guests_under_the_same_rules() {
    let dir = TempDir::new("services-ext");
    let policy = dir.0.join("services.json");
    std::fs::write(
        &policy,
        r#"{"allow": {"*": ["*"], "jail": ["geo"]}, "call_timeout_ms": 500}"#,
    )
    .unwrap();
    let d = Daemon::start(&["--services-policy", policy.to_str().unwrap()]);
    let mut p = program(&d, None, None);
    assert!(p.said.starts_with("REGISTERED"), "{}", p.said);
    let s = upper_status(&d);
    assert_eq!(
        (s["external"].as_bool(), s["calls"][0]["name"].as_str()),
        (Some(true), Some("upper"))
    );

    let c = guest(&d, "phone");
    let mut up = ServiceChannel::open(&c, "upper").unwrap();
    let r = up.call(1, b"hello, host").unwrap();
    assert_eq!((r.output.as_slice(), r.values[1]), (&b"HELLO, HOST"[..], 1));
    // In place: a region in, a region out (the program sees the bytes in its memfd).
    let text = b"in a region".repeat(1000);
    let (inr, outr) = (
        c.alloc_blob(text.len() as u64).unwrap().id,
        c.alloc_blob(text.len() as u64).unwrap().id,
    );
    common::cpu_write(&c, inr, &text);
    up.call_region(1, (inr, 0, text.len() as u64), Some((outr, 0)))
        .unwrap();
    assert_eq!(
        common::cpu_read(&c, outr, text.len()),
        text.to_ascii_uppercase()
    );
    // In packets: 1 MiB + 3 reassembled by the daemon, then handed over.
    let big: Vec<u8> = (0..(1 << 20) + 3u32).map(|i| (i % 241) as u8).collect();
    let v = up.call(2, &big).unwrap().values;
    assert_eq!(
        (v[0], v[1]),
        (u64::from(crc32fast::hash(&big)), big.len() as u64)
    );
    // The program's control operation, through the control API.
    assert_eq!(
        ctl(&d, &["services", "call", "upper", "stats"])["guests"],
        1
    );
    // The policy holds for it as for the built-in ones.
    let jail = guest(&d, "jail");
    assert_eq!(
        status_of(ServiceChannel::open(&jail, "upper")),
        Status::PermissionDenied
    );
    let mut geo = Geo::open(&jail).unwrap();

    // A program that answers more output than it was given room for is cut off.
    drop(p);
    p = program_as(&d, None, None, true);
    assert!(p.said.starts_with("REGISTERED"), "{}", p.said);
    assert_eq!(status_of(up.call(1, b"x")), Status::DeviceError);
    assert_eq!(upper_status(&d)["status"]["connected"], false);
    assert_eq!(
        status_of(up.call(1, b"x")),
        Status::DeviceError,
        "until it registers again"
    );
    drop(p);

    // Registering again resumes service on the same channel.
    p = program(&d, None, None);
    assert!(p.said.starts_with("REGISTERED"), "{}", p.said);
    assert_eq!(up.call(1, b"back").unwrap().output, b"BACK");
    // A second live registration of the name is refused.
    let twin = program(&d, None, None);
    assert!(twin.said.contains("already registered"), "{}", twin.said);
    drop(twin);

    // A program that hangs: its guest gets an error at the deadline, not a hang; the
    // other services go on meanwhile.
    let t0 = std::time::Instant::now();
    let e = up.call(3, b"never").unwrap_err();
    assert_eq!(status_of::<()>(Err(e)), Status::Busy);
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        t0.elapsed()
    );
    assert!(geo.fix().is_ok());
    p.child.kill().unwrap();
    p.child.wait().unwrap();

    // A program that dies: the next call fails at once.
    p = program(&d, None, None);
    assert_eq!(up.call(1, b"alive").unwrap().output, b"ALIVE");
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    assert_eq!(status_of(up.call(1, b"dead")), Status::DeviceError);
    assert!(geo.fix().is_ok());
    up.close().unwrap();
}

#[test]
fn only_trusted_programs_register() {
    let dir = TempDir::new("services-trust");
    let token = dir.0.join("token");
    std::fs::write(&token, "s3cret-services-token\n").unwrap();
    let d = Daemon::start(&["--token-file", token.to_str().unwrap()]);
    // The daemon's own user may.
    let p = program(&d, None, None);
    assert!(p.said.starts_with("REGISTERED"), "{}", p.said);
    drop(p);
    if !rustix::process::geteuid().is_root() {
        eprintln!("not root: the other user's registrations are not tried");
        return;
    }
    // Another user may reach the socket (made world-writable here), but registers only
    // with the daemon's token.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(services_socket(&d), std::fs::Permissions::from_mode(0o666)).unwrap();
    let nobody = 65534;
    let p = program(&d, None, Some(nobody));
    assert!(p.said.contains("token"), "{}", p.said);
    let p = program(&d, Some("guess"), Some(nobody));
    assert!(p.said.contains("wrong token"), "{}", p.said);
    let p = program(&d, Some("s3cret-services-token"), Some(nobody));
    assert!(p.said.starts_with("REGISTERED"), "{}", p.said);
}

#[test]
fn remote_guests_are_told_channels_need_a_process_guest() {
    let dir = TempDir::new("services-remote");
    let token = dir.0.join("token");
    std::fs::write(&token, "s3cret-services-token\n").unwrap();
    let d = Daemon::start(&[
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        token.to_str().unwrap(),
    ]);
    let remote = Connection::open(
        &format!("tcp:{}", d.tcp.as_ref().unwrap()),
        &ConnectOptions {
            token: Some("s3cret-services-token".into()),
            window_size: 32 << 20,
            ..ConnectOptions::default()
        },
    )
    .unwrap();
    // Its window is a copy the futex doorbells of a channel cannot ring through.
    assert_eq!(status_of(Geo::open(&remote)), Status::NotSupported);
    assert!(remote.nop().is_ok(), "the session goes on");
}
