/* zcnet.uring._accel: the optional compiled half of the ring's hot path.
 *
 * Only what pure Python cannot do fast enough lives here: io_uring_enter without ctypes'
 * argument conversion (about 0.35 us per call) and the Ring's hot methods (Core: one C call
 * each instead of a Python frame, a ctypes call and a struct pack). The zero-copy receive
 * path's twins are zcnet.rx.zc._rxaccel. The Core works on the ring's mapped memory
 * through raw pointers, so it checks its own closed flag before every access and the Ring
 * closes it before unmapping; anything unusual goes back to the Python methods, whose checks
 * and errors are then the user's. Private to zcnet.uring.ring: it passes valid addresses. The
 * provided-buffer ring's writes are _accel_bufring.c.
 *
 * Built at install time when a C compiler exists (setup.py, optional); without it, or with
 * ZCNET_PURE=1 in the environment, zcnet runs the pure-Python path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "_cqe.h"
#include "_accel.h"

#ifndef __NR_io_uring_enter
#define __NR_io_uring_enter 426
#endif

static int as_long(PyObject *o, long *out) {
    *out = PyLong_AsLong(o);
    return !(*out == -1 && PyErr_Occurred());
}

/* enter(fd, to_submit, min_complete, flags, arg, argsz) -> int
 *
 * One io_uring_enter. ``arg`` is None or the address of the extended argument. Returns the
 * kernel's result, or -errno on failure (never raises for a kernel error: the caller redoes
 * the call on its slow path, which translates errno). The GIL is released while the kernel
 * may wait for completions (min_complete > 0), so other threads run during a blocking wait. */
static PyObject *accel_enter(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long v[4], argsz = 0;
    void *arg = NULL;
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "enter(fd, to_submit, min_complete, flags, arg, argsz)");
        return NULL;
    }
    for (int i = 0; i < 4; i++)
        if (!as_long(args[i], &v[i]))
            return NULL;
    if (args[4] != Py_None) {
        arg = PyLong_AsVoidPtr(args[4]);
        if (arg == NULL && PyErr_Occurred())
            return NULL;
    }
    if (!as_long(args[5], &argsz))
        return NULL;
    /* Checked before the casts below: a value that only fits once narrowed would reach the
     * kernel as another number (and the GIL decision would be made on the wide one). */
    if (v[0] < 0 || v[0] > INT_MAX || v[1] < 0 || v[1] > UINT_MAX || v[2] < 0 ||
        v[2] > UINT_MAX || v[3] < 0 || v[3] > UINT_MAX || argsz < 0) {
        PyErr_SetString(PyExc_ValueError, "enter: fd, to_submit, min_complete, flags and argsz "
                                          "must be unsigned 32-bit values");
        return NULL;
    }
    long ret;
    if (v[2] > 0) {
        Py_BEGIN_ALLOW_THREADS
        ret = syscall(__NR_io_uring_enter, (int)v[0], (unsigned)v[1], (unsigned)v[2],
                      (unsigned)v[3], arg, (size_t)argsz);
        if (ret < 0)
            ret = -errno;
        Py_END_ALLOW_THREADS
    } else {
        ret = syscall(__NR_io_uring_enter, (int)v[0], (unsigned)v[1], (unsigned)v[2],
                      (unsigned)v[3], arg, (size_t)argsz);
        if (ret < 0)
            ret = -errno;
    }
    return PyLong_FromLong(ret);
}

/* Core: the ring's hot methods over its mapped memory, bound on a Ring made with the
 * accelerator (Ring.prep, .prep_batch, .submit, .reap, .reap_one). The Ring keeps its
 * mappings alive while the Core is open and closes the Core before unmapping; after that
 * every method raises the same
 * ClosedError as the Python methods. Anything off the common path (keywords it does not know,
 * a value out of range, a full SQ, a timeout, a short submit or a failed enter) is handed to
 * the Ring's Python method of the same job, so errors and their messages are the Python
 * path's own. Those methods are handed over once, as the ``slow`` tuple (in SLOW_* order,
 * accel_bind.SLOW_PATHS): no lookup by name on a slow path. */
enum { SLOW_PREP, SLOW_PREP_BATCH, SLOW_SUBMIT, SLOW_SUBMIT_SLOW, SLOW_REAP, SLOW_RELEASE_FD,
       SLOW_N };
