//! The gpu device (being written: answers every command with NotSupported for now).

use virtsoc_proto::Status;

use super::registry::DeviceConfig;
use super::{Device, DeviceCtx, DeviceResult};
use crate::Result;

/// The gpu device.
pub struct Gpu;

impl Gpu {
    /// Builds the device from the daemon's configuration.
    pub fn new(_cfg: &DeviceConfig) -> Result<Self> {
        Ok(Gpu)
    }
}

impl Device for Gpu {
    fn name(&self) -> &str {
        "gpu"
    }

    fn backend(&self) -> String {
        "none yet".into()
    }

    fn execute(&self, _cx: &DeviceCtx<'_>, _args: &[u64; 6]) -> DeviceResult {
        Err(Status::NotSupported)
    }
}
