//! YUV images (NV12, YUV 4:2:0) converted to RGBA on the host's GL, as gfxstream does for
//! `samplerExternalOES`: the planes are uploaded as textures straight from the region's
//! replica (`GL_UNPACK_ROW_LENGTH` takes the rows' stride) and drawn into the image's RGBA
//! texture by a shader doing the CPU reference's integer BT.601 (limited range) arithmetic
//! in floats that hold those integers exactly, so the pixels are the CPU's
//! ([`crate::image::yuv_to_rgba`]) bit for bit. It needs an OpenGL ES 3.0 context (`R8`,
//! `RG8`, `texelFetch`); without one the caller converts on the CPU.

use std::ffi::{c_char, c_void, CStr, CString};

use crate::egl::HostEgl;

const VERTEX: &CStr = c"#version 300 es
void main() {
    vec2 p = vec2(float((gl_VertexID & 1) * 4 - 1), float((gl_VertexID & 2) * 2 - 1));
    gl_Position = vec4(p, 0.0, 1.0);
}
";

/// The fragment shader around its chroma fetch ([`NV12_CHROMA`], [`PLANAR_CHROMA`]): one
/// program per layout, since a branch on a uniform costs llvmpipe both sides (it runs the
/// shader as masked SIMD): the NV12 conversion of a 1080p frame took 46 ms with the branch
/// and 25 ms without.
const FRAGMENT_HEAD: &str = "#version 300 es
precision highp float;
precision highp int;
uniform highp sampler2D y_plane;
uniform highp sampler2D u_plane;
uniform highp sampler2D v_plane;
out vec4 color;
float byte_of(float x) { return floor(x * 255.0 + 0.5); }
void main() {
    ivec2 p = ivec2(gl_FragCoord.xy);
    ivec2 c = p / 2;
    float y = byte_of(texelFetch(y_plane, p, 0).r);
";
const NV12_CHROMA: &str = "    vec2 uv = texelFetch(u_plane, c, 0).rg;
    float u = byte_of(uv.r);
    float v = byte_of(uv.g);
";
const PLANAR_CHROMA: &str = "    float u = byte_of(texelFetch(u_plane, c, 0).r);
    float v = byte_of(texelFetch(v_plane, c, 0).r);
";
const FRAGMENT_TAIL: &str = "    float l = 298.0 * (y - 16.0);
    float d = u - 128.0;
    float e = v - 128.0;
    vec3 rgb = floor((vec3(l + 409.0 * e, l - 100.0 * d - 208.0 * e, l + 516.0 * d) + 128.0) / 256.0);
    color = vec4(clamp(rgb, 0.0, 255.0) / 255.0, 1.0);
}
";

const GL_TEXTURE_2D: u32 = 0x0DE1;
const GL_TEXTURE0: u32 = 0x84C0;
const GL_FRAMEBUFFER: u32 = 0x8D40;
const GL_COLOR_ATTACHMENT0: u32 = 0x8CE0;
const GL_FRAMEBUFFER_COMPLETE: u32 = 0x8CD5;
const GL_VERTEX_SHADER: u32 = 0x8B31;
const GL_FRAGMENT_SHADER: u32 = 0x8B30;
const GL_COMPILE_STATUS: u32 = 0x8B81;
const GL_LINK_STATUS: u32 = 0x8B82;
const GL_R8: i32 = 0x8229;
const GL_RG8: i32 = 0x822B;
const GL_RED: u32 = 0x1903;
const GL_RG: u32 = 0x8227;
const GL_UNSIGNED_BYTE: u32 = 0x1401;
const GL_TEXTURE_MIN_FILTER: u32 = 0x2801;
const GL_TEXTURE_MAG_FILTER: u32 = 0x2800;
const GL_NEAREST: i32 = 0x2600;
const GL_UNPACK_ALIGNMENT: u32 = 0x0CF5;
const GL_UNPACK_ROW_LENGTH: u32 = 0x0CF2;
const GL_TRIANGLES: u32 = 0x0004;
const NV12: u32 = 3;
const YUV420: u32 = 4;

