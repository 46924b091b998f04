//! The services built into the daemon: location (`geo`), sensors (`sensor`), clipboard
//! (`clipboard`) and the bulk echo/sink service (`bulk`). Each is a module linked into the
//! daemon and registered with the hypervisor by [`register_all`].

pub mod bulk;
pub mod clipboard;
pub mod geo;
pub mod sensors;

use std::sync::Arc;

use crate::hypervisor::{Hypervisor, Service};
use crate::policy::Instances;

/// Registers every built-in service: the emulator's services shared by all guests (one
/// host), the bulk service per guest.
pub fn register_all(h: &Hypervisor) {
    let geo = Arc::new(geo::Geo::default());
    h.register(
        Instances::Shared,
        Arc::new(move || geo.clone() as Arc<dyn Service>),
    );
    let sensors = Arc::new(sensors::Sensors::default());
    h.register(
        Instances::Shared,
        Arc::new(move || sensors.clone() as Arc<dyn Service>),
    );
    let clip = Arc::new(clipboard::Clipboard::default());
    h.register(
        Instances::Shared,
        Arc::new(move || clip.clone() as Arc<dyn Service>),
    );
    h.register(
        Instances::PerGuest,
        Arc::new(|| Arc::new(bulk::Bulk::default()) as Arc<dyn Service>),
    );
}

/// Text input of a call, as UTF-8 (at most `max` bytes).
pub(crate) fn text(input: &dyn crate::payload::Input, max: usize) -> crate::Result<String> {
    if input.len() > max {
        return Err(crate::ServiceError::BadArgument(format!(
            "text of {} bytes (at most {max})",
            input.len()
        )));
    }
    String::from_utf8(input.to_vec()?)
        .map_err(|_| crate::ServiceError::BadArgument("text is not UTF-8".into()))
}

/// Writes `bytes` to `out` (checked against its capacity).
pub(crate) fn put(out: &mut dyn crate::payload::Output, bytes: &[u8]) -> crate::Result<usize> {
    if bytes.len() > out.capacity() {
        return Err(crate::ServiceError::BadArgument(format!(
            "answer of {} bytes exceeds the output's {}",
            bytes.len(),
            out.capacity()
        )));
    }
    out.write_at(0, bytes)?;
    Ok(bytes.len())
}
