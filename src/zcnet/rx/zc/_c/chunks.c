/* zcnet.rx.zc._rxaccel: what is handed out and what comes back, per chunk.
 *
 * bind() takes the layouts once (rxaccel.h); make_chunks builds a round's chunks with no
 * __init__ frame each, the release descriptor is ``chunk.release()`` with no Python frame,
 * mark_released is release_many's checks and marking in one pass, chunk_tokens the drain of
 * released chunks. Each takes only the common case and hands the rest to its Python twin
 * (TWINS in module.c), whose checks and errors are the user's. */
#include "rxaccel.h"

#include <string.h>

Layout L;

static int not_bound(void) {
    PyErr_SetString(PyExc_RuntimeError, "zcnet.rx.zc._rxaccel: bind() was not called");
    return 0;
}

/* The iterator path's release (Held.release's common case), as a method descriptor: a held
 * chunk of an open core that is not debugging and has no one waiting on its queue is marked
 * released and appended to the core's deque. Anything else (released twice, debug views, a
 * waiter to signal, a closed core) calls the Python release. */
static PyObject *held_release(PyObject *self, PyObject *unused) {
    PyObject *core = SLOT(self, L.h_rx), *dq;
    if (!core || !Py_IS_TYPE(core, L.core) || SLOT(core, L.k_debug) != Py_False ||
        SLOT(core, L.k_closed) != Py_False || SLOT(core, L.k_waiting) != Py_False ||
        !(dq = SLOT(core, L.k_queue)) || !Py_IS_TYPE(dq, L.deque))
        return PyObject_CallOneArg(L.slow_release, self);
    Py_INCREF(dq); /* clearing the owner drops the chunk's reference to the core, which holds it */
    set_slot(self, L.h_rx, Py_NewRef(Py_None));
    PyObject *argv[2] = {dq, self};
    PyObject *r = PyObject_Vectorcall(L.deque_append, argv, 2, NULL); /* deque.append(dq, self) */
    Py_DECREF(dq);
    return r;
}

static PyMethodDef held_release_def = {
    "release", held_release, METH_NOARGS,
    "Hand the memory back; safe from any thread. Releasing twice raises ValueError.",
};

/* bind(held, chunk, chunk_slots, core, deque, slow_release) -> release descriptor for chunk
 *
 * The layouts every entry point reads: ``chunk_slots`` (zcnet.rx.zc.chunks.CHUNK_SLOTS, member
 * descriptors: Held's owner, token, length and stream offset, then Chunk's offset) and RxCore's
 * C_FIELDS. ``chunk`` is the class make_chunks makes (with ``slow_release``, Held.release, as
 * the descriptor's fallback). Once per process: a second call rebinds. */
static PyObject *rx_bind(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyType_Check(args[0]) || !PyType_Check(args[1]) ||
        !PyType_Check(args[3]) || !PyType_Check(args[4]) || !PyCallable_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "bind(held, chunk, chunk_slots, core, deque, slow_release)");
        return NULL;
    }
    PyTypeObject *held = (PyTypeObject *)args[0], *chunk = (PyTypeObject *)args[1],
                 *core = (PyTypeObject *)args[3];
    if (!PyType_IsSubtype(chunk, held)) {
        PyErr_SetString(PyExc_TypeError, "bind: chunk is not a Held class");
        return NULL;
    }
    static const char *const kn[4] = {"closed", "debug", "waiting", "queue"};
    Py_ssize_t s[5], k[4];
    if (!member_offsets(chunk, args[2], 5, s, "bind: chunk_slots") ||
        !slot_offsets(core, kn, 4, k))
        return NULL;
    /* The first four are read on any Held (mark_released): they must be Held's own. */
    for (int i = 0; i < 4; i++)
        if (member_offset(held, PyTuple_GET_ITEM(args[2], i)) < 0)
            return NULL;
    PyObject *append = PyObject_GetAttrString(args[4], "append");
    if (!append)
        return NULL;
    PyObject *d = PyDescr_NewMethod(chunk, &held_release_def);
    if (!d) {
        Py_DECREF(append);
        return NULL;
    }
    PyObject *types_in[4] = {args[0], args[1], args[3], args[4]};
    PyTypeObject **types[4] = {&L.held, &L.chunk, &L.core, &L.deque};
    for (int i = 0; i < 4; i++)
        Py_XSETREF(*types[i], (PyTypeObject *)Py_NewRef(types_in[i]));
    Py_XSETREF(L.slow_release, Py_NewRef(args[5]));
    Py_XSETREF(L.deque_append, append);
    L.h_rx = s[0], L.h_tok = s[1], L.h_len = s[2], L.h_so = s[3], L.c_off = s[4];
    L.k_closed = k[0], L.k_debug = k[1], L.k_waiting = k[2], L.k_queue = k[3];
    L.bound = 1;
    return d;
}

