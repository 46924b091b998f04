//! Transcript tests: whole AT sessions written as readable scripts.
//!
//! Each transcript is a list of lines:
//!
//! | line            | meaning                                                        |
//! |-----------------|----------------------------------------------------------------|
//! | `# ...`         | comment                                                        |
//! | `% echo on`     | (first lines only) start with echo on; also `% auto_answer MS`, `% capacity N` |
//! | `> CMD`         | the guest sends `CMD` followed by CR                           |
//! | `>> RAW`        | the guest sends `RAW` as is                                    |
//! | `< TEXT`        | the modem answers the line `\r\nTEXT\r\n`                      |
//! | `<< RAW`        | the modem answers exactly `RAW`                                |
//! | `<>`            | the modem answers the SMS prompt `\r\n> `                      |
//! | `! ACTION ...`  | a host action that must succeed                                |
//! | `!! ACTION ...` | a host action that must fail                                   |
//! | `= sent TO TXT` | the next message the guest sent went to `TO` with text `TXT`   |
//! | `= sent-count N`| the guest sent `N` messages in all                             |
//!
//! Host actions: `register home|roaming|none|searching|denied`,
//! `signal RSSI BER`, `sms FROM TEXT...`, `call FROM`, `answer`, `hangup`,
//! `time MS` (advance the modem clock to MS milliseconds).
//!
//! Escapes in `>`, `>>`, `<<` and `= sent`: `\r`, `\n`, `\\`, `\xNN`,
//! `^Z` (0x1A), `^[` (ESC), and `{C*N}` for the byte `C` repeated `N` times.
//!
//! Every answer must be matched: output still unmatched when the guest
//! sends again, the host acts, or the transcript ends, fails the test.

use virtsoc_modem::{Modem, ModemConfig, RegState};

const MS: u64 = 1_000_000;