/* The public method each slow path serves, for a ClosedError once the Ring is gone. */
static const char *const slow_for[SLOW_N] = {"prep", "prep_batch", "submit", "submit", "reap",
                                             "close"};

typedef struct {
    PyObject_HEAD
    int fd, closed;
    unsigned *khead, *ktail, *kcq_head, *kcq_tail;
    char *sqes, *cqes;
    unsigned sq_mask, cq_mask, sq_entries, sqe_size, cqe_size;
    PyObject *ring_ref;     /* weakref to the Ring: its slow paths' self */
    PyObject *slow[SLOW_N]; /* the Ring class's slow-path functions, SLOW_* order */
    PyObject *closed_error; /* zcnet.errors.ClosedError */
    PyObject *owner;        /* the Ring's type name, for the error message */
    PyTypeObject *comp;     /* zcnet.uring.ring.Completions: reap's result */
    Py_ssize_t comp_off[8]; /* its slots, in the order of zcnet.uring.completions.C_SLOTS */
    PyObject *keep;         /* the ring's mappings: alive while any bound method is */
    int cqe32;              /* reaps are 32-byte entries (a CQE32 ring, or a mixed one widened) */
    uint32_t f32, fskip;    /* a CQE_MIXED ring: IORING_CQE_F_32, IORING_CQE_F_SKIP; else 0 */
    int users;              /* enters in flight with the GIL released (fd in use) */
    PyObject *closer;       /* the Ring, closed during such an enter: its fd goes after it */
} Core;

