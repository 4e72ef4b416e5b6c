/* zcnet.aio._loopaccel: the optional compiled half of zcnet.aio's per-message paths.
 *
 * Four objects, each a C version of a Python hot path that stays in place as the fallback:
 *
 * - Router: takes every ready CQE off the loop's shared io_uring and hands each member (one
 *   receiver) its own, as zcnet.aio.shared.LoopRing does in Python: a few CQEs as a list of
 *   (local user_data, res, flags) tuples, many as a Completions made from the raw CQEs with the
 *   user_data made local; then calls the member's on_ready() or kick().
 * - Round: one receive round of a ZcTransport (zcnet.aio.protocol) in the common case: every
 *   released chunk goes back to the buffer ring, every completion is data of the receive in
 *   one buffer, the chunks are made and given to the protocol's chunk_received. Data that ended
 *   the multishot (a bundle took the ring's last buffer) is delivered the same way, and the
 *   next round re-arms the receive through the provider's own arm(). A pooled receiver's
 *   round (zcnet.aio.pool: a buffer group shared by the loop's receivers) takes each buffer
 *   by the id its completion names, since other receivers' completions interleave in ring
 *   order, and leaves re-arming to the pool's pacing in Python. Anything else (a batch
 *   or coalesced chunk released, an error or EOF completion, back-pressure, a closed receiver,
 *   a buffer ring out of step, a double release) returns FALLBACK before changing anything,
 *   and the Python round runs with its own checks and errors.
 *   Its take() and take_batch() are the same round for an AsyncReceiver's ``recv`` and
 *   ``recv_batch``, returning the chunks (or one Batch) instead of calling a protocol.
 * - Anext: an AsyncReceiver's ``__anext__`` on such a round, as an awaitable with no
 *   coroutine frame; anything but a chunk now or a wait for data goes to the Python step.
 * - CopySend: a copy sender's ``sendall`` when the socket takes the bytes at once.
 *
 * Router and Round work on mapped memory through raw pointers: they check the ring's fd (and
 * the buffer ring's registration) before every access; the Python owners close them before
 * unmapping. Private to zcnet.aio's modules, which pass valid addresses.
 *
 * Built at install time when a C compiler exists (setup.py, optional); without it, or with
 * ZCNET_PURE=1 in the environment, the Python path runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX, READONLY: the slot members read in place */
#include <stdint.h>
#include <string.h>

#include <errno.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "_bufring.h"
#include "_cqe.h"

#ifndef __NR_io_uring_enter
#define __NR_io_uring_enter 426
#endif

/* The kernel's constants come from zcnet.uapi through the constructors (one place for the ABI). */

enum { DONE = 0, AGAIN = 1, FALLBACK = 2, STOPPED = 3 };
/* zcnet.rx.zc.core.Phase */
enum { PHASE_IDLE = 0, PHASE_ARMED = 1, PHASE_STOPPED = 2 };

/* Interned attribute names. */
static PyObject *s_fd, *s_inbox, *s_on_ready, *s_closed, *s_owner_tid, *s_registered, *s_in_ring,
    *s_head, *s_tail, *s_stalled, *s_stats, *s_phase, *s_delivered, *s_delivered_bytes, *s_released,
    *s_released_bytes, *s_peak, *s_peak_bytes, *s_stream_off, *s_limit, *s_closing, *s_paused,
    *s_held, *s_protocol, *s_chunk_received, *s_put_back, *s_popleft, *s_entries_addr, *s_base,
    *s_entries, *s_mask, *s_buf_size, *s_ring, *s_fast, *s_failed, *s_eof, *s_waiting_release,
    *s_wbuf, *s_st, *s_write, *s_send_failed, *s_buffer_rest, *s_arx_closed, *s_rx, *s_offset,
    *s_length, *s_tok, *s_stream_offset, *s_waiter, *s_done, *s_set_result, *s_extend, *s_throw,
    *s_close, *s_fileno, *s_sending, *s_sends, *s_bytes, *s_offsets, *s_lengths, *s_linear,
    *s_rearms, *s_arm, *s_waiting, *s_released_now, *s_tuples, *s_drop_pending;

/* The pending exception as one object (PyErr_GetRaisedException exists from 3.12 only). */
typedef struct {
    PyObject *type, *value, *tb;
} Exc;

static Exc exc_take(void) {
    Exc e;
    PyErr_Fetch(&e.type, &e.value, &e.tb);
    return e;
}

static void exc_restore(Exc e) { PyErr_Restore(e.type, e.value, e.tb); }

static void exc_drop(Exc e) {
    Py_XDECREF(e.type);
    Py_XDECREF(e.value);
    Py_XDECREF(e.tb);
}

/* ``v`` (attribute ``name``) as a C integer. Only an int is taken: converting anything else
 * calls its __index__, Python that could run between a round's reads and its writes (and
 * close the receiver there). Anything else is a TypeError, as the Python round's arithmetic
 * on it raises. */
static int as_ll(PyObject *v, PyObject *name, long long *out) {
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "%U is %s, not an int", name, Py_TYPE(v)->tp_name);
        *out = 0;
        return 0;
    }
    *out = PyLong_AsLongLong(v);
    return !(*out == -1 && PyErr_Occurred());
}

static int get_ll(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v)
        return 0;
    int ok = as_ll(v, name, out);
    Py_DECREF(v);
    return ok;
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
static SlotMemo slot_memo[256];

/* The offset of ``name`` in instances of ``t`` (0: no writable object slot of that name). */
static Py_ssize_t type_slot_offset(PyTypeObject *t, PyObject *name) {
    PyObject *d = _PyType_Lookup(t, name); /* borrowed; assigns the version tag */
    if (!d || !Py_IS_TYPE(d, &PyMemberDescr_Type))
        return 0;
    PyMemberDef *md = ((PyMemberDescrObject *)d)->d_member;
    return md->type == T_OBJECT_EX && !(md->flags & READONLY) ? md->offset : 0;
}

static Py_ssize_t slot_offset(PyObject *o, PyObject *name) {
    PyTypeObject *t = Py_TYPE(o);
    SlotMemo *m = &slot_memo[(((uintptr_t)t >> 4) ^ ((uintptr_t)name >> 3)) & 255];
    if (m->type == t && m->name == name && m->tag == t->tp_version_tag && m->tag)
        return m->off;
    Py_ssize_t off = type_slot_offset(t, name);
    *m = (SlotMemo){t, name, t->tp_version_tag, off};
    return off;
}

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* o.name (new reference). An unset slot raises through getattr, as Python would. */
static PyObject *iget(PyObject *o, PyObject *name) {
    Py_ssize_t off = slot_offset(o, name);
    if (off && SLOT(o, off))
        return Py_NewRef(SLOT(o, off));
    return PyObject_GetAttr(o, name);
}

static int iget_ll(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = iget(o, name);
    if (!v)
        return 0;
    int ok = as_ll(v, name, out);
    Py_DECREF(v);
    return ok;
}

