/* zcnet.uring._accel: the optional compiled half of the ring's hot path.
 *
 * Only what pure Python cannot do fast enough lives here: the io_uring_enter syscall without
 * ctypes' argument conversion (about 0.35 us per call). Every check that protects the user
 * (closed ring, bad arguments) stays in Python; these functions trust their caller, which is
 * zcnet.uring.ring, and only ever touch memory through the buffer protocol.
 *
 * Built at install time when a C compiler exists (setup.py, optional); without it, or with
 * ZCNET_PURE=1 in the environment, zcnet runs the pure-Python path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

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
 * accelerator (Ring.prep, .submit, .reap_one). The Ring keeps its mappings alive while the Core
 * is open and closes the Core before unmapping; after that every method raises the same
 * ClosedError as the Python methods. Anything off the common path (keywords it does not know,
 * a value out of range, a full SQ, a timeout, a short submit or a failed enter) is handed to
 * the Ring's Python method of the same job, so errors and their messages are the Python
 * path's own. */
typedef struct {
    PyObject_HEAD
    int fd, closed;
    unsigned *khead, *ktail, *kcq_head, *kcq_tail;
    char *sqes, *cqes;
    unsigned sq_mask, cq_mask, sq_entries, sqe_size, cqe_size;
    PyObject *ring_ref;     /* weakref to the Ring: its slow paths */
    PyObject *closed_error; /* zcnet.errors.ClosedError */
    PyObject *owner;        /* the Ring's type name, for the error message */
} Core;

