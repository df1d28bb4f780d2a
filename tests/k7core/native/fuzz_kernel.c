/* Fuzz driver for the k7 kernel's readers, built with AddressSanitizer and
 * UndefinedBehaviorSanitizer by tests/k7core/native/sanitize.sh (and the test that runs it).
 *
 *   fuzz_kernel SEED ITERATIONS
 *
 * Each iteration builds a segment image in a heap block of exactly its size (so any read
 * past the end is an ASan report): random bytes, or valid frames then mutated (bit flips,
 * length fields set to huge / negative / off-by-one values, truncation, zeroed ranges,
 * overlapping frames). It then runs the scan, the recovery scan (scan_end), the tail search
 * (last_nonzero), the gather of what the scan found, and the reader state (k7_read) at
 * random positions and visible ends, and checks the invariants the Python side relies on:
 * every frame reported lies inside the image, a frame's CRC matches, scan_end stops inside
 * it, a round trip of frames written by k7_append reads back the same payloads.
 * Prints "ok <iterations> <frames seen>" and exits 0; any violation aborts (exit != 0).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k7.h"

static uint64_t rng_state;

static uint64_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ULL;
}

static int64_t below(int64_t n) { return n > 0 ? (int64_t)(rnd() % (uint64_t)n) : 0; }

#define CHECK(cond, ...)                                                            \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "invariant failed: %s (line %d): ", #cond, __LINE__);   \
            fprintf(stderr, __VA_ARGS__);                                           \
            fputc('\n', stderr);                                                    \
            abort();                                                                \
        }                                                                           \
    } while (0)

static int64_t pick_position(int64_t cap) {
    switch (below(6)) {
    case 0: return 0;
    case 1: return 8 * below(cap / 8 + 2);
    case 2: return below(cap + 16);
    case 3: return -below(1 << 20) - 1;
    case 4: return INT64_MAX - below(1 << 20);
    default: return INT64_MIN + below(1 << 20);
    }
}

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

/* A segment image of `cap` bytes: valid frames, then mutations. */
static void fill(uint8_t *img, int64_t cap) {
    memset(img, 0, (size_t)cap);
    int kind = (int)below(4);
    if (kind == 0) {
        for (int64_t i = 0; i < cap; i++) img[i] = (uint8_t)rnd();
        return;
    }
    uint8_t payload[600];
    int64_t pos = 0;
    while (pos < cap) {
        int64_t len = below(below(4) ? 64 : 600);
        for (int64_t i = 0; i < len; i++) payload[i] = (uint8_t)rnd();
        int64_t next = k7_write_frame(img, cap, pos, payload, len);
        if (next < 0) break;
        /* overlapping frames: sometimes start the next one inside this one */
        pos = (kind == 3 && below(4) == 0 && next - pos > 16) ? pos + 8 : next;
    }
    int64_t mutations = 1 + below(8);
    for (int64_t m = 0; m < mutations && cap > 0; m++) {
        int64_t at = below(cap);
        switch (below(6)) {
        case 0: img[at] ^= (uint8_t)(1u << below(8)); break;
        case 1: /* a length field at a frame-aligned position */
            at &= ~(int64_t)7;
            if (at + 6 <= cap) {
                static const uint32_t lens[] = {0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu, 0xFFFFFFF6u};
                uint32_t v = below(2) ? lens[below(4)] : (uint32_t)(cap - at - 10 + below(3) - 1);
                put_be32(img + at + 2, v);
            }
            break;
        case 2: memset(img + at, 0, (size_t)below(cap - at + 1)); break;
        case 3: img[at & ~(int64_t)7] = 0x4B; if ((at & ~(int64_t)7) + 1 < cap) img[(at & ~(int64_t)7) + 1] = 1; break;
        case 4: memset(img + at, 0xFF, (size_t)below(16 < cap - at ? 16 : cap - at + 1)); break;
        default: img[at] = (uint8_t)rnd(); break;
        }
    }
}

static int64_t frames_seen;

