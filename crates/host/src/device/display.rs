//! The display device (being written: answers every command with NotSupported for now).

use virtsoc_proto::Status;

use super::registry::DeviceConfig;
use super::{Device, DeviceCtx, DeviceResult};
use crate::Result;

/// The display device.
pub struct Display;

impl Display {
    /// Builds the device from the daemon's configuration.
    pub fn new(_cfg: &DeviceConfig) -> Result<Self> {
        Ok(Display)
    }
}

impl Device for Display {
    fn name(&self) -> &str {
        "display"
    }

    fn backend(&self) -> String {
        "none yet".into()
    }

    fn execute(&self, _cx: &DeviceCtx<'_>, _args: &[u64; 6]) -> DeviceResult {
        Err(Status::NotSupported)
    }
}
