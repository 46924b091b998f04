/*
 * virtsoc.h - C ABI of the virtsoc guest library (libvirtsoc_guest).
 *
 * The shared memory interface of vSoC (SOSP'24, Figure 3): allocate a region, hand its 64-bit
 * id to devices, and bracket every access - by the CPU or by a device - with
 * virtsoc_begin_access / virtsoc_end_access so the host keeps the replicas coherent.
 *
 * Every function returns 0 on success or a negative VIRTSOC_E_* code; virtsoc_last_error()
 * gives the message of the last failure on the calling thread. A connection may be used from
 * several threads at once.
 *
 * The constants below are checked against the Rust protocol definitions by the library's
 * test suite.
 */
#ifndef VIRTSOC_H
#define VIRTSOC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes (negated). */
#define VIRTSOC_OK 0
#define VIRTSOC_E_UNKNOWN_OPCODE (-1)
#define VIRTSOC_E_UNKNOWN_DEVICE (-2)
#define VIRTSOC_E_NO_SUCH_REGION (-3)
#define VIRTSOC_E_OUT_OF_RANGE (-4)
#define VIRTSOC_E_BAD_ARGUMENT (-5)
#define VIRTSOC_E_OUT_OF_MEMORY (-6)
#define VIRTSOC_E_BUSY (-7)
#define VIRTSOC_E_DEVICE (-8)
#define VIRTSOC_E_NOT_SUPPORTED (-9)
#define VIRTSOC_E_CLOSED (-10)
#define VIRTSOC_E_INTERNAL (-11)
#define VIRTSOC_E_PERMISSION_DENIED (-12)

/* Access modes. */
#define VIRTSOC_READ 1
#define VIRTSOC_WRITE 2
#define VIRTSOC_RW 3

/* Devices. */
#define VIRTSOC_DEV_CPU 0
#define VIRTSOC_DEV_PRODUCER 1
#define VIRTSOC_DEV_CONSUMER 2
#define VIRTSOC_DEV_CONSUMER2 3

/* Formats. */
#define VIRTSOC_FMT_BLOB 0
#define VIRTSOC_FMT_RGBA8 1
#define VIRTSOC_FMT_BGRA8 2
#define VIRTSOC_FMT_NV12 3
#define VIRTSOC_FMT_YUV420P 4
#define VIRTSOC_FMT_YUYV 5

/* Usage bits (kept in the region's metadata). */
#define VIRTSOC_USAGE_CPU_READ 1u
#define VIRTSOC_USAGE_CPU_WRITE 2u
#define VIRTSOC_USAGE_DEVICE_READ 4u
#define VIRTSOC_USAGE_DEVICE_WRITE 8u

/* Test device commands (args[0] of virtsoc_device_cmd). */
#define VIRTSOC_TEST_WRITE_PATTERN 1 /* producer: args[1]=id, args[2]=seed -> values[0]=crc32 */
#define VIRTSOC_TEST_CHECKSUM 2      /* consumer: args[1]=id -> values[0]=crc32 */

typedef struct VirtsocConn virtsoc_conn;

/* Connects to the daemon at socket_path. name and coherence ("guest-staging",
 * "write-invalidate", "prefetch") may be NULL. */
int virtsoc_connect(const char *socket_path, const char *name, const char *coherence,
                    virtsoc_conn **out);
/* Hangs up; the daemon releases all regions of this guest. NULL is ignored. */
void virtsoc_disconnect(virtsoc_conn *c);

/* Allocates a region: size bytes of VIRTSOC_FMT_BLOB, or a width x height image of another
 * format (size is then computed). Memory is committed lazily at first access. */
int virtsoc_alloc(virtsoc_conn *c, uint64_t size, uint32_t width, uint32_t height,
                  uint32_t format, uint32_t usage, uint64_t *id_out, uint64_t *size_out);
int virtsoc_free(virtsoc_conn *c, uint64_t id);

/* Brackets an access of [offset, offset+len) by device. For VIRTSOC_DEV_CPU, *ptr_out
 * receives a pointer to the first byte, valid until virtsoc_end_access; for other devices it
 * receives NULL. ptr_out may be NULL. */
int virtsoc_begin_access(virtsoc_conn *c, uint64_t id, uint32_t device, uint64_t offset,
                         uint64_t len, uint32_t mode, void **ptr_out);
int virtsoc_end_access(virtsoc_conn *c, uint64_t id, uint32_t device, uint64_t offset,
                       uint64_t len, uint32_t mode);

/* Sends a device command; args points to 6 words, values (may be NULL) receives 6 words. */
int virtsoc_device_cmd(virtsoc_conn *c, uint32_t device, const uint64_t *args, uint64_t *values);

/* Virtual command fences: a signal queued on one device and a wait queued on another order
 * the two devices' work on the host; the guest never waits. Status is read from a page shared
 * with the host, without a round trip. */
int virtsoc_fence_create(virtsoc_conn *c, uint64_t *fence_out);
int virtsoc_fence_signal(virtsoc_conn *c, uint32_t device, uint64_t fence);
int virtsoc_fence_wait(virtsoc_conn *c, uint32_t device, uint64_t fence);
int virtsoc_fence_release(virtsoc_conn *c, uint64_t fence);
int virtsoc_fence_signaled(virtsoc_conn *c, uint64_t fence, int *signaled);

/* Message of the last error on this thread. */
const char *virtsoc_last_error(void);
/* Static description of a status code. */
const char *virtsoc_strerror(int code);

#ifdef __cplusplus
}
#endif

#endif /* VIRTSOC_H */
