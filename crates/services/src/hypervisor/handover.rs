//! Migration of a guest's service sessions: what the source daemon's hypervisor hands over
//! (the guest's channels by id, and each service's state for the guest), and how the
//! target's takes it over under the guest's new id, keeping the channel ids.
//!
//! Channel ids are unique across daemons in practice: each hypervisor numbers its channels
//! from a random base ([`channel_id_base`]), so a channel that comes with a guest keeps its
//! id on the target; the rare id already taken there is refused (that channel does not come
//! back; its guest gets an error when it resumes it).

use std::io::Read;

use serde_json::{Map, Value};

use super::{lock, ChannelRec, Hypervisor};
use crate::chan::{Entry, MAX_ENTRIES, SLOT_SIZE};
use crate::{Result, ServiceError};
use virtsoc_sync::RwLockExt;

/// Most channels one guest's record may carry.
pub const MAX_RECORD_CHANNELS: usize = 64;

/// The first channel id of a hypervisor: a random 20-bit base above 2^32 (ids stay below
/// 2^53, exact in any JSON reader).
pub fn channel_id_base() -> u64 {
    let mut b = [0u8; 4];
    let random = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map(|_| u32::from_le_bytes(b))
        .unwrap_or_else(|_| {
            // No urandom: the process id and the clock differ between daemons well enough.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            std::process::id() ^ t
        });
    (u64::from(random & 0xf_ffff) | 1) << 32
}

/// A channel as a migration record names it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChannelRecord {
    /// Its id (kept on the target).
    pub id: u64,
    /// The service it is open to.
    pub service: String,
    /// The guest's region its rings live in.
    pub region: u64,
    /// The answers the guest may not have read yet when the channel stopped: the target
    /// posts them into the channel's new rings first (the guest takes those it waits for).
    #[serde(default)]
    pub answers: Vec<KeptAnswer>,
}

/// An answer posted to a channel's response ring, with its slot's bytes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeptAnswer {
    /// The response entry.
    pub seq: u64,
    /// Its status (0: ok).
    pub code: u32,
    /// The slot its output is in.
    pub slot: u32,
    /// Bytes of output (or error text) in the slot.
    pub len: u32,
    /// Its values.
    pub args: [u64; 5],
    /// The slot's bytes (the first `len`), in hex.
    pub out: String,
}

impl KeptAnswer {
    /// The answer of response `e` whose slot holds `bytes`.
    pub fn new(e: &Entry, bytes: &[u8]) -> Self {
        KeptAnswer {
            seq: e.seq,
            code: e.code,
            slot: e.slot,
            len: e.len,
            args: e.args,
            out: bytes.iter().map(|b| format!("{b:02x}")).collect(),
        }
    }

    /// The response entry and its slot's bytes, checked against a channel of `entries`
    /// slots (untrusted input).
    pub fn decode(&self, entries: u32) -> Result<(Entry, Vec<u8>)> {
        let bad = |m: &str| Err(ServiceError::BadArgument(format!("kept answer: {m}")));
        if self.slot >= entries || self.len > SLOT_SIZE {
            return bad("slot or length out of range");
        }
        let hex = self.out.as_bytes();
        if !hex.len().is_multiple_of(2) || hex.len() / 2 > self.len as usize {
            return bad("output longer than its length");
        }
        let nib = |c: u8| (c as char).to_digit(16);
        let mut bytes = Vec::with_capacity(hex.len() / 2);
        for p in hex.chunks_exact(2) {
            match (nib(p[0]), nib(p[1])) {
                (Some(h), Some(l)) => bytes.push((h * 16 + l) as u8),
                _ => return bad("output not hex"),
            }
        }
        let e = Entry {
            seq: self.seq,
            code: self.code,
            call: 0,
            slot: self.slot,
            len: self.len,
            args: self.args,
        };
        Ok((e, bytes))
    }
}

