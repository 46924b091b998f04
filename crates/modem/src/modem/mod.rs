//! The [`Modem`] state machine: bytes from the guest in, response bytes and
//! unsolicited result codes out, plus the host control API.
//!
//! The modem never blocks and never reads a clock. The guest transport
//! calls [`Modem::feed`] with whatever bytes arrived and sends
//! [`Modem::take_output`] back; the host calls the control methods
//! (`set_registered`, `deliver_sms`, `incoming_call`, ...) and
//! [`Modem::advance`] with the current time so timed transitions (dialing
//! -> alerting -> active, repeated `RING`) happen. [`Modem::next_deadline`]
//! says when the next timed transition is due, so a driver can sleep until
//! then instead of polling.
//!
//! Output framing follows V.250 verbose mode: every information line and
//! every result code is written as `\r\n<text>\r\n` (multi-line answers such
//! as `+CMGL` are a sequence of such lines); the SMS text prompt is
//! `\r\n> `.

use std::collections::BTreeMap;

use crate::error::{ModemError, Result};
use crate::parser::{parse_commands, Arg, Command, ExtOp};
use crate::types::{
    toa, Call, CallDirection, CallState, RegState, SentSms, Signal, SmsStatus, StoredSms,
};

mod calls;
mod network;
mod sms;
#[cfg(test)]
mod tests;

const CTRL_Z: u8 = 0x1a;
const ESC: u8 = 0x1b;
const BACKSPACE: u8 = 0x08;
const DEL: u8 = 0x7f;

/// Static configuration of a [`Modem`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModemConfig {
    /// Long alphanumeric operator name (`AT+COPS=3,0`).
    pub operator_long: String,
    /// Short alphanumeric operator name (`AT+COPS=3,1`).
    pub operator_short: String,
    /// Numeric operator id, MCC+MNC (`AT+COPS=3,2`).
    pub operator_numeric: String,
    /// Location area code reported by `AT+CREG=2`.
    pub lac: u16,
    /// Cell id reported by `AT+CREG=2`.
    pub cell_id: u32,
    /// IMEI answered to `AT+CGSN`.
    pub imei: String,
    /// Echo state after power-up and `ATZ` (V.250 default: on).
    pub echo: bool,
    /// Network registration after power-up.
    pub registration: RegState,
    /// Signal report after power-up.
    pub signal: Signal,
    /// Number of slots in SMS storage (a full store refuses deliveries with
    /// [`ModemError::MemoryFull`], `+CMS ERROR: 322`).
    pub sms_capacity: u32,
    /// Sent messages kept for the host ([`Modem::sent_messages`]); beyond, the oldest
    /// (already delivered to the network) are dropped.
    pub sent_capacity: usize,
    /// Longest command line (and SMS text) accepted, in bytes.
    pub max_line_len: usize,
    /// Time an outgoing call spends dialing before it alerts.
    pub dial_to_alert_ns: u64,
    /// Time an alerting outgoing call waits before the remote party answers
    /// by itself; `None` waits for [`Modem::remote_answer`].
    pub auto_answer_ns: Option<u64>,
    /// Interval at which `RING` repeats for an unanswered incoming call;
    /// `None` rings once.
    pub ring_interval_ns: Option<u64>,
}

impl Default for ModemConfig {
    fn default() -> Self {
        ModemConfig {
            operator_long: "Android Virtual Operator".into(),
            operator_short: "Android".into(),
            operator_numeric: "310260".into(),
            lac: 0x1234,
            cell_id: 0x0001_5678,
            imei: "358240051111110".into(),
            echo: true,
            registration: RegState::Home,
            signal: Signal::default(),
            sms_capacity: 30,
            sent_capacity: 256,
            max_line_len: 1024,
            dial_to_alert_ns: 1_000_000_000,
            auto_answer_ns: Some(3_000_000_000),
            ring_interval_ns: Some(3_000_000_000),
        }
    }
}

/// Per-session settings the guest changes with AT commands (reset by `ATZ`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Settings {
    echo: bool,
    cmee: u8,
    creg: u8,
    clip: bool,
    text_mode: bool,
    cops_format: u8,
}

impl Settings {
    fn new(cfg: &ModemConfig) -> Self {
        Settings {
            echo: cfg.echo,
            cmee: 0,
            creg: 0,
            clip: false,
            text_mode: false,
            cops_format: 0,
        }
    }
}

