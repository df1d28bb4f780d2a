/* SIGBUS guard for the memory maps of a queue (see k7.h).
 *
 * A file truncated underneath a live MAP_SHARED mapping makes the next access to a page
 * past its new end raise SIGBUS (so does a media error while reading a page in). The
 * handler looks the faulting address up in the table of registered maps; when it is in
 * one, it puts a private zero page in place of the lost page and returns, so that the
 * access completes: a reader then sees zeros (no valid frame: a clear error in Python), a
 * write lands in memory only (the writer finds the file shrunk at its next check). Any
 * other SIGBUS goes to the handler that was installed before, or ends the process as
 * usual. Only async-signal-safe calls (mmap, sigaction) are made in the handler.
 */
#define _GNU_SOURCE
#include "k7.h"

#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define K7_BUS_SLOTS 1024

static uintptr_t bus_start[K7_BUS_SLOTS]; /* 0: free slot */
static uintptr_t bus_end[K7_BUS_SLOTS];
static int64_t bus_faults;
static uintptr_t bus_page;
static struct sigaction bus_prev;
static int bus_installed;

static void bus_handler(int sig, siginfo_t *si, void *uc) {
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < K7_BUS_SLOTS; i++) {
        uintptr_t s = __atomic_load_n(&bus_start[i], __ATOMIC_ACQUIRE);
        if (s == 0 || a < s || a >= __atomic_load_n(&bus_end[i], __ATOMIC_ACQUIRE)) continue;
        void *page = (void *)(a & ~(bus_page - 1));
        if (mmap(page, bus_page, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0) != MAP_FAILED) {
            __atomic_fetch_add(&bus_faults, 1, __ATOMIC_RELAXED);
            return; /* the faulting access is retried on the zero page */
        }
        break;
    }
    if (bus_prev.sa_flags & SA_SIGINFO) {
        bus_prev.sa_sigaction(sig, si, uc);
    } else if (bus_prev.sa_handler != SIG_DFL && bus_prev.sa_handler != SIG_IGN) {
        bus_prev.sa_handler(sig);
    } else { /* the default action: the retried access faults again and ends the process */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGBUS, &dfl, NULL);
    }
}

int k7_bus_install(void) {
    if (__atomic_exchange_n(&bus_installed, 1, __ATOMIC_ACQ_REL)) return 0;
    bus_page = (uintptr_t)sysconf(_SC_PAGESIZE);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = bus_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGBUS, &sa, &bus_prev) ? -1 : 0;
}

int k7_bus_register(const uint8_t *addr, int64_t len) {
    uintptr_t s = (uintptr_t)addr;
    if (s == 0 || len <= 0) return -1;
    for (int i = 0; i < K7_BUS_SLOTS; i++) {
        uintptr_t zero = 0; /* a free slot's end is 0 already (unregister clears it first) */
        if (__atomic_compare_exchange_n(&bus_start[i], &zero, s, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            __atomic_store_n(&bus_end[i], s + (uintptr_t)len, __ATOMIC_RELEASE);
            return i;
        }
    }
    return -1; /* table full: this map is not guarded */
}

void k7_bus_unregister(int slot) {
    if (slot < 0 || slot >= K7_BUS_SLOTS) return;
    __atomic_store_n(&bus_end[slot], 0, __ATOMIC_RELEASE);
    __atomic_store_n(&bus_start[slot], 0, __ATOMIC_RELEASE);
}

int64_t k7_bus_faults(void) { return __atomic_load_n(&bus_faults, __ATOMIC_RELAXED); }
