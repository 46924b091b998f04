/*
 * virtsoc.h - C ABI of the virtsoc guest library (libvirtsoc_guest).
 *
 * The shared memory interface of vSoC (SOSP'24, Figure 3): allocate a region, hand its 64-bit
 * id to devices, and bracket every access - by the CPU or by a device - with
 * virtsoc_begin_access / virtsoc_end_access so the host keeps the replicas coherent.
 *
 * Device commands: include the generated "virtsoc_devices.h" (`virtsoc devices --c-header`):
 * the device ids (enum virtsoc_device), region formats (enum virtsoc_format, the same values
 * as VIRTSOC_FMT_* below), codec kinds (enum virtsoc_codec_kind), the bits of a decoded
 * picture's flags (enum virtsoc_codec_frame_flag: CORRUPT, CROPPED) and one inline stub per
 * command, e.g. virtsoc_codec_decode(c, handle, bitstream, len, pts, &frames_ready, &failed,
 * &failed_pts, &failed_seq) (pass NULL for results you do not need).
 * examples/c-decoder/decode.c is a complete decoder to copy from.
 *
 * Contract of every call:
 * - Return value: 0 (VIRTSOC_OK) on success, else a negative VIRTSOC_E_* code. Output
 *   pointers are written only on success. After a failure, virtsoc_last_error() returns a
 *   message for it on the calling thread (valid until that thread's next failing call; it is
 *   not cleared by successful calls) and virtsoc_strerror(code) a static description.
 * - Pointers: NULL where a pointer is required is VIRTSOC_E_BAD_ARGUMENT, never dereferenced.
 *   Strings are NUL-terminated UTF-8.
 * - Threads: a virtsoc_conn may be used from several threads at once (requests are matched
 *   to their callers). Ordering between threads is the caller's: an access must be begun
 *   before the command that uses it and ended after it.
 * - Ownership: the connection owns its regions, fences and device sessions (decoder
 *   handles...); virtsoc_disconnect releases them all on the host. Region ids and handles are
 *   private to the connection that made them (another's region id is VIRTSOC_E_NO_SUCH_REGION,
 *   another's handle VIRTSOC_E_BAD_ARGUMENT).
 * - Devices: a command reads or writes its region arguments on its own device, so each region
 *   argument is bracketed by virtsoc_begin_access / virtsoc_end_access naming THAT device
 *   (VIRTSOC_DEVICE_CODEC around virtsoc_codec_decode's bitstream, for instance), with the
 *   mode the command's documentation gives (read for inputs, write for outputs). The CPU
 *   brackets its own reads and writes with VIRTSOC_DEV_CPU and gets a pointer.
 *
 * Status codes a device command may return:
 *   VIRTSOC_E_BAD_ARGUMENT   an argument is invalid (unknown handle, wrong frame size...)
 *   VIRTSOC_E_NO_SUCH_REGION a region id is not one of this connection's
 *   VIRTSOC_E_OUT_OF_RANGE   a length exceeds its region (or an output does not fit)
 *   VIRTSOC_E_NOT_SUPPORTED  the device cannot do this (format, codec, option)
 *   VIRTSOC_E_BUSY           a queue or limit is full now: do something else and retry
 *                            (e.g. receive frames before decoding more)
 *   VIRTSOC_E_OUT_OF_MEMORY  this guest's quota is exhausted
 *   VIRTSOC_E_DEVICE         the device failed on the data (a corrupt packet); the session
 *                            stays usable. A decoder with frame threads learns a packet's
 *                            failure only some packets later: that later call succeeds and
 *                            reports it in `failed` / `failed_pts` / `failed_seq`; pictures
 *                            decoded with damage concealed come with
 *                            VIRTSOC_CODEC_FRAME_FLAG_CORRUPT
 *   VIRTSOC_E_CLOSED         the daemon is gone
 * When the device says why (a decoder's message, the sizes that do not match), the reason
 * (at most 48 bytes) ends virtsoc_last_error()'s message, e.g.
 * "DeviceCmd failed: offset or length out of range: len 3001 > bitstream's 3000 bytes".
 *
 * The constants below are checked against the Rust protocol definitions by the library's
 * test suite.
 */
