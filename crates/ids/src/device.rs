//! Device ids (which virtual device a request names) and handles (an object a guest opened
//! on one device: a decoder, an encoder, a GL context...).

/// A virtual device as named in requests (the request's `device` word).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId(pub u32);

impl DeviceId {
    /// The guest CPU: accesses go through the guest window.
    pub const CPU: DeviceId = DeviceId(0);
    /// Test device that writes a pattern into a region.
    pub const PRODUCER: DeviceId = DeviceId(1);
    /// Test device that checksums a region.
    pub const CONSUMER: DeviceId = DeviceId(2);
    /// A second checksum device, for multi-reader flows.
    pub const CONSUMER2: DeviceId = DeviceId(3);
}

/// An object a guest opened on one device (a codec's decoder or encoder...): the device hands
/// it out in a completion value and the guest names it in later commands. Handles are the
/// device's own per guest, so a handle is named host-wide only with its guest and device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct HandleId(pub u64);

wire_word!(DeviceId: u32, HandleId: u64);