static void core_dealloc(Core *c) {
    Py_XDECREF(c->ring_ref);
    Py_XDECREF(c->closed_error);
    Py_XDECREF(c->owner);
    Py_XDECREF(c->comp);
    Py_XDECREF(c->keep);
    Py_XDECREF(c->closer);
    for (int i = 0; i < SLOW_N; i++)
        Py_XDECREF(c->slow[i]);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *core_new(PyTypeObject *t, PyObject *args, PyObject *kw) {
    Core *c = (Core *)PyType_GenericNew(t, args, kw);
    if (c)
        c->closed = 1; /* no ring until __init__ succeeds: every method refuses */
    return (PyObject *)c;
}

static int core_init(Core *c, PyObject *args, PyObject *kw) {
    unsigned long long sq, cq, sqes, cqes;
    unsigned khead, ktail, kcq_head, kcq_tail, sq_mask, sq_entries, sqe_size, cq_mask, cqe_size;
    int cqe32, fd, closed;
    unsigned f32, fskip;
    PyObject *ring, *err, *of, *of_slots, *keep, *slow;
    /* Parsed into locals and stored only once every check passed: a failed __init__ leaves
     * the Core as it was (closed, or bound to its ring). */
    if (!PyArg_ParseTuple(args, "OOOOOO!iIIiKIIKIIKIIIKIII", &ring, &err, &of, &of_slots,
                          &keep, &PyTuple_Type, &slow, &cqe32, &f32, &fskip, &fd, &sq, &khead,
                          &ktail, &cq,
                          &kcq_head, &kcq_tail, &sqes, &sq_mask, &sq_entries, &sqe_size, &cqes,
                          &cq_mask, &cqe_size, &closed))
        return -1;
    if (PyTuple_GET_SIZE(slow) != SLOW_N) {
        PyErr_Format(PyExc_TypeError, "Core: slow is a tuple of %d functions", SLOW_N);
        return -1;
    }
    for (int i = 0; i < SLOW_N; i++)
        if (!PyCallable_Check(PyTuple_GET_ITEM(slow, i))) {
            PyErr_Format(PyExc_TypeError, "Core: slow[%d] is not callable", i);
            return -1;
        }
    if ((f32 || fskip) && (!cqe32 || !f32 || !fskip || f32 == fskip)) {
        PyErr_SetString(PyExc_ValueError, "Core: a mixed CQ takes cqe32=1 (its reaps are "
                                          "widened) and two distinct flags f32, fskip");
        return -1;
    }
    if (cqe_size != (cqe32 && !f32 ? CQE32_SIZE : CQE_SIZE)) {
        PyErr_Format(PyExc_ValueError, "Core: cqe_size %u does not match cqe32=%d, mixed=%d",
                     cqe_size, cqe32, f32 != 0);
        return -1;
    }
    if (sqe_size != 64 && sqe_size != 128) {
        PyErr_Format(PyExc_ValueError, "Core: sqe_size %u is not 64 or 128", sqe_size);
        return -1;
    }
    if (!PyType_Check(of)) {
        PyErr_SetString(PyExc_TypeError, "Core: completions_of must be the Completions class");
        return -1;
    }
    /* Its slots as Python hands them over (C_SLOTS): the three a reap sets, then the lazily
     * decoded ones (None). */
    Py_ssize_t comp_off[8];
    if (!member_offsets((PyTypeObject *)of, of_slots, 8, comp_off, "Core: completions_slots"))
        return -1;
    PyObject *ring_ref = PyWeakref_NewRef(ring, NULL);
    PyObject *owner = ring_ref ? PyUnicode_FromString(Py_TYPE(ring)->tp_name) : NULL;
    if (!owner) {
        Py_XDECREF(ring_ref);
        return -1;
    }
    memcpy(c->comp_off, comp_off, sizeof comp_off);
    for (int i = 0; i < SLOW_N; i++)
        Py_XSETREF(c->slow[i], Py_NewRef(PyTuple_GET_ITEM(slow, i)));
    Py_XSETREF(c->comp, (PyTypeObject *)Py_NewRef(of));
    Py_XSETREF(c->keep, Py_NewRef(keep));
    Py_XSETREF(c->ring_ref, ring_ref);
    Py_XSETREF(c->closed_error, Py_NewRef(err));
    Py_XSETREF(c->owner, owner);
    c->cqe32 = cqe32;
    c->f32 = f32;
    c->fskip = fskip;
    c->fd = fd;
    c->sq_mask = sq_mask;
    c->sq_entries = sq_entries;
    c->sqe_size = sqe_size;
    c->cq_mask = cq_mask;
    c->cqe_size = cqe_size;
    c->khead = (unsigned *)(uintptr_t)(sq + khead);
    c->ktail = (unsigned *)(uintptr_t)(sq + ktail);
    c->kcq_head = (unsigned *)(uintptr_t)(cq + kcq_head);
    c->kcq_tail = (unsigned *)(uintptr_t)(cq + kcq_tail);
    c->sqes = (char *)(uintptr_t)sqes;
    c->cqes = (char *)(uintptr_t)cqes;
    c->closed = closed;
    return 0;
}

static PyObject *core_closed(Core *c, const char *method) {
    if (!c->closed_error || !c->owner) /* never initialised: no ring, no error class */
        PyErr_Format(PyExc_ValueError, "%s() on a Core that was never bound to a ring", method);
    else
        PyErr_Format(c->closed_error, "%s() on a closed %U", method, c->owner);
    return NULL;
}

/* A new reference to the Core's Ring; NULL with no exception set when the Ring is gone, NULL
 * with one on an error. PyWeakref_GetObject (a borrowed reference) is deprecated from Python
 * 3.13 on; PyWeakref_GetRef, new in 3.13, gives a strong one. */
static PyObject *core_ring(Core *c) {
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *ring;
    if (PyWeakref_GetRef(c->ring_ref, &ring) < 0)
        return NULL;
    return ring; /* NULL when the Ring is gone */
#else
    PyObject *ring = PyWeakref_GetObject(c->ring_ref); /* borrowed */
    if (!ring || ring == Py_None)
        return NULL;
    Py_INCREF(ring);
    return ring;
#endif
}

/* Call the Ring's slow path ``which`` with these arguments, the Ring as its self. */
static PyObject *core_delegate(Core *c, int which, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    PyObject *ring = core_ring(c);
    if (!ring)
        return PyErr_Occurred() ? NULL : core_closed(c, slow_for[which]);
    PyObject *meth = PyMethod_New(c->slow[which], ring);
    Py_DECREF(ring);
    if (!meth)
        return NULL;
    PyObject *ret = PyObject_Vectorcall(meth, args, nargsf, kwnames);
    Py_DECREF(meth);
    return ret;
}

static const char *const field_names[] = {"opcode", "fd", "addr", "length", "off",
                                          "user_data", "flags", "ioprio", "op_flags",
                                          "buf_index", "file_index", "addr3"};
enum { F_OPCODE, F_FD, F_ADDR, F_LEN, F_OFF, F_UD, F_FLAGS, F_IOPRIO, F_OPFLAGS, F_BUFINDEX,
       F_FILEINDEX, F_ADDR3, F_N };
/* the largest value each field holds; fd is signed (checked separately) */
static const unsigned long long field_max[F_N] = {
    0xFF, 0, ~0ULL, 0xFFFFFFFFULL, ~0ULL, ~0ULL, 0xFF, 0xFFFF, 0xFFFFFFFFULL, 0xFFFF,
    0xFFFFFFFFULL, ~0ULL};

/* Sort the arguments into given[field]: positional ones in the order ``pos``, keywords whose
 * field is in ``kw_ok``. Returns 0 for anything else (the Python method then decides). */
static int gather(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const int *pos,
                  int npos, unsigned kw_ok, PyObject **given) {
    if (nargs < 1 || nargs > npos)
        return 0;
    for (Py_ssize_t i = 0; i < nargs; i++)
        given[pos[i]] = args[i];
    if (!kwnames)
        return 1;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int j = F_N;
        for (int i = 0; i < F_N; i++)
            if ((kw_ok >> i) & 1 && PyUnicode_CompareWithASCIIString(name, field_names[i]) == 0) {
                j = i;
                break;
            }
        if (j == F_N || given[j])
            return 0;
        given[j] = args[nargs + k];
    }
    return 1;
}

