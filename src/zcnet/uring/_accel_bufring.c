/* zcnet.uring._accel, the provided-buffer ring's half (see _accel.c for the module): BufRing's
 * batch writes (buf_provide) and its in-step check (buf_in_step). Each takes only the common
 * case and leaves the rest to the Python code it stands for, whose checks and errors are the
 * user's. (The soft provider's round over a ring's CQEs is the receive core's:
 * zcnet.rx.zc._rxaccel.soft_round.) */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_accel.h"
#include "_bufring.h"
#include "_cqe.h"
#include "_ints.h"

/* --- ring memory the application writes: the provided-buffer ring ---
 *
 * The batch paths' writes in one C call each instead of a handful of numpy calls. Memory comes
 * as a writable buffer (the ring's memoryview), every index is bounds-checked against it, and
 * any input they do not take (a bid out of range, a full ring, an element type they do not
 * read) returns None so the Python path runs with its errors. The callers make the same open
 * checks before as before their numpy writes. */

/* A call's ring (args 0 and 1: buf_ring_of) and ids (arg 3: load_ints). Returns the count of
 * ids, or -1 with an error set, or NOT_INTS; on either, nothing is held. */
static Py_ssize_t ring_and_ids(PyObject *const *args, int flags, Py_buffer *mem,
                               unsigned char **e, Py_ssize_t *entries, unsigned long long **v) {
    if (!(*e = buf_ring_of(args[0], args[1], mem, flags, entries)))
        return -1;
    Py_ssize_t n = load_ints(args[3], v);
    if (n < 0)
        PyBuffer_Release(mem);
    return n;
}

/* buf_provide(mem, entries, tail, bids, base, buf_size) -> new tail, or None
 *
 * Publish ``bids``: entry (tail + i) & mask gets buffer bids[i] at base + bid * buf_size,
 * then the tail goes in with a release store, so the kernel sees the entries first. None
 * (nothing written) when a bid is not below ``entries``. */
static PyObject *accel_buf_provide(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "buf_provide(mem, entries, tail, bids, base, buf_size)");
        return NULL;
    }
    unsigned long long tail = PyLong_AsUnsignedLongLong(args[2]),
                       base = PyLong_AsUnsignedLongLong(args[4]),
                       bs = PyLong_AsUnsignedLongLong(args[5]), *v;
    if (PyErr_Occurred())
        return NULL;
    Py_buffer mem;
    Py_ssize_t entries;
    unsigned char *e;
    Py_ssize_t n = ring_and_ids(args, PyBUF_WRITABLE, &mem, &e, &entries, &v);
    if (n < 0) {
        if (n == -1)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *ret = NULL;
    Py_ssize_t i = 0;
    while (i < n && v[i] < (unsigned long long)entries)
        i++;
    if (i < n) { /* a bad bid writes nothing */
        ret = Py_NewRef(Py_None);
    } else {
        unsigned long long mask = (unsigned long long)entries - 1;
        uint32_t len = (uint32_t)bs;
        for (i = 0; i < n; i++)
            buf_put(buf_entry(e, tail + i, mask), base + v[i] * bs, len, (uint16_t)v[i]);
        tail = (tail + n) & 0xFFFF;
        buf_publish_tail(e, (uint16_t)tail);
        ret = PyLong_FromUnsignedLongLong(tail);
    }
    PyMem_Free(v);
    PyBuffer_Release(&mem);
    return ret;
}

/* buf_in_step(mem, entries, head, bids) -> bool
 *
 * Whether ``bids`` are the ids of the entries from ``head`` on, in ring order: the buffers
 * the kernel consumes next (False also for a sequence this does not read). */
static PyObject *accel_buf_in_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "buf_in_step(mem, entries, head, bids)");
        return NULL;
    }
    unsigned long long head = PyLong_AsUnsignedLongLong(args[2]), *v;
    if (PyErr_Occurred())
        return NULL;
    Py_buffer mem;
    Py_ssize_t entries;
    unsigned char *e;
    Py_ssize_t n = ring_and_ids(args, PyBUF_SIMPLE, &mem, &e, &entries, &v);
    if (n < 0) {
        if (n == -1)
            return NULL;
        Py_RETURN_FALSE;
    }
    unsigned long long mask = (unsigned long long)entries - 1;
    int same = n <= entries;
    for (Py_ssize_t i = 0; same && i < n; i++)
        same = v[i] == buf_bid(buf_entry(e, head + i, mask));
    PyMem_Free(v);
    PyBuffer_Release(&mem);
    return PyBool_FromLong(same);
}

static PyMethodDef bufring_methods[] = {
    BUFRING_LAYOUT_METHOD,
    {"buf_provide", (PyCFunction)(void (*)(void))accel_buf_provide, METH_FASTCALL,
     "buf_provide($module, mem, entries, tail, bids, base, buf_size, /)\n--\n\n"
     "Publish bids to the buffer ring: the new tail, or None."},
    {"buf_in_step", (PyCFunction)(void (*)(void))accel_buf_in_step, METH_FASTCALL,
     "buf_in_step($module, mem, entries, head, bids, /)\n--\n\n"
     "Whether bids are the ring's entries from head on, in order."},
    {NULL, NULL, 0, NULL},
};

int bufring_add(PyObject *m) { return PyModule_AddFunctions(m, bufring_methods); }
