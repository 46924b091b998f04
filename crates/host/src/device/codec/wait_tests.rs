//! The waiter's `encode` and `decode`: a frame handed to an encoder's worker, or a packet
//! to a decoder's, holds no other guest.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use virtsoc_devapi::codec as api;
use virtsoc_devapi::{codec_kind, DeviceCommand};
use virtsoc_ids::{HandleId, RegionId};
use virtsoc_media::codec::{EncodedPacket, EncoderBackend};
use virtsoc_media::{DecodedFrame, DecoderBackend, FrameLayout, FrameRef, MediaError, PixelFormat};
use virtsoc_proto::{wire::Format, AccessMode, DeviceId, Opcode};
use virtsoc_svm::{AccessSpec, DomainId, GuestId};

use super::super::Codec;
use crate::device::registry::DeviceConfig;
use crate::device::tests::{reply_for, results};
use crate::device::{Device, DeviceCtx};
use crate::testkit::{Core, GUEST};

/// Runs `held`, a command of `cx1`'s guest that waits for its worker, and checks that it is
/// not answered yet; then a `stream_info` of `cx2`'s guest on its decoder `h2`, which must
/// be answered at once (`what` names the case). Returns what fires once `held` is answered.
pub(in crate::device::codec) fn held_beside_another(
    codec: &Codec,
    core: &Core,
    (cx1, held): (&DeviceCtx<'_>, [u64; 6]),
    (cx2, h2): (&DeviceCtx<'_>, HandleId),
    what: &str,
) -> std::sync::mpsc::Receiver<()> {
    let (done, answered) = std::sync::mpsc::channel();
    let mut reply = reply_for(core, 7);
    reply.on_sent = Some(Box::new(move |_| done.send(()).unwrap()));
    codec.execute_async(cx1, &held, reply);
    let early = results(core);
    assert!(
        early.is_empty(),
        "{what}: answered before its worker did: {early:?}"
    );
    let info = api::StreamInfo { handle: h2 };
    codec.execute_async(cx2, &info.encode(), reply_for(core, 8));
    let other = results(core);
    assert_eq!(other.len(), 1, "{what}");
    assert_eq!(other[0].0, 8, "{what}");
    assert!(other[0].1.is_ok(), "{what}: {:?}", other[0].1);
    answered
}

/// A 4 KiB bitstream region of the test's guest, read-accessed by a device of domain 2 (that
/// domain's, for the codec's commands).
pub(in crate::device::codec) fn read_bitstream(core: &mut Core) -> (u64, DomainId) {
    let bitstream = core.blob(4096);
    let domain = DomainId(2);
    let len = core.svm.meta(GUEST, RegionId(bitstream)).unwrap().size;
    let spec = AccessSpec::new(DeviceId::PRODUCER.0, domain, 0, len, AccessMode::Read);
    core.svm
        .begin_access(GUEST, RegionId(bitstream), &spec)
        .unwrap();
    (bitstream, domain)
}

/// An encoder running apart: a frame started is answered with one packet (the byte the test
/// writes to the other end of `answers`, after an H.264 start code) when the test writes it.
struct Starting {
    answers: UnixStream,
    started: bool,
}

impl EncoderBackend for Starting {
    fn name(&self) -> &str {
        "starting"
    }
    fn encode(
        &mut self,
        _frame: FrameRef<'_>,
        _pts: i64,
    ) -> virtsoc_media::Result<Vec<EncodedPacket>> {
        // What the codec's thread did before the waiter: waited here for the worker.
        Err(MediaError::Encode("encoded on the codec's thread".into()))
    }
    fn flush(&mut self) -> virtsoc_media::Result<Vec<EncodedPacket>> {
        Ok(Vec::new())
    }
    fn start(&mut self, _frame: FrameRef<'_>, _pts: i64) -> virtsoc_media::Result<bool> {
        self.started = true;
        Ok(true)
    }
    fn started(&self) -> bool {
        self.started
    }
    fn finish(&mut self) -> virtsoc_media::Result<Vec<EncodedPacket>> {
        if !std::mem::take(&mut self.started) {
            return Ok(Vec::new());
        }
        let mut b = [0u8; 1];
        match self.answers.read(&mut b) {
            Ok(1) => Ok(vec![EncodedPacket {
                data: vec![0, 0, 0, 1, 0x65, b[0]],
                pts: 5,
                dts: 5,
                keyframe: true,
            }]),
            _ => Err(MediaError::Encode("no answer".into())),
        }
    }
    fn answers_fd(&self) -> Option<BorrowedFd<'_>> {
        self.started.then(|| self.answers.as_fd())
    }
}

/// An `encode` whose encoder runs apart does not hold the device while its worker encodes:
/// another guest's commands are answered meanwhile, and the encode once its packets come,
/// written into its output region.
#[test]
fn an_encode_waiting_for_its_worker_holds_no_other_guest() {
    let codec = Codec::new(&DeviceConfig::default()).unwrap();
    let mut core = Core::new();
    let alloc = [0, 64, 48, Format::Nv12 as u64, 0, 0];
    let frame = core.call(Opcode::Alloc, DeviceId::CPU, alloc).unwrap()[0];
    let out = core.blob(4096);
    // The codec here is a device of the test core's first device domain (the producer's),
    // with the accesses a guest would take: the frame read, the packets' region written.
    let domain = DomainId(2);
    for (id, mode) in [(frame, AccessMode::Read), (out, AccessMode::Write)] {
        let len = core.svm.meta(GUEST, RegionId(id)).unwrap().size;
        let spec = AccessSpec::new(DeviceId::PRODUCER.0, domain, 0, len, mode);
        core.svm.begin_access(GUEST, RegionId(id), &spec).unwrap();
    }
    let cx = |g| DeviceCtx::new(g, &core.svm, domain, core.session.fences());
    let (cx1, cx2) = (cx(GUEST), cx(GuestId(2)));
    let open = api::OpenEncoder {
        width: 64,
        height: 48,
        fps: 30,
        bitrate: 100_000,
    };
    let e = codec.open_encoder_at(GUEST, open, None, None).unwrap();
    let (mut worker, answers) = UnixStream::pair().unwrap();
    answers
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    codec.state().encoder(GUEST, e).unwrap().encoder = Box::new(Starting {
        answers,
        started: false,
    });
    // Another guest on the codec (alone, the encode would run on the codec's thread).
    let dec = api::OpenDecoder {
        kind: codec_kind::H264,
        format: Format::Nv12 as u64,
        threads: 1,
    };
    let h2 = HandleId(codec.open_decoder_for(&cx2, dec).unwrap()[0]);
    let encode = api::Encode {
        handle: e,
        frame: RegionId(frame),
        pts: 5,
        out: RegionId(out),
    };
    let held = (&cx1, encode.encode());
    let answered = held_beside_another(&codec, &core, held, (&cx2, h2), "encode");
    worker.write_all(&[0x42]).unwrap();
    answered.recv_timeout(Duration::from_secs(30)).unwrap();
    let got = results(&core);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, 7);
    let r = api::EncodeReply::from_values(&got[0].1.unwrap());
    assert_eq!((r.bytes, r.keyframe, r.out_pts), (6, 1, 5));
    let written = cx1.with_source(RegionId(out), |b| b[..6].to_vec()).unwrap();
    assert_eq!(written, [0, 0, 0, 1, 0x65, 0x42], "the worker's packet");
}

