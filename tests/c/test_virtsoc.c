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
    CHECK(virtsoc_fence_release(c, fence) == 0, "fence release");

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