/// The functions the conversion calls.
struct Fns {
    create_shader: unsafe extern "C" fn(u32) -> u32,
    shader_source: unsafe extern "C" fn(u32, i32, *const *const c_char, *const i32),
    compile_shader: unsafe extern "C" fn(u32),
    get_shaderiv: unsafe extern "C" fn(u32, u32, *mut i32),
    create_program: unsafe extern "C" fn() -> u32,
    attach_shader: unsafe extern "C" fn(u32, u32),
    link_program: unsafe extern "C" fn(u32),
    get_programiv: unsafe extern "C" fn(u32, u32, *mut i32),
    use_program: unsafe extern "C" fn(u32),
    uniform_location: unsafe extern "C" fn(u32, *const c_char) -> i32,
    uniform1i: unsafe extern "C" fn(i32, i32),
    active_texture: unsafe extern "C" fn(u32),
    gen_textures: unsafe extern "C" fn(i32, *mut u32),
    bind_texture: unsafe extern "C" fn(u32, u32),
    tex_parameteri: unsafe extern "C" fn(u32, u32, i32),
    tex_image: unsafe extern "C" fn(u32, i32, i32, i32, i32, i32, u32, u32, *const c_void),
    tex_sub_image: unsafe extern "C" fn(u32, i32, i32, i32, i32, i32, u32, u32, *const c_void),
    pixel_storei: unsafe extern "C" fn(u32, i32),
    gen_framebuffers: unsafe extern "C" fn(i32, *mut u32),
    bind_framebuffer: unsafe extern "C" fn(u32, u32),
    framebuffer_texture: unsafe extern "C" fn(u32, u32, u32, u32, i32),
    check_status: unsafe extern "C" fn(u32) -> u32,
    viewport: unsafe extern "C" fn(i32, i32, i32, i32),
    draw_arrays: unsafe extern "C" fn(u32, i32, i32),
}

impl Fns {
    fn load(egl: &HostEgl) -> Option<Fns> {
        Some(Fns {
            create_shader: egl.function(c"glCreateShader")?,
            shader_source: egl.function(c"glShaderSource")?,
            compile_shader: egl.function(c"glCompileShader")?,
            get_shaderiv: egl.function(c"glGetShaderiv")?,
            create_program: egl.function(c"glCreateProgram")?,
            attach_shader: egl.function(c"glAttachShader")?,
            link_program: egl.function(c"glLinkProgram")?,
            get_programiv: egl.function(c"glGetProgramiv")?,
            use_program: egl.function(c"glUseProgram")?,
            uniform_location: egl.function(c"glGetUniformLocation")?,
            uniform1i: egl.function(c"glUniform1i")?,
            active_texture: egl.function(c"glActiveTexture")?,
            gen_textures: egl.function(c"glGenTextures")?,
            bind_texture: egl.function(c"glBindTexture")?,
            tex_parameteri: egl.function(c"glTexParameteri")?,
            tex_image: egl.function(c"glTexImage2D")?,
            tex_sub_image: egl.function(c"glTexSubImage2D")?,
            pixel_storei: egl.function(c"glPixelStorei")?,
            gen_framebuffers: egl.function(c"glGenFramebuffers")?,
            bind_framebuffer: egl.function(c"glBindFramebuffer")?,
            framebuffer_texture: egl.function(c"glFramebufferTexture2D")?,
            check_status: egl.function(c"glCheckFramebufferStatus")?,
            viewport: egl.function(c"glViewport")?,
            draw_arrays: egl.function(c"glDrawArrays")?,
        })
    }
}

/// One plane texture of the converter, at its size.
#[derive(Default, Clone, Copy)]
struct Plane {
    tex: u32,
    size: (u32, u32),
    two: bool,
}

/// The conversion's programs, plane textures and framebuffer, in the image context.
pub struct Converter {
    f: Fns,
    /// The NV12 program and the planar (YUV 4:2:0) one.
    programs: [u32; 2],
    fbo: u32,
    planes: [Plane; 3],
}

