/*
 * decode.c - decodes an H.264 Annex-B file on the virtsoc codec device, through the C API
 * alone (virtsoc.h and the generated virtsoc_devices.h), and prints one line per frame with
 * the MD5 of its packed YUV420P bytes, as `ffmpeg -f framemd5 -pix_fmt yuv420p` does.
 *
 * Usage: decode SOCKET CLIP.h264
 * Build: see README.md. Copy it: every step a decoding guest needs is here.
 *
 *   1. connect to the daemon;
 *   2. split the file into access units (all NAL units of one picture) - the codec takes
 *      exactly one access unit per decode;
 *   3. for each access unit: the CPU writes it into a bitstream region (a posted write:
 *      virtsoc_write_posted, no round trip; only the CPU writes that region, so the daemon
 *      takes every one), the codec reads it (a codec read access around
 *      virtsoc_codec_decode);
 *   4. for each decoded picture: virtsoc_codec_stream_info gives its size, a frame region of
 *      that size is (re)allocated with virtsoc_alloc_frame, the codec writes the picture into
 *      it (a codec write access around virtsoc_codec_receive_frame), the CPU reads it (a CPU
 *      read access) row by row using the plane offsets and strides the region reports;
 *   5. at the end, flush the decoder and receive what it still holds.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libavutil/md5.h>
#include <libavutil/mem.h>

#include "virtsoc.h"
#include "virtsoc_devices.h" /* generated: virtsoc devices --c-header */

/* One access unit: bytes [offset, offset + len) of the file. */
struct access_unit {
    size_t offset;
    size_t len;
};

struct decoder {
    virtsoc_conn *c;
    uint64_t handle;          /* the codec's decoder */
    uint64_t bitstream;       /* blob region the access units go through */
    struct virtsoc_region frame; /* the frame region, id 0 until the first picture */
    uint64_t frames;          /* frames printed */
    uint64_t changes;         /* resolution changes seen */
    struct AVMD5 *md5;
};

/* Reports a failed call; returns rc. */
static int check(int rc, const char *what) {
    if (rc != 0) {
        fprintf(stderr, "decode: %s: %s (%s)\n", what, virtsoc_strerror(rc), virtsoc_last_error());
    }
    return rc;
}

/* Reads a whole file into memory. */
static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf != NULL) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        uint8_t *bigger = realloc(buf, cap * 2);
        if (bigger == NULL) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    if (buf != NULL && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = n;
    return buf;
}

/* Offset of the next start code (00 00 01, or 00 00 00 01) at or after from, n if none;
 * *nal receives the offset of the NAL unit's header byte after it. */
static size_t next_start_code(const uint8_t *b, size_t n, size_t from, size_t *nal) {
    for (size_t i = from; i + 3 <= n; i++) {
        if (b[i] == 0 && b[i + 1] == 0 && b[i + 2] == 1) {
            *nal = i + 3;
            return i > from && b[i - 1] == 0 ? i - 1 : i;
        }
    }
    *nal = n;
    return n;
}

/* Whether the NAL unit at nal (len bytes) begins a new access unit, the current one already
 * holding a picture's slice (H.264 7.4.1.2.3): an access unit delimiter, SEI, SPS, PPS or
 * the NAL types 14-18 do, and so does the first slice of the next picture (first_mb_in_slice
 * 0, coded as a single 1 bit, in a non-IDR or IDR slice). */
static int begins_access_unit(const uint8_t *nal, size_t len) {
    if (len < 1) return 0;
    int type = nal[0] & 0x1f;
    if (type == 1 || type == 5) return len > 1 && (nal[1] & 0x80) != 0;
    return type == 6 || type == 7 || type == 8 || type == 9 || (type >= 14 && type <= 18);
}

/* Splits an Annex-B stream into access units; returns how many, *out an array to free. */
static size_t split_access_units(const uint8_t *b, size_t n, struct access_unit **out) {
    size_t count = 0, cap = 64;
    struct access_unit *aus = malloc(cap * sizeof *aus);
    size_t nal = 0;
    size_t sc = next_start_code(b, n, 0, &nal);
    size_t au_start = sc;
    int has_slice = 0;
    while (aus != NULL && sc < n) {
        size_t next_nal = 0;
        size_t next_sc = next_start_code(b, n, nal, &next_nal);
        int type = nal < n ? b[nal] & 0x1f : 0;
        if (has_slice && begins_access_unit(b + nal, next_sc - nal)) {
            if (count == cap) {
                struct access_unit *bigger = realloc(aus, 2 * cap * sizeof *aus);
                if (bigger == NULL) break;
                aus = bigger;
                cap *= 2;
            }
            aus[count++] = (struct access_unit){au_start, sc - au_start};
            au_start = sc;
            has_slice = 0;
        }
        if (type == 1 || type == 5) has_slice = 1;
        sc = next_sc;
        nal = next_nal;
    }
    if (aus != NULL && has_slice) {
        if (count == cap) {
            struct access_unit *bigger = realloc(aus, (cap + 1) * sizeof *aus);
            if (bigger == NULL) {
                free(aus);
                return 0;
            }
            aus = bigger;
        }
        aus[count++] = (struct access_unit){au_start, n - au_start};
    }
    *out = aus;
    return aus != NULL ? count : 0;
}

