//! Unit tests of the codec device: sessions, limits, statuses.

use super::*;
use virtsoc_media::DecodedFrame;

impl Codec {
    /// `open_decoder` for `guest` without a command's context (no worker charge).
    fn open_decoder(&self, guest: GuestId, c: api::OpenDecoder) -> DeviceResult {
        let handle = self.open_decoder_at(guest, c, None, None)?;
        Ok(api::OpenDecoderReply { handle }.to_values())
    }

    /// `open_encoder` for `guest` without a command's context.
    fn open_encoder(&self, guest: GuestId, c: api::OpenEncoder) -> DeviceResult {
        let handle = self.open_encoder_at(guest, c, None, None)?;
        Ok(api::OpenEncoderReply { handle }.to_values())
    }
}

#[test]
fn region_formats_map_to_layouts() {
    let meta = |format, width, height, stride, size| RegionMeta {
        size,
        width,
        height,
        stride,
        format,
        usage: 0,
    };
    let l = frame_layout(&meta(Format::Nv12, 64, 48, 64, 64 * 48 * 3 / 2)).unwrap();
    assert_eq!((l.format, l.width, l.height), (PixelFormat::Nv12, 64, 48));
    assert_eq!(
        frame_layout(&meta(Format::Blob, 0, 0, 0, 100)),
        Err(Status::NotSupported)
    );
    assert_eq!(
        frame_layout(&meta(Format::Yuyv, 64, 48, 128, 64 * 48 * 2)),
        Err(Status::NotSupported)
    );
    // Metadata claiming more than the region holds.
    assert_eq!(
        frame_layout(&meta(Format::Yuv420p, 64, 48, 64, 100)),
        Err(Status::BadArgument)
    );
    assert_eq!(
        frame_layout(&meta(Format::Rgba8, 0, 48, 0, 100)),
        Err(Status::BadArgument)
    );
}

#[test]
fn handles_are_per_guest_and_bounded() {
    let codec = Codec::new(&DeviceConfig::default()).unwrap();
    assert!(codec.backend().starts_with("libavcodec"));
    let open = |guest| {
        codec.open_decoder(
            guest,
            api::OpenDecoder {
                kind: codec_kind::H264,
                format: Format::Nv12 as u64,
                threads: 1,
            },
        )
    };
    let h1 = open(GuestId(1)).unwrap()[0];
    let h2 = open(GuestId(2)).unwrap()[0];
    assert_eq!((h1, h2), (1, 1), "each guest counts its own handles");
    // Guest 2 cannot flush or close guest 1's second decoder.
    let h = open(GuestId(1)).unwrap()[0];
    assert_eq!(
        codec.close(
            GuestId(2),
            api::Close {
                handle: HandleId(h)
            }
        ),
        Err(Status::BadArgument)
    );
    assert_eq!(
        codec.flush(
            GuestId(1),
            api::Flush {
                handle: HandleId(h)
            }
        ),
        Ok([0; 6])
    );
    assert_eq!(
        codec.close(
            GuestId(1),
            api::Close {
                handle: HandleId(h)
            }
        ),
        Ok([0; 6])
    );
    assert_eq!(
        codec.close(
            GuestId(1),
            api::Close {
                handle: HandleId(h)
            }
        ),
        Err(Status::BadArgument)
    );
    for _ in 1..MAX_SESSIONS_PER_GUEST {
        open(GuestId(1)).unwrap();
    }
    assert_eq!(open(GuestId(1)), Err(Status::OutOfMemory));
    codec.guest_gone(GuestId(1));
    assert_eq!(open(GuestId(1)).unwrap()[0], 1);
    assert_eq!(
        codec.flush(
            GuestId(2),
            api::Flush {
                handle: HandleId(1)
            }
        ),
        Ok([0; 6])
    );
}

#[test]
fn sessions_and_threads_are_capped_across_guests() {
    let limits = Limits {
        codec_sessions: 3,
        codec_threads: 8,
        ..Limits::default()
    };
    let codec = Codec::new(&DeviceConfig::default())
        .unwrap()
        .with_limits(&limits);
    let open = |guest, threads| {
        codec.open_decoder(
            guest,
            api::OpenDecoder {
                kind: codec_kind::H264,
                format: Format::Nv12 as u64,
                threads,
            },
        )
    };
    // Threads: 4 + 4 fill the daemon's 8; a third decoder of any guest is Busy.
    let a = open(GuestId(1), 4).unwrap()[0];
    open(GuestId(2), 4).unwrap();
    assert_eq!(open(GuestId(3), 1), Err(Status::Busy));
    // Closing gives the threads back.
    codec
        .close(
            GuestId(1),
            api::Close {
                handle: HandleId(a),
            },
        )
        .unwrap();
    open(GuestId(3), 2).unwrap();
    open(GuestId(3), 2).unwrap();
    // Sessions: three open, a fourth (even of one thread) is Busy.
    assert_eq!(open(GuestId(4), 0), Err(Status::Busy));
    codec.guest_gone(GuestId(3));
    open(GuestId(4), 1).unwrap();
}

