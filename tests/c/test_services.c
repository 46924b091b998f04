/*
 * C test of host services (virtsoc_channel_*) against a real daemon: the clipboard both
 * ways, a sensor, the location service before any fix, bulk echo and a sink of 200 KiB (a
 * packet transfer), and a service that does not exist.
 * Usage: test_services SOCKET
 * Prints one line per check and a closing "N passed, N failed" line; exits non-zero on failure.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "virtsoc.h"

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

/* CRC-32 (IEEE), bitwise. */
static uint32_t crc32(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
        return 2;
    }
    virtsoc_conn *c = NULL;
    CHECK(virtsoc_connect(argv[1], "c-services", NULL, &c) == 0, "connect");
    if (!c) return 1;

    virtsoc_channel *clip = NULL;
    CHECK(virtsoc_channel_open(c, "clipboard", &clip) == 0, "open clipboard");
    const char *text = "copied in C";
    uint64_t v[4] = {0};
    CHECK(virtsoc_channel_call(clip, VIRTSOC_CLIPBOARD_SET, text, strlen(text), NULL, 0, NULL, v) == 0
              && v[0] >= 1,
          "clipboard set");
    char out[64] = {0};
    size_t n = 0;
    CHECK(virtsoc_channel_call(clip, VIRTSOC_CLIPBOARD_GET, NULL, 0, out, sizeof out - 1, &n, v) == 0
              && n == strlen(text) && memcmp(out, text, n) == 0,
          "clipboard get returns the text");
    CHECK(virtsoc_channel_call(clip, VIRTSOC_CLIPBOARD_GET, NULL, 0, out, 2, &n, v)
              == VIRTSOC_E_BAD_ARGUMENT,
          "an output buffer too small is refused");
    CHECK(virtsoc_channel_close(c, clip) == 0, "close clipboard");

    virtsoc_channel *sensor = NULL;
    CHECK(virtsoc_channel_open(c, "sensor", &sensor) == 0, "open sensor");
    double xyz[3] = {0, 0, 0};
    uint64_t t = 0;
    CHECK(virtsoc_sensor_read(sensor, "magnetometer", xyz, &t) == 0 && xyz[2] < -40.0,
          "magnetometer reads its default field");
    CHECK(virtsoc_sensor_read(sensor, "thermometer", xyz, &t) == VIRTSOC_E_BAD_ARGUMENT,
          "an unknown sensor is refused");
    virtsoc_channel_close(c, sensor);

    virtsoc_channel *geo = NULL;
    CHECK(virtsoc_channel_open(c, "geo", &geo) == 0, "open geo");
    double lon, lat, alt;
    uint64_t ms = 1;
    CHECK(virtsoc_geo_fix(geo, &lon, &lat, &alt, &ms) == 0 && ms == 0, "no fix yet");
    virtsoc_channel_close(c, geo);

    virtsoc_channel *bulk = NULL;
    CHECK(virtsoc_channel_open(c, "bulk", &bulk) == 0, "open bulk");
    CHECK(virtsoc_channel_call(bulk, VIRTSOC_BULK_ECHO, "ping", 4, out, sizeof out, &n, v) == 0
              && n == 4 && memcmp(out, "ping", 4) == 0,
          "bulk echo");
    size_t big = 200 * 1024;
    uint8_t *data = malloc(big);
    for (size_t i = 0; data && i < big; i++) data[i] = (uint8_t)(i * 13 + 1);
    CHECK(data && virtsoc_channel_call(bulk, VIRTSOC_BULK_SINK, data, big, NULL, 0, NULL, v) == 0
              && v[0] == crc32(data, big) && v[1] == big,
          "bulk sink of 200 KiB in packets: CRC and length");
    free(data);
    virtsoc_channel_close(c, bulk);

    virtsoc_channel *none = NULL;
    CHECK(virtsoc_channel_open(c, "no-such", &none) == VIRTSOC_E_NOT_SUPPORTED && !none,
          "an unknown service is refused");

    virtsoc_disconnect(c);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