impl Hypervisor {
    /// What each service keeps for `guest` (its instance's [`export_guest`]), by service name.
    ///
    /// [`export_guest`]: super::Service::export_guest
    pub fn export_guest(&self, guest: u64) -> Value {
        let all: Vec<(String, std::sync::Arc<super::Registered>)> = self
            .services
            .read_or_recover()
            .iter()
            .map(|(n, r)| (n.clone(), r.clone()))
            .collect();
        let mut out = Map::new();
        for (name, r) in all {
            let inst = match self.policy().instances(&name, r.default_instances) {
                super::Instances::Shared => lock(&r.shared).clone(),
                super::Instances::PerGuest => lock(&r.per_guest).get(&guest).cloned(),
            };
            if let Some(v) = inst.and_then(|i| i.export_guest(guest)) {
                out.insert(name, v);
            }
        }
        Value::Object(out)
    }

    /// Gives each service what [`export_guest`](Self::export_guest) of another daemon kept
    /// for the guest, now `guest` here; the services that refused theirs, with why.
    pub fn import_guest(&self, guest: u64, states: &Value) -> Vec<(String, ServiceError)> {
        let Some(states) = states.as_object() else {
            return vec![(
                String::new(),
                ServiceError::BadArgument("service states: a JSON object".into()),
            )];
        };
        let mut refused = Vec::new();
        for (name, state) in states {
            let r = self
                .service(name)
                .map(|r| self.instance(&r, name, guest))
                .and_then(|inst| inst.import_guest(guest, state));
            if let Err(e) = r {
                refused.push((name.clone(), e));
            }
        }
        refused
    }

    /// The channels of `guest`, as a migration record names them (`region` filled in by
    /// the caller, which knows where each channel lives).
    pub fn channels_of(&self, guest: u64) -> Vec<(u64, String)> {
        let mut v: Vec<(u64, String)> = lock(&self.channels)
            .iter()
            .filter(|(_, c)| c.guest == guest)
            .map(|(id, c)| (*id, c.service.clone()))
            .collect();
        v.sort();
        v
    }

    /// Takes over channel `id` of a guest that migrated here, now `guest` (named
    /// `guest_name`), open to `service`. Refused when the service is not here or the id is
    /// taken; the policy is checked at each call, as for any channel.
    pub fn adopt(&self, guest: u64, guest_name: &str, id: u64, service: &str) -> Result<()> {
        self.service(service)?;
        let mut ch = lock(&self.channels);
        if ch.contains_key(&id) {
            return Err(ServiceError::BadArgument(format!(
                "channel id {id} is taken in this daemon"
            )));
        }
        ch.insert(
            id,
            ChannelRec {
                guest,
                guest_name: guest_name.to_string(),
                service: service.to_string(),
            },
        );
        Ok(())
    }
}

/// Checks a record's channels (untrusted input): at most [`MAX_RECORD_CHANNELS`], ids
/// distinct and non-zero, service names valid, at most a ring of kept answers each (each
/// answer is checked when it is posted, [`KeptAnswer::decode`]).
pub fn check_channels(channels: &[ChannelRecord]) -> Result<()> {
    if channels.len() > MAX_RECORD_CHANNELS {
        return Err(ServiceError::BadArgument(format!(
            "{} channels in one guest's record (at most {MAX_RECORD_CHANNELS})",
            channels.len()
        )));
    }
    for (i, c) in channels.iter().enumerate() {
        if c.id == 0 || channels[..i].iter().any(|d| d.id == c.id) {
            return Err(ServiceError::BadArgument(format!(
                "channel id {} invalid or repeated",
                c.id
            )));
        }
        if c.answers.len() > MAX_ENTRIES as usize {
            return Err(ServiceError::BadArgument(format!(
                "channel {}: {} kept answers",
                c.id,
                c.answers.len()
            )));
        }
        if crate::pack_name(&c.service).is_none() {
            return Err(ServiceError::BadArgument(format!(
                "service name {:?}",
                c.service
            )));
        }
    }
    Ok(())
}
