/* k7 kernel. See k7.h for the frame layout and the contract of each function. */
#define _GNU_SOURCE
#include "k7.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#endif

#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

/* ------------------------------------------------------------------ CRC32C */

static uint32_t crc_table[8][256];
static int crc_hw = 0;

__attribute__((constructor)) static void k7_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
#if defined(__x86_64__)
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) { crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8); n--; }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;  /* little-endian hosts only use this path on x86/arm64 */
        crc = crc_table[7][w & 0xFF] ^ crc_table[6][(w >> 8) & 0xFF] ^
              crc_table[5][(w >> 16) & 0xFF] ^ crc_table[4][(w >> 24) & 0xFF] ^
              crc_table[3][(w >> 32) & 0xFF] ^ crc_table[2][(w >> 40) & 0xFF] ^
              crc_table[1][(w >> 48) & 0xFF] ^ crc_table[0][w >> 56];
        p += 8; n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw_x86(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) { c = _mm_crc32_u8((uint32_t)c, *p++); n--; }
    while (n >= 8) { uint64_t w; memcpy(&w, p, 8); c = _mm_crc32_u64(c, w); p += 8; n -= 8; }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

uint32_t k7_crc32c(uint32_t crc, const uint8_t *buf, size_t len) {
    crc = ~crc;
#if defined(__x86_64__)
    if (crc_hw) return ~crc_hw_x86(crc, buf, len);
#endif
    return ~crc_sw(crc, buf, len);
}

int k7_crc32c_hardware(void) { return crc_hw != 0; }

/* ------------------------------------------------------------------ key hashes */

static inline uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