/* Convert the scalar fields (all but ``skip``); 0 when one is not an int or out of range. */
static int convert(PyObject **given, int skip, unsigned long long *v, int32_t *fd) {
    *fd = -1;
    for (int i = 0; i < F_N; i++) {
        if (!given[i] || i == skip)
            continue;
        if (!PyLong_CheckExact(given[i]))
            return 0;
        if (i == F_FD) {
            long long x = PyLong_AsLongLong(given[i]);
            if ((x == -1 && PyErr_Occurred()) || x < INT32_MIN || x > INT32_MAX) {
                PyErr_Clear();
                return 0;
            }
            *fd = (int32_t)x;
            continue;
        }
        v[i] = PyLong_AsUnsignedLongLong(given[i]);
        if ((v[i] == (unsigned long long)-1 && PyErr_Occurred()) || v[i] > field_max[i]) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* The 64-byte struct io_uring_sqe, every byte written (as the Python path does). */
static void write_sqe(unsigned char *s, const unsigned long long *v, int32_t fd) {
    uint8_t u8;
    uint16_t u16;
    uint32_t u32;
    uint64_t u64;
    u8 = (uint8_t)v[F_OPCODE]; memcpy(s + 0, &u8, 1);
    u8 = (uint8_t)v[F_FLAGS]; memcpy(s + 1, &u8, 1);
    u16 = (uint16_t)v[F_IOPRIO]; memcpy(s + 2, &u16, 2);
    memcpy(s + 4, &fd, 4);
    u64 = v[F_OFF]; memcpy(s + 8, &u64, 8);
    u64 = v[F_ADDR]; memcpy(s + 16, &u64, 8);
    u32 = (uint32_t)v[F_LEN]; memcpy(s + 24, &u32, 4);
    u32 = (uint32_t)v[F_OPFLAGS]; memcpy(s + 28, &u32, 4);
    u64 = v[F_UD]; memcpy(s + 32, &u64, 8);
    u16 = (uint16_t)v[F_BUFINDEX]; memcpy(s + 40, &u16, 2);
    u16 = 0; memcpy(s + 42, &u16, 2); /* personality */
    u32 = (uint32_t)v[F_FILEINDEX]; memcpy(s + 44, &u32, 4);
    u64 = v[F_ADDR3]; memcpy(s + 48, &u64, 8);
    u64 = 0; memcpy(s + 56, &u64, 8);
}

static const int prep_pos[] = {F_OPCODE, F_FD, F_ADDR, F_LEN, F_OFF, F_UD};

/* prep(opcode, fd=-1, addr=0, length=0, off=0, user_data=0, *, flags=0, ioprio=0,
 *      op_flags=0, buf_index=0, file_index=0, addr3=0) -> slot */
static PyObject *core_prep(Core *c, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    unsigned long long v[F_N] = {0};
    PyObject *given[F_N] = {NULL};
    int32_t fd;
    if (c->closed)
        return core_closed(c, "prep");
    if (c->sqe_size != 64 || /* write_sqe fills 64 bytes; the Python path zeroes 128 */
        !gather(args, PyVectorcall_NARGS(nargsf), kwnames, prep_pos, 6,
                ((1u << F_N) - 1) & ~1u, given) || !convert(given, -1, v, &fd))
        goto slow;
    unsigned tail = *c->ktail;
    if (tail - __atomic_load_n(c->khead, __ATOMIC_RELAXED) >= c->sq_entries)
        goto slow; /* full: the Python method submits to make room */
    unsigned slot = tail & c->sq_mask;
    write_sqe((unsigned char *)c->sqes + (size_t)slot * c->sqe_size, v, fd);
    /* The kernel reads ktail only inside our own io_uring_enter, so publishing it here is
     * the same as publishing it at submit. */
    __atomic_store_n(c->ktail, tail + 1, __ATOMIC_RELEASE);
    return PyLong_FromUnsignedLong(slot);
slow:
    return core_delegate(c, SLOW_PREP, args, nargsf, kwnames);
}

static const int batch_pos[] = {F_OPCODE, F_UD};

/* prep_batch(opcode, user_data, *, fd=-1, addr=0, length=0, flags=0, ioprio=0, op_flags=0,
 *            buf_index=0): user_data a contiguous 1-D buffer of 8-byte unsigned ints; array
 * addr or length (and anything else) go to the Python method. */
static PyObject *core_prep_batch(Core *c, PyObject *const *args, size_t nargsf,
                                 PyObject *kwnames) {
    unsigned long long v[F_N] = {0};
    PyObject *given[F_N] = {NULL};
    int32_t fd;
    Py_buffer ud;
    if (c->closed)
        return core_closed(c, "prep_batch");
    unsigned kw_ok = 1u << F_UD | 1u << F_FD | 1u << F_ADDR | 1u << F_LEN | 1u << F_FLAGS |
                     1u << F_IOPRIO | 1u << F_OPFLAGS | 1u << F_BUFINDEX;
    if (c->sqe_size != 64 ||
        !gather(args, PyVectorcall_NARGS(nargsf), kwnames, batch_pos, 2, kw_ok, given) ||
        !given[F_UD] || !convert(given, F_UD, v, &fd))
        goto slow;
    if (PyObject_GetBuffer(given[F_UD], &ud, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        goto slow;
    }
    if (c->closed) { /* a Python __buffer__ (3.12+) can close the ring: it is unmapped now */
        PyBuffer_Release(&ud);
        return core_closed(c, "prep_batch");
    }
    const char *f = ud.format ? ud.format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    if (ud.ndim != 1 || ud.itemsize != 8 || !(f[0] == 'Q' || f[0] == 'L') || f[1]) {
        PyBuffer_Release(&ud);
        goto slow;
    }
    Py_ssize_t n = ud.shape[0];
    unsigned tail = *c->ktail;
    if (n == 0 || (Py_ssize_t)(c->sq_entries - (tail - __atomic_load_n(c->khead,
                                                                        __ATOMIC_RELAXED))) < n) {
        PyBuffer_Release(&ud);
        goto slow; /* nothing to do, or the Python method submits to make room */
    }
    unsigned char tmpl[64];
    write_sqe(tmpl, v, fd);
    const uint64_t *uds = ud.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char *s = (unsigned char *)c->sqes + (size_t)((tail + i) & c->sq_mask) *
                                                          c->sqe_size;
        memcpy(s, tmpl, 64);
        memcpy(s + 32, &uds[i], 8);
    }
    PyBuffer_Release(&ud);
    __atomic_store_n(c->ktail, tail + (unsigned)n, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
slow:
    return core_delegate(c, SLOW_PREP_BATCH, args, nargsf, kwnames);
}

/* One enter; with a wait the GIL is released, and the enter counts in ``users`` meanwhile: a
 * Ring closed by another thread then leaves its fd open until the last such enter is over
 * (core_enter_done), so the number the kernel reads is still this ring's. */
static long sys_enter(Core *c, unsigned n, unsigned wait_nr) {
    long ret;
    unsigned flags = wait_nr ? 1u /* IORING_ENTER_GETEVENTS */ : 0u;
    if (wait_nr) {
        int fd = c->fd;
        c->users++;
        Py_BEGIN_ALLOW_THREADS
        ret = syscall(__NR_io_uring_enter, fd, n, wait_nr, flags, NULL, (size_t)0);
        Py_END_ALLOW_THREADS
        c->users--;
    } else {
        ret = syscall(__NR_io_uring_enter, c->fd, n, wait_nr, flags, NULL, (size_t)0);
    }
    return ret;
}

/* After an enter on a ring closed meanwhile: the last one hands the fd back to the Ring's
 * close (Ring._release_fd); an error there is raised instead of ClosedError. */
static int core_enter_done(Core *c) {
    if (c->users || !c->closer)
        return 0;
    PyObject *ring = c->closer;
    c->closer = NULL;
    PyObject *r = PyObject_CallOneArg(c->slow[SLOW_RELEASE_FD], ring);
    Py_DECREF(ring);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* submit(wait_nr=0, timeout=None) -> SQEs the kernel consumed */
static PyObject *core_submit(Core *c, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (c->closed)
        return core_closed(c, "submit");
    if (kwnames || nargs > 2 || (nargs == 2 && args[1] != Py_None))
        goto slow;
    unsigned long wait_nr = 0;
    if (nargs >= 1) {
        if (!PyLong_CheckExact(args[0]))
            goto slow;
        wait_nr = PyLong_AsUnsignedLong(args[0]);
        if ((wait_nr == (unsigned long)-1 && PyErr_Occurred()) || wait_nr > 0xFFFFFFFFUL) {
            PyErr_Clear();
            goto slow;
        }
    }
    unsigned n = *c->ktail - __atomic_load_n(c->khead, __ATOMIC_RELAXED);
    long ret = sys_enter(c, n, (unsigned)wait_nr);
    if (c->closed) /* closed by another thread while we waited without the GIL: unmapped */
        return core_enter_done(c) < 0 ? NULL : core_closed(c, "submit");
    if (ret >= 0 && !wait_nr)
        return PyLong_FromLong(ret);
    if (ret == (long)n &&
        __atomic_load_n(c->kcq_tail, __ATOMIC_ACQUIRE) - *c->kcq_head >= wait_nr)
        return PyLong_FromLong(ret);
    /* a signal, a short submit, an error: the Python slow path, from the count before */
    {
        PyObject *pyargs[3] = {NULL, NULL, NULL};
        pyargs[0] = PyLong_FromUnsignedLong(n);
        pyargs[1] = PyLong_FromUnsignedLong(wait_nr);
        pyargs[2] = Py_None;
        if (!pyargs[0] || !pyargs[1]) {
            Py_XDECREF(pyargs[0]);
            Py_XDECREF(pyargs[1]);
            return NULL;
        }
        PyObject *r = core_delegate(c, SLOW_SUBMIT_SLOW, pyargs, 3, NULL);
        Py_DECREF(pyargs[0]);
        Py_DECREF(pyargs[1]);
        return r;
    }
slow:
    return core_delegate(c, SLOW_SUBMIT, args, nargsf, kwnames);
}

/* reap_one() -> (user_data, res, flags) or None */
static PyObject *core_reap_one(Core *c, PyObject *unused) {
    if (c->closed)
        return core_closed(c, "reap_one");
    unsigned head = *c->kcq_head;
    if (__atomic_load_n(c->kcq_tail, __ATOMIC_ACQUIRE) == head)
        Py_RETURN_NONE;
    const unsigned char *cqe = cqe_at((const unsigned char *)c->cqes, head, c->cq_mask,
                                      c->cqe_size);
    if (c->f32) { /* mixed: pads stepped over, a 32-byte entry takes two slots */
        unsigned char wide[CQE32_SIZE];
        uint32_t used, slots = __atomic_load_n(c->kcq_tail, __ATOMIC_ACQUIRE) - head;
        if (slots > c->cq_mask + 1) /* a head out of step (cq_addresses): one lap at most */
            slots = c->cq_mask + 1;
        uint32_t n = cqes_widen((const unsigned char *)c->cqes, head, slots, c->cq_mask,
                                c->f32, c->fskip, wide, 1, &used);
        __atomic_store_n(c->kcq_head, head + used, __ATOMIC_RELEASE);
        if (!n)
            Py_RETURN_NONE;
        return cqe_tuple(cqe_user_data(wide), cqe_res(wide), cqe_flags(wide));
    }
    uint64_t ud = cqe_user_data(cqe);
    int32_t res = cqe_res(cqe);
    uint32_t flags = cqe_flags(cqe);
    __atomic_store_n(c->kcq_head, head + 1, __ATOMIC_RELEASE);
    return cqe_tuple(ud, res, flags);
}

/* As Completions.from_raw: the copy, its count and kind; the rest decoded on first use. Takes
 * the reference to ``raw``. */
static PyObject *core_completions(Core *c, PyObject *raw, unsigned n) {
    PyObject *pn = PyLong_FromUnsignedLong(n);
    PyObject *ret = pn ? c->comp->tp_alloc(c->comp, 0) : NULL;
    if (!ret) {
        Py_XDECREF(pn);
        Py_DECREF(raw);
        return NULL;
    }
    set_slot(ret, c->comp_off[0], raw);
    set_slot(ret, c->comp_off[1], pn);
    set_slot(ret, c->comp_off[2], Py_NewRef(c->cqe32 ? Py_True : Py_False));
    for (int i = 3; i < 8; i++)
        set_slot(ret, c->comp_off[i], Py_NewRef(Py_None));
    return ret;
}

/* reap(max_n=None) -> Completions: every ready CQE (up to max_n), one bytes copy (a mixed
 * ring's widened to 32 bytes each) */
static PyObject *core_reap(Core *c, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (c->closed)
        return core_closed(c, "reap");
    unsigned head = *c->kcq_head;
    unsigned slots = __atomic_load_n(c->kcq_tail, __ATOMIC_ACQUIRE) - head;
    unsigned n = slots; /* at most this many entries */
    if (kwnames || nargs > 1)
        return core_delegate(c, SLOW_REAP, args, nargsf, kwnames);
    if (nargs == 1 && args[0] != Py_None) {
        if (!PyLong_CheckExact(args[0]))
            return core_delegate(c, SLOW_REAP, args, nargsf, kwnames);
        long long m = PyLong_AsLongLong(args[0]);
        if (m == -1 && PyErr_Occurred()) {
            PyErr_Clear(); /* too big for C: the Python method takes it */
            return core_delegate(c, SLOW_REAP, args, nargsf, kwnames);
        }
        if (m < (long long)n)
            n = m < 0 ? 0 : (unsigned)m;
    }
    if (slots > c->cq_mask + 1) /* a head out of step (written through cq_addresses): no copy */
        return core_delegate(c, SLOW_REAP, args, nargsf, kwnames);
    if (c->f32) { /* mixed: entries widened, pads dropped */
        PyObject *raw = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)n * CQE32_SIZE);
        if (!raw)
            return NULL;
        unsigned used;
        n = cqes_widen((const unsigned char *)c->cqes, head, slots, c->cq_mask, c->f32,
                       c->fskip, (unsigned char *)PyByteArray_AS_STRING(raw), n, &used);
        __atomic_store_n(c->kcq_head, head + used, __ATOMIC_RELEASE); /* the copy is done */
        if (PyByteArray_Resize(raw, (Py_ssize_t)n * CQE32_SIZE) < 0) {
            Py_DECREF(raw);
            return NULL;
        }
        return core_completions(c, raw, n);
    }
    size_t sz = c->cqe_size, ring_bytes = (size_t)(c->cq_mask + 1) * sz;
    size_t start = (size_t)(head & c->cq_mask) * sz, len = (size_t)n * sz;
    PyObject *raw = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (!raw)
        return NULL;
    char *dst = PyByteArray_AS_STRING(raw);
    if (start + len <= ring_bytes) {
        memcpy(dst, c->cqes + start, len);
    } else {
        memcpy(dst, c->cqes + start, ring_bytes - start);
        memcpy(dst + (ring_bytes - start), c->cqes, len - (ring_bytes - start));
    }
    __atomic_store_n(c->kcq_head, head + n, __ATOMIC_RELEASE); /* the copy above is done */
    return core_completions(c, raw, n);
}

/* close(ring=None): from now on every method raises ClosedError (call before unmapping).
 * With an enter in flight (``users``) the Core keeps ``ring`` until that enter is over and then
 * calls its _release_fd, which closes the fd (the Ring leaves it open while ``users``). */
static PyObject *core_close(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "close(ring=None)");
        return NULL;
    }
    c->closed = 1;
    if (nargs && args[0] != Py_None && c->users)
        Py_XSETREF(c->closer, Py_NewRef(args[0]));
    Py_RETURN_NONE;
}

