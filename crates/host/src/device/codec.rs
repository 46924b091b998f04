//! The codec device (being written: answers every command with NotSupported for now).

use virtsoc_proto::Status;

use super::registry::DeviceConfig;
use super::{Device, DeviceCtx, DeviceResult};
use crate::Result;

/// The codec device.
pub struct Codec;

impl Codec {
    /// Builds the device from the daemon's configuration.
    pub fn new(_cfg: &DeviceConfig) -> Result<Self> {
        Ok(Codec)
    }
}

impl Device for Codec {
    fn name(&self) -> &str {
        "codec"
    }

    fn backend(&self) -> String {
        "none yet".into()
    }

    fn execute(&self, _cx: &DeviceCtx<'_>, _args: &[u64; 6]) -> DeviceResult {
        Err(Status::NotSupported)
    }
}
