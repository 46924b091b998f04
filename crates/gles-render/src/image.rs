//! Guest EGLImages of SVM regions (`EGL_VIRTSOC_REGION`) on the host: each is an RGBA8
//! texture of a context of the worker's own (the *image context*, sharing nothing), wrapped
//! in a host EGLImage (`EGL_KHR_gl_texture_2D_image`), so any guest context's texture can
//! become its sibling (`glEGLImageTargetTexture2DOES`, [`egl::IMAGE_TARGET_TEXTURE`]).
//!
//! Pixels are the region's replica in the `gles` domain as the SVM brought it there, read
//! where it is ([`egl::IMPORT_MAPPED`]: the replica is shared with the worker,
//! [`crate::mapped`]) or sent by the daemon ([`egl::IMPORT`], a replica that is not
//! shared).
//! YUV layouts (NV12, YUV 4:2:0) are converted to RGBA (BT.601, limited range, as the ISP's
//! CPU reference does) by a shader of the image context drawing from the planes uploaded
//! as textures ([`crate::yuv`]; on the CPU where the host has no OpenGL ES 3.0), so a
//! guest's `samplerExternalOES` samples RGB, and the host's `GL_OES_EGL_image_external`
//! takes the shader as it is. The upload runs on the
//! image context and is finished there, so every sibling sees the new pixels in the next
//! draw.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};

use virtsoc_gles_stream::{egl, Reader, StreamError};

use crate::egl::{EglError, Handle, HostEgl};

/// Most images of one guest.
pub const MAX_IMAGES: usize = 1024;
/// Most texture memory the images of one guest hold (more: `EGL_BAD_ALLOC`).
pub const MAX_IMAGE_BYTES: u64 = 1 << 30;

const GL_TEXTURE_2D: u32 = 0x0DE1;
const GL_TEXTURE_EXTERNAL_OES: u32 = 0x8D65;
const GL_RGBA: u32 = 0x1908;
const GL_UNSIGNED_BYTE: u32 = 0x1401;
const GL_TEXTURE_MIN_FILTER: u32 = 0x2801;
const GL_TEXTURE_MAG_FILTER: u32 = 0x2800;
const GL_TEXTURE_WRAP_S: u32 = 0x2802;
const GL_TEXTURE_WRAP_T: u32 = 0x2803;
const GL_LINEAR: i32 = 0x2601;
const GL_CLAMP_TO_EDGE: i32 = 0x812F;
const GL_UNPACK_ALIGNMENT: u32 = 0x0CF5;
const GL_UNPACK_ROW_LENGTH: u32 = 0x0CF2;
const EGL_GL_TEXTURE_2D_KHR: u32 = 0x30B1;
const EGL_GL_TEXTURE_LEVEL_KHR: i32 = 0x30BC;
const EGL_NONE: i32 = 0x3038;

type CreateImage = unsafe extern "C" fn(Handle, Handle, u32, *mut c_void, *const i32) -> Handle;
type DestroyImage = unsafe extern "C" fn(Handle, Handle) -> u32;
type TargetTexture = unsafe extern "C" fn(u32, *mut c_void);
type GenTextures = unsafe extern "C" fn(i32, *mut u32);
type BindTexture = unsafe extern "C" fn(u32, u32);
type TexImage2D = unsafe extern "C" fn(u32, i32, i32, i32, i32, i32, u32, u32, *const c_void);
type TexSubImage2D = unsafe extern "C" fn(u32, i32, i32, i32, i32, i32, u32, u32, *const c_void);
type TexParameteri = unsafe extern "C" fn(u32, u32, i32);
type PixelStorei = unsafe extern "C" fn(u32, i32);
type Finish = unsafe extern "C" fn();

/// The host functions images need (`eglGetProcAddress`).
struct Fns {
    create_image: CreateImage,
    destroy_image: DestroyImage,
    target_texture: TargetTexture,
    gen_textures: GenTextures,
    delete_textures: unsafe extern "C" fn(i32, *const u32),
    bind_texture: BindTexture,
    tex_image: TexImage2D,
    tex_sub_image: TexSubImage2D,
    tex_parameteri: TexParameteri,
    pixel_storei: PixelStorei,
    finish: Finish,
}

