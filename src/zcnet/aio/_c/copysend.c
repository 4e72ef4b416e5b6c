/* zcnet.aio._loopaccel's CopySend: a copy sender's sendall (module.c has the overview). */
#include "loopaccel.h"

#include <errno.h>
#include <sys/socket.h>

/* CopySend(stats, sock, owner_tid, is_running): an AsyncSender's copy sendall (zcnet.aio.  */
/* sender) in its common case, which the sender calls only while it is open (one of the    */
/* copy kind) with no send in flight: from the owner's thread with its loop running, and   */
/* the socket taking bytes now. Calling it with ``data`` sends what the socket takes at    */
/* once, without blocking, and counts it in ``stats`` (the sender's SendStats, handed over  */
/* once: the send, and its bytes): True when that was all of it, else the bytes it took (0 */
/* when it did not try), for the Python sendall to go on from without counting the send    */
/* again. A send error is raised as the socket's send raises it.                           */

typedef struct {
    PyObject_HEAD
    PyObject *stats, *sock, *running;
    unsigned long tid;
} CopySend;

#define COPYSEND_REFS(X) X(stats) X(sock) X(running)
GC_METHODS(CopySend, copysend, COPYSEND_REFS)

static int copysend_init(CopySend *c, PyObject *args, PyObject *kw) {
    PyObject *stats, *sock, *running;
    unsigned long long tid;
    if (!PyArg_ParseTuple(args, "OOKO", &stats, &sock, &tid, &running))
        return -1;
    if (!PyCallable_Check(running)) {
        PyErr_SetString(PyExc_TypeError, "CopySend: is_running is a callable");
        return -1;
    }
    Py_XSETREF(c->stats, Py_NewRef(stats));
    Py_XSETREF(c->sock, Py_NewRef(sock));
    Py_XSETREF(c->running, Py_NewRef(running));
    c->tid = (unsigned long)tid;
    return 0;
}

/* stats.name += n */
static int add_stat(PyObject *stats, PyObject *name, long long n) {
    long long v;
    return iget_counter(stats, name, COUNTER_ADD, &v) && iset_ll(stats, name, v + n);
}

static PyObject *copysend_call(CopySend *c, PyObject *args, PyObject *kw) {
    PyObject *data, *res;
    long long fd;
    int v;
    if (!c->stats || !c->sock || !c->running) {
        PyErr_SetString(PyExc_ValueError, "the CopySend is cleared");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O", &data))
        return NULL;
    if ((v = owner_here(c->tid, c->running)) <= 0)
        return v < 0 ? NULL : PyLong_FromLong(0);
    if (!(res = PyObject_CallMethodNoArgs(c->sock, la_name.fileno)))
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
    /* One send per sendall, as the Python one counts (its rest is not counted again). */
    PyObject *stats = Py_NewRef(c->stats); /* held: a counter's conversion may clear c */
    int ok = add_stat(stats, la_name.sends, 1) && add_stat(stats, la_name.bytes, n);
    Py_DECREF(stats);
    if (!ok)
        return NULL;
    return n == len ? Py_NewRef(Py_True) : PyLong_FromSsize_t(n);
}

static PyMethodDef copysend_methods[] = {{NULL, NULL, 0, NULL}};

OBJECT_TYPE(CopySend, copysend,
            "CopySend(stats, sock, owner_tid, is_running, /)\n--\n\n"
            "An AsyncSender's copy sendall in C (the common case).",
            .tp_call = (ternaryfunc)copysend_call);
