/*
 * eglext_virtsoc.h: virtsoc's EGL extensions EGL_VIRTSOC_region_image and
 * EGL_VIRTSOC_fence_sync (libEGL_virtsoc.so, crates/gles-guest/src/egl/image.rs, device.rs,
 * sync.rs). Include after <EGL/egl.h> and <EGL/eglext.h>.
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

/* Queues the same command without waiting: the region accesses and the command go to the
 * device's queue and the call returns at once (no results; a failure on the host is logged
 * by the library). Order it against the GL queue with virtual fences (below). */
typedef EGLBoolean (*PFNEGLQUEUEDEVICECOMMANDVIRTSOCPROC)(EGLDisplay dpy, const char *device,
                                                          const char *command,
                                                          const uint64_t *args);

/*
 * EGL_VIRTSOC_fence_sync: EGL syncs are virtsoc virtual fences (as a sync file is the
 * native fence of EGL_ANDROID_native_fence_sync, a fence id of the library's connection is
 * virtsoc's). Every sync of this library is one:
 *
 * - EGL_SYNC_FENCE_KHR (EGL_KHR_fence_sync, eglCreateSync): the stream is flushed (not
 *   waited for) and the gles device's queue signals the fence once the GL work before it
 *   has run on the host. Creating one costs no round trip.
 * - eglClientWaitSyncKHR waits on the fence's word in the shared fence page (no round trip
 *   per check); a finite timeout answers EGL_TIMEOUT_EXPIRED_KHR, a fence that never
 *   signals never hangs a finite wait. EGL_SYNC_FLUSH_COMMANDS_BIT_KHR flushes the stream.
 * - eglWaitSyncKHR (EGL_KHR_wait_sync): the guest's GL queue on the host holds its later
 *   work (draws, image latches) until the fence signals; the calling thread does not wait.
 *   The daemon's queues are per guest: another guest's GL queue is never held.
 * - EGL_SYNC_VIRTSOC_FENCE syncs:
 *     EGLint a[] = { EGL_VIRTSOC_SYNC_DEVICE, 10, EGL_NONE };   (10: the codec)
 *     EGLSyncKHR decoded = eglCreateSyncKHR(dpy, EGL_SYNC_VIRTSOC_FENCE, a);
 *     eglWaitSyncKHR(dpy, decoded, 0);   (the GL queue waits for the decode queued before)
 *   EGL_VIRTSOC_SYNC_DEVICE: the virtsoc device id (`virtsoc devices`: codec 10, isp 11,
 *   camera 12, gpu 13, display 14, gles 16, the default) whose queue signals the fence once
 *   the guest's commands queued on it before have completed; 0: nobody but the program,
 *   with eglSignalSyncKHR(dpy, sync, EGL_SIGNALED_KHR) (a virtual fence signals once:
 *   EGL_UNSIGNALED_KHR is EGL_BAD_MATCH). EGL_VIRTSOC_FENCE_ID_LO / _HI instead import an
 *   existing fence id of this connection (checked with the daemon: another guest's fence
 *   id, or a released one, is EGL_BAD_PARAMETER); an imported fence stays its creator's.
 * - Export: eglGetSyncFenceVIRTSOC, or eglGetSyncAttribKHR with EGL_VIRTSOC_FENCE_ID_LO /
 *   _HI. EGL_VIRTSOC_SYNC_SIGNALER answers the signaling device (EGL_NONE when imported).
 * - eglDeviceWaitSyncVIRTSOC makes the queue of any device (e.g. "display") wait on a sync.
 * - eglDestroySyncKHR releases a fence the sync made; the daemon keeps a pending one until
 *   it signals, so waits already queued on it still hold.
 * - Presents carry acquire fences: with the daemon's display (VIRTSOC_GLES_PRESENT=1),
 *   eglSwapBuffers queues the surface's readback on the gles queue, a fence signaled after
 *   it, and the display's present behind a wait on that fence.
 */
#define EGL_VIRTSOC_fence_sync 1
#define EGL_SYNC_VIRTSOC_FENCE          0x7A20
#define EGL_VIRTSOC_SYNC_DEVICE         0x7A21
#define EGL_VIRTSOC_FENCE_ID_LO         0x7A22
#define EGL_VIRTSOC_FENCE_ID_HI         0x7A23
#define EGL_VIRTSOC_SYNC_SIGNALER       0x7A24
/* The virtsoc fence id of `sync`. */
typedef EGLBoolean (*PFNEGLGETSYNCFENCEVIRTSOCPROC)(EGLDisplay dpy, EGLSyncKHR sync,
                                                    uint64_t *fence);
/* The queue of virtsoc device `device` (a name as `virtsoc devices` lists it) holds the
 * guest's later commands on that device until `sync` signals. */
typedef EGLBoolean (*PFNEGLDEVICEWAITSYNCVIRTSOCPROC)(EGLDisplay dpy, EGLSyncKHR sync,
                                                      const char *device);

/*
 * Presenting and measuring (EGL_VIRTSOC_fence_sync):
 *
 * eglPresentVIRTSOC shows the current context's draw surface `surface` (width x height; a
 * pbuffer too, for programs without an X server) on the daemon's display: on the gles queue
 * the surface is read back into one of three frame regions after the GL work before it, a
 * fence signaled after that (the acquire fence) holds the display's present, which carries
 * `capture_ns` (CLOCK_MONOTONIC of the frame's decode or capture, 0: none) for the
 * display's decode-to-photon latency; a fence the display signals after its read (the
 * release fence) holds the next readback into that frame region. Nothing waits unless
 * `flags` has EGL_VIRTSOC_PRESENT_WAIT (the program waits for the display's read). Call it
 * after eglSwapBuffers. EGL_BAD_PARAMETER for a zero size or unknown flags, EGL_BAD_SURFACE
 * without a current context, EGL_BAD_ACCESS when a request fails.
 */
#define EGL_VIRTSOC_PRESENT_WAIT        0x0001
typedef EGLBoolean (*PFNEGLPRESENTVIRTSOCPROC)(EGLDisplay dpy, EGLSurface surface,
                                               EGLint width, EGLint height,
                                               uint64_t capture_ns, EGLint flags);
/* One of the connection's SVM counters (monotonic) by name: "hits" and "misses" (the
 * prefetch engine's predictions), "copies", "copy_ns", "device_copies", "device_copy_ns". */
typedef EGLBoolean (*PFNEGLQUERYCOUNTERVIRTSOCPROC)(EGLDisplay dpy, const char *name,
                                                    uint64_t *value);
/* The host-side durations (ns) of the region accesses of the image latches
 * (glEGLImageTargetTexture2DOES) since the last call, at most `max` into `ns`, their count
 * through `count`: the SVM's access latency into the gles domain (a region prefetched there
 * during the slack is ready at once). Waits for latches still in flight. */
typedef EGLBoolean (*PFNEGLQUERYIMPORTLATENCYVIRTSOCPROC)(EGLDisplay dpy, uint64_t *ns,
                                                          EGLint max, EGLint *count);

#ifdef __cplusplus
}
#endif

#endif /* EGLEXT_VIRTSOC_H */