impl Converter {
    /// Builds the conversion on the current context (the image context, OpenGL ES 3.0);
    /// `None` where it cannot (an ES 2 context, a driver refusing the shaders).
    pub fn new(egl: &HostEgl) -> Option<Converter> {
        let f = Fns::load(egl)?;
        let shader = |kind: u32, src: &CStr| {
            // SAFETY: the image context is current; one NUL-terminated source string.
            unsafe {
                let s = (f.create_shader)(kind);
                let p = src.as_ptr();
                (f.shader_source)(s, 1, &p, std::ptr::null());
                (f.compile_shader)(s);
                let mut ok = 0;
                (f.get_shaderiv)(s, GL_COMPILE_STATUS, &mut ok);
                (ok == 1).then_some(s)
            }
        };
        let vs = shader(GL_VERTEX_SHADER, VERTEX)?;
        let program = |chroma: &str| {
            let src = CString::new([FRAGMENT_HEAD, chroma, FRAGMENT_TAIL].concat()).ok()?;
            let fs = shader(GL_FRAGMENT_SHADER, &src)?;
            // SAFETY: the image context is current; shaders and program names of it; the
            // uniform names are NUL-terminated.
            unsafe {
                let p = (f.create_program)();
                (f.attach_shader)(p, vs);
                (f.attach_shader)(p, fs);
                (f.link_program)(p);
                let mut ok = 0;
                (f.get_programiv)(p, GL_LINK_STATUS, &mut ok);
                if ok != 1 {
                    return None;
                }
                (f.use_program)(p);
                for (unit, name) in [c"y_plane", c"u_plane", c"v_plane"].iter().enumerate() {
                    (f.uniform1i)((f.uniform_location)(p, name.as_ptr()), unit as i32);
                }
                Some(p)
            }
        };
        let programs = [program(NV12_CHROMA)?, program(PLANAR_CHROMA)?];
        let mut fbo = 0;
        // SAFETY: the image context is current; one framebuffer name written.
        unsafe { (f.gen_framebuffers)(1, &mut fbo) };
        Some(Converter {
            f,
            programs,
            fbo,
            planes: [Plane::default(); 3],
        })
    }

    /// Uploads plane `i` (`size` texels of 1 or 2 bytes, rows `stride` bytes apart from
    /// `src`'s start) into its texture on unit `i`.
    fn upload(&mut self, i: usize, size: (u32, u32), two: bool, stride: u32, src: &[u8]) {
        let f = &self.f;
        let p = &mut self.planes[i];
        let (format, internal, bpp) = match two {
            true => (GL_RG, GL_RG8, 2),
            false => (GL_RED, GL_R8, 1),
        };
        // SAFETY: the image context is current; `src` holds the plane's rows (checked by
        // the caller: the last row ends inside it), read with row length `stride / bpp`
        // texels and alignment 1.
        unsafe {
            (f.active_texture)(GL_TEXTURE0 + i as u32);
            if p.tex == 0 {
                (f.gen_textures)(1, &mut p.tex);
            }
            (f.bind_texture)(GL_TEXTURE_2D, p.tex);
            (f.pixel_storei)(GL_UNPACK_ALIGNMENT, 1);
            (f.pixel_storei)(GL_UNPACK_ROW_LENGTH, (stride / bpp) as i32);
            let (w, h) = (size.0 as i32, size.1 as i32);
            if p.size != size || p.two != two {
                (f.tex_parameteri)(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_NEAREST);
                (f.tex_parameteri)(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_NEAREST);
                (f.tex_image)(
                    GL_TEXTURE_2D,
                    0,
                    internal,
                    w,
                    h,
                    0,
                    format,
                    GL_UNSIGNED_BYTE,
                    src.as_ptr().cast(),
                );
                p.size = size;
                p.two = two;
            } else {
                (f.tex_sub_image)(
                    GL_TEXTURE_2D,
                    0,
                    0,
                    0,
                    w,
                    h,
                    format,
                    GL_UNSIGNED_BYTE,
                    src.as_ptr().cast(),
                );
            }
            (f.pixel_storei)(GL_UNPACK_ROW_LENGTH, 0);
        }
    }