static void core_dealloc(Core *c) {
    Py_XDECREF(c->ring_ref);
    Py_XDECREF(c->closed_error);
    Py_XDECREF(c->owner);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int core_init(Core *c, PyObject *args, PyObject *kw) {
    unsigned long long sq, cq, sqes, cqes;
    unsigned khead, ktail, kcq_head, kcq_tail;
    PyObject *ring, *err;
    if (!PyArg_ParseTuple(args, "OOiKIIKIIKIIIKIII", &ring, &err, &c->fd, &sq, &khead, &ktail,
                          &cq, &kcq_head, &kcq_tail, &sqes, &c->sq_mask, &c->sq_entries,
                          &c->sqe_size, &cqes, &c->cq_mask, &c->cqe_size, &c->closed))
        return -1;
    c->khead = (unsigned *)(uintptr_t)(sq + khead);
    c->ktail = (unsigned *)(uintptr_t)(sq + ktail);
    c->kcq_head = (unsigned *)(uintptr_t)(cq + kcq_head);
    c->kcq_tail = (unsigned *)(uintptr_t)(cq + kcq_tail);
    c->sqes = (char *)(uintptr_t)sqes;
    c->cqes = (char *)(uintptr_t)cqes;
    Py_XSETREF(c->ring_ref, PyWeakref_NewRef(ring, NULL));
    if (!c->ring_ref)
        return -1;
    Py_INCREF(err);
    Py_XSETREF(c->closed_error, err);
    Py_XSETREF(c->owner, PyUnicode_FromString(Py_TYPE(ring)->tp_name));
    return c->owner ? 0 : -1;
}

static PyObject *core_closed(Core *c, const char *method) {
    PyErr_Format(c->closed_error, "%s() on a closed %U", method, c->owner);
    return NULL;
}

/* Call the Ring's Python method ``name`` with these arguments (the slow path). */
static PyObject *core_delegate(Core *c, const char *name, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    PyObject *ring = PyWeakref_GetObject(c->ring_ref); /* borrowed */
    if (ring == Py_None)
        return core_closed(c, name);
    PyObject *meth = PyObject_GetAttrString(ring, name);
    if (!meth)
        return NULL;
    PyObject *ret = PyObject_Vectorcall(meth, args, nargsf, kwnames);
    Py_DECREF(meth);
    return ret;
}

static const char *const prep_names[] = {"opcode", "fd", "addr", "length", "off", "user_data",
                                         "flags", "ioprio", "op_flags", "buf_index",
                                         "file_index", "addr3"};
#define PREP_N 12
/* the largest value each field holds; fd is signed (checked separately) */
static const unsigned long long prep_max[PREP_N] = {
    0xFF, 0, ~0ULL, 0xFFFFFFFFULL, ~0ULL, ~0ULL, 0xFF, 0xFFFF, 0xFFFFFFFFULL, 0xFFFF,
    0xFFFFFFFFULL, ~0ULL};

/* prep(opcode, fd=-1, addr=0, length=0, off=0, user_data=0, *, flags=0, ioprio=0,
 *      op_flags=0, buf_index=0, file_index=0, addr3=0) -> slot */
static PyObject *core_prep(Core *c, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    unsigned long long v[PREP_N] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    long long fd = -1;
    PyObject *given[PREP_N] = {NULL};
    if (c->closed)
        return core_closed(c, "prep");
    if (nargs < 1 || nargs > 6)
        goto slow;
    for (Py_ssize_t i = 0; i < nargs; i++)
        given[i] = args[i];
    if (kwnames) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t k = 0; k < nk; k++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, k);
            int j = PREP_N;
            for (int i = 1; i < PREP_N; i++)
                if (PyUnicode_CompareWithASCIIString(name, prep_names[i]) == 0) {
                    j = i;
                    break;
                }
            if (j == PREP_N || given[j] || (j < 6 && j < nargs))
                goto slow;
            given[j] = args[nargs + k];
        }
    }
    for (int i = 0; i < PREP_N; i++) {
        if (!given[i])
            continue;
        if (!PyLong_CheckExact(given[i]))
            goto slow;
        if (i == 1) {
            fd = PyLong_AsLongLong(given[i]);
            if ((fd == -1 && PyErr_Occurred()) || fd < INT32_MIN || fd > INT32_MAX)
                goto slow_clear;
            continue;
        }
        v[i] = PyLong_AsUnsignedLongLong(given[i]);
        if ((v[i] == (unsigned long long)-1 && PyErr_Occurred()) || v[i] > prep_max[i])
            goto slow_clear;
    }
    unsigned tail = *c->ktail;
    if (tail - __atomic_load_n(c->khead, __ATOMIC_RELAXED) >= c->sq_entries)
        goto slow; /* full: the Python method submits to make room */
    unsigned slot = tail & c->sq_mask;
    unsigned char *s = (unsigned char *)c->sqes + (size_t)slot * c->sqe_size;
    /* the 64-byte struct io_uring_sqe, every byte written (as the Python path does) */
    uint8_t u8;
    uint16_t u16;
    int32_t i32 = (int32_t)fd;
    uint32_t u32;
    uint64_t u64;
    u8 = (uint8_t)v[0]; memcpy(s + 0, &u8, 1);          /* opcode */
    u8 = (uint8_t)v[6]; memcpy(s + 1, &u8, 1);          /* flags */
    u16 = (uint16_t)v[7]; memcpy(s + 2, &u16, 2);       /* ioprio */
    memcpy(s + 4, &i32, 4);                             /* fd */
    u64 = v[4]; memcpy(s + 8, &u64, 8);                 /* off */
    u64 = v[2]; memcpy(s + 16, &u64, 8);                /* addr */
    u32 = (uint32_t)v[3]; memcpy(s + 24, &u32, 4);      /* len */
    u32 = (uint32_t)v[8]; memcpy(s + 28, &u32, 4);      /* op_flags */
    u64 = v[5]; memcpy(s + 32, &u64, 8);                /* user_data */
    u16 = (uint16_t)v[9]; memcpy(s + 40, &u16, 2);      /* buf_index */
    u16 = 0; memcpy(s + 42, &u16, 2);                   /* personality */
    u32 = (uint32_t)v[10]; memcpy(s + 44, &u32, 4);     /* file_index */
    u64 = v[11]; memcpy(s + 48, &u64, 8);               /* addr3 */
    u64 = 0; memcpy(s + 56, &u64, 8);                   /* pad */
    /* The kernel reads ktail only inside our own io_uring_enter, so publishing it here is
     * the same as publishing it at submit. */
    __atomic_store_n(c->ktail, tail + 1, __ATOMIC_RELEASE);
    return PyLong_FromUnsignedLong(slot);
