/* zcnet/_slots.h: __slots__ members read and written in place, for the compiled halves that are
 * handed a Python object's layout once (at import, or when a compiled object is made) instead
 * of looking its attributes up by name on every call. */
#ifndef ZCNET_SLOTS_H
#define ZCNET_SLOTS_H

#include <Python.h>
#include <structmember.h>

#include "_members.h" /* the offsets, from the descriptors Python hands over */

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* The byte offset of __slots__ member ``name`` of ``cls`` (-1 and TypeError when it is not a
 * writable object slot). */
static inline Py_ssize_t slot_offset(PyTypeObject *cls, const char *name) {
    PyObject *d = PyObject_GetAttrString((PyObject *)cls, name);
    if (!d) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear(); /* no such member: the TypeError below */
    }
    Py_ssize_t off = -1;
    if (d && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READONLY))
            off = m->offset;
    }
    Py_XDECREF(d);
    if (off < 0)
        PyErr_Format(PyExc_TypeError, "%s.%s is not a writable __slots__ member", cls->tp_name,
                     name);
    return off;
}

/* The offsets of ``n`` members of ``cls`` into ``out``: 0 with an error set when one is not a
 * writable object slot, 1 done. */
static inline int slot_offsets(PyTypeObject *cls, const char *const *names, int n,
                               Py_ssize_t *out) {
    for (int i = 0; i < n; i++)
        if ((out[i] = slot_offset(cls, names[i])) < 0)
            return 0;
    return 1;
}

/* Store ``v`` (a reference it steals) in the slot at ``off``, dropping the old value. */
static inline void set_slot(PyObject *o, Py_ssize_t off, PyObject *v) {
    PyObject **p = (PyObject **)((char *)o + off);
    PyObject *old = *p;
    *p = v;
    Py_XDECREF(old);
}

/* The slot's value as a C integer, when it holds an int (anything else: 0 with no error, as
 * converting it would call its __index__, Python that could run between a round's reads and
 * its writes). -1 with an error on overflow; 1 done. */
static inline int slot_ll(PyObject *o, Py_ssize_t off, long long *out) {
    PyObject *v = SLOT(o, off);
    if (!v || !PyLong_CheckExact(v))
        return 0;
    int ovf = 0;
    *out = PyLong_AsLongLongAndOverflow(v, &ovf);
    if (ovf) {
        PyErr_SetString(PyExc_OverflowError, "a counter does not fit 64 bits");
        return -1;
    }
    return 1;
}

/* Set the slot to the int ``v``: 1 done, 0 error (no memory). */
static inline int slot_set_ll(PyObject *o, Py_ssize_t off, long long v) {
    PyObject *x = PyLong_FromLongLong(v);
    if (!x)
        return 0;
    set_slot(o, off, x);
    return 1;
}

/* The C entry points of a module and the Python code each stands for (its twin): the module's
 * TWINS dict, which tests/test_twins.py holds to the Python side. */
typedef struct {
    const char *c, *python;
} Twin;

static inline int add_twins(PyObject *m, const Twin *twins) {
    PyObject *d = PyDict_New();
    if (!d)
        return -1;
    for (const Twin *t = twins; t->c; t++) {
        PyObject *v = PyUnicode_FromString(t->python);
        if (!v || PyDict_SetItemString(d, t->c, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return -1;
        }
        Py_DECREF(v);
    }
    int r = PyModule_AddObjectRef(m, "TWINS", d);
    Py_DECREF(d);
    return r;
}

#endif /* ZCNET_SLOTS_H */