int32_t k7_murmur2(const uint8_t *data, size_t len, uint32_t seed) {
    const uint32_t m = 0x5bd1e995u;
    uint32_t h = seed ^ (uint32_t)len;  /* Kafka: an int length; keys are < 2 GiB */
    size_t i = 0;
    for (; i + 4 <= len; i += 4) {
        uint32_t k = le32(data + i) * m;
        k ^= k >> 24;
        h = (h * m) ^ (k * m);
    }
    switch (len & 3) {
    case 3: h ^= (uint32_t)data[i + 2] << 16; /* fall through */
    case 2: h ^= (uint32_t)data[i + 1] << 8;  /* fall through */
    case 1: h ^= data[i]; h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return (int32_t)h;  /* two's complement, as Java's int */
}

uint32_t k7_murmur3_32(const uint8_t *data, size_t len, uint32_t seed) {
    const uint32_t c1 = 0xcc9e2d51u, c2 = 0x1b873593u;
    uint32_t h = seed, k;
    size_t i = 0;
    for (; i + 4 <= len; i += 4) {
        k = rotl32(le32(data + i) * c1, 15) * c2;
        h = rotl32(h ^ k, 13) * 5 + 0xe6546b64u;
    }
    k = 0;
    switch (len & 3) {
    case 3: k ^= (uint32_t)data[i + 2] << 16; /* fall through */
    case 2: k ^= (uint32_t)data[i + 1] << 8;  /* fall through */
    case 1: k ^= data[i]; h ^= rotl32(k * c1, 15) * c2;
    }
    h ^= (uint32_t)len;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h;
}

/* ------------------------------------------------------------------ frames */

static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

int64_t k7_frame_size(int64_t len) {
    return (K7_HEADER + len + K7_ALIGN - 1) & ~(int64_t)(K7_ALIGN - 1);
}

/* Write one frame; returns the new position or K7_NOFIT. */
static inline int64_t put_frame(uint8_t *buf, int64_t cap, int64_t pos, const uint8_t *data, int64_t len) {
    if (len < 0 || len > K7_MAX_LEN || pos < 0) return K7_NOFIT;
    int64_t size = k7_frame_size(len);
    if (pos > cap || size > cap - pos) return K7_NOFIT;
    uint8_t *f = buf + pos;
    f[0] = K7_MAGIC;
    f[1] = K7_FLAG_COMMITTED;
    put_be32(f + 2, (uint32_t)len);
    put_be32(f + 6, k7_crc32c(0, data, (size_t)len));
    if (len) memcpy(f + K7_HEADER, data, (size_t)len);
    memset(f + K7_HEADER + len, 0, (size_t)(size - K7_HEADER - len));
    return pos + size;
}

int64_t k7_write_frame(uint8_t *buf, int64_t cap, int64_t pos, const uint8_t *data, int64_t len) {
    return put_frame(buf, cap, pos, data, len);
}

/* Validate the frame at pos; returns its payload length, or -K7_SCAN_EMPTY / -K7_SCAN_CORRUPT. */
static inline int64_t check_frame(const uint8_t *buf, int64_t cap, int64_t pos, int64_t limit) {
    if (pos < 0 || pos > cap - K7_HEADER) return -K7_SCAN_EMPTY;
    const uint8_t *f = buf + pos;
    if (f[0] == 0 && f[1] == 0) {
        uint32_t l = be32(f + 2), c = be32(f + 6);
        if (l == 0 && c == 0) return -K7_SCAN_EMPTY;
        return -K7_SCAN_CORRUPT;
    }
    if (f[0] != K7_MAGIC || f[1] != K7_FLAG_COMMITTED) return -K7_SCAN_CORRUPT;
    int64_t len = (int64_t)be32(f + 2);
    if (len > K7_MAX_LEN || len > limit - pos - K7_HEADER) return -K7_SCAN_CORRUPT;
    if (k7_crc32c(0, f + K7_HEADER, (size_t)len) != be32(f + 6)) return -K7_SCAN_CORRUPT;
    return len;
}

int64_t k7_scan(const uint8_t *buf, int64_t cap, int64_t pos, int64_t limit, int64_t max_n,
                int64_t *out_pos, int64_t *out_len, int64_t *out_next, int32_t *out_status) {
    if (limit > cap) limit = cap;
    int64_t n = 0;
    int32_t status = K7_SCAN_OK;
    while (n < max_n && pos < limit) {
        int64_t len = check_frame(buf, cap, pos, limit);
        if (len < 0) { status = (int32_t)-len; break; }
        out_pos[n] = pos + K7_HEADER;
        out_len[n] = len;
        n++;
        int64_t next = pos + k7_frame_size(len);
        pos = next < cap ? next : cap;
    }
    *out_next = pos;
    *out_status = status;
    return n;
}

int64_t k7_next_frame(const uint8_t *buf, int64_t cap, int64_t start, int64_t limit) {
    if (limit > cap) limit = cap;
    if (start < 0) start = 0;
    int64_t first = (start + K7_ALIGN - 1) & ~(int64_t)(K7_ALIGN - 1);
    for (int64_t pos = first; pos + K7_HEADER <= limit; pos += K7_ALIGN) {
        if (buf[pos] == K7_MAGIC && buf[pos + 1] == K7_FLAG_COMMITTED &&
            check_frame(buf, cap, pos, limit) >= 0)
            return pos;
    }
    return limit;
}

int64_t k7_scan_end(const uint8_t *buf, int64_t cap, int64_t *out_count, int32_t *out_status) {
    int64_t pos = 0, count = 0;
    int32_t status = K7_SCAN_OK;
    while (pos < cap) {
        int64_t len = check_frame(buf, cap, pos, cap);
        if (len < 0) { status = (int32_t)-len; break; }
        count++;
        int64_t next = pos + k7_frame_size(len);
        pos = next < cap ? next : cap;
    }
    *out_count = count;
    *out_status = status;
    return pos;
}

int64_t k7_walk(const uint8_t *buf, int64_t cap, int64_t pos, int64_t target) {
    while (pos < target) {
        if (pos < 0 || pos > cap - K7_HEADER) return -1;
        const uint8_t *f = buf + pos;
        if (f[0] != K7_MAGIC || f[1] != K7_FLAG_COMMITTED) return -1;
        int64_t len = (int64_t)be32(f + 2);
        if (len > cap - pos - K7_HEADER) return -1;
        pos += k7_frame_size(len);
    }
    return pos;
}

int64_t k7_last_nonzero(const uint8_t *buf, int64_t from, int64_t cap) {
    if (from < 0) from = 0;
    int64_t i = cap;
    while (i > from && (i & 7)) { if (buf[i - 1]) return i; i--; }
    while (i - 8 >= from) {
        uint64_t w;
        memcpy(&w, buf + i - 8, 8);
        if (w) break;
        i -= 8;
    }
    while (i > from) { if (buf[i - 1]) return i; i--; }
    return from;
}

int64_t k7_gather(const uint8_t *buf, int64_t cap, const int64_t *pos, const int64_t *len,
                  int64_t n, uint8_t *dst, int64_t dst_cap, int32_t *dst_offsets) {
    int64_t total = 0;
    dst_offsets[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        if (pos[i] < 0 || len[i] < 0 || pos[i] > cap || len[i] > cap - pos[i]) return -1;
        if (len[i] > dst_cap - total || total + len[i] > 0x7FFFFFFF) return -1;
        memcpy(dst + total, buf + pos[i], (size_t)len[i]);
        total += len[i];
        dst_offsets[i + 1] = (int32_t)total;
    }
    return total;
}

void k7_add_const(int64_t *dst, const int64_t *src, int64_t n, int64_t k) {
    for (int64_t i = 0; i < n; i++) dst[i] = src[i] + k;
}

int64_t k7_read(k7_reader *r, int64_t max_n) {
    int64_t end = (int64_t)__atomic_load_n(&r->pub->end, __ATOMIC_ACQUIRE);
    if (end < r->floor_end) end = r->floor_end;
    r->end = end;
    if (max_n > r->capacity) max_n = r->capacity;
    int64_t pos = r->pos;
    if (pos >= end || max_n <= 0) { r->status = K7_SCAN_OK; return 0; }
    if (!r->seg || pos < r->base || pos - r->base >= r->cap) { r->status = K7_SCAN_NOSEG; return 0; }
    int64_t next;
    int32_t status;
    int64_t n = k7_scan(r->seg, r->cap, pos - r->base, end - r->base, max_n, r->starts, r->lens, &next, &status);
    r->pos = r->base + next;
    r->status = status;
    return n;
}

/* ------------------------------------------------------------------ waiting */

#ifdef __linux__
static void futex_wait(uint32_t *addr, uint32_t val, int64_t timeout_ns, int private_) {
    struct timespec ts, *tsp = NULL;
    if (timeout_ns >= 0) {
        ts.tv_sec = timeout_ns / 1000000000LL;
        ts.tv_nsec = timeout_ns % 1000000000LL;
        tsp = &ts;
    }
    syscall(SYS_futex, addr, private_ ? FUTEX_WAIT_PRIVATE : FUTEX_WAIT, val, tsp, NULL, 0);
}
static void futex_wake(uint32_t *addr, int n, int private_) {
    syscall(SYS_futex, addr, private_ ? FUTEX_WAKE_PRIVATE : FUTEX_WAKE, n, NULL, NULL, 0);
}
#endif

void k7_sleep_ns(int64_t ns) {
    if (ns <= 0) return;
    struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void k7_publish(k7_pos *p, uint64_t end) {
    __atomic_store_n(&p->end, end, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&p->seq, 1, __ATOMIC_SEQ_CST);
#ifdef __linux__
    if (__atomic_load_n(&p->waiters, __ATOMIC_SEQ_CST)) futex_wake(&p->seq, 0x7FFFFFFF, 0);
#endif
}

uint64_t k7_load_end(const k7_pos *p) { return LOAD_ACQ(&p->end); }

int k7_wait(k7_pos *p, uint64_t known_end, int64_t timeout_ns) {
    if (LOAD_ACQ(&p->end) != known_end) return 1;
#ifdef __linux__
    __atomic_fetch_add(&p->waiters, 1, __ATOMIC_SEQ_CST);
    uint32_t seq = __atomic_load_n(&p->seq, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&p->end, __ATOMIC_SEQ_CST) == known_end) futex_wait(&p->seq, seq, timeout_ns, 0);
    __atomic_fetch_sub(&p->waiters, 1, __ATOMIC_SEQ_CST);
#else
    int64_t deadline = now_ns() + timeout_ns, step = 20000;
    while (LOAD_ACQ(&p->end) == known_end) {
        int64_t left = deadline - now_ns();
        if (left <= 0) break;
        k7_sleep_ns(step < left ? step : left);
        if (step < 1000000) step *= 2;
    }
#endif
    return LOAD_ACQ(&p->end) != known_end;
}

uint32_t k7_bell_seq(k7_bell *b) { return __atomic_load_n(&b->seq, __ATOMIC_SEQ_CST); }

void k7_bell_ring(k7_bell *b) {
    __atomic_fetch_add(&b->seq, 1, __ATOMIC_SEQ_CST);
#ifdef __linux__
    if (__atomic_load_n(&b->sleeping, __ATOMIC_SEQ_CST)) futex_wake(&b->seq, 1, 1);
#endif
}

int k7_bell_wait(k7_bell *b, uint32_t seen, int64_t timeout_ns) {
#ifdef __linux__
    __atomic_store_n(&b->sleeping, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&b->seq, __ATOMIC_SEQ_CST) == seen) futex_wait(&b->seq, seen, timeout_ns, 1);
    __atomic_store_n(&b->sleeping, 0, __ATOMIC_SEQ_CST);
#else
    int64_t deadline = now_ns() + timeout_ns;
    while (__atomic_load_n(&b->seq, __ATOMIC_SEQ_CST) == seen && now_ns() < deadline) k7_sleep_ns(50000);
#endif
    return __atomic_load_n(&b->seq, __ATOMIC_SEQ_CST) != seen;
}


/* ------------------------------------------------------------------ shared writers
 *
 * Several processes append to one directory (docs/concurrency.md). `mu` serialises appends
 * and rolls: its holder reads the shared end (base, pos), writes its frames there and
 * stores the new end before it unlocks, so a call's frames are contiguous and offsets are
 * handed out in lock order. A holder that dies leaves `mu` to the next locker with
 * EOWNERDEAD: the mutex is made consistent at once and `recover` set, and every locker gets
 * K7_RECOVER until the tail past `pos` is cut (its frames were never returned to anyone).
 * `sync_mu` serialises msyncs: one msync of [synced, end) serves every process waiting
 * (group commit). Waiters do not queue on sync_mu (each would wake only after the msync
 * started after it, though the one before covered it): a waiter sleeps on `sync_seq` (the
 * msyncs done) until the msync that covers it ends: the running one if its `covering` end
 * reaches the waiter's frames, else the next, whose leader the running one wakes. Before
 * it msyncs, a leader gathers: it waits (briefly) for the callers the last msync woke to
 * append again, so that one msync serves every writer in a loop of "sync" appends.
 * Lock order: mu, then sync_mu. Invariant: synced >= base (a roll msyncs
 * the segment it seals), so a writer that still maps an older segment has nothing to sync
 * there.
 * A holder that is stopped (SIGSTOP, a debugger), not dead, keeps its lock: no wait on it
 * lasts longer than the waiter's w->lock_timeout_ns. A wait for mu then ends in
 * K7_LOCKTIMEOUT, naming the holder (the thread id the lock word holds). An msync that has run
 * that long is taken for stuck: the waiters msync [synced, end) themselves without sync_mu
 * (sync_mu only makes one msync serve many; synced only grows, by CAS). */

