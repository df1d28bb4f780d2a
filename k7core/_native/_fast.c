/* k7core._native._fast: CPython entry points for the per-message hot paths.
 *
 * The kernel (k7.c) is reached through cffi everywhere else. A cffi call costs ~250 ns,
 * and building one Message per frame in Python costs ~600 ns more; at 32-byte payloads that
 * is most of the time of enqueue and poll (measured, see docs/benchmarks.md). These objects
 * call the kernel functions directly with METH_O / METH_FASTCALL and build the Python
 * objects in C. They hold raw pointers to C structs owned by the Python objects of
 * k7core (Queue, ConsumerGroup), which detach() them before those structs are freed.
 *
 * This module does not compile k7.c: the kernel is built once, into the cffi module _k7,
 * whose k7_api_table() k7core._kernel passes to bind() at import. Until then Appender and
 * Fetcher refuse to be created.
 *
 * It also holds the job store's records (JobRecord, JobMaker): the per-job objects of
 * k7core.jobs, which need no kernel.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "k7.h"

#define K7_CLOSED (-100) /* returned when the object was detached (queue or group closed) */
#define STACK_ITEMS 256

/* ------------------------------------------------------------------ the kernel */

static const k7_api *kernel; /* set once by bind() */

/* bind(address of the k7_api of the cffi module _k7): the kernel the fast paths call. */
static PyObject *bind(PyObject *Py_UNUSED(module), PyObject *arg) {
    unsigned long long addr = PyLong_AsUnsignedLongLong(arg);
    if (addr == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    const k7_api *t = (const k7_api *)(uintptr_t)addr;
    if (!t || t->api_size != (int64_t)sizeof(k7_api) ||
        t->writer_size != (int64_t)sizeof(k7_writer) ||
        t->reader_size != (int64_t)sizeof(k7_reader)) {
        PyErr_SetString(PyExc_ValueError,
                        "bind: not a k7_api table of this build of k7.h (rebuild the package)");
        return NULL;
    }
    if (kernel && kernel != t) {
        PyErr_SetString(PyExc_RuntimeError, "bind: already bound to another kernel");
        return NULL;
    }
    kernel = t;
    Py_RETURN_NONE;
}

static int bound(void) {
    if (kernel) return 1;
    PyErr_SetString(PyExc_RuntimeError,
                    "k7core._native._fast is not bound to the kernel: import k7core first");
    return 0;
}

/* ------------------------------------------------------------------ thread guard
 *
 * A writer (Appender) and a consumer group (Fetcher) are used from one thread at a time.
 * While a thread is in a slow path (Python code between kernel calls: a roll, a wait in
 * poll) or in a section that releases the GIL (an msync), the object's `owner` holds its
 * thread id; a call from another thread meanwhile raises k7core.ConcurrentUseError instead
 * of racing on the same C state. On the fast paths the check is one load of `owner`. */

static PyObject *busy_error; /* k7core.ConcurrentUseError (set_busy_error), else RuntimeError */

static int busy(unsigned long owner, const char *what) {
    if (!owner || owner == PyThread_get_thread_ident()) return 0;
    PyErr_Format(busy_error ? busy_error : PyExc_RuntimeError,
                 "%s is in use by another thread at this moment (%s)", what,
                 "use it from one thread at a time; see docs/concurrency.md");
    return 1;
}

#define GUARD(self, what, fail) \
    if ((self)->owner && busy((self)->owner, (what))) return (fail)

/* enter() -> True when the calling thread now owns the object (call leave() after), False
 * when it already did (nested); raises ConcurrentUseError when another thread does. */
#define GUARD_METHODS(Type, what)                                                 \
    static PyObject *Type##_enter(Type *self, PyObject *Py_UNUSED(unused)) {      \
        GUARD(self, what, NULL);                                                  \
        if (self->owner) Py_RETURN_FALSE;                                         \
        self->owner = PyThread_get_thread_ident();                                \
        Py_RETURN_TRUE;                                                           \
    }                                                                             \
    static PyObject *Type##_leave(Type *self, PyObject *Py_UNUSED(unused)) {      \
        self->owner = 0;                                                          \
        Py_RETURN_NONE;                                                           \
    }

static PyObject *set_busy_error(PyObject *Py_UNUSED(module), PyObject *cls) {
    if (!PyExceptionClass_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "set_busy_error: expected an exception class");
        return NULL;
    }
    Py_INCREF(cls);
    Py_XSETREF(busy_error, cls);
    Py_RETURN_NONE;
}

/* k7core._checks.check_count / check_timeout (set_checks): called only for the arguments
 * the fast paths do not recognise at a glance, so one Python function words every error. */
static PyObject *count_check, *timeout_check;

static PyObject *set_checks(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "set_checks(check_count, check_timeout)");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(count_check, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(timeout_check, args[1]);
    Py_RETURN_NONE;
}

/* 0 when `check(o)` accepts `o` (or no check is set), -1 with its exception set. */
static int run_check(PyObject *check, PyObject *o) {
    if (!check) return 0;
    PyObject *r = PyObject_CallOneArg(check, o);
    if (!r) return -1;
    Py_DECREF(r);
    return 0;
}

/* A count (max_batch): an exact int is checked by the caller's range test; anything else
 * (bool, float, an __index__ type) goes through check_count. */
static int count_ok(PyObject *o) {
    return PyLong_CheckExact(o) ? 0 : run_check(count_check, o);
}

/* A timeout: None, or a float or int >= 0 at a glance (nan is not); anything else goes
 * through check_timeout, which raises or accepts it. */
static int timeout_ok(PyObject *t) {
    if (t == Py_None) return 0;
    if (PyFloat_CheckExact(t) && PyFloat_AS_DOUBLE(t) >= 0.0) return 0;
    if (PyLong_CheckExact(t)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(t, &overflow);
        if (overflow > 0 || (!overflow && v >= 0)) return 0;
    }
    return run_check(timeout_check, t);
}