impl Fns {
    fn load(egl: &HostEgl) -> Result<Fns, EglError> {
        fn get<T: Copy>(egl: &HostEgl, name: &'static CStr) -> Result<T, EglError> {
            egl.function(name).ok_or(EglError::NoFunction(name))
        }
        Ok(Fns {
            create_image: get(egl, c"eglCreateImageKHR")?,
            destroy_image: get(egl, c"eglDestroyImageKHR")?,
            target_texture: get(egl, c"glEGLImageTargetTexture2DOES")?,
            gen_textures: get(egl, c"glGenTextures")?,
            delete_textures: get(egl, c"glDeleteTextures")?,
            bind_texture: get(egl, c"glBindTexture")?,
            tex_image: get(egl, c"glTexImage2D")?,
            tex_sub_image: get(egl, c"glTexSubImage2D")?,
            tex_parameteri: get(egl, c"glTexParameteri")?,
            pixel_storei: get(egl, c"glPixelStorei")?,
            finish: get(egl, c"glFinish")?,
        })
    }
}

/// One guest image on the host.
struct HostImage {
    /// Its texture in the image context.
    tex: u32,
    /// The host EGLImage of that texture.
    image: Handle,
    size: (u32, u32),
}

/// A guest's images.
#[derive(Default)]
pub struct Images {
    fns: Option<Fns>,
    /// The image context (null until the first image).
    ctx: Option<Handle>,
    images: HashMap<u32, HostImage>,
    /// The GL conversion of YUV images (`None` until the GL first converts; `Some(None)`: the host
    /// cannot, the CPU converts).
    yuv: Option<Option<crate::yuv::Converter>>,
    /// Whether YUV images are converted on the CPU although the GL could
    /// ([`crate::yuv::prefer_cpu`]: a software rasterizer); decided at the first.
    cpu_yuv: Option<bool>,
    /// The RGBA pixels of a conversion on the CPU, kept between imports (a frame's worth
    /// of fresh pages every import would fault them in each time).
    scratch: Vec<u8>,
    /// Whether the image context is OpenGL ES 3.0 (`GL_UNPACK_ROW_LENGTH`).
    es3: bool,
    /// YUV images converted by the GL (tests).
    gl_conversions: u64,
}

// SAFETY: the worker uses its images from one thread only; the handles are plain pointers.
unsafe impl Send for Images {}

impl Images {
    /// The host functions and the image context, made current (the caller's context is
    /// no longer current afterwards).
    fn enter(&mut self, egl: &HostEgl) -> Result<(&Fns, Handle), u32> {
        if self.fns.is_none() {
            let f = Fns::load(egl).map_err(|e| {
                log::warn!("render worker: images: {e}");
                egl::BAD_ALLOC
            })?;
            self.fns = Some(f);
        }
        let ctx = match self.ctx {
            Some(c) => c,
            None => {
                // OpenGL ES 3.0 where the host has it: the YUV conversion's shaders need it.
                let null = std::ptr::null_mut();
                let es3 = egl.create_context(null, null, 3);
                self.es3 = es3.is_ok();
                let c = es3
                    .or_else(|_| egl.create_context(null, null, 2))
                    .map_err(|e| {
                        log::warn!("render worker: image context: {e}");
                        egl::BAD_ALLOC
                    })?;
                self.ctx = Some(c);
                c
            }
        };
        let null = std::ptr::null_mut();
        egl.make_current(null, null, ctx).map_err(|e| {
            log::warn!("render worker: image context: {e}");
            egl::BAD_ALLOC
        })?;
        match &self.fns {
            Some(f) => Ok((f, ctx)),
            None => Err(egl::BAD_ALLOC),
        }
    }

