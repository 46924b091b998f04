/*
 * C test of the modem device through the generated stubs of virtsoc_devices.h, against a real
 * daemon: an AT session (registration, signal, an SMS, a voice call) and bad writes.
 * Usage: test_modem SOCKET
 * Prints one line per check and a closing "N passed, N failed" line; exits non-zero on failure.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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

/* Sends `n` bytes in writes of at most 32 bytes, packed little-endian into four words.
 * Returns 0, or the first error / -100 if the modem accepted fewer bytes than sent. */
static int modem_send(virtsoc_conn *c, const char *bytes, size_t n) {
    while (n > 0) {
        size_t len = n < 32 ? n : 32;
        uint64_t w[4] = {0, 0, 0, 0};
        for (size_t i = 0; i < len; i++) w[i / 8] |= (uint64_t)(uint8_t)bytes[i] << (8 * (i % 8));
        uint64_t accepted = 0;
        int rc = virtsoc_modem_write(c, len, w[0], w[1], w[2], w[3], &accepted);
        if (rc != 0) return rc;
        if (accepted != len) return -100;
        bytes += len;
        n -= len;
    }
    return 0;
}

/* One read of at most 40 bytes into `out` (NUL-terminated); returns the length or an error. */
static int modem_read_once(virtsoc_conn *c, char *out, size_t cap) {
    uint64_t len = 0, w[5] = {0, 0, 0, 0, 0};
    int rc = virtsoc_modem_read(c, &len, &w[0], &w[1], &w[2], &w[3], &w[4]);
    if (rc != 0) return rc;
    if (len > 40 || len + 1 > cap) return -101;
    for (uint64_t i = 0; i < len; i++) out[i] = (char)(uint8_t)(w[i / 8] >> (8 * (i % 8)));
    out[len] = '\0';
    return (int)len;
}

static int ends_with(const char *s, const char *end) {
    size_t a = strlen(s), b = strlen(end);
    return a >= b && strcmp(s + a - b, end) == 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Sends `line` and reads the answer into `out` until it ends with a final result code or the
 * SMS prompt (bounded: 20 s). Returns 0 or a negative error. */
static int at(virtsoc_conn *c, const char *line, char *out, size_t cap) {
    out[0] = '\0';
    int rc = modem_send(c, line, strlen(line));
    if (rc != 0) return rc;
    size_t n = 0;
    double deadline = now_s() + 20.0;
    for (;;) {
        char chunk[48];
        int got = modem_read_once(c, chunk, sizeof chunk);
        if (got < 0) return got;
        if (got == 0) {
            if (ends_with(out, "OK\r\n") || ends_with(out, "ERROR\r\n") || ends_with(out, "\r\n> "))
                return 0;
            if (now_s() > deadline) return -102;
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
            continue;
        }
        if (n + (size_t)got + 1 > cap) return -103;
        memcpy(out + n, chunk, (size_t)got + 1);
        n += (size_t)got;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SOCKET\n", argv[0]);
        return 2;
    }
    virtsoc_conn *c = NULL, *other = NULL;
    int rc = virtsoc_connect(argv[1], "c-modem", NULL, &c);
    CHECK(rc == 0 && c != NULL, "connect");
    if (c == NULL) goto done;

    char out[1024];
    CHECK(at(c, "ATE0\r", out, sizeof out) == 0 && strcmp(out, "ATE0\r\r\nOK\r\n") == 0,
          "ATE0: the modem powers up echoing, then stops");
    CHECK(at(c, "AT\r", out, sizeof out) == 0 && strcmp(out, "\r\nOK\r\n") == 0, "AT");
    CHECK(at(c, "AT+CREG?\r", out, sizeof out) == 0 &&
              strcmp(out, "\r\n+CREG: 0,1\r\n\r\nOK\r\n") == 0,
          "AT+CREG?: registered on the home network");
    CHECK(at(c, "AT+CSQ\r", out, sizeof out) == 0 && strcmp(out, "\r\n+CSQ: 20,99\r\n\r\nOK\r\n") == 0,
          "AT+CSQ: signal quality");

    CHECK(at(c, "AT+CMGF=1\r", out, sizeof out) == 0 && strcmp(out, "\r\nOK\r\n") == 0,
          "AT+CMGF=1: SMS text mode");
    CHECK(at(c, "AT+CMGS=\"+15551234567\"\r", out, sizeof out) == 0 && strcmp(out, "\r\n> ") == 0,
          "AT+CMGS: the text prompt");
    CHECK(at(c, "Hello from C, through the generated stubs\x1a", out, sizeof out) == 0 &&
              strncmp(out, "\r\n+CMGS: ", 9) == 0 && ends_with(out, "\r\n\r\nOK\r\n"),
          "SMS text and Ctrl-Z: sent, with a message reference");

    CHECK(at(c, "ATD+15550000;\r", out, sizeof out) == 0 && strcmp(out, "\r\nOK\r\n") == 0,
          "ATD: dial a voice call");
    CHECK(at(c, "AT+CLCC\r", out, sizeof out) == 0 && strstr(out, "+CLCC: 1,0,") != NULL &&
              strstr(out, "\"+15550000\",145") != NULL,
          "AT+CLCC lists the outgoing call");
    CHECK(at(c, "ATH\r", out, sizeof out) == 0 && strcmp(out, "\r\nOK\r\n") == 0, "ATH: hang up");
    CHECK(at(c, "AT+CLCC\r", out, sizeof out) == 0 && strcmp(out, "\r\nOK\r\n") == 0,
          "no call after hanging up");
    CHECK(at(c, "AT+NOPE\r", out, sizeof out) == 0 && strcmp(out, "\r\nERROR\r\n") == 0,
          "unknown command: ERROR");

    /* Bad writes. */
    uint64_t accepted = 99;
    CHECK(virtsoc_modem_write(c, 33, 0, 0, 0, 0, &accepted) == VIRTSOC_E_BAD_ARGUMENT &&
              accepted == 99,
          "a 33-byte write is refused");
    CHECK(virtsoc_modem_write(c, 0, 0, 0, 0, 0, &accepted) == 0 && accepted == 0, "an empty write");
    CHECK(modem_read_once(c, out, sizeof out) == 0, "nothing pending");

    /* A second guest has its own modem (still echoing). */
    rc = virtsoc_connect(argv[1], "c-modem-2", NULL, &other);
    CHECK(rc == 0 && other != NULL, "connect a second guest");
    if (other != NULL) {
        CHECK(at(other, "AT\r", out, sizeof out) == 0 && strcmp(out, "AT\r\r\nOK\r\n") == 0,
              "the second guest's modem is a fresh one");
        virtsoc_disconnect(other);
    }
    CHECK(at(c, "AT\r", out, sizeof out) == 0 && strcmp(out, "\r\nOK\r\n") == 0,
          "the first guest's modem is unchanged");
    virtsoc_disconnect(c);

done:
    printf("modem: %d passed, %d failed\n", passed, failed);
    return failed == 0 && passed > 0 ? 0 : 1;
}
