/* zcnet.rx.zc._rxaccel: the receive core's compiled twins (see module.c for the list).
 *
 * What the module's files share. The layouts are handed over once: bind() (called by
 * zcnet.rx.zc.core at import) gives the held, chunk and core classes and the chunk's slots as
 * member descriptors, whose offsets are read then; no private field is ever named here.
 */
#ifndef ZCNET_RXACCEL_H
#define ZCNET_RXACCEL_H

#include <Python.h>
#include <stdint.h>

#include "_slots.h"

/* The layouts bind() was given (zero until then: every entry point refuses). */
typedef struct {
    int bound;
    PyTypeObject *held, *chunk, *core, *deque;
    PyObject *slow_release, *deque_append;
    /* zcnet.rx.zc.chunks.CHUNK_SLOTS: Held's owner, token, length, stream offset; Chunk's
     * offset */
    Py_ssize_t h_rx, h_tok, h_len, h_so, c_off;
    /* RxCore.C_FIELDS: closed, debug, waiting, queue */
    Py_ssize_t k_closed, k_debug, k_waiting, k_queue;
} Layout;

extern Layout L;

/* chunks.c */
extern PyMethodDef rx_chunk_methods[];
/* chunkiter.c */
extern PyTypeObject ChunkIterType;
/* ints.c */
extern PyMethodDef rx_int_methods[];
/* softround.c */
extern PyMethodDef rx_soft_methods[];

#endif /* ZCNET_RXACCEL_H */
