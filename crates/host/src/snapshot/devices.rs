//! Device objects in a snapshot: per device, the record of the commands that created and
//! configured the guest's objects on it ([`Device::export_guest`](crate::device::Device::export_guest)),
//! replayed into the target daemon's device ([`Device::import_guest`](crate::device::Device::import_guest))
//! as AvA replays its recorded calls.

use std::collections::BTreeMap;
use virtsoc_svm::GuestId;

use crate::device::DeviceSet;

/// Each device's record of one guest's objects, by device name.
pub type DeviceRecords = BTreeMap<String, serde_json::Value>;

/// The records of `guest`'s objects on every device that keeps some.
pub fn capture(devices: &DeviceSet, guest: GuestId) -> DeviceRecords {
    devices
        .iter()
        .filter_map(|slot| {
            let v = slot.device.export_guest(guest)?;
            Some((slot.device.name().to_string(), v))
        })
        .collect()
}

/// Checks that every record names a device of this daemon (before anything is restored).
pub fn check(devices: &DeviceSet, records: &DeviceRecords) -> crate::Result<()> {
    for name in records.keys() {
        if !devices.iter().any(|s| s.device.name() == name) {
            return Err(super::format::err(format!(
                "the snapshot has objects of device {name:?}, which this daemon does not have"
            )));
        }
    }
    Ok(())
}

/// Replays the records into `guest`'s objects; returns the devices that refused theirs
/// (the rest of the session is restored all the same: a device object is recreated by the
/// guest at its next command, as after a device reset).
pub fn restore(devices: &DeviceSet, guest: GuestId, records: &DeviceRecords) -> Vec<String> {
    let mut refused = Vec::new();
    for (name, v) in records {
        if let Some(slot) = devices.iter().find(|s| s.device.name() == name) {
            if let Err(e) = slot.device.import_guest(guest, v) {
                log::warn!("guest {guest}: device {name} refused its snapshot record: {e}");
                refused.push(name.clone());
            }
        }
    }
    refused
}