#define K7_SHARED_MAGIC 0x314A4853595037CBULL
#define K7_SHARED_VERSION 4
/* Looks at a taken append lock before a sync writer sleeps on it (it is held for a copy). */
#define K7_SHARED_SPINS 50
/* The longest an msync's leader gathers callers (and at most as long as the last msync). */
#define K7_GATHER_MAX_NS 100000LL

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

struct k7_shared {
    uint64_t magic;          /* written last by init (release) */
    uint64_t size;           /* sizeof(struct k7_shared): refuses another build's layout */
    uint32_t version;
    int32_t mode;            /* K7_MODE_* every writer of the directory uses */
    pthread_mutex_t mu;
    pthread_mutex_t sync_mu;
    int64_t base;            /* the segment written; under mu, read atomically by syncs */
    int64_t pos;             /* the write position in it; under mu */
    int64_t end;             /* atomic: base + pos */
    int64_t synced;          /* atomic, only grows: the end of msync'd frames */
    int32_t recover;         /* under mu: a holder died; its tail is not cut yet */
    int32_t nmembers;        /* under mu: slots in use (dead writers not yet swept too) */
    int64_t deaths;          /* atomic: holders found dead */
    int64_t nsyncs;          /* atomic: msyncs of the log by every writer */
    int64_t covering;        /* atomic: the end the running msync covers (0: not known yet) */
    uint32_t sync_seq;       /* atomic futex word: msyncs ended (waiters sleep on it) */
    uint32_t sync_waiters;   /* atomic: processes asleep on sync_seq */
    uint32_t arrivals;       /* atomic futex word: calls that came to wait for an msync */
    uint32_t gather;         /* atomic: the arrivals the next msync's leader waits for */
    uint32_t gathering;      /* atomic: a leader sleeps on arrivals */
    int64_t sync_ns;         /* atomic: how long the last msync took */
    uint32_t unlocks;        /* atomic futex word: bit 0 a waiter for mu may sleep, then a
                                count of unlocks (see mu_lock) */
    int32_t holder;          /* atomic: slot + 1 of mu's holder (0: none, or not known) */
    int32_t sync_holder;     /* atomic: the pid holding sync_mu (0: none, or not stored yet) */
    int32_t pad_;
    int64_t sync_since;      /* atomic: when sync_mu's holder took it (CLOCK_MONOTONIC ns) */
    k7_member members[K7_SHARED_WRITERS];  /* under mu: the writers (id 0: a free slot) */
};

_Static_assert(sizeof(struct k7_shared) <= K7_SHARED_FILE_SIZE, "the state fits its file");

static int robust_mutex(pthread_mutex_t *m) {
    pthread_mutexattr_t a;
    int rc = pthread_mutexattr_init(&a);
    if (rc) return rc;
    rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (!rc) rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    if (!rc) rc = pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
    return rc;
}

