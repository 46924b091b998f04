//! The isp device (being written: answers every command with NotSupported for now).

use std::sync::Arc;

use virtsoc_proto::Status;

use super::registry::DeviceConfig;
use super::{Device, DeviceCtx, DeviceResult};
use crate::Result;

/// The isp device.
pub struct Isp;

impl Isp {
    /// Builds the device from the daemon's configuration.
    pub fn new(_cfg: &DeviceConfig, _gpu: &Arc<super::gpu::Gpu>) -> Result<Self> {
        Ok(Isp)
    }
}

impl Device for Isp {
    fn name(&self) -> &str {
        "isp"
    }

    fn backend(&self) -> String {
        "none yet".into()
    }

    fn execute(&self, _cx: &DeviceCtx<'_>, _args: &[u64; 6]) -> DeviceResult {
        Err(Status::NotSupported)
    }
}
