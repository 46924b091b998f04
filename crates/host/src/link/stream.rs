//! [`StreamLink`]: the host end of a remote guest's TCP stream (see the parent module for
//! how it behaves: completions sent at once when the socket takes them, else by the writer
//! thread; CPU writes' bytes read straight into the window where the placer says).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, IoSlice, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::{Arc, Condvar, Mutex};

use virtsoc_proto::stream::{
    frame_head, read_head, read_rest, write_all_vectored, StreamFrameError,
};
use virtsoc_proto::{Completion, Request, SharedWindow};
use virtsoc_sync::{CondvarExt, LockExt};

use super::{HostLink, Incoming, LinkError, PayloadCharger, PayloadPlacer, STREAM_MAX_UNSENT};

/// The reader's buffer: frame heads and small payloads arrive in few reads; a CPU write's
/// bytes beyond what it holds are read straight into the window (so at most this many of
/// them are copied once more, out of it).
const READ_BUFFER: usize = 64 << 10;

/// A completion frame on its way: its head (entry and payload length), its payload, and
/// how many of their bytes are sent.
struct Frame {
    head: Vec<u8>,
    payload: Vec<u8>,
    sent: usize,
}

impl Frame {
    fn new(c: &Completion, payload: Vec<u8>) -> Frame {
        Frame {
            head: frame_head(c, payload.len()),
            payload,
            sent: 0,
        }
    }

    fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }

    /// What is left to send.
    fn rest(&self) -> [IoSlice<'_>; 2] {
        let h = self.sent.min(self.head.len());
        let p = self.sent.saturating_sub(self.head.len());
        [
            IoSlice::new(&self.head[h..]),
            IoSlice::new(&self.payload[p..]),
        ]
    }
}

struct Outbox {
    frames: VecDeque<Frame>,
    /// The writer thread is sending a frame it took off `frames`.
    writing: bool,
    in_flight: u64,
    /// Payload bytes of the frames queued and not yet written.
    bytes: u64,
    closed: bool,
}

/// Frames on a TCP stream.
pub struct StreamLink {
    reader: Mutex<BufReader<TcpStream>>,
    stream: TcpStream,
    outbox: Arc<(Mutex<Outbox>, Condvar)>,
    max_payload: u64,
    /// No request is taken while this many payload bytes wait to be sent.
    max_bytes: u64,
    /// Charges each incoming payload to the guest before it is allocated.
    charger: Option<PayloadCharger>,
    /// Where CPU writes' bytes go, read straight off the socket.
    placer: Option<(Arc<SharedWindow>, PayloadPlacer)>,
}

impl StreamLink {
    /// A link over `stream`; payloads over `max_payload` bytes are a violation; no request
    /// is taken while `max_bytes` bytes of completions wait to be sent (the guest's reads in
    /// flight are bounded by bytes, not only by count). Starts the writer thread.
    pub fn new(stream: TcpStream, max_payload: u64, max_bytes: u64) -> std::io::Result<Self> {
        stream.set_nodelay(true)?;
        let outbox = Arc::new((
            Mutex::new(Outbox {
                frames: VecDeque::new(),
                writing: false,
                in_flight: 0,
                bytes: 0,
                closed: false,
            }),
            Condvar::new(),
        ));
        let (w, ob) = (stream.try_clone()?, outbox.clone());
        std::thread::Builder::new()
            .name("tcp-writer".into())
            .spawn(move || writer(w, ob))?;
        Ok(StreamLink {
            reader: Mutex::new(BufReader::with_capacity(READ_BUFFER, stream.try_clone()?)),
            stream,
            outbox,
            max_payload,
            max_bytes,
            charger: None,
            placer: None,
        })
    }

    /// The same link, charging each request's payload (a remote CPU write's bytes, up to
    /// the window's size) against the guest's memory limit with `charger` before the
    /// payload is allocated, for as long as the request holds it: a guest whose payload
    /// would pass its limit is cut off, and the daemon never buffers bytes no guest is
    /// charged for.
    pub fn charging(mut self, charger: PayloadCharger) -> Self {
        self.charger = Some(charger);
        self
    }

    /// The same link, reading the bytes of each CPU write `placer` places straight into
    /// `window` (the host's copy of the guest's window) at the offset it gives: no buffer is
    /// allocated or charged for them, and they are not copied again.
    pub fn placing(mut self, window: Arc<SharedWindow>, placer: PayloadPlacer) -> Self {
        self.placer = Some((window, placer));
        self
    }