fn decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => {
                match b.get(i + 1) {
                    Some(b'r') => out.push(b'\r'),
                    Some(b'n') => out.push(b'\n'),
                    Some(b'\\') => out.push(b'\\'),
                    Some(b'x') => {
                        let hex = &s[i + 2..i + 4];
                        out.push(u8::from_str_radix(hex, 16).expect("bad \\x escape"));
                        i += 2;
                    }
                    other => panic!("bad escape {other:?} in {s:?}"),
                }
                i += 2;
            }
            b'^' if b.get(i + 1) == Some(&b'Z') => {
                out.push(0x1a);
                i += 2;
            }
            b'^' if b.get(i + 1) == Some(&b'[') => {
                out.push(0x1b);
                i += 2;
            }
            b'{' => {
                let end = i + s[i..].find('}').expect("unterminated {C*N}");
                let (c, n) = s[i + 1..end].split_once('*').expect("{C*N}");
                let n: usize = n.parse().expect("{C*N} count");
                out.resize(out.len() + n, c.as_bytes()[0]);
                i = end + 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

fn show(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}

fn host(m: &mut Modem, action: &str) -> Result<(), String> {
    let (verb, rest) = action.split_once(' ').unwrap_or((action, ""));
    let err = |e: virtsoc_modem::ModemError| e.to_string();
    match verb {
        "register" => {
            let state = match rest {
                "home" => RegState::Home,
                "roaming" => RegState::Roaming,
                "none" => RegState::NotRegistered,
                "searching" => RegState::Searching,
                "denied" => RegState::Denied,
                _ => panic!("unknown registration {rest:?}"),
            };
            m.set_registered(state);
            Ok(())
        }
        "signal" => {
            let (r, b) = rest.split_once(' ').expect("signal RSSI BER");
            m.set_signal(r.parse().unwrap(), b.parse().unwrap())
                .map_err(err)
        }
        "sms" => {
            let (from, text) = rest.split_once(' ').expect("sms FROM TEXT");
            m.deliver_sms(from, text).map(|_| ()).map_err(err)
        }
        "call" => m.incoming_call(rest).map_err(err),
        "answer" => m.remote_answer().map_err(err),
        "hangup" => m.remote_hangup().map_err(err),
        "time" => {
            m.advance(rest.parse::<u64>().expect("time MS") * MS);
            Ok(())
        }
        _ => panic!("unknown host action {verb:?}"),
    }
}

fn run_transcript(name: &str, script: &str) {
    let mut cfg = ModemConfig {
        echo: false,
        auto_answer_ns: None,
        dial_to_alert_ns: 1000 * MS,
        ring_interval_ns: Some(3000 * MS),
        ..ModemConfig::default()
    };
    let mut lines = script.lines().enumerate().peekable();
    while let Some((_, l)) = lines.peek() {
        let l = l.trim();
        if let Some(d) = l.strip_prefix("% ") {
            let (k, v) = d.split_once(' ').expect("% KEY VALUE");
            match k {
                "echo" => cfg.echo = v == "on",
                "auto_answer" => cfg.auto_answer_ns = Some(v.parse::<u64>().unwrap() * MS),
                "capacity" => cfg.sms_capacity = v.parse().unwrap(),
                _ => panic!("{name}: unknown directive {k}"),
            }
        } else if !l.is_empty() {
            break;
        }
        lines.next();
    }

    let mut m = Modem::new(cfg);
    let mut out: Vec<u8> = Vec::new();
    let mut sent_checked = 0;
    for (n, line) in lines {
        let n = n + 1;
        let line = line.trim_start();
        let at = || format!("{name}:{n}: {line:?}");
        let drained = |out: &Vec<u8>| {
            assert!(
                out.is_empty(),
                "{}: unmatched output before this step: {}",
                at(),
                show(out)
            );
        };
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let expect = |out: &mut Vec<u8>, want: Vec<u8>| {
            assert!(
                out.starts_with(&want),
                "{}\n  expected: {}\n  got:      {}",
                at(),
                show(&want),
                show(out)
            );
            out.drain(..want.len());
        };
        if let Some(raw) = line.strip_prefix(">> ") {
            drained(&out);
            m.feed(&decode(raw));
        } else if let Some(cmd) = line.strip_prefix("> ") {
            drained(&out);
            let mut bytes = decode(cmd);
            bytes.push(b'\r');
            m.feed(&bytes);
        } else if line == "<>" {
            expect(&mut out, b"\r\n> ".to_vec());
        } else if let Some(raw) = line.strip_prefix("<< ") {
            expect(&mut out, decode(raw));
        } else if let Some(text) = line.strip_prefix("< ") {
            let mut want = b"\r\n".to_vec();
            want.extend_from_slice(text.as_bytes());
            want.extend_from_slice(b"\r\n");
            expect(&mut out, want);
        } else if let Some(action) = line.strip_prefix("!! ") {
            drained(&out);
            assert!(host(&mut m, action).is_err(), "{}: should fail", at());
        } else if let Some(action) = line.strip_prefix("! ") {
            drained(&out);
            if let Err(e) = host(&mut m, action) {
                panic!("{}: host action failed: {e}", at());
            }
        } else if let Some(check) = line.strip_prefix("= sent ") {
            if let Some(count) = check.strip_prefix("count ") {
                assert_eq!(
                    m.sent_messages().len(),
                    count.parse::<usize>().unwrap(),
                    "{}",
                    at()
                );
            } else {
                let (to, text) = check.split_once(' ').expect("= sent TO TEXT");
                let sent = m
                    .sent_messages()
                    .get(sent_checked)
                    .unwrap_or_else(|| panic!("{}: no message sent", at()));
                assert_eq!(sent.to, to, "{}", at());
                assert_eq!(sent.text.as_bytes(), decode(text).as_slice(), "{}", at());
                sent_checked += 1;
            }
        } else {
            panic!("{}: unknown transcript line", at());
        }
        out.extend(m.take_output());
    }
    assert!(
        out.is_empty(),
        "{name}: unmatched output at end: {}",
        show(&out)
    );
}

const BASICS: &str = r#"
% echo on
> AT
<< AT\r
< OK
> ATE0
<< ATE0\r
< OK
> at
< OK
> ATE1
< OK
> ATV1Q0
<< ATV1Q0\r
< OK
# CRLF line endings: the LF is echoed but is not a second, empty line
>> AT\r\n
<< AT\r
< OK
<< \n
# empty lines are ignored; a bare LF also ends a line
>> \r
<< \r
>> AT\n
<< AT\n
< OK
# backspace edits the line
>> ATX\x08\r
<< ATX\x08\r
< OK
> ATI
<< ATI\r
< virtsoc virtual modem
< OK
# SMS text is echoed as it is typed
> AT+CMGF=1
<< AT+CMGF=1\r
< OK
> AT+CMGS="+15550000"
<< AT+CMGS="+15550000"\r
<>
>> hi^Z
<< hi^Z
< +CMGS: 0
< OK
= sent +15550000 hi
"#;

const ERRORS: &str = r#"
> ATX
< ERROR
> HELLO
< ERROR
> AT+FOO
< ERROR
> AT+CSQ?x
< ERROR
> AT+CMGS="unterminated
< ERROR
> AT+CFUN=7
< ERROR
> AT+CMEE=1
< OK
> AT+CMEE?
< +CMEE: 1
< OK
> AT+CFUN=7
< +CME ERROR: 50
> AT+CMEE=2
< OK
> AT+CFUN=7
< +CME ERROR: incorrect parameters
> AT+CMEE=3
< +CME ERROR: incorrect parameters
> AT+CMEE=?
< +CMEE: (0-2)
< OK
# unknown commands stay a plain ERROR whatever CMEE says
> AT+FOO
< ERROR
# a chain stops at the first failing command; earlier answers stand
> AT+CSQ;+FOO;+CSQ
< +CSQ: 20,99
< ERROR
> AT+CSQ ; +CMEE?
< +CSQ: 20,99
< +CMEE: 2
< OK
"#;

const LINE_LIMITS: &str = r#"
# an over-long line is answered with ERROR as soon as it passes 1 KiB ...
>> AT{A*1030}
< ERROR
# ... and the rest of it, up to CR, is discarded silently
>> MORE JUNK{B*5000}\r
> AT
< OK
# exactly 1 KiB is still a line, one byte more is not
> AT{ *1022}
< OK
> AT{ *1023}
< ERROR
# non-UTF-8 bytes are tolerated
> AT\xff\xfe
< ERROR
> \xc3\x28AT
< ERROR
> AT+CMGF=1
< OK
> AT+CMGS="123"
<>
>> h\xffi^Z
< +CMGS: 0
< OK
= sent 123 h\xef\xbf\xbdi
> AT
< OK
"#;

const REGISTRATION: &str = r#"
> AT+CREG?
< +CREG: 0,1
< OK
> AT+CREG=1
< OK
! register none
< +CREG: 0
# no change, no unsolicited code
! register none
! register roaming
< +CREG: 5
> AT+CREG=2
< OK
> AT+CREG?
< +CREG: 2,5,"1234","00015678"
< OK
! register home
< +CREG: 1,"1234","00015678"
! register searching
< +CREG: 2
> AT+CREG=0
< OK
! register denied
> AT+CREG?
< +CREG: 0,3
< OK
> AT+COPS?
< +COPS: 0
< OK
! register home
> AT+CREG=3
< ERROR
> AT+CREG=?
< +CREG: (0-2)
< OK
> AT+COPS?
< +COPS: 0,0,"Android Virtual Operator"
< OK
> AT+COPS=3,0;+COPS?;+COPS=3,1;+COPS?;+COPS=3,2;+COPS?
< +COPS: 0,0,"Android Virtual Operator"
< +COPS: 0,1,"Android"
< +COPS: 0,2,"310260"
< OK
> AT+COPS=0,1
< OK
> AT+COPS?
< +COPS: 0,1,"Android"
< OK
> AT+CMEE=1
< OK
> AT+COPS=1,2,"310410"
< +CME ERROR: 4
> AT+COPS=?
< +COPS: (2,"Android Virtual Operator","Android","310260"),,(0,3),(0-2)
< OK
"#;

const RADIO_POWER: &str = r#"
> AT+CREG=1
< OK
> AT+CFUN?
< +CFUN: 1
< OK
> AT+CFUN=0
< +CREG: 0
< OK
> AT+CFUN?
< +CFUN: 0
< OK
> AT+CSQ
< +CSQ: 99,99
< OK
> AT+CREG?
< +CREG: 1,0
< OK
> ATD5551234;
< ERROR
> AT+CMEE=1
< OK
> ATD5551234;
< +CME ERROR: 3
!! call 5551234
!! sms 5551234 lost
# the host's registration is remembered while the radio is off
! register roaming
> AT+CFUN=1
< +CREG: 5
< OK
> AT+CFUN=4
< +CREG: 0
< OK
> AT+CFUN=1,0
< +CREG: 5
< OK
> AT+CFUN=?
< +CFUN: (0,1,4),(0)
< OK
"#;

const SIGNAL: &str = r#"
> AT+CSQ
< +CSQ: 20,99
< OK
! signal 31 0
> AT+CSQ
< +CSQ: 31,0
< OK
!! signal 40 0
!! signal 10 8
> AT+CSQ
< +CSQ: 31,0
< OK
! signal 99 99
> AT+CSQ
< +CSQ: 99,99
< OK
> AT+CSQ=?
< +CSQ: (0-31,99),(0-7,99)
< OK
> AT+CSQ?
< ERROR
"#;

const SMS_SEND: &str = r#"
# PDU mode (the default) is not implemented
> AT+CMGF?
< +CMGF: 0
< OK
> AT+CMGS="+15551234"
< +CMS ERROR: 303
> AT+CMGF=?
< +CMGF: (0,1)
< OK
> AT+CMGF=1
< OK
> AT+CMGS="+15551234"
<>
>> Hello^Z
< +CMGS: 0
< OK
= sent +15551234 Hello
# CR inside the text starts a new line with a new prompt
> AT+CMGS="5550000",129
<>
>> two\r
<>
>> lines^Z
< +CMGS: 1
< OK
= sent 5550000 two\nlines
# ESC cancels
> AT+CMGS="5550000"
<>
>> never mind^[
< OK
= sent count 2
> AT+CMGS="12ab!"
< +CMS ERROR: 305
> AT+CMGS="5550000",7
< +CMS ERROR: 305
! register none
> AT+CMGS="5550000"
< +CMS ERROR: 331
! register home
# the network can go away while the guest types
> AT+CMGS="5550000"
<>
! register denied
>> too late^Z
< +CMS ERROR: 331
! register home
# over-long text
> AT+CMGS="5550000"
<>
>> {x*1100}^Z
< +CMS ERROR: 305
= sent count 2
> AT+CMGS=?
< OK
"#;

const SMS_RECEIVE: &str = r#"
! sms +15550001 Hi there
< +CMTI: "SM",1
# reading needs text mode
> AT+CMGL
< +CMS ERROR: 303
> AT+CMGF=1
< OK
! sms Google Your code is 1234
< +CMTI: "SM",2
> AT+CMGR=2
< +CMGR: "REC UNREAD","Google"
< Your code is 1234
< OK
> AT+CMGR=2
< +CMGR: "REC READ","Google"
< Your code is 1234
< OK
> AT+CMGL
< +CMGL: 1,"REC UNREAD","+15550001"
< Hi there
< OK
> AT+CMGL="ALL"
< +CMGL: 1,"REC READ","+15550001"
< Hi there
< +CMGL: 2,"REC READ","Google"
< Your code is 1234
< OK
> AT+CMGL="REC UNREAD"
< OK
> AT+CMGL="BOGUS"
< +CMS ERROR: 305
> AT+CMGL=?
< +CMGL: ("REC UNREAD","REC READ","STO UNSENT","STO SENT","ALL")
< OK
> AT+CMGD=1
< OK
> AT+CMGR=1
< +CMS ERROR: 321
> AT+CMGD=1
< +CMS ERROR: 321
> AT+CMGD=31
< +CMS ERROR: 321
> AT+CMGR=0
< +CMS ERROR: 321
> AT+CMGR=x
< +CMS ERROR: 305
# the lowest free slot is reused
! sms +15550003 refill
< +CMTI: "SM",1
# delflag 1 deletes read messages only
> AT+CMGD=0,1
< OK
> AT+CMGL="ALL"
< +CMGL: 1,"REC UNREAD","+15550003"
< refill
< OK
! sms +15550004 another
< +CMTI: "SM",2
> AT+CMGD=1,4
< OK
> AT+CMGL="ALL"
< OK
> AT+CMGD=?
< +CMGD: (1-30),(0-4)
< OK
! register none
!! sms +15550005 lost
"#;

const SMS_FULL: &str = r#"
% capacity 2
! sms 1 a
< +CMTI: "SM",1
! sms 2 b
< +CMTI: "SM",2
!! sms 3 c
> AT+CMGD=2
< OK
! sms 4 d
< +CMTI: "SM",2
"#;

const OUTGOING_CALL: &str = r#"
> AT+CLCC
< OK
> ATD+15551234;
< OK
> AT+CLCC
< +CLCC: 1,0,2,0,0,"+15551234",145
< OK
! time 999
> AT+CLCC
< +CLCC: 1,0,2,0,0,"+15551234",145
< OK
! time 1000
> AT+CLCC
< +CLCC: 1,0,3,0,0,"+15551234",145
< OK
! answer
> AT+CLCC
< +CLCC: 1,0,0,0,0,"+15551234",145
< OK
# one call at a time
> ATD5550000;
< ERROR
> ATH
< OK
> AT+CLCC
< OK
# data calls are not supported
> ATD5551234
< ERROR
> AT+CMEE=1
< OK
> ATD5551234
< +CME ERROR: 4
> ATD12x;
< +CME ERROR: 25
> ATD;
< +CME ERROR: 25
# the tone-dialing prefix is accepted and stripped
> ATDT5551234;
< OK
> AT+CLCC
< +CLCC: 1,0,2,0,0,"5551234",129
< OK
# the remote side hangs up
! hangup
< NO CARRIER
!! hangup
!! answer
> AT+CLCC
< OK
# dialing without registration
! register none
> ATD5551234;
< +CME ERROR: 30
! register home
# losing registration drops the call
> ATD123;+CLCC
< +CLCC: 1,0,2,0,0,"123",129
< OK
! register searching
< NO CARRIER
"#;

const AUTO_ANSWER: &str = r#"
% auto_answer 2000
> ATD5551234;
< OK
! time 1000
! time 2999
> AT+CLCC
< +CLCC: 1,0,3,0,0,"5551234",129
< OK
! time 3000
> AT+CLCC
< +CLCC: 1,0,0,0,0,"5551234",129
< OK
> AT+CHUP
< OK
> AT+CLCC
< OK
"#;

const INCOMING_CALL: &str = r#"
! call +15557777
< RING
> AT+CLCC
< +CLCC: 1,1,4,0,0,"+15557777",145
< OK
! time 2999
! time 3000
< RING
> ATA
< OK
> AT+CLCC
< +CLCC: 1,1,0,0,0,"+15557777",145
< OK
# no RING once answered
! time 9000
! hangup
< NO CARRIER
> AT+CLIP=1
< OK
> AT+CLIP?
< +CLIP: 1,1
< OK
> AT+CLIP=?
< +CLIP: (0,1)
< OK
! call 5550100
< RING
< +CLIP: "5550100",129
!! call 5550101
! time 12000
< RING
< +CLIP: "5550100",129
# rejecting the call
> AT+CHUP
< OK
> ATA
< ERROR
> AT+CMEE=1
< OK
> ATA
< +CME ERROR: 3
# radio off drops a call
! call 5550100
< RING
< +CLIP: "5550100",129
> AT+CFUN=0
< NO CARRIER
< OK
!! call 5550100
> AT+CFUN=1
< OK
"#;

const SETTINGS: &str = r#"
> ATS0?
< 000
< OK
> ATS0=2
< OK
> ATS0?
< 002
< OK
> ATS0=300
< ERROR
> AT+CMEE=1;+CLIP=1;+CMGF=1;+CREG=2
< OK
> ATZ
< OK
> AT+CMEE?;+CLIP?;+CMGF?;+CREG?
< +CMEE: 0
< +CLIP: 0,1
< +CMGF: 0
< +CREG: 0,1
< OK
> ATS0?
< 000
< OK
> AT+CMEE=2
< OK
> AT&F
< OK
> AT+CMEE?
< +CMEE: 0
< OK
> AT+CGMI;+CGMM;+CGSN
< virtsoc
< virtsoc-modem
< 358240051111110
< OK
> AT&Q
< ERROR
"#;

/// The session reference-ril runs when it attaches, condensed.
const RIL_INIT: &str = r#"
% echo on
> ATE0Q0V1
<< ATE0Q0V1\r
< OK
> ATS0=0
< OK
> AT+CMEE=1
< OK
> AT+CREG=2
< OK
> AT+CFUN?
< +CFUN: 1
< OK
> AT+COPS=3,0;+COPS?;+COPS=3,1;+COPS?;+COPS=3,2;+COPS?
< +COPS: 0,0,"Android Virtual Operator"
< +COPS: 0,1,"Android"
< +COPS: 0,2,"310260"
< OK
> AT+CSQ
< +CSQ: 20,99
< OK
> AT+CGSN
< 358240051111110
< OK
"#;

/// One `#[test]` per transcript.
macro_rules! transcript_tests {
    ($($test:ident => $script:ident),* $(,)?) => {
        $(
            #[test]
            fn $test() {
                run_transcript(stringify!($test), $script);
            }
        )*
    };
}

transcript_tests! {
    basics => BASICS,
    errors => ERRORS,
    line_limits => LINE_LIMITS,
    registration => REGISTRATION,
    radio_power => RADIO_POWER,
    signal => SIGNAL,
    sms_send => SMS_SEND,
    sms_receive => SMS_RECEIVE,
    sms_full => SMS_FULL,
    outgoing_call => OUTGOING_CALL,
    auto_answer => AUTO_ANSWER,
    incoming_call => INCOMING_CALL,
    settings => SETTINGS,
    ril_init => RIL_INIT,
}

/// The runner itself catches a wrong answer and an unmatched one.
#[test]
#[should_panic(expected = "expected")]
fn runner_catches_wrong_answer() {
    run_transcript("wrong", "> AT\n< ERROR");
}

#[test]
#[should_panic(expected = "unmatched output at end")]
fn runner_catches_unmatched_output() {
    run_transcript("unmatched", "> AT");
}

/// Byte-at-a-time delivery gives the same answers as whole lines.
#[test]
fn transcripts_survive_byte_at_a_time_delivery() {
    let session = b"AT+CMGF=1\rAT+CMGS=\"1\"\rab\x1aAT+CSQ\r\nATD1;\rAT+CLCC\r";
    let mut whole = Modem::default();
    whole.feed(session);
    let mut bytewise = Modem::default();
    let mut out = Vec::new();
    for b in session {
        bytewise.feed(std::slice::from_ref(b));
        out.extend(bytewise.take_output());
    }
    assert_eq!(show(&out), show(&whole.take_output()));
    assert_eq!(whole.sent_messages(), bytewise.sent_messages());
}
