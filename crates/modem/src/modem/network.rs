//! Network registration, radio, signal, identity and caller-id commands (`+CREG`, `+COPS`,
//! `+CFUN`, `+CSQ`, `+CLIP`, `+CLCC`, `+CGMI`...) and the host's registration/signal controls.

use super::*;

impl Modem {
    /// A numeric setting with read / test / set forms.
    pub(super) fn setting_on(
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

    pub(super) fn creg(&mut self, op: ExtOp) -> CmdResult {
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
    pub(super) fn creg_body(&self, with_cell: bool) -> String {
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

    pub(super) fn cops(&mut self, op: ExtOp) -> CmdResult {
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

    pub(super) fn cfun(&mut self, op: ExtOp) -> CmdResult {
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

    pub(super) fn csq(&mut self, op: ExtOp) -> CmdResult {
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

    pub(super) fn clip(&mut self, op: ExtOp) -> CmdResult {
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

    pub(super) fn clcc(&mut self, op: ExtOp) -> CmdResult {
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

    pub(super) fn identity(&mut self, op: ExtOp, text: &str) -> CmdResult {
        match op {
            ExtOp::Exec => self.info(text),
            ExtOp::Test => {}
            _ => return Err(Failure::Plain),
        }
        Ok(Flow::Continue)
    }

    // Network state

    pub(super) fn network_ok(&self) -> Result<()> {
        if !self.radio_on {
            Err(ModemError::RadioOff)
        } else if !self.network.is_registered() {
            Err(ModemError::NotRegistered)
        } else {
            Ok(())
        }
    }

    pub(super) fn set_radio(&mut self, on: bool) {
        self.radio_on = on;
        self.network_changed();
    }

    /// Reports a registration change and drops the call if the network went
    /// away.
    pub(super) fn network_changed(&mut self) {
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

    // Host control API

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
}