int k7_shared_init(uint8_t *map, int64_t len, int64_t base, int64_t pos, int32_t mode) {
    if (len < (int64_t)sizeof(struct k7_shared)) return EINVAL;
    struct k7_shared *s = (struct k7_shared *)map;
    __atomic_store_n(&s->magic, 0, __ATOMIC_RELEASE);
    memset(s, 0, sizeof *s);
    int rc = robust_mutex(&s->mu);
    if (!rc) rc = robust_mutex(&s->sync_mu);
    if (rc) return rc;
    s->size = sizeof *s;
    s->version = K7_SHARED_VERSION;
    s->mode = mode;
    s->base = base;
    s->pos = pos;
    s->end = s->synced = base + pos;
    __atomic_store_n(&s->magic, K7_SHARED_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

k7_shared *k7_shared_attach(uint8_t *map, int64_t len) {
    if (len < (int64_t)sizeof(struct k7_shared)) return NULL;
    struct k7_shared *s = (struct k7_shared *)map;
    if (LOAD_ACQ(&s->magic) != K7_SHARED_MAGIC || s->size != sizeof *s ||
        s->version != K7_SHARED_VERSION)
        return NULL;
    return s;
}

/* The thread holding m (its id; a process's first thread has the process's), read from the
 * lock word: a robust mutex keeps there what the futex ABI says (the owner's TID, and the
 * FUTEX_WAITERS and FUTEX_OWNER_DIED bits), set by the atomic operation that takes it, so
 * it is never out of date. 0 where that word's place is not known. */
static int32_t lock_owner(pthread_mutex_t *m) {
#if defined(__GLIBC__) && defined(__linux__)
    return (int32_t)(__atomic_load_n(&m->__data.__lock, __ATOMIC_RELAXED) & FUTEX_TID_MASK);
#else
    (void)m;
    return 0;
#endif
}

/* Wait for mu without ever sleeping inside pthread_mutex_lock. A robust mutex names its
 * owner by thread id, and a process killed while it sleeps in pthread_mutex_lock leaves the
 * kernel a pending lock that it checks against the dying thread's id: when the holder has
 * that same id in its own PID namespace (both pid 1: containers sharing a volume), the
 * kernel marks the live holder dead, and the next writer would recover its tail under it.
 * So a waiter sleeps on `unlocks` between trylocks (bit 0 asks the unlocker for a wake); a
 * holder's death wakes nobody there, hence the bounded sleep, after which the trylock gets
 * EOWNERDEAD. */
#define K7_LOCK_POLL_NS 10000000LL

static int mu_lock(k7_shared *s, int64_t timeout_ns) {
    int64_t deadline = now_ns() + (timeout_ns > 0 ? timeout_ns : 0);
    for (;;) {
        uint32_t v = __atomic_or_fetch(&s->unlocks, 1u, __ATOMIC_SEQ_CST);
        int rc = pthread_mutex_trylock(&s->mu);
        if (rc != EBUSY) {
            /* others may sleep still: this holder's unlock wakes the next */
            __atomic_or_fetch(&s->unlocks, 1u, __ATOMIC_SEQ_CST);
            return rc;
        }
        int64_t left = deadline - now_ns();
        if (left <= 0) return ETIMEDOUT;
#ifdef __linux__
        futex_wait(&s->unlocks, v, left < K7_LOCK_POLL_NS ? left : K7_LOCK_POLL_NS, 0);
#else
        (void)v;
        k7_sleep_ns(50000);
#endif
    }
}

static void mu_unlock(k7_shared *s) {
    pthread_mutex_unlock(&s->mu);
    uint32_t old = __atomic_fetch_add(&s->unlocks, 2u, __ATOMIC_SEQ_CST);
    if (old & 1u) {
        __atomic_and_fetch(&s->unlocks, ~1u, __ATOMIC_SEQ_CST);
#ifdef __linux__
        futex_wake(&s->unlocks, 1, 0);
#endif
    }
}

/* Lock mu (block: wait, at most w->lock_timeout_ns; else K7_BUSY when taken) unless held;
 * then check the state. */
static int shared_enter(k7_writer *w, int block) {
    k7_shared *s = w->sh;
    if (!w->held) {
        int rc = pthread_mutex_trylock(&s->mu);
        for (int i = 0; rc == EBUSY && block && i < K7_SHARED_SPINS; i++) {
            cpu_relax();
            rc = pthread_mutex_trylock(&s->mu);
        }
        if (rc == EBUSY && block) rc = mu_lock(s, w->lock_timeout_ns);
        if (rc == EBUSY && !block) return K7_BUSY;
        if (rc == ETIMEDOUT) {
            w->holder = lock_owner(&s->mu);
            return K7_LOCKTIMEOUT;
        }
        if (rc == EOWNERDEAD) {
            pthread_mutex_consistent(&s->mu);
            s->recover = 1;
            __atomic_fetch_add(&s->deaths, 1, __ATOMIC_RELAXED);
            rc = 0;
        }
        if (rc) {
            w->err = rc;
            return K7_EIO;
        }
        w->held = 1;
        __atomic_store_n(&s->holder, w->slot + 1, __ATOMIC_RELAXED);
    }
    if (s->recover) return K7_RECOVER;
    if (s->base != w->base) return K7_REMAP;
    w->pos = s->pos;
    return 0;
}

int k7_shared_lock(k7_writer *w) { return shared_enter(w, 1); }

void k7_shared_release(k7_writer *w) {
    if (w->sh && w->held) {
        w->held = 0;
        __atomic_store_n(&w->sh->holder, 0, __ATOMIC_RELAXED);
        mu_unlock(w->sh);
    }
}

/* Under mu: frames up to w->pos are complete; make them the shared end. */
static void shared_store_end(k7_writer *w) {
    k7_shared *s = w->sh;
    s->pos = w->pos;
    STORE_REL(&w->written, w->pos);
    STORE_REL(&s->end, w->base + w->pos);
    if (w->mode == K7_MODE_FLUSH) k7_publish(w->pub, (uint64_t)(w->base + w->pos));
}

/* Publish `end` unless a larger end is published already. */
static void publish_max(k7_pos *p, uint64_t end) {
    uint64_t cur = LOAD_ACQ(&p->end);
    while (cur < end) {
        if (__atomic_compare_exchange_n(&p->end, &cur, end, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_ACQUIRE)) {
            __atomic_fetch_add(&p->seq, 1, __ATOMIC_SEQ_CST);
#ifdef __linux__
            if (__atomic_load_n(&p->waiters, __ATOMIC_SEQ_CST)) futex_wake(&p->seq, 0x7FFFFFFF, 0);
#endif
            return;
        }
    }
}

static int writer_msync(k7_writer *w, int64_t start, int64_t end);

/* A leader's msync runs longer than this only on a slow disk (a waiter then looks again)
 * or when the leader died in it (the next trylock gets EOWNERDEAD and takes over). */
#define K7_SYNC_WAIT_NS 10000000LL

#ifdef __linux__
/* The futex bit of waiters for the msync that makes sync_seq `seq`: the end of one msync
 * wakes only those it covers (and one leader for the next). */
static uint32_t sync_bit(uint32_t seq) { return 1u << (seq & 31); }
#endif

/* Sleep until the msync that covers `want` ends (or a while passes); sync_seq was `seq`
 * and another process holds sync_mu. */
static void sync_wait(k7_shared *s, uint32_t seq, int64_t want) {
    __atomic_fetch_add(&s->sync_waiters, 1, __ATOMIC_SEQ_CST);
#ifdef __linux__
    int64_t covering = __atomic_load_n(&s->covering, __ATOMIC_SEQ_CST);
    /* not known yet: maybe covered (a wrong guess costs one more look, never a sleep) */
    uint32_t target = covering == 0 || covering >= want ? seq + 1 : seq + 2;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += K7_SYNC_WAIT_NS;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    if (__atomic_load_n(&s->synced, __ATOMIC_SEQ_CST) < want)
        syscall(SYS_futex, &s->sync_seq, FUTEX_WAIT_BITSET, seq, &ts, NULL, sync_bit(target));
#else
    (void)want;
    for (int i = 0; i < 200 && __atomic_load_n(&s->sync_seq, __ATOMIC_SEQ_CST) == seq; i++)
        k7_sleep_ns(50000);
#endif
    __atomic_fetch_sub(&s->sync_waiters, 1, __ATOMIC_SEQ_CST);
}

/* The leader of an msync (sync_mu held) waits for the callers the last msync woke to append
 * again (`gather` arrivals), so that this msync covers them too; at most as long as the last
 * msync took, and K7_GATHER_MAX_NS. Without it, callers woken by msync k append while k+1
 * runs, and the writers split into two halves that take turns (half of them per msync). */
static void sync_gather(k7_shared *s) {
#ifdef __linux__
    uint32_t target = __atomic_load_n(&s->gather, __ATOMIC_SEQ_CST);
    uint32_t now = __atomic_load_n(&s->arrivals, __ATOMIC_SEQ_CST);
    if ((int32_t)(target - now) <= 0) return;
    int64_t limit = __atomic_load_n(&s->sync_ns, __ATOMIC_RELAXED);
    if (limit > K7_GATHER_MAX_NS) limit = K7_GATHER_MAX_NS;
    __atomic_store_n(&s->gathering, 1, __ATOMIC_SEQ_CST);
    int64_t deadline = now_ns() + limit;
    for (;;) {
        now = __atomic_load_n(&s->arrivals, __ATOMIC_SEQ_CST);
        target = __atomic_load_n(&s->gather, __ATOMIC_SEQ_CST); /* the waker may lower it */
        int64_t left = deadline - now_ns();
        if ((int32_t)(target - now) <= 0 || left <= 0) break;
        struct timespec ts = {0, (long)left};
        syscall(SYS_futex, &s->arrivals, FUTEX_WAIT, now, &ts, NULL, 0);
    }
    __atomic_store_n(&s->gathering, 0, __ATOMIC_SEQ_CST);
#else
    (void)s;
#endif
}

/* A caller came to wait for an msync: wake a gathering leader if it was the last awaited. */
static void sync_arrive(k7_shared *s) {
    uint32_t a = __atomic_add_fetch(&s->arrivals, 1, __ATOMIC_SEQ_CST);
#ifdef __linux__
    if (__atomic_load_n(&s->gathering, __ATOMIC_SEQ_CST) &&
        (int32_t)(a - __atomic_load_n(&s->gather, __ATOMIC_SEQ_CST)) >= 0)
        syscall(SYS_futex, &s->arrivals, FUTEX_WAKE, 1, NULL, NULL, 0);
#else
    (void)a;
#endif
}

/* msync [synced, end) of the segment w maps, and make `synced` at least that end. `lead`:
 * under sync_mu (it says what it covers and how long it took, for the waiters); else
 * without it, beside an msync taken for stuck. *older: w maps a segment older than the one
 * written (nothing to do: the roll that sealed it msynced it). 0 or an errno. */
static int sync_range(k7_writer *w, int lead, int *older) {
    k7_shared *s = w->sh;
    int64_t done = LOAD_ACQ(&s->synced);
    int64_t end = LOAD_ACQ(&s->end); /* before base: an end of a newer segment */
    int64_t base = LOAD_ACQ(&s->base); /* comes with that segment's base */
    *older = base != w->base;
    if (*older || end <= done) return 0;
    if (lead) __atomic_store_n(&s->covering, end, __ATOMIC_SEQ_CST);
    int64_t from = done > base ? done - base : 0;
    int64_t ns = w->sync_ns;
    int rc = writer_msync(w, from, end - base);
    if (lead) __atomic_store_n(&s->sync_ns, w->sync_ns - ns, __ATOMIC_RELAXED);
    if (!rc) {
        __atomic_fetch_add(&s->nsyncs, 1, __ATOMIC_RELAXED);
        int64_t cur = LOAD_ACQ(&s->synced);
        while (cur < end && !__atomic_compare_exchange_n(&s->synced, &cur, end, 0,
                                                         __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)) {
        }
    }
    return rc;
}

/* Whether the msync running now (sync_mu taken; sync_seq was `seq`) has run for
 * w->lock_timeout_ns: since its holder says it took sync_mu, or since this writer first
 * found it running (the holder may have stopped before it said so). */
static int sync_stalled(k7_writer *w, uint32_t seq) {
    k7_shared *s = w->sh;
    int64_t now = now_ns();
    if (w->stall_ns == 0 || w->stall_seq != seq) {
        w->stall_seq = seq;
        w->stall_ns = now;
    }
    int64_t since = w->stall_ns;
    if (__atomic_load_n(&s->sync_holder, __ATOMIC_SEQ_CST)) {
        int64_t t = __atomic_load_n(&s->sync_since, __ATOMIC_SEQ_CST);
        if (t > 0 && t < since) since = t;
    }
    return now - since >= w->lock_timeout_ns;
}

/* shared_sync's answer when it may not wait (the flusher) and another msync runs. */
#define SYNC_LATER (-1)

/* sync_mu was taken (by w's process, now): say who holds it, and since when. */
static void sync_held(k7_writer *w) {
    __atomic_store_n(&w->sh->sync_since, now_ns(), __ATOMIC_SEQ_CST);
    __atomic_store_n(&w->sh->sync_holder, w->pid, __ATOMIC_SEQ_CST);
}

/* msync every frame up to `want` (a global offset) that is not yet, through w's map; then
 * publish what is synced (durable modes). 0 or an errno; SYNC_LATER when another process
 * msyncs and `block` is 0 (the flusher, which retries at its next pass). */
static int shared_sync(k7_writer *w, int64_t want, int block) {
    k7_shared *s = w->sh;
    int rc = 0;
    if (LOAD_ACQ(&s->synced) < want) sync_arrive(s);
    while (LOAD_ACQ(&s->synced) < want) {
        uint32_t seq = __atomic_load_n(&s->sync_seq, __ATOMIC_SEQ_CST);
        int older = 0;
        rc = pthread_mutex_trylock(&s->sync_mu);
        if (rc == EBUSY) {  /* another process msyncs: its msync may cover `want` */
            if (sync_stalled(w, seq)) {  /* ... but it is stuck: msync without it */
                rc = sync_range(w, 0, &older);
                if (rc) return rc;
                if (older) break;
                continue;
            }
            if (!block) return SYNC_LATER;
            sync_wait(s, seq, want);
            rc = 0;
            continue;
        }
        if (rc == EOWNERDEAD) {  /* died in an msync: nothing to repair, it is done again */
            pthread_mutex_consistent(&s->sync_mu);
            rc = 0;
        }
        if (rc) return rc;
        sync_held(w);
        seq = __atomic_load_n(&s->sync_seq, __ATOMIC_SEQ_CST);
        if (LOAD_ACQ(&s->synced) < want) {
            sync_gather(s);
            rc = sync_range(w, 1, &older);
        }
        __atomic_store_n(&s->sync_holder, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&s->covering, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&s->sync_seq, seq + 1, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&s->sync_mu);
#ifdef __linux__
        if (__atomic_load_n(&s->sync_waiters, __ATOMIC_SEQ_CST)) {
            /* the next msync waits a little for those woken (and this caller) to come
             * back: at most every waiter until the wake says how many it woke */
            uint32_t a0 = __atomic_load_n(&s->arrivals, __ATOMIC_SEQ_CST);
            __atomic_store_n(&s->gather,
                             a0 + 1 + __atomic_load_n(&s->sync_waiters, __ATOMIC_SEQ_CST),
                             __ATOMIC_SEQ_CST);
            long woken = syscall(SYS_futex, &s->sync_seq, FUTEX_WAKE_BITSET, 0x7FFFFFFF, NULL,
                                 NULL, sync_bit(seq + 1));
            __atomic_store_n(&s->gather, a0 + 1 + (uint32_t)(woken > 0 ? woken : 0),
                             __ATOMIC_SEQ_CST);
            if (__atomic_load_n(&s->gathering, __ATOMIC_SEQ_CST))
                syscall(SYS_futex, &s->arrivals, FUTEX_WAKE, 1, NULL, NULL, 0);
            if (LOAD_ACQ(&s->end) > LOAD_ACQ(&s->synced)) /* a leader for the next msync */
                syscall(SYS_futex, &s->sync_seq, FUTEX_WAKE_BITSET, 1, NULL, NULL,
                        sync_bit(seq + 2));
        } else { /* nobody to gather (a writer alone, or the others stopped) */
            __atomic_store_n(&s->gather, __atomic_load_n(&s->arrivals, __ATOMIC_SEQ_CST),
                             __ATOMIC_SEQ_CST);
        }
#endif
        if (rc) return rc;
        if (older) break;
    }
    if (w->mode != K7_MODE_FLUSH) publish_max(w->pub, (uint64_t)LOAD_ACQ(&s->synced));
    return 0;
}

int k7_shared_sync_hold(k7_writer *w) {
    int rc = pthread_mutex_lock(&w->sh->sync_mu);
    if (rc == EOWNERDEAD) rc = pthread_mutex_consistent(&w->sh->sync_mu);
    if (!rc) sync_held(w);
    return rc;
}

/* Under mu, after frames were written: store the end, unlock, then make them durable and
 * visible per mode. The global offset after them is `end`. */
static int64_t shared_finish(k7_writer *w) {
    int64_t end = w->base + w->pos;
    shared_store_end(w);
    k7_shared_release(w);
    if (w->mode == K7_MODE_ASYNC) {
        k7_bell_ring(w->bell);
    } else if (w->mode == K7_MODE_SYNC) {
        int rc = shared_sync(w, end, 1);
        if (rc) {
            w->err = rc;
            return K7_EIO;  /* written (others may follow it): not durable, not rolled back */
        }
    }
    return 0;
}

void k7_shared_state(const k7_shared *s, int64_t *out) {
    out[0] = LOAD_ACQ(&s->base);
    out[1] = s->pos;
    out[2] = LOAD_ACQ(&s->end);
    out[3] = LOAD_ACQ(&s->synced);
    out[4] = s->recover;
    out[5] = __atomic_load_n(&s->deaths, __ATOMIC_RELAXED);
    out[6] = __atomic_load_n(&s->nsyncs, __ATOMIC_RELAXED);
    out[7] = s->mode;
    out[8] = s->nmembers;
}

void k7_shared_follow(k7_writer *w) {
    w->pos = w->sh->pos;
    STORE_REL(&w->written, w->pos);
    w->synced = 0;
}

void k7_shared_rolled(k7_writer *w) {
    k7_shared *s = w->sh;
    w->pos = w->synced = 0;
    STORE_REL(&w->written, 0);
    s->pos = 0;
    STORE_REL(&s->base, w->base);
    STORE_REL(&s->end, w->base);
}

void k7_shared_recovered(k7_writer *w, int64_t pos) {
    k7_shared *s = w->sh;
    s->recover = 0;
    s->pos = pos;
    STORE_REL(&s->end, w->base + pos);
    w->pos = pos;
    STORE_REL(&w->written, w->pos);
    if (w->mode == K7_MODE_FLUSH) k7_publish(w->pub, (uint64_t)(w->base + w->pos));
    else publish_max(w->pub, (uint64_t)LOAD_ACQ(&s->synced));
}

uint64_t k7_shared_set_member(k7_writer *w, int32_t i, const k7_member *m) {
    k7_shared *s = w->sh;
    if (i < 0 || i >= K7_SHARED_WRITERS) return 0;
    uint64_t old = s->members[i].id;
    s->nmembers += (m->id != 0) - (old != 0);
    __atomic_store_n(&s->members[i].pidns, m->pidns, __ATOMIC_RELAXED);
    __atomic_store_n(&s->members[i].pid, m->pid, __ATOMIC_RELAXED);
    __atomic_store_n(&s->members[i].id, m->id, __ATOMIC_RELEASE);
    return old;
}

void k7_shared_members(const k7_shared *s, k7_member *out) {
    for (int i = 0; i < K7_SHARED_WRITERS; i++) {
        out[i].id = LOAD_ACQ(&s->members[i].id);
        out[i].pidns = __atomic_load_n(&s->members[i].pidns, __ATOMIC_RELAXED);
        out[i].pid = __atomic_load_n(&s->members[i].pid, __ATOMIC_RELAXED);
        out[i].pad_ = 0;
    }
}

int32_t k7_shared_holder(const k7_shared *s) {
    return __atomic_load_n(&s->holder, __ATOMIC_RELAXED) - 1;
}

#ifdef F_OFD_SETLK
#define K7_SETLK F_OFD_SETLK
#define K7_GETLK F_OFD_GETLK
#else  /* process-owned locks: closing any descriptor of the file drops them */
#define K7_SETLK F_SETLK
#define K7_GETLK F_GETLK
#endif

static struct flock range_of(int64_t at, short type) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)at;
    fl.l_len = 1;
    return fl;
}