static void check_scan(const uint8_t *img, int64_t cap) {
    enum { MAXN = 512 };
    int64_t pos_out[MAXN], len_out[MAXN], next;
    int32_t status;
    int64_t pos = pick_position(cap), limit = below(3) ? cap : pick_position(cap);
    int64_t max_n = 1 + below(MAXN);
    int64_t n = k7_scan(img, cap, pos, limit, max_n, pos_out, len_out, &next, &status);
    CHECK(n >= 0 && n <= max_n, "n=%lld", (long long)n);
    CHECK(status >= K7_SCAN_OK && status <= K7_SCAN_CORRUPT, "status=%d", status);
    for (int64_t i = 0; i < n; i++) {
        CHECK(pos_out[i] >= K7_HEADER && len_out[i] >= 0 && pos_out[i] + len_out[i] <= cap,
              "frame %lld at %lld len %lld cap %lld", (long long)i, (long long)pos_out[i],
              (long long)len_out[i], (long long)cap);
        uint32_t crc = ((uint32_t)img[pos_out[i] - 4] << 24) | ((uint32_t)img[pos_out[i] - 3] << 16) |
                       ((uint32_t)img[pos_out[i] - 2] << 8) | img[pos_out[i] - 1];
        CHECK(k7_crc32c(0, img + pos_out[i], (size_t)len_out[i]) == crc, "crc of frame %lld", (long long)i);
    }
    frames_seen += n;
    if (n > 0) { /* the gather of what was found stays inside both buffers */
        int64_t total = 0;
        for (int64_t i = 0; i < n; i++) total += len_out[i];
        uint8_t *dst = malloc((size_t)total + 1);
        int32_t *offs = malloc((size_t)(n + 1) * sizeof *offs);
        CHECK(dst && offs, "oom");
        int64_t got = k7_gather(img, cap, pos_out, len_out, n, dst, total, offs);
        CHECK(got == total, "gather %lld != %lld", (long long)got, (long long)total);
        /* and refuses a destination one byte short */
        if (total > 0) CHECK(k7_gather(img, cap, pos_out, len_out, n, dst, total - 1, offs) == -1, "short dst");
        free(dst);
        free(offs);
    }
    int64_t count;
    int64_t end = k7_scan_end(img, cap, &count, &status);
    CHECK(end >= 0 && end <= cap && count >= 0, "scan_end %lld cap %lld", (long long)end, (long long)cap);
    int64_t from = below(3) ? end : pick_position(cap);
    int64_t last = k7_last_nonzero(img, from > cap ? cap : from, cap);
    CHECK(last <= cap, "last_nonzero %lld", (long long)last);
    int64_t target = pick_position(cap);
    int64_t walked = k7_walk(img, cap, below(2) ? 0 : pick_position(cap), target);
    CHECK(walked == -1 || walked >= target, "walk %lld to %lld", (long long)walked, (long long)target);
}

static void check_reader(const uint8_t *img, int64_t cap) {
    enum { CAPN = 256 };
    int64_t starts[CAPN], lens[CAPN];
    k7_pos pub = {0, 0, 0};
    k7_reader r;
    memset(&r, 0, sizeof r);
    r.seg = below(8) ? img : NULL;
    r.cap = cap;
    r.base = below(2) ? 0 : (int64_t)below(1LL << 40) * 8;
    r.pos = below(2) ? r.base + 8 * below(cap / 8 + 2) : pick_position(cap);
    pub.end = (uint64_t)(below(2) ? r.base + cap : pick_position(cap));
    r.pub = &pub;
    r.floor_end = below(4) ? 0 : pick_position(cap);
    r.starts = starts;
    r.lens = lens;
    r.capacity = CAPN;
    int64_t n = k7_read(&r, below(2) ? CAPN : pick_position(CAPN));
    CHECK(n >= 0 && n <= CAPN, "read n=%lld", (long long)n);
    for (int64_t i = 0; i < n; i++)
        CHECK(starts[i] >= K7_HEADER && lens[i] >= 0 && starts[i] + lens[i] <= cap,
              "read frame %lld at %lld len %lld", (long long)i, (long long)starts[i], (long long)lens[i]);
    frames_seen += n;
}

/* Frames appended by the writer read back identical, up to a segment that is exactly full. */
static void check_round_trip(int64_t cap) {
    uint8_t *seg = calloc(1, (size_t)cap);
    CHECK(seg != NULL, "oom");
    k7_pos pub = {0, 0, 0};
    k7_writer w;
    memset(&w, 0, sizeof w);
    w.seg = seg;
    w.cap = cap;
    w.pub = &pub;
    uint8_t data[300];
    int64_t offs[64], lens[64], n = 0;
    for (; n < 64; n++) {
        lens[n] = below(300);
        for (int64_t i = 0; i < lens[n]; i++) data[i] = (uint8_t)(n + i);
        int64_t off = k7_append(&w, data, lens[n]);
        if (off < 0) { CHECK(off == K7_NOFIT, "append %lld", (long long)off); break; }
        offs[n] = off;
    }
    int64_t pos_out[64], len_out[64], next;
    int32_t status;
    int64_t got = k7_scan(seg, cap, 0, (int64_t)pub.end, 64, pos_out, len_out, &next, &status);
    CHECK(got == n, "round trip %lld of %lld", (long long)got, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        CHECK(pos_out[i] == offs[i] + K7_HEADER && len_out[i] == lens[i], "frame %lld moved", (long long)i);
        for (int64_t j = 0; j < lens[i]; j++)
            CHECK(seg[pos_out[i] + j] == (uint8_t)(i + j), "payload %lld byte %lld", (long long)i, (long long)j);
    }
    free(seg);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s SEED ITERATIONS\n", argv[0]);
        return 2;
    }
    rng_state = strtoull(argv[1], NULL, 10) * 0x9E3779B97F4A7C15ULL + 1;
    long long iterations = strtoll(argv[2], NULL, 10);
    for (long long it = 0; it < iterations; it++) {
        int64_t cap = below(8) == 0 ? below(16) : below(4) ? 8 * below(512) : below(8192);
        uint8_t *img = malloc((size_t)(cap ? cap : 1));
        CHECK(img != NULL, "oom");
        fill(img, cap);
        check_scan(img, cap);
        check_reader(img, cap);
        free(img);
        if (it % 16 == 0) check_round_trip(64 + below(4096));
    }
    printf("ok %lld %lld\n", iterations, (long long)frames_seen);
    return 0;
}