/// A decoder running apart whose answers come when the test writes a byte to the other end
/// of `answers`: with one thread (`full` false) a packet started is answered with a 64x48
/// picture carrying the packet's pts (a flush started: pts 9); with frame threads and its most packets in flight
/// (`full`), `submit` takes the packet once the oldest answer has come (its picture, pts 1).
struct Slow {
    answers: UnixStream,
    started: Option<i64>,
    full: bool,
}

impl Slow {
    fn picture(&mut self, pts: i64) -> virtsoc_media::Result<Vec<DecodedFrame>> {
        let mut b = [0u8; 1];
        match self.answers.read(&mut b) {
            Ok(1) => {
                let layout = FrameLayout::packed(PixelFormat::Nv12, 64, 48).unwrap();
                Ok(vec![DecodedFrame::packed(
                    layout,
                    pts,
                    vec![b[0]; layout.size()],
                )])
            }
            _ => Err(MediaError::Decode("no answer".into())),
        }
    }
}

impl DecoderBackend for Slow {
    fn name(&self) -> &str {
        "slow"
    }
    fn decode(&mut self, _packet: &[u8], _pts: i64) -> virtsoc_media::Result<Vec<DecodedFrame>> {
        // What the codec's thread did before the waiter: waited here for the worker.
        Err(MediaError::Decode("decoded on the codec's thread".into()))
    }
    fn submit(&mut self, packet: &[u8], pts: i64) -> virtsoc_media::Result<Vec<DecodedFrame>> {
        if !self.full || self.would_wait() {
            return self.decode(packet, pts);
        }
        self.full = false;
        self.picture(1)
    }
    fn flush(&mut self) -> virtsoc_media::Result<Vec<DecodedFrame>> {
        Ok(Vec::new())
    }
    fn output_layout(&self) -> Option<FrameLayout> {
        None
    }
    fn in_flight(&self) -> usize {
        usize::from(self.started.is_some()) + if self.full { 4 } else { 0 }
    }
    fn start(&mut self, _packet: &[u8], pts: i64) -> virtsoc_media::Result<bool> {
        if self.full || self.started.is_some() {
            return Ok(false);
        }
        self.started = Some(pts);
        Ok(true)
    }
    fn starts(&self) -> bool {
        !self.full && self.started.is_none()
    }
    fn start_flush(&mut self) -> virtsoc_media::Result<bool> {
        // The flush's answer: a picture of pts 9.
        self.start(&[], 9)
    }
    fn started(&self) -> bool {
        self.started.is_some()
    }
    fn finish(&mut self) -> virtsoc_media::Result<Vec<DecodedFrame>> {
        match self.started.take() {
            Some(pts) => self.picture(pts),
            None => Ok(Vec::new()),
        }
    }
    fn would_wait(&mut self) -> bool {
        let readable = {
            let mut fds = [rustix::event::PollFd::new(
                &self.answers,
                rustix::event::PollFlags::IN,
            )];
            rustix::event::poll(&mut fds, Some(&rustix::time::Timespec::default()))
                .is_ok_and(|n| n > 0)
        };
        (self.started.is_some() || self.full) && !readable
    }
    fn answers_fd(&self) -> Option<BorrowedFd<'_>> {
        (self.started.is_some() || self.full).then(|| self.answers.as_fd())
    }
}

