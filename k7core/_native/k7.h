/* k7 kernel: frame codec, CRC32C, scan, position publication, msync.
 *
 * Frame layout (k7-compatible, big-endian fields):
 *
 *   0      1      2              6              10            10+len      align8
 *   +------+------+--------------+--------------+-------------+-----------+
 *   | 0x4B | 0x01 | length (u32) | CRC32C (u32) | payload ... | zero pad  |
 *   +------+------+--------------+--------------+-------------+-----------+
 *
 * Every function is bounds-checked against the capacity it is given: no
 * input (however corrupt) makes it read or write outside [base, base+cap).
 */
#include <stdint.h>
#include <stddef.h>

/* On-disk format (docs/format.md). k7core/_format.py takes these values from the compiled
 * module, so this header is their one source. */
#define K7_HEADER 10              /* frame header bytes: magic, flags, length, CRC32C */
#define K7_MAGIC 0x4B             /* 'K' */
#define K7_FLAG_COMMITTED 0x01
#define K7_ALIGN 8                /* frames are zero-padded to a multiple of this */
#define K7_MAX_LEN 2147483647LL   /* the largest payload: the length field is a BE int32 */
#define K7_MAX_OFFSET INT64_MAX   /* offsets are int64 (cursor files, the kernel) */
/* k7 on the JVM maps a segment as one MappedByteBuffer (at most 2^31-1 bytes): the largest
 * segment file that both read, a multiple of K7_ALIGN. */
#define K7_MAX_SEGMENT 2147483640LL
#define K7_CURSOR_FILE_SIZE 4096  /* cursor-<group>.k7 */
#define K7_CURSOR_SIZE 8          /* its committed offset: a BE int64 at byte 0 */
#define K7_POS_FILE_SIZE 4096     /* k7py-position: a k7_pos at byte 0 */

/* durability modes (k7_writer.mode, k7_cursor.mode; k7core.Fsync) */
#define K7_MODE_FLUSH 0
#define K7_MODE_ASYNC 1
#define K7_MODE_SYNC 2

/* scan status */
#define K7_SCAN_OK 0       /* stopped at max_n or at the limit */
#define K7_SCAN_EMPTY 1    /* zero header (or no room for one): end of written data */
#define K7_SCAN_CORRUPT 2  /* bytes at *next that are not a valid frame */
#define K7_SCAN_NOSEG 3    /* k7_read: position outside the mapped segment */

/* append return codes (negative) */
#define K7_NOFIT (-1)      /* frame does not fit in the rest of the segment */
#define K7_EIO (-2)        /* msync failed (now or earlier, sticky); errno in w->err */
#define K7_BADOFFSETS (-3) /* columnar offsets not monotonic or outside the buffer */
#define K7_TOOLARGE (-4)   /* a frame larger than w->max_frame: nothing written */
/* Shared writers only; the shared lock is held on return of RECOVER and REMAP (and of NOFIT
 * or a short batch), so that the caller's fix and the retry happen under it. */
#define K7_BUSY (-5)       /* the shared lock is taken: k7_shared_lock (blocking), then retry */
#define K7_RECOVER (-6)    /* a writer died holding the lock: cut its tail, k7_shared_recovered */
#define K7_REMAP (-7)      /* another writer rolled: map the segment at k7_shared_state's base */
/* The shared lock stayed taken for w->lock_timeout_ns (its holder is stopped or stuck, not
 * dead: a dead one's lock passes on): not held; w->holder is the holder's thread id (a
 * process's first thread has the process's id; 0: unknown). */
#define K7_LOCKTIMEOUT (-8)

/* Shared writers (Queue(writers="shared")): the state every writing process of a directory
 * maps from the file k7py-writers (K7_SHARED_FILE_SIZE bytes). Opaque here (it holds two
 * process-shared robust pthread mutexes: appends and rolls; msyncs); k7.c owns its layout. */
