//! Tests of shared replicas ([`SvmManager::set_shared_memory`]): a domain's host replicas in
//! sealed memfds another process can map.

use super::*;
use std::os::unix::fs::FileExt;
use virtsoc_proto::WindowLayout;

fn blob(size: u64) -> AllocDesc {
    AllocDesc {
        size,
        width: 0,
        height: 0,
        format: Format::Blob,
        usage: 0,
    }
}

fn spec(d: DomainId, len: u64, mode: AccessMode) -> AccessSpec {
    AccessSpec::new(d.0, d, 0, len, mode)
}

/// A manager with a shared domain `gl` and a host-memory reader `disp`, one guest attached
/// with a memory limit of `limit` bytes.
fn setup(kind: ProtocolKind, limit: u64) -> (SvmManager, DomainId, DomainId, Arc<GuestSvm>) {
    let mut t = Topology::new();
    let gl = t.add_device_domain("gl");
    let disp = t.add_device_domain("disp");
    let svm = SvmManager::new(t);
    svm.set_shared_memory(gl);
    let win = Arc::new(
        SharedWindow::create_memfd("t", WindowLayout::new(4 << 20, 16, 16).unwrap()).unwrap(),
    );
    let g = svm
        .attach_guest(GuestId(1), win, svm.protocol(kind), limit)
        .unwrap();
    (svm, gl, disp, g)
}

/// The memfd of region `id`'s replica in `d`, as another process would open it.
fn memfd_of(svm: &SvmManager, id: RegionId, d: DomainId) -> std::fs::File {
    match svm.replica(GuestId(1), id, d).unwrap() {
        Backing::Host(b) => {
            let m = b.memfd().expect("a shared replica");
            std::fs::File::from(m.fd().try_clone_to_owned().unwrap())
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_shared_domains_replicas_are_memfds_with_the_replicas_bytes() {
    for kind in ProtocolKind::ALL {
        let (svm, gl, _, _) = setup(kind, 1 << 30);
        let size = 10_000u64;
        let (id, _) = svm.alloc(GuestId(1), blob(size)).unwrap();
        // The guest writes; the shared domain reads: the memfd holds the bytes after the
        // importer's page.
        let pattern: Vec<u8> = (0..size).map(|i| (i * 13 % 251) as u8).collect();
        svm.begin_access(
            GuestId(1),
            id,
            &spec(DomainId::HOST_RAM, size, AccessMode::Write),
        )
        .unwrap();
        svm.with_replica(GuestId(1), id, DomainId::HOST_RAM, |b| {
            b.copy_from_slice(&pattern)
        })
        .unwrap();
        svm.end_access(
            GuestId(1),
            id,
            &spec(DomainId::HOST_RAM, size, AccessMode::Write),
        )
        .unwrap();
        svm.begin_access(GuestId(1), id, &spec(gl, size, AccessMode::Read))
            .unwrap();
        let f = memfd_of(&svm, id, gl);
        let mut seen = vec![0u8; size as usize];
        f.read_exact_at(&mut seen, SHARED_DATA_OFFSET).unwrap();
        assert_eq!(seen, pattern, "{kind}");
        svm.end_access(GuestId(1), id, &spec(gl, size, AccessMode::Read))
            .unwrap();
        // Sealed: the other side can neither shrink nor grow it.
        let len = f.metadata().unwrap().len();
        assert_eq!(len, SHARED_DATA_OFFSET + size.next_multiple_of(4096));
        assert!(f.set_len(4096).is_err(), "{kind}: shrinking refused");
        assert!(f.set_len(len * 2).is_err(), "{kind}: growing refused");
        // What the other side writes while the device's write access lasts is the
        // replica's: the guest reads it after the access.
        svm.begin_access(GuestId(1), id, &spec(gl, size, AccessMode::Write))
            .unwrap();
        f.write_all_at(&[0xAB; 16], SHARED_DATA_OFFSET).unwrap();
        svm.end_access(GuestId(1), id, &spec(gl, size, AccessMode::Write))
            .unwrap();
        svm.begin_access(
            GuestId(1),
            id,
            &spec(DomainId::HOST_RAM, size, AccessMode::Read),
        )
        .unwrap();
        let first = svm
            .with_replica(GuestId(1), id, DomainId::HOST_RAM, |b| b[..16].to_vec())
            .unwrap();
        assert_eq!(first, [0xAB; 16], "{kind}");
        svm.end_access(
            GuestId(1),
            id,
            &spec(DomainId::HOST_RAM, size, AccessMode::Read),
        )
        .unwrap();
        // Other domains' replicas stay anonymous memory.
        match svm.replica(GuestId(1), id, DomainId::HOST_RAM).unwrap() {
            Backing::Host(b) => assert!(b.memfd().is_none(), "{kind}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn shared_replicas_count_against_the_memory_limit_and_are_read_in_place() {
    let (svm, gl, disp, g) = setup(ProtocolKind::WriteInvalidate, 64 << 10);
    let (a, _) = svm.alloc(GuestId(1), blob(48 << 10)).unwrap();
    let (b, _) = svm.alloc(GuestId(1), blob(48 << 10)).unwrap();
    svm.begin_access(GuestId(1), a, &spec(gl, 48 << 10, AccessMode::Write))
        .unwrap();
    svm.with_replica(GuestId(1), a, gl, |x| x.fill(7)).unwrap();
    svm.end_access(GuestId(1), a, &spec(gl, 48 << 10, AccessMode::Write))
        .unwrap();
    assert_eq!(g.host_bytes(), 48 << 10, "charged as any replica");
    assert!(matches!(
        svm.begin_access(GuestId(1), b, &spec(gl, 48 << 10, AccessMode::Write)),
        Err(SvmError::OutOfMemory)
    ));
    // A host-memory reader reads the shared replica where it is: no copy.
    let reader = spec(disp, 48 << 10, AccessMode::Read).reading_host(true);
    let r = svm.begin_access(GuestId(1), a, &reader).unwrap();
    assert_eq!(r.copies, 0);
    match svm.read_replica(GuestId(1), a, disp).unwrap() {
        Backing::Host(buf) => {
            assert!(buf.memfd().is_some(), "the shared replica itself");
            assert!(buf.read().iter().all(|&x| x == 7));
        }
        other => panic!("{other:?}"),
    }
    svm.end_access(GuestId(1), a, &reader).unwrap();
    // Freed: the charge comes back.
    svm.free(GuestId(1), a).unwrap();
    assert_eq!(g.host_bytes(), 0);
}
