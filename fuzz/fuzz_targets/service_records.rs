//! What host services read from outside the daemon's own memory, from arbitrary bytes: a
//! migration's hand-over record (the channels with their kept answers, the services'
//! states for a guest; `virtsoc_services::hypervisor::handover`) and a host program's
//! registration (`virtsoc_services::external`). A record that checks out names channels
//! within bounds and answers that fit their slots; a state a service refuses is an error.
//! Every error is fine; a panic is not.

#![no_main]

use libfuzzer_sys::fuzz_target;
use virtsoc_services::chan::{MAX_ENTRIES, SLOT_SIZE};
use virtsoc_services::external::FromProgram;
use virtsoc_services::hypervisor::handover::{check_channels, ChannelRecord};
use virtsoc_services::hypervisor::Hypervisor;

fuzz_target!(|data: &[u8]| {
    if let Ok(FromProgram::Register(r)) = serde_json::from_slice(data) {
        if let Ok((slots, bytes)) = r.check() {
            assert!(slots >= 1 && bytes >= 64 << 10 && u64::from(slots) * bytes <= 1 << 30);
        }
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(chs) = serde_json::from_value::<Vec<ChannelRecord>>(v["channels"].clone()) {
        if check_channels(&chs).is_ok() {
            for a in chs.iter().flat_map(|c| &c.answers) {
                if let Ok((e, bytes)) = a.decode(MAX_ENTRIES) {
                    assert!(e.slot < MAX_ENTRIES && e.len <= SLOT_SIZE);
                    assert!(bytes.len() <= e.len as usize);
                }
            }
        }
    }
    let hv = Hypervisor::default();
    virtsoc_services::builtin::register_all(&hv);
    let _ = hv.import_guest(1, &v["services"]);
    let _ = hv.export_guest(1);
});