/* Prints the framemd5 line of the picture in d->frame: the MD5 of its planes' meaningful
 * bytes, row by row (packed YUV420P), read by the CPU. */
static int print_frame(struct decoder *d) {
    const struct virtsoc_region *f = &d->frame;
    void *p = NULL;
    int rc = virtsoc_begin_access(d->c, f->id, VIRTSOC_DEVICE_CPU, 0, f->size, VIRTSOC_READ, &p);
    if (check(rc, "begin CPU read of the frame") != 0) return rc;
    const uint8_t *bytes = p;
    uint64_t packed = 0;
    av_md5_init(d->md5);
    for (uint32_t i = 0; i < f->plane_count; i++) {
        const struct virtsoc_plane *pl = &f->planes[i];
        for (uint32_t row = 0; row < pl->rows; row++) {
            av_md5_update(d->md5, bytes + pl->offset + (uint64_t)row * pl->stride, pl->row_bytes);
            packed += pl->row_bytes;
        }
    }
    uint8_t sum[16];
    av_md5_final(d->md5, sum);
    rc = check(virtsoc_end_access(d->c, f->id, VIRTSOC_DEVICE_CPU, 0, f->size, VIRTSOC_READ),
               "end CPU read of the frame");
    if (rc != 0) return rc;
    char hex[33];
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", sum[i]);
    printf("0, %10" PRIu64 ", %10" PRIu64 ", %8d, %8" PRIu64 ", %s\n", d->frames, d->frames, 1,
           packed, hex);
    d->frames++;
    return 0;
}

/* Receives the ready pictures, sizing the frame region from stream_info first. */
static int receive_frames(struct decoder *d, uint64_t ready) {
    for (uint64_t i = 0; i < ready; i++) {
        uint64_t w = 0, h = 0, format = 0, changes = 0;
        int rc = check(virtsoc_codec_stream_info(d->c, d->handle, &w, &h, &format, &changes, NULL, NULL),
                       "stream_info");
        if (rc != 0) return rc;
        if (changes != d->changes) {
            fprintf(stderr,
                    "decode: resolution change %" PRIu64 ": %" PRIu64 "x%" PRIu64
                    " from frame %" PRIu64 "\n",
                    changes, w, h, d->frames);
            d->changes = changes;
        }
        if (d->frame.id == 0 || d->frame.width != w || d->frame.height != h) {
            if (d->frame.id != 0) {
                rc = check(virtsoc_free(d->c, d->frame.id), "free the frame region");
                d->frame.id = 0;
                if (rc != 0) return rc;
            }
            uint32_t usage = VIRTSOC_USAGE_DEVICE_WRITE | VIRTSOC_USAGE_CPU_READ;
            rc = check(virtsoc_alloc_frame(d->c, (uint32_t)w, (uint32_t)h, (uint32_t)format, usage,
                                           &d->frame),
                       "allocate the frame region");
            if (rc != 0) return rc;
        }
        const struct virtsoc_region *f = &d->frame;
        rc = virtsoc_begin_access(d->c, f->id, VIRTSOC_DEVICE_CODEC, 0, f->size, VIRTSOC_WRITE,
                                  NULL);
        if (check(rc, "begin codec write of the frame") != 0) return rc;
        uint64_t got = 0;
        int recv = virtsoc_codec_receive_frame(d->c, d->handle, f->id, &got, NULL, NULL, NULL, NULL);
        check(recv, "receive_frame");
        rc = check(virtsoc_end_access(d->c, f->id, VIRTSOC_DEVICE_CODEC, 0, f->size, VIRTSOC_WRITE),
                   "end codec write of the frame");
        if (recv != 0) return recv;
        if (rc != 0) return rc;
        if (!got) return 0;
        rc = print_frame(d);
        if (rc != 0) return rc;
    }
    return 0;
}

