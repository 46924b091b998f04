//! Format tests: random session images round-trip through a file; truncated, corrupted,
//! other-version files and inconsistent images are refused with a clear error.

use proptest::prelude::*;
use std::path::PathBuf;

use virtsoc_fence::{FenceId, FenceTableImage, SlotImage, PAGE_SLOTS};
use virtsoc_proto::wire::Format;
use virtsoc_svm::{RegionImage, RegionMeta};

use super::*;

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("virtsoc-snap-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fences(seed: u64, overflow: usize) -> FenceTableImage {
    let slots = (0..PAGE_SLOTS)
        .map(|i| {
            let g = ((seed >> (i % 32)) as u32 ^ i) % 5;
            let st = match (g, (seed as u32 ^ i) % 4) {
                (0, _) => SlotImage::Free,
                (_, 0) => SlotImage::Free,
                (_, 1) => SlotImage::Pending { released: false },
                (_, 2) => SlotImage::Pending { released: true },
                _ => SlotImage::Signaled,
            };
            (g, st)
        })
        .collect();
    FenceTableImage {
        slots,
        overflow: (0..overflow as u32)
            .map(|i| FenceId {
                index: PAGE_SLOTS + i,
                generation: 1,
            })
            .collect(),
        overflow_next: overflow as u64 + 2,
        created: 5000,
        recycled: seed % 7,
    }
}

fn region(id: u64, kind: u8, n: u32, written: bool) -> RegionImage {
    let (format, width, height, size, stride) = match kind % 3 {
        0 => (Format::Blob, 0, 0, 1 + (n as u64 % 5000), 0),
        1 => {
            let (w, h) = (1 + n % 30, 1 + n % 20);
            (Format::Rgba8, w, h, (w * h * 4) as u64, w * 4)
        }
        _ => {
            let (w, h) = (2 * (1 + n % 16), 2 * (1 + n % 9));
            (Format::Nv12, w, h, (w * h * 3 / 2) as u64, w)
        }
    };
    RegionImage {
        id,
        meta: RegionMeta {
            size,
            width,
            height,
            stride,
            format,
            usage: n,
        },
        bytes: written.then(|| (0..size).map(|i| (i as u32 ^ n) as u8).collect()),
    }
}