/* 1 when attribute ``name`` is true, 0 when false, -1 on error. */
static int iget_true(PyObject *o, PyObject *name) {
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
static int iset_ll(PyObject *o, PyObject *name, long long v) {
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
static int iset(PyObject *o, PyObject *name, PyObject *v) {
    Py_ssize_t off = slot_offset(o, name);
    if (off) {
        Py_XSETREF(SLOT(o, off), Py_NewRef(v));
        return 0;
    }
    return PyObject_SetAttr(o, name, v);
}

static int as_ptr(PyObject *o, void **out) {
    *out = PyLong_AsVoidPtr(o);
    return !(*out == NULL && PyErr_Occurred());
}

/* ---------------------------------------------------------------------------------------- */
/* Router(ring, members, khead, ktail, cqes, mask, cqe_size, completions_of, few, sq_flags,  */
/*        work_mask, getevents, local_bits)                                                 */

typedef struct {
    PyObject_HEAD
    PyObject *ring, *members, *completions_of;
    uint32_t *khead, *ktail, *sq_flags;
    unsigned char *cqes;
    uint32_t mask, cqe_size, work, getevents;
    unsigned int local_bits;
    Py_ssize_t few;
} Router;

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

#define ROUTER_REFS(X) X(ring) X(members) X(completions_of)
GC_METHODS(Router, router, ROUTER_REFS)

static int router_init(Router *r, PyObject *args, PyObject *kw) {
    PyObject *ring, *members, *kh, *kt, *cq, *of, *sqf;
    long long mask, cqe_size, work, getevents, local_bits;
    Py_ssize_t few;
    void *khead, *ktail, *cqes, *sq_flags;
    /* Parsed wide and checked before anything is stored: a failed __init__ changes nothing. */
    if (!PyArg_ParseTuple(args, "OO!OOOLLOnOLLL", &ring, &PyDict_Type, &members, &kh, &kt,
                          &cq, &mask, &cqe_size, &of, &few, &sqf, &work, &getevents,
                          &local_bits))
        return -1;
    if (!as_ptr(kh, &khead) || !as_ptr(kt, &ktail) || !as_ptr(cq, &cqes) ||
        !as_ptr(sqf, &sq_flags))
        return -1;
    if (local_bits < 1 || local_bits > 32) {
        PyErr_SetString(PyExc_ValueError, "Router: local_bits is 1..32");
        return -1;
    }
    if (!cqe_size_valid(cqe_size)) {
        PyErr_SetString(PyExc_ValueError, "Router: cqe_size is 16 or 32");
        return -1;
    }
    if (mask < 0 || mask > 0x7FFFFFFF || (mask & (mask + 1)) || work < 0 ||
        work > UINT32_MAX || getevents < 0 || getevents > UINT32_MAX || few < 0 || !khead ||
        !ktail || !cqes || !sq_flags || ((uintptr_t)khead | (uintptr_t)ktail |
                                         (uintptr_t)sq_flags) & 3) {
        PyErr_SetString(PyExc_ValueError, "Router: a mask of 2**k - 1, 32-bit flags, few >= 0 "
                                          "and aligned ring addresses");
        return -1;
    }
    Py_XSETREF(r->ring, Py_NewRef(ring));
    Py_XSETREF(r->members, Py_NewRef(members));
    Py_XSETREF(r->completions_of, Py_NewRef(of));
    r->khead = khead;
    r->ktail = ktail;
    r->cqes = cqes;
    r->sq_flags = sq_flags;
    r->mask = (uint32_t)mask;
    r->cqe_size = (uint32_t)cqe_size;
    r->work = (uint32_t)work;
    r->getevents = (uint32_t)getevents;
    r->local_bits = (unsigned)local_bits;
    r->few = few;
    return 0;
}

typedef struct {
    uint64_t mid;
    Py_ssize_t count;
} Group;

/* Whether member ``mid`` takes any number of CQEs as tuples: one driven by callbacks
 * (``on_ready`` set: the compiled Round takes them without a Python object per field), or
 * one that asks for them (``tuples``: a pooled receiver, a CQE per buffer); otherwise a big
 * group goes as arrays. -1 on error. */
static int takes_tuples(Router *r, uint64_t mid) {
    PyObject *key = PyLong_FromUnsignedLongLong(mid);
    if (!key)
        return -1;
    PyObject *m = PyDict_GetItemWithError(r->members, key); /* borrowed */
    Py_DECREF(key);
    if (!m)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *cb = iget(m, s_on_ready);
    if (!cb)
        return -1;
    Py_DECREF(cb);
    return cb != Py_None ? 1 : iget_true(m, s_tuples);
}

/* Keep the pending exception in *exc when it is the first (else drop it). */
static void keep_first(Exc *exc) {
    if (exc->type == NULL)
        *exc = exc_take();
    else
        PyErr_Clear();
}

static PyTypeObject RoundType;
typedef struct Round Round;
static PyObject *round_run(Round *r, PyObject *unused);
static PyObject *round_transport(Round *r);

/* Run member ``m``'s compiled round directly (``m.fast``): 1 when that finished it, 0 when
 * ``on_ready`` must run, -1 on an error to raise. A round's Exception goes to its transport's
 * ``_round_failed`` as the Python round's would. */
static int run_fast(PyObject *m) {
    PyObject *fast = iget(m, s_fast);
    if (!fast)
        return -1;
    if (!Py_IS_TYPE(fast, &RoundType)) {
        Py_DECREF(fast);
        return 0;
    }
    PyObject *res = round_run((Round *)fast, NULL);
    if (res) {
        long v = PyLong_AsLong(res);
        Py_DECREF(res);
        Py_DECREF(fast);
        return v == DONE || v == STOPPED;
    }
    if (!PyErr_ExceptionMatches(PyExc_Exception)) { /* KeyboardInterrupt & co: raised */
        Py_DECREF(fast);
        return -1;
    }
    Exc e = exc_take();
    PyErr_NormalizeException(&e.type, &e.value, &e.tb);
    if (e.tb)
        PyException_SetTraceback(e.value, e.tb);
    PyObject *tr = round_transport((Round *)fast);
    PyObject *r2 = tr ? PyObject_CallMethodOneArg(tr, s_failed, e.value) : NULL;
    Py_XDECREF(tr);
    exc_drop(e);
    Py_DECREF(fast);
    if (!r2)
        return -1;
    Py_DECREF(r2);
    return 1;
}

/* MemberRing.kick: the waiting task's future (``m.waiter``) resolved, and forgotten. */
static PyObject *kick(PyObject *m) {
    PyObject *w = iget(m, s_waiter);
    if (!w)
        return NULL;
    if (w == Py_None) {
        Py_DECREF(w);
        Py_RETURN_NONE;
    }
    PyObject *res = NULL;
    if (iset(m, s_waiter, Py_None) == 0) {
        PyObject *d = PyObject_CallMethodNoArgs(w, s_done);
        int done = d ? PyObject_IsTrue(d) : -1;
        Py_XDECREF(d);
        res = done < 0 ? NULL
              : done   ? Py_NewRef(Py_None)
                       : PyObject_CallMethodOneArg(w, s_set_result, Py_None);
    }
    Py_DECREF(w);
    return res;
}

/* Run ``m``'s compiled round, else call ``m.on_ready()`` or ``m.kick()``; the first failure is
 * kept in *exc. */
static void wake(PyObject *m, Exc *exc) {
    int done = run_fast(m);
    if (done) {
        if (done < 0)
            keep_first(exc);
        return;
    }
    PyObject *cb = iget(m, s_on_ready);
    PyObject *res = NULL;
    if (cb) {
        res = cb == Py_None ? kick(m) : PyObject_CallNoArgs(cb);
        Py_DECREF(cb);
    }
    if (res) {
        Py_DECREF(res);
        return;
    }
    keep_first(exc);
}

/* route() -> int: every ready CQE to its member (see the module docstring); the number taken. A
 * failing on_ready/kick does not stop the others; the first failure is raised at the end.
 *
 * The CQEs are copied out and the head published before anything can run Python: an
 * allocation below can start a GC pass, whose finalizers may close a receiver (and with the
 * last one the ring, unmapping the CQ) or run a nested pass. Every group goes into its member's
 * inbox before any member is woken, so a pass nested in a wake-up (a receiver closed from a
 * callback waits on this ring) finds each inbox holding the older CQEs first. */
static PyObject *do_route(Router *r) {
    uint32_t head = *r->khead;
    uint32_t tail = __atomic_load_n(r->ktail, __ATOMIC_ACQUIRE);
    uint32_t n = tail - head;
    if (n == 0)
        return PyLong_FromLong(0);
    if (n > r->mask + 1) {
        PyErr_SetString(PyExc_RuntimeError, "route: the CQ head is out of step with its tail");
        return NULL;
    }
    /* A pass of up to 64 CQEs (the common one) uses the stack only. */
    unsigned char small[64 * CQE32_SIZE];
    Group stack[64];
    PyObject *mstack[64];
    unsigned char *copy = n <= 64 ? small : PyMem_Malloc((size_t)n * r->cqe_size);
    Group *groups = n <= 64 ? stack : PyMem_Malloc(sizeof(Group) * n);
    PyObject **woken = n <= 64 ? mstack : PyMem_Malloc(sizeof(PyObject *) * n);
    Py_ssize_t nw = 0; /* the members given CQEs, in group order (new references) */
    if (!copy || !groups || !woken) {
        PyErr_NoMemory();
        goto done;
    }
    for (uint32_t i = 0; i < n; i++)
        memcpy(copy + (size_t)i * r->cqe_size, cqe_at(r->cqes, head + i, r->mask, r->cqe_size),
               r->cqe_size);
    __atomic_store_n(r->khead, head + n, __ATOMIC_RELEASE); /* the copy above is done */
    /* Members in order of their first CQE; few distinct ones per pass, so a linear search. */
    Py_ssize_t ng = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t mid = cqe_user_data(copy + (size_t)i * r->cqe_size) >> r->local_bits;
        Py_ssize_t g = 0;
        while (g < ng && groups[g].mid != mid)
            g++;
        if (g == ng) {
            groups[ng].mid = mid;
            groups[ng].count = 0;
            ng++;
        }
        groups[g].count++;
    }
    PyObject *items = PyList_New(ng); /* per group: a list of tuples, or a Completions */
    Exc exc = {NULL, NULL, NULL};
    if (!items)
        goto fail;
    for (Py_ssize_t g = 0; g < ng; g++) {
        PyObject *it;
        Py_ssize_t k = groups[g].count;
        int tuples = k <= r->few ? 1 : takes_tuples(r, groups[g].mid);
        if (tuples < 0)
            goto fail;
        if (!tuples) {
            it = PyByteArray_FromStringAndSize(NULL, k * r->cqe_size);
            groups[g].count = 0; /* now: entries written */
        } else {
            it = PyList_New(0);
        }
        if (!it)
            goto fail;
        PyList_SET_ITEM(items, g, it);
    }
    for (uint32_t i = 0; i < n; i++) {
        const unsigned char *c = copy + (size_t)i * r->cqe_size;
        uint64_t ud = cqe_user_data(c);
        uint64_t mid = ud >> r->local_bits;
        Py_ssize_t g = 0;
        while (groups[g].mid != mid)
            g++;
        PyObject *it = PyList_GET_ITEM(items, g);
        uint64_t local = ud & ((1ull << r->local_bits) - 1);
        if (PyByteArray_CheckExact(it)) {
            unsigned char *dst = (unsigned char *)PyByteArray_AS_STRING(it) +
                                 groups[g].count++ * r->cqe_size;
            memcpy(dst, c, r->cqe_size);
            cqe_set_user_data(dst, local);
        } else {
            PyObject *t = cqe_tuple(local, cqe_res(c), cqe_flags(c));
            if (!t || PyList_Append(it, t) < 0) {
                Py_XDECREF(t);
                goto fail;
            }
            Py_DECREF(t);
        }
    }
    /* Every group to its member's inbox, then the wake-ups. */
    for (Py_ssize_t g = 0; g < ng; g++) {
        PyObject *key = PyLong_FromUnsignedLongLong(groups[g].mid);
        if (!key)
            goto fail;
        PyObject *m = PyDict_GetItemWithError(r->members, key); /* borrowed */
        Py_DECREF(key);
        if (!m) {
            if (PyErr_Occurred())
                goto fail;
            continue; /* a member that left; its cancel completed before it did */
        }
        Py_INCREF(m);
        PyObject *it = PyList_GET_ITEM(items, g);
        PyObject *box = NULL, *comp = NULL;
        int ok = 0;
        if (PyByteArray_CheckExact(it)) {
            /* Python (a GC pass) may run a round that replaces the member's inbox: read it
             * after. */
            comp = PyObject_CallFunction(r->completions_of, "OnO", it, groups[g].count,
                                         r->cqe_size == CQE32_SIZE ? Py_True : Py_False);
            ok = comp && (box = iget(m, s_inbox)) && PyList_Append(box, comp) == 0;
        } else if ((box = iget(m, s_inbox))) {
            ok = PyList_Append(box, it) == 0;
        }
        Py_XDECREF(comp);
        Py_XDECREF(box);
        if (ok)
            woken[nw++] = m; /* the reference taken above */
        else {
            Py_DECREF(m);
            keep_first(&exc);
        }
    }
    for (Py_ssize_t i = 0; i < nw; i++)
        wake(woken[i], &exc);
    Py_DECREF(items);
    PyObject *ret = NULL;
    if (exc.type)
        exc_restore(exc);
    else
        ret = PyLong_FromUnsignedLong(n);
    goto done_ret;
fail:
    exc_drop(exc);
    Py_XDECREF(items);
done:
    ret = NULL;
done_ret:
    for (Py_ssize_t i = 0; i < nw; i++)
        Py_DECREF(woken[i]);
    if (copy != small)
        PyMem_Free(copy);
    if (groups != stack)
        PyMem_Free(groups);
    if (woken != mstack)
        PyMem_Free(woken);
    return ret;
}

/* The ring's fd, or -1 with an exception set (-2 without one: the ring is closed). */
static long long ring_fd(Router *r) {
    long long fd;
    if (!r->ring) { /* never initialised, or cleared by the cycle collector */
        PyErr_SetString(PyExc_ValueError, "the Router has no ring");
        return -1;
    }
    if (!iget_ll(r->ring, s_fd, &fd))
        return -1;
    return fd < 0 ? -2 : fd;
}

static PyObject *router_route(Router *r, PyObject *unused) {
    long long fd = ring_fd(r);
    if (fd < 0) {
        if (fd == -2)
            PyErr_SetString(PyExc_ValueError, "route: the io_uring is closed");
        return NULL;
    }
    return do_route(r);
}

/* poll(entered, efd) -> int: the rest of a pass after its submission (LoopRing.poll): run the
 * task work when the kernel flagged some, route the CQEs, then, when the pass entered the kernel
 * or was signalled (``entered``), reset the eventfd and look again. Returns -1 when no further
 * look was due (or the ring closed meanwhile), else whether the kernel has more (1) or not (0):
 * the caller schedules another pass for 1, or for SQEs prepared during the dispatch. */
static PyObject *router_poll(Router *r, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "poll(entered, efd)");
        return NULL;
    }
    int entered = PyObject_IsTrue(args[0]);
    long efd = PyLong_AsLong(args[1]);
    if (entered < 0 || (efd == -1 && PyErr_Occurred()))
        return NULL;
    if (efd < 0 || efd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "poll: efd is a file descriptor");
        return NULL;
    }
    long long fd = ring_fd(r);
    if (fd < 0)
        return fd == -2 ? PyLong_FromLong(-1) : NULL;
    if (__atomic_load_n(r->sq_flags, __ATOMIC_ACQUIRE) & r->work) {
        if (syscall(__NR_io_uring_enter, (int)fd, 0, 0, r->getevents, NULL, 0) < 0) {
            /* Ring.get_events redoes it and raises what the errno means */
            PyObject *res = PyObject_CallMethod(r->ring, "get_events", NULL);
            if (!res)
                return NULL;
            Py_DECREF(res);
            if ((fd = ring_fd(r)) < 0) /* that Python closed the ring (a GC pass) */
                return fd == -2 ? PyLong_FromLong(-1) : NULL;
        }
        entered = 1;
    }
    if (*r->ktail != *r->khead) {
        PyObject *n = do_route(r);
        if (!n)
            return NULL;
        Py_DECREF(n);
        if ((fd = ring_fd(r)) < 0) /* its last member left during the dispatch */
            return fd == -2 ? PyLong_FromLong(-1) : NULL;
    }
    if (!entered)
        return PyLong_FromLong(-1);
    uint64_t v;
    if (read((int)efd, &v, sizeof v) < 0 && errno != EAGAIN)
        return PyErr_SetFromErrno(PyExc_OSError);
    int more = (__atomic_load_n(r->sq_flags, __ATOMIC_ACQUIRE) & r->work) ||
               __atomic_load_n(r->ktail, __ATOMIC_ACQUIRE) != *r->khead;
    return PyLong_FromLong(more);
}