/* ------------------------------------------------------------------ payloads */

/* Pointer and length of a bytes-like object: bytes directly, anything else through the
 * buffer protocol (then *held is set and the buffer must be released). */
static int get_bytes(PyObject *o, Py_buffer *buf, const uint8_t **p, int64_t *n, int *held) {
    if (PyBytes_CheckExact(o)) {
        *p = (const uint8_t *)PyBytes_AS_STRING(o);
        *n = (int64_t)PyBytes_GET_SIZE(o);
        *held = 0;
        return 0;
    }
    if (PyObject_GetBuffer(o, buf, PyBUF_SIMPLE) < 0) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Format(PyExc_TypeError,
                         "payload must be bytes-like (bytes, bytearray, memoryview), not %.100s",
                         Py_TYPE(o)->tp_name);
        }
        return -1;
    }
    *p = (const uint8_t *)buf->buf;
    *n = (int64_t)buf->len;
    *held = 1;
    return 0;
}

static int too_large(const k7_writer *w, int64_t n) {
    return n > K7_MAX_LEN || (w->max_frame > 0 && kernel->frame_size(n) > w->max_frame);
}

/* ------------------------------------------------------------------ Appender */

typedef struct {
    PyObject_HEAD
    k7_writer *w;
    unsigned long owner; /* thread guard (see above) */
} Appender;

#define WRITER_WHAT "this queue's writer (enqueue)"
GUARD_METHODS(Appender, WRITER_WHAT)

/* Run `stmt` with the GIL released, owning the writer meanwhile. */
#define UNLOCKED_OWNED(self, stmt)                                     \
    do {                                                               \
        int took_ = !(self)->owner;                                    \
        if (took_) (self)->owner = PyThread_get_thread_ident();        \
        Py_BEGIN_ALLOW_THREADS                                         \
        stmt;                                                          \
        Py_END_ALLOW_THREADS                                           \
        if (took_) (self)->owner = 0;                                  \
    } while (0)

static int Appender_init(Appender *self, PyObject *args, PyObject *kwds) {
    unsigned long long addr;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Appender takes no keyword arguments");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "K", &addr) || !bound()) return -1;
    self->w = (k7_writer *)(uintptr_t)addr;
    return 0;
}

static PyObject *Appender_detach(Appender *self, PyObject *Py_UNUSED(unused)) {
    self->w = NULL;
    Py_RETURN_NONE;
}

/* append(data) -> global offset (>= 0) or a negative K7_* code (nothing written). */
static PyObject *Appender_append(Appender *self, PyObject *data) {
    k7_writer *w = self->w;
    if (!w) return PyLong_FromLong(K7_CLOSED);
    GUARD(self, WRITER_WHAT, NULL);
    Py_buffer buf;
    const uint8_t *p;
    int64_t n, rc;
    int held;
    if (get_bytes(data, &buf, &p, &n, &held) < 0) return NULL;
    if (n > K7_MAX_LEN) {
        rc = K7_TOOLARGE;
    } else if (w->mode == K7_MODE_SYNC) { /* msync: let other threads run meanwhile */
        UNLOCKED_OWNED(self, rc = kernel->append(w, p, n));
    } else {
        rc = kernel->append(w, p, n);
        if (rc == K7_BUSY) { /* another process holds the shared lock: wait for it unlocked */
            UNLOCKED_OWNED(self, rc = kernel->shared_lock(w));
            if (rc != K7_LOCKTIMEOUT) rc = kernel->append(w, p, n);
        }
    }
    if (held) PyBuffer_Release(&buf);
    return PyLong_FromLongLong(rc);
}

/* append_many(items, start) -> list of global offsets of items[start:start+k] (k >= 1, as
 * many as fit in the segment), or a negative K7_* code / 0 (the first does not fit).
 * Every item is checked against max_frame before anything is written. */
static PyObject *Appender_append_many(Appender *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "append_many(items, start)");
        return NULL;
    }
    PyObject *items = args[0];
    if (!PyList_CheckExact(items) && !PyTuple_CheckExact(items)) {
        PyErr_SetString(PyExc_TypeError, "append_many: items must be a list or a tuple");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    k7_writer *w = self->w;
    if (!w) return PyLong_FromLong(K7_CLOSED);
    GUARD(self, WRITER_WHAT, NULL);
    /* A snapshot keeps every item alive while the GIL is released ("sync" msyncs). */
    PyObject *seq = PySequence_Tuple(items);
    if (!seq) return NULL;
    Py_ssize_t total = PyTuple_GET_SIZE(seq);
    if (start < 0 || start > total) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_IndexError, "append_many: start out of range");
        return NULL;
    }
    Py_ssize_t n = total - start;
    const uint8_t *sptrs[STACK_ITEMS];
    int64_t slens[STACK_ITEMS], soffs[STACK_ITEMS];
    const uint8_t **ptrs = sptrs;
    int64_t *lens = slens, *offs = soffs;
    Py_buffer *bufs = NULL;
    Py_ssize_t nheld = 0, i;
    PyObject *result = NULL;
    if (n > STACK_ITEMS) {
        ptrs = malloc((size_t)n * sizeof *ptrs);
        lens = malloc((size_t)n * sizeof *lens);
        offs = malloc((size_t)n * sizeof *offs);
        if (!ptrs || !lens || !offs) {
            PyErr_NoMemory();
            goto done;
        }
    }
    int64_t rc = 0;
    for (i = 0; i < n; i++) {
        PyObject *o = PyTuple_GET_ITEM(seq, start + i);
        if (PyBytes_CheckExact(o)) {
            ptrs[i] = (const uint8_t *)PyBytes_AS_STRING(o);
            lens[i] = (int64_t)PyBytes_GET_SIZE(o);
        } else {
            if (!bufs) {
                bufs = PyMem_Malloc((size_t)n * sizeof *bufs);
                if (!bufs) {
                    PyErr_NoMemory();
                    goto done;
                }
            }
            int held;
            if (get_bytes(o, &bufs[nheld], &ptrs[i], &lens[i], &held) < 0) goto done;
            nheld++;
        }
        if (too_large(w, lens[i])) rc = K7_TOOLARGE;
    }
    if (n == 0) {
        result = PyList_New(0);
        goto done;
    }
    if (rc == 0) {
        if (w->mode == K7_MODE_SYNC) {
            UNLOCKED_OWNED(self, rc = kernel->append_many(w, (uint8_t **)ptrs, lens, n, offs));
        } else {
            rc = kernel->append_many(w, (uint8_t **)ptrs, lens, n, offs);
            if (rc == K7_BUSY) {
                UNLOCKED_OWNED(self, rc = kernel->shared_lock(w));
                if (rc != K7_LOCKTIMEOUT)
                    rc = kernel->append_many(w, (uint8_t **)ptrs, lens, n, offs);
            }
        }
    }
    if (rc <= 0) {
        result = PyLong_FromLongLong(rc);
        goto done;
    }
    result = PyList_New((Py_ssize_t)rc);
    if (!result) goto release;
    for (i = 0; i < (Py_ssize_t)rc; i++) {
        PyObject *v = PyLong_FromLongLong(offs[i]);
        if (!v) {
            Py_CLEAR(result);
            goto release;
        }
        PyList_SET_ITEM(result, i, v);
    }
    goto done;