/* A new chunk of the bound class, slots set as Chunk.__init__ sets them: stolen references
 * (NULL: no memory, with every reference dropped). */
static PyObject *new_chunk(PyObject *core, PyObject *off, PyObject *len, PyObject *tok,
                           PyObject *so) {
    PyObject *c = off && len && tok && so ? L.chunk->tp_alloc(L.chunk, 0) : NULL;
    if (!c) {
        Py_XDECREF(off);
        Py_XDECREF(len);
        Py_XDECREF(tok);
        Py_XDECREF(so);
        return NULL;
    }
    /* A fresh object's slots are NULL: set in place; its dealloc frees what is set. */
    SLOT(c, L.h_rx) = Py_NewRef(core);
    SLOT(c, L.c_off) = off;
    SLOT(c, L.h_len) = len;
    SLOT(c, L.h_tok) = tok;
    SLOT(c, L.h_so) = so;
    return c;
}

/* make_chunks(core, offsets, lengths, tokens, start) -> (chunks, end)
 *
 * RxCore.deliver's per-buffer objects: one bound chunk per buffer, stream offsets running from
 * ``start``. ``offsets``, ``lengths`` and ``tokens`` are lists of the same length, the lengths
 * ints (the provider's). */
static PyObject *rx_make_chunks_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!L.bound)
        return not_bound(), NULL;
    if (nargs != 5 || !PyList_Check(args[1]) || !PyList_Check(args[2]) ||
        !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "make_chunks(core, offsets: list, lengths: list, tokens: list, start)");
        return NULL;
    }
    PyObject *core = args[0], *offs = args[1], *lens = args[2], *toks = args[3];
    Py_ssize_t n = PyList_GET_SIZE(offs);
    if (PyList_GET_SIZE(lens) != n || PyList_GET_SIZE(toks) != n) {
        PyErr_SetString(PyExc_ValueError, "make_chunks: offsets, lengths and tokens differ in "
                                          "length");
        return NULL;
    }
    long long s = PyLong_AsLongLong(args[4]);
    if (s == -1 && PyErr_Occurred())
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
        PyObject *ln = PyList_GET_ITEM(lens, i);
        /* an int: its conversion runs no Python (no __index__) */
        long long l = PyLong_Check(ln) ? PyLong_AsLongLong(ln) : -1;
        if (!PyLong_Check(ln)) {
            PyErr_Format(PyExc_TypeError, "make_chunks: a length is %s, not an int",
                         Py_TYPE(ln)->tp_name);
            goto fail;
        }
        if (l == -1 && PyErr_Occurred())
            goto fail;
        PyObject *c = new_chunk(core, Py_NewRef(PyList_GET_ITEM(offs, i)), Py_NewRef(ln),
                                Py_NewRef(PyList_GET_ITEM(toks, i)), PyLong_FromLongLong(s));
        if (!c)
            goto fail;
        PyList_SET_ITEM(out, i, c);
        s += l;
    }
    PyObject *end = PyLong_FromLongLong(s);
    if (!end)
        goto fail;
    PyObject *r = PyTuple_Pack(2, out, end);
    Py_DECREF(out);
    Py_DECREF(end);
    return r;
fail:
    Py_DECREF(out);
    return NULL;
}

/* mark_released(items, core) -> bool
 *
 * release_many's checks and marking in one pass (RxCore.release_many): when every item is a
 * Held held by ``core`` and none appears twice, each gets owner None and True is returned.
 * Otherwise nothing changes (items marked so far get ``core`` back) and False sends the caller
 * to its Python checks, which say what is wrong. A repeat shows as an item already marked in
 * this pass. */