static PyMethodDef router_methods[] = {
    {"route", (PyCFunction)router_route, METH_NOARGS,
     "Every ready CQE to its member; returns how many."},
    {"poll", (PyCFunction)(void (*)(void))router_poll, METH_FASTCALL,
     "The rest of a pass after its submission; see the source."},
    {NULL, NULL, 0, NULL},
};

/* A type of this module; further slots (``tp_call``) may follow the doc. */
#define OBJECT_TYPE(Name, name, doc, ...)                                                 \
    static PyTypeObject Name##Type = {                                                    \
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

OBJECT_TYPE(Router, router, "The shared ring's CQEs routed to its members.");

/* ---------------------------------------------------------------------------------------- */
/* Round(transport, rx, member, provider, chunk_cls, release_deque, stats, recv_ud, f_more,  */
/*       buffer_shift); transport None: an AsyncReceiver's, for take() only                 */

struct Round {
    PyObject_HEAD
    PyObject *tr, *st, *rx, *member, *prov, *bufring, *cls, *queue, *stats;
    PyObject *bcls;                                /* the Batch class (NULL: no batch rounds) */
    PyObject *pool;                                /* the loop's Pool (NULL: a group of its own) */
    long long recv_ud, f_more;
    unsigned int buffer_shift;
    Py_ssize_t o_rx, o_off, o_len, o_tok, o_so;    /* the chunk class's slot offsets */
    Py_ssize_t o_offs, o_lens, o_lin;              /* the Batch class's own ones */
    PyObject *pop;                                 /* queue.popleft */
    PyObject *py_write;                            /* the transport class's own write */
    /* The provider's buffer ring as last seen, with what stays fixed for its life: its
     * io_uring, its entries' address, the area's base, entries, mask and buffer size. */
    PyObject *buf, *buf_ring;
    unsigned char *entries;
    unsigned long long base;
    long long n, mask, bs;
};

static PyObject *round_transport(Round *r) {
    if (!r->tr)
        PyErr_SetString(PyExc_ValueError, "the round is cleared");
    Py_XINCREF(r->tr);
    return r->tr;
}

#define ROUND_REFS(X)                                                                     \
    X(tr) X(st) X(rx) X(member) X(prov) X(bufring) X(cls) X(queue) X(stats) X(pop) X(py_write) \
    X(buf) X(buf_ring) X(bcls) X(pool)
GC_METHODS(Round, round, ROUND_REFS)

static int round_init(Round *r, PyObject *args, PyObject *kw) {
    PyObject *tr, *rx, *member, *prov, *bufring, *cls, *queue, *stats, *bcls = NULL,
        *pool = Py_None;
    long long recv_ud, f_more, shift;
    /* Checked in locals first: a failed __init__ leaves the Round as it was. */
    if (!PyArg_ParseTuple(args, "OOOOOO!OOLLL|O!O", &tr, &rx, &member, &prov, &bufring,
                          &PyType_Type, &cls, &queue, &stats, &recv_ud, &f_more, &shift,
                          &PyType_Type, &bcls, &pool))
        return -1;
    if (shift < 0 || shift > 31) {
        PyErr_SetString(PyExc_ValueError, "Round: buffer_shift is 0..31");
        return -1;
    }
    PyObject *const names[5] = {s_rx, s_offset, s_length, s_tok, s_stream_offset};
    Py_ssize_t offs[5];
    for (int i = 0; i < 5; i++)
        if (!(offs[i] = type_slot_offset((PyTypeObject *)cls, names[i]))) {
            PyErr_Format(PyExc_TypeError, "%R.%U is not a __slots__ member", cls, names[i]);
            return -1;
        }
    /* A Batch class: the chunk's held-object slots at the same offsets (``names`` 0, 2, 3, 4),
     * and its own three. */
    PyObject *const bnames[7] = {s_rx, s_length, s_tok, s_stream_offset, s_offsets, s_lengths,
                                 s_linear};
    const int same[4] = {0, 2, 3, 4};
    Py_ssize_t boffs[7] = {0};
    for (int i = 0; bcls && i < 7; i++) {
        boffs[i] = type_slot_offset((PyTypeObject *)bcls, bnames[i]);
        if (!boffs[i] || (i < 4 && boffs[i] != offs[same[i]])) {
            PyErr_Format(PyExc_TypeError, "%R.%U is not the __slots__ member a round needs",
                         bcls, bnames[i]);
            return -1;
        }
    }
    PyObject *pop = PyObject_GetAttr(queue, s_popleft);
    if (!pop)
        return -1;
    /* No transport (None): an AsyncReceiver's round, which only takes. */
    PyObject *w = tr == Py_None ? NULL : PyObject_GetAttr((PyObject *)Py_TYPE(tr), s_write);
    /* The transport's TransportState, read and written by every round. */
    PyObject *st = w ? PyObject_GetAttr(tr, s_st) : NULL;
    if (!st && tr != Py_None) {
        Py_XDECREF(w);
        Py_DECREF(pop);
        return -1;
    }
    r->f_more = f_more;
    r->buffer_shift = (unsigned)shift;
    r->o_rx = offs[0];
    r->o_off = offs[1];
    r->o_len = offs[2];
    r->o_tok = offs[3];
    r->o_so = offs[4];
    r->o_offs = boffs[4];
    r->o_lens = boffs[5];
    r->o_lin = boffs[6];
    Py_XINCREF(bcls);
    Py_XSETREF(r->bcls, bcls);
    Py_XSETREF(r->pool, pool == Py_None ? NULL : Py_NewRef(pool));
    Py_XSETREF(r->pop, pop);
    Py_XSETREF(r->py_write, w);
    Py_XSETREF(r->st, st);
    Py_CLEAR(r->buf);
    Py_CLEAR(r->buf_ring);
    PyObject *objs[8] = {tr == Py_None ? NULL : tr, rx, member, prov, bufring, cls, queue, stats};
    PyObject **dst[8] = {&r->tr, &r->rx, &r->member, &r->prov, &r->bufring, &r->cls, &r->queue,
                         &r->stats};
    for (int i = 0; i < 8; i++) {
        Py_XINCREF(objs[i]);
        Py_XSETREF(*dst[i], objs[i]);
    }
    r->recv_ud = recv_ud;
    return 0;
}

/* The buffer ring's fields a round reads and writes. */
typedef struct {
    unsigned char *entries; /* the ring's io_uring_buf entries (_bufring.h) */
    unsigned long long base;
    long long n, mask, bs, head, tail, in_ring;
} BufState;

/* Cache the fixed fields of ``buf`` (the provider's current buffer ring) unless cached: 1 done,
 * 0 error. */
static int cache_buf(Round *r, PyObject *buf) {
    if (buf == r->buf)
        return 1;
    long long addr, base, n, mask, bs;
    if (!get_ll(buf, s_entries_addr, &addr) || !get_ll(buf, s_base, &base) ||
        !get_ll(buf, s_entries, &n) || !get_ll(buf, s_mask, &mask) ||
        !get_ll(buf, s_buf_size, &bs))
        return 0;
    if (n < 1 || n > 32768 || mask != n - 1 || (n & mask) || bs < 1 || !addr) {
        PyErr_SetString(PyExc_ValueError, "a buffer ring of 2**k entries (at most 32768) and "
                                          "a buffer size > 0");
        return 0;
    }
    PyObject *ring = PyObject_GetAttr(buf, s_ring);
    if (!ring)
        return 0;
    Py_XSETREF(r->buf_ring, ring);
    Py_XSETREF(r->buf, Py_NewRef(buf));
    r->entries = (unsigned char *)(uintptr_t)addr;
    r->base = (unsigned long long)base;
    r->n = n;
    r->mask = mask;
    r->bs = bs;
    return 1;
}

static int read_buf(Round *r, PyObject *buf, BufState *b) {
    b->entries = r->entries;
    b->base = r->base;
    b->n = r->n;
    b->mask = r->mask;
    b->bs = r->bs;
    return iget_ll(buf, s_head, &b->head) && iget_ll(buf, s_tail, &b->tail) &&
           iget_ll(buf, s_in_ring, &b->in_ring);
}

#define ENTRY(b, i)                                                                        \
    buf_entry((b)->entries, (unsigned long long)(i), (unsigned long long)(b)->mask)

/* The receiver open: 1; -1 closed; 0 with an exception (the tri-state of ring_now). */
static int is_open(PyObject *rx) {
    int v = iget_true(rx, s_closed);
    return v < 0 ? 0 : v ? -1 : 1;
}

/* Attribute ``name`` of ``o`` is None: 1; -1 not; 0 with an exception. */
static int is_none(PyObject *o, PyObject *name) {
    PyObject *v = iget(o, name);
    if (!v)
        return 0;
    Py_DECREF(v);
    return v == Py_None ? 1 : -1;
}