    /// Reads the `len` payload bytes of the frame whose head was just read into the window
    /// at `offset`: what the reader's buffer already holds, then straight off the socket.
    fn read_into_window(
        r: &mut BufReader<TcpStream>,
        window: &SharedWindow,
        offset: u64,
        len: u64,
    ) -> std::io::Result<()> {
        let buffered = r.buffer();
        let n = buffered.len().min(len as usize);
        window
            .copy_in(offset, &buffered[..n])
            .map_err(std::io::Error::other)?;
        r.consume(n);
        let rest = len - n as u64;
        if rest == 0 {
            return Ok(());
        }
        let slice = window
            .slice(offset + n as u64, rest)
            .map_err(std::io::Error::other)?;
        let guard = slice.ptr_guard_mut();
        read_raw(r.get_ref(), guard.as_ptr(), rest as usize)
    }
}

/// Reads exactly `len` bytes from `sock` into the memory at `at` with read(2) (no Rust
/// reference to it: it is shared memory others may read meanwhile), through interruptions
/// and read timeouts.
fn read_raw(sock: &TcpStream, mut at: *mut u8, mut len: usize) -> std::io::Result<()> {
    use std::io::ErrorKind;
    use std::os::fd::AsRawFd;
    while len > 0 {
        // SAFETY: the caller passes `len` writable bytes at `at` (a checked range of the
        // mapped window, kept mapped for the call); the kernel writes at most `len` of them.
        let n = unsafe { libc::read(sock.as_raw_fd(), at.cast(), len) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut => continue,
                _ => return Err(e),
            }
        }
        if n == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        let n = n as usize;
        // SAFETY: `n <= len`: still inside the caller's range.
        at = unsafe { at.add(n) };
        len -= n;
    }
    Ok(())
}

