/* zcnet.rx.zc._rxaccel: the soft provider's round (the C twin of
 * zcnet.rx.zc.soft_group.SoftGroup.round's vectorized path), read from the CQEs' copy
 * (Completions.raw) in one pass: every CQE is data of request ``recv_ud`` in one buffer, the
 * buffers are the ring's next ones, and the last CQE has ``f_more`` or ends the multishot. The
 * records go out as bytes for one numpy view: no numpy call per field and no Python object per
 * buffer. Anything else returns None and SoftGroup's numpy path takes the round, with its checks
 * and errors. zcnet.uring.bufring.BufRing.take_round calls it and accounts what it took. */
#include "rxaccel.h"

#include <string.h>

#include "_bufring.h"
#include "_cqe.h"

/* The records returned, as numpy reads them (SOFT_RECORD in zcnet.rx.zc.soft_group); natural
 * alignment leaves no padding but ``pad``. */
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
 * ring's entries, zcnet.uring.bufring.BufRing's, checked as its buf_in_step does). ``records`` holds ``count`` of {i64 offset, i32 length,
 * u16 bid, u16 0}, offset = base + bid * buf_size. The last CQE may end the multishot (no
 * ``f_more``): ``final`` is then its res (data as above when > 0, else EOF or -errno with no
 * buffer), otherwise None. */
static PyObject *rx_soft_round(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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

PyMethodDef rx_soft_methods[] = {
    {"soft_round", (PyCFunction)(void (*)(void))rx_soft_round, METH_FASTCALL,
     "soft_round($module, raw, n, cqe_size, recv_ud, f_more, f_buffer, shift, mem, entries, "
     "head, buf_size, base, /)\n--\n\n"
     "A soft receive's common round: (records, count, final), or None."},
    {NULL, NULL, 0, NULL},
};
