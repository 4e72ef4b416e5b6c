/* zcnet.uring._accel, the zero-copy receive path's half (see _accel.c for the module).
 *
 * What runs once per chunk or once per round on the receiver's side: the iterator's loop
 * (ChunkIter) and its chunks (make_chunks, chunk_release, chunk_tokens, mark_released), the
 * buffer ring's and zcrx refill ring's writes (buf_provide, buf_in_step, refill_push), a
 * provider's common round (soft_round, zcrx_round) and a round's byte count (int_sum). Each
 * takes only the common case and leaves the rest to the Python code it stands for, whose
 * checks and errors are the user's. Private to zcnet.rx.zc and zcnet.uring.bufring.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_accel.h"
#include "_bufring.h"
#include "_cqe.h"

/* make_chunks(cls, rx, offsets, lengths, tokens, start) -> (chunks, end)
 *
 * The iterator path's per-buffer objects: one ``cls`` instance per buffer (a class with
 * __slots__ _rx, _offset, _length, _tok, _stream_offset, all set here as its __init__ would),
 * stream offsets running from ``start``. Allocating them from C skips a Python __init__ frame
 * per chunk. ``offsets``, ``lengths`` and ``tokens`` are lists of the same length, the
 * lengths ints (the provider's). */
static PyObject *accel_make_chunks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyType_Check(args[0]) || !PyList_Check(args[2]) ||
        !PyList_Check(args[3]) || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "make_chunks(cls, rx, offsets: list, lengths: list, tokens: list, start)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *rx = args[1], *offs = args[2], *lens = args[3], *toks = args[4];
    Py_ssize_t n = PyList_GET_SIZE(offs);
    if (PyList_GET_SIZE(lens) != n || PyList_GET_SIZE(toks) != n) {
        PyErr_SetString(PyExc_ValueError, "make_chunks: offsets, lengths and tokens differ in "
                                          "length");
        return NULL;
    }
    long long s = PyLong_AsLongLong(args[5]);
    if (s == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t o_rx, o_off, o_len, o_tok, o_so; /* one at a time: each may raise */
    if ((o_rx = slot_offset(cls, "_rx")) < 0 || (o_off = slot_offset(cls, "_offset")) < 0 ||
        (o_len = slot_offset(cls, "_length")) < 0 || (o_tok = slot_offset(cls, "_tok")) < 0 ||
        (o_so = slot_offset(cls, "_stream_offset")) < 0)
        return NULL;
    PyObject *out = PyList_New(n);
    if (!out)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* tp_alloc can run a GC pass whose finalizers could change the lists: this index's
         * items are held first, and the lists are checked to still reach it. */
        if (i >= PyList_GET_SIZE(offs) || i >= PyList_GET_SIZE(lens) ||
            i >= PyList_GET_SIZE(toks)) {
            PyErr_SetString(PyExc_RuntimeError, "make_chunks: the lists changed during the call");
            goto fail;
        }
        PyObject *of = Py_NewRef(PyList_GET_ITEM(offs, i)),
                 *ln = Py_NewRef(PyList_GET_ITEM(lens, i)),
                 *tk = Py_NewRef(PyList_GET_ITEM(toks, i));
        /* an int: its conversion runs no Python (no __index__) */
        long long l = PyLong_Check(ln) ? PyLong_AsLongLong(ln) : -1;
        if (!PyLong_Check(ln))
            PyErr_Format(PyExc_TypeError, "make_chunks: a length is %s, not an int",
                         Py_TYPE(ln)->tp_name);
        PyObject *so = l == -1 && PyErr_Occurred() ? NULL : PyLong_FromLongLong(s);
        PyObject *c = so ? cls->tp_alloc(cls, 0) : NULL;
        if (!c) {
            Py_XDECREF(so);
            Py_DECREF(of);
            Py_DECREF(ln);
            Py_DECREF(tk);
            goto fail;
        }
        set_slot(c, o_rx, Py_NewRef(rx));
        set_slot(c, o_off, of);
        set_slot(c, o_len, ln);
        set_slot(c, o_tok, tk);
        set_slot(c, o_so, so);
        PyList_SET_ITEM(out, i, c);
        s += l;
    }
    {
        PyObject *end = PyLong_FromLongLong(s);
        if (!end)
            goto fail;
        PyObject *r = PyTuple_Pack(2, out, end);
        Py_DECREF(out);
        Py_DECREF(end);
        return r;
    }
