//! Tests of the daemon's packets on shared replicas: a present writes the surface into the
//! frame's mapping top row first (both ways), a batch runs out of a mapping with its large
//! answers placed in the reply mapping, mappings go with UNMAP, and a guest's stream cannot
//! carry any of these packets.

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use virtsoc_gles_stream::{egl, gl_ops, Encoder, Reader};

use crate::mapped::DATA_OFFSET;
use crate::worker::Renderer;
use virtsoc_sync::LockExt;

/// A memfd like a shared replica's of `len` bytes (the importer's page first).
fn replica(len: usize) -> (OwnedFd, std::fs::File) {
    // SAFETY: a NUL-terminated name.
    let raw = unsafe { libc::memfd_create(c"replica".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: a fresh descriptor owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let file = std::fs::File::from(fd.try_clone().unwrap());
    file.set_len((DATA_OFFSET + len.next_multiple_of(4096)) as u64)
        .unwrap();
    (fd, file)
}

/// Runs a daemon batch with `fds` riding on it; the answers as `(op, words)`.
fn daemon(r: &mut Renderer, e: &Encoder, fds: Vec<OwnedFd>) -> Vec<(u32, Vec<u32>)> {
    r.incoming = fds.into();
    let mut reply = Encoder::new();
    r.run(e.as_bytes(), &mut reply, true).unwrap();
    let mut out = Vec::new();
    let mut rd = Reader::new(reply.as_bytes());
    while let Some(Ok((op, mut p))) = rd.next_packet() {
        let mut w = Vec::new();
        while let Ok(x) = p.u32() {
            w.push(x);
        }
        out.push((op, w));
    }
    out
}

/// A context on a `w` x `h` surface cleared blue with the bottom row red (GL's row 0).
fn draw(r: &mut Renderer, (w, h): (u32, u32)) {
    let mut e = Encoder::new();
    e.packet(egl::CREATE_CONTEXT).u32(1).u32(0).u32(2);
    e.packet(egl::CREATE_SURFACE).u32(5).u32(w).u32(h).u32(4);
    e.packet(egl::MAKE_CURRENT).u32(1).u32(5).u32(5);
    e.packet(gl_ops::glClearColor)
        .f32(0.0)
        .f32(0.0)
        .f32(1.0)
        .f32(1.0);
    e.packet(gl_ops::glClear).u32(0x4000);
    e.packet(gl_ops::glEnable).u32(0x0C11);
    e.packet(gl_ops::glScissor)
        .i32(0)
        .i32(0)
        .i32(w as i32)
        .i32(1);
    e.packet(gl_ops::glClearColor)
        .f32(1.0)
        .f32(0.0)
        .f32(0.0)
        .f32(1.0);
    e.packet(gl_ops::glClear).u32(0x4000);
    let mut reply = Encoder::new();
    r.run(e.as_bytes(), &mut reply, false).unwrap();
}

fn present_and_check(r: &mut Renderer, (w, h): (u32, u32), handle: u32, direct: bool) {
    let n = (w * h * 4) as usize;
    let (fd, file) = replica(n);
    let mut e = Encoder::new();
    e.packet(egl::MAP).u32(handle).u64(n as u64);
    e.packet(egl::PRESENT).u32(5).u32(handle).u32(w).u32(h);
    let a = daemon(r, &e, vec![fd]);
    assert_eq!(a, [(egl::PRESENT, vec![w, h, 1])], "{w}x{h}: one copy");
    assert_eq!(r.presenter.direct_targets() > 0, direct, "{w}x{h}");
    let mut px = vec![0u8; n];
    file.read_exact_at(&mut px, DATA_OFFSET as u64).unwrap();
    let row = (w * 4) as usize;
    let (top, bottom) = (&px[..row], &px[n - row..]);
    assert!(
        top.chunks(4).all(|p| p == [0, 0, 255, 255]),
        "{w}x{h}: top row blue"
    );
    assert!(
        bottom.chunks(4).all(|p| p == [255, 0, 0, 255]),
        "{w}x{h}: bottom row red"
    );
    // A size other than the surface's, or a surface that is not the draw surface: nothing.
    let mut e = Encoder::new();
    e.packet(egl::PRESENT).u32(5).u32(handle).u32(w).u32(h + 1);
    e.packet(egl::PRESENT).u32(6).u32(handle).u32(w).u32(h);
    let a = daemon(r, &e, vec![]);
    assert_eq!(a[0].1, [0, 0, 0]);
    assert_eq!(a[1].1, [0, 0, 0]);
    let mut e = Encoder::new();
    e.packet(egl::UNMAP).u32(handle);
    daemon(r, &e, vec![]);
    assert!(r.mappings.get(handle).is_none());
    assert_eq!(
        r.presenter.direct_targets(),
        0,
        "forgotten with the mapping"
    );
}

#[test]
fn presents_write_the_frame_top_row_first() {
    let _one = crate::egl::HOST_EGL_TESTS.lock_or_recover();
    let Ok(mut r) = Renderer::new() else {
        eprintln!("SKIPPED: no host EGL");
        return;
    };
    r.warm_up();
    let again = |r: &mut Renderer| {
        let mut e = Encoder::new();
        e.packet(egl::DESTROY_SURFACE).u32(5);
        e.packet(egl::DESTROY_CONTEXT).u32(1);
        r.run(e.as_bytes(), &mut Encoder::new(), false).unwrap();
    };
    // Read back into the mapping (the default).
    draw(&mut r, (32, 8));
    present_and_check(&mut r, (32, 8), 3, false);
    // Asked for: rows of a multiple of 64 bytes, llvmpipe's layout, imported and blitted
    // into.
    r.presenter.prefer_direct = true;
    again(&mut r);
    draw(&mut r, (32, 8));
    present_and_check(&mut r, (32, 8), 4, true);
    // Other rows: read back.
    again(&mut r);
    draw(&mut r, (20, 6));
    present_and_check(&mut r, (20, 6), 5, false);
}

#[test]
fn batches_run_out_of_a_mapping_and_answers_go_into_another() {
    let _one = crate::egl::HOST_EGL_TESTS.lock_or_recover();
    let Ok(mut r) = Renderer::new() else {
        eprintln!("SKIPPED: no host EGL");
        return;
    };
    // The guest's batch, in its stream region's replica.
    let mut g = Encoder::new();
    g.packet(egl::CREATE_CONTEXT).u32(1).u32(0).u32(2);
    g.packet(egl::CREATE_SURFACE).u32(5).u32(8).u32(8).u32(4);
    g.packet(egl::MAKE_CURRENT).u32(1).u32(5).u32(5);
    g.packet(gl_ops::glReadPixels)
        .i32(0)
        .i32(0)
        .i32(8)
        .i32(8)
        .u32(0x1908)
        .u32(0x1401)
        .u32(0);
    let batch = g.as_bytes();
    let (sfd, sfile) = replica(1 << 16);
    sfile.write_all_at(batch, DATA_OFFSET as u64).unwrap();
    let (rfd, rfile) = replica(1 << 16);
    let mut e = Encoder::new();
    e.packet(egl::MAP).u32(1).u64(1 << 16);
    e.packet(egl::MAP).u32(2).u64(1 << 16);
    e.packet(egl::EXEC_MAPPED)
        .u32(1)
        .u32(2)
        .u32(batch.len() as u32);
    let a = daemon(&mut r, &e, vec![sfd, rfd]);
    assert_eq!(r.reply_to, 2);
    assert_eq!(a[0], (egl::CREATE_CONTEXT, vec![egl::SUCCESS]));
    assert_eq!(a[1], (egl::CREATE_SURFACE, vec![egl::SUCCESS]));
    assert_eq!(a[3].0, gl_ops::glReadPixels, "the pixels answered");
    drop(rfile);
    // A batch longer than its mapping, an unknown mapping, a MAP without its descriptor:
    // malformed, never a panic.
    for (stream, len) in [(1, (1 << 16) + 4), (9, 4)] {
        let mut e = Encoder::new();
        e.packet(egl::EXEC_MAPPED).u32(stream).u32(0).u32(len);
        r.incoming.clear();
        assert!(r.run(e.as_bytes(), &mut Encoder::new(), true).is_err());
    }
    let mut e = Encoder::new();
    e.packet(egl::MAP).u32(7).u64(16);
    assert!(r.run(e.as_bytes(), &mut Encoder::new(), true).is_err());
    // None of the daemon's packets passes in a guest's stream.
    for op in [
        egl::MAP,
        egl::UNMAP,
        egl::EXEC_MAPPED,
        egl::PRESENT,
        egl::IMPORT_MAPPED,
    ] {
        let mut e = Encoder::new();
        e.packet(op).u32(1).u32(1).u32(1).u32(1);
        assert!(
            r.run(e.as_bytes(), &mut Encoder::new(), false).is_err(),
            "{op:#x}"
        );
    }
    let mut e = Encoder::new();
    e.packet(egl::UNMAP).u32(1);
    e.packet(egl::UNMAP).u32(2);
    e.packet(egl::UNMAP).u32(77);
    daemon(&mut r, &e, vec![]);
    assert!(r.mappings.is_empty());
}

/// The worker logs these words for a present that did not happen: the typed error keeps the
/// texts it wrote as strings before.
#[test]
fn present_refusals_read_as_before() {
    use crate::present::PresentError;
    let too_small = PresentError::MappingTooSmall {
        w: 4,
        h: 2,
        len: 16,
    };
    assert_eq!(too_small.to_string(), "a 4x2 frame in a 16-byte mapping");
    assert_eq!(
        PresentError::NoFramebufferFunctions.to_string(),
        "the host GL lacks framebuffer functions"
    );
    assert_eq!(
        PresentError::NoBlitToFlip.to_string(),
        "no glBlitFramebuffer to flip the rows"
    );
    let missing = crate::gl::MissingGlFunction("glFinish");
    assert_eq!(
        crate::egl::EglError::from(missing).to_string(),
        "host EGL: host GL has no glFinish"
    );
}