    /// CREATE_IMAGE: an RGBA8 texture of `w` x `h` wrapped in a host EGLImage. Answers an
    /// EGL error code. Leaves the image context current.
    pub fn create(&mut self, egl: &HostEgl, id: u32, w: u32, h: u32) -> u32 {
        if id == 0 || self.images.contains_key(&id) || self.images.len() >= MAX_IMAGES {
            return egl::BAD_PARAMETER;
        }
        if !(1..=egl::MAX_SURFACE).contains(&w) || !(1..=egl::MAX_SURFACE).contains(&h) {
            return egl::BAD_PARAMETER;
        }
        if self.bytes() + u64::from(w) * u64::from(h) * 4 > MAX_IMAGE_BYTES {
            return egl::BAD_ALLOC;
        }
        let (f, ctx) = match self.enter(egl) {
            Ok(x) => x,
            Err(e) => return e,
        };
        let mut tex = 0u32;
        // SAFETY: the image context is current; `tex` receives one name; the texture is
        // given storage (no pixels: null) before it is wrapped, as EGL_KHR_gl_image needs
        // a complete texture (linear filtering: no mipmaps needed).
        let image = unsafe {
            (f.gen_textures)(1, &mut tex);
            (f.bind_texture)(GL_TEXTURE_2D, tex);
            (f.tex_parameteri)(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_LINEAR);
            (f.tex_parameteri)(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_LINEAR);
            (f.tex_parameteri)(GL_TEXTURE_2D, GL_TEXTURE_WRAP_S, GL_CLAMP_TO_EDGE);
            (f.tex_parameteri)(GL_TEXTURE_2D, GL_TEXTURE_WRAP_T, GL_CLAMP_TO_EDGE);
            (f.tex_image)(
                GL_TEXTURE_2D,
                0,
                GL_RGBA as i32,
                w as i32,
                h as i32,
                0,
                GL_RGBA,
                GL_UNSIGNED_BYTE,
                std::ptr::null(),
            );
            let attrs = [EGL_GL_TEXTURE_LEVEL_KHR, 0, EGL_NONE];
            (f.create_image)(
                egl.display(),
                ctx,
                EGL_GL_TEXTURE_2D_KHR,
                tex as usize as *mut c_void,
                attrs.as_ptr(),
            )
        };
        if image.is_null() {
            // SAFETY: the image context is current and `tex` is its texture.
            unsafe { (f.delete_textures)(1, &tex) };
            log::warn!("render worker: eglCreateImageKHR of a {w}x{h} texture failed");
            return egl::BAD_ALLOC;
        }
        self.images.insert(
            id,
            HostImage {
                tex,
                image,
                size: (w, h),
            },
        );
        egl::SUCCESS
    }

    /// DESTROY_IMAGE: textures bound to it keep its storage. Leaves the image context
    /// current when there was such an image.
    pub fn destroy(&mut self, egl: &HostEgl, id: u32) {
        let Some(img) = self.images.remove(&id) else {
            return;
        };
        let Ok((f, _)) = self.enter(egl) else {
            return;
        };
        // SAFETY: an image of this display and a texture of the (current) image context.
        unsafe {
            (f.destroy_image)(egl.display(), img.image);
            (f.delete_textures)(1, &img.tex);
        }
    }

    /// IMAGE_TARGET_TEXTURE on the caller's current context: `false` (GL_INVALID_OPERATION
    /// for the guest) for an unknown image or a target other than `GL_TEXTURE_2D` and
    /// `GL_TEXTURE_EXTERNAL_OES`.
    pub fn target_texture(&self, target: u32, id: u32) -> bool {
        let (Some(f), Some(img)) = (&self.fns, self.images.get(&id)) else {
            return false;
        };
        if target != GL_TEXTURE_2D && target != GL_TEXTURE_EXTERNAL_OES {
            return false;
        }
        // SAFETY: a context is current (the caller's); `img.image` is a live EGLImage of
        // the worker's display.
        unsafe { (f.target_texture)(target, img.image) };
        true
    }

    /// IMPORT (the daemon's): converts and uploads the pixels; answers an EGL error code.
    /// Leaves the image context current.
    pub fn import(&mut self, egl: &HostEgl, p: &mut Reader<'_>) -> Result<u32, StreamError> {
        let (id, format, w, h) = (p.u32()?, p.u32()?, p.u32()?, p.u32()?);
        let (stride, off1, off2) = (p.u32()?, p.u32()?, p.u32()?);
        let bytes = p.bytes()?.unwrap_or_default();
        Ok(self.import_bytes(egl, (id, format), (w, h, stride), [off1, off2], bytes))
    }

