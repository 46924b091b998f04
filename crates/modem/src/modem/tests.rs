//! Unit tests of the modem state machine.

use super::*;

fn modem() -> Modem {
    Modem::new(ModemConfig {
        echo: false,
        ..ModemConfig::default()
    })
}

fn run(m: &mut Modem, input: &str) -> String {
    m.feed(input.as_bytes());
    String::from_utf8(m.take_output()).unwrap()
}

#[test]
fn deadlines_follow_the_call() {
    let mut m = modem();
    assert_eq!(m.next_deadline(), None);
    run(&mut m, "ATD123;\r");
    assert_eq!(m.next_deadline(), Some(1_000_000_000));
    m.advance(1_500_000_000);
    assert_eq!(m.call().unwrap().state, CallState::Alerting);
    // Alerting started at the deadline, not at the late advance.
    assert_eq!(m.next_deadline(), Some(4_000_000_000));
    m.advance(4_000_000_000);
    assert_eq!(m.call().unwrap().state, CallState::Active);
    assert_eq!(m.next_deadline(), None);
}

#[test]
fn late_advance_goes_through_both_transitions() {
    let mut m = modem();
    run(&mut m, "ATD123;\r");
    m.advance(10_000_000_000);
    assert_eq!(m.call().unwrap().state, CallState::Active);
}

#[test]
fn time_never_goes_backwards() {
    let mut m = modem();
    m.advance(5);
    m.advance(3);
    assert_eq!(m.now_ns(), 5);
}

#[test]
fn storage_fills_up() {
    let mut m = Modem::new(ModemConfig {
        sms_capacity: 2,
        echo: false,
        ..ModemConfig::default()
    });
    assert_eq!(m.deliver_sms("+1", "a"), Ok(1));
    assert_eq!(m.deliver_sms("+1", "b"), Ok(2));
    assert_eq!(m.deliver_sms("+1", "c"), Err(ModemError::MemoryFull));
    run(&mut m, "AT+CMGD=1\r");
    assert_eq!(m.deliver_sms("+1", "d"), Ok(1));
}

#[test]
fn the_sent_record_keeps_only_the_latest_messages() {
    let mut m = Modem::new(ModemConfig {
        sent_capacity: 3,
        echo: false,
        ..ModemConfig::default()
    });
    run(&mut m, "AT+CMGF=1\r");
    for i in 0..10 {
        let out = run(&mut m, &format!("AT+CMGS=\"+1555\"\rmsg {i}\x1a"));
        assert!(out.contains("+CMGS:"), "{out:?}");
    }
    let texts: Vec<&str> = m.sent_messages().iter().map(|s| s.text.as_str()).collect();
    assert_eq!(texts, ["msg 7", "msg 8", "msg 9"]);
}

#[test]
fn host_api_validates() {
    let mut m = modem();
    assert!(matches!(
        m.set_signal(32, 0),
        Err(ModemError::InvalidSignal { .. })
    ));
    assert!(m.set_signal(99, 99).is_ok());
    assert!(m.deliver_sms("a\"b", "x").is_err());
    assert!(m.deliver_sms("", "x").is_err());
    assert_eq!(m.remote_answer(), Err(ModemError::NoCall));
    assert_eq!(m.remote_hangup(), Err(ModemError::NoCall));
    m.incoming_call("+1").unwrap();
    assert_eq!(m.incoming_call("+2"), Err(ModemError::CallInProgress));
    // Remote answer is for outgoing calls only.
    assert_eq!(m.remote_answer(), Err(ModemError::NoCall));
}

#[test]
fn garbage_never_panics() {
    let mut m = modem();
    let mut seed = 0x1234_5678_u32;
    let mut bytes = Vec::new();
    for _ in 0..20_000 {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let b = match seed % 8 {
            0 => b'\r',
            1 => b'A',
            2 => b'T',
            3 => b'+',
            4 => b'"',
            _ => (seed >> 8) as u8,
        };
        bytes.push(b);
    }
    m.feed(&bytes);
    m.feed(b"\x1b\rAT\r");
    let out = m.take_output();
    assert!(out.ends_with(b"\r\nOK\r\n"));
}

#[test]
fn cme_codes_are_distinct_per_meaning() {
    assert_eq!(ModemError::NotRegistered.cme_code(), 30);
    assert_eq!(ModemError::NotRegistered.cms_code(), 331);
    assert_eq!(ModemError::InvalidIndex(3).cms_code(), 321);
    assert_eq!(
        ModemError::NotSupported.cme_text(),
        "operation not supported"
    );
}
