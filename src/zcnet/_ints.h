/* zcnet/_ints.h: a sequence of ints (a list, or a 1-D buffer of 2-, 4- or 8-byte integers) read
 * into C memory, for the compiled ring writes of zcnet.uring._accel and zcnet.rx.zc._rxaccel. */
#ifndef ZCNET_INTS_H
#define ZCNET_INTS_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NOT_INTS (-2)

/* The ints of a list, or of a 1-D buffer of 2-, 4- or 8-byte integers (numpy arrays, strided
 * views included; signed ones sign-extended), into a new array (PyMem_Free it). Returns
 * their count, -1 with an error set, or NOT_INTS for anything else (no error set). */
static inline Py_ssize_t load_ints(PyObject *o, unsigned long long **out) {
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

#endif /* ZCNET_INTS_H */
