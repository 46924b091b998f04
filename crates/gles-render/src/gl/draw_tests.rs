//! Client arrays on the host's driver: drawn from the batch's bytes, and an attribute left
//! pointing there by one draw is refused by the next draw that does not send it again.

use virtsoc_gles_stream::gl_ops as op;

use super::*;
use crate::egl::TestContext;
use crate::gl::{ShareGroup, GL_NO_ERROR};

/// Runs `batch`'s GL packets on `cx` (current on the host); the GL tests of `gl` share it.
pub(in crate::gl) fn run(gl: &Gl, cx: &mut ContextState, batch: &Encoder) {
    let mut reply = Encoder::new();
    let mut r = Reader::new(batch.as_bytes());
    while let Some(p) = r.next_packet() {
        let (opc, payload) = p.expect("packet");
        super::super::dispatch(gl, cx, opc, payload, &mut reply).expect("decoded");
    }
}

/// `glDrawArrays(TRIANGLES, 0, 3)` with attribute 0's three vec2 vertices in the batch
/// (`None`: no client attribute sent).
fn draw(e: &mut Encoder, verts: Option<&[f32; 6]>) {
    let mut p = e.packet(op::glDrawArrays);
    p.u32(4).i32(0).i32(3);
    match verts {
        Some(v) => {
            let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            p.u32(0)
                .u32(3)
                .u32(1)
                .u32(0)
                .i32(2)
                .u32(0x1406)
                .u32(0)
                .bytes(&b);
        }
        None => {
            p.u32(0).u32(0).u32(0);
        }
    }
}

/// Makes and uses program 3: attribute 0 (with 1 and 2 read too) drawn in white.
fn program(e: &mut Encoder) {
    let (vs, fs) = (
        "attribute vec2 p; attribute vec3 n; attribute vec2 t;\n\
         void main() { gl_Position = vec4(p + 0.0 * (n.xy + t), 0.0, 1.0); }",
        "precision mediump float; void main() { gl_FragColor = vec4(1.0); }",
    );
    for (name, kind, src) in [(1u32, 0x8B31u32, vs), (2, 0x8B30, fs)] {
        e.packet(op::glCreateShader).u32(kind).u32(name);
        e.packet(op::glShaderSource).u32(name).bytes(src.as_bytes());
        e.packet(op::glCompileShader).u32(name);
    }
    e.packet(op::glCreateProgram).u32(3);
    e.packet(op::glAttachShader).u32(3).u32(1);
    e.packet(op::glAttachShader).u32(3).u32(2);
    e.packet(op::glBindAttribLocation)
        .u32(3)
        .u32(0)
        .bytes(b"p\0");
    e.packet(op::glLinkProgram).u32(3);
    e.packet(op::glUseProgram).u32(3);
}

#[test]
fn client_arrays_draw_from_the_batch_and_never_linger() {
    let Some(host) = TestContext::open(2, (8, 8)) else {
        return;
    };
    let gl = host.gl();
    let mut cx = ContextState::new(ShareGroup::new_shared());
    // A program drawing attribute 0 in white over a black clear.
    let mut e = Encoder::new();
    program(&mut e);
    e.packet(op::glEnableVertexAttribArray).u32(0);
    e.packet(op::glClear).u32(0x4000);
    draw(&mut e, Some(&[-1.0, -1.0, 3.0, -1.0, -1.0, 3.0]));
    run(&gl, &mut cx, &e);
    assert_eq!(cx.take_error(), GL_NO_ERROR, "the client draw runs");
    let mut px = [0u8; 4];
    // SAFETY: a current context; one RGBA8 pixel into `px`.
    unsafe { (gl.glReadPixels)(4, 4, 1, 1, 0x1908, 0x1401, px.as_mut_ptr().cast()) };
    assert_eq!(px, [255; 4], "drawn from the batch's vertices");
    // The attribute still points where that batch was: a draw that does not send its
    // bytes again is refused, never run on them.
    let mut e = Encoder::new();
    e.packet(op::glClear).u32(0x4000);
    draw(&mut e, None);
    run(&gl, &mut cx, &e);
    assert_eq!(
        cx.take_error(),
        GL_INVALID_OPERATION,
        "no stale client pointer"
    );
    // SAFETY: as above.
    unsafe { (gl.glReadPixels)(4, 4, 1, 1, 0x1908, 0x1401, px.as_mut_ptr().cast()) };
    assert_eq!(px, [0, 0, 0, 0], "nothing drawn");
}

/// Not a test: the time of a draw of 517 KB of client arrays (glmark2's `build:use-vbo=false`
/// frame) from the batch and through the scratch buffer, interleaved.
/// `cargo test --release -p virtsoc-render --lib client_array_cost -- --ignored --nocapture`
#[test]
#[ignore]
fn client_array_cost() {
    let host = TestContext::open(2, (64, 64)).expect("host EGL");
    let gl = host.gl();
    let mut cx = ContextState::new(ShareGroup::new_shared());
    let mut e = Encoder::new();
    program(&mut e);
    e.packet(op::glEnableVertexAttribArray).u32(0);
    e.packet(op::glEnableVertexAttribArray).u32(1);
    e.packet(op::glEnableVertexAttribArray).u32(2);
    run(&gl, &mut cx, &e);
    // 14364 vertices: positions and normals (vec3), texture coordinates (vec2).
    let n = 14364usize;
    let mut e = Encoder::new();
    {
        let mut p = e.packet(op::glDrawArrays);
        p.u32(4).i32(0).i32(n as i32).u32(0).u32(n as u32).u32(3);
        for (i, size) in [(0u32, 3usize), (1, 3), (2, 2)] {
            let b = vec![0u8; n * size * 4];
            p.u32(i).i32(size as i32).u32(0x1406).u32(0).bytes(&b);
        }
    }
    let mut best = [f64::MAX; 2];
    for round in 0..40 {
        let scratch = round % 2 == 1;
        cx.es3.vertex_arrays_used = scratch;
        let t = std::time::Instant::now();
        for _ in 0..20 {
            run(&gl, &mut cx, &e);
        }
        // SAFETY: a current context.
        unsafe { (gl.glFinish)() };
        let us = t.elapsed().as_secs_f64() * 1e6 / 20.0;
        best[scratch as usize] = best[scratch as usize].min(us);
    }
    eprintln!(
        "517 KB client draw: from the batch {:.0} us, through the scratch buffer {:.0} us (best of 20 x 20)",
        best[0], best[1]
    );
    let t = std::time::Instant::now();
    for _ in 0..10_000 {
        std::hint::black_box(attribs_are_buffers(&gl, &mut cx, &[]));
    }
    eprintln!(
        "attribs_are_buffers: {:.2} us per draw ({} attributes)",
        t.elapsed().as_secs_f64() * 1e6 / 10_000.0,
        cx.max_attribs
    );
}
