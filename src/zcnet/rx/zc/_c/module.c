/* zcnet.rx.zc._rxaccel: the receive core's optional compiled twins.
 *
 * What runs once per chunk or once per round on the receiver's side: a round's chunks
 * (make_chunks), their release (the descriptor bind() returns), release_many's marking
 * (mark_released), the drain of released chunks (chunk_tokens), the blocking iterator
 * (ChunkIter), zcrx's round and refill ring (zcrx_round, refill_push), a round's byte count
 * (int_sum) and the soft provider's round (soft_round). Each takes only the common case
 * and leaves the rest to the Python code it stands for (TWINS below, which the tests hold to
 * the Python side), whose checks and errors are the user's.
 *
 * Built at install time when a C compiler exists (setup.py, optional); without it, or with
 * ZCNET_PURE=1 in the environment, the Python path runs.
 */
#include "rxaccel.h"

/* Each entry point and its Python twin. */
static const Twin twins[] = {
    /* bind hands over the layouts (zcnet.rx.zc.core.C_FIELDS) and returns the chunk's release */
    {"bind", "zcnet.rx.zc.chunks.Held.release"},
    {"make_chunks", "zcnet.rx.zc.core.RxCore.deliver"},
    {"mark_released", "zcnet.rx.zc.core.RxCore.release_many"},
    {"chunk_tokens", "zcnet.rx.zc.core.RxCore.returned"},
    {"ChunkIter", "zcnet.rx.zc.receiver.Receiver._iterate"},
    {"readonly_slot", "zcnet.rx.zc.chunks._read_only"},
    {"int_sum", "zcnet.rx.zc.core.RxCore.deliver_batch"},
    {"zcrx_round", "zcnet.rx.zc.zcrx_rings.parse_completions"},
    {"refill_push", "zcnet.rx.zc.zcrx_rings.RefillRing.push"},
    {"soft_round", "zcnet.rx.zc.soft_group.SoftGroup.round"},
    {NULL, NULL},
};

static struct PyModuleDef rx_module = {
    PyModuleDef_HEAD_INIT, "zcnet.rx.zc._rxaccel",
    "The receive core's optional compiled twins (see the source's header).", -1, NULL,
};

PyMODINIT_FUNC PyInit__rxaccel(void) {
    if (PyType_Ready(&ChunkIterType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&rx_module);
    if (!m)
        return NULL;
    if (PyModule_AddFunctions(m, rx_chunk_methods) < 0 ||
        PyModule_AddFunctions(m, rx_int_methods) < 0 ||
        PyModule_AddFunctions(m, rx_soft_methods) < 0 ||
        PyModule_AddObjectRef(m, "ChunkIter", (PyObject *)&ChunkIterType) < 0 ||
        add_twins(m, twins) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
