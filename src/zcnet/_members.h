/* zcnet/_members.h: a class's __slots__ members, handed to compiled code as their descriptors.
 *
 * The contract between a Python class and its compiled twin: Python hands over the fields the
 * C reads and writes in place as member descriptors (``(Cls.a, Cls.b)``, in an order the Python
 * side declares), once, when the compiled object is made or bound. The C keeps their offsets
 * and never looks a field up by name, so the names stay the class's own business (private ones
 * included), and tests/project/test_code_guard.py holds the C to naming none. */
#ifndef ZCNET_MEMBERS_H
#define ZCNET_MEMBERS_H

#include <Python.h>
#include <structmember.h>

/* The offset of member descriptor ``d`` in instances of ``cls``: a writable object slot of a
 * base of ``cls`` (or ``cls`` itself) that ``cls`` still resolves its name to, so a subclass
 * that shadows the name (with a property, say) is refused. -1 with TypeError otherwise. */
static inline Py_ssize_t member_offset(PyTypeObject *cls, PyObject *d) {
    PyMemberDef *m = NULL;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type) && PyType_IsSubtype(cls, PyDescr_TYPE(d)))
        m = ((PyMemberDescrObject *)d)->d_member;
    if (m && m->type == T_OBJECT_EX && !(m->flags & READONLY)) {
        PyObject *now = PyObject_GetAttr((PyObject *)cls, PyDescr_NAME(d));
        int same = now == d;
        Py_XDECREF(now);
        if (same)
            return m->offset;
        if (!now && !PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
    }
    PyErr_Format(PyExc_TypeError, "%R is not a writable __slots__ member of %s", d,
                 cls->tp_name);
    return -1;
}

/* The offsets of the ``n`` member descriptors in tuple ``descrs`` into ``out``, in order (see
 * member_offset): 1 done, 0 with TypeError (``what`` names the argument; ``descrs`` NULL: an
 * optional argument left out). */
static inline int member_offsets(PyTypeObject *cls, PyObject *descrs, Py_ssize_t n,
                                 Py_ssize_t *out, const char *what) {
    if (!descrs || !PyTuple_Check(descrs) || PyTuple_GET_SIZE(descrs) != n) {
        PyErr_Format(PyExc_TypeError, "%s is a tuple of %zd member descriptors", what, n);
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if ((out[i] = member_offset(cls, PyTuple_GET_ITEM(descrs, i))) < 0)
            return 0;
    return 1;
}

#endif /* ZCNET_MEMBERS_H */
