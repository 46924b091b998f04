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

    fn send_sms(&mut self, to: String, text: &[u8]) {
        // The network may have gone away while the guest typed.
        if let Err(e) = self.network_ok() {
            self.fail(Failure::Cms(e));
            return;
        }
        let mr = self.next_mr;
        self.next_mr = self.next_mr.wrapping_add(1);
        let text = String::from_utf8_lossy(text).into_owned();
        // The record of sent messages is bounded: the oldest (delivered) go first.
        if self.sent.len() >= self.cfg.sent_capacity.max(1) {
            let excess = self.sent.len() + 1 - self.cfg.sent_capacity.max(1);
            self.sent.drain(..excess);
        }
        self.sent.push(SentSms {
            mr,
            to,
            text,
            sent_ns: self.now_ns,
        });
        self.info(&format!("+CMGS: {mr}"));
        self.result("OK");
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
    // Individual commands
    // ----------------------------------------------------------------

    /// A numeric setting with read / test / set forms.
    fn setting_on(
        &mut self,
        op: ExtOp,
        name: &str,
        range: &str,
        max: u8,
        value: &mut u8,
    ) -> CmdResult {
        match op {
            ExtOp::Read => self.info(&format!("{name}: {value}")),
            ExtOp::Test => self.info(&format!("{name}: {range}")),
            ExtOp::Set(args) => *value = small_arg(&args, 0, max)?.unwrap_or(0),
            ExtOp::Exec => *value = 0,
        }
        Ok(Flow::Continue)
    }

    fn creg(&mut self, op: ExtOp) -> CmdResult {
        match op {
            ExtOp::Read => {
                let n = self.set.creg;
                let body = self.creg_body(n == 2);
                self.info(&format!("+CREG: {n},{body}"));
            }
            ExtOp::Test => self.info("+CREG: (0-2)"),
            ExtOp::Set(args) => self.set.creg = small_arg(&args, 0, 2)?.unwrap_or(0),
            ExtOp::Exec => self.set.creg = 0,
        }
        Ok(Flow::Continue)
    }

    /// `<stat>[,"<lac>","<ci>"]`.
    fn creg_body(&self, with_cell: bool) -> String {
        let stat = self.registration();
        if with_cell && stat.is_registered() {
            format!(
                "{},\"{:04X}\",\"{:08X}\"",
                stat.code(),
                self.cfg.lac,
                self.cfg.cell_id
            )
        } else {
            stat.code().to_string()
        }
    }

    fn cops(&mut self, op: ExtOp) -> CmdResult {
        match op {
            ExtOp::Read => {
                if self.registration().is_registered() {
                    let f = self.set.cops_format;
                    let name = match f {
                        0 => &self.cfg.operator_long,
                        1 => &self.cfg.operator_short,
                        _ => &self.cfg.operator_numeric,
                    };
                    let line = format!("+COPS: 0,{f},\"{name}\"");
                    self.info(&line);
                } else {
                    self.info("+COPS: 0");
                }
            }
            ExtOp::Test => {
                let line = format!(
                    "+COPS: (2,\"{}\",\"{}\",\"{}\"),,(0,3),(0-2)",
                    self.cfg.operator_long, self.cfg.operator_short, self.cfg.operator_numeric
                );
                self.info(&line);
            }
            ExtOp::Set(args) => match small_arg(&args, 0, 4)? {
                Some(0) | None => {
                    if let Some(f) = small_arg(&args, 1, 2)? {
                        self.set.cops_format = f;
                    }
                }
                Some(3) => {
                    self.set.cops_format = small_arg(&args, 1, 2)?.unwrap_or(0);
                }
                Some(_) => return Err(Failure::Cme(ModemError::NotSupported)),
            },
            ExtOp::Exec => return Err(Failure::Plain),
        }
        Ok(Flow::Continue)
    }

    fn cfun(&mut self, op: ExtOp) -> CmdResult {
        match op {
            ExtOp::Read => {
                let v = u8::from(self.radio_on);
                self.info(&format!("+CFUN: {v}"));
            }
            ExtOp::Test => self.info("+CFUN: (0,1,4),(0)"),
            ExtOp::Set(args) => match small_arg(&args, 0, 4)? {
                Some(1) => self.set_radio(true),
                Some(0 | 4) => self.set_radio(false),
                _ => {
                    return Err(Failure::Cme(ModemError::InvalidParameter(
                        "CFUN level must be 0, 1 or 4",
                    )))
                }
            },
            ExtOp::Exec => return Err(Failure::Plain),
        }
        Ok(Flow::Continue)
    }

    fn csq(&mut self, op: ExtOp) -> CmdResult {
        match op {
            ExtOp::Exec => {
                let s = self.signal();
                self.info(&format!("+CSQ: {},{}", s.rssi, s.ber));
            }
            ExtOp::Test => self.info("+CSQ: (0-31,99),(0-7,99)"),
            _ => return Err(Failure::Plain),
        }
        Ok(Flow::Continue)
    }

    fn clip(&mut self, op: ExtOp) -> CmdResult {
        match op {
            ExtOp::Read => {
                let n = u8::from(self.set.clip);
                self.info(&format!("+CLIP: {n},1"));
            }
            ExtOp::Test => self.info("+CLIP: (0,1)"),
            ExtOp::Set(args) => self.set.clip = small_arg(&args, 0, 1)?.unwrap_or(0) == 1,
            ExtOp::Exec => self.set.clip = false,
        }
        Ok(Flow::Continue)
    }

    fn clcc(&mut self, op: ExtOp) -> CmdResult {
        match op {
            ExtOp::Exec => {
                if let Some(c) = &self.call {
                    let dir = u8::from(c.direction == CallDirection::Incoming);
                    let line = format!(
                        "+CLCC: {},{dir},{},0,0,\"{}\",{}",
                        c.index,
                        c.state.code(),
                        c.number,
                        toa(&c.number)
                    );
                    self.info(&line);
                }
            }
            ExtOp::Test => {}
            _ => return Err(Failure::Plain),
        }
        Ok(Flow::Continue)
    }

    fn identity(&mut self, op: ExtOp, text: &str) -> CmdResult {
        match op {
            ExtOp::Exec => self.info(text),
            ExtOp::Test => {}
            _ => return Err(Failure::Plain),
        }
        Ok(Flow::Continue)
    }

    fn require_text_mode(&self) -> std::result::Result<(), Failure> {
        if self.set.text_mode {
            Ok(())
        } else {
            Err(Failure::Cms(ModemError::NotSupported))
        }
    }

    fn cmgs(&mut self, op: ExtOp) -> CmdResult {
        let ExtOp::Set(args) = op else {
            return match op {
                ExtOp::Test => Ok(Flow::Continue),
                _ => Err(Failure::Plain),
            };
        };
        self.require_text_mode()?;
        let to = args.first().map(|a| a.text.clone()).unwrap_or_default();
        validate_number(&to).map_err(Failure::Cms)?;
        if let Some(t) = args.get(1).filter(|a| !a.is_empty()) {
            if !matches!(t.number(), Some(129 | 145 | 161)) {
                return Err(Failure::Cms(ModemError::InvalidParameter(
                    "type of address",
                )));
            }
        }
        self.network_ok().map_err(Failure::Cms)?;
        Ok(Flow::SmsText(to))
    }

    fn cmgl(&mut self, op: ExtOp) -> CmdResult {
        let filter = match op {
            ExtOp::Exec => Some(SmsStatus::ReceivedUnread),
            ExtOp::Set(args) => {
                let stat = args.first().map(|a| a.text.to_ascii_uppercase());
                match stat.as_deref().unwrap_or("REC UNREAD") {
                    "ALL" => None,
                    "REC UNREAD" => Some(SmsStatus::ReceivedUnread),
                    "REC READ" => Some(SmsStatus::ReceivedRead),
                    "STO UNSENT" => Some(SmsStatus::StoredUnsent),
                    "STO SENT" => Some(SmsStatus::StoredSent),
                    _ => return Err(Failure::Cms(ModemError::InvalidParameter("message status"))),
                }
            }
            ExtOp::Test => {
                self.info(
                    "+CMGL: (\"REC UNREAD\",\"REC READ\",\"STO UNSENT\",\"STO SENT\",\"ALL\")",
                );
                return Ok(Flow::Continue);
            }
            ExtOp::Read => return Err(Failure::Plain),
        };
        self.require_text_mode()?;
        let mut lines = Vec::new();
        for m in self.storage.values_mut() {
            if filter.is_some_and(|f| f != m.status) {
                continue;
            }
            lines.push(format!(
                "+CMGL: {},\"{}\",\"{}\"",
                m.index,
                m.status.as_str(),
                m.from
            ));
            lines.push(m.text.clone());
            if m.status == SmsStatus::ReceivedUnread {
                m.status = SmsStatus::ReceivedRead;
            }
        }
        for l in lines {
            self.info(&l);
        }
        Ok(Flow::Continue)
    }

    fn storage_index(&self, args: &[Arg]) -> std::result::Result<u32, Failure> {
        let arg = args.first().ok_or(Failure::Plain)?;
        match arg.number() {
            Some(i) if (1..=self.cfg.sms_capacity).contains(&i) => Ok(i),
            Some(i) => Err(Failure::Cms(ModemError::InvalidIndex(i))),
            None => Err(Failure::Cms(ModemError::InvalidParameter("index"))),
        }
    }

    fn cmgr(&mut self, op: ExtOp) -> CmdResult {
        let args = match op {
            ExtOp::Set(args) => args,
            ExtOp::Test => return Ok(Flow::Continue),
            _ => return Err(Failure::Plain),
        };
        self.require_text_mode()?;
        let index = self.storage_index(&args)?;
        let m = self
            .storage
            .get_mut(&index)
            .ok_or(Failure::Cms(ModemError::InvalidIndex(index)))?;
        let head = format!("+CMGR: \"{}\",\"{}\"", m.status.as_str(), m.from);
        let text = m.text.clone();
        if m.status == SmsStatus::ReceivedUnread {
            m.status = SmsStatus::ReceivedRead;
        }
        self.info(&head);
        self.info(&text);
        Ok(Flow::Continue)
    }

    fn cmgd(&mut self, op: ExtOp) -> CmdResult {
        let args = match op {
            ExtOp::Set(args) => args,
            ExtOp::Test => {
                let line = format!("+CMGD: (1-{}),(0-4)", self.cfg.sms_capacity);
                self.info(&line);
                return Ok(Flow::Continue);
            }
            _ => return Err(Failure::Plain),
        };
        let flag = match args.get(1).filter(|a| !a.is_empty()) {
            None => 0,
            Some(a) => match a.number() {
                Some(f @ 0..=4) => f,
                _ => return Err(Failure::Cms(ModemError::InvalidParameter("delflag"))),
            },
        };
        if flag == 0 {
            let index = self.storage_index(&args)?;
            if self.storage.remove(&index).is_none() {
                return Err(Failure::Cms(ModemError::InvalidIndex(index)));
            }
        } else {
            self.storage.retain(|_, m| {
                let doomed = match m.status {
                    SmsStatus::ReceivedRead => true,
                    SmsStatus::StoredSent => flag >= 2,
                    SmsStatus::StoredUnsent => flag >= 3,
                    SmsStatus::ReceivedUnread => flag >= 4,
                };
                !doomed
            });
        }
        Ok(Flow::Continue)
    }

    fn dial(&mut self, number: &str, voice: bool) -> Result<Flow> {
        let number = number.strip_prefix(['T', 't', 'P', 'p']).unwrap_or(number);
        if !voice {
            return Err(ModemError::NotSupported);
        }
        validate_dial_string(number)?;
        self.network_ok()?;
        if self.call.is_some() {
            return Err(ModemError::CallInProgress);
        }
        self.call = Some(Call {
            index: 1,
            direction: CallDirection::Outgoing,
            state: CallState::Dialing,
            number: number.to_string(),
            state_since_ns: self.now_ns,
        });
        Ok(Flow::Continue)
    }

    fn answer(&mut self) -> Result<()> {
        match &mut self.call {
            Some(c) if c.state == CallState::Incoming => {
                c.state = CallState::Active;
                c.state_since_ns = self.now_ns;
                Ok(())
            }
            _ => Err(ModemError::NoCall),
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

    // ----------------------------------------------------------------
    // Network state
    // ----------------------------------------------------------------

    fn network_ok(&self) -> Result<()> {
        if !self.radio_on {
            Err(ModemError::RadioOff)
        } else if !self.network.is_registered() {
            Err(ModemError::NotRegistered)
        } else {
            Ok(())
        }
    }

    fn set_radio(&mut self, on: bool) {
        self.radio_on = on;
        self.network_changed();
    }

    /// Reports a registration change and drops the call if the network went
    /// away.
    fn network_changed(&mut self) {
        if self.network_ok().is_err() && self.call.take().is_some() {
            self.result("NO CARRIER");
        }
        let now = self.registration();
        if now != self.reported {
            self.reported = now;
            if self.set.creg >= 1 {
                let body = self.creg_body(self.set.creg == 2);
                self.info(&format!("+CREG: {body}"));
            }
        }
    }

    fn ring(&mut self) {
        self.result("RING");
        if self.set.clip {
            if let Some(c) = &self.call {
                let line = format!("+CLIP: \"{}\",{}", c.number, toa(&c.number));
                self.info(&line);
            }
        }
        self.last_ring_ns = self.now_ns;
    }

    // ----------------------------------------------------------------
    // Host control API
    // ----------------------------------------------------------------

    /// Sets the network registration the host simulates. Emits `+CREG:` when
    /// the reported state changes and the guest enabled it; a call is dropped
    /// (`NO CARRIER`) when the modem loses registration.
    pub fn set_registered(&mut self, state: RegState) {
        self.network = state;
        self.network_changed();
    }

    /// Sets the signal report (`AT+CSQ`). Ranges as in [`Signal::is_valid`].
    pub fn set_signal(&mut self, rssi: u8, ber: u8) -> Result<()> {
        let s = Signal { rssi, ber };
        if !s.is_valid() {
            return Err(ModemError::InvalidSignal { rssi, ber });
        }
        self.signal = s;
        Ok(())
    }

    /// Delivers an incoming SMS: stores it in the lowest free slot and emits
    /// `+CMTI: "SM",<index>`. Returns the index.
    pub fn deliver_sms(&mut self, from: &str, text: &str) -> Result<u32> {
        validate_address(from)?;
        if text.len() > self.cfg.max_line_len {
            return Err(ModemError::TextTooLong(self.cfg.max_line_len));
        }
        self.network_ok()?;
        let index = (1..=self.cfg.sms_capacity)
            .find(|i| !self.storage.contains_key(i))
            .ok_or(ModemError::MemoryFull)?;
        self.storage.insert(
            index,
            StoredSms {
                index,
                status: SmsStatus::ReceivedUnread,
                from: from.to_string(),
                text: text.to_string(),
                received_ns: self.now_ns,
            },
        );
        self.info(&format!("+CMTI: \"SM\",{index}"));
        Ok(index)
    }

    /// Offers an incoming voice call: emits `RING` (and `+CLIP:` when the
    /// guest enabled it with `AT+CLIP=1`).
    pub fn incoming_call(&mut self, from: &str) -> Result<()> {
        validate_address(from)?;
        self.network_ok()?;
        if self.call.is_some() {
            return Err(ModemError::CallInProgress);
        }
        self.call = Some(Call {
            index: 1,
            direction: CallDirection::Incoming,
            state: CallState::Incoming,
            number: from.to_string(),
            state_since_ns: self.now_ns,
        });
        self.ring();
        Ok(())
    }

    /// The remote party answers the outgoing call (dialing or alerting ->
    /// active).
    pub fn remote_answer(&mut self) -> Result<()> {
        match &mut self.call {
            Some(c)
                if c.direction == CallDirection::Outgoing
                    && matches!(c.state, CallState::Dialing | CallState::Alerting) =>
            {
                c.state = CallState::Active;
                c.state_since_ns = self.now_ns;
                Ok(())
            }
            _ => Err(ModemError::NoCall),
        }
    }

    /// The remote party hangs up (or the network drops the call): emits
    /// `NO CARRIER`.
    pub fn remote_hangup(&mut self) -> Result<()> {
        if self.call.take().is_none() {
            return Err(ModemError::NoCall);
        }
        self.result("NO CARRIER");
        Ok(())
    }

    /// Moves modem time to `now_ns` (monotonic; earlier times are ignored)
    /// and performs the timed transitions that are due.
    pub fn advance(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
        let now = self.now_ns;
        let dial = self.cfg.dial_to_alert_ns;
        let auto = self.cfg.auto_answer_ns;
        let mut ring = false;
        if let Some(c) = &mut self.call {
            if c.state == CallState::Dialing && now.saturating_sub(c.state_since_ns) >= dial {
                c.state = CallState::Alerting;
                c.state_since_ns = c.state_since_ns.saturating_add(dial);
            }
            if let Some(auto) = auto {
                if c.state == CallState::Alerting && now.saturating_sub(c.state_since_ns) >= auto {
                    c.state = CallState::Active;
                    c.state_since_ns = c.state_since_ns.saturating_add(auto);
                }
            }
            if let Some(iv) = self.cfg.ring_interval_ns {
                ring = c.state == CallState::Incoming
                    && now.saturating_sub(self.last_ring_ns) >= iv.max(1);
            }
        }
        if ring {
            self.ring();
        }
    }

    /// When the next timed transition is due (for [`advance`](Self::advance)),
    /// or `None` if nothing is pending.
    pub fn next_deadline(&self) -> Option<u64> {
        let c = self.call.as_ref()?;
        match c.state {
            CallState::Dialing => Some(c.state_since_ns.saturating_add(self.cfg.dial_to_alert_ns)),
            CallState::Alerting => self
                .cfg
                .auto_answer_ns
                .map(|a| c.state_since_ns.saturating_add(a)),
            CallState::Incoming => self
                .cfg
                .ring_interval_ns
                .map(|iv| self.last_ring_ns.saturating_add(iv.max(1))),
            _ => None,
        }
    }

    // ----------------------------------------------------------------
    // Host inspection
    // ----------------------------------------------------------------

    /// Messages the guest sent, oldest first.
    pub fn sent_messages(&self) -> &[SentSms] {
        &self.sent
    }

    /// Takes the record of sent messages.
    pub fn take_sent_messages(&mut self) -> Vec<SentSms> {
        std::mem::take(&mut self.sent)
    }

    /// Messages in SMS storage, by index.
    pub fn stored_messages(&self) -> impl Iterator<Item = &StoredSms> {
        self.storage.values()
    }

    /// The current call, if any.
    pub fn call(&self) -> Option<&Call> {
        self.call.as_ref()
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

#[cfg(test)]
mod tests {
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
}
