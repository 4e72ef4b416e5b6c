/* zcnet/_cqe.h: reading io_uring completion queue entries, for the compiled halves that reap a
 * CQ themselves (zcnet.uring._accel's Core, zcnet.aio._loopaccel's Router and Round).
 *
 * struct io_uring_cqe (include/uapi/linux/io_uring.h): __u64 user_data at byte 0, __s32 res at
 * byte 8, __u32 flags at byte 12; with IORING_SETUP_CQE32 every entry has 16 more bytes
 * (big_cqe[]), so an entry is 16 or 32 bytes. Ring index i is entry (i & ring_mask) of the CQ
 * ring's array. Fields are read with memcpy: no alignment or aliasing assumptions.
 *
 * zcnet.uapi.io_uring stays the one reference for the ABI: the flag bits and
 * IORING_CQE_BUFFER_SHIFT reach the C code through the objects' constructors, and the layout
 * below is exported by each module's cqe_layout() so a test compares it with
 * zcnet.uapi.io_uring.io_uring_cqe.
 */
#ifndef ZCNET_CQE_H
#define ZCNET_CQE_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Byte offsets of struct io_uring_cqe's fields, and the two entry sizes. */
enum {
    CQE_USER_DATA = 0,
    CQE_RES = 8,
    CQE_FLAGS = 12,
    CQE_SIZE = 16,   /* struct io_uring_cqe */
    CQE32_SIZE = 32, /* with IORING_SETUP_CQE32 */
};

/* Whether ``size`` is the size of an entry of some CQ ring (wide: a caller's value is checked
 * before any narrowing). */
static inline int cqe_size_valid(long long size) {
    return size == CQE_SIZE || size == CQE32_SIZE;
}

/* The entry of ring index ``index`` in the CQ array ``cqes``. */
static inline const unsigned char *cqe_at(const unsigned char *cqes, uint32_t index,
                                          uint32_t ring_mask, uint32_t cqe_size) {
    return cqes + (size_t)(index & ring_mask) * cqe_size;
}

static inline uint64_t cqe_user_data(const unsigned char *cqe) {
    uint64_t v;
    memcpy(&v, cqe + CQE_USER_DATA, sizeof v);
    return v;
}

static inline int32_t cqe_res(const unsigned char *cqe) {
    int32_t v;
    memcpy(&v, cqe + CQE_RES, sizeof v);
    return v;
}

static inline uint32_t cqe_flags(const unsigned char *cqe) {
    uint32_t v;
    memcpy(&v, cqe + CQE_FLAGS, sizeof v);
    return v;
}

/* Rewrite the user_data of a copied entry (the copy, never the ring: the kernel owns that). */
static inline void cqe_set_user_data(unsigned char *cqe, uint64_t user_data) {
    memcpy(cqe + CQE_USER_DATA, &user_data, sizeof user_data);
}

/* The provided buffer's id of a completion with IORING_CQE_F_BUFFER set: the flags' upper
 * bits, from ``buffer_shift`` (IORING_CQE_BUFFER_SHIFT, passed in from zcnet.uapi). */
static inline uint16_t cqe_buffer_id(uint32_t flags, unsigned buffer_shift) {
    return (uint16_t)(flags >> buffer_shift);
}

/* (user_data, res, flags) as Python ints: the tuple Ring.reap_one returns and the shared
 * ring's members take; a new reference, or NULL with an exception set. */
static inline PyObject *cqe_tuple(uint64_t user_data, int32_t res, uint32_t flags) {
    PyObject *t = PyTuple_New(3);
    if (!t)
        return NULL;
    PyObject *a = PyLong_FromUnsignedLongLong(user_data), *b = PyLong_FromLong(res),
             *f = PyLong_FromUnsignedLong(flags);
    if (!a || !b || !f) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(f);
        Py_DECREF(t);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, a);
    PyTuple_SET_ITEM(t, 1, b);
    PyTuple_SET_ITEM(t, 2, f);
    return t;
}

/* A round's copy of the CQEs: n entries of ``size`` bytes (a buffer the caller releases);
 * NULL (no error) when it is shorter, or with the error set when ``raw`` has no buffer. */
static inline const unsigned char *cqes_of(PyObject *raw, Py_ssize_t n, Py_ssize_t size,
                                           Py_buffer *b) {
    if (PyObject_GetBuffer(raw, b, PyBUF_SIMPLE) < 0)
        return NULL;
    if (n <= 0 || size <= 0 || n > b->len / size) { /* no n * size: it could wrap */
        PyBuffer_Release(b);
        return NULL;
    }
    return b->buf;
}

/* A CQE_MIXED ring's CQ (IORING_SETUP_CQE_MIXED): 16-byte slots; an entry whose flags have
 * ``f32`` (IORING_CQE_F_32) takes two, one with ``fskip`` (IORING_CQE_F_SKIP) is a pad that
 * carries nothing (the kernel never lets an entry straddle the wrap). Up to ``max`` entries of
 * the ``slots`` ready from ring index ``head`` go to ``dst`` widened to 32 bytes (a 16-byte
 * entry's second half zeroed, pads dropped): returns the entries written, and in *used the
 * slots they took. The twin of zcnet.uring.mixed.widen. */
static inline uint32_t cqes_widen(const unsigned char *cqes, uint32_t head, uint32_t slots,
                                  uint32_t mask, uint32_t f32, uint32_t fskip,
                                  unsigned char *dst, uint32_t max, uint32_t *used) {
    uint32_t i = 0, n = 0;
    while (i < slots && n < max) {
        const unsigned char *c = cqe_at(cqes, head + i, mask, CQE_SIZE);
        uint32_t flags = cqe_flags(c);
        if (flags & fskip) {
            i++;
            continue;
        }
        unsigned char *d = dst + (size_t)n * CQE32_SIZE;
        if (flags & f32) {
            if (i + 1 >= slots) /* half an entry: the kernel never publishes one */
                break;
            memcpy(d, c, CQE_SIZE);
            memcpy(d + CQE_SIZE, cqe_at(cqes, head + i + 1, mask, CQE_SIZE), CQE_SIZE);
            i += 2;
        } else {
            memcpy(d, c, CQE_SIZE);
            memset(d + CQE_SIZE, 0, CQE_SIZE);
            i++;
        }
        n++;
    }
    *used = i;
    return n;
}

/* cqe_layout() -> dict: the layout this header assumes (field -> byte offset, and the entry
 * sizes), for the test that holds it to zcnet.uapi. Listed in each module's methods. */
static inline PyObject *cqe_layout(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("{sisisisisi}", "user_data", CQE_USER_DATA, "res", CQE_RES, "flags",
                         CQE_FLAGS, "size", CQE_SIZE, "size_cqe32", CQE32_SIZE);
}

#define CQE_LAYOUT_METHOD                                                                   \
    {"cqe_layout", (PyCFunction)cqe_layout, METH_NOARGS,                                    \
     "cqe_layout($module, /)\n--\n\nThe struct io_uring_cqe layout this module was built for."}

#endif /* ZCNET_CQE_H */