release: /* no list for the caller: a short batch must not keep the shared lock */
    kernel->shared_release(w);
done:
    for (i = 0; i < nheld; i++) PyBuffer_Release(&bufs[i]);
    PyMem_Free(bufs);
    if (ptrs != sptrs) free((void *)ptrs);
    if (lens != slens) free(lens);
    if (offs != soffs) free(offs);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef Appender_methods[] = {
    {"append", (PyCFunction)Appender_append, METH_O, NULL},
    {"append_many", (PyCFunction)(void (*)(void))Appender_append_many, METH_FASTCALL, NULL},
    {"detach", (PyCFunction)Appender_detach, METH_NOARGS, NULL},
    {"enter", (PyCFunction)Appender_enter, METH_NOARGS, NULL},
    {"leave", (PyCFunction)Appender_leave, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "k7core._native._fast.Appender",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Appends frames through a k7_writer (by address); see k7core/_queue.py.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Appender_init,
    .tp_methods = Appender_methods,
};

/* ------------------------------------------------------------------ Fetcher */

typedef struct {
    PyObject_HEAD
    k7_reader *r;
    k7_inflight *f;
    PyTypeObject *msgtype; /* a tuple subclass (k7core.Message) */
    PyObject *view;        /* read-only memoryview of the reader's segment, or NULL */
    int64_t base10;        /* segment base minus the frame header */
    unsigned long owner;   /* thread guard (see above) */
} Fetcher;

#define GROUP_WHAT "this consumer group"
GUARD_METHODS(Fetcher, GROUP_WHAT)

static int Fetcher_init(Fetcher *self, PyObject *args, PyObject *kwds) {
    unsigned long long raddr, faddr;
    PyObject *t;
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Fetcher takes no keyword arguments");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "KKO!", &raddr, &faddr, &PyType_Type, &t) || !bound()) return -1;
    if (!PyType_IsSubtype((PyTypeObject *)t, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "Fetcher: the message type must subclass tuple");
        return -1;
    }
    self->r = (k7_reader *)(uintptr_t)raddr;
    self->f = (k7_inflight *)(uintptr_t)faddr;
    Py_INCREF(t);
    Py_XSETREF(self->msgtype, (PyTypeObject *)t);
    return 0;
}

static int Fetcher_traverse(Fetcher *self, visitproc visit, void *arg) {
    Py_VISIT(self->msgtype);
    Py_VISIT(self->view);
    return 0;
}

static int Fetcher_clear(Fetcher *self) {
    Py_CLEAR(self->msgtype);
    Py_CLEAR(self->view);
    return 0;
}

static void Fetcher_dealloc(Fetcher *self) {
    PyObject_GC_UnTrack(self);
    Fetcher_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* set_segment(view or None, base10): what the reader's k7_reader currently points into. */
static PyObject *Fetcher_set_segment(Fetcher *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_segment(view, base10)");
        return NULL;
    }
    long long base10 = PyLong_AsLongLong(args[1]);
    if (base10 == -1 && PyErr_Occurred()) return NULL;
    if (args[0] == Py_None) {
        Py_CLEAR(self->view);
    } else {
        if (!PyMemoryView_Check(args[0])) {
            PyErr_SetString(PyExc_TypeError, "set_segment: view must be a memoryview or None");
            return NULL;
        }
        Py_INCREF(args[0]);
        Py_XSETREF(self->view, args[0]);
    }
    self->base10 = base10;
    Py_RETURN_NONE;
}

static PyObject *Fetcher_detach(Fetcher *self, PyObject *Py_UNUSED(unused)) {
    self->r = NULL;
    self->f = NULL;
    Py_CLEAR(self->view);
    Py_RETURN_NONE;
}

/* Track and build the n frames the last k7_read left in r->starts / r->lens.
 *
 * Its allocations may run the cyclic GC, whose finalizers run Python code, during which
 * the GIL can pass to another thread: the caller owns the fetcher meanwhile (OWN_CALL), so
 * that thread cannot close, seek or regrow the reader under it (ConcurrentUseError), and
 * the view is held here, so a close by a finalizer on this thread (nested ownership) does
 * not leave it dangling. The reader struct and its arrays are the group's for its life. */
static PyObject *collect(Fetcher *self, int64_t n) {
    k7_reader *r = self->r;
    if (n <= 0) return PyList_New(0);
    if (!self->view || n > r->capacity) {
        PyErr_SetString(PyExc_RuntimeError, "k7 fetcher: no segment view for the frames read");
        return NULL;
    }
    if (kernel->track(self->f, n)) return PyErr_NoMemory();
    PyObject *view = Py_NewRef(self->view);
    int64_t base10 = self->base10;
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) {
        Py_DECREF(view);
        return NULL;
    }
    binaryfunc subscript = Py_TYPE(view)->tp_as_mapping->mp_subscript;
    PyTypeObject *t = (PyTypeObject *)Py_NewRef((PyObject *)self->msgtype);
    for (int64_t i = 0; i < n; i++) {
        int64_t s = r->starts[i];
        PyObject *lo = PyLong_FromLongLong(s);
        PyObject *hi = PyLong_FromLongLong(s + r->lens[i]);
        PyObject *sl = (lo && hi) ? PySlice_New(lo, hi, NULL) : NULL;
        Py_XDECREF(lo);
        Py_XDECREF(hi);
        PyObject *payload = sl ? subscript(view, sl) : NULL;
        Py_XDECREF(sl);
        PyObject *off = payload ? PyLong_FromLongLong(base10 + s) : NULL;
        PyObject *msg = off ? t->tp_alloc(t, 2) : NULL;
        if (!msg) {
            Py_XDECREF(payload);
            Py_XDECREF(off);
            Py_DECREF(list);
            list = NULL;
            break;
        }
        PyTuple_SET_ITEM(msg, 0, off);
        PyTuple_SET_ITEM(msg, 1, payload);
        /* A message cannot be part of a reference cycle (an int, and a view of an mmap,
         * which refers to nothing): keep it out of the cyclic GC, whose collections
         * otherwise grow with every batch still held. (Its dealloc untracks checked.) */
        PyObject_GC_UnTrack(msg);
        PyList_SET_ITEM(list, (Py_ssize_t)i, msg);
    }
    Py_DECREF(t);
    Py_DECREF(view);
    return list;
}

