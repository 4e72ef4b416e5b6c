/* zcnet.uring._accel, the provided-buffer ring's half (see _accel.c for the module): BufRing's
 * batch writes (buf_provide), its in-step check (buf_in_step) and a soft receive's common round
 * over the CQEs' copy (soft_round, BufRing.take_round: the C twin of the soft provider's round
 * function's vectorized path). Each takes only the common case and leaves the rest to the
 * Python code it stands for, whose checks and errors are the user's. */
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

/* The entries of a provided-buffer ring (_bufring.h): ``entries`` (a power of two) from the
 * start of ``mem``. */
static unsigned char *buf_ring_of(PyObject *mem_obj, PyObject *entries_obj, Py_buffer *mem,
                                  int flags, Py_ssize_t *entries) {
    *entries = PyLong_AsSsize_t(entries_obj);
    if (*entries == -1 && PyErr_Occurred())
        return NULL;
    if (PyObject_GetBuffer(mem_obj, mem, flags) < 0)
        return NULL;
    if (*entries <= 0 || (*entries & (*entries - 1)) || *entries > mem->len / BUF_ENTRY_SIZE) {
        PyBuffer_Release(mem);
        PyErr_SetString(PyExc_ValueError, "a buffer ring of that many entries does not fit");
        return NULL;
    }
    return mem->buf;
}

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

/* A provider's common round, read from the CQEs' copy (Completions.raw) in one pass: every
 * CQE is data of request ``recv_ud`` and the last has ``f_more`` (the multishot goes on; soft
 * also takes a last one that ends it). The
 * records go out as bytes for one numpy view: no numpy call per field and no Python object
 * per buffer. Anything else returns None and the provider's numpy path takes the round, with
 * its checks and errors. */

/* The records returned, as numpy reads them (ROUND_RECORD in zcnet.uring.bufring); natural alignment leaves no padding but ``pad``. */
typedef struct {
    int64_t offset;
    int32_t length;
    uint16_t bid, pad;
} SoftRecord;

_Static_assert(sizeof(SoftRecord) == 16, "record layout");

/* soft_round(raw, n, cqe_size, recv_ud, f_more, f_buffer, shift, mem, entries, head,
 *            buf_size, base) -> (records, count, final), or None
 *
 * A provided-buffer multishot's round where each CQE filled one buffer (F_BUFFER, 0 < res <=
 * buf_size) and the buffers are the ring's next ones from ``head`` (``mem``: the buffer
 * ring's entries, as in buf_in_step). ``records`` holds ``count`` of {i64 offset, i32 length,
 * u16 bid, u16 0}, offset = base + bid * buf_size. The last CQE may end the multishot (no
 * ``f_more``): ``final`` is then its res (data as above when > 0, else EOF or -errno with no
 * buffer), otherwise None. */
static PyObject *accel_soft_round(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "soft_round(raw, n, cqe_size, recv_ud, f_more, "
                                         "f_buffer, shift, mem, entries, head, buf_size, base)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[1]), size = PyLong_AsSsize_t(args[2]);
    unsigned long long ud = PyLong_AsUnsignedLongLong(args[3]),
                       f_more = PyLong_AsUnsignedLongLong(args[4]),
                       f_buffer = PyLong_AsUnsignedLongLong(args[5]),
                       shift = PyLong_AsUnsignedLongLong(args[6]),
                       head = PyLong_AsUnsignedLongLong(args[9]),
                       bs = PyLong_AsUnsignedLongLong(args[10]),
                       base = PyLong_AsUnsignedLongLong(args[11]);
    if (PyErr_Occurred())
        return NULL;
    if (!cqe_size_valid(size)) {
        PyErr_SetString(PyExc_ValueError, "soft_round: a CQE is 16 or 32 bytes");
        return NULL;
    }
    Py_buffer cb, mem;
    Py_ssize_t entries;
    const unsigned char *c = cqes_of(args[0], n, size, &cb);
    if (!c) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    unsigned char *e = buf_ring_of(args[7], args[8], &mem, PyBUF_SIMPLE, &entries);
    if (!e) {
        PyBuffer_Release(&cb);
        return NULL;
    }
    PyObject *out = n <= entries ? PyBytes_FromStringAndSize(NULL, n * sizeof(SoftRecord))
                                 : Py_NewRef(Py_None);
    Py_ssize_t k = 0;        /* records written; -1: not the common round */
    int32_t final = INT32_MIN; /* the last CQE's res when it ends the multishot */
    if (out && out != Py_None) {
        unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
        unsigned long long mask = (unsigned long long)entries - 1;
        for (Py_ssize_t i = 0; i < n; i++) {
            const unsigned char *q = c + i * size; /* record k: CQE i, if data */
            uint64_t u = cqe_user_data(q);
            int32_t res = cqe_res(q);
            uint32_t flags = cqe_flags(q);
            uint16_t bid = cqe_buffer_id(flags, (unsigned)shift);
            if (i == n - 1 && !(flags & f_more)) { /* the multishot's end */
                final = res;
                if (res <= 0) { /* EOF or an errno: no buffer */
                    if (u != ud || (flags & f_buffer))
                        k = -1;
                    break;
                }
            }
            if (u != ud || !(flags & f_buffer) || res <= 0 || (unsigned long long)res > bs ||
                bid != buf_bid(buf_entry(e, head + i, mask))) {
                k = -1;
                break;
            }
            SoftRecord rec = {(int64_t)(base + bid * bs), res, bid, 0};
            memcpy(o + k++ * sizeof rec, &rec, sizeof rec);
        }
    }
    PyBuffer_Release(&mem);
    PyBuffer_Release(&cb);
    if (!out || out == Py_None)
        return out;
    if (k < 0) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    if (final == INT32_MIN)
        return Py_BuildValue("(NnO)", out, k, Py_None);
    return Py_BuildValue("(Nni)", out, k, final);
}

static PyMethodDef bufring_methods[] = {
    BUFRING_LAYOUT_METHOD,
    {"soft_round", (PyCFunction)(void (*)(void))accel_soft_round, METH_FASTCALL,
     "soft_round($module, raw, n, cqe_size, recv_ud, f_more, f_buffer, shift, mem, entries, "
     "head, buf_size, base, /)\n--\n\n"
     "A soft receive's common round: (records, count, final), or None."},
    {"buf_provide", (PyCFunction)(void (*)(void))accel_buf_provide, METH_FASTCALL,
     "buf_provide($module, mem, entries, tail, bids, base, buf_size, /)\n--\n\n"
     "Publish bids to the buffer ring: the new tail, or None."},
    {"buf_in_step", (PyCFunction)(void (*)(void))accel_buf_in_step, METH_FASTCALL,
     "buf_in_step($module, mem, entries, head, bids, /)\n--\n\n"
     "Whether bids are the ring's entries from head on, in order."},
    {NULL, NULL, 0, NULL},
};

int bufring_add(PyObject *m) { return PyModule_AddFunctions(m, bufring_methods); }
