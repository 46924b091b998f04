//! SMS in text mode: sending (`+CMGS`), the storage (`+CMGL`, `+CMGR`, `+CMGD`), the host's
//! incoming messages (`+CMTI`) and the record of sent ones.

use super::*;

impl Modem {
    pub(super) fn send_sms(&mut self, to: String, text: &[u8]) {
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

    pub(super) fn require_text_mode(&self) -> std::result::Result<(), Failure> {
        if self.set.text_mode {
            Ok(())
        } else {
            Err(Failure::Cms(ModemError::NotSupported))
        }
    }

    pub(super) fn cmgs(&mut self, op: ExtOp) -> CmdResult {
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

    pub(super) fn cmgl(&mut self, op: ExtOp) -> CmdResult {
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

    pub(super) fn storage_index(&self, args: &[Arg]) -> std::result::Result<u32, Failure> {
        let arg = args.first().ok_or(Failure::Plain)?;
        match arg.number() {
            Some(i) if (1..=self.cfg.sms_capacity).contains(&i) => Ok(i),
            Some(i) => Err(Failure::Cms(ModemError::InvalidIndex(i))),
            None => Err(Failure::Cms(ModemError::InvalidParameter("index"))),
        }
    }

    pub(super) fn cmgr(&mut self, op: ExtOp) -> CmdResult {
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

    pub(super) fn cmgd(&mut self, op: ExtOp) -> CmdResult {
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

    // Host inspection

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
}