#define K7_SHARED_FILE_SIZE 4096
#define K7_SHARED_WRITERS 64      /* at most this many shared writers (Queue objects) at once */
typedef struct k7_shared k7_shared;
/* A shared writer in the state's table (docs/format.md): a random id (0: a free slot), and
 * for reports only, its pid as it sees itself and its PID namespace (the inode of
 * /proc/self/ns/pid, 0 when unknown). Identity is the id; liveness is the writer's lock on
 * its slot (k7_range_lock), which the kernel drops when the writer dies, in any namespace. */
typedef struct {
    uint64_t id;
    uint64_t pidns;
    int32_t pid;
    int32_t pad_;
} k7_member;

/* Published position (an mmap'd file shared by all processes). */
typedef struct {
    uint64_t end;        /* committed end, global offset; release store / acquire load */
    uint32_t seq;        /* futex word, bumped on every publish */
    uint32_t waiters;    /* readers blocked in k7_wait */
} k7_pos;

/* Wake-up word for the background flusher thread (process-private). */
typedef struct {
    uint32_t seq;
    uint32_t sleeping;
} k7_bell;

/* Writer state: one per writing Queue (process-private). */
typedef struct {
    uint8_t *seg;        /* mapped segment */
    int64_t cap;         /* segment size */
    int64_t base;        /* base global offset */
    int64_t pos;         /* write position (writer thread only) */
    int64_t written;     /* atomic: end of complete frames, local */
    int64_t synced;      /* flusher: end of msync'd frames, local */
    k7_pos *pub;         /* where to publish */
    k7_bell *bell;       /* flusher wake-up (K7_MODE_ASYNC) */
    int32_t mode;        /* K7_MODE_* */
    int32_t err;         /* errno of the last failed msync */
    int64_t nsyncs;      /* msync calls made */
    int64_t max_frame;   /* batches: frames larger than this are refused up front (0: no check) */
    int64_t sync_ns;     /* total time in the log's msyncs (ns) */
    int64_t sync_max_ns; /* longest msync of the log (ns) */
    int64_t sync_hist[40]; /* msyncs by duration: bucket k counts those of [2^(k-1), 2^k) ns */
    k7_shared *sh;       /* shared writers: the directory's shared state; NULL: exclusive */
    int32_t held;        /* shared writers: this writer holds sh's lock */
    int32_t slot;        /* shared writers: this writer's slot in sh's table (-1: none) */
    int32_t pid;         /* shared writers: this process, recorded as the msync lock's holder */
    int64_t lock_timeout_ns; /* shared writers: the longest wait for another process's lock */
    int32_t holder;      /* out (K7_LOCKTIMEOUT): the thread id that held the lock */
    uint32_t stall_seq;  /* the msync (sh's sync count) seen running since stall_ns */
    int64_t stall_ns;    /* when this writer first found that msync running (0: never) */
} k7_writer;

/* Cursor state: one per consumer group (process-private). */
typedef struct {
    uint8_t *map;        /* mapped cursor file (>= K7_CURSOR_SIZE bytes) */
    k7_bell *bell;
    int32_t mode;        /* K7_MODE_* */
    int32_t err;
    int32_t dirty;       /* atomic: stored but not yet msync'd */
    int32_t pad_;
} k7_cursor;

/* Reader state: one per consumer (process-private). k7_read scans the mapped
 * segment from pos below the visible end, max(pub->end, floor_end). */
typedef struct {
    const uint8_t *seg;  /* mapped segment, NULL when none */
    int64_t cap;
    int64_t base;
    int64_t pos;         /* global offset of the next frame */
    const k7_pos *pub;
    int64_t floor_end;
    int64_t end;         /* out: visible end seen by the last k7_read */
    int64_t *starts;     /* out: payload positions in the segment */
    int64_t *lens;       /* out: payload lengths */
    int64_t capacity;
    int32_t status;      /* out: K7_SCAN_* */
    int32_t pad_;
} k7_reader;

int64_t k7_read(k7_reader *r, int64_t max_n);

/* In-flight tracking of a consumer group: delivered offsets in delivery order (ascending),
 * acked flags, and the committed cursor. k7_track registers the frames of the last k7_read;
 * k7_ack marks one acked and stores the contiguous frontier (lowest unacked offset, else the
 * read position) in the cursor when it moved. */