    /// IMPORT_MAPPED (the daemon's): [`import`](Self::import) of the first `byte_len`
    /// bytes of a shared replica, read where they are; answers an EGL error code
    /// (`EGL_BAD_PARAMETER` for an unknown mapping or one shorter than `byte_len`).
    pub fn import_mapped(
        &mut self,
        egl: &HostEgl,
        p: &mut Reader<'_>,
        mappings: &crate::mapped::Mappings,
    ) -> Result<u32, StreamError> {
        let (id, format, w, h) = (p.u32()?, p.u32()?, p.u32()?, p.u32()?);
        let (stride, off1, off2) = (p.u32()?, p.u32()?, p.u32()?);
        let (mapping, n) = (p.u32()?, p.u32()? as usize);
        let Some(bytes) = mappings.get(mapping).and_then(|m| m.bytes().get(..n)) else {
            return Ok(egl::BAD_PARAMETER);
        };
        Ok(self.import_bytes(egl, (id, format), (w, h, stride), [off1, off2], bytes))
    }

    /// Converts and uploads `bytes` laid out as `format` into image `id`.
    fn import_bytes(
        &mut self,
        egl: &HostEgl,
        (id, format): (u32, u32),
        (w, h, stride): (u32, u32, u32),
        [off1, off2]: [u32; 2],
        bytes: &[u8],
    ) -> u32 {
        let Some((size, tex)) = self.images.get(&id).map(|i| (i.size, i.tex)) else {
            return egl::BAD_PARAMETER;
        };
        if size != (w, h) {
            return egl::BAD_MATCH;
        }
        if format == egl::IMAGE_NV12 || format == egl::IMAGE_YUV420 {
            if let Err(e) = self.enter(egl) {
                return e;
            }
            let cpu = *self
                .cpu_yuv
                .get_or_insert_with(|| crate::yuv::prefer_cpu(egl));
            // The GL's programs are built only where the GL converts.
            let yuv = match cpu {
                true => None,
                false => self
                    .yuv
                    .get_or_insert_with(|| crate::yuv::Converter::new(egl))
                    .as_mut(),
            };
            if let (Some(c), Some(f)) = (yuv, &self.fns) {
                if c.convert(tex, format, (w, h, stride), [off1, off2], bytes) {
                    // SAFETY: the image context is current.
                    unsafe { (f.finish)() };
                    self.gl_conversions += 1;
                    return egl::SUCCESS;
                }
            }
        }
        // RGBA rows go to the GL where they lie (the row length takes their stride).
        if format == egl::IMAGE_RGBA8
            && stride % 4 == 0
            && (self.es3 || u64::from(stride) == u64::from(w) * 4)
        {
            let last = (h as usize).saturating_sub(1) * stride as usize;
            return match bytes.get(..last + w as usize * 4) {
                Some(px) if h > 0 => self.upload_rgba(egl, tex, (w, h, stride / 4), px),
                _ => egl::BAD_PARAMETER,
            };
        }
        let mut rgba = std::mem::take(&mut self.scratch);
        if to_rgba_into(format, (w, h, stride), [off1, off2], bytes, &mut rgba).is_none() {
            self.scratch = rgba;
            return egl::BAD_PARAMETER;
        }
        let done = self.upload_rgba(egl, tex, (w, h, w), &rgba);
        self.scratch = rgba;
        done
    }

    /// Uploads `w` x `h` RGBA8 pixels, rows `row` pixels apart, into texture `tex` of the
    /// image context and finishes; answers an EGL error code.
    fn upload_rgba(
        &mut self,
        egl: &HostEgl,
        tex: u32,
        (w, h, row): (u32, u32, u32),
        rgba: &[u8],
    ) -> u32 {
        let (f, _) = match self.enter(egl) {
            Ok(x) => x,
            Err(e) => return e,
        };
        // SAFETY: the image context is current; `rgba` holds h rows of w RGBA8 pixels,
        // `row` pixels apart (the last one ends inside it: checked by the caller), read at
        // unpack alignment 4 and row length `row` (set here; the image context is the
        // worker's own).
        unsafe {
            (f.pixel_storei)(GL_UNPACK_ALIGNMENT, 4);
            (f.pixel_storei)(GL_UNPACK_ROW_LENGTH, row as i32);
            (f.bind_texture)(GL_TEXTURE_2D, tex);
            (f.tex_sub_image)(
                GL_TEXTURE_2D,
                0,
                0,
                0,
                w as i32,
                h as i32,
                GL_RGBA,
                GL_UNSIGNED_BYTE,
                rgba.as_ptr().cast(),
            );
            (f.pixel_storei)(GL_UNPACK_ROW_LENGTH, 0);
            // Every sibling (other contexts) sees the pixels in its next draw.
            (f.finish)();
        }
        egl::SUCCESS
    }