fail:
    Py_DECREF(out);
    return NULL;
}

/* The iterator path's release, ``chunk.release()`` in C: the chunk's class gets it as a method
 * descriptor (chunk_release), so the interpreter calls it without a bound method or a Python
 * frame. It does what _Held.release does on the common path (a held chunk of a Receiver that
 * is open, not debugging, and with no one waiting on its queue): mark the chunk released and
 * append it to the receiver's release deque. Anything else (released twice, another owner,
 * debug views, a waiter to signal, a closed receiver) calls the Python release, whose checks
 * and errors are the user's. One configuration per process: the Receiver's. */
static struct {
    PyTypeObject *rx_type, *queue_type, *deque_type;
    Py_ssize_t o_rx, o_debug, o_releases, o_closed, o_q, o_waiting;
    PyObject *slow, *append;
} rel;

#define SLOT_OF(o, off) (*(PyObject **)((char *)(o) + (off)))

static PyObject *held_release(PyObject *self, PyObject *unused) {
    PyObject *rx = SLOT_OF(self, rel.o_rx), *q, *dq, *flag;
    if (!rx || !Py_IS_TYPE(rx, rel.rx_type) || SLOT_OF(rx, rel.o_debug) != Py_False ||
        SLOT_OF(rx, rel.o_closed) != Py_False || !(q = SLOT_OF(rx, rel.o_releases)) ||
        !Py_IS_TYPE(q, rel.queue_type) || !(flag = SLOT_OF(q, rel.o_waiting)) ||
        flag != Py_False || !(dq = SLOT_OF(q, rel.o_q)) || !Py_IS_TYPE(dq, rel.deque_type))
        return PyObject_CallOneArg(rel.slow, self);
    Py_INCREF(dq); /* setting _rx drops the chunk's reference to the receiver, which holds it */
    set_slot(self, rel.o_rx, Py_NewRef(Py_None));
    PyObject *argv[2] = {dq, self};
    PyObject *r = PyObject_Vectorcall(rel.append, argv, 2, NULL); /* deque.append(dq, self) */
    Py_DECREF(dq);
    return r;
}

static PyMethodDef held_release_def = {
    "release", held_release, METH_NOARGS,
    "Hand the memory back; safe from any thread. Releasing twice raises ValueError.",
};

/* chunk_release(cls, rx_cls, queue_cls, deque_cls, slow) -> method descriptor for cls.release
 *
 * ``cls`` has the __slots__ member _rx, ``rx_cls`` debug, _releases and _closed, ``queue_cls``
 * _q and _waiting; ``slow(chunk)`` is the Python release. */
static PyObject *accel_chunk_release(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyType_Check(args[0]) || !PyType_Check(args[1]) ||
        !PyType_Check(args[2]) || !PyType_Check(args[3]) || !PyCallable_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "chunk_release(cls, rx_cls, queue_cls, deque_cls, slow)");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0], *rxc = (PyTypeObject *)args[1],
                 *qc = (PyTypeObject *)args[2];
    PyTypeObject *const in[6] = {cls, rxc, rxc, rxc, qc, qc};
    const char *const names[6] = {"_rx", "debug", "_releases", "_closed", "_q", "_waiting"};
    Py_ssize_t o[6];
    for (int i = 0; i < 6; i++) /* one at a time: each may raise */
        if ((o[i] = slot_offset(in[i], names[i])) < 0)
            return NULL;
    PyObject *append = PyObject_GetAttrString(args[3], "append");
    if (!append)
        return NULL;
    rel.o_rx = o[0], rel.o_debug = o[1], rel.o_releases = o[2], rel.o_closed = o[3];
    rel.o_q = o[4], rel.o_waiting = o[5];
    Py_XSETREF(rel.rx_type, (PyTypeObject *)Py_NewRef(args[1]));
    Py_XSETREF(rel.queue_type, (PyTypeObject *)Py_NewRef(args[2]));
    Py_XSETREF(rel.deque_type, (PyTypeObject *)Py_NewRef(args[3]));
    Py_XSETREF(rel.slow, Py_NewRef(args[4]));
    Py_XSETREF(rel.append, append);
    return PyDescr_NewMethod(cls, &held_release_def);
}

/* mark_released(chunks, rx, held_cls) -> bool
 *
 * release_many's checks and marking in one pass: when every item is a ``held_cls`` held by
 * ``rx`` and none appears twice, each gets _rx = None and True is returned. Otherwise nothing
 * changes (items marked so far get ``rx`` back) and False sends the caller to its Python
 * checks, which say what is wrong. A repeat shows as an item already marked in this pass. */