/* The buffer ring as it stands now: registered, its fd open, its head, tail and count read
 * into *b. 1; -1 when it is not usable (the Python round runs); 0 with an exception. */
static int ring_now(Round *r, PyObject *buf, BufState *b) {
    long long fd;
    int v = iget_true(buf, s_registered);
    if (v != 1)
        return v < 0 ? 0 : -1;
    if (!iget_ll(r->buf_ring, s_fd, &fd))
        return 0;
    if (fd < 0)
        return -1;
    return read_buf(r, buf, b);
}

/* Buffer ids collected in C memory (no Python object, so no GC pass while it grows). */
typedef struct {
    uint16_t *v;
    Py_ssize_t n, cap;
} Ids;

static int ids_push(Ids *ids, long long t) {
    if (ids->n == ids->cap) {
        Py_ssize_t cap = ids->cap ? 2 * ids->cap : 64;
        uint16_t *v = PyMem_Realloc(ids->v, (size_t)cap * sizeof *v);
        if (!v) {
            PyErr_NoMemory();
            return 0;
        }
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = (uint16_t)t;
    return 1;
}

/* A released item's buffer ids (into ``ids``) and bytes: a plain chunk's one token, or a
 * Batch's list of them. 1 done, 0 error, -1 anything else (the Python flush takes it). */
static int held_tokens(Round *r, PyObject *c, long long bufs, Ids *ids, long long *nbytes) {
    PyObject *tok = SLOT(c, r->o_tok), *len = SLOT(c, r->o_len); /* borrowed */
    PyObject *one[1] = {tok};
    PyObject **toks = one;
    Py_ssize_t k = 1;
    if ((PyObject *)Py_TYPE(c) == r->cls)
        ;
    else if (r->bcls && (PyObject *)Py_TYPE(c) == r->bcls && tok && PyList_CheckExact(tok)) {
        toks = PySequence_Fast_ITEMS(tok);
        k = PyList_GET_SIZE(tok);
    } else
        return -1; /* a coalesced chunk, a batch of arrays: the Python flush */
    int ovf = 0;
    long long l = len && PyLong_CheckExact(len) ? PyLong_AsLongLongAndOverflow(len, &ovf) : -1;
    if (ovf || l < 0 || l > LLONG_MAX - *nbytes)
        return -1;
    for (Py_ssize_t i = 0; i < k; i++) {
        /* exact ints: no error but overflow, which the Python flush reports as it does */
        long long t = toks[i] && PyLong_CheckExact(toks[i])
                          ? PyLong_AsLongLongAndOverflow(toks[i], &ovf) : -1;
        if (ovf || t < 0 || t >= bufs)
            return -1;
        if (!ids_push(ids, t))
            return 0;
    }
    *nbytes += l;
    return 1;
}

/* Buffers went back to the loop's pool: with receivers waiting for some, its ``released()``
 * makes a pass come soon (PooledSoftProvider.recycle in Python). 1 done, 0 error. */
static int pool_released(PyObject *pool) {
    PyObject *waiting = PyObject_GetAttr(pool, s_waiting);
    int v = waiting ? PyObject_IsTrue(waiting) : -1;
    Py_XDECREF(waiting);
    if (v <= 0)
        return v == 0;
    PyObject *res = PyObject_CallMethodNoArgs(pool, s_released_now);
    Py_XDECREF(res);
    return res != NULL;
}

/* Released chunks and batches back to the buffer ring (Receiver._flush_releases +
 * BufRing.provide for plain chunks and list batches), the stats' released counts advanced.
 * 1 done, 0 error, -1 fall back (nothing changed). The ring and the counts are read here,
 * after the last point where Python can run before they are written.
 *
 * Every item is checked and its ids copied before anything changes; the items are then taken
 * off the queue and held until the ring and the counts are written: dropping the last
 * reference to one can run Python (a finalizer of something stored in it), which then finds
 * the ring, the queue and the counts consistent. */
static int flush_releases(Round *r, PyObject *buf) {
    Py_ssize_t n = PyObject_Length(r->queue);
    if (n < 0)
        return 0;
    if (n == 0)
        return 1;
    PyObject *it = PyObject_GetIter(r->queue);
    if (!it)
        return 0;
    Ids ids = {NULL, 0, 0};
    long long nbytes = 0;
    int verdict = 1;
    for (Py_ssize_t i = 0; i < n && verdict == 1; i++) {
        PyObject *c = PyIter_Next(it); /* the queue keeps its own reference */
        if (!c) {
            verdict = PyErr_Occurred() ? 0 : -1;
            break;
        }
        verdict = held_tokens(r, c, r->n, &ids, &nbytes);
        Py_DECREF(c);
    }
    Py_DECREF(it);
    /* Getting the iterator allocates: a GC pass there may have released and flushed in
     * Python, or closed the receiver. Nothing from here on runs Python: read the state now. */
    BufState bs, *b = &bs;
    long long rel, relb;
    if (verdict == 1 && (verdict = is_open(r->rx)) == 1 && (verdict = ring_now(r, buf, b)) == 1 &&
        !(iget_ll(r->stats, s_released, &rel) && iget_ll(r->stats, s_released_bytes, &relb)))
        verdict = 0;
    PyObject **items = verdict == 1 ? PyMem_Malloc((size_t)n * sizeof *items) : NULL;
    if (verdict == 1 && !items) {
        PyErr_NoMemory();
        verdict = 0;
    }
    if (verdict == 1 && b->in_ring + ids.n > b->n)
        verdict = -1; /* a double release: BufRing's check raises it */
    if (verdict != 1) {
        PyMem_Free(ids.v);
        PyMem_Free(items);
        return verdict;
    }
    Py_ssize_t taken = 0;
    for (; taken < n; taken++) /* popleft runs no Python: the items are the ones checked */
        if (!(items[taken] = PyObject_CallNoArgs(r->pop)))
            break;
    if (taken == n) {
        long long t = b->tail;
        for (Py_ssize_t j = 0; j < ids.n; j++, t++)
            buf_put(ENTRY(b, t), b->base + (uint64_t)ids.v[j] * (uint64_t)b->bs,
                    (uint32_t)b->bs, ids.v[j]);
        b->tail = t & 0xFFFF;
        b->in_ring += ids.n;
        buf_publish_tail(b->entries, (uint16_t)b->tail); /* after the entries above */
        verdict = iset_ll(buf, s_tail, b->tail) && iset_ll(buf, s_in_ring, b->in_ring) &&
                  iset_ll(r->stats, s_released, rel + ids.n) &&
                  iset_ll(r->stats, s_released_bytes, relb + nbytes);
    } else
        verdict = 0; /* cannot happen: n items were there and only this thread takes */
    PyMem_Free(ids.v);
    for (Py_ssize_t i = 0; i < taken; i++)
        Py_DECREF(items[i]);
    PyMem_Free(items);
    if (verdict == 1 && ids.n && r->pool)
        verdict = pool_released(r->pool);
    return verdict;
}

/* The chunks from ``i`` on were never the protocol's: the transport keeps them in its state's
 * ``held`` and releases them at its teardown (the pending exception stays pending). */
static void keep_rest(PyObject *st, PyObject *chunks, Py_ssize_t i) {
    Exc exc = exc_take();
    PyObject *rest = PyList_GetSlice(chunks, i, PyList_GET_SIZE(chunks));
    if (!rest || PyObject_SetAttr(st, s_held, rest) < 0)
        PyErr_WriteUnraisable(st);
    Py_XDECREF(rest);
    exc_restore(exc);
}

/* Call ``tr.<name>(list)``. */
static int call_with_list(PyObject *o, PyObject *name, PyObject *list) {
    PyObject *res = PyObject_CallMethodOneArg(o, name, list);
    Py_XDECREF(res);
    return res != NULL;
}

/* One buffer of a round: its id and the bytes the kernel put in it. */
typedef struct {
    uint16_t bid;
    uint32_t len;
} Piece;

static PyObject *make_batch(Round *r, const Piece *pieces, Py_ssize_t k, long long bs,
                            long long s);
static PyObject *make_chunks(Round *r, const Piece *pieces, Py_ssize_t k, long long bs,
                             long long s);

/* The common case of a round up to its chunks, for round_run (which then gives them to the
 * protocol) and round_take (which returns them): every check, the releases back to the buffer
 * ring, the member's completions taken, the chunks made and the counts advanced. A new list of
 * at least one chunk (``batch``: one Batch instead); or NULL with no exception and *code DONE
 * (no completions: the releases went back, and a receive that had ended is re-armed) or
 * FALLBACK (nothing changed: the Python round runs); or NULL with an exception. */
static PyObject *take_chunks(Round *r, int *code, int batch) {
    PyObject *buf = NULL, *chunks = NULL;
    int v;
    long long x;
#define BAIL(c) do { Py_XDECREF(buf); *code = (c); return NULL; } while (0)
/* A check answering 1 (go on), -1 (the Python round runs) or 0 (an exception). */
#define CHECK(e) do { if ((v = (e)) != 1) { if (v == 0) goto error; BAIL(FALLBACK); } } while (0)
    /* The receiver: open and owned by this thread; releases first, as Receiver._next does. */
    CHECK(is_open(r->rx));
    if (!iget_ll(r->rx, s_owner_tid, &x))
        goto error;
    if ((unsigned long long)x != (unsigned long long)PyThread_get_thread_ident())
        BAIL(FALLBACK);
    if (!r->bufring)
        BAIL(FALLBACK);
    buf = Py_NewRef(r->bufring);
    if (!cache_buf(r, buf))
        goto error;
    CHECK(flush_releases(r, buf));
    /* The flush dropped the released items: a finalizer may have released and flushed, run a
     * round in Python (which may arm or end the receive), or closed the receiver. Everything
     * used below is read after it. The receiver: open, not ended, not paused; armed, or its
     * multishot ended with data after an earlier arm (re-armed below, as Receiver._next
     * does). */
    CHECK(is_open(r->rx));
    CHECK(is_none(r->rx, s_stalled));
    long long phase;
    if (!iget_ll(r->rx, s_phase, &phase))
        goto error;
    if (phase != PHASE_ARMED && phase != PHASE_STOPPED)
        BAIL(FALLBACK); /* never armed, or ended: the Python round */
    int armed = phase == PHASE_ARMED;
    BufState b;
    CHECK(ring_now(r, buf, &b));
    if (b.bs > INT32_MAX)
        BAIL(FALLBACK);
    long long dl, dlb, rel, relb, limit;
    if (!iget_ll(r->stats, s_delivered, &dl) ||
        !iget_ll(r->stats, s_delivered_bytes, &dlb) ||
        !iget_ll(r->stats, s_released, &rel) ||
        !iget_ll(r->stats, s_released_bytes, &relb) ||
        !iget_ll(r->rx, s_limit, &limit))
        goto error;
    /* Back-pressure: the Python round pauses and counts it. */
    if (dlb - relb > limit)
        BAIL(FALLBACK);
    /* The member's completions: one list of tuples, each data of the receive in one buffer. */
    PyObject *box = iget(r->member, s_inbox);
    if (!box)
        goto error;
    Py_DECREF(box); /* the member keeps it */
    if (!PyList_CheckExact(box))
        BAIL(FALLBACK);
    if (!armed) {
        /* The last round's final CQE ended the multishot (a bundle took the ring's last
         * buffer). With the releases back, arm it again and wait for its completions; left
         * completions, or no buffer to arm with (the Python round pauses), go to Python, and
         * so does a pooled receiver, which waits for the pool's turn to arm. */
        if (PyList_GET_SIZE(box) != 0 || b.in_ring == 0 || r->pool)
            BAIL(FALLBACK);
        PyObject *ok = PyObject_CallMethodNoArgs(r->prov, s_arm);
        if (!ok)
            goto error;
        Py_DECREF(ok);
        /* RxCore.armed_now: the receive is armed again, counted. */
        long long n;
        if (!iget_ll(r->stats, s_rearms, &n) || !iset_ll(r->stats, s_rearms, n + 1) ||
            !iset_ll(r->rx, s_phase, PHASE_ARMED))
            goto error;
        /* arm() ran Python (a GC pass, say) that may have closed the receiver: waiting then
         * would never end; the Python round raises ClosedError instead. */
        CHECK(is_open(r->rx));
        BAIL(DONE);
    }
    if (PyList_GET_SIZE(box) == 0)
        BAIL(DONE);
    PyObject *cqes = PyList_GET_ITEM(box, 0);
    if (PyList_GET_SIZE(box) != 1 || !PyList_CheckExact(cqes))
        BAIL(FALLBACK);
    /* Each CQE's buffers: the next ones in ring order, the first named by the CQE (with
     * bundles one CQE fills several, each full but the last); pooled, the one buffer the CQE
     * names. Only the last CQE may lack F_MORE: data that ended the multishot, re-armed by
     * the next round (pooled: at the pool's turn). */
    Py_ssize_t ncqe = PyList_GET_SIZE(cqes), k = 0;
    long long total = 0;
    int ended = 0;
    for (Py_ssize_t i = 0; i < ncqe; i++) {
        PyObject *t = PyList_GET_ITEM(cqes, i);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 3 ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(t, 0)) ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(t, 1)) ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(t, 2)))
            BAIL(FALLBACK); /* the Router's tuples hold ints: converting them runs no Python */
        long long ud = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 0));
        long long res = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 1));
        long long fl = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2));
        if (PyErr_Occurred())
            goto error;
        if (ud != r->recv_ud || res <= 0 || (!(fl & r->f_more) && i != ncqe - 1))
            BAIL(FALLBACK);
        ended = !(fl & r->f_more);
        long long count = (res + b.bs - 1) / b.bs;
        if (k + count > b.in_ring)
            BAIL(FALLBACK); /* out of step: the Python round raises it */
        unsigned bid = cqe_buffer_id((uint32_t)fl, r->buffer_shift);
        if (r->pool ? count != 1 || (long long)bid >= b.n
                    : bid != buf_bid(ENTRY(&b, b.head + k)))
            BAIL(FALLBACK);
        k += count;
        total += res;
    }
    /* Each buffer's id and bytes (in ring order; with bundles a CQE fills several, each full
     * but the last), read now: the allocations below can start a GC pass whose finalizers
     * may close the receiver and unmap its buffer ring. */
    Piece *pieces = PyMem_Malloc((size_t)(k ? k : 1) * sizeof *pieces);
    if (!pieces) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0, j = 0; i < ncqe; i++) {
        PyObject *t = PyList_GET_ITEM(cqes, i);
        long long res = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 1));
        if (r->pool) { /* checked above: one buffer, named by the CQE */
            uint32_t fl = (uint32_t)PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2));
            pieces[j++] = (Piece){(uint16_t)cqe_buffer_id(fl, r->buffer_shift), (uint32_t)res};
            continue;
        }
        for (; res > 0; j++, res -= b.bs)
            pieces[j] = (Piece){buf_bid(ENTRY(&b, b.head + j)),
                                (uint32_t)(res < b.bs ? res : b.bs)};
    }
    /* Committed from here: the completions are taken. */
    long long s0;
    if (PyList_SetSlice(box, 0, 1, NULL) < 0 || !iget_ll(r->rx, s_stream_off, &s0)) {
        PyMem_Free(pieces);
        goto error;
    }
    /* The ring's head and count, the delivered counts and the stream offset, written before
     * any object is made: an allocation below can start a GC pass whose finalizers release
     * and flush (moving the ring's tail and count), which must find them current. */
    long long pk, pkb;
    /* Pooled: BufRing.took, the shared ring's head is not followed (CQE order is not ring
     * order across receivers). */
    if ((!r->pool && !iset_ll(buf, s_head, (b.head + k) & 0xFFFF)) ||
        !iset_ll(buf, s_in_ring, b.in_ring - k) ||
        !iset_ll(r->stats, s_delivered, dl + k) ||
        !iset_ll(r->stats, s_delivered_bytes, dlb + total) ||
        !iget_ll(r->stats, s_peak, &pk) ||
        !iget_ll(r->stats, s_peak_bytes, &pkb) ||
        (dl + k - rel > pk && !iset_ll(r->stats, s_peak, dl + k - rel)) ||
        (dlb + total - relb > pkb && !iset_ll(r->stats, s_peak_bytes, dlb + total - relb)) ||
        !iset_ll(r->rx, s_stream_off, s0 + total) ||
        (ended && !iset_ll(r->rx, s_phase, PHASE_STOPPED))) {
        PyMem_Free(pieces);
        goto error; /* only memory runs out here */
    }
    /* Then the chunks, or the one Batch. Memory running out from here loses these buffers to
     * the receiver (counted delivered, never handed out) until it closes; the ring stays in
     * step with the kernel. */
    chunks = batch ? make_batch(r, pieces, k, b.bs, s0) : make_chunks(r, pieces, k, b.bs, s0);
    PyMem_Free(pieces);
    Py_DECREF(buf);
    return chunks;