/* Call `expr` (a PyObject *) owning the fetcher meanwhile, unless this thread already does. */
#define OWN_CALL(self, result, expr)                                   \
    do {                                                               \
        int took_ = !(self)->owner;                                    \
        if (took_) (self)->owner = PyThread_get_thread_ident();        \
        (result) = (expr);                                             \
        if (took_) (self)->owner = 0;                                  \
    } while (0)

/* read(max_n[, timeout]) -> messages of the frames visible in the current segment, up to
 * max_n. `timeout` is only checked (poll's fast path does not wait). */
static PyObject *Fetcher_read(Fetcher *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "read(max_n[, timeout])");
        return NULL;
    }
    if (count_ok(args[0]) < 0 || (nargs == 2 && timeout_ok(args[1]) < 0)) return NULL;
    long long max_n = PyLong_AsLongLong(args[0]);
    if (max_n == -1 && PyErr_Occurred()) return NULL;
    if (!self->r) return PyList_New(0);
    GUARD(self, GROUP_WHAT, NULL);
    PyObject *list;
    OWN_CALL(self, list, collect(self, kernel->read(self->r, max_n)));
    return list;
}

/* collect(n) -> messages for n frames already scanned (after the Python slow path). */
static PyObject *Fetcher_collect(Fetcher *self, PyObject *arg) {
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (!self->r) return PyList_New(0);
    GUARD(self, GROUP_WHAT, NULL);
    PyObject *list;
    OWN_CALL(self, list, collect(self, n));
    return list;
}