typedef struct k7_inflight k7_inflight;
k7_inflight *k7_inflight_new(k7_reader *r, k7_cursor *c, int64_t committed);
void k7_inflight_free(k7_inflight *f);
int k7_track(k7_inflight *f, int64_t n);          /* 0 or ENOMEM */
int k7_ack(k7_inflight *f, int64_t off);           /* 1 acked, 0 not in flight, -errno */
int64_t k7_ack_many(k7_inflight *f, const int64_t *offs, int64_t n); /* count acked, or -errno; one store */
int k7_inflight_has(k7_inflight *f, int64_t off);
int64_t k7_inflight_count(k7_inflight *f);
int64_t k7_committed(k7_inflight *f);
int k7_reset(k7_inflight *f, int64_t pos);         /* seek: forget, store pos; 0 or errno */

uint32_t k7_crc32c(uint32_t crc, const uint8_t *buf, size_t len);
int k7_crc32c_hardware(void);

/* Key hashes for topic partitioning (pure: no state, no allocation). k7_murmur2 is Kafka's
 * Utils.murmur2 with the seed given (Kafka's is 0x9747b28c), as Java's signed int;
 * k7_murmur3_32 is MurmurHash3_x86_32 (Appleby's reference). Both read bytes little-endian
 * whatever the host. */
int32_t k7_murmur2(const uint8_t *data, size_t len, uint32_t seed);
uint32_t k7_murmur3_32(const uint8_t *data, size_t len, uint32_t seed);

int64_t k7_frame_size(int64_t len);

/* Single frames on a raw buffer (reference-comparable). */
int64_t k7_write_frame(uint8_t *buf, int64_t cap, int64_t pos, const uint8_t *data, int64_t len);
int64_t k7_scan(const uint8_t *buf, int64_t cap, int64_t pos, int64_t limit, int64_t max_n,
                int64_t *out_pos, int64_t *out_len, int64_t *out_next, int32_t *out_status);
int64_t k7_scan_end(const uint8_t *buf, int64_t cap, int64_t *out_count, int32_t *out_status);
int64_t k7_last_nonzero(const uint8_t *buf, int64_t from, int64_t cap);
/* Follow frame headers (magic, flags, length; no CRC) from pos: the first frame boundary at
 * or after target, or -1 when a header on the way is not a frame (checking a cursor). */
int64_t k7_walk(const uint8_t *buf, int64_t cap, int64_t pos, int64_t target);
/* The first 8-aligned position in [start, limit) where a valid frame (CRC-checked, ending by
 * limit) starts; limit when there is none (resuming after damage). */
int64_t k7_next_frame(const uint8_t *buf, int64_t cap, int64_t start, int64_t limit);
void k7_add_const(int64_t *dst, const int64_t *src, int64_t n, int64_t k); /* dst[i] = src[i] + k */
int64_t k7_gather(const uint8_t *buf, int64_t cap, const int64_t *pos, const int64_t *len,
                  int64_t n, uint8_t *dst, int64_t dst_cap, int32_t *dst_offsets);

/* Writer: append and publish according to w->mode. Return the global offset
 * (single) or the count written (batches, stopping at the first that does not fit). */
int64_t k7_append(k7_writer *w, const uint8_t *data, int64_t len);
int64_t k7_append_many(k7_writer *w, uint8_t **datas, const int64_t *lens, int64_t n, int64_t *out_offsets);
int64_t k7_append_columnar(k7_writer *w, const uint8_t *buf, int64_t buf_len, const int64_t *offsets, int64_t n, int64_t *out_offsets);
int64_t k7_append_columnar32(k7_writer *w, const uint8_t *buf, int64_t buf_len, const int32_t *offsets, int64_t n, int64_t *out_offsets);
int k7_writer_sync(k7_writer *w);   /* msync [synced, written), publish; 0 or errno */
void k7_writer_rollback(k7_writer *w, int64_t pos);

