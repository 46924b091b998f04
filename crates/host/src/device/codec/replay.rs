//! Snapshots of a guest's codec sessions as records of the commands that opened them (AvA's
//! record and replay): each open decoder or encoder is kept as its `open_decoder` /
//! `open_encoder` arguments and its handle, and a restore replays the command under the same
//! handle. The codec's internal state is not kept: a restored decoder starts afresh, so it
//! decodes again from the next key frame the guest sends (pictures decoded but not yet
//! received, and the frames between the snapshot and that key frame, are lost); a restored
//! encoder starts a new stream (its first frame is a key frame).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use virtsoc_devapi::codec as api;
use virtsoc_ids::HandleId;
use virtsoc_svm::GuestId;

use super::super::RecordError;
use super::Codec;

/// The command that opened a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub(super) enum Opened {
    Decoder {
        kind: u64,
        format: u64,
        threads: u64,
    },
    Encoder {
        width: u64,
        height: u64,
        fps: u64,
        bitrate: u64,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    handle: u64,
    opened: Opened,
}

/// Largest handle a record may name (so later handles never wrap).
const MAX_HANDLE: u64 = 1 << 32;
/// Most sessions a record may hold (the limits refuse more anyway).
const MAX_SESSIONS: usize = 1024;

impl Codec {
    pub(super) fn export(&self, guest: GuestId) -> Option<Value> {
        let st = self.state();
        let mut recs: Vec<Record> = st
            .sessions
            .iter()
            .filter(|((g, _), _)| *g == guest)
            .map(|((_, handle), o)| Record {
                handle: handle.0,
                opened: o.record,
            })
            .collect();
        if recs.is_empty() {
            return None;
        }
        recs.sort_by_key(|r| r.handle);
        serde_json::to_value(recs).ok()
    }

    /// Replays every record (untrusted: each goes through the same checks and quotas as the
    /// guest's own command). All or nothing: on a refusal the sessions opened are closed.
    pub(super) fn import(&self, guest: GuestId, v: &Value) -> Result<(), RecordError> {
        let recs: Vec<Record> = serde_json::from_value(v.clone())?;
        if recs.len() > MAX_SESSIONS {
            return Err(RecordError::Invalid(format!(
                "{} codec sessions",
                recs.len()
            )));
        }
        let mut opened = Vec::new();
        for r in &recs {
            if r.handle == 0 || r.handle > MAX_HANDLE {
                return Err(RecordError::Invalid(format!("codec handle {}", r.handle)));
            }
        }
        for r in &recs {
            let done = match r.opened {
                Opened::Decoder {
                    kind,
                    format,
                    threads,
                } => self.open_decoder_at(
                    guest,
                    api::OpenDecoder {
                        kind,
                        format,
                        threads,
                    },
                    Some(HandleId(r.handle)),
                    None,
                ),
                Opened::Encoder {
                    width,
                    height,
                    fps,
                    bitrate,
                } => self.open_encoder_at(
                    guest,
                    api::OpenEncoder {
                        width,
                        height,
                        fps,
                        bitrate,
                    },
                    Some(HandleId(r.handle)),
                    None,
                ),
            };
            match done {
                Ok(h) => opened.push(h),
                Err(s) => {
                    let mut st = self.state();
                    for h in opened {
                        st.remove(&(guest, h));
                    }
                    return Err(RecordError::Refused {
                        what: format!("codec session {}", r.handle),
                        status: s,
                    });
                }
            }
        }
        Ok(())
    }
}