error:
    Py_XDECREF(buf);
    return NULL;
#undef BAIL
#undef CHECK
}

/* The round's k buffers as a list of chunks, from stream offset ``s``. NULL only when memory
 * runs out. */
static PyObject *make_chunks(Round *r, const Piece *pieces, Py_ssize_t k, long long bs,
                             long long s) {
    PyTypeObject *cls = (PyTypeObject *)r->cls;
    PyObject *chunks = PyList_New(k);
    if (!chunks)
        return NULL;
    for (Py_ssize_t j = 0; j < k; s += pieces[j].len, j++) {
        PyObject *c = cls->tp_alloc(cls, 0);
        if (!c)
            goto error;
        /* A fresh object's slots are NULL: set in place; its dealloc frees what is set. */
        SLOT(c, r->o_rx) = Py_NewRef(r->rx);
        PyList_SET_ITEM(chunks, j, c);
        if (!(SLOT(c, r->o_off) = PyLong_FromLongLong(pieces[j].bid * bs)) ||
            !(SLOT(c, r->o_len) = PyLong_FromUnsignedLong(pieces[j].len)) ||
            !(SLOT(c, r->o_tok) = PyLong_FromLong(pieces[j].bid)) ||
            !(SLOT(c, r->o_so) = PyLong_FromLongLong(s)))
            goto error;
    }
    return chunks;
error:
    Py_DECREF(chunks);
    return NULL;
}

/* The round's k buffers as one Batch, as Receiver.recv_batch makes it from a few CQEs: lists
 * of tokens, offsets and lengths, from stream offset ``s``. NULL only when memory runs out. */
static PyObject *make_batch(Round *r, const Piece *pieces, Py_ssize_t k, long long bs,
                            long long s) {
    PyTypeObject *cls = (PyTypeObject *)r->bcls;
    PyObject *toks = PyList_New(k), *offs = PyList_New(k), *lens = PyList_New(k);
    PyObject *bt = toks && offs && lens ? cls->tp_alloc(cls, 0) : NULL;
    long long s0 = s;
    if (!bt)
        goto error;
    /* A fresh object's slots are NULL: set in place; its dealloc frees what is set. */
    SLOT(bt, r->o_rx) = Py_NewRef(r->rx);
    SLOT(bt, r->o_tok) = Py_NewRef(toks);
    SLOT(bt, r->o_offs) = Py_NewRef(offs);
    SLOT(bt, r->o_lens) = Py_NewRef(lens);
    SLOT(bt, r->o_lin) = Py_NewRef(Py_None);
    for (Py_ssize_t j = 0; j < k; s += pieces[j].len, j++) {
        PyObject *t = PyLong_FromLong(pieces[j].bid);
        PyObject *o = PyLong_FromLongLong(pieces[j].bid * bs);
        PyObject *l = PyLong_FromUnsignedLong(pieces[j].len);
        if (!t || !o || !l) {
            Py_XDECREF(t);
            Py_XDECREF(o);
            Py_XDECREF(l);
            goto error;
        }
        PyList_SET_ITEM(toks, j, t);
        PyList_SET_ITEM(offs, j, o);
        PyList_SET_ITEM(lens, j, l);
    }
    if (!(SLOT(bt, r->o_so) = PyLong_FromLongLong(s0)) ||
        !(SLOT(bt, r->o_len) = PyLong_FromLongLong(s - s0)))
        goto error;
    Py_DECREF(toks);
    Py_DECREF(offs);
    Py_DECREF(lens);
    return bt;
error:
    Py_XDECREF(bt);
    Py_XDECREF(toks);
    Py_XDECREF(offs);
    Py_XDECREF(lens);
    return NULL;
}

/* run() -> int: one round; DONE (nothing more now), AGAIN (call again), FALLBACK (run the
 * Python round), STOPPED (the protocol closed or paused the transport in a callback). */
