/*
 * C test of the virtsoc guest library through virtsoc.h, against a real daemon.
 * Usage: test_virtsoc SOCKET
 * Prints one line per check and a closing "N passed, N failed" line; exits non-zero on failure.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "virtsoc.h"
#include "virtsoc_devices.h" /* generated: virtsoc devices --c-header */

static int passed, failed;

/* The hand-written constants of virtsoc.h equal the generated enums of virtsoc_devices.h
 * (which the devapi tests check against the Rust definitions). */
_Static_assert(VIRTSOC_FMT_BLOB == VIRTSOC_FORMAT_BLOB, "blob");
_Static_assert(VIRTSOC_FMT_RGBA8 == VIRTSOC_FORMAT_RGBA8, "rgba8");
_Static_assert(VIRTSOC_FMT_BGRA8 == VIRTSOC_FORMAT_BGRA8, "bgra8");
_Static_assert(VIRTSOC_FMT_NV12 == VIRTSOC_FORMAT_NV12, "nv12");
_Static_assert(VIRTSOC_FMT_YUV420P == VIRTSOC_FORMAT_YUV420P, "yuv420p");
_Static_assert(VIRTSOC_FMT_YUYV == VIRTSOC_FORMAT_YUYV, "yuyv");
_Static_assert(VIRTSOC_DEV_CPU == VIRTSOC_DEVICE_CPU, "cpu");
_Static_assert(VIRTSOC_DEV_PRODUCER == VIRTSOC_DEVICE_PRODUCER, "producer");
_Static_assert(VIRTSOC_DEV_CONSUMER == VIRTSOC_DEVICE_CONSUMER, "consumer");
_Static_assert(VIRTSOC_DEV_CONSUMER2 == VIRTSOC_DEVICE_CONSUMER2, "consumer2");

#define CHECK(cond, what)                                                                    \
    do {                                                                                     \
        if (cond) {                                                                          \
            passed++;                                                                        \
            printf("ok   %s\n", what);                                                       \
        } else {                                                                             \
            failed++;                                                                        \
            printf("FAIL %s (line %d, last error: %s)\n", what, __LINE__, virtsoc_last_error()); \
        }                                                                                    \
    } while (0)