/// What the byte stream from the guest currently is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Input {
    /// Command lines.
    Command,
    /// SMS text after `AT+CMGS="<to>"`, until Ctrl-Z (send) or ESC (cancel).
    SmsText {
        to: String,
        text: Vec<u8>,
        overflow: bool,
    },
}

/// How one command failed.
#[derive(Debug)]
enum Failure {
    /// Plain `ERROR` (syntax, unknown command).
    Plain,
    /// `+CME ERROR` (or `ERROR` when `AT+CMEE=0`).
    Cme(ModemError),
    /// `+CMS ERROR` (SMS commands, always numeric as in 27.005).
    Cms(ModemError),
}

/// What happens after a command succeeded.
enum Flow {
    Continue,
    /// Switch to SMS text input; the rest of the line is ignored and no
    /// final result code is sent yet.
    SmsText(String),
}

type CmdResult = std::result::Result<Flow, Failure>;

/// The modem.
#[derive(Debug)]
pub struct Modem {
    cfg: ModemConfig,
    set: Settings,
    s_regs: BTreeMap<u32, u32>,
    radio_on: bool,
    network: RegState,
    reported: RegState,
    signal: Signal,
    input: Input,
    line: Vec<u8>,
    discarding: bool,
    last_was_cr: bool,
    out: Vec<u8>,
    storage: BTreeMap<u32, StoredSms>,
    sent: Vec<SentSms>,
    next_mr: u8,
    call: Option<Call>,
    last_ring_ns: u64,
    now_ns: u64,
}

impl Default for Modem {
    fn default() -> Self {
        Modem::new(ModemConfig::default())
    }
}

impl Modem {
    /// A powered-up modem (radio on) with the given configuration, at time 0.
    pub fn new(cfg: ModemConfig) -> Self {
        let set = Settings::new(&cfg);
        let network = cfg.registration;
        let signal = cfg.signal;
        Modem {
            set,
            s_regs: default_s_registers(),
            radio_on: true,
            network,
            reported: network,
            signal,
            input: Input::Command,
            line: Vec::new(),
            discarding: false,
            last_was_cr: false,
            out: Vec::new(),
            storage: BTreeMap::new(),
            sent: Vec::new(),
            next_mr: 0,
            call: None,
            last_ring_ns: 0,
            now_ns: 0,
            cfg,
        }
    }

    // ----------------------------------------------------------------
    // Guest side
    // ----------------------------------------------------------------

