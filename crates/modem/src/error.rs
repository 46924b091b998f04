//! The crate's single error type, [`ModemError`], and its `Result` alias.
//!
//! The same enum serves two audiences: the host control API returns it as an
//! ordinary Rust error, and the AT interpreter turns it into the numeric or
//! verbose codes of 3GPP TS 27.007 (`+CME ERROR: <n>`) and TS 27.005
//! (`+CMS ERROR: <n>`, for the SMS commands).

use thiserror::Error;

/// Everything that can go wrong in this crate.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ModemError {
    /// A call operation named a call that does not exist or is in the wrong
    /// state (e.g. `ATA` with no incoming call, `remote_answer` with nothing
    /// alerting).
    #[error("no call in a suitable state")]
    NoCall,
    /// A new call was offered or dialed while another call is up; this modem
    /// carries one call at a time.
    #[error("a call is already in progress")]
    CallInProgress,
    /// A dial string or phone number holds characters that are not allowed.
    #[error("invalid phone number {0:?}")]
    InvalidNumber(String),
    /// A parameter is out of range or malformed.
    #[error("invalid parameter: {0}")]
    InvalidParameter(&'static str),
    /// An SMS storage index that is out of range or empty.
    #[error("invalid SMS storage index {0}")]
    InvalidIndex(u32),
    /// SMS storage has no free slot.
    #[error("SMS storage full")]
    MemoryFull,
    /// The operation is valid AT syntax but this modem does not implement it
    /// (PDU mode, data calls, manual operator selection).
    #[error("operation not supported")]
    NotSupported,
    /// The operation needs the network but the radio is off (`AT+CFUN=0`).
    #[error("radio is off")]
    RadioOff,
    /// The operation needs the network but the modem is not registered.
    #[error("not registered on a network")]
    NotRegistered,
    /// A signal report outside the ranges of `AT+CSQ`.
    #[error("invalid signal report rssi={rssi} ber={ber} (rssi 0-31 or 99, ber 0-7 or 99)")]
    InvalidSignal {
        /// The rejected received signal strength indication.
        rssi: u8,
        /// The rejected bit error rate.
        ber: u8,
    },
    /// An SMS body longer than the modem accepts.
    #[error("message text longer than {0} bytes")]
    TextTooLong(usize),
}

impl ModemError {
    /// The 3GPP TS 27.007 `+CME ERROR` code for this error.
    pub fn cme_code(&self) -> u16 {
        match self {
            ModemError::NoCall | ModemError::CallInProgress | ModemError::RadioOff => 3,
            ModemError::NotSupported => 4,
            ModemError::MemoryFull => 20,
            ModemError::InvalidIndex(_) => 21,
            ModemError::TextTooLong(_) => 24,
            ModemError::InvalidNumber(_) => 25,
            ModemError::NotRegistered => 30,
            ModemError::InvalidParameter(_) | ModemError::InvalidSignal { .. } => 50,
        }
    }

    /// The 3GPP TS 27.005 `+CMS ERROR` code for this error.
    pub fn cms_code(&self) -> u16 {
        match self {
            ModemError::NoCall | ModemError::CallInProgress => 302,
            ModemError::NotSupported => 303,
            ModemError::InvalidParameter(_)
            | ModemError::InvalidSignal { .. }
            | ModemError::InvalidNumber(_)
            | ModemError::TextTooLong(_) => 305,
            ModemError::InvalidIndex(_) => 321,
            ModemError::MemoryFull => 322,
            ModemError::RadioOff | ModemError::NotRegistered => 331,
        }
    }

    /// The verbose text 27.007 gives for [`cme_code`](Self::cme_code)
    /// (used with `AT+CMEE=2`).
    pub fn cme_text(&self) -> &'static str {
        match self.cme_code() {
            3 => "operation not allowed",
            4 => "operation not supported",
            20 => "memory full",
            21 => "invalid index",
            24 => "text string too long",
            25 => "invalid characters in dial string",
            30 => "no network service",
            50 => "incorrect parameters",
            _ => "unknown",
        }
    }
}

/// `Result` with [`ModemError`] as the default error.
pub type Result<T, E = ModemError> = std::result::Result<T, E>;