#[test]
fn bad_open_arguments() {
    let codec = Codec::new(&DeviceConfig::default()).unwrap();
    let dec = |kind, format, threads| {
        codec.open_decoder(
            GuestId(7),
            api::OpenDecoder {
                kind,
                format,
                threads,
            },
        )
    };
    assert_eq!(dec(99, Format::Nv12 as u64, 0), Err(Status::BadArgument));
    assert_eq!(
        dec(codec_kind::H264, Format::Rgba8 as u64, 0),
        Err(Status::NotSupported)
    );
    assert_eq!(dec(codec_kind::H264, 77, 0), Err(Status::BadArgument));
    assert_eq!(
        dec(codec_kind::H264, Format::Nv12 as u64, 1000),
        Err(Status::BadArgument)
    );
    let enc = |width, height, fps, bitrate| {
        codec.open_encoder(
            GuestId(7),
            api::OpenEncoder {
                width,
                height,
                fps,
                bitrate,
            },
        )
    };
    assert_eq!(enc(0, 240, 30, 1_000_000), Err(Status::BadArgument));
    assert_eq!(enc(321, 240, 30, 1_000_000), Err(Status::BadArgument));
    assert_eq!(enc(1 << 40, 240, 30, 1_000_000), Err(Status::BadArgument));
    assert_eq!(enc(320, 240, 0, 1_000_000), Err(Status::BadArgument));
    assert_eq!(enc(320, 240, 30, 0), Err(Status::BadArgument));
    assert!(enc(320, 240, 30, 1_000_000).is_ok());
    assert_eq!(
        codec.flush(
            GuestId(7),
            api::Flush {
                handle: HandleId(1)
            }
        ),
        Err(Status::BadArgument),
        "an encoder handle is not a decoder"
    );
}

#[test]
fn stream_info_reports_the_next_pictures_size_and_its_changes() {
    let codec = Codec::new(&DeviceConfig::default()).unwrap();
    let h = codec
        .open_decoder(
            GuestId(3),
            api::OpenDecoder {
                kind: codec_kind::H264,
                format: Format::Yuv420p as u64,
                threads: 1,
            },
        )
        .unwrap()[0];
    let info = |guest, handle| {
        codec
            .stream_info(guest, api::StreamInfo { handle })
            .map(|v| api::StreamInfoReply::from_values(&v))
    };
    let reply = |width, height, changes| api::StreamInfoReply {
        width,
        height,
        format: Format::Yuv420p as u64,
        changes,
        picture_width: width,
        picture_height: height,
    };
    assert_eq!(
        info(GuestId(3), HandleId(h)),
        Ok(reply(0, 0, 0)),
        "nothing decoded yet"
    );
    let pic = |w, h, pts| {
        let layout = FrameLayout::packed(PixelFormat::Yuv420p, w, h).unwrap();
        DecodedFrame::packed(layout, pts, vec![0; layout.size()])
    };
    codec
        .state()
        .decoder(GuestId(3), HandleId(h))
        .unwrap()
        .queue(vec![pic(64, 48, 0), pic(64, 48, 1), pic(32, 16, 2)]);
    assert_eq!(
        info(GuestId(3), HandleId(h)),
        Ok(reply(64, 48, 0)),
        "the oldest waiting picture (the change is behind it)"
    );
    let pop = || {
        codec
            .state()
            .decoder(GuestId(3), HandleId(h))
            .unwrap()
            .pop_ready();
    };
    pop();
    assert_eq!(info(GuestId(3), HandleId(h)), Ok(reply(64, 48, 0)));
    pop();
    assert_eq!(
        info(GuestId(3), HandleId(h)),
        Ok(reply(32, 16, 1)),
        "the new size before its picture"
    );
    pop();
    assert_eq!(
        info(GuestId(3), HandleId(h)),
        Ok(reply(32, 16, 1)),
        "none waiting: the last size"
    );
    codec
        .state()
        .decoder(GuestId(3), HandleId(h))
        .unwrap()
        .queue(vec![pic(64, 48, 3)]);
    assert_eq!(info(GuestId(3), HandleId(h)), Ok(reply(64, 48, 2)));
    assert_eq!(
        info(GuestId(4), HandleId(h)),
        Err(Status::BadArgument),
        "another guest's handle"
    );
    assert_eq!(
        info(GuestId(3), HandleId(h + 1)),
        Err(Status::BadArgument),
        "unknown handle"
    );
    let e = codec
        .open_encoder(
            GuestId(3),
            api::OpenEncoder {
                width: 64,
                height: 48,
                fps: 30,
                bitrate: 100_000,
            },
        )
        .unwrap()[0];
    assert_eq!(
        info(GuestId(3), HandleId(e)),
        Err(Status::BadArgument),
        "an encoder"
    );
}

