//! Where guest input meets the devices and their native libraries:
//! - selector 0: every device's declared command decoded from arbitrary request words with
//!   `virtsoc_devapi` (and the layer and marker records the GPU and display read);
//! - selector 1: the ISP conversion with the real libswscale backend (and the CPU reference)
//!   on small frames with fuzzed formats, sizes, strides and buffer placement;
//! - selector 2: an FFmpeg decoder of a fuzzed codec fed fuzzed packets, then flushed
//!   (pictures of at most 128 x 128);
//! - selector 3: the daemon's own devices (codec in process, swscale ISP, the GPU's CPU
//!   backend, camera, headless display, modem, test devices) running fuzzed commands through
//!   the daemon's checks (`device::validate`, then `Device::execute`) for a guest with
//!   regions of every format, region arguments mostly naming its regions.
//!
//! Errors are fine; a panic or a crash inside FFmpeg is not.

#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use virtsoc_devapi as api;
use virtsoc_fence::{MemPage, VirtualFenceTable};
use virtsoc_host::device::registry::{self, DeviceConfig, GpuBackendKind};
use virtsoc_host::device::{validate, Device, DeviceCtx};
use virtsoc_media::{
    CodecKind, CpuIsp, DecoderBackend, FfmpegDecoder, FrameLayout, FrameMut, FrameRef, IspBackend,
    PixelFormat, SwscaleIsp,
};
use virtsoc_proto::wire::Format;
use virtsoc_proto::{AccessMode, DeviceId, SharedWindow, WindowLayout};
use virtsoc_svm::{AccessSpec, AllocDesc, DomainId, GuestId, ProtocolKind, SvmManager, Topology};

/// Reads the fuzz input as little numbers.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0u64, |v, i| v | (u64::from(self.u8()) << (8 * i)))
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

fn check<C: std::fmt::Debug>(
    info: &api::DeviceInfo,
    words: &[u64; 6],
    decoded: Result<C, api::Status>,
    regions: impl Fn(&C) -> Vec<(api::RegionId, api::AccessMode)>,
    name: impl Fn(&C) -> &'static str,
) {
    let declared = info.commands.iter().find(|c| c.op == words[0]);
    match decoded {
        Ok(cmd) => {
            let decl = declared.expect("decoded an undeclared opcode");
            assert_eq!(name(&cmd), decl.name);
            let region_args = decl
                .args
                .iter()
                .filter(|a| a.kind.region().is_some())
                .count();
            assert_eq!(regions(&cmd).len(), region_args, "{}", decl.name);
            // The typed command and the declaration decode the same regions from the words.
            assert_eq!(regions(&cmd), decl.regions(words), "{}", decl.name);
        }
        Err(st) => {
            assert!(declared.is_none(), "{}: declared opcode refused", info.name);
            assert_eq!(st, api::Status::UnknownOpcode);
        }
    }
}

macro_rules! decode_all {
    ($words:expr, $($dev:ident),*) => {
        $(
            check(
                &api::$dev::INFO,
                $words,
                api::$dev::Command::decode($words),
                |c| c.regions(),
                |c| c.name(),
            );
        )*
    };
}

fn commands(b: &mut Bytes) {
    let mut words = [0u64; 6];
    for w in &mut words {
        *w = b.u64();
    }
    // Small opcodes are the declared ones.
    words[0] %= 1 + (words[0] >> 60) * 16;
    decode_all!(&words, producer, consumer, consumer2, codec, isp, camera, gpu, display, modem);
    let rest = b.take(usize::MAX);
    for chunk in rest.chunks(api::LAYER_RECORD) {
        if let Some(l) = api::LayerRecord::from_bytes(chunk) {
            let again = api::LayerRecord::from_bytes(&l.to_bytes()).expect("round trip");
            assert_eq!(again.to_bytes(), l.to_bytes());
        }
    }
    for chunk in rest.chunks(api::MARKER_RECORD) {
        if let Some(m) = api::MarkerRecord::from_bytes(chunk) {
            assert_eq!(&m.to_bytes()[..], chunk);
        }
    }
}

