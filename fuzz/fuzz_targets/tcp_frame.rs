//! The remote guests' frame reader (crates/proto/src/stream.rs): arbitrary bytes as they
//! arrive on the TCP stream, read as request frames (what the daemon reads) and completion
//! frames (what a remote guest reads), through a reader that hands out short reads and read
//! timeouts the way a socket does. Every frame that decodes must re-encode to the same bytes;
//! no payload above the limit may be allocated; nothing panics.

#![no_main]

use std::io::{self, Read};

use libfuzzer_sys::fuzz_target;
use virtsoc_proto::stream::{read_frame, write_frame, StreamFrame, StreamFrameError};
use virtsoc_proto::{Completion, Request};
use vm_memory::ByteValued;

/// A stream that returns at most `chunk` bytes per read and, when `stall`, a timeout before
/// every other read (as a socket with a read timeout does).
struct Trickle<'a> {
    data: &'a [u8],
    chunk: usize,
    stall: bool,
    flip: bool,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.flip = !self.flip;
        if self.stall && self.flip {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(self.chunk).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn read_all<T: ByteValued + Default>(data: &[u8], chunk: usize, stall: bool, max: u64) {
    let mut r = Trickle {
        data,
        chunk,
        stall,
        flip: false,
    };
    for _ in 0..1000 {
        let before = r.data.len();
        match read_frame::<T>(&mut r, max) {
            Ok(StreamFrame { entry, payload }) => {
                assert!(payload.len() as u64 <= max);
                let mut again = Vec::new();
                write_frame(&mut again, &entry, &payload).expect("encode");
                assert_eq!(again.len(), before - r.data.len(), "a frame is its bytes");
            }
            Err(StreamFrameError::TooLarge { len, max: m }) => {
                assert!(len > m);
                return;
            }
            Err(e) if e.is_timeout() => {
                // Nothing was consumed: the reader may try again.
                assert_eq!(before, r.data.len());
            }
            Err(_) => return,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&cfg, rest)) = data.split_first() else {
        return;
    };
    let chunk = 1 + (cfg & 0x3f) as usize;
    let stall = cfg & 0x40 != 0;
    let max = if cfg & 0x80 != 0 { 1 << 20 } else { 64 };
    read_all::<Request>(rest, chunk, stall, max);
    read_all::<Completion>(rest, chunk, stall, max);
});