/* The offset of a Message or of an int; -1 (never in flight) for an int beyond int64. */
static int offset_of(PyObject *o, int64_t *off) {
    if (PyTuple_Check(o) && PyTuple_GET_SIZE(o) >= 1) o = PyTuple_GET_ITEM(o, 0);
    if (!PyLong_Check(o) || PyBool_Check(o)) {
        PyErr_Format(PyExc_TypeError, "expected a Message or an int offset, not %.100s",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    *off = overflow ? -1 : v;
    return 0;
}

/* message_offset(msg) -> the offset ack reads from a Message or an int (for nack and
 * k7async): -1 when it cannot be one. */
static PyObject *message_offset(PyObject *Py_UNUSED(module), PyObject *arg) {
    int64_t off;
    if (offset_of(arg, &off) < 0) return NULL;
    return PyLong_FromLongLong(off);
}

/* ack(msg or offset) -> 1 acked, 0 not in flight, -errno (cursor store failed). */
static PyObject *Fetcher_ack(Fetcher *self, PyObject *arg) {
    int64_t off;
    if (offset_of(arg, &off) < 0) return NULL;
    if (!self->f) return PyLong_FromLong(0);
    GUARD(self, GROUP_WHAT, NULL);
    return PyLong_FromLong(kernel->ack(self->f, off));
}

/* ack_many(iterable of msgs or offsets) -> count acked, or -errno; one cursor store. */
static PyObject *Fetcher_ack_many(Fetcher *self, PyObject *arg) {
    GUARD(self, GROUP_WHAT, NULL);
    PyObject *seq = PySequence_Fast(arg, "ack_many: expected an iterable of messages");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int64_t soffs[STACK_ITEMS];
    int64_t *offs = n > STACK_ITEMS ? malloc((size_t)n * sizeof *offs) : soffs;
    PyObject *result = NULL;
    if (!offs) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (offset_of(items[i], &offs[i]) < 0) goto done;
    }
    result = PyLong_FromLongLong(self->f && n ? kernel->ack_many(self->f, offs, n) : 0);
done:
    if (offs != soffs) free(offs);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef Fetcher_methods[] = {
    {"read", (PyCFunction)(void (*)(void))Fetcher_read, METH_FASTCALL, NULL},
    {"collect", (PyCFunction)Fetcher_collect, METH_O, NULL},
    {"set_segment", (PyCFunction)(void (*)(void))Fetcher_set_segment, METH_FASTCALL, NULL},
    {"ack", (PyCFunction)Fetcher_ack, METH_O, NULL},
    {"ack_many", (PyCFunction)Fetcher_ack_many, METH_O, NULL},
    {"detach", (PyCFunction)Fetcher_detach, METH_NOARGS, NULL},
    {"enter", (PyCFunction)Fetcher_enter, METH_NOARGS, NULL},
    {"leave", (PyCFunction)Fetcher_leave, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FetcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "k7core._native._fast.Fetcher",
    .tp_basicsize = sizeof(Fetcher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Reads and acks through a k7_reader / k7_inflight (by address); see "
              "k7core/_group.py.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Fetcher_init,
    .tp_dealloc = (destructor)Fetcher_dealloc,
    .tp_traverse = (traverseproc)Fetcher_traverse,
    .tp_clear = (inquiry)Fetcher_clear,
    .tp_methods = Fetcher_methods,
};

/* ------------------------------------------------------------------ job records
 *
 * JobRecord: one live job of the job store (k7core/jobs/_machine.py), mutable. Millions of
 * them live as long as their jobs, so they are a C struct: made by one call (a Python
 * object with slots took 20 attribute stores), with the numbers stored inline (no float
 * object per timestamp), and not a GC object: the cycle collector never walks them (it
 * did, in pauses of 100 ms and more). A record holds no cycle to break: it refers
 * to its tube, its state, its owner while reserved, and plain values.
 *
 * JobRecord(id, tube, priority, delay, ttr, ready_at, created_at, key, depends_on, body,
 * state): seq, pending and the counters start at 0, errors at (), owner at None. */

typedef struct {
    PyObject_HEAD
    PyObject *tube, *body, *key, *depends_on, *errors, *owner, *state;
    long long id, priority, seq, pending, reserves, timeouts, releases, buries, kicks;
    double delay, ttr, ready_at, created_at;
} JobRecord;

static PyTypeObject JobRecordType;

static PyObject *JobRecord_vectorcall(PyObject *Py_UNUSED(type), PyObject *const *args,
                                      size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 11 || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError,
                        "JobRecord takes 11 positional arguments: id, tube, priority, delay, "
                        "ttr, ready_at, created_at, key, depends_on, body, state");
        return NULL;
    }
    long long id = PyLong_AsLongLong(args[0]);
    if (id == -1 && PyErr_Occurred()) return NULL;
    long long priority = PyLong_AsLongLong(args[2]);
    if (priority == -1 && PyErr_Occurred()) return NULL;
    double v[4];
    for (int i = 0; i < 4; i++) {
        v[i] = PyFloat_AsDouble(args[3 + i]);
        if (v[i] == -1.0 && PyErr_Occurred()) return NULL;
    }
    JobRecord *r = PyObject_New(JobRecord, &JobRecordType);
    if (!r) return NULL;
    r->id = id;
    r->priority = priority;
    r->delay = v[0];
    r->ttr = v[1];
    r->ready_at = v[2];
    r->created_at = v[3];
    r->tube = Py_NewRef(args[1]);
    r->key = Py_NewRef(args[7]);
    r->depends_on = Py_NewRef(args[8]);
    r->body = Py_NewRef(args[9]);
    r->state = Py_NewRef(args[10]);
    r->errors = PyTuple_New(0);
    r->owner = Py_NewRef(Py_None);
    r->seq = r->pending = r->reserves = r->timeouts = r->releases = r->buries = r->kicks = 0;
    return (PyObject *)r;
}

static PyObject *JobRecord_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "JobRecord takes no keyword arguments");
        return NULL;
    }
    return JobRecord_vectorcall((PyObject *)type, &PyTuple_GET_ITEM(args, 0),
                                (size_t)PyTuple_GET_SIZE(args), NULL);
}

static void JobRecord_dealloc(JobRecord *r) {
    Py_XDECREF(r->tube);
    Py_XDECREF(r->body);
    Py_XDECREF(r->key);
    Py_XDECREF(r->depends_on);
    Py_XDECREF(r->errors);
    Py_XDECREF(r->owner);
    Py_XDECREF(r->state);
    PyObject_Free(r);
}

#define REC_OBJECT(name) {#name, T_OBJECT_EX, offsetof(JobRecord, name), 0, NULL}
#define REC_INT(name) {#name, T_LONGLONG, offsetof(JobRecord, name), 0, NULL}
#define REC_DOUBLE(name) {#name, T_DOUBLE, offsetof(JobRecord, name), 0, NULL}

static PyMemberDef JobRecord_members[] = {
    REC_OBJECT(tube), REC_OBJECT(body), REC_OBJECT(key), REC_OBJECT(depends_on),
    REC_OBJECT(errors), REC_OBJECT(owner), REC_OBJECT(state),
    REC_INT(id), REC_INT(priority), REC_INT(seq), REC_INT(pending), REC_INT(reserves),
    REC_INT(timeouts), REC_INT(releases), REC_INT(buries), REC_INT(kicks),
    REC_DOUBLE(delay), REC_DOUBLE(ttr), REC_DOUBLE(ready_at), REC_DOUBLE(created_at),
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject JobRecordType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "k7core._native._fast.JobRecord",
    .tp_basicsize = sizeof(JobRecord),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A live job of the job store, mutable; see k7core/jobs/_machine.py.",
    .tp_new = JobRecord_new,
    .tp_vectorcall = JobRecord_vectorcall,
    .tp_dealloc = (destructor)JobRecord_dealloc,
    .tp_members = JobRecord_members,
};