static int range_set(int fd, int64_t at, short type) {
    struct flock fl = range_of(at, type);
    if (fcntl(fd, K7_SETLK, &fl) == 0) return 0;
    return errno == EACCES ? EAGAIN : errno;
}

int k7_range_lock(int fd, int64_t at, int exclusive) {
    return range_set(fd, at, exclusive ? F_WRLCK : F_RDLCK);
}

int k7_range_unlock(int fd, int64_t at) { return range_set(fd, at, F_UNLCK); }

int k7_range_held(int fd, int64_t at) {
    struct flock fl = range_of(at, F_WRLCK);
    if (fcntl(fd, K7_GETLK, &fl) != 0) return -errno;
    return fl.l_type != F_UNLCK;
}

/* ------------------------------------------------------------------ msync */

int32_t k7_fault_msync;

int k7_msync(uint8_t *addr, int64_t start, int64_t end) {
    if (end <= start) return 0;
    if (__atomic_load_n(&k7_fault_msync, __ATOMIC_RELAXED)) return k7_fault_msync;
    int64_t page = (int64_t)sysconf(_SC_PAGESIZE);
    int64_t s = start & ~(page - 1);
    if (msync(addr + s, (size_t)(end - s), MS_SYNC) != 0) return errno ? errno : EIO;
    return 0;
}