fn layout(b: &mut Bytes) -> (FrameLayout, usize, usize) {
    let format = PixelFormat::ALL[b.u8() as usize % 4];
    // Mostly valid sizes, sometimes anything (odd, zero): the backends must refuse those.
    let raw = b.u8();
    let (w, h) = (u32::from(b.u8() % 65), u32::from(b.u8() % 65));
    let (w, h) = if raw & 1 == 0 {
        ((w + 1) & !1, (h + 1) & !1)
    } else {
        (w, h)
    };
    let pad = u32::from(b.u8() % 80);
    let stride = (w * format.bytes_per_pixel()).saturating_add(pad);
    let l = FrameLayout {
        format,
        width: w,
        height: h,
        stride: if raw & 2 == 0 { stride & !1 } else { stride },
    };
    // Buffer: the layout's size give or take a few bytes, at a fuzzed misalignment.
    let size = if l.validate().is_ok() {
        l.size()
    } else {
        (w * h * 4) as usize
    };
    let slack = (b.u8() % 16) as usize;
    let len = if raw & 4 == 0 {
        size + slack
    } else {
        size.saturating_sub(slack)
    };
    (l, len, (b.u8() % 64) as usize)
}

fn isp(b: &mut Bytes) {
    let (sl, slen, soff) = layout(b);
    let (dl, dlen, doff) = layout(b);
    let mut src = vec![0u8; soff + slen];
    let fill = b.take(slen);
    src[soff..soff + fill.len()].copy_from_slice(fill);
    let mut dst = vec![0u8; doff + dlen];
    let accurate = b.u8() & 1 == 1;
    let src = FrameRef {
        layout: sl,
        data: &src[soff..],
    };
    let sws = if accurate {
        SwscaleIsp::accurate()
    } else {
        SwscaleIsp::new()
    };
    let ok = sws
        .convert(
            src,
            FrameMut {
                layout: dl,
                data: &mut dst[doff..],
            },
        )
        .is_ok();
    let cpu = CpuIsp::new()
        .convert(
            src,
            FrameMut {
                layout: dl,
                data: &mut dst[doff..],
            },
        )
        .is_ok();
    assert_eq!(
        ok, cpu,
        "swscale and the CPU reference agree on what is valid: {sl:?} -> {dl:?}"
    );
}

fn decoder(b: &mut Bytes) {
    let kind = CodecKind::ALL[b.u8() as usize % CodecKind::ALL.len()];
    let out = if b.u8() & 1 == 0 {
        PixelFormat::Nv12
    } else {
        PixelFormat::Yuv420p
    };
    // Pictures of at most 128 x 128: a packet may declare any size up to the daemon's limit
    // (DCI 4K), which libavcodec allocates with its reference frames before decoding, about
    // 14 ms an input under ASan; once such inputs filled the corpus the run fell from 4,000
    // to 400 inputs a second. The parsing and the checks are the same at any size.
    let Ok(mut dec) = FfmpegDecoder::with_max_pixels(kind, out, 1, 128 * 128) else {
        return;
    };
    let mut frames = Vec::new();
    for pts in 0..8 {
        if b.0.is_empty() {
            break;
        }
        let n = b.u16() as usize;
        let packet = b.take(n).to_vec();
        if let Ok(f) = dec.decode(&packet, pts) {
            frames.extend(f);
        }
    }
    if let Ok(f) = dec.flush() {
        frames.extend(f);
    }
    for f in frames {
        assert_eq!(f.data.len(), f.layout.size(), "a picture fills its layout");
        f.as_frame().validate().expect("a decoded picture is valid");
        dec.recycle(f);
    }
}

/// The daemon's devices, an SVM manager and one guest with regions, made once. The pictures
/// are small (at most 40 x 30, the display 32 x 24): what is checked (sizes, strides,
/// formats, ranges) is the same at any size, and the GPU's CPU backend, instrumented for
/// coverage, draws about a pixel a microsecond, so a 320 x 240 target took about 100 ms an
/// input and such inputs, once in the corpus, held the whole run near 50 a second.
struct World {
    svm: Arc<SvmManager>,
    devices: Vec<(DeviceId, DomainId, Arc<dyn Device>)>,
    fences: Arc<VirtualFenceTable>,
    regions: Vec<u64>,
}