static uint32_t crc32(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
        return 2;
    }
    virtsoc_conn *c = NULL;
    int rc = virtsoc_connect("/nonexistent/virtsoc.sock", "c-test", NULL, &c);
    CHECK(rc == VIRTSOC_E_CLOSED && c == NULL, "connecting to a missing socket fails clearly");
    CHECK(strlen(virtsoc_last_error()) > 0, "last_error explains the failure");

    rc = virtsoc_connect(argv[1], "c-test", "write-invalidate", &c);
    CHECK(rc == 0 && c != NULL, "connect");
    if (c == NULL) goto done;

    uint64_t id = 0, size = 0;
    rc = virtsoc_alloc(c, 0, 640, 480, VIRTSOC_FMT_RGBA8, VIRTSOC_USAGE_CPU_WRITE, &id, &size);
    CHECK(rc == 0 && id != 0 && size == 640u * 480u * 4u, "alloc a 640x480 RGBA image");

    /* CPU writes, the consumer device checksums. */
    void *p = NULL;
    rc = virtsoc_begin_access(c, id, VIRTSOC_DEV_CPU, 0, size, VIRTSOC_WRITE, &p);
    CHECK(rc == 0 && p != NULL, "begin CPU write access returns a pointer");
    if (p) {
        for (uint64_t i = 0; i < size; i++) ((uint8_t *)p)[i] = (uint8_t)(i * 13 + 1);
    }
    uint32_t want = p ? crc32((const uint8_t *)p, size) : 0;
    CHECK(virtsoc_end_access(c, id, VIRTSOC_DEV_CPU, 0, size, VIRTSOC_WRITE) == 0, "end CPU write");
    CHECK(virtsoc_begin_access(c, id, VIRTSOC_DEV_CONSUMER, 0, size, VIRTSOC_READ, &p) == 0 &&
              p == NULL,
          "begin consumer read (no CPU pointer for devices)");
    uint64_t args[6] = {VIRTSOC_TEST_CHECKSUM, id, 0, 0, 0, 0}, vals[6] = {0};
    rc = virtsoc_device_cmd(c, VIRTSOC_DEV_CONSUMER, args, vals);
    CHECK(rc == 0 && vals[0] == want, "consumer sees the CPU's bytes");
    CHECK(virtsoc_end_access(c, id, VIRTSOC_DEV_CONSUMER, 0, size, VIRTSOC_READ) == 0, "end consumer read");

    /* Producer writes, the CPU reads back. */
    CHECK(virtsoc_begin_access(c, id, VIRTSOC_DEV_PRODUCER, 0, size, VIRTSOC_WRITE, NULL) == 0,
          "begin producer write");
    uint64_t pargs[6] = {VIRTSOC_TEST_WRITE_PATTERN, id, 42, 0, 0, 0};
    CHECK(virtsoc_device_cmd(c, VIRTSOC_DEV_PRODUCER, pargs, vals) == 0, "producer writes a pattern");
    uint64_t produced = vals[0];
    CHECK(virtsoc_end_access(c, id, VIRTSOC_DEV_PRODUCER, 0, size, VIRTSOC_WRITE) == 0, "end producer write");
    rc = virtsoc_begin_access(c, id, VIRTSOC_DEV_CPU, 0, size, VIRTSOC_READ, &p);
    CHECK(rc == 0 && p != NULL && crc32((const uint8_t *)p, size) == produced,
          "CPU reads the producer's bytes");
    CHECK(virtsoc_end_access(c, id, VIRTSOC_DEV_CPU, 0, size, VIRTSOC_READ) == 0, "end CPU read");

    /* Posted writes: one request each, not waited for; refused (nothing published) once a
     * device has written the region. */
    uint64_t pbuf = 0, bsize = 0, bcrc = 0, seq = 0;
    int st = 0;
    uint8_t buf[4096];
    rc = virtsoc_alloc(c, sizeof buf, 0, 0, VIRTSOC_FMT_BLOB, 0, &pbuf, &bsize);
    CHECK(rc == 0 && bsize == sizeof buf, "alloc a blob");
    for (int round = 1; round <= 3; round++) {
        for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * round + 7);
        CHECK(virtsoc_write_posted(c, pbuf, 0, buf, sizeof buf) == 0, "a posted write");
        CHECK(virtsoc_begin_access(c, pbuf, VIRTSOC_DEV_CONSUMER, 0, bsize, VIRTSOC_READ, NULL) == 0 &&
                  virtsoc_consumer_checksum(c, pbuf, &bcrc) == 0 && bcrc == crc32(buf, sizeof buf) &&
                  virtsoc_end_access(c, pbuf, VIRTSOC_DEV_CONSUMER, 0, bsize, VIRTSOC_READ) == 0,
              "the consumer sees each posted write");
    }
    CHECK(virtsoc_drain(c) == 0 && virtsoc_take_async_error(c, &seq, &st) == 0,
          "no posted write refused");
    uint64_t bargs[6] = {VIRTSOC_TEST_WRITE_PATTERN, pbuf, 5, 0, 0, 0};
    CHECK(virtsoc_begin_access(c, pbuf, VIRTSOC_DEV_PRODUCER, 0, bsize, VIRTSOC_WRITE, NULL) == 0 &&
              virtsoc_device_cmd(c, VIRTSOC_DEV_PRODUCER, bargs, vals) == 0 &&
              virtsoc_end_access(c, pbuf, VIRTSOC_DEV_PRODUCER, 0, bsize, VIRTSOC_WRITE) == 0,
          "the producer writes the blob");
    uint64_t pblob = vals[0];
    memset(buf, 0xEE, sizeof buf);
    CHECK(virtsoc_write_posted(c, pbuf, 0, buf, sizeof buf) == 0,
          "a posted write after a device wrote is sent");
    CHECK(virtsoc_drain(c) == 0 && virtsoc_take_async_error(c, &seq, &st) == 1 &&
              st == VIRTSOC_E_BAD_ARGUMENT && seq != 0,
          "... and refused");
    CHECK(virtsoc_take_async_error(c, NULL, NULL) == 0, "a refusal is taken once");
    CHECK(virtsoc_begin_access(c, pbuf, VIRTSOC_DEV_CONSUMER, 0, bsize, VIRTSOC_READ, NULL) == 0 &&
              virtsoc_consumer_checksum(c, pbuf, &bcrc) == 0 && bcrc == pblob &&
              virtsoc_end_access(c, pbuf, VIRTSOC_DEV_CONSUMER, 0, bsize, VIRTSOC_READ) == 0,
          "the refused write published nothing");
    CHECK(virtsoc_write_posted(c, pbuf, 4000, buf, 200) == VIRTSOC_E_BAD_ARGUMENT,
          "a posted write past the end is refused at once");
    CHECK(virtsoc_write_posted(c, pbuf, 0, NULL, 16) == VIRTSOC_E_BAD_ARGUMENT,
          "a posted write of NULL bytes is refused at once");

    /* Fences: the consumer's checksum waits for the producer's signal. */
    uint64_t fence = 0;
    CHECK(virtsoc_fence_create(c, &fence) == 0, "fence create");
    int sig = -1;
    CHECK(virtsoc_fence_signaled(c, fence, &sig) == 0 && sig == 0, "new fence reads pending from the page");
    CHECK(virtsoc_fence_wait(c, VIRTSOC_DEV_CONSUMER, fence) == 0, "queue a wait on the consumer");
    CHECK(virtsoc_begin_access(c, id, VIRTSOC_DEV_PRODUCER, 0, size, VIRTSOC_WRITE, NULL) == 0,
          "begin producer write (fenced)");
    uint64_t fargs[6] = {VIRTSOC_TEST_WRITE_PATTERN, id, 7, 0, 0, 0};
    CHECK(virtsoc_device_cmd(c, VIRTSOC_DEV_PRODUCER, fargs, vals) == 0, "producer writes again");
    produced = vals[0];
    CHECK(virtsoc_end_access(c, id, VIRTSOC_DEV_PRODUCER, 0, size, VIRTSOC_WRITE) == 0, "end producer write (fenced)");
    CHECK(virtsoc_fence_signal(c, VIRTSOC_DEV_PRODUCER, fence) == 0, "queue the signal on the producer");
    CHECK(virtsoc_begin_access(c, id, VIRTSOC_DEV_CONSUMER, 0, size, VIRTSOC_READ, NULL) == 0,
          "consumer read after the wait");
    uint64_t crc = 0;
    CHECK(virtsoc_consumer_checksum(c, id, &crc) == 0 && crc == produced,
          "fenced consumer sees the producer's write (generated stub)");
    CHECK(virtsoc_end_access(c, id, VIRTSOC_DEV_CONSUMER, 0, size, VIRTSOC_READ) == 0, "end consumer read (fenced)");
    CHECK(virtsoc_fence_signaled(c, fence, &sig) == 0 && sig == 1, "signaled fence reads signaled");
    sig = -1;
    CHECK(virtsoc_fence_wait_cpu(c, fence, 1000, &sig) == 0 && sig == 1, "a CPU wait on a signaled fence returns signaled");
    CHECK(virtsoc_fence_release(c, fence) == 0, "fence release");
    uint64_t never = 0;
    CHECK(virtsoc_fence_create(c, &never) == 0, "fence create (never signaled)");
    sig = -1;
    CHECK(virtsoc_fence_wait_cpu(c, never, 20, &sig) == 0 && sig == 0, "a CPU wait on a pending fence times out unsignaled");
    CHECK(virtsoc_fence_wait_cpu(c, never, 20, NULL) != 0, "fence_wait_cpu refuses a null output");
    CHECK(virtsoc_fence_release(c, never) == 0, "fence release (never signaled)");

    /* Frame regions report their layout. */
    struct virtsoc_region r, q;
    memset(&r, 0xAB, sizeof r);
    rc = virtsoc_alloc_frame(c, 320, 240, VIRTSOC_FORMAT_YUV420P, VIRTSOC_USAGE_CPU_READ, &r);
    CHECK(rc == 0 && r.id != 0 && r.width == 320 && r.height == 240 &&
              r.format == VIRTSOC_FORMAT_YUV420P && r.stride >= 320 && r.plane_count == 3,
          "alloc_frame: a 320x240 YUV420P frame with three planes");
    CHECK(r.planes[0].offset == 0 && r.planes[0].stride == r.stride && r.planes[0].row_bytes == 320 &&
              r.planes[0].rows == 240,
          "alloc_frame: the Y plane");
    CHECK(r.planes[1].offset == (uint64_t)r.stride * 240 && r.planes[1].stride == r.stride / 2 &&
              r.planes[1].row_bytes == 160 && r.planes[1].rows == 120 &&
              r.planes[2].offset == r.planes[1].offset + (uint64_t)r.planes[1].stride * 120 &&
              r.planes[2].stride == r.stride / 2 && r.planes[2].rows == 120,
          "alloc_frame: the U and V planes follow");
    CHECK(r.planes[2].offset + (uint64_t)r.planes[2].stride * r.planes[2].rows <= r.size &&
              r.planes[3].offset == 0 && r.planes[3].stride == 0 && r.reserved == 0,
          "alloc_frame: the planes fit the size, unused ones are zero");
    CHECK(virtsoc_region_info(c, r.id, &q) == 0 && memcmp(&q, &r, sizeof q) == 0,
          "region_info reports the same layout");
    CHECK(virtsoc_free(c, r.id) == 0, "free the frame");
    rc = virtsoc_alloc_frame(c, 64, 48, VIRTSOC_FORMAT_NV12, 0, &r);
    CHECK(rc == 0 && r.plane_count == 2 && r.planes[1].offset == (uint64_t)r.stride * 48 &&
              r.planes[1].stride == r.stride && r.planes[1].rows == 24 && r.size == 64u * 48u * 3u / 2u,
          "alloc_frame: NV12 has Y and interleaved UV");
    CHECK(virtsoc_free(c, r.id) == 0, "free the NV12 frame");
    uint64_t blob = 0;
    CHECK(virtsoc_alloc(c, 4096, 0, 0, VIRTSOC_FMT_BLOB, 0, &blob, NULL) == 0 &&
              virtsoc_region_info(c, blob, &q) == 0 && q.size == 4096 && q.plane_count == 0 &&
              q.format == VIRTSOC_FORMAT_BLOB,
          "region_info of a blob (virtsoc_alloc keeps its ABI)");
    CHECK(virtsoc_alloc_frame(c, 64, 48, VIRTSOC_FORMAT_BLOB, 0, &r) == VIRTSOC_E_BAD_ARGUMENT,
          "alloc_frame refuses a blob");
    CHECK(virtsoc_alloc_frame(c, 63, 48, VIRTSOC_FORMAT_YUV420P, 0, &r) == VIRTSOC_E_BAD_ARGUMENT,
          "alloc_frame refuses odd YUV dimensions");
    CHECK(virtsoc_alloc_frame(c, 64, 48, VIRTSOC_FORMAT_RGBA8, 0, NULL) == VIRTSOC_E_BAD_ARGUMENT,
          "alloc_frame refuses a null output");
    CHECK(virtsoc_region_info(c, 0xdeadbeef, &q) == VIRTSOC_E_NO_SUCH_REGION &&
              strlen(virtsoc_last_error()) > 0,
          "region_info of an unknown id");
    CHECK(virtsoc_free(c, blob) == 0, "free the blob");

    /* A decoder's stream info before any packet. */
    uint64_t dec = 0, w = 1, h = 1, fmt = 0, changes = 1;
    CHECK(virtsoc_codec_open_decoder(c, VIRTSOC_CODEC_KIND_H264, VIRTSOC_FORMAT_YUV420P, 1, &dec) == 0,
          "open an H.264 decoder");
    CHECK(virtsoc_codec_stream_info(c, dec, &w, &h, &fmt, &changes, NULL, NULL) == 0 && w == 0 && h == 0 &&
              fmt == VIRTSOC_FORMAT_YUV420P && changes == 0,
          "stream_info before the first picture: 0x0");
    CHECK(virtsoc_codec_stream_info(c, dec + 100, &w, &h, &fmt, &changes, NULL, NULL) == VIRTSOC_E_BAD_ARGUMENT,
          "stream_info of an unknown handle");

    /* Device errors carry the device's reason to virtsoc_last_error. */
    uint64_t bs = 0;
    CHECK(virtsoc_alloc(c, 3000, 0, 0, VIRTSOC_FORMAT_BLOB, 0, &bs, NULL) == 0, "alloc a bitstream");
    CHECK(virtsoc_begin_access(c, bs, VIRTSOC_DEVICE_CPU, 0, 3000, VIRTSOC_WRITE, &p) == 0 && p != NULL,
          "begin CPU write of junk");
    if (p) {
        /* Bytes without a single NAL unit: libavcodec rejects the packet. */
        for (uint32_t i = 0; i < 3000; i++) ((uint8_t *)p)[i] = (uint8_t)((i * 7 + 0xa5) | 0x80);
    }
    CHECK(virtsoc_end_access(c, bs, VIRTSOC_DEVICE_CPU, 0, 3000, VIRTSOC_WRITE) == 0, "end CPU write of junk");
    CHECK(virtsoc_begin_access(c, bs, VIRTSOC_DEVICE_CODEC, 0, 3000, VIRTSOC_READ, NULL) == 0,
          "begin codec read");
    rc = virtsoc_codec_decode(c, dec, bs, 3000, 0, NULL, NULL, NULL, NULL);
    printf("     last error: %s\n", virtsoc_last_error());
    CHECK(rc == VIRTSOC_E_DEVICE && strstr(virtsoc_last_error(), "device error: h264") != NULL,
          "a corrupt packet: VIRTSOC_E_DEVICE with the decoder's reason");
    rc = virtsoc_codec_decode(c, dec, bs, 3001, 0, NULL, NULL, NULL, NULL);
    printf("     last error: %s\n", virtsoc_last_error());
    CHECK(rc == VIRTSOC_E_OUT_OF_RANGE && strstr(virtsoc_last_error(), "len 3001 > bitstream's 3000 bytes") != NULL,
          "a length past the region: VIRTSOC_E_OUT_OF_RANGE with the lengths");
    CHECK(virtsoc_end_access(c, bs, VIRTSOC_DEVICE_CODEC, 0, 3000, VIRTSOC_READ) == 0, "end codec read");
    CHECK(virtsoc_free(c, bs) == 0, "free the bitstream");
    CHECK(virtsoc_codec_close(c, dec) == 0, "close the decoder");

    /* Errors. */
    CHECK(virtsoc_begin_access(c, id, VIRTSOC_DEV_CPU, 0, size, 7, &p) == VIRTSOC_E_BAD_ARGUMENT,
          "bad access mode");
    CHECK(virtsoc_begin_access(c, id, VIRTSOC_DEV_CPU, size, 1, VIRTSOC_READ, &p) == VIRTSOC_E_BAD_ARGUMENT,
          "range past the end (checked by the library's cached metadata)");
    CHECK(virtsoc_begin_access(c, id, 77, 0, size, VIRTSOC_READ, &p) == VIRTSOC_E_UNKNOWN_DEVICE,
          "unknown device");
    CHECK(virtsoc_free(c, 0xdeadbeef) == VIRTSOC_E_NO_SUCH_REGION, "free an unknown id");
    CHECK(virtsoc_alloc(c, 0, 3, 3, VIRTSOC_FMT_NV12, 0, &id, NULL) == VIRTSOC_E_BAD_ARGUMENT,
          "odd NV12 dimensions");
    CHECK(virtsoc_alloc(c, 0, 0, 0, 99, 0, &id, NULL) == VIRTSOC_E_BAD_ARGUMENT, "unknown format");
    CHECK(virtsoc_alloc(NULL, 1, 0, 0, 0, 0, &id, NULL) == VIRTSOC_E_BAD_ARGUMENT, "null handle");
    CHECK(strcmp(virtsoc_strerror(VIRTSOC_E_NO_SUCH_REGION), "no such region (or not yours)") == 0,
          "strerror");
    CHECK(virtsoc_free(c, id) == 0, "free");
    CHECK(virtsoc_free(c, id) == VIRTSOC_E_NO_SUCH_REGION, "double free is an error");
    virtsoc_disconnect(c);

done:
    printf("c-abi: %d passed, %d failed\n", passed, failed);
    return failed == 0 && passed > 0 ? 0 : 1;
}