static PyObject *rx_mark_released(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!L.bound)
        return not_bound(), NULL;
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "mark_released(items: list, core)");
        return NULL;
    }
    PyObject *items = args[0], *core = args[1];
    Py_ssize_t n = PyList_GET_SIZE(items), i;
    for (i = 0; i < n; i++) {
        PyObject *c = PyList_GET_ITEM(items, i);
        if (!PyObject_TypeCheck(c, L.held) || SLOT(c, L.h_rx) != core)
            break;
        SLOT(c, L.h_rx) = Py_None; /* the reference to core moves to the loops below */
    }
    if (i < n) {
        while (i--)
            SLOT(PyList_GET_ITEM(items, i), L.h_rx) = core;
        Py_RETURN_FALSE;
    }
    for (i = 0; i < n; i++) { /* each item's reference to core goes, one to None comes */
        Py_INCREF(Py_None);
        Py_DECREF(core); /* core outlives this: the caller holds it */
    }
    Py_RETURN_TRUE;
}

/* chunk_tokens(items) -> (tokens, lengths, nbytes), or None when one is not exactly a bound
 * chunk with an int token and length (then the caller takes its general path)
 *
 * RxCore.returned's drain of released iterator chunks: their token and length slots as two
 * lists in one pass, with the byte total. Every slot is checked before anything is read or
 * made: no Python runs here (no __index__, no allocation before the checks). */
static PyObject *rx_chunk_tokens(PyObject *self, PyObject *items) {
    if (!L.bound)
        return not_bound(), NULL;
    if (!PyList_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "chunk_tokens(items: list)");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    long long total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PyList_GET_ITEM(items, i), *t, *l;
        int ovf = 0;
        if (!Py_IS_TYPE(c, L.chunk) || !(t = SLOT(c, L.h_tok)) || !PyLong_CheckExact(t) ||
            !(l = SLOT(c, L.h_len)) || !PyLong_CheckExact(l))
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
        PyObject *c = PyList_GET_ITEM(items, i);
        PyList_SET_ITEM(toks, i, Py_NewRef(SLOT(c, L.h_tok)));
        PyList_SET_ITEM(lens, i, Py_NewRef(SLOT(c, L.h_len)));
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

/* readonly_slot(slot, name) -> descriptor for ``<class>.<name>``: reads the __slots__ member
 * ``slot`` (its descriptor, ``cls._x``) in place, as fast as the member's own descriptor, and
 * refuses assignment and deletion (AttributeError). For the fields the compiled paths read back
 * (a chunk's offset and length): only the class's own code writes them, through ``slot``. */
static PyObject *rx_readonly_slot(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !Py_IS_TYPE(args[0], &PyMemberDescr_Type) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "readonly_slot(slot: member descriptor, name: str)");
        return NULL;
    }
    PyTypeObject *cls = PyDescr_TYPE(args[0]);
    const char *name = PyUnicode_AsUTF8(args[1]);
    if (!name)
        return NULL;
    Py_ssize_t off = member_offset(cls, args[0]);
    if (off < 0)
        return NULL;
    /* A member descriptor keeps pointing at its PyMemberDef: one per class attribute, made at
     * import and never freed. */
    size_t len = strlen(name) + 1;
    PyMemberDef *def = PyMem_Calloc(1, sizeof *def + len);
    if (!def)
        return PyErr_NoMemory();
    memcpy((char *)(def + 1), name, len);
    def->name = (const char *)(def + 1);
    def->type = T_OBJECT_EX;
    def->offset = off;
    def->flags = READONLY;
    PyObject *d = PyDescr_NewMember(cls, def);
    if (!d)
        PyMem_Free(def);
    return d;
}

PyMethodDef rx_chunk_methods[] = {
    {"bind", (PyCFunction)(void (*)(void))rx_bind, METH_FASTCALL,
     "bind($module, held, chunk, chunk_slots, core, deque, slow_release, /)\n--\n\n"
     "Bind the chunk classes; returns the chunk's release."},
    {"make_chunks", (PyCFunction)(void (*)(void))rx_make_chunks_py, METH_FASTCALL,
     "make_chunks($module, core, offsets, lengths, tokens, start, /)\n--\n\n"
     "One bound chunk per buffer: (chunks, end)."},
    {"mark_released", (PyCFunction)(void (*)(void))rx_mark_released, METH_FASTCALL,
     "mark_released($module, items, core, /)\n--\n\n"
     "Mark items released to core: whether all were taken."},
    {"chunk_tokens", (PyCFunction)rx_chunk_tokens, METH_O,
     "chunk_tokens($module, items, /)\n--\n\n"
     "The items' (tokens, lengths, nbytes), or None."},
    {"readonly_slot", (PyCFunction)(void (*)(void))rx_readonly_slot, METH_FASTCALL,
     "readonly_slot($module, slot, name, /)\n--\n\n"
     "A read-only descriptor of the __slots__ member slot."},
    {NULL, NULL, 0, NULL},
};