/// Sends what is left of `f` on `w`: all of it (true), or as much as the socket takes
/// now without blocking when `nonblocking` (false when some is left).
fn send_frame(w: &TcpStream, f: &mut Frame, nonblocking: bool) -> std::io::Result<bool> {
    if !nonblocking {
        let mut w = w;
        let mut bufs = f.rest();
        write_all_vectored(&mut w, &mut bufs)?;
        f.sent = f.len();
        return Ok(true);
    }
    while f.sent < f.len() {
        let flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
        let bufs = f.rest();
        let mut control = rustix::net::SendAncillaryBuffer::default();
        match rustix::net::sendmsg(w.as_fd(), &bufs, &mut control, flags) {
            Ok(n) => f.sent += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

fn writer(w: TcpStream, outbox: Arc<(Mutex<Outbox>, Condvar)>) {
    let (m, cv) = &*outbox;
    loop {
        let mut f = {
            let mut ob = m.lock_or_recover();
            loop {
                if let Some(f) = ob.frames.pop_front() {
                    ob.writing = true;
                    break f;
                }
                if ob.closed {
                    return;
                }
                ob = cv.wait_or_recover(ob);
            }
        };
        let ok = send_frame(&w, &mut f, false).is_ok();
        let sent = f.payload.len() as u64;
        drop(f);
        let mut ob = m.lock_or_recover();
        ob.writing = false;
        ob.in_flight = ob.in_flight.saturating_sub(1);
        ob.bytes = ob.bytes.saturating_sub(sent);
        if !ok {
            ob.closed = true;
        }
        cv.notify_all();
        if !ok {
            let _ = w.shutdown(std::net::Shutdown::Both);
            return;
        }
    }
}

impl HostLink for StreamLink {
    fn next(&self) -> Result<Option<Incoming>, LinkError> {
        {
            let (m, cv) = &*self.outbox;
            let mut ob = m.lock_or_recover();
            while !ob.closed && (ob.frames.len() >= STREAM_MAX_UNSENT || ob.bytes >= self.max_bytes)
            {
                ob = cv.wait_or_recover(ob);
            }
            if ob.closed {
                return Ok(None);
            }
        }
        let mut r = self.reader.lock_or_recover();
        let (req, len) = match read_head::<Request>(&mut *r, self.max_payload) {
            Ok(h) => h,
            Err(StreamFrameError::TooLarge { len, max }) => {
                return Err(LinkError::Violation(format!(
                    "frame payload of {len} bytes over {max}"
                )))
            }
            Err(_) => return Ok(None),
        };
        let place = match (&self.placer, len) {
            (Some((window, placer)), 1..) => placer(&req, len).map(|at| (window, at)),
            _ => None,
        };
        let (payload, charge, placed) = match place {
            Some((window, at)) => match Self::read_into_window(&mut r, window, at, len) {
                Ok(()) => (Vec::new(), None, true),
                Err(_) => return Ok(None),
            },
            None => {
                let charge = match (&self.charger, len) {
                    (Some(charge), 1..) => Some(charge(len).map_err(|e| {
                        LinkError::Violation(format!(
                            "frame payload of {len} bytes: buffering it would pass the \
                             guest's memory limit ({e})"
                        ))
                    })?),
                    _ => None,
                };
                let mut payload = vec![0u8; len as usize];
                if read_rest(&mut *r, &mut payload).is_err() {
                    return Ok(None);
                }
                (payload, charge, false)
            }
        };
        let (m, _) = &*self.outbox;
        m.lock_or_recover().in_flight += 1;
        Ok(Some(Incoming {
            req,
            payload,
            charge,
            placed,
        }))
    }

    fn post(&self, c: Completion, payload: Vec<u8>) -> Result<(), LinkError> {
        let (m, cv) = &*self.outbox;
        let mut ob = m.lock_or_recover();
        if ob.closed {
            return Ok(());
        }
        let mut c = c;
        c.queue_depth = ob.in_flight.saturating_sub(1).min(u32::MAX as u64) as u32;
        let mut f = Frame::new(&c, payload);
        if ob.frames.is_empty() && !ob.writing {
            // Nothing before it: send it now, as far as the socket takes it without
            // blocking; the writer thread sends the rest.
            match send_frame(&self.stream, &mut f, true) {
                Ok(true) => {
                    ob.in_flight = ob.in_flight.saturating_sub(1);
                    return Ok(());
                }
                Ok(false) => {}
                Err(_) => {
                    ob.closed = true;
                    cv.notify_all();
                    return Ok(());
                }
            }
        }
        ob.bytes += f.payload.len() as u64;
        ob.frames.push_back(f);
        cv.notify_all();
        Ok(())
    }

    fn close(&self) {
        let (m, cv) = &*self.outbox;
        m.lock_or_recover().closed = true;
        cv.notify_all();
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        let _ = (&self.stream).flush();
    }

    fn carries_bulk(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::mpsc;
    use std::time::Duration;
    use virtsoc_proto::stream::{read_frame, write_frame};
    use virtsoc_proto::{DeviceId, Opcode};

    /// A remote guest that does not read its completions holds back its own requests once
    /// the bytes waiting for it reach the limit: the daemon's outbox is bounded in bytes.
    #[test]
    fn no_request_is_taken_while_the_guests_bytes_wait() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (host, _) = l.accept().unwrap();
        let link = Arc::new(StreamLink::new(host, 1 << 20, 1 << 20).unwrap());
        // 64 MiB of read bytes: far more than the socket buffers take without the peer
        // reading, so they stay queued.
        link.post(Completion::ok(1, [0; 6]), vec![7u8; 64 << 20])
            .unwrap();
        let req = Request::new(2, Opcode::Nop, DeviceId::CPU, [0; 6]);
        write_frame(&mut peer, &req, &[]).unwrap();
        let (tx, rx) = mpsc::channel();
        let l2 = link.clone();
        let taker = std::thread::spawn(move || {
            let got = l2.next().unwrap().map(|i| i.req.seq);
            tx.send(got).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a request was taken with 64 MiB waiting for the guest"
        );
        // The guest reads its completion: the bytes drain and the request is taken.
        let mut r = std::io::BufReader::new(peer.try_clone().unwrap());
        let f = read_frame::<Completion>(&mut r, 128 << 20).unwrap();
        assert_eq!(f.payload.len(), 64 << 20);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(20)).unwrap(),
            Some(2),
            "the request is taken once the bytes drained"
        );
        taker.join().unwrap();
        link.close();
    }

    /// A connected pair: the host's link and the guest's end.
    fn pair(max_bytes: u64) -> (Arc<StreamLink>, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (host, _) = l.accept().unwrap();
        (
            Arc::new(StreamLink::new(host, 1 << 26, max_bytes).unwrap()),
            peer,
        )
    }

    fn pattern(seed: u8, n: usize) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    /// Completions posted while the guest reads nothing (the first partly sent at once, the
    /// rest queued behind it), then read by a guest that stops in the middle of a frame and
    /// goes on later in small reads: every byte arrives, in order.
    #[test]
    fn completions_keep_every_byte_in_order_across_a_stalled_reader() {
        let (link, peer) = pair(1 << 30);
        let sizes = [8 << 20, 0, 100, 12 << 20, 1, 3 << 20];
        for (i, n) in sizes.iter().enumerate() {
            link.post(
                Completion::ok(i as u64, [i as u64; 6]),
                pattern(i as u8, *n),
            )
            .unwrap();
        }
        // Half of the first frame's payload, then nothing for a while (the writer blocks),
        // then the rest in reads of at most 4 KiB.
        let mut r = std::io::BufReader::with_capacity(4096, peer);
        let (c, len) = read_head::<Completion>(&mut r, 1 << 26).unwrap();
        assert_eq!((c.seq, len), (0, 8 << 20));
        let mut first = vec![0u8; 8 << 20];
        read_rest(&mut r, &mut first[..4 << 20]).unwrap();
        std::thread::yield_now();
        read_rest(&mut r, &mut first[4 << 20..]).unwrap();
        assert!(first == pattern(0, 8 << 20), "frame 0");
        for (i, n) in sizes.iter().enumerate().skip(1) {
            let f = read_frame::<Completion>(&mut r, 1 << 26).unwrap();
            assert_eq!((f.entry.seq, f.entry.values), (i as u64, [i as u64; 6]));
            assert!(f.payload == pattern(i as u8, *n), "frame {i}");
        }
        link.close();
    }

    /// A CPU write's bytes, sent by a slow writer in small pieces, land in the window where
    /// the placer says (no payload buffer); a request the placer does not place comes with
    /// its payload as before.
    #[test]
    fn placed_writes_are_read_straight_into_the_window() {
        let window = crate::testkit::window();
        let (l, mut peer) = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (host, _) = l.accept().unwrap();
            (StreamLink::new(host, 1 << 20, 1 << 20).unwrap(), peer)
        };
        let link = l.placing(
            window.clone(),
            Box::new(|req, len| (req.seq == 1 && len == 5000).then_some(4096)),
        );
        let bytes = pattern(7, 5000);
        let mut frame = Vec::new();
        let req = Request::new(1, Opcode::EndAccess, DeviceId::CPU, [0; 6]);
        write_frame(&mut frame, &req, &bytes).unwrap();
        let other = Request::new(2, Opcode::EndAccess, DeviceId::CPU, [0; 6]);
        write_frame(&mut frame, &other, &bytes[..10]).unwrap();
        let (tx, rx) = mpsc::channel();
        let w = std::thread::spawn(move || {
            for chunk in frame.chunks(700) {
                peer.write_all(chunk).unwrap();
                std::thread::yield_now();
            }
            // Hold the stream open until the host has read everything.
            rx.recv().ok();
        });
        let a = link.next().unwrap().unwrap();
        assert!(a.placed && a.payload.is_empty() && a.charge.is_none());
        let mut got = vec![0u8; 5000];
        window.copy_out(4096, &mut got).unwrap();
        assert!(got == bytes, "the bytes in the window");
        let b = link.next().unwrap().unwrap();
        assert!(!b.placed);
        assert_eq!((b.req.seq, &b.payload[..]), (2, &bytes[..10]));
        tx.send(()).unwrap();
        w.join().unwrap();
        link.close();
    }

    /// A payload the link does not place is buffered, charged to the guest first: a charge
    /// refused cuts the guest off before anything is allocated.
    #[test]
    fn unplaced_payloads_are_charged_before_they_are_buffered() {
        let (l, mut peer) = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (host, _) = l.accept().unwrap();
            (StreamLink::new(host, 1 << 20, 1 << 20).unwrap(), peer)
        };
        let charged = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let c = charged.clone();
        let link = l
            .charging(Box::new(move |len| {
                c.fetch_add(len, std::sync::atomic::Ordering::SeqCst);
                Err(virtsoc_svm::SvmError::OutOfMemory)
            }))
            .placing(crate::testkit::window(), Box::new(|_, _| None));
        let req = Request::new(1, Opcode::EndAccess, DeviceId::CPU, [0; 6]);
        write_frame(&mut peer, &req, &[1u8; 1000]).unwrap();
        assert!(matches!(link.next(), Err(LinkError::Violation(_))));
        assert_eq!(charged.load(std::sync::atomic::Ordering::SeqCst), 1000);
        link.close();
    }
}