#[test]
fn no_guest_holds_more_than_its_share_of_codec_threads() {
    let limits = Limits {
        codec_threads: 64,
        codec_threads_per_guest: 16,
        ..Limits::default()
    };
    let codec = Codec::new(&DeviceConfig::default())
        .unwrap()
        .with_limits(&limits);
    let open = |guest, threads| {
        codec.open_decoder(
            guest,
            api::OpenDecoder {
                kind: codec_kind::H264,
                format: Format::Nv12 as u64,
                threads,
            },
        )
    };
    // One guest asking for four 16-thread decoders (the whole daemon's threads) gets one.
    assert!(open(GuestId(1), 16).is_ok());
    for _ in 0..3 {
        assert_eq!(open(GuestId(1), 16), Err(Status::Busy));
    }
    let why = codec
        .state()
        .refusal(&limits, GuestId(1), 16)
        .map(|(_, why)| why)
        .unwrap_or_default();
    assert!(why.contains("share of 16"), "{why}");
    // The others still get theirs.
    for g in 2..=4 {
        assert!(open(GuestId(g), 16).is_ok(), "guest {g} was locked out");
    }
}

/// A guest asking for more decoder threads than a decoder may have, up to `u64::MAX`, is
/// refused as a bad argument before the quotas add them to what it holds (the sum
/// overflowed: a panic where overflow is checked, a wrapped sum that could pass the share
/// where it is not; found by the `device_commands` fuzzer), and it still opens decoders.
#[test]
fn a_guest_asking_for_too_many_decoder_threads_is_refused_before_the_quotas() {
    let codec = Codec::new(&DeviceConfig::default()).unwrap();
    let core = crate::testkit::Core::new();
    let cx = DeviceCtx::new(
        GuestId(1),
        &core.svm,
        virtsoc_svm::DomainId(0),
        core.session.fences(),
    );
    let open = |threads| {
        let c = api::OpenDecoder {
            kind: codec_kind::H264,
            format: Format::Nv12 as u64,
            threads,
        };
        codec.open_decoder_for(&cx, c)
    };
    assert!(open(1).is_ok());
    for threads in [MAX_DECODE_THREADS + 1, u64::MAX - 1, u64::MAX] {
        assert_eq!(open(threads), Err(Status::BadArgument), "{threads}");
        let why = cx.take_reason().unwrap_or_default();
        assert!(why.contains("at most 16"), "{why}");
    }
    let st = codec.state();
    let refused = st.refusal(&Limits::default(), GuestId(1), usize::MAX);
    assert_eq!(refused.map(|(s, _)| s), Some(Status::Busy), "no overflow");
    drop(st);
    assert!(open(0).is_ok(), "the guest goes on");
}

/// A guest's policy names its own share of codec threads (`codec_threads`), in place of the
/// daemon's `--limit-codec-threads-per-guest`, smaller or larger; other guests keep the
/// daemon's.
#[test]
fn a_guest_policy_sets_its_share_of_codec_threads() {
    use virtsoc_sched::policy::GuestPolicy;
    let limits = Limits {
        codec_threads: 64,
        codec_threads_per_guest: 16,
        ..Limits::default()
    };
    let codec = Codec::new(&DeviceConfig::default())
        .unwrap()
        .with_limits(&limits);
    let core = crate::testkit::Core::new();
    let (small, large) = (
        GuestPolicy {
            codec_threads: Some(4),
            ..GuestPolicy::default()
        },
        GuestPolicy {
            codec_threads: Some(32),
            ..GuestPolicy::default()
        },
    );
    let open = |guest: u64, threads: u64, policy: Option<&GuestPolicy>| {
        let mut cx = DeviceCtx::new(
            GuestId(guest),
            &core.svm,
            virtsoc_svm::DomainId(0),
            core.session.fences(),
        );
        cx.policy = policy;
        let c = api::OpenDecoder {
            kind: codec_kind::H264,
            format: Format::Nv12 as u64,
            threads,
        };
        codec.open_decoder_for(&cx, c).map(|_| ())
    };
    // 4 threads: one 4-thread decoder, not a fifth thread.
    assert_eq!(open(1, 4, Some(&small)), Ok(()));
    assert_eq!(open(1, 1, Some(&small)), Err(Status::Busy));
    // 32: two 16-thread decoders, past the daemon's per-guest 16.
    assert_eq!(open(2, 16, Some(&large)), Ok(()));
    assert_eq!(open(2, 16, Some(&large)), Ok(()));
    assert_eq!(open(2, 1, Some(&large)), Err(Status::Busy));
    // No policy: the daemon's 16.
    assert_eq!(open(3, 16, None), Ok(()));
    assert_eq!(open(3, 1, None), Err(Status::Busy));
}

