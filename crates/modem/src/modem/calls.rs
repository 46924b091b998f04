//! The voice call: dialing, answering, hanging up, ringing, the host's incoming calls and the
//! timed transitions (dialing -> alerting -> active, repeated `RING`).

use super::*;

impl Modem {
    pub(super) fn dial(&mut self, number: &str, voice: bool) -> Result<Flow> {
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

    pub(super) fn answer(&mut self) -> Result<()> {
        match &mut self.call {
            Some(c) if c.state == CallState::Incoming => {
                c.state = CallState::Active;
                c.state_since_ns = self.now_ns;
                Ok(())
            }
            _ => Err(ModemError::NoCall),
        }
    }

    pub(super) fn ring(&mut self) {
        self.result("RING");
        if self.set.clip {
            if let Some(c) = &self.call {
                let line = format!("+CLIP: \"{}\",{}", c.number, toa(&c.number));
                self.info(&line);
            }
        }
        self.last_ring_ns = self.now_ns;
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

    /// The current call, if any.
    pub fn call(&self) -> Option<&Call> {
        self.call.as_ref()
    }
}