    /// Feeds bytes received from the guest. Responses accumulate in the
    /// output buffer ([`take_output`](Self::take_output)).
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.set.echo {
                self.out.push(b);
            }
            if matches!(self.input, Input::Command) {
                self.command_byte(b);
            } else {
                self.sms_byte(b);
            }
            self.last_was_cr = b == b'\r';
        }
    }

    /// Takes everything the modem has written since the last call.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// The bytes written and not yet taken.
    pub fn pending_output(&self) -> &[u8] {
        &self.out
    }

    /// Whether the modem is waiting for SMS text (after the `> ` prompt).
    pub fn awaiting_sms_text(&self) -> bool {
        matches!(self.input, Input::SmsText { .. })
    }

    fn command_byte(&mut self, b: u8) {
        match b {
            b'\r' | b'\n' => {
                if b == b'\n' && self.last_was_cr {
                    return;
                }
                if self.discarding {
                    self.discarding = false;
                    self.line.clear();
                } else {
                    let line = std::mem::take(&mut self.line);
                    self.execute_line(&line);
                }
            }
            BACKSPACE | DEL => {
                self.line.pop();
            }
            _ if self.discarding => {}
            _ if self.line.len() >= self.cfg.max_line_len => {
                self.line.clear();
                self.discarding = true;
                self.result("ERROR");
            }
            _ => self.line.push(b),
        }
    }

    fn sms_byte(&mut self, b: u8) {
        let max = self.cfg.max_line_len;
        let Input::SmsText { text, overflow, .. } = &mut self.input else {
            return;
        };
        match b {
            CTRL_Z => {
                let Input::SmsText { to, text, overflow } =
                    std::mem::replace(&mut self.input, Input::Command)
                else {
                    return;
                };
                if overflow {
                    self.fail(Failure::Cms(ModemError::TextTooLong(max)));
                } else {
                    self.send_sms(to, &text);
                }
            }
            ESC => {
                self.input = Input::Command;
                self.result("OK");
            }
            b'\r' => {
                if text.len() < max {
                    text.push(b'\n');
                } else {
                    *overflow = true;
                }
                self.out.extend_from_slice(b"\r\n> ");
            }
            b'\n' => {}
            BACKSPACE | DEL => {
                text.pop();
            }
            _ => {
                if text.len() < max {
                    text.push(b);
                } else {
                    *overflow = true;
                }
            }
        }
    }

    fn execute_line(&mut self, raw: &[u8]) {
        let text = String::from_utf8_lossy(raw);
        let line = text.trim();
        if line.is_empty() {
            return;
        }
        let Some(body) = line
            .get(..2)
            .filter(|p| p.eq_ignore_ascii_case("AT"))
            .map(|_| &line[2..])
        else {
            self.fail(Failure::Plain);
            return;
        };
        let Some(commands) = parse_commands(body) else {
            self.fail(Failure::Plain);
            return;
        };
        for cmd in commands {
            match self.execute(cmd) {
                Ok(Flow::Continue) => {}
                Ok(Flow::SmsText(to)) => {
                    self.input = Input::SmsText {
                        to,
                        text: Vec::new(),
                        overflow: false,
                    };
                    self.out.extend_from_slice(b"\r\n> ");
                    return;
                }
                Err(f) => {
                    self.fail(f);
                    return;
                }
            }
        }
        self.result("OK");
    }

    fn execute(&mut self, cmd: Command) -> CmdResult {
        match cmd {
            Command::Basic { letter, value } => self.basic(letter, value.unwrap_or(0)),
            Command::Ampersand { letter: b'F', .. } => {
                self.set = Settings::new(&self.cfg);
                Ok(Flow::Continue)
            }
            Command::Ampersand { .. } => Err(Failure::Plain),
            Command::SSet { reg, value } => {
                if reg > 255 || value > 255 {
                    return Err(Failure::Cme(ModemError::InvalidParameter(
                        "S-register or value out of range",
                    )));
                }
                self.s_regs.insert(reg, value);
                Ok(Flow::Continue)
            }
            Command::SRead { reg } => {
                let v = self.s_regs.get(&reg).copied().unwrap_or(0);
                self.info(&format!("{v:03}"));
                Ok(Flow::Continue)
            }
            Command::Dial { number, voice } => self.dial(&number, voice).map_err(Failure::Cme),
            Command::Extended { name, op } => self.extended(&name, op),
        }
    }

    fn basic(&mut self, letter: u8, value: u32) -> CmdResult {
        match (letter, value) {
            (b'E', 0 | 1) => self.set.echo = value == 1,
            (b'V', 1) | (b'Q', 0) => {}
            (b'Z', 0) => {
                self.set = Settings::new(&self.cfg);
                self.s_regs = default_s_registers();
            }
            (b'H', 0) => {
                self.call = None;
            }
            (b'A', 0) => self.answer().map_err(Failure::Cme)?,
            (b'I', 0) => self.info("virtsoc virtual modem"),
            _ => return Err(Failure::Plain),
        }
        Ok(Flow::Continue)
    }

    fn extended(&mut self, name: &str, op: ExtOp) -> CmdResult {
        match name {
            "+CMEE" => {
                let mut level = self.set.cmee;
                let r = self.setting_on(op, "+CMEE", "(0-2)", 2, &mut level);
                self.set.cmee = level;
                r
            }
            "+CREG" => self.creg(op),
            "+COPS" => self.cops(op),
            "+CFUN" => self.cfun(op),
            "+CSQ" => self.csq(op),
            "+CLIP" => self.clip(op),
            "+CLCC" => self.clcc(op),
            "+CHUP" => match op {
                ExtOp::Exec => {
                    self.call = None;
                    Ok(Flow::Continue)
                }
                ExtOp::Test => Ok(Flow::Continue),
                _ => Err(Failure::Plain),
            },
            "+CMGF" => {
                let mut mode = u8::from(self.set.text_mode);
                let r = self.setting_on(op, "+CMGF", "(0,1)", 1, &mut mode);
                self.set.text_mode = mode == 1;
                r
            }
            "+CMGS" => self.cmgs(op),
            "+CMGL" => self.cmgl(op),
            "+CMGR" => self.cmgr(op),
            "+CMGD" => self.cmgd(op),
            "+CGMI" => self.identity(op, "virtsoc"),
            "+CGMM" => self.identity(op, "virtsoc-modem"),
            "+CGMR" => self.identity(op, env!("CARGO_PKG_VERSION")),
            "+CGSN" => {
                let imei = self.cfg.imei.clone();
                self.identity(op, &imei)
            }
            _ => Err(Failure::Plain),
        }
    }

    // ----------------------------------------------------------------
    // Output helpers
    // ----------------------------------------------------------------

    fn info(&mut self, line: &str) {
        self.out.extend_from_slice(b"\r\n");
        self.out.extend_from_slice(line.as_bytes());
        self.out.extend_from_slice(b"\r\n");
    }

    fn result(&mut self, code: &str) {
        self.info(code);
    }

    fn fail(&mut self, f: Failure) {
        let line = match f {
            Failure::Plain => "ERROR".to_string(),
            Failure::Cme(e) => match self.set.cmee {
                0 => "ERROR".to_string(),
                1 => format!("+CME ERROR: {}", e.cme_code()),
                _ => format!("+CME ERROR: {}", e.cme_text()),
            },
            Failure::Cms(e) => format!("+CMS ERROR: {}", e.cms_code()),
        };
        self.result(&line);
    }

    /// The registration state the guest sees (not registered while the
    /// radio is off).
    pub fn registration(&self) -> RegState {
        if self.radio_on {
            self.network
        } else {
            RegState::NotRegistered
        }
    }

    /// The signal report the guest sees (unknown while the radio is off).
    pub fn signal(&self) -> Signal {
        if self.radio_on {
            self.signal
        } else {
            Signal::UNKNOWN
        }
    }

    /// Whether the radio is on (`AT+CFUN=1`).
    pub fn radio_on(&self) -> bool {
        self.radio_on
    }

    /// Whether command echo is on (`ATE1`).
    pub fn echo(&self) -> bool {
        self.set.echo
    }

    /// Modem time, as last given to [`advance`](Self::advance).
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// The configuration.
    pub fn config(&self) -> &ModemConfig {
        &self.cfg
    }
}