    /// Bytes of texture memory the images hold.
    pub fn bytes(&self) -> u64 {
        self.images
            .values()
            .map(|i| u64::from(i.size.0) * u64::from(i.size.1) * 4)
            .sum()
    }
}

/// The RGBA8 pixels (rows from the top, tightly packed) of a `w` x `h` image laid out as
/// `format` in `src`; `None` when the layout reads outside `src` or is unknown. YUV is
/// BT.601 limited range ([`yuv_to_rgba`]).
pub fn to_rgba(
    format: u32,
    w: u32,
    h: u32,
    stride: u32,
    off: [u32; 2],
    src: &[u8],
) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    to_rgba_into(format, (w, h, stride), off, src, &mut out)?;
    Some(out)
}

/// [`to_rgba`] into `out` (its allocation reused).
fn to_rgba_into(
    format: u32,
    (w, h, stride): (u32, u32, u32),
    off: [u32; 2],
    src: &[u8],
    out: &mut Vec<u8>,
) -> Option<()> {
    let (w, h, s) = (w as usize, h as usize, stride as usize);
    let off = [off[0] as usize, off[1] as usize];
    match format {
        egl::IMAGE_RGBA8 if w > 0 && h > 0 => {
            out.clear();
            for y in 0..h {
                let start = s.checked_mul(y)?;
                out.extend_from_slice(src.get(start..start.checked_add(w * 4)?)?);
            }
            Some(())
        }
        egl::IMAGE_NV12 => crate::yuv::to_rgba_cpu(true, (w, h, s), off, src, out),
        egl::IMAGE_YUV420 => crate::yuv::to_rgba_cpu(false, (w, h, s), off, src, out),
        _ => None,
    }
}