/* JobMaker(Job): a callable that copies a JobRecord into a new instance of Job (the job
 * store's frozen dataclass with slots), the copy a call returns. Job's slots are filled by
 * their offsets, read once here from its member descriptors, instead of 17 attribute copies
 * in Python (every reserve and peek makes one). Job must have
 * exactly the slots of job_fields, each a plain object slot; Job.tube is the tube's name. */

static const char *const job_fields[] = {
    "id", "tube", "priority", "body", "state", "ttr", "reserves", "timeouts", "releases",
    "buries", "kicks", "created_at", "key", "depends_on", "errors", "delay", "ready_at",
};
#define JOB_FIELDS ((Py_ssize_t)(sizeof(job_fields) / sizeof(job_fields[0])))

typedef struct {
    PyObject_HEAD
    PyTypeObject *job_type;
    PyObject *name; /* "name", the attribute of a tube */
    Py_ssize_t offsets[JOB_FIELDS];
    vectorcallfunc vectorcall;
} JobMaker;

static PyTypeObject JobMakerType;

static PyObject *record_object(PyObject *value, const char *field) {
    if (!value) return PyErr_Format(PyExc_AttributeError, "JobRecord has no %s", field);
    return Py_NewRef(value);
}

static PyObject *JobMaker_call(JobMaker *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames && PyTuple_GET_SIZE(kwnames)) ||
        !Py_IS_TYPE(args[0], &JobRecordType)) {
        PyErr_SetString(PyExc_TypeError, "JobMaker takes one JobRecord");
        return NULL;
    }
    const JobRecord *r = (const JobRecord *)args[0];
    PyObject *values[JOB_FIELDS] = {
        PyLong_FromLongLong(r->id),
        r->tube ? PyObject_GetAttr(r->tube, self->name) : record_object(NULL, "tube"),
        PyLong_FromLongLong(r->priority),
        record_object(r->body, "body"),
        record_object(r->state, "state"),
        PyFloat_FromDouble(r->ttr),
        PyLong_FromLongLong(r->reserves),
        PyLong_FromLongLong(r->timeouts),
        PyLong_FromLongLong(r->releases),
        PyLong_FromLongLong(r->buries),
        PyLong_FromLongLong(r->kicks),
        PyFloat_FromDouble(r->created_at),
        record_object(r->key, "key"),
        record_object(r->depends_on, "depends_on"),
        record_object(r->errors, "errors"),
        PyFloat_FromDouble(r->delay),
        PyFloat_FromDouble(r->ready_at),
    };
    PyObject *job = NULL;
    for (Py_ssize_t i = 0; i < JOB_FIELDS; i++)
        if (!values[i]) goto fail;
    job = self->job_type->tp_alloc(self->job_type, 0);
    if (!job) goto fail;
    for (Py_ssize_t i = 0; i < JOB_FIELDS; i++)
        *(PyObject **)((char *)job + self->offsets[i]) = values[i]; /* steals the reference */
    return job;
fail:
    for (Py_ssize_t i = 0; i < JOB_FIELDS; i++) Py_XDECREF(values[i]);
    return NULL;
}

static int JobMaker_init(JobMaker *self, PyObject *args, PyObject *kwds) {
    PyObject *job_type;
    if (!PyArg_ParseTuple(args, "O!:JobMaker", &PyType_Type, &job_type)) return -1;
    PyTypeObject *type = (PyTypeObject *)job_type;
    PyObject *slots = PyObject_GetAttrString(job_type, "__slots__");
    if (!slots) return -1;
    Py_ssize_t n = PyObject_Length(slots);
    Py_DECREF(slots);
    if (n < 0) return -1;
    if (n != JOB_FIELDS) {
        PyErr_Format(PyExc_TypeError, "JobMaker: %s has %zd slots, not the %zd of a job",
                     type->tp_name, n, JOB_FIELDS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < JOB_FIELDS; i++) {
        PyObject *d = PyObject_GetAttrString(job_type, job_fields[i]);
        if (!d) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
            PyErr_Clear();
        }
        int ok = d && Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX &&
                 ((PyMemberDescrObject *)d)->d_common.d_type == type;
        if (ok) self->offsets[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_XDECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "JobMaker: %s.%s is not a slot of its own",
                         type->tp_name, job_fields[i]);
            return -1;
        }
    }
    PyObject *name = PyUnicode_InternFromString("name");
    if (!name) return -1;
    Py_XSETREF(self->name, name);
    Py_XSETREF(self->job_type, (PyTypeObject *)Py_NewRef(job_type));
    self->vectorcall = (vectorcallfunc)JobMaker_call;
    (void)kwds;
    return 0;
}

static PyObject *JobMaker_tp_call(JobMaker *self, PyObject *args, PyObject *kwds) {
    if (!self->job_type) {
        PyErr_SetString(PyExc_TypeError, "JobMaker was not initialised");
        return NULL;
    }
    if (kwds && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "JobMaker takes no keyword arguments");
        return NULL;
    }
    return JobMaker_call(self, &PyTuple_GET_ITEM(args, 0), (size_t)PyTuple_GET_SIZE(args),
                         NULL);
}

static int JobMaker_traverse(JobMaker *self, visitproc visit, void *arg) {
    Py_VISIT(self->job_type);
    return 0;
}

static int JobMaker_clear(JobMaker *self) {
    Py_CLEAR(self->job_type);
    return 0;
}

