/* zcnet.rx.zc._rxaccel: zcrx's ring-memory twins and a round's byte count.
 *
 * refill_push writes zcrx's refill ring (RefillRing.push's common case), zcrx_round parses a
 * RECV_ZC round of CQE32s (the C twin of zcrx's round function, zcrx_rings.parse_completions),
 * int_sum counts a round's bytes (RxCore.deliver_batch). Each returns None for anything but
 * the common case, and the Python code runs with its checks and errors. */
#include "rxaccel.h"

#include <string.h>

#include "_cqe.h"
#include "_ints.h"

typedef struct {
    uint64_t token;
    int64_t offset;
    int32_t length;
    uint32_t pad;
} ZcrxRecord;

_Static_assert(sizeof(ZcrxRecord) == 24, "record layout");

/* refill_push(mem, head_off, tail_off, rqes_off, entries, tail, offs, lens, token, off_mask)
 *     -> new tail, or None
 *
 * zcrx's refill ring in the region ``mem``: io_uring_zcrx_rqe {u64 off, u32 len, u32 pad} at
 * ``rqes_off``; we own the u32 tail at ``tail_off``, the kernel the head at ``head_off``.
 * Writes every buffer (off & off_mask | token, len) and then the tail with a release store.
 * None (nothing written) when they do not all fit (the Python path holds the rest back) or a
 * value is not one it takes (the Python path's error). */
static PyObject *rx_refill_push(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    unsigned long long a[7];
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "refill_push(mem, head_off, tail_off, rqes_off, "
                                         "entries, tail, offs, lens, token, off_mask)");
        return NULL;
    }
    const int ix[7] = {1, 2, 3, 4, 5, 8, 9};
    for (int i = 0; i < 7; i++) {
        a[i] = PyLong_AsUnsignedLongLong(args[ix[i]]);
        if (a[i] == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
    }
    unsigned long long head_off = a[0], tail_off = a[1], rqes_off = a[2], entries = a[3],
                       tail = a[4], token = a[5], off_mask = a[6], *o = NULL, *l = NULL;
    Py_buffer mem;
    if (PyObject_GetBuffer(args[0], &mem, PyBUF_WRITABLE) < 0)
        return NULL;
    unsigned long long size = (unsigned long long)mem.len;
    /* Each bound as a comparison that cannot wrap; the u32 indexes are 4-byte aligned. */
    if (!entries || (entries & (entries - 1)) || size < 4 || head_off > size - 4 ||
        tail_off > size - 4 || (head_off | tail_off) & 3 || rqes_off > size ||
        entries > (size - rqes_off) / 16) {
        PyBuffer_Release(&mem);
        PyErr_SetString(PyExc_ValueError, "the refill ring does not fit in its region");
        return NULL;
    }
    PyObject *ret = NULL;
    Py_ssize_t n = load_ints(args[6], &o), nl = n < 0 ? n : load_ints(args[7], &l);
    if (n == -1 || nl == -1)
        goto done;
    unsigned char *m = mem.buf;
    uint32_t khead = __atomic_load_n((uint32_t *)(m + head_off), __ATOMIC_ACQUIRE);
    unsigned long long space = entries - ((tail - khead) & 0xFFFFFFFFu);
    Py_ssize_t i = 0;
    if (n >= 0 && nl == n)
        while (i < n && l[i] <= 0xFFFFFFFFu)
            i++;
    if (n < 0 || nl != n || i < n || (unsigned long long)n > space) {
        ret = Py_NewRef(Py_None); /* nothing written */
        goto done;
    }
    for (i = 0; i < n; i++) {
        unsigned char *rqe = m + rqes_off + ((tail + i) & (entries - 1)) * 16;
        uint64_t off = (o[i] & off_mask) | token;
        uint32_t len = (uint32_t)l[i];
        memcpy(rqe, &off, 8);
        memcpy(rqe + 8, &len, 4);
    }
    tail = (tail + n) & 0xFFFFFFFFu;
    __atomic_store_n((uint32_t *)(m + tail_off), (uint32_t)tail, __ATOMIC_RELEASE);
    ret = PyLong_FromUnsignedLongLong(tail);
done:
    PyMem_Free(o);
    PyMem_Free(l);
    PyBuffer_Release(&mem);
    return ret;
}

/* zcrx_round(raw, n, recv_ud, f_more, off_mask)
 *     -> bytes of n records {u64 token, i64 offset, i32 length, u32 0}, or None
 *
 * A RECV_ZC round of CQE32s: token is the CQE's ``off`` (area id and offset, what the refill
 * ring takes back), offset its ``off & off_mask``; every res > 0. */
static PyObject *rx_zcrx_round(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "zcrx_round(raw, n, recv_ud, f_more, off_mask)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    unsigned long long ud = PyLong_AsUnsignedLongLong(args[2]),
                       f_more = PyLong_AsUnsignedLongLong(args[3]),
                       off_mask = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer cb;
    const unsigned char *c = cqes_of(args[0], n, CQE32_SIZE, &cb);
    if (!c) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * sizeof(ZcrxRecord));
    if (out) {
        unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
        for (Py_ssize_t i = 0; i < n; i++) {
            const unsigned char *q = c + i * CQE32_SIZE;
            int32_t res = cqe_res(q);
            uint64_t tok;
            memcpy(&tok, q + CQE_SIZE, sizeof tok); /* big_cqe[0]: io_uring_zcrx_cqe.off */
            if (cqe_user_data(q) != ud || res <= 0 ||
                (i == n - 1 && !(cqe_flags(q) & f_more))) {
                Py_SETREF(out, Py_NewRef(Py_None));
                break;
            }
            ZcrxRecord rec = {tok, (int64_t)(tok & off_mask), res, 0};
            memcpy(o + i * sizeof rec, &rec, sizeof rec);
        }
    }
    PyBuffer_Release(&cb);
    return out;
}

/* int_sum(seq) -> int, or None for a sequence it does not read
 *
 * The byte count of a round's lengths (a list, or a numpy int array that is often a strided
 * view of the CQEs): numpy's reduce costs about a microsecond here whatever the size. */
static PyObject *rx_int_sum(PyObject *self, PyObject *seq) {
    unsigned long long *v;
    Py_ssize_t n = load_ints(seq, &v);
    if (n < 0) {
        if (n == -1)
            return NULL;
        Py_RETURN_NONE;
    }
    long long total = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        total += (long long)v[i]; /* signed formats come sign-extended */
    PyMem_Free(v);
    return PyLong_FromLongLong(total);
}

PyMethodDef rx_int_methods[] = {
    {"int_sum", (PyCFunction)rx_int_sum, METH_O, "int_sum($module, seq, /)\n--\n\nThe sum of seq's ints, or None."},
    {"zcrx_round", (PyCFunction)(void (*)(void))rx_zcrx_round, METH_FASTCALL,
     "zcrx_round($module, raw, n, recv_ud, f_more, off_mask, /)\n--\n\n"
     "A zcrx receive's common round: the records, or None."},
    {"refill_push", (PyCFunction)(void (*)(void))rx_refill_push, METH_FASTCALL,
     "refill_push($module, mem, head_off, tail_off, rqes_off, entries, tail, offs, lens, "
     "token, off_mask, /)\n--\n\n"
     "Push buffers to the refill ring: the new tail, or None."},
    CQE_LAYOUT_METHOD,
    {NULL, NULL, 0, NULL},
};
