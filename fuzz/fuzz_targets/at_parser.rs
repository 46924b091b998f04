//! The modem's AT-command channel (crates/modem): arbitrary guest bytes fed to the modem in
//! fuzzed chunks, interleaved with the host's side (incoming SMS and calls, the network,
//! time passing), the output taken after every step. Errors are answered as `ERROR` / `+CME
//! ERROR`; a panic or output that grows without bound is not fine.
//!
//! Byte 0xFF starts a host event (the next byte says which); any other byte goes to the modem.

#![no_main]

use libfuzzer_sys::fuzz_target;
use virtsoc_modem::{Modem, RegState};

/// Output one step may produce, far above anything a chunk of input justifies.
const MAX_STEP_OUTPUT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let mut m = Modem::default();
    let mut now = 0u64;
    let mut parts = data.split(|&b| b == 0xFF);
    if let Some(first) = parts.next() {
        m.feed(first);
    }
    let mut taken = 0usize;
    for part in parts {
        let (&ev, rest) = match part.split_first() {
            Some(x) => x,
            None => (&0u8, part),
        };
        let text = String::from_utf8_lossy(rest.get(..rest.len().min(200)).unwrap_or(rest));
        let _ = match ev % 8 {
            0 => m.deliver_sms("+15551234", &text).map(|_| ()),
            1 => m.incoming_call(&text),
            2 => m.remote_answer(),
            3 => m.remote_hangup(),
            4 => m.set_signal(
                rest.first().copied().unwrap_or(0),
                rest.get(1).copied().unwrap_or(0),
            ),
            5 => {
                let states = [
                    RegState::NotRegistered,
                    RegState::Home,
                    RegState::Searching,
                    RegState::Denied,
                    RegState::Roaming,
                ];
                m.set_registered(
                    states[rest.first().copied().unwrap_or(0) as usize % states.len()],
                );
                Ok(())
            }
            6 => {
                now =
                    now.saturating_add(u64::from(rest.first().copied().unwrap_or(1)) * 100_000_000);
                m.advance(now);
                Ok(())
            }
            _ => Ok(()),
        };
        m.feed(rest);
        let out = m.take_output();
        assert!(
            out.len() <= MAX_STEP_OUTPUT,
            "{} bytes of output",
            out.len()
        );
        taken += out.len();
    }
    let _ = m.next_deadline();
    let _ = (
        m.call(),
        m.registration(),
        m.signal(),
        m.stored_messages().count(),
        taken,
    );
    assert!(m.take_output().len() <= MAX_STEP_OUTPUT);
});
