//! Property test of region export and import: random region sets (blobs and images), random
//! contents written by the CPU (guest window), a host-memory device and a device with its own
//! memory (the only valid copy then being device memory, read back) -> export -> import into
//! a fresh manager under the same ids -> every region's metadata and bytes equal, read
//! through the new manager. Plus: invalid images are refused and add nothing.

use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use virtsoc_proto::wire::Format;
use virtsoc_proto::{AccessMode, SharedWindow, WindowLayout};
use virtsoc_svm::{
    AccessSpec, AllocDesc, Backing, DeviceAllocator, DeviceMemory, DomainId, GuestId, ProtocolKind,
    RegionId, RegionImage, RegionMeta, SvmError, SvmManager, Topology,
};

#[derive(Debug)]
struct Mem(Mutex<Vec<u8>>);

impl DeviceMemory for Mem {
    fn write(&self, offset: u64, src: &[u8]) -> virtsoc_svm::Result<()> {
        self.0.lock().unwrap()[offset as usize..offset as usize + src.len()].copy_from_slice(src);
        Ok(())
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> virtsoc_svm::Result<()> {
        dst.copy_from_slice(&self.0.lock().unwrap()[offset as usize..offset as usize + dst.len()]);
        Ok(())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct Alloc;

impl DeviceAllocator for Alloc {
    fn alloc(&self, meta: &RegionMeta) -> virtsoc_svm::Result<Option<Arc<dyn DeviceMemory>>> {
        Ok(Some(Arc::new(Mem(Mutex::new(vec![0; meta.size as usize])))))
    }
}

struct Setup {
    svm: SvmManager,
    win: Arc<SharedWindow>,
    host_dev: DomainId,
    gpu: DomainId,
}

fn setup(kind: ProtocolKind) -> Setup {
    let mut t = Topology::new();
    let host_dev = t.add_device_domain("isp");
    let gpu = t.add_device_domain("gpu");
    let svm = SvmManager::new(t);
    svm.set_allocator(gpu, Arc::new(Alloc));
    let win = Arc::new(
        SharedWindow::create_memfd("t", WindowLayout::new(8 << 20, 16, 16).unwrap()).unwrap(),
    );
    svm.attach_guest(GuestId(1), win.clone(), svm.protocol(kind), 1 << 30)
        .unwrap();
    Setup {
        svm,
        win,
        host_dev,
        gpu,
    }
}

/// Writes a pattern into `[offset, offset + len)` (reduced into the region) from one of the
/// three kinds of memory.
fn write(s: &Setup, id: RegionId, (who, offset, len, seed): (u8, u64, u64, u8)) {
    let size = s.svm.meta(GuestId(1), id).unwrap().size;
    let offset = offset % size;
    let len = (len % (size - offset)).max(1);
    let pattern: Vec<u8> = (0..len).map(|i| seed ^ (i as u8).wrapping_mul(7)).collect();
    let (vdev, d) = match who % 3 {
        0 => (0, DomainId::GUEST_WINDOW),
        1 => (2, s.host_dev),
        _ => (3, s.gpu),
    };
    let spec = AccessSpec::new(vdev, d, offset, len, AccessMode::Write);
    let r = s.svm.begin_access(GuestId(1), id, &spec).unwrap();
    if d == DomainId::GUEST_WINDOW {
        s.win.copy_in(r.window_offset.unwrap(), &pattern).unwrap();
    } else {
        match s.svm.replica(GuestId(1), id, d).unwrap() {
            Backing::Host(b) => {
                b.lock()[offset as usize..(offset + len) as usize].copy_from_slice(&pattern)
            }
            Backing::Device(m) => m.write(offset, &pattern).unwrap(),
            other => panic!("{other:?}"),
        }
    }
    s.svm.end_access(GuestId(1), id, &spec).unwrap();
}

fn read_all(s: &Setup, id: u64) -> Vec<u8> {
    let size = s.svm.meta(GuestId(1), RegionId(id)).unwrap().size;
    let spec = AccessSpec::new(0, DomainId::GUEST_WINDOW, 0, size, AccessMode::Read);
    let r = s.svm.begin_access(GuestId(1), RegionId(id), &spec).unwrap();
    let mut out = vec![0; size as usize];
    s.win.copy_out(r.window_offset.unwrap(), &mut out).unwrap();
    s.svm.end_access(GuestId(1), RegionId(id), &spec).unwrap();
    out
}

fn desc(kind: u8, n: u32) -> AllocDesc {
    let (format, width, height, size) = match kind % 3 {
        0 => (Format::Blob, 0, 0, 1 + (n as u64 * 997) % 70_000),
        1 => (Format::Rgba8, 1 + n % 64, 1 + n % 37, 0),
        _ => (Format::Nv12, 2 * (1 + n % 40), 2 * (1 + n % 20), 0),
    };
    AllocDesc {
        size,
        width,
        height,
        format,
        usage: n,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn export_import_keeps_ids_metadata_and_bytes(
        regions in proptest::collection::vec((any::<u8>(), any::<u32>()), 1..8),
        frees in proptest::collection::vec(any::<usize>(), 0..3),
        writes in proptest::collection::vec(
            (any::<usize>(), (any::<u8>(), any::<u64>(), any::<u64>(), any::<u8>())), 0..16),
        kind in 0usize..3,
    ) {
        let kind = ProtocolKind::ALL[kind];
        let a = setup(kind);
        let mut ids: Vec<RegionId> = regions
            .iter()
            .map(|&(k, n)| a.svm.alloc(GuestId(1), desc(k, n)).unwrap().0)
            .collect();
        for f in frees {
            if ids.len() > 1 {
                let id = ids.remove(f % ids.len());
                a.svm.free(GuestId(1), id).unwrap();
            }
        }
        for (i, w) in writes {
            write(&a, ids[i % ids.len()], w);
        }
        let images: Vec<RegionImage> = a
            .svm
            .region_ids(GuestId(1))
            .unwrap()
            .into_iter()
            .map(|id| a.svm.export_region(GuestId(1), id).unwrap())
            .collect();
        let next = a.svm.next_region_id(GuestId(1)).unwrap();
        let b = setup(kind);
        for img in &images {
            b.svm.import_region(GuestId(1), img).unwrap();
        }
        b.svm.reserve_ids(GuestId(1), next).unwrap();
        prop_assert_eq!(b.svm.region_ids(GuestId(1)).unwrap(), ids.clone());
        for img in &images {
            prop_assert_eq!(b.svm.meta(GuestId(1), RegionId(img.id)).unwrap(), img.meta);
            let want = img.bytes.clone().unwrap_or_else(|| vec![0; img.meta.size as usize]);
            prop_assert_eq!(read_all(&b, img.id), want.clone());
            prop_assert_eq!(read_all(&a, img.id), want);
            prop_assert_eq!(&b.svm.export_region(GuestId(1), RegionId(img.id)).unwrap(), img);
        }
        let (fresh, _) = b.svm.alloc(GuestId(1), desc(0, 1)).unwrap();
        prop_assert!(fresh >= next);
    }
}

#[test]
fn invalid_images_are_refused() {
    let s = setup(ProtocolKind::WriteInvalidate);
    let (id, meta) = s.svm.alloc(GuestId(1), desc(1, 5)).unwrap();
    let good = RegionImage {
        id: id.0 + 1,
        meta,
        bytes: Some(vec![1; meta.size as usize]),
    };
    s.svm.import_region(GuestId(1), &good).unwrap();
    let bad = [
        RegionImage {
            id: 0,
            ..good.clone()
        },
        RegionImage {
            id: id.0,
            ..good.clone()
        },
        RegionImage {
            id: 99,
            bytes: Some(vec![0; 3]),
            ..good.clone()
        },
        RegionImage {
            id: 99,
            meta: RegionMeta {
                size: meta.size + 1,
                ..meta
            },
            bytes: None,
        },
        RegionImage {
            id: 99,
            meta: RegionMeta {
                width: 1 << 20,
                ..meta
            },
            bytes: None,
        },
        RegionImage {
            id: 99,
            meta: RegionMeta {
                format: Format::Blob,
                size: 1 << 50,
                stride: 0,
                ..meta
            },
            bytes: None,
        },
    ];
    for img in bad {
        let e = s.svm.import_region(GuestId(1), &img).unwrap_err();
        assert!(
            matches!(e, SvmError::BadArgument(_) | SvmError::OutOfMemory),
            "{img:?}: {e}"
        );
    }
    assert_eq!(
        s.svm.region_ids(GuestId(1)).unwrap(),
        vec![id, RegionId(id.0 + 1)]
    );
}
