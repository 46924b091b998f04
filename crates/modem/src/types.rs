//! Plain data types of the modem: registration states, signal reports,
//! calls and short messages, with their AT-command encodings.

use std::fmt;

/// Network registration status, as reported in `+CREG: <n>,<stat>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RegState {
    /// 0: not registered, not searching.
    #[default]
    NotRegistered,
    /// 1: registered on the home network.
    Home,
    /// 2: not registered, searching for an operator.
    Searching,
    /// 3: registration denied.
    Denied,
    /// 4: unknown.
    Unknown,
    /// 5: registered, roaming.
    Roaming,
}

impl RegState {
    /// The `<stat>` number of `+CREG`.
    pub fn code(self) -> u8 {
        match self {
            RegState::NotRegistered => 0,
            RegState::Home => 1,
            RegState::Searching => 2,
            RegState::Denied => 3,
            RegState::Unknown => 4,
            RegState::Roaming => 5,
        }
    }

    /// Whether calls and SMS can go through (home or roaming).
    pub fn is_registered(self) -> bool {
        matches!(self, RegState::Home | RegState::Roaming)
    }
}

/// A signal quality report, as in `+CSQ: <rssi>,<ber>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Signal {
    /// Received signal strength: 0 (-113 dBm or less) to 31 (-51 dBm or
    /// more), 99 unknown.
    pub rssi: u8,
    /// Bit error rate class 0-7, 99 unknown.
    pub ber: u8,
}

impl Signal {
    /// The report for "no signal / unknown" (99,99).
    pub const UNKNOWN: Signal = Signal { rssi: 99, ber: 99 };

    /// Whether both fields are in the ranges `+CSQ` allows.
    pub fn is_valid(self) -> bool {
        (self.rssi <= 31 || self.rssi == 99) && (self.ber <= 7 || self.ber == 99)
    }
}

impl Default for Signal {
    fn default() -> Self {
        Signal { rssi: 20, ber: 99 }
    }
}

/// Who placed a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallDirection {
    /// Mobile originated: the guest dialed (`ATD`).
    Outgoing,
    /// Mobile terminated: the host offered it (`incoming_call`).
    Incoming,
}

/// The state of a call, as in `+CLCC: ...,<stat>,...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallState {
    /// 0: connected.
    Active,
    /// 1: on hold (not produced by this modem, kept for completeness).
    Held,
    /// 2: outgoing, the network has not reached the callee yet.
    Dialing,
    /// 3: outgoing, the callee's phone is ringing.
    Alerting,
    /// 4: incoming, ringing.
    Incoming,
    /// 5: incoming while another call is up (not produced by this modem).
    Waiting,
}

impl CallState {
    /// The `<stat>` number of `+CLCC`.
    pub fn code(self) -> u8 {
        match self {
            CallState::Active => 0,
            CallState::Held => 1,
            CallState::Dialing => 2,
            CallState::Alerting => 3,
            CallState::Incoming => 4,
            CallState::Waiting => 5,
        }
    }
}

/// A voice call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The call index of `+CLCC` (always 1: one call at a time).
    pub index: u8,
    /// Who placed it.
    pub direction: CallDirection,
    /// Its current state.
    pub state: CallState,
    /// The remote party's number.
    pub number: String,
    /// Modem time (ns) at which it entered `state`.
    pub state_since_ns: u64,
}

/// Storage status of a short message, as in `+CMGL` / `+CMGR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SmsStatus {
    /// Received, not yet read by the guest.
    ReceivedUnread,
    /// Received and read.
    ReceivedRead,
    /// Stored, not sent.
    StoredUnsent,
    /// Stored and sent.
    StoredSent,
}

impl SmsStatus {
    /// The text-mode status string.
    pub fn as_str(self) -> &'static str {
        match self {
            SmsStatus::ReceivedUnread => "REC UNREAD",
            SmsStatus::ReceivedRead => "REC READ",
            SmsStatus::StoredUnsent => "STO UNSENT",
            SmsStatus::StoredSent => "STO SENT",
        }
    }
}

impl fmt::Display for SmsStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A message in the modem's SMS storage (`"SM"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSms {
    /// Storage index (1-based).
    pub index: u32,
    /// Status.
    pub status: SmsStatus,
    /// Originating address.
    pub from: String,
    /// Message text.
    pub text: String,
    /// Modem time (ns) of arrival.
    pub received_ns: u64,
}

/// A message the guest sent with `AT+CMGS`, recorded for the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentSms {
    /// Message reference answered in `+CMGS: <mr>`.
    pub mr: u8,
    /// Destination address.
    pub to: String,
    /// Message text (lines entered with CR are joined with `\n`).
    pub text: String,
    /// Modem time (ns) it was sent.
    pub sent_ns: u64,
}

/// The type-of-address octet for a number: 145 international, 129 other.
pub(crate) fn toa(number: &str) -> u8 {
    if number.starts_with('+') {
        145
    } else {
        129
    }
}