static PyObject *accel_mark_released(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_Check(args[0]) || !PyType_Check(args[2]) || !rel.o_rx) {
        PyErr_SetString(PyExc_TypeError, "mark_released(chunks: list, rx, held_cls), after "
                                         "chunk_release");
        return NULL;
    }
    PyObject *chunks = args[0], *rx = args[1];
    PyTypeObject *held = (PyTypeObject *)args[2];
    Py_ssize_t n = PyList_GET_SIZE(chunks), i;
    for (i = 0; i < n; i++) {
        PyObject *c = PyList_GET_ITEM(chunks, i);
        if (!PyObject_TypeCheck(c, held) || SLOT_OF(c, rel.o_rx) != rx)
            break;
        SLOT_OF(c, rel.o_rx) = Py_None; /* the reference to rx moves to the loops below */
    }
    if (i < n) {
        while (i--)
            SLOT_OF(PyList_GET_ITEM(chunks, i), rel.o_rx) = rx;
        Py_RETURN_FALSE;
    }
    for (i = 0; i < n; i++) { /* each chunk's reference to rx goes, one to None comes */
        Py_INCREF(Py_None);
        Py_DECREF(rx); /* rx outlives this: the caller holds it */
    }
    Py_RETURN_TRUE;
}

/* chunk_tokens(chunks, cls) -> (tokens, lengths, nbytes), or None when one is not exactly a
 * ``cls`` with an int token and length (then the caller takes its general path)
 *
 * The receiver's drain of released iterator chunks: their _tok and _length slots as two lists
 * in one pass, with the byte total. Every slot is checked before anything is read or made:
 * no Python runs here (no __index__, no allocation before the checks), so what is read stays
 * what it was. */
static PyObject *accel_chunk_tokens(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_Check(args[0]) || !PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "chunk_tokens(chunks: list, cls)");
        return NULL;
    }
    PyObject *chunks = args[0];
    PyTypeObject *cls = (PyTypeObject *)args[1];
    Py_ssize_t n = PyList_GET_SIZE(chunks);
    Py_ssize_t o_tok, o_len;
    if ((o_tok = slot_offset(cls, "_tok")) < 0 || (o_len = slot_offset(cls, "_length")) < 0)
        return NULL;
    long long total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PyList_GET_ITEM(chunks, i), *t, *l;
        int ovf = 0;
        if (!Py_IS_TYPE(c, cls) || !(t = SLOT_OF(c, o_tok)) || !PyLong_CheckExact(t) ||
            !(l = SLOT_OF(c, o_len)) || !PyLong_CheckExact(l))
            Py_RETURN_NONE;
        long long v = PyLong_AsLongLongAndOverflow(l, &ovf);
        if (ovf || v < 0 || v > LLONG_MAX - total)
            Py_RETURN_NONE;
        total += v;
    }
    PyObject *toks = PyList_New(n), *lens = PyList_New(n);
    if (!toks || !lens)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) { /* the list keeps the chunks, the chunks the ints */
        PyObject *c = PyList_GET_ITEM(chunks, i);
        PyList_SET_ITEM(toks, i, Py_NewRef(SLOT_OF(c, o_tok)));
        PyList_SET_ITEM(lens, i, Py_NewRef(SLOT_OF(c, o_len)));
    }
    PyObject *sum = PyLong_FromLongLong(total);
    if (!sum)
        goto fail;
    return Py_BuildValue("(NNN)", toks, lens, sum);
fail:
    Py_XDECREF(toks);
    Py_XDECREF(lens);
    return NULL;
}

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

static PyTypeObject ChunkIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "zcnet.uring._accel.ChunkIter",
    .tp_basicsize = sizeof(ChunkIter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "ChunkIter(rx): the chunks of rx.recv() rounds until EOF",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)chunkiter_init,
    .tp_dealloc = (destructor)chunkiter_dealloc,
    .tp_finalize = (destructor)chunkiter_finalize,
    .tp_traverse = (traverseproc)chunkiter_traverse,
    .tp_clear = (inquiry)chunkiter_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)chunkiter_next,
};