fn default_s_registers() -> BTreeMap<u32, u32> {
    // V.250 defaults: S0 auto-answer off, S3 CR, S4 LF, S5 backspace.
    [(0, 0), (3, 13), (4, 10), (5, 8)].into_iter().collect()
}

/// A small numeric argument at `idx`: `None` if absent or empty, an error if
/// not a number or above `max`.
fn small_arg(args: &[Arg], idx: usize, max: u8) -> std::result::Result<Option<u8>, Failure> {
    match args.get(idx) {
        None => Ok(None),
        Some(a) if a.is_empty() => Ok(None),
        Some(a) => match a.number() {
            Some(v) if v <= u32::from(max) => Ok(Some(v as u8)),
            _ => Err(Failure::Cme(ModemError::InvalidParameter(
                "argument out of range",
            ))),
        },
    }
}

/// A dialable number: digits and `+*#ABCD,pPwW`, `+` only first.
fn validate_dial_string(number: &str) -> Result<()> {
    let ok = !number.is_empty()
        && number.len() <= 40
        && number.char_indices().all(|(i, c)| {
            c.is_ascii_digit()
                || matches!(c, '*' | '#' | 'A'..='D' | 'a'..='d' | ',' | 'p' | 'P' | 'w' | 'W')
                || (c == '+' && i == 0)
        });
    if ok {
        Ok(())
    } else {
        Err(ModemError::InvalidNumber(number.to_string()))
    }
}

/// A destination number for SMS.
fn validate_number(number: &str) -> Result<()> {
    validate_dial_string(number)
}

/// An originating address: a number or an alphanumeric sender id, printable
/// and without quotes (it is quoted in responses).
fn validate_address(from: &str) -> Result<()> {
    let ok =
        !from.is_empty() && from.len() <= 40 && from.chars().all(|c| !c.is_control() && c != '"');
    if ok {
        Ok(())
    } else {
        Err(ModemError::InvalidNumber(from.to_string()))
    }
}