/// A `decode` or `flush` that would wait for its decoder's worker does not hold the device
/// while the worker decodes, with one decoding thread (its packet sent first, its picture
/// read once it comes), with frame threads and the most packets in flight (the command runs
/// once the oldest answer has come) and for a flush (sent, then answered once its answer
/// has come): another guest's commands are answered meanwhile, and the waiting one once its
/// worker answers, with the pictures its answer brought.
#[test]
fn a_decode_or_flush_waiting_for_its_worker_holds_no_other_guest() {
    for (full, flush) in [(false, false), (true, false), (false, true)] {
        let codec = Codec::new(&DeviceConfig::default()).unwrap();
        let mut core = Core::new();
        let (bitstream, domain) = read_bitstream(&mut core);
        let cx = |g| DeviceCtx::new(g, &core.svm, domain, core.session.fences());
        let (cx1, cx2) = (cx(GUEST), cx(GuestId(2)));
        let open = api::OpenDecoder {
            kind: codec_kind::H264,
            format: Format::Nv12 as u64,
            threads: 1,
        };
        let h = HandleId(codec.open_decoder_for(&cx1, open).unwrap()[0]);
        let (mut worker, answers) = UnixStream::pair().unwrap();
        answers
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let slow = Slow {
            answers,
            started: None,
            full,
        };
        *codec.state().decoder(GUEST, h).unwrap() =
            super::super::state::DecoderSession::new(Box::new(slow), Format::Nv12);
        // Another guest on the codec (alone, the decode would run on the codec's thread).
        let h2 = HandleId(codec.open_decoder_for(&cx2, open).unwrap()[0]);
        let decode = api::Decode {
            handle: h,
            bitstream: RegionId(bitstream),
            len: 100,
            pts: 5,
        };
        let command = match flush {
            true => api::Flush { handle: h }.encode(),
            false => decode.encode(),
        };
        let what = format!("full {full}, flush {flush}");
        let answered = held_beside_another(&codec, &core, (&cx1, command), (&cx2, h2), &what);

        worker.write_all(&[0x42]).unwrap();
        answered.recv_timeout(Duration::from_secs(30)).unwrap();
        let got = results(&core);
        assert_eq!(got.len(), 1, "full {full}, flush {flush}");
        assert_eq!(got[0].0, 7);
        let ready = match flush {
            true => api::FlushReply::from_values(&got[0].1.unwrap()).frames_ready,
            false => api::DecodeReply::from_values(&got[0].1.unwrap()).frames_ready,
        };
        assert_eq!(
            ready, 1,
            "full {full}, flush {flush}: the picture its worker answered"
        );
        let mut st = codec.state();
        let s = st.decoder(GUEST, h).unwrap();
        let pts = [[5, 9], [1, 1]][usize::from(full)][usize::from(flush)];
        assert_eq!(
            s.ready.front().map(|f| f.pts),
            Some(pts),
            "full {full}, flush {flush}"
        );
        assert!(!s.decoder.started() && s.decoder.in_flight() == 0);
    }
}