/// One BT.601 limited-range pixel as RGBA8 (opaque).
pub fn yuv_to_rgba(y: u8, u: u8, v: u8) -> [u8; 4] {
    let c = 298 * (i32::from(y) - 16);
    let (d, e) = (i32::from(u) - 128, i32::from(v) - 128);
    let clamp = |x: i32| ((x + 128) >> 8).clamp(0, 255) as u8;
    [
        clamp(c + 409 * e),
        clamp(c - 100 * d - 208 * e),
        clamp(c + 516 * d),
        255,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import(images: &mut Images, egl: &HostEgl, words: [u32; 7], px: &[u8]) -> u32 {
        let mut e = virtsoc_gles_stream::Encoder::new();
        {
            let mut p = e.packet(egl::IMPORT);
            for w in words {
                p.u32(w);
            }
            p.bytes(px);
        }
        let mut r = Reader::new(e.as_bytes());
        let (_, mut p) = r.next_packet().unwrap().unwrap();
        images.import(egl, &mut p).unwrap()
    }

    #[test]
    fn images_on_the_host_egl() {
        let _one = virtsoc_sync::LockExt::lock_or_recover(&crate::egl::HOST_EGL_TESTS);
        let Ok(egl) = HostEgl::open() else {
            eprintln!("SKIPPED: no host EGL");
            return;
        };
        let mut im = Images::default();
        assert_eq!(im.create(&egl, 1, 4, 4), egl::SUCCESS);
        assert_eq!(im.create(&egl, 1, 4, 4), egl::BAD_PARAMETER, "id taken");
        assert_eq!(im.create(&egl, 0, 4, 4), egl::BAD_PARAMETER);
        assert_eq!(im.create(&egl, 2, 0, 4), egl::BAD_PARAMETER);
        assert_eq!(
            im.create(&egl, 3, egl::MAX_SURFACE, egl::MAX_SURFACE),
            egl::BAD_ALLOC,
            "over the guest's image memory"
        );
        assert_eq!(im.bytes(), 64);
        let px = [7u8; 64];
        let rgba = |w, h, stride| [1, egl::IMAGE_RGBA8, w, h, stride, 0, 0];
        assert_eq!(import(&mut im, &egl, rgba(4, 4, 16), &px), egl::SUCCESS);
        assert_eq!(import(&mut im, &egl, rgba(2, 4, 8), &px), egl::BAD_MATCH);
        assert_eq!(
            import(&mut im, &egl, rgba(4, 4, 32), &px),
            egl::BAD_PARAMETER
        );
        let unknown = [9, egl::IMAGE_RGBA8, 4, 4, 16, 0, 0];
        assert_eq!(import(&mut im, &egl, unknown, &px), egl::BAD_PARAMETER);
        assert!(!im.target_texture(GL_TEXTURE_2D, 9), "unknown image");
        assert!(!im.target_texture(0x8513, 1), "a cube map");
        im.destroy(&egl, 1);
        im.destroy(&egl, 1);
        assert_eq!(im.bytes(), 0);
    }

    #[test]
    fn padded_rgba_rows_are_uploaded_where_they_lie() {
        let _one = virtsoc_sync::LockExt::lock_or_recover(&crate::egl::HOST_EGL_TESTS);
        let Ok(egl) = HostEgl::open() else {
            eprintln!("SKIPPED: no host EGL");
            return;
        };
        let mut im = Images::default();
        assert_eq!(im.create(&egl, 1, 3, 4), egl::SUCCESS);
        // Rows of 3 pixels, 5 apart: the padding must not reach the texture.
        let px: Vec<u8> = (0..20 * 4 - 8).map(|i| (i * 7 % 251) as u8).collect();
        let words = [1, egl::IMAGE_RGBA8, 3, 4, 20, 0, 0];
        assert_eq!(import(&mut im, &egl, words, &px), egl::SUCCESS);
        let want = to_rgba(egl::IMAGE_RGBA8, 3, 4, 20, [0, 0], &px).unwrap();
        assert!(read_image(&im, &egl, 1) == want);
        // One byte short of the last row: refused.
        assert_eq!(
            import(&mut im, &egl, words, &px[..px.len() - 1]),
            egl::BAD_PARAMETER
        );
    }

    /// The RGBA pixels of image `id`'s texture (the image context is current).
    fn read_image(im: &Images, egl: &HostEgl, id: u32) -> Vec<u8> {
        type GenFn = unsafe extern "C" fn(i32, *mut u32);
        let f = |n: &CStr| egl.proc_address(n);
        let img = &im.images[&id];
        let (w, h) = img.size;
        let mut px = vec![0u8; (w * h * 4) as usize];
        // SAFETY: each function gets the GLES 2.0 prototype of its name; the image context
        // is current and `img.tex` its texture; `px` holds w x h RGBA pixels.
        unsafe {
            let gen: GenFn = std::mem::transmute(f(c"glGenFramebuffers"));
            let bind: unsafe extern "C" fn(u32, u32) = std::mem::transmute(f(c"glBindFramebuffer"));
            let attach: unsafe extern "C" fn(u32, u32, u32, u32, i32) =
                std::mem::transmute(f(c"glFramebufferTexture2D"));
            let read: unsafe extern "C" fn(i32, i32, i32, i32, u32, u32, *mut c_void) =
                std::mem::transmute(f(c"glReadPixels"));
            let mut fbo = 0;
            gen(1, &mut fbo);
            bind(0x8D40, fbo);
            attach(0x8D40, 0x8CE0, GL_TEXTURE_2D, img.tex, 0);
            read(
                0,
                0,
                w as i32,
                h as i32,
                GL_RGBA,
                GL_UNSIGNED_BYTE,
                px.as_mut_ptr().cast(),
            );
            bind(0x8D40, 0);
        }
        px
    }

    #[test]
    fn yuv_images_are_converted_by_the_gl_as_the_cpu_does() {
        let _one = virtsoc_sync::LockExt::lock_or_recover(&crate::egl::HOST_EGL_TESTS);
        let Ok(egl) = HostEgl::open() else {
            eprintln!("SKIPPED: no host EGL");
            return;
        };
        for cpu in [false, true] {
            yuv_images_converted(&egl, cpu);
        }
    }

    /// [`yuv_images_are_converted_by_the_gl_as_the_cpu_does`] with the conversion on the
    /// GL or (`cpu`) on the CPU.
    fn yuv_images_converted(egl: &HostEgl, cpu: bool) {
        let mut im = Images {
            cpu_yuv: Some(cpu),
            ..Images::default()
        };
        let (w, h, stride) = (8u32, 6u32, 10u32);
        // Every luma and chroma extreme, clamped both ways, on padded rows.
        let luma: Vec<u8> = (0..stride * h).map(|i| (i * 37 % 256) as u8).collect();
        let chroma: Vec<u8> = (0..stride * h / 2).map(|i| (i * 91 % 256) as u8).collect();
        let nv12 = [luma.clone(), chroma.clone()].concat();
        let i420 = [luma.clone(), chroma[..15].to_vec(), chroma[..15].to_vec()].concat();
        let cases = [
            (egl::IMAGE_NV12, nv12, [stride * h, 0]),
            (egl::IMAGE_YUV420, i420, [stride * h, stride * h + 15]),
        ];
        for (k, (format, bytes, off)) in cases.into_iter().enumerate() {
            let id = k as u32 + 1;
            assert_eq!(im.create(egl, id, w, h), egl::SUCCESS);
            let words = [id, format, w, h, stride, off[0], off[1]];
            assert_eq!(import(&mut im, egl, words, &bytes), egl::SUCCESS);
            assert_eq!(
                im.gl_conversions,
                if cpu { 0 } else { k as u64 + 1 },
                "format {format}: by the GL unless on the CPU"
            );
            let want = to_rgba(format, w, h, stride, off, &bytes).unwrap();
            assert!(
                read_image(&im, egl, id) == want,
                "format {format}: the CPU's pixels"
            );
        }
        // A layout past the bytes: refused, never read.
        let words = [1, egl::IMAGE_NV12, w, h, stride, stride * h, 0];
        assert_eq!(import(&mut im, egl, words, &luma), egl::BAD_PARAMETER);
    }

    #[test]
    fn layouts_convert_to_rgba() {
        // RGBA with padded rows.
        let src: Vec<u8> = (0..2 * 12).map(|i| i as u8).collect();
        let px = to_rgba(egl::IMAGE_RGBA8, 2, 2, 12, [0, 0], &src).unwrap();
        assert_eq!(&px[..8], &src[..8]);
        assert_eq!(&px[8..], &src[12..20]);
        // NV12 and YUV 4:2:0 of one colour give the same pixels.
        let (y, u, v) = (81u8, 90u8, 240u8); // red in BT.601 limited range
        let mut nv12 = vec![y; 16];
        nv12.extend([u, v, u, v, u, v, u, v]);
        let a = to_rgba(egl::IMAGE_NV12, 4, 4, 4, [16, 0], &nv12).unwrap();
        let mut i420 = vec![y; 16];
        i420.extend([u; 4]);
        i420.extend([v; 4]);
        let b = to_rgba(egl::IMAGE_YUV420, 4, 4, 4, [16, 20], &i420).unwrap();
        assert_eq!(a, b);
        let red = yuv_to_rgba(y, u, v);
        assert!(red[0] > 250 && red[1] < 5 && red[2] < 5, "{red:?}");
        assert_eq!(&a[..4], &red);
        // Reading outside the bytes, odd sizes and unknown layouts are refused.
        assert!(to_rgba(egl::IMAGE_NV12, 4, 4, 4, [16, 0], &nv12[..20]).is_none());
        assert!(to_rgba(egl::IMAGE_NV12, 3, 4, 4, [16, 0], &nv12).is_none());
        assert!(to_rgba(9, 4, 4, 4, [0, 0], &nv12).is_none());
        assert!(to_rgba(egl::IMAGE_RGBA8, 4, 4, u32::MAX, [0, 0], &nv12).is_none());
    }
}