/* --- ring memory the application writes: the provided-buffer ring and zcrx's refill ring ---
 *
 * The batch paths' writes in one C call each instead of a handful of numpy calls. Memory comes
 * as a writable buffer (the ring's memoryview), every index is bounds-checked against it, and
 * any input they do not take (a bid out of range, a full ring, an element type they do not
 * read) returns None so the Python path runs with its errors. The callers make the same open
 * checks before as before their numpy writes. */

#define NOT_INTS (-2)

/* The ints of a list, or of a 1-D buffer of 2-, 4- or 8-byte integers (numpy arrays, strided
 * views included; signed ones sign-extended), into a new array (PyMem_Free it). Returns
 * their count, -1 with an error set, or NOT_INTS for anything else (no error set). */
static Py_ssize_t load_ints(PyObject *o, unsigned long long **out) {
    Py_ssize_t n;
    unsigned long long *v;
    if (PyList_Check(o)) {
        n = PyList_GET_SIZE(o);
        if (!(v = PyMem_Malloc(n * sizeof *v + 1)))
            return PyErr_NoMemory(), -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *x = PyList_GET_ITEM(o, i);
            long long s = PyLong_Check(x) ? PyLong_AsLongLong(x) : (PyErr_Clear(), -1);
            if ((s == -1 && PyErr_Occurred()) || !PyLong_Check(x)) {
                PyErr_Clear(); /* too big or not an int: the Python path's error */
                PyMem_Free(v);
                return NOT_INTS;
            }
            v[i] = (unsigned long long)s;
        }
        *out = v;
        return n;
    }
    Py_buffer b;
    if (!PyObject_CheckBuffer(o))
        return NOT_INTS;
    if (PyObject_GetBuffer(o, &b, PyBUF_RECORDS_RO) < 0)
        return -1;
    const char *f = b.format ? b.format : "B";
    if (*f == '<' || *f == '=' || *f == '@')
        f++;
    char t = f[0];
    Py_ssize_t size = t == 'H' || t == 'h' ? 2 : t == 'I' || t == 'i' ? 4 : 8;
    /* t checked before f[1]: "" (or a lone byte-order mark) ends at f[0] */
    if (b.ndim != 1 || !t || f[1] || !strchr("HhIiLlQq", t) || size != b.itemsize) {
        PyBuffer_Release(&b);
        return NOT_INTS;
    }
    n = b.shape[0];
    if (n > (PY_SSIZE_T_MAX - 1) / (Py_ssize_t)sizeof *v) { /* n * 8 + 1 would wrap */
        PyBuffer_Release(&b);
        return NOT_INTS;
    }
    if (!(v = PyMem_Malloc(n * sizeof *v + 1))) {
        PyBuffer_Release(&b);
        return PyErr_NoMemory(), -1;
    }
    const char *p = b.buf;
    Py_ssize_t st = b.strides[0];
    switch (t) { /* one loop per type: no switch per element */
    case 'H': for (Py_ssize_t i = 0; i < n; i++) v[i] = *(const uint16_t *)(p + i * st); break;
    case 'h': for (Py_ssize_t i = 0; i < n; i++) v[i] = *(const int16_t *)(p + i * st); break;
    case 'I': for (Py_ssize_t i = 0; i < n; i++) v[i] = *(const uint32_t *)(p + i * st); break;
    case 'i': for (Py_ssize_t i = 0; i < n; i++) v[i] = *(const int32_t *)(p + i * st); break;
    default: for (Py_ssize_t i = 0; i < n; i++) v[i] = *(const uint64_t *)(p + i * st); break;
    }
    PyBuffer_Release(&b);
    *out = v;
    return n;
}

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

/* refill_push(mem, head_off, tail_off, rqes_off, entries, tail, offs, lens, token, off_mask)
 *     -> new tail, or None
 *
 * zcrx's refill ring in the region ``mem``: io_uring_zcrx_rqe {u64 off, u32 len, u32 pad} at
 * ``rqes_off``; we own the u32 tail at ``tail_off``, the kernel the head at ``head_off``.
 * Writes every buffer (off & off_mask | token, len) and then the tail with a release store.
 * None (nothing written) when they do not all fit (the Python path holds the rest back) or a
 * value is not one it takes (the Python path's error). */
