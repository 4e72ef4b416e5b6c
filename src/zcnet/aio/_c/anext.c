/* zcnet.aio._loopaccel's Anext and its awaitable AnextOp (module.c has the overview). */
#include "loopaccel.h"

/* ---------------------------------------------------------------------------------------- */
/* Anext(round, state, member, owner_tid, is_running, create_future, pending, py_anext,     */
/*       drop_pending, closed_error): an AsyncReceiver's ``__anext__`` (zcnet.aio.receiver)  */
/* in C. What it works on is handed over here: the receiver's ResourceState (``closed`` is  */
/* read in place), its pending deque and its steps as callables; it never sees the receiver. */
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
    PyObject *round, *state, *member, *running, *create_future, *pending, *popleft, *py_anext,
        *drop_pending, *closed_error;
    unsigned long tid;
} Anext;

#define ANEXT_REFS(X)                                                                      \
    X(round) X(state) X(member) X(running) X(create_future) X(pending) X(popleft) X(py_anext) \
    X(drop_pending) X(closed_error)
GC_METHODS(Anext, anext, ANEXT_REFS)

static int anext_init(Anext *a, PyObject *args, PyObject *kw) {
    PyObject *round, *state, *member, *running, *cf, *pending, *py_anext, *drop, *closed_error;
    unsigned long long tid;
    if (!PyArg_ParseTuple(args, "O!OOKOOOOOO", &la_RoundType, &round, &state, &member, &tid,
                          &running, &cf, &pending, &py_anext, &drop, &closed_error))
        return -1;
    if (!PyCallable_Check(running) || !PyCallable_Check(cf) || !PyCallable_Check(py_anext) ||
        !PyCallable_Check(drop) || !PyExceptionClass_Check(closed_error)) {
        PyErr_SetString(PyExc_TypeError, "Anext: is_running, create_future, py_anext and "
                                         "drop_pending are callables, closed_error an "
                                         "exception class");
        return -1;
    }
    PyObject *popleft = PyObject_GetAttr(pending, la_name.popleft);
    if (!popleft)
        return -1;
    PyObject *objs[9] = {round, state, member, running, cf, pending, py_anext, drop,
                         closed_error};
    PyObject **dst[9] = {&a->round,   &a->state,   &a->member,       &a->running,
                         &a->create_future, &a->pending, &a->py_anext, &a->drop_pending,
                         &a->closed_error};
    for (int i = 0; i < 9; i++)
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

static PyObject *anext_call(Anext *a, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "Anext() takes no arguments");
        return NULL;
    }
    AnextOp *op = PyObject_GC_New(AnextOp, &la_AnextOpType);
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
    PyObject *w = a->member ? iget(a->member, la_name.waiter) : Py_NewRef(Py_None);
    int r = w ? 0 : -1;
    if (w == fut)
        r = iset(a->member, la_name.waiter, Py_None);
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
 * Python step does (its ``drop_pending``). */
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
        PyObject *res = rest ? PyObject_CallMethodOneArg(a->pending, la_name.extend, rest) : NULL;
        Py_XDECREF(rest);
        int closed = res ? iget_true(a->state, la_name.closed) : -1;
        Py_XDECREF(res);
        if (closed > 0) {
            res = PyObject_CallNoArgs(a->drop_pending);
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
    PyObject *w = iget(member, la_name.waiter);
    if (!w || w == Py_None) {
        Py_XDECREF(w);
        return w ? 1 : -1;
    }
    PyObject *d = PyObject_CallMethodNoArgs(w, la_name.done);
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
    if (!aw || iset(a->member, la_name.waiter, fut) < 0) {
        if (!aw)
            PyErr_SetString(PyExc_TypeError, "create_future() gave no awaitable");
        Py_DECREF(fut);
        return PYGEN_ERROR;
    }
    Py_XSETREF(op->fut, fut); /* the member's waiter from here: op_forget takes it back */
    PyObject *box = iget(a->member, la_name.inbox);
    Py_ssize_t queued = box ? PyObject_Length(box) : -1;
    Py_XDECREF(box);
    if (queued == 0) {
        int closed = iget_true(a->state, la_name.closed);
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
    if (!a->round || !a->state || !a->member || !a->running || !a->create_future ||
        !a->pending || !a->popleft || !a->py_anext || !a->drop_pending || !a->closed_error) {
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
        int closed = here > 0 ? iget_true(a->state, la_name.closed) : 0;
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
        if (!(res = la_round_take((Round *)a->round, NULL)))
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
        if ((v = iget_true(a->state, la_name.closed)) != 0) {
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
    PyObject *meth = PyObject_GetAttr(d, la_name.throw);
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
    PyObject *res = d ? PyObject_CallMethodNoArgs(d, la_name.close) : Py_NewRef(Py_None);
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

PyTypeObject la_AnextOpType = {
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

OBJECT_TYPE(Anext, anext,
            "Anext(round, state, member, owner_tid, is_running, create_future, pending, "
            "py_anext, drop_pending, closed_error, /)\n--\n\n"
            "An AsyncReceiver's __anext__ in C: each call, an awaitable for one chunk.",
            .tp_call = (ternaryfunc)anext_call);