fn image(regions: &[(u8, u32, bool)], seed: u64, overflow: usize) -> SessionImage {
    let mut id = 1;
    let regions: Vec<RegionImage> = regions
        .iter()
        .map(|&(k, n, w)| {
            id += 1 + (n as u64 % 3);
            region(id, k, n, w)
        })
        .collect();
    let mut devices = devices::DeviceRecords::new();
    devices.insert(
        "display".into(),
        serde_json::json!({ "foreground": seed.is_multiple_of(2) }),
    );
    SessionImage {
        guest: GuestRecord {
            name: format!("guest-{seed}"),
            protocol: "prefetch".into(),
            source_guest: seed,
            next_region_id: id + 1,
            resume: format!("{seed:032x}"),
        },
        fences: fences(seed, overflow),
        regions,
        devices,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn images_round_trip_through_a_file(
        regions in proptest::collection::vec((any::<u8>(), any::<u32>(), any::<bool>()), 0..12),
        seed in any::<u64>(),
        overflow in 0usize..4,
    ) {
        let dir = tmpdir("prop");
        let path = dir.join(format!("s-{seed}.snap"));
        let img = image(&regions, seed, overflow);
        let n = write_image(&path, &img).unwrap();
        prop_assert_eq!(n, std::fs::metadata(&path).unwrap().len());
        prop_assert_eq!(read_image(&path).unwrap(), img);
        std::fs::remove_file(&path).unwrap();
    }
}

fn sample(tag: &str) -> (PathBuf, Vec<u8>) {
    let dir = tmpdir(tag);
    let path = dir.join("s.snap");
    let img = image(&[(0, 100, true), (1, 7, false), (2, 33, true)], 9, 1);
    write_image(&path, &img).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

fn refused(path: &Path, bytes: &[u8]) -> String {
    std::fs::write(path, bytes).unwrap();
    match read_image(path) {
        Err(crate::HostError::Snapshot(m)) => m,
        other => panic!("accepted a bad file: {other:?}"),
    }
}

#[test]
fn truncated_files_are_refused_at_every_length() {
    let (path, bytes) = sample("trunc");
    for cut in (0..bytes.len()).step_by(7).chain([bytes.len() - 1]) {
        let m = refused(&path, &bytes[..cut]);
        assert!(
            m.contains("truncated") || m.contains("corrupted") || m.contains("trailer"),
            "cut at {cut}: {m}"
        );
    }
}

#[test]
fn every_flipped_byte_is_caught() {
    let (path, bytes) = sample("flip");
    for at in 0..bytes.len() {
        let mut b = bytes.clone();
        b[at] ^= 0x5a;
        let m = refused(&path, &b);
        assert!(!m.is_empty(), "byte {at}");
    }
}

#[test]
fn other_versions_and_other_files_are_refused() {
    let (path, bytes) = sample("version");
    let mut b = bytes.clone();
    b[8..12].copy_from_slice(&2u32.to_le_bytes());
    let m = refused(&path, &b);
    assert!(m.contains("version 2"), "{m}");
    let mut b = bytes.clone();
    b[..8].copy_from_slice(b"NOTASNAP");
    assert!(refused(&path, &b).contains("magic"));
    let mut b = bytes.clone();
    b.extend_from_slice(b"junk");
    assert!(refused(&path, &b).contains("after the trailer"));
}

/// A file whose checksums are right but whose contents are inconsistent (as a hostile
/// writer would make): every such record is refused.
#[test]
fn well_formed_but_inconsistent_images_are_refused() {
    let dir = tmpdir("inconsistent");
    let path = dir.join("s.snap");
    let base = image(&[(0, 100, true), (1, 7, true)], 3, 0);
    let mut cases: Vec<(SessionImage, &str)> = Vec::new();
    let mut i = base.clone();
    i.regions[1].id = i.regions[0].id;
    cases.push((i, "order"));
    let mut i = base.clone();
    i.guest.next_region_id = 1;
    cases.push((i, "next region id"));
    let mut i = base.clone();
    i.regions[0].meta.size += 1;
    cases.push((i, "region"));
    let mut i = base.clone();
    i.regions[1].meta.stride = 3;
    cases.push((i, "stride"));
    let mut i = base.clone();
    i.fences.slots[4] = (0, SlotImage::Signaled);
    cases.push((i, "generation 0"));
    let mut i = base.clone();
    i.fences.overflow.push(FenceId {
        index: PAGE_SLOTS + 100,
        generation: 9,
    });
    cases.push((i, "never handed out"));
    for (img, want) in cases {
        write_image(&path, &img).unwrap();
        match read_image(&path) {
            Err(crate::HostError::Snapshot(m)) => assert!(m.contains(want), "{want}: {m}"),
            other => panic!("{want}: accepted {other:?}"),
        }
    }
}

#[test]
fn an_unfinished_write_leaves_the_previous_file() {
    let (path, bytes) = sample("atomic");
    let mut w = SnapshotWriter::create(&path, 3).unwrap();
    w.section(image::GUEST, &[b"partial"]).unwrap();
    drop(w); // as a writer killed before finish: the temporary file goes, the old file stays
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    read_image(&path).unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp."))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn migration_faults_parse_by_name() {
    use migrate::Fault;
    for (name, f) in [
        ("precopy", Fault::Precopy),
        ("stop", Fault::Stop),
        ("ready", Fault::Ready),
        ("resume", Fault::Resume),
    ] {
        assert_eq!(name.parse::<Fault>(), Ok(f));
    }
    assert!("later".parse::<Fault>().unwrap_err().contains("precopy"));
}

/// The bookkeeping of an incoming migration's candidate: found by its secret, dropped only
/// by the migration that parked it, and an uncommitted migration's session returned to its
/// source stops sending the guest away.
#[test]
fn candidates_are_dropped_only_by_their_own_migration() {
    use std::sync::Arc;
    let r = restart::Restart::default();
    let secret = "0123456789abcdef0123456789abcdef".to_string();
    let mine = Arc::new(migrate::Confirm::detached());
    let other = Arc::new(migrate::Confirm::detached());
    r.park_candidate(secret.clone(), image(&[(0, 64, true)], 1, 0), mine.clone());
    assert_eq!(r.parked(), 1);
    assert!(r.candidate(&secret).is_some_and(|c| Arc::ptr_eq(&c, &mine)));
    assert!(r.candidate("no such secret").is_none());
    // An older migration of the same session going away leaves this one alone.
    assert!(!r.drop_candidate(&secret, &other));
    assert_eq!(r.parked(), 1);
    assert!(r.drop_candidate(&secret, &mine));
    assert_eq!(r.parked(), 0);
    assert!(!r.drop_candidate(&secret, &mine), "dropped once");

    // The source side: moved away, then returned (not committed): parked, no longer moved.
    r.moved(&secret, "/tmp/elsewhere.sock");
    r.park_returned(secret.clone(), image(&[(0, 64, true)], 2, 0));
    assert_eq!(r.parked(), 1);
    assert!(
        r.candidate(&secret).is_none(),
        "a returned session needs no confirmation"
    );
}