/* Shared writers. init: the first writer of a directory (no other live) makes the state,
 * the log's end at base + pos, written with fsync mode `mode`; attach: a later one checks it
 * (NULL: not a valid state). The functions below take the writer (w->sh set). */
int k7_shared_init(uint8_t *map, int64_t len, int64_t base, int64_t pos, int32_t mode);
k7_shared *k7_shared_attach(uint8_t *map, int64_t len);
/* Take the lock (waiting at most w->lock_timeout_ns) unless held; then 0 (w->pos is the
 * shared end), K7_RECOVER, K7_REMAP, K7_LOCKTIMEOUT (w->holder set) or K7_EIO (w->err set:
 * the lock is unusable). Held in every case but LOCKTIMEOUT and EIO.
 * Msyncs (k7_writer_sync, "sync" appends) wait for another process's msync only while it
 * has run for less than w->lock_timeout_ns: after that it is taken for stuck (its process
 * stopped) and they msync without it. */
int k7_shared_lock(k7_writer *w);
void k7_shared_release(k7_writer *w);             /* unlock if held */
/* Take the msync lock and keep it (what a writer killed mid-msync leaves: its tests).
 * 0 or an errno. */
int k7_shared_sync_hold(k7_writer *w);
/* base, pos, end, synced, recover, deaths, nsyncs, mode, slots in use (9 values) */
void k7_shared_state(const k7_shared *s, int64_t *out);
/* Under the lock: the writer now writes the segment at w->base from w->pos (a remap). */
void k7_shared_follow(k7_writer *w);
/* Under the lock, after the caller mapped the new segment into w (seg, cap, base; pos 0):
 * every writer goes on there. */
void k7_shared_rolled(k7_writer *w);
/* Under the lock: the dead holder's tail is cut at `pos` (its whole frames before it kept):
 * make `pos` the end, publish per mode and clear the flag. */
void k7_shared_recovered(k7_writer *w, int64_t pos);
/* Under the lock: slot `i` (< K7_SHARED_WRITERS) now holds `m` (id 0: free it); the id it
 * held before (a dead writer's, whose spare segment the caller removes), or 0. */
uint64_t k7_shared_set_member(k7_writer *w, int32_t i, const k7_member *m);
/* A moment's view of the table (K7_SHARED_WRITERS entries; no lock taken). */
void k7_shared_members(const k7_shared *s, k7_member *out);
/* The slot of the writer that holds the append lock now, -1 when none does (a moment's
 * view: for error messages, which name its pid). */
int32_t k7_shared_holder(const k7_shared *s);

/* Liveness without pids: a lock on byte `at` of the file open as `fd`, owned by that open
 * file (an OFD lock on Linux: dropped when it is closed or its process dies, in any PID
 * namespace, never by closing another descriptor of the file). Never blocks. lock
 * (exclusive, or shared) and unlock: 0, EAGAIN (another open file holds a conflicting lock)
 * or an errno. held: 1 another open file holds a lock there, 0 none does, or -errno. */
int k7_range_lock(int fd, int64_t at, int exclusive);
int k7_range_unlock(int fd, int64_t at);
int k7_range_held(int fd, int64_t at);

/* Position publication and waiting (futex on Linux, sleep elsewhere). */
void k7_publish(k7_pos *p, uint64_t end);
uint64_t k7_load_end(const k7_pos *p);
int k7_wait(k7_pos *p, uint64_t known_end, int64_t timeout_ns);

/* Flusher bell. */
uint32_t k7_bell_seq(k7_bell *b);
void k7_bell_ring(k7_bell *b);
int k7_bell_wait(k7_bell *b, uint32_t seen, int64_t timeout_ns);

/* Cursor: store big-endian int64 at byte 0 (K7_CURSOR_SIZE bytes), durability per mode. */
int k7_cursor_store(k7_cursor *c, int64_t value);
int64_t k7_cursor_load(const k7_cursor *c);
int k7_cursor_sync(k7_cursor *c);   /* msync if dirty; 0 or errno */

