/* zcnet.aio._loopaccel's Round: a ZcTransport's or an AsyncReceiver's receive round, and the
 * transport's write (module.c has the overview). */
#include "loopaccel.h"

#include <errno.h>
#include <sys/socket.h>

/* ---------------------------------------------------------------------------------------- */
/* Round(transport, calls, rx, member, provider, bufring, chunk_cls, chunk_slots,            */
/*       release_queue, stats, recv_ud, f_more, buffer_shift, batch_cls, batch_slots, pool); */
/* transport None: an AsyncReceiver's, for take() only. Everything it works on is handed    */
/* over here: the chunk classes' slots as member descriptors (zcnet.rx.zc.chunks.            */
/* CHUNK_SLOTS, BATCH_SLOTS), the transport's steps as callables (zcnet.aio.shared.         */
/* TransportCalls); the rest are public fields of the objects given.                        */

/* The receive's phases this round works in and the two changes it makes, read once at import
 * from zcnet.rx.zc.core (la_phases_load): its Phase values and its TRANSITIONS, the one table
 * of every change, so the round cannot drift from the core's state machine. */
static struct {
    long long armed, stopped; /* Phase.ARMED, Phase.STOPPED */
    long long rearmed;        /* TRANSITIONS[STOPPED, ARM] */
    long long stop;           /* TRANSITIONS[ARMED, STOP] */
} phases;

/* int(getattr(o, name)) */
static int attr_ll(PyObject *o, const char *name, long long *out) {
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v)
        return 0;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return !(*out == -1 && PyErr_Occurred());
}

/* int(TRANSITIONS[(Phase.<from>, Event.<event>)]) */
static int next_phase(PyObject *core, const char *from, const char *event, long long *out) {
    PyObject *phase = NULL, *ev = NULL, *from_v = NULL, *ev_v = NULL, *table = NULL,
             *key = NULL, *to = NULL;
    int ok = (phase = PyObject_GetAttrString(core, "Phase")) &&
             (ev = PyObject_GetAttrString(core, "Event")) &&
             (from_v = PyObject_GetAttrString(phase, from)) &&
             (ev_v = PyObject_GetAttrString(ev, event)) &&
             (table = PyObject_GetAttrString(core, "TRANSITIONS")) &&
             (key = PyTuple_Pack(2, from_v, ev_v)) && (to = PyObject_GetItem(table, key));
    if (ok) {
        *out = PyLong_AsLongLong(to);
        ok = !(*out == -1 && PyErr_Occurred());
    }
    Py_XDECREF(phase); Py_XDECREF(ev); Py_XDECREF(from_v); Py_XDECREF(ev_v);
    Py_XDECREF(table); Py_XDECREF(key); Py_XDECREF(to);
    return ok;
}

int la_phases_load(PyObject *module) {
    PyObject *core = PyImport_ImportModule("zcnet.rx.zc.core");
    if (!core)
        return -1;
    PyObject *phase = PyObject_GetAttrString(core, "Phase");
    int ok = phase && attr_ll(phase, "ARMED", &phases.armed) &&
             attr_ll(phase, "STOPPED", &phases.stopped) &&
             next_phase(core, "STOPPED", "ARM", &phases.rearmed) &&
             next_phase(core, "ARMED", "STOP", &phases.stop);
    Py_XDECREF(phase);
    Py_DECREF(core);
    if (!ok)
        return -1;
    /* What the round uses, for the test that holds it to the core's table. */
    PyObject *used = Py_BuildValue("{s:L,s:L,s:L,s:L}", "ARMED", phases.armed, "STOPPED",
                                   phases.stopped, "STOPPED+ARM", phases.rearmed, "ARMED+STOP",
                                   phases.stop);
    if (!used)
        return -1;
    int rc = PyModule_AddObjectRef(module, "PHASES", used);
    Py_DECREF(used);
    return rc;
}

static int get_ll(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v)
        return 0;
    int ok = as_ll(v, name, out);
    Py_DECREF(v);
    return ok;
}

