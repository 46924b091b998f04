/*
 * eglext_virtsoc.h: virtsoc's EGL extension EGL_VIRTSOC_region_image (libEGL_virtsoc.so,
 * crates/gles-guest/src/egl/image.rs). Include after <EGL/egl.h> and <EGL/eglext.h>.
 *
 * An SVM region (a 64-bit region id of the calling process's virtsoc connection, the one
 * the vendor library opened at eglInitialize) becomes an EGLImage:
 *
 *   EGLint attrs[] = { EGL_VIRTSOC_REGION_ID_LO, (EGLint)(id & 0xffffffff),
 *                      EGL_VIRTSOC_REGION_ID_HI, (EGLint)(id >> 32), EGL_NONE };
 *   EGLImageKHR img = eglCreateImageKHR(dpy, EGL_NO_CONTEXT, EGL_VIRTSOC_REGION,
 *                                       (EGLClientBuffer)NULL, attrs);
 *   glBindTexture(GL_TEXTURE_EXTERNAL_OES, tex);   (or GL_TEXTURE_2D)
 *   glEGLImageTargetTexture2DOES(GL_TEXTURE_EXTERNAL_OES, (GLeglImageOES)img);
 *
 * The region's bytes reach the host's GL through the SVM's coherence (the gles device
 * reads the region; see docs/gles.md), never through the GL stream. They are imported at
 * eglCreateImageKHR and again at every glEGLImageTargetTexture2DOES (the latch point, as
 * Android's SurfaceTexture.updateTexImage): after the region is rewritten (by the CPU or a
 * device), call glEGLImageTargetTexture2DOES again before drawing; an unchanged region is
 * not copied again. YUV layouts are converted to RGBA (BT.601, limited range) on the host,
 * so a samplerExternalOES (GL_OES_EGL_image_external) samples RGB and shaders are passed to
 * the host's driver as they are.
 *
 * Attributes (every one but EGL_VIRTSOC_REGION_ID_LO has a default from the region's
 * metadata): EGL_WIDTH, EGL_HEIGHT (default: the region's); EGL_VIRTSOC_FORMAT (default:
 * the region's format; a Blob region needs it); EGL_VIRTSOC_STRIDE (bytes per RGBA or luma
 * row; default: the region's stride when the image is as wide as the region, else packed);
 * EGL_VIRTSOC_PLANE1_OFFSET (first chroma plane; default stride * height),
 * EGL_VIRTSOC_PLANE2_OFFSET (YUV 4:2:0's V plane; default after the U plane). NV12's chroma
 * rows are `stride` bytes, YUV 4:2:0's `stride / 2`.
 *
 * Errors: EGL_BAD_PARAMETER for another target, a context, an unknown attribute or format,
 * a missing id, a region this connection does not have (another process's, a freed one),
 * impossible sizes or strides; EGL_BAD_MATCH for a layout reaching past the region's end
 * or a format other than the region's own; EGL_CONTEXT_LOST when the render worker is gone.
 * glEGLImageTargetTexture2DOES records GL_INVALID_ENUM (target), GL_INVALID_VALUE (not an
 * image) or GL_INVALID_OPERATION (the import failed: e.g. the region was freed).
 */
#ifndef EGLEXT_VIRTSOC_H
#define EGLEXT_VIRTSOC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EGL_VIRTSOC_region_image 1

/* eglCreateImageKHR target. */
#define EGL_VIRTSOC_REGION              0x7A00
/* Attributes. */
#define EGL_VIRTSOC_REGION_ID_LO        0x7A01
#define EGL_VIRTSOC_REGION_ID_HI        0x7A02
#define EGL_VIRTSOC_FORMAT              0x7A03
#define EGL_VIRTSOC_STRIDE              0x7A04
#define EGL_VIRTSOC_PLANE1_OFFSET       0x7A05
#define EGL_VIRTSOC_PLANE2_OFFSET       0x7A06
/* Values of EGL_VIRTSOC_FORMAT (and of eglCreateRegionVIRTSOC's format). */
#define EGL_VIRTSOC_FORMAT_RGBA8        0x7A10
#define EGL_VIRTSOC_FORMAT_NV12         0x7A11
#define EGL_VIRTSOC_FORMAT_YUV420       0x7A12
/* eglCreateRegionVIRTSOC only: width * height untyped bytes (an image of it names its
 * layout with EGL_VIRTSOC_FORMAT). */
#define EGL_VIRTSOC_FORMAT_BLOB         0x7A13

/*
 * Regions of the library's own connection, for programs that fill them themselves (get
 * each with eglGetProcAddress). A region of another connection is another guest's: it
 * cannot be made an image.
 */
/* Allocates a width x height region of `format`; its id through `region`. */
typedef EGLBoolean (*PFNEGLCREATEREGIONVIRTSOCPROC)(EGLDisplay dpy, EGLint format,
                                                    EGLint width, EGLint height,
                                                    uint64_t *region);
/* Begins the CPU's read-write access of the whole region: its bytes' address (NULL and
 * EGL_BAD_ACCESS / EGL_BAD_PARAMETER on failure), its stride through `stride`. */
typedef void *(*PFNEGLMAPREGIONVIRTSOCPROC)(EGLDisplay dpy, uint64_t region, EGLint *stride);
/* Ends that access (the region's write generation moves: the next import copies it). */
typedef EGLBoolean (*PFNEGLUNMAPREGIONVIRTSOCPROC)(EGLDisplay dpy, uint64_t region);
/* Frees the region. */
typedef EGLBoolean (*PFNEGLDESTROYREGIONVIRTSOCPROC)(EGLDisplay dpy, uint64_t region);
/* The SVM copy ledger of the connection: copies and bytes from memory domain `src` to
 * `dst` ("guest-window", "host-ram", "gles", ...; NULL: any), summed. */
typedef EGLBoolean (*PFNEGLQUERYLEDGERVIRTSOCPROC)(EGLDisplay dpy, const char *src,
                                                   const char *dst, uint64_t *copies,
                                                   uint64_t *bytes);
/* Runs command `command` of virtsoc device `device` (names as `virtsoc devices` lists them,
 * e.g. "codec", "receive_frame") on the connection with its declared arguments `args` (at
 * most five), each region argument bracketed by an access of the whole region from that
 * device in its declared mode; the six result words through `results` (may be NULL).
 * EGL_BAD_PARAMETER for an unknown device, command or region, EGL_BAD_ACCESS when the
 * command or an access fails. For filling regions with devices (a decoder's pictures). */
typedef EGLBoolean (*PFNEGLDEVICECOMMANDVIRTSOCPROC)(EGLDisplay dpy, const char *device,
                                                     const char *command,
                                                     const uint64_t *args, uint64_t *results);

#ifdef __cplusplus
}
#endif

#endif /* EGLEXT_VIRTSOC_H */