static PyMemberDef core_members[] = {
    {"users", T_INT, offsetof(Core, users), READONLY,
     "enters in flight with the GIL released (the fd must stay open)"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef core_methods[] = {
    {"prep", (PyCFunction)(void (*)(void))core_prep, METH_FASTCALL | METH_KEYWORDS,
     "prep($self, /, opcode, fd=-1, addr=0, length=0, off=0, user_data=0, *, flags=0, "
     "ioprio=0, op_flags=0, buf_index=0, file_index=0, addr3=0)\n--\n\n"
     "Fill one SQE; returns the slot index (Ring.prep)."},
    {"submit", (PyCFunction)(void (*)(void))core_submit, METH_FASTCALL | METH_KEYWORDS,
     "submit($self, /, wait_nr=0, timeout=None)\n--\n\n"
     "Publish pending SQEs and enter (Ring.submit)."},
    {"prep_batch", (PyCFunction)(void (*)(void))core_prep_batch, METH_FASTCALL | METH_KEYWORDS,
     "prep_batch($self, /, opcode, user_data, *, fd=-1, addr=0, length=0, flags=0, ioprio=0, "
     "op_flags=0, buf_index=0)\n--\n\n"
     "Fill len(user_data) SQEs of one opcode (Ring.prep_batch)."},
    {"reap", (PyCFunction)(void (*)(void))core_reap, METH_FASTCALL | METH_KEYWORDS,
     "reap($self, /, max_n=None)\n--\n\n"
     "Take every ready CQE (up to max_n) as Completions (Ring.reap)."},
    {"reap_one", (PyCFunction)core_reap_one, METH_NOARGS,
     "reap_one($self, /)\n--\n\n"
     "The oldest ready CQE as (user_data, res, flags), or None (Ring.reap_one)."},
    {"close", (PyCFunction)(void (*)(void))core_close, METH_FASTCALL,
     "close($self, ring=None, /)\n--\n\n"
     "Refuse every later call (ring: whose _release_fd to call after an enter in flight)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "zcnet.uring._accel.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Core(ring, closed_error, completions_of, completions_slots, keep, slow, cqe32, f32, "
              "fskip, fd, "
              "sq_addr, khead, ktail, cq_addr, kcq_head, kcq_tail, sqes_addr, sq_mask, "
              "sq_entries, sqe_size, cqes_addr, cq_mask, cqe_size, closed, /)\n--\n\n"
              "The Ring's hot methods over its mapped memory (zcnet.uring.accel_bind makes it).",
    .tp_new = core_new,
    .tp_init = (initproc)core_init,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_methods = core_methods,
    .tp_members = core_members,
};

/* Each entry point and its Python twin (tests/test_twins.py holds them to the Python side). */
static const Twin twins[] = {
    {"enter", "zcnet.uring.syscall.io_uring_enter"},
    {"Core", "zcnet.uring.ring.Ring"},
    {"buf_provide", "zcnet.uring.bufring.BufRing.provide"},
    {"buf_in_step", "zcnet.uring.bufring.BufRing.take"},
    {NULL, NULL},
};

static PyMethodDef accel_methods[] = {
    {"enter", (PyCFunction)(void (*)(void))accel_enter, METH_FASTCALL,
     "enter($module, fd, to_submit, min_complete, flags, arg, argsz, /)\n--\n\n"
     "One io_uring_enter: the kernel's result, or -errno."},
    CQE_LAYOUT_METHOD,
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef accel_module = {
    PyModuleDef_HEAD_INIT, "zcnet.uring._accel",
    "The optional compiled half of zcnet's io_uring hot path.", -1, accel_methods,
};

PyMODINIT_FUNC PyInit__accel(void) {
    if (PyType_Ready(&CoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&accel_module);
    if (!m)
        return NULL;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    if (bufring_add(m) < 0 || add_twins(m, twins) < 0) { /* _accel_bufring.c's functions */
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
