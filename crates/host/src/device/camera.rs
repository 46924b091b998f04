//! The camera device (being written: answers every command with NotSupported for now).

use virtsoc_proto::Status;

use super::registry::DeviceConfig;
use super::{Device, DeviceCtx, DeviceResult};
use crate::Result;

/// The camera device.
pub struct Camera;

impl Camera {
    /// Builds the device from the daemon's configuration.
    pub fn new(_cfg: &DeviceConfig) -> Result<Self> {
        Ok(Camera)
    }
}

impl Device for Camera {
    fn name(&self) -> &str {
        "camera"
    }

    fn backend(&self) -> String {
        "none yet".into()
    }

    fn execute(&self, _cx: &DeviceCtx<'_>, _args: &[u64; 6]) -> DeviceResult {
        Err(Status::NotSupported)
    }
}