#ifndef VIRTSOC_H
#define VIRTSOC_H

#include <stddef.h>
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

/* Devices (all devices: enum virtsoc_device in virtsoc_devices.h). */
#define VIRTSOC_DEV_CPU 0
#define VIRTSOC_DEV_PRODUCER 1
#define VIRTSOC_DEV_CONSUMER 2
#define VIRTSOC_DEV_CONSUMER2 3

/* Region formats (also enum virtsoc_format in virtsoc_devices.h). */
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

/* Connects to the daemon at socket_path (its --socket) and stores a new handle in *out. name
 * (shown in the daemon's listings) and coherence ("guest-staging", "write-invalidate",
 * "prefetch"; NULL: the daemon's default) may be NULL. The token comes from the VIRTSOC_TOKEN
 * environment variable if set. Errors: CLOSED (no daemon there, or it refused: see
 * virtsoc_last_error). The names are virtsoc_channel_*: virtsoc_service_open and
 * virtsoc_service_close are the service device's raw commands in the generated
 * virtsoc_devices.h. */
int virtsoc_connect(const char *socket_path, const char *name, const char *coherence,
                    virtsoc_conn **out);
/* Hangs up and frees the handle: the daemon releases all regions, fences and device sessions
 * of this connection. No other thread may be using c. NULL is ignored. */
void virtsoc_disconnect(virtsoc_conn *c);

/* Allocates a region: size bytes of VIRTSOC_FMT_BLOB (width, height 0), or a width x height
 * image of another format (size is then ignored and computed; YUV 4:2:0 needs even
 * dimensions). *id_out receives the id, *size_out (may be NULL) the size in bytes. Memory is
 * committed lazily at first access. For an image, virtsoc_region_info
 * gives the row stride and plane offsets (or allocate it with virtsoc_alloc_frame).
 * Errors: BAD_ARGUMENT (format, dimensions), OUT_OF_MEMORY (window or quota). */
int virtsoc_alloc(virtsoc_conn *c, uint64_t size, uint32_t width, uint32_t height,
                  uint32_t format, uint32_t usage, uint64_t *id_out, uint64_t *size_out);

/* Frees a region (the host drops every replica). Accesses must have ended; the id is invalid
 * afterwards (a second free is NO_SUCH_REGION). */
int virtsoc_free(virtsoc_conn *c, uint64_t id);

/* Planes a struct virtsoc_region describes at most. */
#define VIRTSOC_MAX_PLANES 4

/* One plane of an image region: rows of row_bytes meaningful bytes, stride bytes apart,
 * starting offset bytes from the start of the region. */
struct virtsoc_plane {
    uint64_t offset;
    uint32_t stride;
    uint32_t row_bytes;
    uint32_t rows;
    uint32_t reserved;
};

/* A region and where its bytes are. Planes, in order:
 *   NV12     Y (offset 0, stride s), interleaved UV (offset s*h, stride s, h/2 rows)
 *   YUV420P  Y (0, s), U (s*h, s/2, h/2 rows), V (s*h + s/2*h/2, s/2, h/2 rows)
 *   RGBA8, BGRA8, YUYV  one plane (0, s)
 *   BLOB     none (plane_count 0, width = height = stride = 0)
 * where s = stride and h = height. Rows may be padded (stride > row_bytes): copy row by row.
 * Unused planes are zero. */
struct virtsoc_region {
    uint64_t id;          /* region id */
    uint64_t size;        /* bytes, all planes and padding included */
    uint32_t width;       /* pixels */
    uint32_t height;      /* pixels */
    uint32_t format;      /* VIRTSOC_FMT_* / enum virtsoc_format */
    uint32_t stride;      /* bytes between rows of plane 0 */
    uint32_t plane_count; /* planes[0 .. plane_count) are valid */
    uint32_t reserved;
    struct virtsoc_plane planes[VIRTSOC_MAX_PLANES];
};