    /// Converts a `w` x `h` image laid out as `format` (NV12 or YUV 4:2:0, luma rows of
    /// `stride` bytes, chroma planes at `off`) in `src` into RGBA texture `tex` of the
    /// image context (current); `false` when the layout does not fit `src` or the texture
    /// cannot be drawn into (the caller converts on the CPU then).
    pub fn convert(
        &mut self,
        tex: u32,
        format: u32,
        (w, h, stride): (u32, u32, u32),
        off: [u32; 2],
        src: &[u8],
    ) -> bool {
        if w == 0 || h == 0 || w % 2 != 0 || h % 2 != 0 || stride < w || stride % 2 != 0 {
            return false;
        }
        let (cw, ch) = (w / 2, h / 2);
        // The bytes a plane reads: from `at`, `rows` rows of `row` bytes, `stride` apart.
        let plane = |at: u32, stride: u32, rows: u32, row: u32| {
            let end = u64::from(at) + u64::from(stride) * u64::from(rows - 1) + u64::from(row);
            (end <= src.len() as u64).then(|| &src[at as usize..end as usize])
        };
        match format {
            NV12 => {
                let (Some(y), Some(uv)) = (plane(0, stride, h, w), plane(off[0], stride, ch, w))
                else {
                    return false;
                };
                self.upload(0, (w, h), false, stride, y);
                self.upload(1, (cw, ch), true, stride, uv);
            }
            YUV420 => {
                let cs = stride / 2;
                let (Some(y), Some(u), Some(v)) = (
                    plane(0, stride, h, w),
                    plane(off[0], cs, ch, cw),
                    plane(off[1], cs, ch, cw),
                ) else {
                    return false;
                };
                self.upload(0, (w, h), false, stride, y);
                self.upload(1, (cw, ch), false, cs, u);
                self.upload(2, (cw, ch), false, cs, v);
            }
            _ => return false,
        }
        let f = &self.f;
        // SAFETY: the image context is current; `tex` is its `w` x `h` RGBA texture, the
        // framebuffer and program are its own; the plane textures are bound on units 0-2.
        unsafe {
            (f.bind_framebuffer)(GL_FRAMEBUFFER, self.fbo);
            (f.framebuffer_texture)(GL_FRAMEBUFFER, GL_COLOR_ATTACHMENT0, GL_TEXTURE_2D, tex, 0);
            if (f.check_status)(GL_FRAMEBUFFER) != GL_FRAMEBUFFER_COMPLETE {
                (f.bind_framebuffer)(GL_FRAMEBUFFER, 0);
                return false;
            }
            (f.use_program)(self.programs[usize::from(format != NV12)]);
            (f.viewport)(0, 0, w as i32, h as i32);
            (f.draw_arrays)(GL_TRIANGLES, 0, 3);
            (f.bind_framebuffer)(GL_FRAMEBUFFER, 0);
            (f.active_texture)(GL_TEXTURE0);
        }
        true
    }
}

/// `298 * (y - 16)` for every luma byte: the luma term of [`crate::image::yuv_to_rgba`].
const LUMA: [i32; 256] = {
    let mut t = [0i32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = 298 * (i as i32 - 16);
        i += 1;
    }
    t
};

/// The CPU's conversion of a `w` x `h` NV12 (`nv12`) or YUV 4:2:0 image (luma rows `stride`
/// bytes apart, chroma planes at `off`) in `src` into tightly packed RGBA8 rows in `out`:
/// the arithmetic of [`crate::image::yuv_to_rgba`] (bit for bit, tested), with each chroma
/// pair's terms computed once for its two pixels and the luma term from a table. `None`
/// when the layout reads outside `src` or the size is odd. On a software rasterizer this
/// beats the GL's conversion pass (1080p NV12: see [`prefer_cpu`]).
pub fn to_rgba_cpu(
    nv12: bool,
    (w, h, stride): (usize, usize, usize),
    off: [usize; 2],
    src: &[u8],
    out: &mut Vec<u8>,
) -> Option<()> {
    if w == 0 || h == 0 || w % 2 != 0 || h % 2 != 0 {
        return None;
    }
    out.clear();
    out.resize(w.checked_mul(h)?.checked_mul(4)?, 0);
    let rows = |y0: usize, dst: &mut [u8]| rows_to_rgba(nv12, (w, stride), off, src, y0, dst);
    if w * h < PARALLEL_FROM {
        return rows(0, out);
    }
    // Two halves at once (the rasterizer's threads are idle while an image is imported).
    let (top, bottom) = out.split_at_mut(h / 2 * w * 4);
    std::thread::scope(|s| {
        let half = s.spawn(|| rows(h / 2, bottom));
        let first = rows(0, top);
        first.and(half.join().ok().flatten())
    })
}

/// Images of at least this many pixels are converted by two threads (360p is: the
/// scenarios' tests run it inside the worker's sandbox).
const PARALLEL_FROM: usize = 1 << 17;

/// [`to_rgba_cpu`] of the rows from `y0` that `dst` holds (`w` pixels each).
fn rows_to_rgba(
    nv12: bool,
    (w, stride): (usize, usize),
    off: [usize; 2],
    src: &[u8],
    y0: usize,
    dst: &mut [u8],
) -> Option<()> {
    let row = |o: usize, stride: usize, y: usize, len: usize| {
        let start = o.checked_add(stride.checked_mul(y)?)?;
        src.get(start..start.checked_add(len)?)
    };
    for (i, dst) in dst.chunks_exact_mut(w * 4).enumerate() {
        let y = y0 + i;
        let luma = row(0, stride, y, w)?;
        let (u, v, step) = if nv12 {
            let uv = row(off[0], stride, y / 2, w)?;
            (uv, &uv[1..], 2)
        } else {
            let cs = stride / 2;
            (
                row(off[0], cs, y / 2, w / 2)?,
                row(off[1], cs, y / 2, w / 2)?,
                1,
            )
        };
        let pairs = dst.chunks_exact_mut(8).zip(luma.chunks_exact(2));
        for (x, (px, l)) in pairs.enumerate() {
            let (d, e) = (i32::from(u[x * step]) - 128, i32::from(v[x * step]) - 128);
            let (r, g, b) = (409 * e + 128, 128 - 100 * d - 208 * e, 516 * d + 128);
            for (p, &l) in px.chunks_exact_mut(4).zip(l) {
                let c = LUMA[usize::from(l)];
                let clamp = |x: i32| (x >> 8).clamp(0, 255) as u8;
                p.copy_from_slice(&[clamp(c + r), clamp(c + g), clamp(c + b), 255]);
            }
        }
    }
    Some(())
}