static PyObject *round_run(Round *r, PyObject *unused) {
    PyObject *chunks = NULL, *proto = NULL, *cb = NULL;
    int v, code = FALLBACK;
    if (!r->tr || !r->st)
        return PyLong_FromLong(FALLBACK); /* cleared by the cycle collector, or a receiver's */
    /* The transport: receiving (not closing, paused, at EOF or waiting for a release). */
    PyObject *const flags[4] = {s_closing, s_paused, s_eof, s_waiting_release};
    for (int i = 0; i < 4; i++)
        if ((v = iget_true(r->st, flags[i])) != 0)
            return v < 0 ? NULL : PyLong_FromLong(FALLBACK);
    if (!(chunks = take_chunks(r, &code, 0)))
        return PyErr_Occurred() ? NULL : PyLong_FromLong(code);
    Py_ssize_t k = PyList_GET_SIZE(chunks);
    /* To the protocol. */
    proto = iget(r->tr, s_protocol);
    cb = proto ? PyObject_GetAttr(proto, s_chunk_received) : NULL;
    if (!cb) {
        keep_rest(r->st, chunks, 0);
        goto error;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *res = PyObject_CallOneArg(cb, PyList_GET_ITEM(chunks, i));
        if (!res) {
            keep_rest(r->st, chunks, i + 1);
            goto error;
        }
        Py_DECREF(res);
        int closing = iget_true(r->st, s_closing);
        int paused = closing < 0 ? 0 : iget_true(r->st, s_paused);
        if (closing < 0 || paused < 0) {
            keep_rest(r->st, chunks, i + 1);
            goto error;
        }
        if (closing || paused) {
            PyObject *rest = PyList_GetSlice(chunks, i + 1, k);
            int ok = rest && call_with_list(r->tr, s_put_back, rest);
            Py_XDECREF(rest);
            if (!ok)
                goto error;
            Py_DECREF(cb);
            Py_DECREF(proto);
            Py_DECREF(chunks);
            return PyLong_FromLong(STOPPED);
        }
    }
    Py_DECREF(cb);
    Py_DECREF(proto);
    Py_DECREF(chunks);
    PyObject *box = iget(r->member, s_inbox);
    if (!box)
        return NULL;
    Py_ssize_t more = PyObject_Length(box);
    Py_DECREF(box);
    if (more < 0)
        return NULL;
    long long phase;
    if (!iget_ll(r->rx, s_phase, &phase))
        return NULL;
    return PyLong_FromLong(more || phase != PHASE_ARMED ? AGAIN : DONE);
error:
    Py_XDECREF(chunks);
    Py_XDECREF(proto);
    Py_XDECREF(cb);
    return NULL;
}

/* take() -> list | int: a round's chunks for an AsyncReceiver's ``async for`` (a Round made
 * with no transport), else DONE (no completions; the releases went back) or FALLBACK. */
static PyObject *round_take(Round *r, PyObject *unused) {
    int code = FALLBACK;
    if (!r->rx)
        return PyLong_FromLong(FALLBACK); /* cleared by the cycle collector */
    PyObject *chunks = take_chunks(r, &code, 0);
    if (chunks || PyErr_Occurred())
        return chunks;
    return PyLong_FromLong(code);
}

/* take_batch() -> Batch | int: the same round as one Batch, for ``recv_batch``; FALLBACK when
 * the Round was made without a Batch class. */
static PyObject *round_take_batch(Round *r, PyObject *unused) {
    int code = FALLBACK;
    if (!r->rx || !r->bcls)
        return PyLong_FromLong(FALLBACK);
    PyObject *bt = take_chunks(r, &code, 1);
    if (bt || PyErr_Occurred())
        return bt;
    return PyLong_FromLong(code);
}

/* write(data): ZcTransport.write's common case, as the transport's ``write``: open, nothing
 * buffered, and the socket takes all of ``data`` (a non-blocking send that keeps the GIL).
 * What the socket does not take goes to ``_buffer_rest``, a send error to ``_send_failed``,
 * and anything else (closing, a backlog, no contiguous buffer) to the Python write. */
static PyObject *round_write(Round *r, PyObject *data) {
    PyObject *tr = r->tr, *st = r->st;
    if (!tr || !st)
        return round_transport(r); /* cleared by the cycle collector: raises */
    int closing = iget_true(st, s_closing);
    if (closing < 0)
        return NULL;
    Py_ssize_t backlog = 0;
    if (!closing) {
        PyObject *wbuf = iget(st, s_wbuf);
        backlog = wbuf ? PyObject_Length(wbuf) : -1;
        Py_XDECREF(wbuf);
        if (backlog < 0)
            return NULL;
    }
    long long fd = -1;
    Py_buffer view;
    if (closing || backlog != 0 || !iget_ll(st, s_fd, &fd) ||
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* the Python write raises what applies */
        return PyObject_CallFunctionObjArgs(r->py_write, tr, data, NULL);
    }
    if (view.len == 0) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    ssize_t n = send((int)fd, view.buf, (size_t)view.len, MSG_NOSIGNAL);
    int err = errno;
    Py_ssize_t len = view.len;
    PyBuffer_Release(&view);
    if (n == len)
        Py_RETURN_NONE;
    if (n >= 0 || err == EAGAIN || err == EWOULDBLOCK || err == EINTR) {
        PyObject *sent = PyLong_FromSsize_t(n > 0 ? n : 0);
        PyObject *res = sent ? PyObject_CallMethodObjArgs(tr, s_buffer_rest, data, sent, NULL)
                             : NULL;
        Py_XDECREF(sent);
        return res;
    }
    errno = err;
    PyErr_SetFromErrno(PyExc_OSError);
    Exc e = exc_take();
    PyErr_NormalizeException(&e.type, &e.value, &e.tb);
    PyObject *res = PyObject_CallMethodOneArg(tr, s_send_failed, e.value);
    exc_drop(e);
    return res;
}

static PyMethodDef round_methods[] = {
    {"run", (PyCFunction)round_run, METH_NOARGS,
     "One receive round: DONE 0, AGAIN 1, FALLBACK 2, STOPPED 3."},
    {"take_batch", (PyCFunction)round_take_batch, METH_NOARGS,
     "One receive round as a Batch, else DONE 0 or FALLBACK 2."},
    {"take", (PyCFunction)round_take, METH_NOARGS,
     "One receive round's chunks as a list, else DONE 0 or FALLBACK 2."},
    {"write", (PyCFunction)round_write, METH_O, "The transport's write (common case)."},
    {NULL, NULL, 0, NULL},
};

OBJECT_TYPE(Round, round, "One ZcTransport's receive round in C (the common case).");


/* ---------------------------------------------------------------------------------------- */
/* Anext(round, receiver, member, owner_tid, is_running, create_future, pending, py_anext,  */
/*       closed_error): an AsyncReceiver's ``__anext__`` (zcnet.aio.receiver) in C.        */
/*                                                                                          */
/* Each call gives an awaitable (AnextOp) for one chunk, as the Python ``__anext__`` and    */
/* ``_round`` give it: one waiting in ``pending``, else the Round's take(); with none yet,  */
/* the member's waiter future (as MemberRing.wait makes it) is awaited through its own      */
/* __await__, and take() runs again once it resolves. Anything else (another thread or    */
/* loop, a closed receiver, another task's live waiter, a FALLBACK round) hands the step to */
/* the Python coroutine ``py_anext``, which receives or raises with its own checks. What   */
/* it saves per chunk: two coroutine frames, and the owner and waiter checks in Python.     */

typedef struct {
    PyObject_HEAD
    PyObject *round, *arx, *member, *running, *create_future, *pending, *popleft, *py_anext,
        *closed_error;
    unsigned long tid;
} Anext;

#define ANEXT_REFS(X)                                                                      \
    X(round) X(arx) X(member) X(running) X(create_future) X(pending) X(popleft) X(py_anext)  \
    X(closed_error)
GC_METHODS(Anext, anext, ANEXT_REFS)

static int anext_init(Anext *a, PyObject *args, PyObject *kw) {
    PyObject *round, *arx, *member, *running, *cf, *pending, *py_anext, *closed_error;
    unsigned long long tid;
    if (!PyArg_ParseTuple(args, "O!OOKOOOOO", &RoundType, &round, &arx, &member, &tid,
                          &running, &cf, &pending, &py_anext, &closed_error))
        return -1;
    if (!PyCallable_Check(running) || !PyCallable_Check(cf) || !PyCallable_Check(py_anext) ||
        !PyExceptionClass_Check(closed_error)) {
        PyErr_SetString(PyExc_TypeError, "Anext: is_running, create_future and py_anext are "
                                         "callables, closed_error an exception class");
        return -1;
    }
    PyObject *popleft = PyObject_GetAttr(pending, s_popleft);
    if (!popleft)
        return -1;
    PyObject *objs[8] = {round, arx, member, running, cf, pending, py_anext, closed_error};
    PyObject **dst[8] = {&a->round,   &a->arx,     &a->member,   &a->running,
                         &a->create_future, &a->pending, &a->py_anext, &a->closed_error};
    for (int i = 0; i < 8; i++)
        Py_XSETREF(*dst[i], Py_NewRef(objs[i]));
    Py_XSETREF(a->popleft, popleft);
    a->tid = (unsigned long)tid;
    return 0;
}

#ifdef Py_TPFLAGS_HAVE_AM_SEND /* 3.10 reads am_send only with it */
#define AM_SEND_FLAG Py_TPFLAGS_HAVE_AM_SEND
#else
#define AM_SEND_FLAG 0
#endif

/* 1 when called from the owner's thread with its loop running (``running``: the loop's
 * is_running), 0 when not (the Python path says why), -1 on an error. */
static int owner_here(unsigned long tid, PyObject *running) {
    if (PyThread_get_thread_ident() != tid)
        return 0;
    PyObject *res = PyObject_CallNoArgs(running);
    if (!res)
        return -1;
    Py_DECREF(res);
    return res == Py_True;
}

/* One await of the next chunk: FRESH until first sent to, then waiting on the member's
 * future (WAIT) or driving the Python step (PY), DONE once it returned or raised. While it
 * waits, ``fut`` is the future it made the member's waiter: an await that ends unwoken
 * (closed, thrown into, dropped after a step) takes it back, or every later wait would be
 * refused as another task's (as the Python round's ``finally`` does). */
enum { OP_FRESH, OP_WAIT, OP_PY, OP_DONE };

typedef struct {
    PyObject_HEAD
    PyObject *a, *delegate, *fut;
    int state, running; /* running: a send, throw or close is under way (re-entry refused) */
} AnextOp;

#define ANEXTOP_REFS(X) X(a) X(delegate) X(fut)
GC_METHODS(AnextOp, anextop, ANEXTOP_REFS)
static PyTypeObject AnextOpType;

static PyObject *anext_call(Anext *a, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "Anext() takes no arguments");
        return NULL;
    }
    AnextOp *op = PyObject_GC_New(AnextOp, &AnextOpType);
    if (!op)
        return NULL;
    op->a = Py_NewRef(a);
    op->delegate = op->fut = NULL;
    op->state = OP_FRESH;
    op->running = 0;
    PyObject_GC_Track(op);
    return (PyObject *)op;
}

/* The wait is over (woken, or ended unwoken): the member's waiter goes back to None if it is
 * still this op's future. 0 done, -1 error. */
static int op_forget(AnextOp *op) {
    PyObject *fut = op->fut;
    if (!fut)
        return 0;
    op->fut = NULL;
    Anext *a = (Anext *)op->a;
    PyObject *w = a->member ? iget(a->member, s_waiter) : Py_NewRef(Py_None);
    int r = w ? 0 : -1;
    if (w == fut)
        r = iset(a->member, s_waiter, Py_None);
    Py_XDECREF(w);
    Py_DECREF(fut);
    return r;
}

/* Dropped while it waits: take the waiter back (the pending exception stays). */
static void anextop_finalize(AnextOp *op) {
    if (!op->fut)
        return;
    Exc e = exc_take();
    if (op_forget(op) < 0)
        PyErr_WriteUnraisable((PyObject *)op);
    exc_restore(e);
}

