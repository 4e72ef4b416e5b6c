/* zcnet/uring/_accel.h: what the two halves of zcnet.uring._accel share: _accel.c (the module,
 * io_uring_enter and the ring's Core) and _accel_rx.c (the zero-copy receive path). */
#ifndef ZCNET_ACCEL_H
#define ZCNET_ACCEL_H

#include <Python.h>

/* The byte offset of __slots__ member ``name`` of ``cls`` (-1 and TypeError if it is not a
 * writable object slot). */
Py_ssize_t slot_offset(PyTypeObject *cls, const char *name);

/* Store ``v`` (a reference it steals) in the slot at ``off``, dropping the old value. */
void set_slot(PyObject *o, Py_ssize_t off, PyObject *v);

/* Add the receive path's functions and types to the module (_accel_rx.c); -1 on error. */
int zc_rx_add(PyObject *m);

#endif /* ZCNET_ACCEL_H */