static void JobMaker_dealloc(JobMaker *self) {
    PyObject_GC_UnTrack(self);
    JobMaker_clear(self);
    Py_CLEAR(self->name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject JobMakerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "k7core._native._fast.JobMaker",
    .tp_basicsize = sizeof(JobMaker),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "JobMaker(Job)(record) -> a Job copied from a JobRecord; see _fast.c.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)JobMaker_init,
    .tp_call = (ternaryfunc)JobMaker_tp_call,
    .tp_vectorcall_offset = offsetof(JobMaker, vectorcall),
    .tp_dealloc = (destructor)JobMaker_dealloc,
    .tp_traverse = (traverseproc)JobMaker_traverse,
    .tp_clear = (inquiry)JobMaker_clear,
};

/* ------------------------------------------------------------------ topic records
 *
 * The envelope of k7core.topics (the layout, and the reference codec, are in
 * k7core/topics/_envelope.py, which calls these and is tested against its own Python
 * decoder): magic 0xE7, flags (1 key, 2 headers), int64 LE timestamp ms, [u32 key length,
 * key], [u16 header count, then u16 name length, UTF-8 name, u32 value length, value],
 * value. Arguments come checked from _envelope (bytes, a tuple of (str, bytes) pairs). */

#define REC_MAGIC 0xE7
#define REC_KEY 1
#define REC_HEADERS 2
#define REC_HEAD 10

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* record_encode(value: bytes, key: bytes | None, headers: tuple, timestamp: int) -> bytes */
static PyObject *record_encode(PyObject *Py_UNUSED(module), PyObject *const *args,
                               Py_ssize_t nargs) {
    if (nargs != 4 || !PyBytes_Check(args[0]) || (args[1] != Py_None && !PyBytes_Check(args[1]))
        || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "record_encode(value: bytes, key: bytes | None, "
                                         "headers: tuple, timestamp: int)");
        return NULL;
    }
    long long ts = PyLong_AsLongLong(args[3]);
    if (ts == -1 && PyErr_Occurred()) return NULL;
    PyObject *value = args[0], *key = args[1], *hs = args[2];
    Py_ssize_t nh = PyTuple_GET_SIZE(hs);
    if (nh > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "a record holds at most 65535 headers");
        return NULL;
    }
    Py_ssize_t size = REC_HEAD + PyBytes_GET_SIZE(value);
    if (key != Py_None) size += 4 + PyBytes_GET_SIZE(key);
    if (nh) size += 2;
    for (Py_ssize_t i = 0; i < nh; i++) {
        PyObject *h = PyTuple_GET_ITEM(hs, i);
        if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 2 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(h, 0)) || !PyBytes_Check(PyTuple_GET_ITEM(h, 1))) {
            PyErr_SetString(PyExc_TypeError, "record_encode: headers are (str, bytes) pairs");
            return NULL;
        }
        Py_ssize_t nn; /* the str caches its UTF-8: the second pass below reads it again */
        if (!PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(h, 0), &nn)) return NULL;
        Py_ssize_t vn = PyBytes_GET_SIZE(PyTuple_GET_ITEM(h, 1));
        if (nn > 0xFFFF || (uint64_t)vn > 0xFFFFFFFFu) {
            PyErr_SetString(PyExc_ValueError, "record_encode: a header name or value is too long");
            return NULL;
        }
        size += 2 + nn + 4 + vn;
    }
    if (key != Py_None && (uint64_t)PyBytes_GET_SIZE(key) > 0xFFFFFFFFu) {
        PyErr_SetString(PyExc_ValueError, "record_encode: the key is longer than 4 GiB");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (!out) return NULL;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
    p[0] = REC_MAGIC;
    p[1] = (uint8_t)((key != Py_None ? REC_KEY : 0) | (nh ? REC_HEADERS : 0));
    put_le(p + 2, (uint64_t)ts, 8);
    p += REC_HEAD;
    if (key != Py_None) {
        Py_ssize_t kn = PyBytes_GET_SIZE(key);
        put_le(p, (uint64_t)kn, 4);
        memcpy(p + 4, PyBytes_AS_STRING(key), (size_t)kn);
        p += 4 + kn;
    }
    if (nh) {
        put_le(p, (uint64_t)nh, 2);
        p += 2;
        for (Py_ssize_t i = 0; i < nh; i++) {
            PyObject *h = PyTuple_GET_ITEM(hs, i), *v = PyTuple_GET_ITEM(h, 1);
            Py_ssize_t vn = PyBytes_GET_SIZE(v), nn;
            const char *name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(h, 0), &nn);
            put_le(p, (uint64_t)nn, 2);
            memcpy(p + 2, name, (size_t)nn);
            p += 2 + nn;
            put_le(p, (uint64_t)vn, 4);
            memcpy(p + 4, PyBytes_AS_STRING(v), (size_t)vn);
            p += 4 + vn;
        }
    }
    memcpy(p, PyBytes_AS_STRING(value), (size_t)PyBytes_GET_SIZE(value));
    return out;
}