#ifdef __cplusplus
static_assert(sizeof(struct virtsoc_plane) == 24, "struct virtsoc_plane ABI");
static_assert(sizeof(struct virtsoc_region) == 136, "struct virtsoc_region ABI");
#else
_Static_assert(sizeof(struct virtsoc_plane) == 24, "struct virtsoc_plane ABI");
_Static_assert(sizeof(struct virtsoc_region) == 136, "struct virtsoc_region ABI");
#endif

/* Allocates a width x height image region of format (not VIRTSOC_FMT_BLOB: use
 * virtsoc_alloc) and fills *out with its id, size and layout. Free it with virtsoc_free.
 * Errors as virtsoc_alloc. */
int virtsoc_alloc_frame(virtsoc_conn *c, uint32_t width, uint32_t height, uint32_t format,
                        uint32_t usage, struct virtsoc_region *out);

/* Fills *out with the id, size and layout of region id of this connection (answered from the
 * library's cache, no round trip). Errors: NO_SUCH_REGION. */
int virtsoc_region_info(virtsoc_conn *c, uint64_t id, struct virtsoc_region *out);

/* Brackets an access of [offset, offset+len) of region id by device (VIRTSOC_DEV_CPU or a
 * device id of virtsoc_devices.h) in mode (VIRTSOC_READ, VIRTSOC_WRITE - the old contents
 * need not be kept - or VIRTSOC_RW). begin_access makes the range's bytes current in the
 * device's memory; end_access publishes what a write changed. For VIRTSOC_DEV_CPU,
 * *ptr_out receives a pointer to byte offset, valid for len bytes until the matching
 * virtsoc_end_access; for other devices it receives NULL. ptr_out may be NULL.
 * end_access takes the same id, device, range and mode as its begin_access.
 * Errors: NO_SUCH_REGION, BAD_ARGUMENT (mode, range past the end), UNKNOWN_DEVICE. */
int virtsoc_begin_access(virtsoc_conn *c, uint64_t id, uint32_t device, uint64_t offset,
                         uint64_t len, uint32_t mode, void **ptr_out);
int virtsoc_end_access(virtsoc_conn *c, uint64_t id, uint32_t device, uint64_t offset,
                       uint64_t len, uint32_t mode);

/* Writes len bytes from bytes at offset of region id from the CPU as a posted write: into
 * the window where the region lies, then one request the library does not wait for, in
 * which the daemon begins and ends the CPU write (the first write to a region through this
 * connection is an ordinary begin/end, to learn where it lies). No round trip per write,
 * e.g. for a decoder's packets. The daemon refuses it when a device wrote the region since
 * the CPU did (nothing is published; write such regions with begin/end_access): that comes
 * back through virtsoc_take_async_error. Errors here: BAD_ARGUMENT (a region not of this
 * connection, a range past its end, NULL bytes). */
int virtsoc_write_posted(virtsoc_conn *c, uint64_t id, uint64_t offset, const void *bytes,
                         uint64_t len);

/* Waits until every request sent so far has completed, those nobody waits for included. */
int virtsoc_drain(virtsoc_conn *c);

/* The oldest failure of a request nobody waited for (a refused posted write): returns 1 and
 * fills *seq_out and *status_out (a negative VIRTSOC_E_* code; either may be NULL), or 0
 * when there is none. Call virtsoc_drain first to know of every request sent. */
int virtsoc_take_async_error(virtsoc_conn *c, uint64_t *seq_out, int *status_out);

/* Sends a device command and waits for its answer: args points to 6 words (args[0] the
 * command's opcode, then its arguments), values (may be NULL) receives 6 result words. The
 * generated stubs of virtsoc_devices.h call this with the right words; region arguments
 * must be bracketed by accesses of that device (see the top of this file). Errors: the
 * device's status (see the top of this file), UNKNOWN_DEVICE, UNKNOWN_OPCODE. */