slow_clear:
    PyErr_Clear();
slow:
    return core_delegate(c, "_prep_py", args, nargsf, kwnames);
}

static long sys_enter(Core *c, unsigned n, unsigned wait_nr) {
    long ret;
    unsigned flags = wait_nr ? 1u /* IORING_ENTER_GETEVENTS */ : 0u;
    if (wait_nr) {
        Py_BEGIN_ALLOW_THREADS
        ret = syscall(__NR_io_uring_enter, c->fd, n, wait_nr, flags, NULL, (size_t)0);
        Py_END_ALLOW_THREADS
    } else {
        ret = syscall(__NR_io_uring_enter, c->fd, n, wait_nr, flags, NULL, (size_t)0);
    }
    return ret;
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
        return core_closed(c, "submit");
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
        PyObject *r = core_delegate(c, "_submit_slow", pyargs, 3, NULL);
        Py_DECREF(pyargs[0]);
        Py_DECREF(pyargs[1]);
        return r;
    }
slow:
    return core_delegate(c, "_submit_py", args, nargsf, kwnames);
}

/* reap_one() -> (user_data, res, flags) or None */
static PyObject *core_reap_one(Core *c, PyObject *unused) {
    if (c->closed)
        return core_closed(c, "reap_one");
    unsigned head = *c->kcq_head;
    if (__atomic_load_n(c->kcq_tail, __ATOMIC_ACQUIRE) == head)
        Py_RETURN_NONE;
    const char *cqe = c->cqes + (size_t)(head & c->cq_mask) * c->cqe_size;
    uint64_t ud;
    int32_t res;
    uint32_t flags;
    memcpy(&ud, cqe, 8);
    memcpy(&res, cqe + 8, 4);
    memcpy(&flags, cqe + 12, 4);
    __atomic_store_n(c->kcq_head, head + 1, __ATOMIC_RELEASE);
    PyObject *t = PyTuple_New(3);
    if (!t)
        return NULL;
    PyObject *a = PyLong_FromUnsignedLongLong(ud), *b = PyLong_FromLong(res),
             *f = PyLong_FromUnsignedLong(flags);
    if (!a || !b || !f) {
        Py_XDECREF(a); Py_XDECREF(b); Py_XDECREF(f); Py_DECREF(t);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, a);
    PyTuple_SET_ITEM(t, 1, b);
    PyTuple_SET_ITEM(t, 2, f);
    return t;
}

/* close(): from now on every method raises ClosedError (call before unmapping) */
static PyObject *core_close(Core *c, PyObject *unused) {
    c->closed = 1;
    Py_RETURN_NONE;
}

static PyMethodDef core_methods[] = {
    {"prep", (PyCFunction)(void (*)(void))core_prep, METH_FASTCALL | METH_KEYWORDS,
     "Fill one SQE; returns the slot index (Ring.prep)."},
    {"submit", (PyCFunction)(void (*)(void))core_submit, METH_FASTCALL | METH_KEYWORDS,
     "Publish pending SQEs and enter (Ring.submit)."},
    {"reap_one", (PyCFunction)core_reap_one, METH_NOARGS,
     "The oldest ready CQE as (user_data, res, flags), or None (Ring.reap_one)."},
    {"close", (PyCFunction)core_close, METH_NOARGS, "Refuse every later call."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "zcnet.uring._accel.Core",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Core(ring, closed_error, fd, sq_addr, khead, ktail, cq_addr, kcq_head, kcq_tail, "
              "sqes_addr, sq_mask, sq_entries, sqe_size, cqes_addr, cq_mask, cqe_size, closed)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)core_init,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_methods = core_methods,
};

static PyMethodDef accel_methods[] = {
    {"enter", (PyCFunction)(void (*)(void))accel_enter, METH_FASTCALL,
     "enter(fd, to_submit, min_complete, flags, arg, argsz) -> result or -errno"},
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
    return m;
}