/// A guest's policy names how many codec sessions (worker processes) it may hold
/// (`codec_sessions`), in place of the daemon's `--limit-codec-sessions`; past it an open is
/// `OutOfMemory`; other guests keep the daemon's.
#[test]
fn a_guest_policy_sets_its_share_of_codec_sessions() {
    use virtsoc_sched::policy::GuestPolicy;
    let limits = Limits {
        codec_sessions_per_guest: 4,
        ..Limits::default()
    };
    let codec = Codec::new(&DeviceConfig::default())
        .unwrap()
        .with_limits(&limits);
    let core = crate::testkit::Core::new();
    let two = GuestPolicy {
        codec_sessions: Some(2),
        ..GuestPolicy::default()
    };
    let open = |guest: u64, policy: Option<&GuestPolicy>| {
        let mut cx = DeviceCtx::new(
            GuestId(guest),
            &core.svm,
            virtsoc_svm::DomainId(0),
            core.session.fences(),
        );
        cx.policy = policy;
        let c = api::OpenDecoder {
            kind: codec_kind::H264,
            format: Format::Nv12 as u64,
            threads: 1,
        };
        codec.open_decoder_for(&cx, c).map(|_| ())
    };
    assert_eq!(open(1, Some(&two)), Ok(()));
    assert_eq!(open(1, Some(&two)), Ok(()));
    assert_eq!(open(1, Some(&two)), Err(Status::OutOfMemory));
    for _ in 0..4 {
        assert_eq!(open(2, None), Ok(()));
    }
    assert_eq!(open(2, None), Err(Status::OutOfMemory));
}

/// A decoder running apart whose CPU time is what it is told, decoding nothing; its
/// `flush` waits `wait` first, as a command waits for a worker that is not on a CPU yet.
struct Metered {
    cpu: std::sync::Arc<std::sync::atomic::AtomicU64>,
    wait: std::time::Duration,
}

