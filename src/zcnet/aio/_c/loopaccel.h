/* zcnet.aio._loopaccel: what its files share (module.c has the overview).
 *
 * One object per file: router.c (Router), round.c (Round), anext.c (Anext and its AnextOp),
 * copysend.c (CopySend), module.c (the module and the state below). What crosses files is
 * named ``la_*``; everything else stays static in its file.
 */
#ifndef ZCNET_LOOPACCEL_H
#define ZCNET_LOOPACCEL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX, READONLY: the slot members read in place */
#include <stdint.h>
#include <string.h>

#include "_bufring.h"
#include "_cqe.h"
#include "_members.h"

/* The kernel's constants come from zcnet.uapi through the constructors (one place for the ABI). */

enum { DONE = 0, AGAIN = 1, FALLBACK = 2, STOPPED = 3 };

/* Interned attribute names, ``la_name.<field>`` (module.c interns them at import). Public
 * names only, of fields and methods the objects a Round, Anext, CopySend or Router is handed
 * declare for it (their classes' docstrings and __slots__ say which); what is private to a
 * class reaches the C as a member descriptor or a bound callable, handed over when the C
 * object is made (tests/project/test_code_guard.py holds this file to that). */
#define LA_NAMES(X) \
    X(fd, "fd") X(inbox, "inbox") X(on_ready, "on_ready") X(closed, "closed") \
    X(owner_tid, "owner_tid") X(phase, "phase") \
    X(registered, "registered") X(in_ring, "in_ring") X(head, "head") X(tail, "tail") \
    X(stalled, "stalled") X(delivered, "delivered") \
    X(delivered_bytes, "delivered_bytes") X(released, "released") \
    X(released_bytes, "released_bytes") X(peak, "peak_in_flight") \
    X(peak_bytes, "peak_in_flight_bytes") X(stream_off, "stream_off") X(limit, "limit") \
    X(closing, "closing") X(paused, "paused") X(held, "held") X(protocol, "protocol") \
    X(chunk_received, "chunk_received") X(popleft, "popleft") \
    X(entries_addr, "entries_addr") X(base, "base") X(entries, "entries") X(mask, "mask") \
    X(buf_size, "buf_size") X(ring, "ring") X(fast, "fast") \
    X(eof, "eof") X(waiting_release, "waiting_release") X(wbuf, "wbuf") X(st, "st") \
    X(write, "write") \
    X(waiter, "waiter") X(done, "done") X(set_result, "set_result") X(extend, "extend") \
    X(throw, "throw") X(close, "close") X(fileno, "fileno") \
    X(sends, "sends") X(bytes, "bytes") \
    X(rearms, "rearms") X(arm, "arm") X(waiting, "waiting") \
    X(released_now, "released") X(tuples, "tuples")

#define LA_NAME_FIELD(field, text) PyObject *field;
typedef struct {
    LA_NAMES(LA_NAME_FIELD)
} LaNames;
#undef LA_NAME_FIELD

extern LaNames la_name;

/* The pending exception as one object (PyErr_GetRaisedException exists from 3.12 only). */
typedef struct {
    PyObject *type, *value, *tb;
} Exc;

static inline Exc exc_take(void) {
    Exc e;
    PyErr_Fetch(&e.type, &e.value, &e.tb);
    return e;
}

static inline void exc_restore(Exc e) { PyErr_Restore(e.type, e.value, e.tb); }

static inline void exc_drop(Exc e) {
    Py_XDECREF(e.type);
    Py_XDECREF(e.value);
    Py_XDECREF(e.tb);
}

/* ``v`` (attribute ``name``) as a C integer. Only an int is taken: converting anything else
 * calls its __index__, Python that could run between a round's reads and its writes (and
 * close the receiver there). Anything else is a TypeError, as the Python round's arithmetic
 * on it raises. */
static inline int as_ll(PyObject *v, PyObject *name, long long *out) {
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%U is %s, not an int", name, Py_TYPE(v)->tp_name);
        *out = 0;
        return 0;
    }
    *out = PyLong_AsLongLong(v);
    return !(*out == -1 && PyErr_Occurred());
}

/* The attributes a pass reads and writes each time are __slots__ members of their classes
 * (ZcTransport, Receiver, SoftProvider, BufRing, Stats, MemberRing say which): they are read
 * and written in place at the member's offset, as its descriptor does, with no dict lookup.
 * slot_offset finds the member on the object's own type (what getattr finds first), so a
 * subclass that shadows a name with something else, or an object without that slot, goes the
 * generic way (offset 0). Its answers are kept by (type, name) while the type keeps its
 * version tag: CPython gives a type a new tag whenever it or a base changes, and never reuses
 * one. */
typedef struct {
    PyTypeObject *type;
    PyObject *name;
    unsigned int tag;
    Py_ssize_t off;
} SlotMemo;
extern SlotMemo la_slot_memo[256]; /* module.c */

/* The offset of ``name`` in instances of ``t`` (0: no writable object slot of that name). */
static inline Py_ssize_t type_slot_offset(PyTypeObject *t, PyObject *name) {
    PyObject *d = _PyType_Lookup(t, name); /* borrowed; assigns the version tag */
    if (!d || !Py_IS_TYPE(d, &PyMemberDescr_Type))
        return 0;
    PyMemberDef *md = ((PyMemberDescrObject *)d)->d_member;
    return md->type == T_OBJECT_EX && !(md->flags & READONLY) ? md->offset : 0;
}