const GUEST: GuestId = GuestId(1);

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let cfg = DeviceConfig {
            gpu: GpuBackendKind::Cpu,
            codec_worker: None,
            display_size: (32, 24),
            ..DeviceConfig::default()
        };
        let built = registry::build(&cfg, &virtsoc_host::Limits::default()).expect("devices");
        let mut topo = Topology::new();
        let devices = registry::with_domains(built, &mut topo);
        let svm = Arc::new(SvmManager::new(topo));
        let layout = WindowLayout::new(64 << 20, 8, 8).expect("layout");
        let window = Arc::new(SharedWindow::create_memfd("fuzz", layout).expect("window"));
        let protocol = svm.protocol(ProtocolKind::WriteInvalidate);
        svm.attach_guest(GUEST, window, protocol, 1 << 30)
            .expect("guest");
        let shapes = [
            (Format::Blob, 64 << 10, 0, 0),
            (Format::Blob, 4 << 20, 0, 0),
            (Format::Rgba8, 0, 16, 12),
            (Format::Nv12, 0, 16, 12),
            (Format::Yuv420p, 0, 16, 12),
            (Format::Rgba8, 0, 40, 30),
            (Format::Nv12, 0, 40, 30),
        ];
        let regions: Vec<u64> = shapes
            .iter()
            .map(|&(format, size, width, height)| {
                let desc = AllocDesc {
                    size,
                    width,
                    height,
                    format,
                    usage: 0,
                };
                svm.alloc(GUEST, desc).expect("region").0 .0
            })
            .collect();
        // Every device reads and writes every region (an access refused is fine: the
        // commands then meet that refusal).
        for &id in &regions {
            for (dev, dom, _) in &devices {
                let len = svm
                    .meta(GUEST, virtsoc_svm::RegionId(id))
                    .map(|m| m.size)
                    .unwrap_or(0);
                let spec = AccessSpec::new(dev.0, *dom, 0, len, AccessMode::ReadWrite);
                let _ = svm.begin_access(GUEST, virtsoc_svm::RegionId(id), &spec);
            }
        }
        World {
            svm,
            devices,
            fences: Arc::new(VirtualFenceTable::new(Arc::new(MemPage::new()))),
            regions,
        }
    })
}

fn execute(b: &mut Bytes) {
    let w = world();
    let (id, dom, dev) = &w.devices[b.u8() as usize % w.devices.len()];
    let Some(info) = virtsoc_devapi::device(*id) else {
        return;
    };
    let mut words = [0u64; 6];
    // Mostly a declared command; sometimes any opcode.
    words[0] = match info
        .commands
        .get(b.u8() as usize % (info.commands.len() + 1))
    {
        Some(c) => c.op,
        None => b.u64(),
    };
    let decl = info.commands.iter().find(|c| c.op == words[0]);
    for (i, w_i) in words.iter_mut().enumerate().skip(1) {
        let is_region = decl
            .and_then(|c| c.args.get(i - 1))
            .is_some_and(|a| a.kind.region().is_some());
        let pick = b.u8();
        *w_i = if is_region && pick < 224 {
            w.regions[pick as usize % w.regions.len()]
        } else if pick < 160 {
            u64::from(b.u16())
        } else {
            b.u64()
        };
    }
    let cx = DeviceCtx::new(GUEST, &w.svm, *dom, &w.fences).reading_host(dev.reads_host_memory());
    if validate(*id, &cx, &words).is_ok() {
        let _ = dev.execute(&cx, &words);
    }
}

fuzz_target!(|data: &[u8]| {
    virtsoc_media::quiet_ffmpeg_logs();
    let mut b = Bytes(data);
    match b.u8() % 4 {
        0 => commands(&mut b),
        1 => isp(&mut b),
        2 => decoder(&mut b),
        _ => execute(&mut b),
    }
});