/* One record from one payload, or NULL with ValueError (not an envelope) or another error. */
static PyObject *decode_one(PyTypeObject *rt, PyObject *partition, PyObject *offset,
                            const uint8_t *b, Py_ssize_t n) {
    PyObject *key = NULL, *headers = NULL, *value = NULL, *ts = NULL, *rec;
    Py_ssize_t pos = REC_HEAD;
    if (n < REC_HEAD || b[0] != REC_MAGIC || (b[1] & ~(REC_KEY | REC_HEADERS))) goto bad;
    if (b[1] & REC_KEY) {
        if (pos + 4 > n) goto bad;
        uint64_t kn = get_le(b + pos, 4);
        pos += 4;
        if (kn > (uint64_t)(n - pos)) goto bad;
        key = PyBytes_FromStringAndSize((const char *)b + pos, (Py_ssize_t)kn);
        if (!key) goto fail;
        pos += (Py_ssize_t)kn;
    } else {
        key = Py_NewRef(Py_None);
    }
    if (b[1] & REC_HEADERS) {
        if (pos + 2 > n) goto bad;
        Py_ssize_t count = (Py_ssize_t)get_le(b + pos, 2);
        pos += 2;
        headers = PyTuple_New(count);
        if (!headers) goto fail;
        for (Py_ssize_t i = 0; i < count; i++) {
            if (pos + 2 > n) goto bad;
            Py_ssize_t nn = (Py_ssize_t)get_le(b + pos, 2);
            pos += 2;
            if (nn + 4 > n - pos) goto bad;
            PyObject *name = PyUnicode_DecodeUTF8((const char *)b + pos, nn, "strict");
            if (!name) goto fail; /* UnicodeDecodeError is a ValueError */
            pos += nn;
            uint64_t vn = get_le(b + pos, 4);
            pos += 4;
            if (vn > (uint64_t)(n - pos)) {
                Py_DECREF(name);
                goto bad;
            }
            PyObject *hv = PyBytes_FromStringAndSize((const char *)b + pos, (Py_ssize_t)vn);
            PyObject *pair = hv ? PyTuple_Pack(2, name, hv) : NULL;
            Py_DECREF(name);
            Py_XDECREF(hv);
            if (!pair) goto fail;
            PyTuple_SET_ITEM(headers, i, pair);
            pos += (Py_ssize_t)vn;
        }
    } else {
        headers = PyTuple_New(0);
        if (!headers) goto fail;
    }
    value = PyBytes_FromStringAndSize((const char *)b + pos, n - pos);
    ts = value ? PyLong_FromLongLong((long long)get_le(b + 2, 8)) : NULL;
    rec = ts ? rt->tp_alloc(rt, 6) : NULL;
    if (!rec) goto fail;
    PyTuple_SET_ITEM(rec, 0, Py_NewRef(partition));
    PyTuple_SET_ITEM(rec, 1, Py_NewRef(offset));
    PyTuple_SET_ITEM(rec, 2, key);
    PyTuple_SET_ITEM(rec, 3, value);
    PyTuple_SET_ITEM(rec, 4, headers);
    PyTuple_SET_ITEM(rec, 5, ts);
    PyObject_GC_UnTrack(rec); /* ints, bytes and tuples of them: never in a cycle */
    return rec;
bad:
    PyErr_SetString(PyExc_ValueError, "not a topic record");
fail:
    Py_XDECREF(key);
    Py_XDECREF(headers);
    Py_XDECREF(value);
    Py_XDECREF(ts);
    return NULL;
}

/* records_decode(pairs: list, partition: int, record_type: type) -> list of records.
 * ``pairs`` holds (offset, payload) tuples (a Message is one). ValueError if a payload is
 * not an envelope: the caller's Python decoder then says which and why. */
static PyObject *records_decode(PyObject *Py_UNUSED(module), PyObject *const *args,
                                Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[0]) || !PyType_Check(args[2]) ||
        !PyType_IsSubtype((PyTypeObject *)args[2], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError,
                        "records_decode(pairs: list, partition: int, record_type: type)");
        return NULL;
    }
    PyObject *pairs = args[0], *partition = args[1];
    PyTypeObject *rt = (PyTypeObject *)args[2];
    Py_ssize_t n = PyList_GET_SIZE(pairs);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(pairs, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "records_decode: pairs are (offset, payload)");
            Py_DECREF(out);
            return NULL;
        }
        Py_buffer buf;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(pair, 1), &buf, PyBUF_SIMPLE) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *rec = decode_one(rt, partition, PyTuple_GET_ITEM(pair, 0),
                                   (const uint8_t *)buf.buf, buf.len);
        PyBuffer_Release(&buf);
        if (!rec) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, rec);
    }
    return out;
}

/* ------------------------------------------------------------------ module */

/* payload_size(data) -> its length in bytes, or the TypeError enqueue gives. */
static PyObject *payload_size(PyObject *Py_UNUSED(module), PyObject *arg) {
    Py_buffer buf;
    const uint8_t *p;
    int64_t n;
    int held;
    if (get_bytes(arg, &buf, &p, &n, &held) < 0) return NULL;
    if (held) PyBuffer_Release(&buf);
    return PyLong_FromLongLong(n);
}

static PyMethodDef module_methods[] = {
    {"set_busy_error", (PyCFunction)set_busy_error, METH_O, NULL},
    {"set_checks", (PyCFunction)(void (*)(void))set_checks, METH_FASTCALL, NULL},
    {"payload_size", (PyCFunction)payload_size, METH_O, NULL},
    {"message_offset", (PyCFunction)message_offset, METH_O, NULL},
    {"bind", (PyCFunction)bind, METH_O, NULL},
    {"record_encode", (PyCFunction)(void (*)(void))record_encode, METH_FASTCALL, NULL},
    {"records_decode", (PyCFunction)(void (*)(void))records_decode, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastmodule = {
    PyModuleDef_HEAD_INIT, "_fast", "CPython entry points for k7core's hot paths.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fast(void) {
    if (PyType_Ready(&AppenderType) < 0 || PyType_Ready(&FetcherType) < 0 ||
        PyType_Ready(&JobRecordType) < 0 || PyType_Ready(&JobMakerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&fastmodule);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Appender", (PyObject *)&AppenderType) < 0 ||
        PyModule_AddObjectRef(m, "Fetcher", (PyObject *)&FetcherType) < 0 ||
        PyModule_AddObjectRef(m, "JobRecord", (PyObject *)&JobRecordType) < 0 ||
        PyModule_AddObjectRef(m, "JobMaker", (PyObject *)&JobMakerType) < 0 ||
        PyModule_AddIntConstant(m, "CLOSED", K7_CLOSED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