int virtsoc_device_cmd(virtsoc_conn *c, uint32_t device, const uint64_t *args, uint64_t *values);

/* Virtual command fences: a signal queued on one device and a wait queued on another order
 * the two devices' work on the host; the guest never waits. Status is read from a page shared
 * with the host, without a round trip. A fence belongs to its connection until
 * virtsoc_fence_release. */
int virtsoc_fence_create(virtsoc_conn *c, uint64_t *fence_out);
int virtsoc_fence_signal(virtsoc_conn *c, uint32_t device, uint64_t fence);
int virtsoc_fence_wait(virtsoc_conn *c, uint32_t device, uint64_t fence);
int virtsoc_fence_release(virtsoc_conn *c, uint64_t fence);
int virtsoc_fence_signaled(virtsoc_conn *c, uint64_t fence, int *signaled);
/* Blocks until the fence is signaled or timeout_ms passed (a HAL's sync_wait); *signaled
 * tells which. A process guest sleeps on the shared page (a futex the host wakes); VM and
 * remote guests re-check at growing intervals up to 1 ms. */
int virtsoc_fence_wait_cpu(virtsoc_conn *c, uint64_t fence, uint32_t timeout_ms, int *signaled);

/* Host services (issue 29): a channel to a service the daemon hosts ("geo", "sensor",
 * "clipboard", "bulk"), with its own rings in a region of the connection's window. Calls go
 * through the channel, not the connection's ring. Errors: PERMISSION_DENIED (the services
 * policy), NOT_SUPPORTED (no such service, or a remote guest: process and VM guests have
 * channels), the service's status otherwise (the reason in virtsoc_last_error). A VM
 * guest's channels ring over its virtio-serial port, read by one thread of the library per
 * connection. The names are virtsoc_channel_*: virtsoc_service_open and
 * virtsoc_service_close are the service device's raw commands in the generated
 * virtsoc_devices.h. */
typedef struct virtsoc_channel virtsoc_channel;
int virtsoc_channel_open(virtsoc_conn *c, const char *name, virtsoc_channel **out);
/* Calls `call` with in_len bytes of input (more than 64 KiB go as a packet transfer); its
 * output (at most out_cap bytes, else BAD_ARGUMENT) goes to output and its length to
 * *out_len; values (may be NULL) receives the call's 4 result words. */
int virtsoc_channel_call(virtsoc_channel *s, uint32_t call, const void *input, size_t in_len,
                         void *output, size_t out_cap, size_t *out_len, uint64_t *values);
int virtsoc_channel_close(virtsoc_conn *c, virtsoc_channel *s);
/* Location (a channel to "geo"): *time_ms is 0 before the host set a fix. */
int virtsoc_geo_fix(virtsoc_channel *s, double *lon, double *lat, double *alt, uint64_t *time_ms);
/* Sensors (a channel to "sensor"): accelerometer, gyroscope, magnetometer, light, proximity. */
int virtsoc_sensor_read(virtsoc_channel *s, const char *name, double xyz[3], uint64_t *time_ns);
/* Clipboard calls on a channel to "clipboard" (virtsoc_channel_call): 1 get (output: the
 * text), 2 set (input: the text). Bulk: 1 echo, 2 sink (values: CRC-32, bytes). */
#define VIRTSOC_CLIPBOARD_GET 1
#define VIRTSOC_CLIPBOARD_SET 2
#define VIRTSOC_BULK_ECHO 1
#define VIRTSOC_BULK_SINK 2

/* Message of the last failing call on this thread (owned by the library; valid until this
 * thread's next failing call). "" before any failure. */
const char *virtsoc_last_error(void);
/* Static description of a (negative) status code. */
const char *virtsoc_strerror(int code);

#ifdef __cplusplus
}
#endif

#endif /* VIRTSOC_H */
