/* zcnet.aio._loopaccel: the optional compiled half of zcnet.aio's per-message paths.
 *
 * Four objects, each a C version of a Python hot path that stays in place as the fallback:
 *
 * - Router (router.c): takes every ready CQE off the loop's shared io_uring and hands each
 *   member (one receiver) its own, as zcnet.aio.shared.LoopRing does in Python: a few CQEs as a
 *   list of (local user_data, res, flags) tuples, many as a Completions made from the raw CQEs
 *   with the user_data made local; then calls the member's on_ready() or kick().
 * - Round (round.c): one receive round of a ZcTransport (zcnet.aio.protocol) in the common
 *   case: every released chunk goes back to the buffer ring, every completion is data of the
 *   receive in one buffer, the chunks are made and given to the protocol's chunk_received. Data
 *   that ended the multishot (a bundle took the ring's last buffer) is delivered the same way,
 *   and the next round re-arms the receive through the provider's own arm(). A pooled
 *   receiver's round (zcnet.aio.pool: a buffer group shared by the loop's receivers) takes each
 *   buffer by the id its completion names, since other receivers' completions interleave in
 *   ring order, and leaves re-arming to the pool's pacing in Python. Anything else (a batch or
 *   coalesced chunk released, an error or EOF completion, back-pressure, a closed receiver, a
 *   buffer ring out of step, a double release) returns FALLBACK before changing anything, and
 *   the Python round runs with its own checks and errors. Its take() and take_batch() are the
 *   same round for an AsyncReceiver's ``recv`` and ``recv_batch``, returning the chunks (or one
 *   Batch) instead of calling a protocol.
 * - Anext (anext.c, with its awaitable AnextOp): an AsyncReceiver's ``__anext__`` on such a
 *   round, as an awaitable with no coroutine frame; anything but a chunk now or a wait for data
 *   goes to the Python step.
 * - CopySend (copysend.c): a copy sender's ``sendall`` when the socket takes the bytes at once.
 *
 * Router and Round work on mapped memory through raw pointers: they check the ring's fd (and
 * the buffer ring's registration) before every access; the Python owners close them before
 * unmapping. Private to zcnet.aio's modules, which pass valid addresses.
 *
 * Built at install time when a C compiler exists (setup.py, optional); without it, or with
 * ZCNET_PURE=1 in the environment, the Python path runs.
 *
 * loopaccel.h holds what the files share (the interned names, the in-place slot access, the
 * type boilerplate); this file holds the module and the state behind those.
 */
#include "loopaccel.h"

LaNames la_name;
SlotMemo la_slot_memo[256];

static PyMethodDef loopaccel_methods[] = {
    CQE_LAYOUT_METHOD,
    BUFRING_LAYOUT_METHOD,
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef loopaccel_module = {
    PyModuleDef_HEAD_INIT, "zcnet.aio._loopaccel",
    "Compiled shared-ring pass for zcnet.aio (optional; see the source's header).", -1,
    loopaccel_methods,
};

PyMODINIT_FUNC PyInit__loopaccel(void) {
#define INTERN(field, text)                                                               \
    if (!(la_name.field = PyUnicode_InternFromString(text)))                              \
        return NULL;
    LA_NAMES(INTERN)
#undef INTERN
    if (PyType_Ready(&la_RouterType) < 0 || PyType_Ready(&la_RoundType) < 0 ||
        PyType_Ready(&la_AnextType) < 0 || PyType_Ready(&la_AnextOpType) < 0 ||
        PyType_Ready(&la_CopySendType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&loopaccel_module);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "Router", (PyObject *)&la_RouterType) < 0 ||
        PyModule_AddObjectRef(m, "Round", (PyObject *)&la_RoundType) < 0 ||
        PyModule_AddObjectRef(m, "Anext", (PyObject *)&la_AnextType) < 0 ||
        PyModule_AddObjectRef(m, "CopySend", (PyObject *)&la_CopySendType) < 0 ||
        PyModule_AddIntConstant(m, "DONE", DONE) < 0 ||
        PyModule_AddIntConstant(m, "AGAIN", AGAIN) < 0 ||
        PyModule_AddIntConstant(m, "FALLBACK", FALLBACK) < 0 ||
        PyModule_AddIntConstant(m, "STOPPED", STOPPED) < 0 || la_phases_load(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
