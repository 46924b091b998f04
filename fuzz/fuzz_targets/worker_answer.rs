//! The daemon's reading of a decoder worker's answer (crates/media/src/codec/worker): a
//! compromised worker sends arbitrary bytes; the daemon must refuse what is malformed and
//! never panic or allocate without bound.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    virtsoc_media::codec::check_worker_answer(data);
});