static inline Py_ssize_t slot_offset(PyObject *o, PyObject *name) {
    PyTypeObject *t = Py_TYPE(o);
    SlotMemo *m = &la_slot_memo[(((uintptr_t)t >> 4) ^ ((uintptr_t)name >> 3)) & 255];
    if (m->type == t && m->name == name && m->tag == t->tp_version_tag && m->tag)
        return m->off;
    Py_ssize_t off = type_slot_offset(t, name);
    *m = (SlotMemo){t, name, t->tp_version_tag, off};
    return off;
}

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* o.name (new reference). An unset slot raises through getattr, as Python would. */
static inline PyObject *iget(PyObject *o, PyObject *name) {
    Py_ssize_t off = slot_offset(o, name);
    if (off && SLOT(o, off))
        return Py_NewRef(SLOT(o, off));
    return PyObject_GetAttr(o, name);
}

static inline int iget_ll(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = iget(o, name);
    if (!v)
        return 0;
    int ok = as_ll(v, name, out);
    Py_DECREF(v);
    return ok;
}

/* A stats counter (o.name) as a C integer. Anything but an int is the TypeError the Python
 * twin's arithmetic on it raises, word for word: ``err`` is that message with a %s for the
 * counter's type (COUNTER_ADD: ``stats.x += n``; PEAK_CMP: ``held > stats.peak_...``). */
#define COUNTER_ADD "unsupported operand type(s) for +=: '%.200s' and 'int'"
#define PEAK_CMP "'>' not supported between instances of 'int' and '%.200s'"

static inline int iget_counter(PyObject *o, PyObject *name, const char *err, long long *out) {
    PyObject *v = iget(o, name);
    if (!v)
        return 0;
    int ok = 0;
    *out = 0;
    if (PyLong_Check(v))
        ok = as_ll(v, name, out);
    else
        PyErr_Format(PyExc_TypeError, err, Py_TYPE(v)->tp_name);
    Py_DECREF(v);
    return ok;
}

/* 1 when attribute ``name`` is true, 0 when false, -1 on error. */
static inline int iget_true(PyObject *o, PyObject *name) {
    Py_ssize_t off = slot_offset(o, name);
    PyObject *v = off ? SLOT(o, off) : NULL;
    if (v == Py_True || v == Py_False || v == Py_None)
        return v == Py_True;
    v = iget(o, name);
    if (!v)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* o.name = v, as iget. */
static inline int iset_ll(PyObject *o, PyObject *name, long long v) {
    PyObject *x = PyLong_FromLongLong(v);
    if (!x)
        return 0;
    Py_ssize_t off = slot_offset(o, name);
    if (off) {
        Py_XSETREF(SLOT(o, off), x);
        return 1;
    }
    int r = PyObject_SetAttr(o, name, x);
    Py_DECREF(x);
    return r == 0;
}

/* o.name = v, as iget: 0 done, -1 error. */
static inline int iset(PyObject *o, PyObject *name, PyObject *v) {
    Py_ssize_t off = slot_offset(o, name);
    if (off) {
        Py_XSETREF(SLOT(o, off), Py_NewRef(v));
        return 0;
    }
    return PyObject_SetAttr(o, name, v);
}

/* 1 when called from the owner's thread with its loop running (``running``: the loop's
 * is_running), 0 when not (the Python path says why), -1 on an error. */
static inline int owner_here(unsigned long tid, PyObject *running) {
    if (PyThread_get_thread_ident() != tid)
        return 0;
    PyObject *res = PyObject_CallNoArgs(running);
    if (!res)
        return -1;
    Py_DECREF(res);
    return res == Py_True;
}

/* Each type's object references, for its dealloc and the cycle collector (a Round and its
 * transport refer to each other). */
#define VISIT_REF(f) Py_VISIT(r->f);
#define CLEAR_REF(f) Py_CLEAR(r->f);
#define GC_METHODS(Name, name, REFS)                                                      \
    static int name##_traverse(Name *r, visitproc visit, void *arg) {                     \
        REFS(VISIT_REF)                                                                   \
        return 0;                                                                         \
    }                                                                                     \
    static int name##_clear(Name *r) {                                                    \
        REFS(CLEAR_REF)                                                                   \
        return 0;                                                                         \
    }                                                                                     \
    static void name##_dealloc(Name *r) {                                                 \
        if (Py_TYPE(r)->tp_finalize &&                                                    \
            PyObject_CallFinalizerFromDealloc((PyObject *)r) < 0)                         \
            return; /* resurrected */                                                     \
        PyObject_GC_UnTrack(r);                                                           \
        name##_clear(r);                                                                  \
        Py_TYPE(r)->tp_free((PyObject *)r);                                               \
    }

#define OBJECT_TYPE(Name, name, doc, ...)                                                 \
    PyTypeObject la_##Name##Type = {                                                    \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zcnet.aio._loopaccel." #Name,           \
        .tp_basicsize = sizeof(Name),                                                     \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,                              \
        .tp_doc = doc,                                                                    \
        .tp_traverse = (traverseproc)name##_traverse,                                     \
        .tp_clear = (inquiry)name##_clear,                                                \
        .tp_new = PyType_GenericNew,                                                      \
        .tp_init = (initproc)name##_init,                                                 \
        .tp_dealloc = (destructor)name##_dealloc,                                         \
        .tp_methods = name##_methods,                                                     \
        __VA_ARGS__                                                                       \
    }

/* The module's types (module.c adds them); Round's run, take and its transport's round_failed
 * step for router.c and anext.c. */
extern PyTypeObject la_RouterType, la_RoundType, la_AnextType, la_AnextOpType,
    la_CopySendType;
typedef struct Round Round;
int la_phases_load(PyObject *module); /* round.c: the core's phases, at import */
PyObject *la_round_run(Round *r, PyObject *unused);
PyObject *la_round_take(Round *r, PyObject *unused);
PyObject *la_round_failed(Round *r, PyObject *exc);

#endif /* ZCNET_LOOPACCEL_H */
