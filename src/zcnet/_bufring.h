/* zcnet/_bufring.h: writing and reading a provided-buffer ring's entries, for the compiled
 * halves that give buffers back to the kernel (zcnet.uring._accel's receive path,
 * zcnet.aio._loopaccel's Round) and check a round against them (zcnet.rx.zc._rxaccel's
 * soft_round).
 *
 * struct io_uring_buf (include/uapi/linux/io_uring.h): __u64 addr at byte 0, __u32 len at 8,
 * __u16 bid at 12, __u16 resv at 14; 16 bytes an entry. Entry 0's resv is the ring's tail
 * (struct io_uring_buf_ring overlays it), which the kernel reads after the entries, so it is
 * stored last with release ordering. Ring index i is entry (i & mask). The layout is exported
 * by each module's bufring_layout() so a test compares it with zcnet.uapi.io_uring.io_uring_buf.
 */
#ifndef ZCNET_BUFRING_H
#define ZCNET_BUFRING_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

enum {
    BUF_ADDR = 0,
    BUF_LEN = 8,
    BUF_BID = 12,
    BUF_TAIL = 14, /* entry 0's resv */
    BUF_ENTRY_SIZE = 16,
};

/* The entry of ring index ``index``. */
static inline unsigned char *buf_entry(unsigned char *entries, unsigned long long index,
                                       unsigned long long mask) {
    return entries + (size_t)(index & mask) * BUF_ENTRY_SIZE;
}

/* Publish buffer ``bid`` at ``addr``, ``len`` bytes, in ``entry``. */
static inline void buf_put(unsigned char *entry, uint64_t addr, uint32_t len, uint16_t bid) {
    memcpy(entry + BUF_ADDR, &addr, sizeof addr);
    memcpy(entry + BUF_LEN, &len, sizeof len);
    memcpy(entry + BUF_BID, &bid, sizeof bid);
}

/* The buffer id an entry holds (ours: the kernel writes addr and len, never bid). */
static inline uint16_t buf_bid(const unsigned char *entry) {
    uint16_t bid;
    memcpy(&bid, entry + BUF_BID, sizeof bid);
    return bid;
}

/* Store the ring's tail after the entries written before it (release). */
static inline void buf_publish_tail(unsigned char *entries, uint16_t tail) {
    __atomic_store_n((uint16_t *)(entries + BUF_TAIL), tail, __ATOMIC_RELEASE);
}

/* The entries of a provided-buffer ring: ``entries`` (a power of two, from ``entries_obj``)
 * from the start of the buffer ``mem_obj``, which is taken into ``mem`` (release it). NULL
 * with an error set when that many do not fit. */
static inline unsigned char *buf_ring_of(PyObject *mem_obj, PyObject *entries_obj,
                                         Py_buffer *mem, int flags, Py_ssize_t *entries) {
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

/* bufring_layout() -> dict: the layout this header assumes, for the test that holds it to
 * zcnet.uapi. Listed in each module's methods. */
static inline PyObject *bufring_layout(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("{sisisisisi}", "addr", BUF_ADDR, "len", BUF_LEN, "bid", BUF_BID,
                         "resv", BUF_TAIL, "size", BUF_ENTRY_SIZE);
}

#define BUFRING_LAYOUT_METHOD                                                               \
    {"bufring_layout", (PyCFunction)bufring_layout, METH_NOARGS,                            \
     "bufring_layout($module, /)\n--\n\nThe struct io_uring_buf layout this module was built for."}

#endif /* ZCNET_BUFRING_H */