int k7_prefault(uint8_t *addr, int64_t len) {
#ifdef MADV_POPULATE_WRITE
    /* Faults every page in writable without changing its bytes (Linux >= 5.14). */
    return madvise(addr, (size_t)len, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
#else
    (void)addr;
    (void)len;
    return ENOSYS;
#endif
}

uint8_t *k7_map(int fd, int64_t len, int writable) {
    if (len <= 0) { errno = EINVAL; return NULL; }
    void *p = mmap(NULL, (size_t)len, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED,
                   fd, 0);
    return p == MAP_FAILED ? NULL : (uint8_t *)p;
}

int k7_unmap(uint8_t *addr, int64_t len) {
    return munmap(addr, (size_t)len) == 0 ? 0 : errno;
}

int k7_willneed(uint8_t *addr, int64_t len) {
    return madvise(addr, (size_t)len, MADV_WILLNEED) == 0 ? 0 : errno;
}

/* ------------------------------------------------------------------ writer */

/* msync of the log, timed for Queue.stats() (two vDSO clock reads around a syscall that
 * takes microseconds at least). */
static int writer_msync(k7_writer *w, int64_t start, int64_t end) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = k7_msync(w->seg, start, end);
    clock_gettime(CLOCK_MONOTONIC, &b);
    int64_t ns = (int64_t)(b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
    if (ns < 0) ns = 0;
    w->nsyncs++;
    w->sync_ns += ns;
    if (ns > w->sync_max_ns) w->sync_max_ns = ns;
    int k = ns > 0 ? 64 - __builtin_clzll((uint64_t)ns) : 0;
    if (k > 39) k = 39;
    w->sync_hist[k]++;
    return rc;
}

static inline int64_t finish(k7_writer *w, int64_t start) {
    int64_t pos = w->pos;
    STORE_REL(&w->written, pos);
    switch (w->mode) {
    case K7_MODE_FLUSH:
        k7_publish(w->pub, (uint64_t)(w->base + pos));
        break;
    case K7_MODE_ASYNC:
        k7_bell_ring(w->bell);
        break;
    default: {
        int rc = writer_msync(w, start, pos);
        if (rc) {
            w->err = rc;
            memset(w->seg + start, 0, (size_t)(pos - start));
            w->pos = start;
            STORE_REL(&w->written, start);
            return K7_EIO;
        }
        w->synced = pos;
        k7_publish(w->pub, (uint64_t)(w->base + pos));
    }
    }
    return 0;
}

/* Shared writers: enter (rc != 0: returned as is) before any frame is written. */
#define SHARED_ENTER(w)                                                   \
    if ((w)->sh) {                                                        \
        int e_ = shared_enter((w), (w)->mode == K7_MODE_SYNC);            \
        if (e_) return e_;                                                \
    }

/* Frames up to w->pos were written from start: the end of the call (shared: unlocks). */
static inline int64_t done(k7_writer *w, int64_t start) {
    return w->sh ? shared_finish(w) : finish(w, start);
}

int64_t k7_append(k7_writer *w, const uint8_t *data, int64_t len) {
    if (w->err) return K7_EIO;
    SHARED_ENTER(w);
    int64_t start = w->pos;
    int64_t next = put_frame(w->seg, w->cap, start, data, len);
    if (next < 0) return K7_NOFIT;
    w->pos = next;
    int64_t rc = done(w, start);
    return rc ? rc : w->base + start;
}

/* A batch of i frames written from start, n asked: a short batch of a shared writer keeps
 * the lock (the caller rolls, then writes the rest: the call's frames stay contiguous). */
static inline int64_t batch_done(k7_writer *w, int64_t start, int64_t i, int64_t n) {
    if (w->sh && i < n) {
        if (i) shared_store_end(w);
        return i;
    }
    if (i == 0) return 0;
    int64_t rc = done(w, start);
    return rc ? rc : i;
}

int64_t k7_append_many(k7_writer *w, uint8_t **datas, const int64_t *lens, int64_t n, int64_t *out_offsets) {
    if (w->err) return K7_EIO;
    SHARED_ENTER(w);
    int64_t start = w->pos, pos = start, i = 0;
    for (; i < n; i++) {
        int64_t next = put_frame(w->seg, w->cap, pos, datas[i], lens[i]);
        if (next < 0) break;
        out_offsets[i] = w->base + pos;
        pos = next;
    }
    w->pos = pos;
    return batch_done(w, start, i, n);
}

/* Columnar batches: message i is buf[offsets[i] .. offsets[i+1]) (an Arrow binary column,
 * int32 or int64 offsets). All offsets are validated before anything is written. */
#define K7_APPEND_COLUMNAR(NAME, OFF_T)                                                       \
    int64_t NAME(k7_writer *w, const uint8_t *buf, int64_t buf_len, const OFF_T *offsets,     \
                 int64_t n, int64_t *out_offsets) {                                          \
        if (w->err) return K7_EIO;                                                            \
        int64_t start, pos, i;                                                                \
        for (i = 0; i < n; i++) {                                                             \
            int64_t a = offsets[i], b = offsets[i + 1];                                       \
            if (a < 0 || b < a || b > buf_len) return K7_BADOFFSETS;                          \
            if (w->max_frame > 0 && (b - a > K7_MAX_LEN || k7_frame_size(b - a) > w->max_frame)) \
                return K7_TOOLARGE;                                                           \
        }                                                                                     \
        SHARED_ENTER(w);                                                                      \
        start = pos = w->pos;                                                                 \
        for (i = 0; i < n; i++) {                                                             \
            int64_t a = offsets[i], b = offsets[i + 1];                                       \
            int64_t next = put_frame(w->seg, w->cap, pos, buf + a, b - a);                    \
            if (next < 0) break;                                                              \
            out_offsets[i] = w->base + pos;                                                   \
            pos = next;                                                                       \
        }                                                                                     \
        w->pos = pos;                                                                         \
        return batch_done(w, start, i, n);                                                    \
    }

K7_APPEND_COLUMNAR(k7_append_columnar, int64_t)
K7_APPEND_COLUMNAR(k7_append_columnar32, int32_t)

/* k7_writer_sync; `block` 0: SYNC_LATER instead of waiting for another process's msync. */
static int writer_sync(k7_writer *w, int block) {
    if (w->sh) {  /* every writer's frames, not only this one's */
        int rc = shared_sync(w, LOAD_ACQ(&w->sh->end), block);
        if (rc > 0) w->err = rc;
        return rc;
    }
    int64_t end = LOAD_ACQ(&w->written);
    if (end > w->synced) {
        int rc = writer_msync(w, w->synced, end);
        if (rc) { w->err = rc; return rc; }
        w->synced = end;
    }
    if (w->mode != K7_MODE_FLUSH && k7_load_end(w->pub) != (uint64_t)(w->base + end))
        k7_publish(w->pub, (uint64_t)(w->base + end));
    return 0;
}

int k7_writer_sync(k7_writer *w) { return writer_sync(w, 1); }

void k7_writer_rollback(k7_writer *w, int64_t pos) {
    if (pos < 0 || pos > w->pos) return;
    int64_t old = w->pos;
    memset(w->seg + pos, 0, (size_t)(old - pos));
    w->pos = pos;
    STORE_REL(&w->written, pos);
    if (w->synced > pos) {  /* the zeros replace synced frames: make them durable too */
        int rc = writer_msync(w, pos, old);
        if (rc) w->err = rc;
        w->synced = pos;
    }
}

/* ------------------------------------------------------------------ cursor */

_Static_assert(K7_CURSOR_SIZE == sizeof(uint64_t), "the cursor is one aligned 8-byte store");

int k7_cursor_store(k7_cursor *c, int64_t value) {
    __atomic_store_n((uint64_t *)c->map, __builtin_bswap64((uint64_t)value), __ATOMIC_RELEASE);
    if (c->mode == K7_MODE_SYNC) {
        int rc = k7_msync(c->map, 0, K7_CURSOR_SIZE);
        if (rc) c->err = rc;
        return rc;
    }
    if (c->mode == K7_MODE_ASYNC && !__atomic_exchange_n(&c->dirty, 1, __ATOMIC_SEQ_CST)) k7_bell_ring(c->bell);
    return 0;
}

int64_t k7_cursor_load(const k7_cursor *c) {
    return (int64_t)__builtin_bswap64(__atomic_load_n((const uint64_t *)c->map, __ATOMIC_ACQUIRE));
}

int k7_cursor_sync(k7_cursor *c) {
    if (!__atomic_exchange_n(&c->dirty, 0, __ATOMIC_SEQ_CST)) return 0;
    int rc = k7_msync(c->map, 0, K7_CURSOR_SIZE);
    if (rc) { c->err = rc; __atomic_store_n(&c->dirty, 1, __ATOMIC_SEQ_CST); }
    return rc;
}

/* ------------------------------------------------------------------ flusher */

struct k7_slot {
    pthread_mutex_t mu;
    k7_writer *writer;
    k7_cursor **cursors;
    int64_t ncursors, capcursors;
    int32_t err;
};

k7_slot *k7_slot_new(void) {
    k7_slot *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    /* Recursive: a dropped group collected by the GC releases its cursor (takes this lock)
     * on whatever thread runs the collection, possibly one that already holds it. */
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&s->mu, &attr);
    pthread_mutexattr_destroy(&attr);
    return s;
}