/* Send ``arg`` into the delegate (held while it runs); a result other than NEXT ends the
 * delegation. */
static PySendResult op_delegate(AnextOp *op, PyObject *arg, PyObject **result) {
    PyObject *d = Py_NewRef(op->delegate);
    PySendResult r = PyIter_Send(d, arg, result);
    if (r != PYGEN_NEXT && op->delegate == d)
        Py_CLEAR(op->delegate);
    Py_DECREF(d);
    return r;
}

/* A step may not start while one runs (a finalizer or a callback re-entering it), as a
 * running coroutine refuses. */
static int op_enter(AnextOp *op) {
    if (op->running) {
        PyErr_SetString(PyExc_ValueError, "receive already executing");
        return 0;
    }
    op->running = 1;
    return 1;
}

/* Hand the step to the Python coroutine. */
static PySendResult op_py(AnextOp *op, PyObject **result) {
    PyObject *co = PyObject_CallNoArgs(((Anext *)op->a)->py_anext);
    if (!co) {
        op->state = OP_DONE;
        return PYGEN_ERROR;
    }
    op->delegate = co;
    op->state = OP_PY;
    PySendResult r = op_delegate(op, Py_None, result);
    if (r != PYGEN_NEXT)
        op->state = OP_DONE;
    return r;
}

/* A round's chunks: the first is the result, the rest wait in ``pending`` (none: EOF); a
 * receiver closed meanwhile (a finalizer inside the round) releases them at once, as the
 * Python step does (``_drop_pending``). */
static PySendResult op_got(AnextOp *op, PyObject *chunks, PyObject **result) {
    Anext *a = (Anext *)op->a;
    Py_ssize_t n = PyList_GET_SIZE(chunks);
    op->state = OP_DONE;
    if (n == 0) {
        Py_DECREF(chunks);
        PyErr_SetNone(PyExc_StopAsyncIteration);
        return PYGEN_ERROR;
    }
    if (n > 1) {
        PyObject *rest = PyList_GetSlice(chunks, 1, n);
        PyObject *res = rest ? PyObject_CallMethodOneArg(a->pending, s_extend, rest) : NULL;
        Py_XDECREF(rest);
        int closed = res ? iget_true(a->arx, s_arx_closed) : -1;
        Py_XDECREF(res);
        if (closed > 0) {
            res = PyObject_CallMethodNoArgs(a->arx, s_drop_pending);
            Py_XDECREF(res);
            if (!res)
                closed = -1;
        }
        if (closed < 0) {
            Py_DECREF(chunks);
            return PYGEN_ERROR;
        }
    }
    *result = Py_NewRef(PyList_GET_ITEM(chunks, 0));
    Py_DECREF(chunks);
    return PYGEN_RETURN;
}

/* Whether a new waiter may replace the member's (none, or resolved); -1 on error. */
static int waiter_free(PyObject *member) {
    PyObject *w = iget(member, s_waiter);
    if (!w || w == Py_None) {
        Py_XDECREF(w);
        return w ? 1 : -1;
    }
    PyObject *d = PyObject_CallMethodNoArgs(w, s_done);
    Py_DECREF(w);
    int done = d ? PyObject_IsTrue(d) : -1;
    Py_XDECREF(d);
    return done;
}

/* The member's new waiter future, awaited: NEXT with it yielded, else RETURN (it resolved at
 * once: *result None) or ERROR. */
static PySendResult op_wait(AnextOp *op, PyObject **result) {
    Anext *a = (Anext *)op->a;
    PyObject *fut = PyObject_CallNoArgs(a->create_future);
    if (!fut)
        return PYGEN_ERROR;
    unaryfunc aw = Py_TYPE(fut)->tp_as_async ? Py_TYPE(fut)->tp_as_async->am_await : NULL;
    if (!aw || iset(a->member, s_waiter, fut) < 0) {
        if (!aw)
            PyErr_SetString(PyExc_TypeError, "create_future() gave no awaitable");
        Py_DECREF(fut);
        return PYGEN_ERROR;
    }
    Py_XSETREF(op->fut, fut); /* the member's waiter from here: op_forget takes it back */
    PyObject *box = iget(a->member, s_inbox);
    Py_ssize_t queued = box ? PyObject_Length(box) : -1;
    Py_XDECREF(box);
    if (queued == 0) {
        int closed = iget_true(a->arx, s_arx_closed);
        queued = closed < 0 ? -1 : closed;
    }
    if (queued != 0) {
        /* Completions came while no waiter was set, or the receiver was closed then (a GC
         * pass in create_future or between take() and here can run a nested pass or a
         * close, whose kick found no waiter): take them, or raise, instead of sleeping. */
        if (queued < 0)
            return PYGEN_ERROR; /* the caller forgets the waiter */
        if (op_forget(op) < 0)
            return PYGEN_ERROR;
        *result = Py_NewRef(Py_None);
        return PYGEN_RETURN;
    }
    PyObject *it = aw(op->fut);
    if (!it)
        return PYGEN_ERROR;
    op->delegate = it;
    op->state = OP_WAIT;
    return op_delegate(op, Py_None, result);
}

/* The receive is over with an exception: DONE, and the waiter taken back (the exception stays
 * pending unless that fails). */
static PySendResult op_fail(AnextOp *op) {
    op->state = OP_DONE;
    Exc e = exc_take();
    if (op_forget(op) < 0)
        exc_drop(e);
    else
        exc_restore(e);
    return PYGEN_ERROR;
}

static PySendResult op_send(AnextOp *op, PyObject *arg, PyObject **result) {
    Anext *a = (Anext *)op->a;
    PyObject *res;
    int v;
    *result = NULL;
    if (!a->round || !a->arx || !a->member || !a->running || !a->create_future ||
        !a->pending || !a->popleft || !a->py_anext || !a->closed_error) {
        PyErr_SetString(PyExc_ValueError, "the Anext is not initialised");
        return PYGEN_ERROR;
    }
    switch (op->state) {
    case OP_DONE:
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited receive");
        return PYGEN_ERROR;
    case OP_PY: {
        PySendResult r = op_delegate(op, arg, result);
        if (r != PYGEN_NEXT)
            op->state = OP_DONE;
        return r;
    }
    case OP_WAIT: {
        PySendResult r = op_delegate(op, arg, result);
        if (r != PYGEN_RETURN) {
            if (r == PYGEN_ERROR) /* the future raised (cancelled): the wait is over */
                return op_fail(op);
            return r;
        }
        Py_CLEAR(*result);
        goto woken;
    }
    default: /* FRESH: from the owner's thread with its loop running, on an open receiver */
        if (arg != Py_None) {
            PyErr_SetString(PyExc_TypeError,
                            "can't send non-None value to a just-started receive");
            goto error;
        }
        int here = owner_here(a->tid, a->running);
        int closed = here > 0 ? iget_true(a->arx, s_arx_closed) : 0;
        if (here < 0 || closed < 0)
            goto error;
        if (!here || closed)
            return op_py(op, result);
        if ((v = (int)PyObject_Length(a->pending)) != 0) {
            if (v < 0 || !(*result = PyObject_CallNoArgs(a->popleft)))
                goto error;
            op->state = OP_DONE;
            return PYGEN_RETURN;
        }
    }
    for (;;) {
        if (!(res = round_take((Round *)a->round, NULL)))
            goto error;
        if (PyList_CheckExact(res))
            return op_got(op, res, result);
        long code = PyLong_AsLong(res);
        Py_DECREF(res);
        if (code != DONE || (v = waiter_free(a->member)) == 0)
            return PyErr_Occurred() ? (op->state = OP_DONE, PYGEN_ERROR) : op_py(op, result);
        if (v < 0)
            goto error;
        PySendResult r = op_wait(op, result);
        if (r != PYGEN_RETURN)
            return r == PYGEN_ERROR ? op_fail(op) : r;
        Py_CLEAR(*result);
    woken: /* as the Python round after its wait: closed meanwhile, or take again */
        if (op_forget(op) < 0)
            goto error;
        if ((v = iget_true(a->arx, s_arx_closed)) != 0) {
            if (v > 0)
                PyErr_SetString(a->closed_error,
                                "the zcnet.aio receiver was closed while a receive waited");
            goto error;
        }
    }
error:
    return op_fail(op);
}

/* A return value as StopIteration (what an iterator's __next__ and send do). */
static PyObject *stop_with(PyObject *value) {
    if (value != Py_None) {
        PyObject *e = PyObject_CallOneArg(PyExc_StopIteration, value);
        if (e) {
            PyErr_SetObject(PyExc_StopIteration, e);
            Py_DECREF(e);
        }
    }
    Py_DECREF(value);
    return NULL;
}

static PySendResult op_am_send(PyObject *o, PyObject *arg, PyObject **result) {
    AnextOp *op = (AnextOp *)o;
    if (!op_enter(op)) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    PySendResult r = op_send(op, arg, result);
    op->running = 0;
    return r;
}

static PyObject *op_send_method(AnextOp *op, PyObject *arg) {
    PyObject *res;
    PySendResult r = op_am_send((PyObject *)op, arg, &res);
    return r == PYGEN_NEXT ? res : r == PYGEN_RETURN ? stop_with(res) : NULL;
}

static PyObject *op_iternext(AnextOp *op) { return op_send_method(op, Py_None); }

/* The exception throw(type[, value[, traceback]]) names, raised here, as a generator's throw
 * raises it. */
static PyObject *raise_thrown(PyObject *const *args, Py_ssize_t nargs) {
    PyObject *typ = args[0], *val = nargs > 1 ? args[1] : Py_None;
    PyObject *tb = nargs > 2 && args[2] != Py_None ? args[2] : NULL;
    if (tb && !PyTraceBack_Check(tb)) {
        PyErr_SetString(PyExc_TypeError, "throw() third argument must be a traceback object");
        return NULL;
    }
    if (PyExceptionClass_Check(typ)) {
        PyErr_Restore(Py_NewRef(typ), val == Py_None ? NULL : Py_NewRef(val), Py_XNewRef(tb));
    } else if (PyExceptionInstance_Check(typ)) {
        if (val != Py_None) {
            PyErr_SetString(PyExc_TypeError, "instance exception may not have a separate value");
            return NULL;
        }
        PyErr_Restore(Py_NewRef(Py_TYPE(typ)), Py_NewRef(typ),
                      tb ? Py_NewRef(tb) : PyException_GetTraceback(typ));
    } else {
        PyErr_Format(PyExc_TypeError,
                     "exceptions must be classes or instances deriving from BaseException, "
                     "not %s", Py_TYPE(typ)->tp_name);
    }
    return NULL;
}

/* throw(exc): into the delegate (the waiter's __await__, which re-raises it, or the Python
 * step, whose finally runs), else raised here; either way the receive is over unless the
 * Python step goes on. */
