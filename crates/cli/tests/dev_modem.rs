//! Integration tests of the modem device through a real daemon: an AT session (registration,
//! signal, an SMS, a voice call), independent modems for two guests, and bad writes.

mod common;

use std::time::{Duration, Instant};

use common::{modem_read_once, modem_send, Daemon};
use virtsoc_guest::devices::modem::Write;
use virtsoc_guest::{ConnectOptions, Connection, Status};

fn connect(d: &Daemon) -> Connection {
    Connection::connect(
        d.socket(),
        &ConnectOptions {
            window_size: 16 << 20,
            ..ConnectOptions::default()
        },
    )
    .expect("connect")
}

/// Reads until the output ends with a final result code or the SMS prompt (bounded).
fn response(c: &Connection) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = Vec::new();
    loop {
        let b = modem_read_once(c);
        if b.is_empty() {
            let s = String::from_utf8_lossy(&out);
            if ["OK\r\n", "ERROR\r\n", "\r\n> "]
                .iter()
                .any(|end| s.ends_with(end))
                || s.contains("ERROR:")
            {
                return s.into_owned();
            }
            assert!(Instant::now() < deadline, "no final result code in {s:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
        out.extend(b);
    }
}

fn at(c: &Connection, line: &str) -> String {
    modem_send(c, line.as_bytes());
    response(c)
}

#[test]
fn an_at_session_registers_texts_and_calls() {
    let d = Daemon::start(&[]);
    let c = connect(&d);
    // The modem powers up with echo on.
    assert_eq!(at(&c, "ATE0\r"), "ATE0\r\r\nOK\r\n");
    assert_eq!(at(&c, "AT\r"), "\r\nOK\r\n");
    assert_eq!(
        at(&c, "AT+CREG?\r"),
        "\r\n+CREG: 0,1\r\n\r\nOK\r\n",
        "registered, home"
    );
    assert_eq!(at(&c, "AT+CSQ\r"), "\r\n+CSQ: 20,99\r\n\r\nOK\r\n");

    // An SMS in text mode: the prompt, the text, Ctrl-Z.
    assert_eq!(at(&c, "AT+CMGF=1\r"), "\r\nOK\r\n");
    assert_eq!(at(&c, "AT+CMGS=\"+15551234567\"\r"), "\r\n> ");
    let sent = at(&c, "Hello from a virtsoc phone, over the AT channel\x1a");
    assert!(
        sent.starts_with("\r\n+CMGS: ") && sent.ends_with("\r\n\r\nOK\r\n"),
        "{sent:?}"
    );

    // A voice call: dial, it is listed, hang up, it is gone.
    assert_eq!(at(&c, "ATD+15550000;\r"), "\r\nOK\r\n");
    let calls = at(&c, "AT+CLCC\r");
    assert!(
        calls.contains("+CLCC: 1,0,") && calls.contains("\"+15550000\",145"),
        "{calls:?}"
    );
    assert_eq!(at(&c, "ATH\r"), "\r\nOK\r\n");
    assert_eq!(at(&c, "AT+CLCC\r"), "\r\nOK\r\n", "no call any more");

    // Unknown commands are errors, and the modem goes on.
    assert_eq!(at(&c, "AT+NOPE\r"), "\r\nERROR\r\n");
    assert_eq!(at(&c, "AT\r"), "\r\nOK\r\n");
    assert!(modem_read_once(&c).is_empty(), "nothing left over");
}

#[test]
fn guests_have_independent_modems() {
    let d = Daemon::start(&[]);
    let a = connect(&d);
    let b = connect(&d);
    assert_eq!(at(&a, "ATE0\r"), "ATE0\r\r\nOK\r\n");
    // b's modem still echoes, and holds no output of a's.
    assert!(modem_read_once(&b).is_empty());
    assert_eq!(at(&b, "AT\r"), "AT\r\r\nOK\r\n");
    assert_eq!(at(&a, "AT\r"), "\r\nOK\r\n");
    // A call on a's modem is not on b's.
    assert_eq!(at(&a, "ATD5551234;\r"), "\r\nOK\r\n");
    assert_eq!(at(&b, "ATE0\r"), "ATE0\r\r\nOK\r\n");
    assert_eq!(at(&b, "AT+CLCC\r"), "\r\nOK\r\n");
    assert!(at(&a, "AT+CLCC\r").contains("\"5551234\""));
    // Unread output stays with its guest across the other's commands.
    modem_send(&a, b"AT+CSQ\r");
    assert_eq!(at(&b, "AT+CSQ\r"), "\r\n+CSQ: 20,99\r\n\r\nOK\r\n");
    assert_eq!(response(&a), "\r\n+CSQ: 20,99\r\n\r\nOK\r\n");
}

#[test]
fn oversized_writes_are_refused() {
    let d = Daemon::start(&[]);
    let c = connect(&d);
    let err = c
        .command(&Write {
            len: 33,
            b0: 0x0d_54_41,
            b1: 0,
            b2: 0,
            b3: 0,
        })
        .expect_err("33 bytes do not fit four words");
    assert_eq!(err.status(), Status::BadArgument);
    let err = c
        .command(&Write {
            len: u64::MAX,
            ..Write::default()
        })
        .expect_err("absurd length");
    assert_eq!(err.status(), Status::BadArgument);
    assert!(modem_read_once(&c).is_empty(), "nothing was fed");
    // An empty write and a full 32-byte one are fine.
    assert_eq!(
        c.command(&Write::default()).unwrap().accepted,
        0,
        "empty write"
    );
    assert_eq!(at(&c, "ATE0\r"), "ATE0\r\r\nOK\r\n");
    let line = "AT+CSQ;+CREG?;+CSQ;+CREG?;+CGMI\r";
    assert_eq!(line.len(), 32);
    let reply = at(&c, line);
    assert!(
        reply.starts_with("\r\n+CSQ: 20,99\r\n") && reply.ends_with("OK\r\n"),
        "{reply:?}"
    );
}
