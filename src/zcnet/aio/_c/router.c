/* zcnet.aio._loopaccel's Router: the shared ring's CQEs to its members (module.c has the
 * overview). */
#include "loopaccel.h"

#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef __NR_io_uring_enter
#define __NR_io_uring_enter 426
#endif

/* ---------------------------------------------------------------------------------------- */
/* Router(ring, members, khead, ktail, cqes, mask, cqe_size, completions_of, few, sq_flags,  */
/*        work_mask, getevents, local_bits)                                                 */

static int as_ptr(PyObject *o, void **out) {
    *out = PyLong_AsVoidPtr(o);
    return !(*out == NULL && PyErr_Occurred());
}

/* Keep the pending exception in *exc when it is the first (else drop it). */
static void keep_first(Exc *exc) {
    if (exc->type == NULL)
        *exc = exc_take();
    else
        PyErr_Clear();
}

typedef struct {
    PyObject_HEAD
    PyObject *ring, *members, *completions_of;
    uint32_t *khead, *ktail, *sq_flags;
    unsigned char *cqes;
    uint32_t mask, cqe_size, work, getevents;
    unsigned int local_bits;
    Py_ssize_t few;
} Router;

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
    PyObject *cb = iget(m, la_name.on_ready);
    if (!cb)
        return -1;
    Py_DECREF(cb);
    return cb != Py_None ? 1 : iget_true(m, la_name.tuples);
}

/* Keep the pending exception in *exc when it is the first (else drop it). */

/* Run member ``m``'s compiled round directly (``m.fast``): 1 when that finished it, 0 when
 * ``on_ready`` must run, -1 on an error to raise. A round's Exception goes to its transport's
 * ``round_failed`` step (handed to the Round) as the Python round's would. */
static int run_fast(PyObject *m) {
    PyObject *fast = iget(m, la_name.fast);
    if (!fast)
        return -1;
    if (!Py_IS_TYPE(fast, &la_RoundType)) {
        Py_DECREF(fast);
        return 0;
    }
    PyObject *res = la_round_run((Round *)fast, NULL);
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
    PyObject *r2 = la_round_failed((Round *)fast, e.value);
    exc_drop(e);
    Py_DECREF(fast);
    if (!r2)
        return -1;
    Py_DECREF(r2);
    return 1;
}

/* MemberRing.kick: the waiting task's future (``m.waiter``) resolved, and forgotten. */
static PyObject *kick(PyObject *m) {
    PyObject *w = iget(m, la_name.waiter);
    if (!w)
        return NULL;
    if (w == Py_None) {
        Py_DECREF(w);
        Py_RETURN_NONE;
    }
    PyObject *res = NULL;
    if (iset(m, la_name.waiter, Py_None) == 0) {
        PyObject *d = PyObject_CallMethodNoArgs(w, la_name.done);
        int done = d ? PyObject_IsTrue(d) : -1;
        Py_XDECREF(d);
        res = done < 0 ? NULL
              : done   ? Py_NewRef(Py_None)
                       : PyObject_CallMethodOneArg(w, la_name.set_result, Py_None);
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
    PyObject *cb = iget(m, la_name.on_ready);
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
            ok = comp && (box = iget(m, la_name.inbox)) && PyList_Append(box, comp) == 0;
        } else if ((box = iget(m, la_name.inbox))) {
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
    if (!iget_ll(r->ring, la_name.fd, &fd))
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
     "route($self, /)\n--\n\nEvery ready CQE to its member; returns how many."},
    {"poll", (PyCFunction)(void (*)(void))router_poll, METH_FASTCALL,
     "poll($self, entered, efd, /)\n--\n\n"
     "The rest of a pass after its submission: -1 (no further look), 0 or 1 (more)."},
    {NULL, NULL, 0, NULL},
};

OBJECT_TYPE(Router, router,
            "Router(ring, members, khead, ktail, cqes, mask, cqe_size, completions_of, few, "
            "sq_flags, work_mask, getevents, local_bits, /)\n--\n\n"
            "The shared ring's CQEs routed to its members.");