/// Whether the host's GL is a software rasterizer (llvmpipe, softpipe, SwiftShader), on
/// which the CPU's conversion ([`to_rgba_cpu`]) is faster than the GL's pass: importing a
/// 1080p NV12 frame took 22-24 ms p50 with a llvmpipe pass and 7.6-8.6 ms converted on the
/// CPU by two threads (upload and finish included; release, 15 imports, load 4.8 on 2
/// cores). A real GPU converts in a fraction of a millisecond: the GL's pass stays.
pub fn prefer_cpu(egl: &HostEgl) -> bool {
    const GL_RENDERER: u32 = 0x1F01;
    let Some(get) = egl.function::<unsafe extern "C" fn(u32) -> *const c_char>(c"glGetString")
    else {
        return false;
    };
    // SAFETY: a context is current (the image context); glGetString answers a static
    // NUL-terminated string or null.
    let p = unsafe { get(GL_RENDERER) };
    if p.is_null() {
        return false;
    }
    // SAFETY: non-null: a NUL-terminated string the driver keeps.
    let name = unsafe { CStr::from_ptr(p) }
        .to_string_lossy()
        .to_lowercase();
    ["llvmpipe", "softpipe", "swiftshader"]
        .iter()
        .any(|s| name.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::yuv_to_rgba;

    /// The reference: each pixel by [`yuv_to_rgba`].
    fn reference(
        nv12: bool,
        (w, h, s): (usize, usize, usize),
        off: [usize; 2],
        src: &[u8],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        for y in 0..h {
            for x in 0..w {
                let (u, v) = if nv12 {
                    let at = off[0] + s * (y / 2) + 2 * (x / 2);
                    (src[at], src[at + 1])
                } else {
                    let at = s / 2 * (y / 2) + x / 2;
                    (src[off[0] + at], src[off[1] + at])
                };
                out.extend_from_slice(&yuv_to_rgba(src[s * y + x], u, v));
            }
        }
        out
    }

    #[test]
    fn the_cpu_conversion_is_the_references_bit_for_bit() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        };
        let mut out = Vec::new();
        // The last size is converted by two threads.
        for (w, h, s) in [
            (2, 2, 2),
            (8, 6, 10),
            (64, 18, 70),
            (30, 4, 32),
            (640, 362, 644),
        ] {
            let src: Vec<u8> = (0..s * h * 2).map(|_| next()).collect();
            let nv = [s * h, 0];
            to_rgba_cpu(true, (w, h, s), nv, &src, &mut out).unwrap();
            assert!(out == reference(true, (w, h, s), nv, &src), "nv12 {w}x{h}");
            let planar = [s * h, s * h + s / 2 * h / 2];
            to_rgba_cpu(false, (w, h, s), planar, &src, &mut out).unwrap();
            assert!(
                out == reference(false, (w, h, s), planar, &src),
                "i420 {w}x{h}"
            );
        }
        // Every extreme: luma and chroma at 0 and 255 clamp both ways.
        for (y, u, v) in [(0, 0, 0), (255, 255, 255), (0, 255, 0), (255, 0, 255)] {
            let src = [y, y, y, y, u, v];
            to_rgba_cpu(true, (2, 2, 2), [4, 0], &src, &mut out).unwrap();
            assert_eq!(&out[..4], &yuv_to_rgba(y, u, v));
        }
        // Layouts past the bytes, odd sizes: refused.
        assert!(to_rgba_cpu(true, (4, 4, 4), [16, 0], &[0; 20], &mut out).is_none());
        assert!(to_rgba_cpu(true, (3, 2, 4), [8, 0], &[0; 16], &mut out).is_none());
        assert!(to_rgba_cpu(false, (4, 2, 4), [8, 100], &[0; 16], &mut out).is_none());
    }
}