/* Feeds one access unit, then receives the pictures it completed. */
static int decode_access_unit(struct decoder *d, const uint8_t *au, size_t len, uint64_t pts) {
    uint64_t bs = d->bitstream;
    /* The daemon runs this CPU write before the codec's read access queued after it. */
    int rc = check(virtsoc_write_posted(d->c, bs, 0, au, len), "posted write of the bitstream");
    if (rc != 0) return rc;
    for (;;) {
        uint64_t ready = 0, failed = 0, failed_pts = 0;
        rc = virtsoc_begin_access(d->c, bs, VIRTSOC_DEVICE_CODEC, 0, len, VIRTSOC_READ, NULL);
        if (check(rc, "begin codec read of the bitstream") != 0) return rc;
        int dec = virtsoc_codec_decode(d->c, d->handle, bs, len, pts, &ready, &failed, &failed_pts,
                                       NULL);
        const char *why = dec != 0 ? virtsoc_last_error() : "";
        char reason[256];
        snprintf(reason, sizeof reason, "%s", why);
        rc = check(virtsoc_end_access(d->c, bs, VIRTSOC_DEVICE_CODEC, 0, len, VIRTSOC_READ),
                   "end codec read of the bitstream");
        if (rc != 0) return rc;
        if (dec == VIRTSOC_E_BUSY) {
            /* Too many pictures wait: receive them all, then feed the access unit again. */
            uint64_t before = d->frames;
            rc = receive_frames(d, UINT64_MAX);
            if (rc != 0) return rc;
            if (d->frames == before) return check(dec, "decode (busy with no picture waiting)");
            continue;
        }
        if (dec == VIRTSOC_E_DEVICE) {
            /* A corrupt access unit: the decoder stays usable, go on with the next one. */
            fprintf(stderr, "decode: access unit %" PRIu64 " not decoded: %s\n", pts, reason);
            return 0;
        }
        if (dec != 0) {
            fprintf(stderr, "decode: decode: %s (%s)\n", virtsoc_strerror(dec), reason);
            return dec;
        }
        if (failed != 0) {
            /* With frame threads an earlier access unit's failure is reported later. */
            fprintf(stderr, "decode: access unit %" PRIu64 " not decoded\n", failed_pts);
        }
        return receive_frames(d, ready);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s SOCKET CLIP.h264\n", argv[0]);
        return 2;
    }
    size_t len = 0;
    uint8_t *data = read_file(argv[2], &len);
    if (data == NULL) {
        perror(argv[2]);
        return 1;
    }
    struct access_unit *aus = NULL;
    size_t count = split_access_units(data, len, &aus);
    size_t largest = 0;
    for (size_t i = 0; i < count; i++) largest = aus[i].len > largest ? aus[i].len : largest;
    if (count == 0) {
        fprintf(stderr, "decode: no H.264 access units in %s\n", argv[2]);
        free(aus);
        free(data);
        return 1;
    }
    fprintf(stderr, "decode: %zu access units, the largest %zu bytes\n", count, largest);

    struct decoder d = {0};
    int rc = 1;
    d.md5 = av_md5_alloc();
    if (d.md5 == NULL) goto out;
    if (check(virtsoc_connect(argv[1], "c-decoder", NULL, &d.c), "connect") != 0) goto out;
    /* threads 0: the daemon's default number of decoding threads. */
    rc = virtsoc_codec_open_decoder(d.c, VIRTSOC_CODEC_KIND_H264, VIRTSOC_FORMAT_YUV420P, 0,
                                    &d.handle);
    if (check(rc, "open_decoder") != 0) goto out;
    uint32_t usage = VIRTSOC_USAGE_CPU_WRITE | VIRTSOC_USAGE_DEVICE_READ;
    rc = virtsoc_alloc(d.c, largest, 0, 0, VIRTSOC_FORMAT_BLOB, usage, &d.bitstream, NULL);
    if (check(rc, "allocate the bitstream region") != 0) goto out;

    printf("#format: frame checksums\n#version: 2\n#hash: MD5\n#software: virtsoc c-decoder\n");
    printf("#stream#, dts,        pts, duration,     size, hash\n");
    for (size_t i = 0; i < count; i++) {
        rc = decode_access_unit(&d, data + aus[i].offset, aus[i].len, i);
        if (rc != 0) goto out;
    }
    uint64_t ready = 0;
    rc = check(virtsoc_codec_flush(d.c, d.handle, &ready, NULL, NULL, NULL), "flush");
    if (rc == 0) rc = receive_frames(&d, ready);
    if (rc == 0) rc = check(virtsoc_codec_close(d.c, d.handle), "close");
    /* A posted write the daemon refused would have fed the codec old bytes: there is none. */
    int refused = 0;
    if (rc == 0 && virtsoc_drain(d.c) == 0 && virtsoc_take_async_error(d.c, NULL, &refused) == 1)
        rc = check(refused, "a posted write of the bitstream");
    fprintf(stderr, "decode: %" PRIu64 " frames\n", d.frames);

out:
    if (d.c != NULL) {
        /* Regions, the decoder and everything else of the connection go with it. */
        virtsoc_disconnect(d.c);
    }
    av_free(d.md5);
    free(aus);
    free(data);
    return rc == 0 ? 0 : 1;
}
