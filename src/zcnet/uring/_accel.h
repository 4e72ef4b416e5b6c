/* zcnet/uring/_accel.h: what the two files of zcnet.uring._accel share: _accel.c (the module,
 * io_uring_enter and the ring's Core) and _accel_bufring.c (the provided-buffer ring). */
#ifndef ZCNET_ACCEL_H
#define ZCNET_ACCEL_H

#include <Python.h>

#include "_slots.h"

/* Add the provided-buffer ring's functions to the module (_accel_bufring.c); -1 on error. */
int bufring_add(PyObject *m);

#endif /* ZCNET_ACCEL_H */
