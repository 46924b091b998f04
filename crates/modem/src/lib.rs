//! `virtsoc-modem`: the cellular modem of a virtsoc phone.
//!
//! A paravirtual modem in the style of the Android Emulator's telephony
//! modem (the one `reference-ril` talks to): the guest's radio interface
//! layer writes AT commands (ITU-T V.250, 3GPP TS 27.007 and 27.005 text
//! mode) to a serial-like channel, and the host decides what the simulated
//! network does (registration, signal, incoming SMS and calls).
//!
//! * [`Modem`] is a pure state machine: [`Modem::feed`] bytes from the
//!   guest, send [`Modem::take_output`] back. It reads no clock; the host
//!   drives timed transitions with [`Modem::advance`].
//! * The host control API (`set_registered`, `set_signal`, `deliver_sms`,
//!   `incoming_call`, `remote_answer`, `remote_hangup`) produces the
//!   unsolicited result codes (`+CREG:`, `+CMTI:`, `RING`, `+CLIP:`,
//!   `NO CARRIER`) a real modem would.
//!
//! Supported commands: `AT`, `ATE0/1`, `ATV1`, `ATQ0`, `ATZ`, `AT&F`, `ATI`,
//! `ATS<n>=<v>`/`ATS<n>?`, `ATD<number>;`, `ATA`, `ATH`, `AT+CHUP`,
//! `AT+CLCC`, `AT+CLIP`, `AT+CMEE`, `AT+CREG`, `AT+COPS`, `AT+CFUN`,
//! `AT+CSQ`, `AT+CMGF`, `AT+CMGS`, `AT+CMGL`, `AT+CMGR`, `AT+CMGD`,
//! `AT+CGMI`, `AT+CGMM`, `AT+CGMR`, `AT+CGSN`; commands chain on one line
//! (`ATE0Q0V1`, `AT+COPS=3,0;+COPS?`). SMS is text mode only (`AT+CMGF=1`);
//! the modem carries one voice call at a time.

pub mod error;
pub mod modem;
mod parser;
pub mod types;

pub use error::{ModemError, Result};
pub use modem::{Modem, ModemConfig};
pub use types::{Call, CallDirection, CallState, RegState, SentSms, Signal, SmsStatus, StoredSms};
