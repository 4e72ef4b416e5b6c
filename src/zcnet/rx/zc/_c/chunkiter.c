/* zcnet.rx.zc._rxaccel.ChunkIter: the blocking Receiver's iterator loop in C (the twin of
 * Receiver._iterate). It calls the receiver's public recv(), eof and release_many only. */
#include "rxaccel.h"

/* ChunkIter(rx): iter(receiver), the iterator path's loop without a generator frame. It hands
 * out the chunks of each ``rx.recv()`` in order and ends at EOF (``rx.eof``); recv's errors
 * (the stream's OSError after the data before it) pass through. Left early, its finalizer
 * gives the chunks of the round not yet handed out to ``rx.release_many``, as the generator's
 * ``finally`` did (Receiver.__iter__ is that generator on the pure path). A ``next`` inside
 * a ``next`` (a finalizer run by a GC pass in recv) is refused as the generator refuses it. */
typedef struct {
    PyObject_HEAD
    PyObject *rx, *recv, *got; /* got: the round being handed out, or NULL */
    Py_ssize_t i;
    int running; /* a next() is under way */
} ChunkIter;

static int chunkiter_init(ChunkIter *it, PyObject *args, PyObject *kw) {
    PyObject *rx;
    if (it->running) {
        PyErr_SetString(PyExc_ValueError, "generator already executing");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "O", &rx))
        return -1;
    PyObject *recv = PyObject_GetAttrString(rx, "recv");
    if (!recv)
        return -1;
    Py_XSETREF(it->rx, Py_NewRef(rx));
    Py_XSETREF(it->recv, recv);
    Py_CLEAR(it->got);
    it->i = 0;
    return 0;
}

static PyObject *chunkiter_step(ChunkIter *it) {
    for (;;) {
        PyObject *got = it->got;
        if (got && it->i < PyList_GET_SIZE(got))
            return Py_NewRef(PyList_GET_ITEM(got, it->i++));
        Py_CLEAR(it->got);
        if (!it->recv || !it->rx)
            return NULL; /* exhausted (or cleared) */
        PyObject *recv = Py_NewRef(it->recv);
        got = PyObject_CallNoArgs(recv);
        Py_DECREF(recv);
        if (!got)
            return NULL;
        if (!PyList_Check(got)) {
            PyErr_Format(PyExc_TypeError, "recv() returned %s, not a list", Py_TYPE(got)->tp_name);
            Py_DECREF(got);
            return NULL;
        }
        if (PyList_GET_SIZE(got)) {
            Py_XSETREF(it->got, got);
            it->i = 0;
            continue;
        }
        Py_DECREF(got);
        if (!it->rx)
            return NULL;
        PyObject *eof = PyObject_GetAttrString(it->rx, "eof");
        if (!eof)
            return NULL;
        int done = PyObject_IsTrue(eof);
        Py_DECREF(eof);
        if (done < 0)
            return NULL;
        if (done) {
            Py_CLEAR(it->recv);
            return NULL;
        }
    }
}

static PyObject *chunkiter_next(ChunkIter *it) {
    if (it->running) {
        PyErr_SetString(PyExc_ValueError, "generator already executing");
        return NULL;
    }
    it->running = 1;
    PyObject *r = chunkiter_step(it);
    it->running = 0;
    return r;
}

static void chunkiter_finalize(ChunkIter *it) {
    if (!it->got || it->i >= PyList_GET_SIZE(it->got) || !it->rx)
        return;
    PyObject *exc_type, *exc, *tb;
    PyErr_Fetch(&exc_type, &exc, &tb);
    PyObject *rest = PyList_GetSlice(it->got, it->i, PyList_GET_SIZE(it->got));
    Py_CLEAR(it->got);
    PyObject *r = rest ? PyObject_CallMethod(it->rx, "release_many", "O", rest) : NULL;
    if (!r)
        PyErr_WriteUnraisable((PyObject *)it);
    Py_XDECREF(r);
    Py_XDECREF(rest);
    PyErr_Restore(exc_type, exc, tb);
}

static int chunkiter_traverse(ChunkIter *it, visitproc visit, void *arg) {
    Py_VISIT(it->rx);
    Py_VISIT(it->recv);
    Py_VISIT(it->got);
    return 0;
}

static int chunkiter_clear(ChunkIter *it) {
    Py_CLEAR(it->rx);
    Py_CLEAR(it->recv);
    Py_CLEAR(it->got);
    return 0;
}

static void chunkiter_dealloc(ChunkIter *it) {
    if (PyObject_CallFinalizerFromDealloc((PyObject *)it) < 0)
        return; /* resurrected */
    PyObject_GC_UnTrack(it);
    chunkiter_clear(it);
    Py_TYPE(it)->tp_free((PyObject *)it);
}

PyTypeObject ChunkIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "zcnet.rx.zc._rxaccel.ChunkIter",
    .tp_basicsize = sizeof(ChunkIter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "ChunkIter(rx, /)\n--\n\nThe chunks of rx.recv() rounds until EOF.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)chunkiter_init,
    .tp_dealloc = (destructor)chunkiter_dealloc,
    .tp_finalize = (destructor)chunkiter_finalize,
    .tp_traverse = (traverseproc)chunkiter_traverse,
    .tp_clear = (inquiry)chunkiter_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)chunkiter_next,
};