impl virtsoc_media::DecoderBackend for Metered {
    fn name(&self) -> &str {
        "metered"
    }
    fn decode(&mut self, _packet: &[u8], _pts: i64) -> virtsoc_media::Result<Vec<DecodedFrame>> {
        Ok(Vec::new())
    }
    fn flush(&mut self) -> virtsoc_media::Result<Vec<DecodedFrame>> {
        std::thread::sleep(self.wait);
        Ok(Vec::new())
    }
    fn output_layout(&self) -> Option<FrameLayout> {
        None
    }
    fn cpu_ns(&self) -> Option<u64> {
        Some(self.cpu.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// A decoder's commands are charged what its worker used since its previous charge (its
/// frame threads decode between the guest's commands, while the device thread serves
/// others) plus the command's own CPU time on the device thread, not the time the command
/// waited; what the worker used before the session opened is not the guest's; a decoder on
/// the device's own threads is not measured apart.
#[test]
fn a_decoders_commands_are_charged_its_workers_cpu_time() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;
    let codec = Codec::new(&DeviceConfig::default()).unwrap();
    let core = crate::testkit::Core::new();
    let g = GuestId(1);
    let cx = DeviceCtx::new(
        g,
        &core.svm,
        virtsoc_svm::DomainId(0),
        core.session.fences(),
    );
    let c = api::OpenDecoder {
        kind: codec_kind::H264,
        format: Format::Nv12 as u64,
        threads: 1,
    };
    let h = HandleId(codec.open_decoder_for(&cx, c).unwrap()[0]);
    let flush = |cx: &DeviceCtx<'_>| {
        let args = virtsoc_devapi::DeviceCommand::encode(&api::Flush { handle: h });
        codec.execute(cx, &args).unwrap();
        cx.take_busy()
    };
    assert_eq!(
        flush(&cx),
        None,
        "in process: the wall time, as any command"
    );
    // A worker that used 40 ms before it served this guest (its start).
    let cpu = std::sync::Arc::new(AtomicU64::new(40_000_000));
    let wait = Duration::from_millis(30);
    let metered = Metered {
        cpu: cpu.clone(),
        wait,
    };
    *codec.state().decoder(g, h).unwrap() =
        state::DecoderSession::new(Box::new(metered), Format::Nv12);
    let ms = 1_000_000;
    let first = flush(&cx).expect("measured apart");
    assert!(
        first < ms,
        "the worker's start is not the guest's; the 30 ms wait is not charged: {first}"
    );
    cpu.fetch_add(15 * ms, Ordering::Relaxed);
    let second = flush(&cx).unwrap();
    assert!(
        (15 * ms..16 * ms).contains(&second),
        "the worker's 15 ms since, and the command's own CPU time: {second}"
    );
}

/// A decoder running apart with one packet in flight, whose answer (a 64x48 picture)
/// arrives when the test writes a byte to the other end of `answers`.
struct Answering {
    answers: std::os::unix::net::UnixStream,
    in_flight: usize,
}

impl virtsoc_media::DecoderBackend for Answering {
    fn name(&self) -> &str {
        "answering"
    }
    fn decode(&mut self, _packet: &[u8], _pts: i64) -> virtsoc_media::Result<Vec<DecodedFrame>> {
        Ok(Vec::new())
    }
    fn flush(&mut self) -> virtsoc_media::Result<Vec<DecodedFrame>> {
        Ok(Vec::new())
    }
    fn output_layout(&self) -> Option<FrameLayout> {
        None
    }
    fn in_flight(&self) -> usize {
        self.in_flight
    }
    fn collect(&mut self, wait: bool) -> virtsoc_media::Result<Vec<DecodedFrame>> {
        use std::io::Read;
        if self.in_flight == 0 {
            return Ok(Vec::new());
        }
        self.answers.set_nonblocking(!wait).unwrap();
        match self.answers.read(&mut [0u8; 1]) {
            Ok(1) => {
                self.in_flight = 0;
                let layout = FrameLayout::packed(PixelFormat::Nv12, 64, 48).unwrap();
                Ok(vec![DecodedFrame::packed(
                    layout,
                    9,
                    vec![0; layout.size()],
                )])
            }
            // As a worker that does not answer in time: ended, an error.
            _ if wait => {
                self.in_flight = 0;
                Err(MediaError::Decode("no answer".into()))
            }
            _ => Ok(Vec::new()),
        }
    }
    fn answers_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        (self.in_flight > 0).then(|| self.answers.as_fd())
    }
}

/// A command that would wait for its decoder's worker (no picture ready, a packet in
/// flight) does not hold the device: another guest's commands are answered meanwhile, and
/// the waiting one is answered with the picture once the worker's answer arrives.
#[test]
fn a_command_waiting_for_its_worker_holds_no_other_guest() {
    use crate::device::tests::results;
    use std::time::Duration;
    let codec = Codec::new(&DeviceConfig::default()).unwrap();
    let core = crate::testkit::Core::new();
    let cx = |g| {
        DeviceCtx::new(
            g,
            &core.svm,
            virtsoc_svm::DomainId(0),
            core.session.fences(),
        )
    };
    let (cx1, cx2) = (cx(GuestId(1)), cx(GuestId(2)));
    let open = api::OpenDecoder {
        kind: codec_kind::H264,
        format: Format::Nv12 as u64,
        threads: 1,
    };
    let h = HandleId(codec.open_decoder_for(&cx1, open).unwrap()[0]);
    let (mut worker, answers) = std::os::unix::net::UnixStream::pair().unwrap();
    // Waited for on the device's thread, the answer would not come: a timeout, no picture.
    answers
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let slow = Answering {
        answers,
        in_flight: 1,
    };
    *codec.state().decoder(GuestId(1), h).unwrap() =
        state::DecoderSession::new(Box::new(slow), Format::Nv12);
    let info = |handle| virtsoc_devapi::DeviceCommand::encode(&api::StreamInfo { handle });
    // Another guest on the codec (alone, the first would wait on the codec's thread).
    let h2 = HandleId(codec.open_decoder_for(&cx2, open).unwrap()[0]);
    let held = (&cx1, info(h));
    let answered =
        super::wait::tests::held_beside_another(&codec, &core, held, (&cx2, h2), "stream_info");

    std::io::Write::write_all(&mut worker, &[1]).unwrap();
    answered.recv_timeout(Duration::from_secs(30)).unwrap();
    let got = results(&core);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, 7);
    let v = api::StreamInfoReply::from_values(&got[0].1.unwrap());
    assert_eq!(
        (v.width, v.height),
        (64, 48),
        "the picture the worker answered"
    );
}