void k7_slot_free(k7_slot *s) {
    if (!s) return;
    pthread_mutex_destroy(&s->mu);
    free(s->cursors);
    free(s);
}

void k7_slot_lock(k7_slot *s) { pthread_mutex_lock(&s->mu); }
void k7_slot_unlock(k7_slot *s) { pthread_mutex_unlock(&s->mu); }
void k7_slot_set_writer(k7_slot *s, k7_writer *w) { s->writer = w; }
int k7_slot_error(k7_slot *s) { return __atomic_load_n(&s->err, __ATOMIC_ACQUIRE); }

int k7_slot_add_cursor(k7_slot *s, k7_cursor *c) {
    if (s->ncursors == s->capcursors) {
        int64_t cap = s->capcursors ? 2 * s->capcursors : 8;
        k7_cursor **p = realloc(s->cursors, (size_t)cap * sizeof *p);
        if (!p) return ENOMEM;
        s->cursors = p;
        s->capcursors = cap;
    }
    s->cursors[s->ncursors++] = c;
    return 0;
}

void k7_slot_remove_cursor(k7_slot *s, k7_cursor *c) {
    for (int64_t i = 0; i < s->ncursors; i++) {
        if (s->cursors[i] == c) {
            s->cursors[i] = s->cursors[--s->ncursors];
            return;
        }
    }
}

/* One pass over the slot (under its lock); `block` 0: SYNC_LATER when the log's msync must
 * wait for another process's (the cursors are synced anyway). 0, SYNC_LATER or an errno. */