struct Round {
    PyObject_HEAD
    PyObject *tr, *st, *rx, *member, *prov, *bufring, *cls, *queue, *stats;
    /* TransportCalls, in its order (NULL: an AsyncReceiver's round) */
    PyObject *round_failed, *put_back, *send_failed, *buffer_rest;
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

/* The round's transport's step ``cb`` (one of TransportCalls) called with ``args``. */
static PyObject *call_step(Round *r, PyObject *cb, PyObject *const *args, size_t n) {
    if (!cb) {
        PyErr_SetString(PyExc_ValueError, "the round is cleared");
        return NULL;
    }
    Py_INCREF(cb); /* held while it runs: the step may clear the round */
    PyObject *res = PyObject_Vectorcall(cb, args, n, NULL);
    Py_DECREF(cb);
    return res;
}

PyObject *la_round_failed(Round *r, PyObject *exc) {
    return call_step(r, r->round_failed, &exc, 1);
}

#define ROUND_REFS(X)                                                                     \
    X(tr) X(st) X(rx) X(member) X(prov) X(bufring) X(cls) X(queue) X(stats) X(pop) X(py_write) \
    X(buf) X(buf_ring) X(bcls) X(pool) X(round_failed) X(put_back) X(send_failed) X(buffer_rest)
GC_METHODS(Round, round, ROUND_REFS)

static int round_init(Round *r, PyObject *args, PyObject *kw) {
    PyObject *tr, *calls, *rx, *member, *prov, *bufring, *cls, *cslots, *queue, *stats,
        *bcls = NULL, *bslots = NULL, *pool = Py_None;
    long long recv_ud, f_more, shift;
    /* Checked in locals first: a failed __init__ leaves the Round as it was. */
    if (!PyArg_ParseTuple(args, "OOOOOOO!OOOLLL|O!OO", &tr, &calls, &rx, &member, &prov,
                          &bufring, &PyType_Type, &cls, &cslots, &queue, &stats, &recv_ud,
                          &f_more, &shift, &PyType_Type, &bcls, &bslots, &pool))
        return -1;
    if (shift < 0 || shift > 31) {
        PyErr_SetString(PyExc_ValueError, "Round: buffer_shift is 0..31");
        return -1;
    }
    /* A transport's steps: four callables (TransportCalls); an AsyncReceiver's round has none. */
    int ncalls = tr == Py_None ? 0 : 4;
    if (tr == Py_None ? calls != Py_None
                      : !PyTuple_Check(calls) || PyTuple_GET_SIZE(calls) != ncalls) {
        PyErr_SetString(PyExc_TypeError, "Round: calls is a TransportCalls with a transport, "
                                         "else None");
        return -1;
    }
    for (int i = 0; i < ncalls; i++)
        if (!PyCallable_Check(PyTuple_GET_ITEM(calls, i))) {
            PyErr_Format(PyExc_TypeError, "Round: calls[%d] is not callable", i);
            return -1;
        }
    /* The chunk's slots: Held's owner, token, length and stream offset, then its offset. */
    Py_ssize_t offs[5];
    if (!member_offsets((PyTypeObject *)cls, cslots, 5, offs, "Round: chunk_slots"))
        return -1;
    /* A Batch class's: Held's four, at the chunk's offsets, then its offsets, lengths and
     * linear copies. */
    Py_ssize_t boffs[7] = {0};
    if (bcls && !member_offsets((PyTypeObject *)bcls, bslots, 7, boffs, "Round: batch_slots"))
        return -1;
    for (int i = 0; bcls && i < 4; i++)
        if (boffs[i] != offs[i]) {
            PyErr_Format(PyExc_TypeError, "Round: batch_slots[%d] is not the chunk's "
                                          "(chunk_slots[%d])", i, i);
            return -1;
        }
    PyObject *pop = PyObject_GetAttr(queue, la_name.popleft);
    if (!pop)
        return -1;
    /* No transport (None): an AsyncReceiver's round, which only takes. */
    PyObject *w = tr == Py_None ? NULL : PyObject_GetAttr((PyObject *)Py_TYPE(tr), la_name.write);
    /* The transport's TransportState, read and written by every round. */
    PyObject *st = w ? PyObject_GetAttr(tr, la_name.st) : NULL;
    if (!st && tr != Py_None) {
        Py_XDECREF(w);
        Py_DECREF(pop);
        return -1;
    }
    r->f_more = f_more;
    r->buffer_shift = (unsigned)shift;
    r->o_rx = offs[0];
    r->o_tok = offs[1];
    r->o_len = offs[2];
    r->o_so = offs[3];
    r->o_off = offs[4];
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
    PyObject *objs[12] = {tr == Py_None ? NULL : tr, rx, member, prov, bufring, cls, queue,
                          stats};
    for (int i = 0; i < ncalls; i++)
        objs[8 + i] = PyTuple_GET_ITEM(calls, i);
    for (int i = ncalls; i < 4; i++)
        objs[8 + i] = NULL;
    PyObject **dst[12] = {&r->tr, &r->rx, &r->member, &r->prov, &r->bufring, &r->cls,
                          &r->queue, &r->stats, &r->round_failed, &r->put_back,
                          &r->send_failed, &r->buffer_rest};
    for (int i = 0; i < 12; i++) {
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
    if (!get_ll(buf, la_name.entries_addr, &addr) || !get_ll(buf, la_name.base, &base) ||
        !get_ll(buf, la_name.entries, &n) || !get_ll(buf, la_name.mask, &mask) ||
        !get_ll(buf, la_name.buf_size, &bs))
        return 0;
    if (n < 1 || n > 32768 || mask != n - 1 || (n & mask) || bs < 1 || !addr) {
        PyErr_SetString(PyExc_ValueError, "a buffer ring of 2**k entries (at most 32768) and "
                                          "a buffer size > 0");
        return 0;
    }
    PyObject *ring = PyObject_GetAttr(buf, la_name.ring);
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
    return iget_ll(buf, la_name.head, &b->head) && iget_ll(buf, la_name.tail, &b->tail) &&
           iget_ll(buf, la_name.in_ring, &b->in_ring);
}

#define ENTRY(b, i)                                                                        \
    buf_entry((b)->entries, (unsigned long long)(i), (unsigned long long)(b)->mask)

/* The receiver open: 1; -1 closed; 0 with an exception (the tri-state of ring_now). */
static int is_open(PyObject *rx) {
    int v = iget_true(rx, la_name.closed);
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
    int v = iget_true(buf, la_name.registered);
    if (v != 1)
        return v < 0 ? 0 : -1;
    if (!iget_ll(r->buf_ring, la_name.fd, &fd))
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
    PyObject *waiting = PyObject_GetAttr(pool, la_name.waiting);
    int v = waiting ? PyObject_IsTrue(waiting) : -1;
    Py_XDECREF(waiting);
    if (v <= 0)
        return v == 0;
    PyObject *res = PyObject_CallMethodNoArgs(pool, la_name.released_now);
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
        !(iget_counter(r->stats, la_name.released, COUNTER_ADD, &rel) &&
          iget_counter(r->stats, la_name.released_bytes, COUNTER_ADD, &relb)))
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
        verdict = iset_ll(buf, la_name.tail, b->tail) &&
                  iset_ll(buf, la_name.in_ring, b->in_ring) &&
                  iset_ll(r->stats, la_name.released, rel + ids.n) &&
                  iset_ll(r->stats, la_name.released_bytes, relb + nbytes);
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
    if (!rest || PyObject_SetAttr(st, la_name.held, rest) < 0)
        PyErr_WriteUnraisable(st);
    Py_XDECREF(rest);
    exc_restore(exc);
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

/* The common case of a round up to its chunks, for la_round_run (which then gives them to the
 * protocol) and la_round_take (which returns them): every check, the releases back to the buffer
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
    if (!iget_ll(r->rx, la_name.owner_tid, &x))
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
    CHECK(is_none(r->rx, la_name.stalled));
    long long phase;
    if (!iget_ll(r->rx, la_name.phase, &phase))
        goto error;
    if (phase != phases.armed && phase != phases.stopped)
        BAIL(FALLBACK); /* never armed, or ended: the Python round */
    int armed = phase == phases.armed;
    BufState b;
    CHECK(ring_now(r, buf, &b));
    if (b.bs > INT32_MAX)
        BAIL(FALLBACK);
    long long dl, dlb, rel, relb, limit;
    if (!iget_counter(r->stats, la_name.delivered, COUNTER_ADD, &dl) ||
        !iget_counter(r->stats, la_name.delivered_bytes, COUNTER_ADD, &dlb) ||
        !iget_counter(r->stats, la_name.released, COUNTER_ADD, &rel) ||
        !iget_counter(r->stats, la_name.released_bytes, COUNTER_ADD, &relb) ||
        !iget_ll(r->rx, la_name.limit, &limit))
        goto error;
    /* Back-pressure: the Python round pauses and counts it. */
    if (dlb - relb > limit)
        BAIL(FALLBACK);
    /* The member's completions: one list of tuples, each data of the receive in one buffer. */
    PyObject *box = iget(r->member, la_name.inbox);
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
        PyObject *ok = PyObject_CallMethodNoArgs(r->prov, la_name.arm);
        if (!ok)
            goto error;
        Py_DECREF(ok);
        /* RxCore.armed_now: the receive is armed again (the core's STOPPED + ARM), counted. */
        long long n;
        if (!iget_counter(r->stats, la_name.rearms, COUNTER_ADD, &n) ||
            !iset_ll(r->stats, la_name.rearms, n + 1) ||
            !iset_ll(r->rx, la_name.phase, phases.rearmed))
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
    if (PyList_SetSlice(box, 0, 1, NULL) < 0 || !iget_ll(r->rx, la_name.stream_off, &s0)) {
        PyMem_Free(pieces);
        goto error;
    }
    /* The ring's head and count, the delivered counts and the stream offset, written before
     * any object is made: an allocation below can start a GC pass whose finalizers release
     * and flush (moving the ring's tail and count), which must find them current. */
    long long pk, pkb;
    /* Pooled: BufRing.took, the shared ring's head is not followed (CQE order is not ring
     * order across receivers). */
    if ((!r->pool && !iset_ll(buf, la_name.head, (b.head + k) & 0xFFFF)) ||
        !iset_ll(buf, la_name.in_ring, b.in_ring - k) ||
        !iset_ll(r->stats, la_name.delivered, dl + k) ||
        !iset_ll(r->stats, la_name.delivered_bytes, dlb + total) ||
        !iget_counter(r->stats, la_name.peak, PEAK_CMP, &pk) ||
        !iget_counter(r->stats, la_name.peak_bytes, PEAK_CMP, &pkb) ||
        (dl + k - rel > pk && !iset_ll(r->stats, la_name.peak, dl + k - rel)) ||
        (dlb + total - relb > pkb && !iset_ll(r->stats, la_name.peak_bytes, dlb + total - relb)) ||
        !iset_ll(r->rx, la_name.stream_off, s0 + total) ||
        (ended && !iset_ll(r->rx, la_name.phase, phases.stop))) { /* ARMED + STOP */
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
PyObject *la_round_run(Round *r, PyObject *unused) {
    PyObject *chunks = NULL, *proto = NULL, *cb = NULL;
    int v, code = FALLBACK;
    if (!r->tr || !r->st)
        return PyLong_FromLong(FALLBACK); /* cleared by the cycle collector, or a receiver's */
    /* The transport: receiving (not closing, paused, at EOF or waiting for a release). */
    PyObject *const flags[4] = {la_name.closing, la_name.paused, la_name.eof,
                                la_name.waiting_release};
    for (int i = 0; i < 4; i++)
        if ((v = iget_true(r->st, flags[i])) != 0)
            return v < 0 ? NULL : PyLong_FromLong(FALLBACK);
    if (!(chunks = take_chunks(r, &code, 0)))
        return PyErr_Occurred() ? NULL : PyLong_FromLong(code);
    Py_ssize_t k = PyList_GET_SIZE(chunks);
    /* To the protocol. */
    proto = iget(r->tr, la_name.protocol);
    cb = proto ? PyObject_GetAttr(proto, la_name.chunk_received) : NULL;
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
        int closing = iget_true(r->st, la_name.closing);
        int paused = closing < 0 ? 0 : iget_true(r->st, la_name.paused);
        if (closing < 0 || paused < 0) {
            keep_rest(r->st, chunks, i + 1);
            goto error;
        }
        if (closing || paused) {
            PyObject *rest = PyList_GetSlice(chunks, i + 1, k);
            PyObject *res = rest ? call_step(r, r->put_back, &rest, 1) : NULL;
            Py_XDECREF(rest);
            if (!res)
                goto error;
            Py_DECREF(res);
            Py_DECREF(cb);
            Py_DECREF(proto);
            Py_DECREF(chunks);
            return PyLong_FromLong(STOPPED);
        }
    }
    Py_DECREF(cb);
    Py_DECREF(proto);
    Py_DECREF(chunks);
    PyObject *box = iget(r->member, la_name.inbox);
    if (!box)
        return NULL;
    Py_ssize_t more = PyObject_Length(box);
    Py_DECREF(box);
    if (more < 0)
        return NULL;
    long long phase;
    if (!iget_ll(r->rx, la_name.phase, &phase))
        return NULL;
    return PyLong_FromLong(more || phase != phases.armed ? AGAIN : DONE);
error:
    Py_XDECREF(chunks);
    Py_XDECREF(proto);
    Py_XDECREF(cb);
    return NULL;
}

/* take() -> list | int: a round's chunks for an AsyncReceiver's ``async for`` (a Round made
 * with no transport), else DONE (no completions; the releases went back) or FALLBACK. */
PyObject *la_round_take(Round *r, PyObject *unused) {
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
 * What the socket does not take goes to the transport's ``buffer_rest`` step, a send error to
 * its ``send_failed``, and anything else (closing, a backlog, no contiguous buffer) to the
 * Python write. */
static PyObject *round_write(Round *r, PyObject *data) {
    PyObject *tr = r->tr, *st = r->st;
    if (!tr || !st)
        return call_step(r, NULL, NULL, 0); /* cleared by the cycle collector: raises */
    int closing = iget_true(st, la_name.closing);
    if (closing < 0)
        return NULL;
    Py_ssize_t backlog = 0;
    if (!closing) {
        PyObject *wbuf = iget(st, la_name.wbuf);
        backlog = wbuf ? PyObject_Length(wbuf) : -1;
        Py_XDECREF(wbuf);
        if (backlog < 0)
            return NULL;
    }
    long long fd = -1;
    Py_buffer view;
    if (closing || backlog != 0 || !iget_ll(st, la_name.fd, &fd) ||
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
        PyObject *argv[2] = {data, sent};
        PyObject *res = sent ? call_step(r, r->buffer_rest, argv, 2) : NULL;
        Py_XDECREF(sent);
        return res;
    }
    errno = err;
    PyErr_SetFromErrno(PyExc_OSError);
    Exc e = exc_take();
    PyErr_NormalizeException(&e.type, &e.value, &e.tb);
    PyObject *res = call_step(r, r->send_failed, &e.value, 1);
    exc_drop(e);
    return res;
}

static PyMethodDef round_methods[] = {
    {"run", (PyCFunction)la_round_run, METH_NOARGS,
     "run($self, /)\n--\n\nOne receive round: DONE 0, AGAIN 1, FALLBACK 2, STOPPED 3."},
    {"take_batch", (PyCFunction)round_take_batch, METH_NOARGS,
     "take_batch($self, /)\n--\n\nOne receive round as a Batch, else DONE 0 or FALLBACK 2."},
    {"take", (PyCFunction)la_round_take, METH_NOARGS,
     "take($self, /)\n--\n\n"
     "One receive round's chunks as a list, else DONE 0 or FALLBACK 2."},
    {"write", (PyCFunction)round_write, METH_O,
     "write($self, data, /)\n--\n\nThe transport's write (common case)."},
    {NULL, NULL, 0, NULL},
};

OBJECT_TYPE(Round, round,
            "Round(transport, calls, rx, member, provider, bufring, chunk_cls, chunk_slots, "
            "release_queue, stats, recv_ud, f_more, buffer_shift, batch_cls=..., "
            "batch_slots=..., pool=None, /)\n--\n\n"
            "One ZcTransport's receive round in C (the common case); batch_cls left out: no "
            "take_batch rounds.");