/* Background flusher (the "async" strategy): one thread, run without the GIL, serves many
 * queues. Each queue is a slot (its writer and its async cursors, with its own lock, which
 * also serialises the queue's rolls with the flusher); the flusher msyncs every attached
 * slot, publishes, and sleeps on its bell. */
typedef struct k7_slot k7_slot;
k7_slot *k7_slot_new(void);
void k7_slot_free(k7_slot *s);
void k7_slot_lock(k7_slot *s);
void k7_slot_unlock(k7_slot *s);
void k7_slot_set_writer(k7_slot *s, k7_writer *w);      /* under the slot lock */
int k7_slot_add_cursor(k7_slot *s, k7_cursor *c);       /* under the slot lock; 0 or ENOMEM */
void k7_slot_remove_cursor(k7_slot *s, k7_cursor *c);   /* under the slot lock */
int k7_slot_sync(k7_slot *s);       /* one pass, under the slot lock; 0 or errno */
int k7_slot_error(k7_slot *s);      /* the first errno a flusher pass met, 0 if none */

typedef struct k7_flusher k7_flusher;
k7_flusher *k7_flusher_new(int64_t interval_ns);
void k7_flusher_free(k7_flusher *f);
k7_bell *k7_flusher_bell(k7_flusher *f);
void k7_flusher_run(k7_flusher *f);         /* blocks until k7_flusher_stop */
void k7_flusher_stop(k7_flusher *f);
int k7_flusher_attach(k7_flusher *f, k7_slot *s);  /* 0 or ENOMEM */
void k7_flusher_detach(k7_flusher *f, k7_slot *s); /* on return, no pass touches s */

/* SIGBUS guard (k7_bus.c, in the cffi module only): a page of a registered map lost to a
 * truncated file (or unreadable) is replaced by a private zero page instead of ending the
 * process. install: once per process, chaining to the previous handler (0 or -1);
 * register: returns a slot for unregister, or -1 when the table is full. */
int k7_bus_install(void);
int k7_bus_register(const uint8_t *addr, int64_t len);
void k7_bus_unregister(int slot);
int64_t k7_bus_faults(void);          /* pages replaced so far */

int k7_msync(uint8_t *addr, int64_t start, int64_t end);
/* Fault injection (tests, through k7core._faults): when nonzero, every k7_msync fails with
 * this errno instead of syncing. */
extern int32_t k7_fault_msync;
int k7_prefault(uint8_t *addr, int64_t len);  /* page tables writable now; 0 or errno */
/* A shared map of a whole file that holds no file descriptor (Python's mmap dups one per
 * map): NULL with errno set on failure. unmap: 0 or errno. willneed: readahead hint. */
uint8_t *k7_map(int fd, int64_t len, int writable);
int k7_unmap(uint8_t *addr, int64_t len);
int k7_willneed(uint8_t *addr, int64_t len);
void k7_sleep_ns(int64_t ns);

/* The entry points of the CPython extension k7core._native._fast, which does not compile
 * this kernel: k7core._kernel hands it this table (k7_api_table's address) once at import,
 * and it refuses to work before. The sizes let it refuse a table from another build. */
typedef struct k7_api {
    int64_t api_size;     /* sizeof(k7_api) */
    int64_t writer_size;  /* sizeof(k7_writer) */
    int64_t reader_size;  /* sizeof(k7_reader) */
    int64_t (*append)(k7_writer *w, const uint8_t *data, int64_t len);
    int64_t (*append_many)(k7_writer *w, uint8_t **datas, const int64_t *lens, int64_t n,
                           int64_t *out_offsets);
    int64_t (*frame_size)(int64_t len);
    int64_t (*read)(k7_reader *r, int64_t max_n);
    int (*track)(k7_inflight *f, int64_t n);
    int (*ack)(k7_inflight *f, int64_t off);
    int64_t (*ack_many)(k7_inflight *f, const int64_t *offs, int64_t n);
    int (*shared_lock)(k7_writer *w);
    void (*shared_release)(k7_writer *w);
} k7_api;
const k7_api *k7_api_table(void);