static PyObject *accel_refill_push(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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

/* A provider's common round, read from the CQEs' copy (Completions.raw) in one pass: every
 * CQE is data of request ``recv_ud`` and the last has ``f_more`` (the multishot goes on; soft
 * also takes a last one that ends it). The
 * records go out as bytes for one numpy view: no numpy call per field and no Python object
 * per buffer. Anything else returns None and the provider's numpy path takes the round, with
 * its checks and errors. */

/* The records returned, as numpy reads them (ROUND_RECORD in zcnet.uring.bufring,
 * _ROUND_RECORD in zcnet.rx.zc.zcrx_rings); natural alignment leaves no padding but ``pad``. */
typedef struct {
    int64_t offset;
    int32_t length;
    uint16_t bid, pad;
} SoftRecord;

typedef struct {
    uint64_t token;
    int64_t offset;
    int32_t length;
    uint32_t pad;
} ZcrxRecord;

_Static_assert(sizeof(SoftRecord) == 16 && sizeof(ZcrxRecord) == 24, "record layout");

/* The CQEs' copy: n entries of ``size`` bytes; NULL (no error) when it is shorter. */
static const unsigned char *cqes_of(PyObject *raw, Py_ssize_t n, Py_ssize_t size,
                                    Py_buffer *b) {
    if (PyObject_GetBuffer(raw, b, PyBUF_SIMPLE) < 0)
        return NULL;
    if (n <= 0 || size <= 0 || n > b->len / size) { /* no n * size: it could wrap */
        PyBuffer_Release(b);
        return NULL;
    }
    return b->buf;
}

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

/* zcrx_round(raw, n, recv_ud, f_more, off_mask)
 *     -> bytes of n records {u64 token, i64 offset, i32 length, u32 0}, or None
 *
 * A RECV_ZC round of CQE32s: token is the CQE's ``off`` (area id and offset, what the refill
 * ring takes back), offset its ``off & off_mask``; every res > 0. */
static PyObject *accel_zcrx_round(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
static PyObject *accel_int_sum(PyObject *self, PyObject *seq) {
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

static PyMethodDef zc_rx_methods[] = {
    BUFRING_LAYOUT_METHOD,
    {"make_chunks", (PyCFunction)(void (*)(void))accel_make_chunks, METH_FASTCALL,
     "make_chunks(cls, rx, offsets, lengths, tokens, start) -> (chunks, end)"},
    {"chunk_release", (PyCFunction)(void (*)(void))accel_chunk_release, METH_FASTCALL,
     "chunk_release(cls, rx_cls, queue_cls, deque_cls, slow) -> descriptor for cls.release"},
    {"int_sum", (PyCFunction)accel_int_sum, METH_O, "int_sum(seq) -> int or None"},
    {"soft_round", (PyCFunction)(void (*)(void))accel_soft_round, METH_FASTCALL,
     "soft_round(raw, n, cqe_size, recv_ud, f_more, f_buffer, shift, mem, entries, head, "
     "buf_size, base) -> (records, count, final) or None"},
    {"zcrx_round", (PyCFunction)(void (*)(void))accel_zcrx_round, METH_FASTCALL,
     "zcrx_round(raw, n, recv_ud, f_more, off_mask) -> records or None"},
    {"buf_provide", (PyCFunction)(void (*)(void))accel_buf_provide, METH_FASTCALL,
     "buf_provide(mem, entries, tail, bids, base, buf_size) -> new tail or None"},
    {"buf_in_step", (PyCFunction)(void (*)(void))accel_buf_in_step, METH_FASTCALL,
     "buf_in_step(mem, entries, head, bids) -> bool"},
    {"refill_push", (PyCFunction)(void (*)(void))accel_refill_push, METH_FASTCALL,
     "refill_push(mem, head_off, tail_off, rqes_off, entries, tail, offs, lens, token, "
     "off_mask) -> new tail or None"},
    {"mark_released", (PyCFunction)(void (*)(void))accel_mark_released, METH_FASTCALL,
     "mark_released(chunks, rx, held_cls) -> bool"},
    {"chunk_tokens", (PyCFunction)(void (*)(void))accel_chunk_tokens, METH_FASTCALL,
     "chunk_tokens(chunks, cls) -> (tokens, lengths, nbytes) or None"},
    {NULL, NULL, 0, NULL},
};

int zc_rx_add(PyObject *m) {
    if (PyType_Ready(&ChunkIterType) < 0 || PyModule_AddFunctions(m, zc_rx_methods) < 0)
        return -1;
    Py_INCREF(&ChunkIterType);
    if (PyModule_AddObject(m, "ChunkIter", (PyObject *)&ChunkIterType) < 0) {
        Py_DECREF(&ChunkIterType);
        return -1;
    }
    return 0;
}