static int slot_sync(k7_slot *s, int block) {
    int rc = 0, later = 0;
    if (s->writer) rc = writer_sync(s->writer, block);
    if (rc == SYNC_LATER) {
        later = 1;
        rc = 0;
    }
    for (int64_t i = 0; i < s->ncursors; i++) {
        int r = k7_cursor_sync(s->cursors[i]);
        if (r && !rc) rc = r;
    }
    if (rc) {
        int32_t none = 0;
        __atomic_compare_exchange_n(&s->err, &none, rc, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
    }
    return rc ? rc : later ? SYNC_LATER : 0;
}

int k7_slot_sync(k7_slot *s) { return slot_sync(s, 1); }

struct k7_flusher {
    k7_bell bell;
    int32_t stop;
    int64_t interval_ns;
    k7_slot **slots;
    int64_t nslots, capslots;
    pthread_mutex_t mu;  /* the slot list; held for a whole pass, which never waits */
};

k7_flusher *k7_flusher_new(int64_t interval_ns) {
    k7_flusher *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->interval_ns = interval_ns;
    pthread_mutex_init(&f->mu, NULL);
    return f;
}

void k7_flusher_free(k7_flusher *f) {
    if (!f) return;
    pthread_mutex_destroy(&f->mu);
    free(f->slots);
    free(f);
}

k7_bell *k7_flusher_bell(k7_flusher *f) { return &f->bell; }

int k7_flusher_attach(k7_flusher *f, k7_slot *s) {
    int rc = 0;
    pthread_mutex_lock(&f->mu);
    if (f->nslots == f->capslots) {
        int64_t cap = f->capslots ? 2 * f->capslots : 8;
        k7_slot **p = realloc(f->slots, (size_t)cap * sizeof *p);
        if (!p) rc = ENOMEM; else { f->slots = p; f->capslots = cap; }
    }
    if (!rc) f->slots[f->nslots++] = s;
    pthread_mutex_unlock(&f->mu);
    return rc;
}

void k7_flusher_detach(k7_flusher *f, k7_slot *s) {
    pthread_mutex_lock(&f->mu);
    for (int64_t i = 0; i < f->nslots; i++) {
        if (f->slots[i] == s) {
            f->slots[i] = f->slots[--f->nslots];
            break;
        }
    }
    pthread_mutex_unlock(&f->mu);
}

void k7_flusher_stop(k7_flusher *f) {
    __atomic_store_n(&f->stop, 1, __ATOMIC_SEQ_CST);
#ifdef __linux__
    futex_wake((uint32_t *)&f->stop, 1, 1);
#endif
    k7_bell_ring(&f->bell);
}

/* Sleep for the commit interval, cut short by k7_flusher_stop. */
static void interval_sleep(k7_flusher *f) {
    if (f->interval_ns <= 0) return;
#ifdef __linux__
    futex_wait((uint32_t *)&f->stop, 0, f->interval_ns, 1);
#else
    k7_sleep_ns(f->interval_ns);
#endif
}

/* A pass holds the slot list's lock, which every queue of the process takes to attach or
 * detach: it never waits, neither for a slot's lock (its queue is rolling or syncing, which
 * msyncs anyway) nor for another process's msync (shared writers): such a slot is left for
 * a pass soon after (K7_RETRY_NS), the others' msync covering it meanwhile. */
#define K7_RETRY_NS 1000000LL

void k7_flusher_run(k7_flusher *f) {
    for (;;) {
        uint32_t seen = k7_bell_seq(&f->bell);
        int again = 0;
        pthread_mutex_lock(&f->mu);
        for (int64_t i = 0; i < f->nslots; i++) {
            k7_slot *s = f->slots[i];
            if (pthread_mutex_trylock(&s->mu)) {
                again = 1;
                continue;
            }
            if (slot_sync(s, 0) == SYNC_LATER) again = 1;
            pthread_mutex_unlock(&s->mu);
        }
        pthread_mutex_unlock(&f->mu);
        if (__atomic_load_n(&f->stop, __ATOMIC_SEQ_CST)) return;
        interval_sleep(f);   /* at most one pass per interval */
        k7_bell_wait(&f->bell, seen, again ? K7_RETRY_NS : 200000000LL);
    }
}

/* ------------------------------------------------------------------ in-flight */

struct k7_inflight {
    int64_t *offs;       /* [head, tail): delivered, ascending */
    uint8_t *acked;
    int64_t head, tail, cap, count;
    k7_reader *reader;
    k7_cursor *cursor;
    int64_t committed;
};

k7_inflight *k7_inflight_new(k7_reader *r, k7_cursor *c, int64_t committed) {
    k7_inflight *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->reader = r;
    f->cursor = c;
    f->committed = committed;
    return f;
}

void k7_inflight_free(k7_inflight *f) {
    if (!f) return;
    free(f->offs);
    free(f->acked);
    free(f);
}

static int reserve(k7_inflight *f, int64_t n) {
    if (f->head > 0 && (f->tail + n > f->cap || f->head > f->cap / 2)) {
        int64_t live = f->tail - f->head;
        memmove(f->offs, f->offs + f->head, (size_t)live * sizeof *f->offs);
        memmove(f->acked, f->acked + f->head, (size_t)live);
        f->head = 0;
        f->tail = live;
    }
    if (f->tail + n <= f->cap) return 0;
    int64_t cap = f->cap ? f->cap : 256;
    while (cap < f->tail + n) cap *= 2;
    int64_t *o = realloc(f->offs, (size_t)cap * sizeof *o);
    if (!o) return ENOMEM;
    f->offs = o;
    uint8_t *a = realloc(f->acked, (size_t)cap);
    if (!a) return ENOMEM;
    f->acked = a;
    f->cap = cap;
    return 0;
}

int k7_track(k7_inflight *f, int64_t n) {
    if (n <= 0) return 0;
    if (reserve(f, n)) return ENOMEM;
    const k7_reader *r = f->reader;
    int64_t base = r->base - K7_HEADER;
    for (int64_t i = 0; i < n; i++) {
        f->offs[f->tail + i] = base + r->starts[i];
        f->acked[f->tail + i] = 0;
    }
    f->tail += n;
    f->count += n;
    return 0;
}

static int64_t find(const k7_inflight *f, int64_t off) {
    int64_t lo = f->head, hi = f->tail;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (f->offs[mid] < off) lo = mid + 1; else hi = mid;
    }
    return (lo < f->tail && f->offs[lo] == off && !f->acked[lo]) ? lo : -1;
}

static int store(k7_inflight *f, int64_t value) {
    if (value == f->committed) return 0;
    int rc = k7_cursor_store(f->cursor, value);
    if (rc) return -rc;
    f->committed = value;
    return 0;
}

int k7_ack(k7_inflight *f, int64_t off) {
    int64_t i = find(f, off);
    if (i < 0) return 0;
    f->acked[i] = 1;
    f->count--;
    if (i != f->head) return 1;
    while (f->head < f->tail && f->acked[f->head]) f->head++;
    int rc = store(f, f->head < f->tail ? f->offs[f->head] : f->reader->pos);
    return rc ? rc : 1;
}

int64_t k7_ack_many(k7_inflight *f, const int64_t *offs, int64_t n) {
    int64_t acked = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t i = find(f, offs[k]);
        if (i < 0) continue;
        f->acked[i] = 1;
        f->count--;
        acked++;
    }
    if (!acked) return 0;
    while (f->head < f->tail && f->acked[f->head]) f->head++;
    int rc = store(f, f->head < f->tail ? f->offs[f->head] : f->reader->pos);
    return rc ? rc : acked;
}

int k7_inflight_has(k7_inflight *f, int64_t off) { return find(f, off) >= 0; }
int64_t k7_inflight_count(k7_inflight *f) { return f->count; }
int64_t k7_committed(k7_inflight *f) { return f->committed; }

int k7_reset(k7_inflight *f, int64_t pos) {
    f->head = f->tail = f->count = 0;
    f->reader->pos = pos;
    int rc = store(f, pos);
    return rc ? -rc : 0;
}

/* ------------------------------------------------------------------ CPython fast paths */

static const k7_api api = {
    .api_size = sizeof(k7_api),
    .writer_size = sizeof(k7_writer),
    .reader_size = sizeof(k7_reader),
    .append = k7_append,
    .append_many = k7_append_many,
    .frame_size = k7_frame_size,
    .read = k7_read,
    .track = k7_track,
    .ack = k7_ack,
    .ack_many = k7_ack_many,
    .shared_lock = k7_shared_lock,
    .shared_release = k7_shared_release,
};

const k7_api *k7_api_table(void) { return &api; }