static PyObject *op_throw_in(AnextOp *op, PyObject *const *args, Py_ssize_t nargs) {
    if (op->state == OP_DONE) {
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited receive");
        return NULL;
    }
    if (!op->delegate) {
        op->state = OP_DONE;
        return raise_thrown(args, nargs);
    }
    PyObject *d = Py_NewRef(op->delegate);
    PyObject *meth = PyObject_GetAttr(d, s_throw);
    PyObject *res = meth ? PyObject_Vectorcall(meth, args, (size_t)nargs, NULL) : NULL;
    Py_XDECREF(meth);
    if (!res) { /* it raised, or returned (StopIteration): the receive is over */
        if (op->delegate == d)
            Py_CLEAR(op->delegate);
        op_fail(op);
    }
    Py_DECREF(d);
    return res; /* else the Python step awaits something else */
}

static PyObject *op_throw(AnextOp *op, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw(type[, value[, traceback]])");
        return NULL;
    }
    if (!op_enter(op))
        return NULL;
    PyObject *res = op_throw_in(op, args, nargs);
    op->running = 0;
    return res;
}

static PyObject *op_close(AnextOp *op, PyObject *unused) {
    if (!op_enter(op))
        return NULL;
    PyObject *d = op->delegate;
    op->delegate = NULL;
    op->state = OP_DONE;
    PyObject *res = d ? PyObject_CallMethodNoArgs(d, s_close) : Py_NewRef(Py_None);
    Py_XDECREF(d);
    if (op_forget(op) < 0)
        Py_CLEAR(res);
    op->running = 0;
    if (!res)
        return NULL;
    Py_DECREF(res);
    Py_RETURN_NONE;
}

/* Awaited by one task at a time, as a coroutine is. */
static PyObject *op_await(PyObject *o) {
    if (((AnextOp *)o)->delegate) {
        PyErr_SetString(PyExc_RuntimeError, "receive is being awaited already");
        return NULL;
    }
    return Py_NewRef(o);
}

static PyAsyncMethods anextop_async = {.am_await = op_await, .am_send = op_am_send};

static PyMethodDef anextop_methods[] = {
    {"send", (PyCFunction)op_send_method, METH_O, "Resume the receive."},
    {"throw", (PyCFunction)(void (*)(void))op_throw, METH_FASTCALL,
     "Raise an exception at the receive's await."},
    {"close", (PyCFunction)op_close, METH_NOARGS, "End the receive."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AnextOpType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "zcnet.aio._loopaccel.AnextOp",
    .tp_basicsize = sizeof(AnextOp),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | AM_SEND_FLAG,
    .tp_doc = "One await of an AsyncReceiver's next chunk.",
    .tp_traverse = (traverseproc)anextop_traverse,
    .tp_clear = (inquiry)anextop_clear,
    .tp_dealloc = (destructor)anextop_dealloc,
    .tp_finalize = (destructor)anextop_finalize,
    .tp_as_async = &anextop_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)op_iternext,
    .tp_methods = anextop_methods,
};

static PyMethodDef anext_methods[] = {{NULL, NULL, 0, NULL}};

OBJECT_TYPE(Anext, anext, "An AsyncReceiver's __anext__ in C: each call, an awaitable for one "
            "chunk.", .tp_call = (ternaryfunc)anext_call);


/* ---------------------------------------------------------------------------------------- */
/* CopySend(sender, sock, owner_tid, is_running): an AsyncSender's copy sendall (zcnet.aio. */
/* sender) in its common case: the owner's thread with its loop running, the sender open    */
/* (one of the copy kind) with no send in flight, and the socket taking bytes now.          */
/* Calling it with ``data`` sends what the socket takes at once, without blocking, and      */
/* counts it in the sender's stats (the send, and its bytes): True when that was all of it, */
/* else the bytes it took (0 when it did not try), for the Python sendall to go on from    */
/* without counting the send again. A send error is raised as the socket's send raises it. */

typedef struct {
    PyObject_HEAD
    PyObject *sender, *sock, *running;
    unsigned long tid;
} CopySend;

#define COPYSEND_REFS(X) X(sender) X(sock) X(running)
GC_METHODS(CopySend, copysend, COPYSEND_REFS)

static int copysend_init(CopySend *c, PyObject *args, PyObject *kw) {
    PyObject *sender, *sock, *running;
    unsigned long long tid;
    if (!PyArg_ParseTuple(args, "OOKO", &sender, &sock, &tid, &running))
        return -1;
    if (!PyCallable_Check(running)) {
        PyErr_SetString(PyExc_TypeError, "CopySend: is_running is a callable");
        return -1;
    }
    Py_XSETREF(c->sender, Py_NewRef(sender));
    Py_XSETREF(c->sock, Py_NewRef(sock));
    Py_XSETREF(c->running, Py_NewRef(running));
    c->tid = (unsigned long)tid;
    return 0;
}

/* stats.name += n */
static int add_stat(PyObject *stats, PyObject *name, long long n) {
    long long v;
    return iget_ll(stats, name, &v) && iset_ll(stats, name, v + n);
}

static PyObject *copysend_call(CopySend *c, PyObject *args, PyObject *kw) {
    PyObject *data, *res;
    long long fd, sending;
    int v;
    if (!c->sender) {
        PyErr_SetString(PyExc_ValueError, "the CopySend is cleared");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O", &data))
        return NULL;
    if ((v = owner_here(c->tid, c->running)) <= 0)
        return v < 0 ? NULL : PyLong_FromLong(0);
    /* Open, no send in flight (the sender makes a CopySend only for the copy kind). */
    if ((v = iget_true(c->sender, s_arx_closed)) != 0)
        return v < 0 ? NULL : PyLong_FromLong(0);
    if (!iget_ll(c->sender, s_sending, &sending))
        return NULL;
    if (sending >= 0)
        return PyLong_FromLong(0);
    if (!(res = PyObject_CallMethodNoArgs(c->sock, s_fileno)))
        return NULL;
    fd = PyLong_AsLongLong(res);
    Py_DECREF(res);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (fd < 0 || fd > INT_MAX || PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* the Python sendall raises what applies */
        return PyLong_FromLong(0);
    }
    if (view.len == 0) {
        PyBuffer_Release(&view);
        return PyLong_FromLong(0);
    }
    ssize_t n = send((int)fd, view.buf, (size_t)view.len, MSG_DONTWAIT | MSG_NOSIGNAL);
    int err = errno;
    Py_ssize_t len = view.len;
    PyBuffer_Release(&view);
    if (n < 0 && err != EAGAIN && err != EWOULDBLOCK && err != EINTR) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (n <= 0)
        return PyLong_FromLong(0);
    PyObject *stats = iget(c->sender, s_stats);
    if (!stats)
        return NULL;
    /* One send per sendall, as the Python one counts (its rest is not counted again). */
    int ok = add_stat(stats, s_sends, 1) && add_stat(stats, s_bytes, n);
    Py_DECREF(stats);
    if (!ok)
        return NULL;
    return n == len ? Py_NewRef(Py_True) : PyLong_FromSsize_t(n);
}

static PyMethodDef copysend_methods[] = {{NULL, NULL, 0, NULL}};

OBJECT_TYPE(CopySend, copysend, "An AsyncSender's copy sendall in C (the common case).",
            .tp_call = (ternaryfunc)copysend_call);

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
    struct {
        PyObject **p;
        const char *s;
    } names[] = {
        {&s_fd, "fd"}, {&s_inbox, "inbox"}, {&s_on_ready, "on_ready"}, {&s_closed, "closed"},
        {&s_owner_tid, "owner_tid"}, {&s_phase, "phase"}, {&s_arx_closed, "_closed"},
        {&s_registered, "registered"}, {&s_in_ring, "in_ring"}, {&s_head, "head"},
        {&s_tail, "tail"}, {&s_stalled, "stalled"}, {&s_stats, "_stats"},
        {&s_delivered, "delivered"}, {&s_delivered_bytes, "delivered_bytes"},
        {&s_released, "released"}, {&s_released_bytes, "released_bytes"},
        {&s_peak, "peak_in_flight"}, {&s_peak_bytes, "peak_in_flight_bytes"},
        {&s_stream_off, "stream_off"}, {&s_limit, "limit"}, {&s_closing, "closing"},
        {&s_paused, "paused"}, {&s_held, "held"}, {&s_protocol, "protocol"},
        {&s_chunk_received, "chunk_received"}, {&s_put_back, "_put_back"}, {&s_popleft, "popleft"},
        {&s_entries_addr, "entries_addr"}, {&s_base, "base"}, {&s_entries, "entries"},
        {&s_mask, "mask"}, {&s_buf_size, "buf_size"}, {&s_ring, "ring"}, {&s_fast, "fast"},
        {&s_failed, "_round_failed"}, {&s_eof, "eof"}, {&s_waiting_release, "waiting_release"},
        {&s_wbuf, "wbuf"}, {&s_st, "st"}, {&s_write, "write"}, {&s_send_failed, "_send_failed"},
        {&s_buffer_rest, "_buffer_rest"}, {&s_rx, "_rx"}, {&s_offset, "_offset"},
        {&s_length, "_length"}, {&s_tok, "_tok"}, {&s_stream_offset, "_stream_offset"},
        {&s_waiter, "waiter"}, {&s_done, "done"}, {&s_set_result, "set_result"},
        {&s_extend, "extend"}, {&s_throw, "throw"}, {&s_close, "close"}, {&s_fileno, "fileno"},
        {&s_sending, "_sending"}, {&s_sends, "sends"}, {&s_bytes, "bytes"},
        {&s_offsets, "_offsets"}, {&s_lengths, "_lengths"}, {&s_linear, "_linear"},
        {&s_rearms, "rearms"}, {&s_arm, "arm"}, {&s_waiting, "waiting"},
        {&s_released_now, "released"}, {&s_tuples, "tuples"}, {&s_drop_pending, "_drop_pending"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!(*names[i].p = PyUnicode_InternFromString(names[i].s)))
            return NULL;
    if (PyType_Ready(&RouterType) < 0 || PyType_Ready(&RoundType) < 0 ||
        PyType_Ready(&AnextType) < 0 || PyType_Ready(&AnextOpType) < 0 ||
        PyType_Ready(&CopySendType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&loopaccel_module);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "Router", (PyObject *)&RouterType) < 0 ||
        PyModule_AddObjectRef(m, "Round", (PyObject *)&RoundType) < 0 ||
        PyModule_AddObjectRef(m, "Anext", (PyObject *)&AnextType) < 0 ||
        PyModule_AddObjectRef(m, "CopySend", (PyObject *)&CopySendType) < 0 ||
        PyModule_AddIntConstant(m, "DONE", DONE) < 0 ||
        PyModule_AddIntConstant(m, "AGAIN", AGAIN) < 0 ||
        PyModule_AddIntConstant(m, "FALLBACK", FALLBACK) < 0 ||
        PyModule_AddIntConstant(m, "STOPPED", STOPPED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
