/* The admission gate's memory in C: OfferHistory(limit, proven_offers).
 *
 * offload/cpu/policies/offer_history.py states the contract (what an offer
 * records, the reuse-horizon rule, the least recently offered forgotten first)
 * and holds its Python form; this is the same contract without the
 * interpreter's cost per offered block, which the gated tier and its gated
 * models pay on every store. Tests hold both forms to the same sequences.
 *
 * The blocks sit in a key table (offload/key_table.h), linked from the most
 * recently offered to the least: the order the limit forgets them in.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include "structmember.h"
#include "key_table.h"
#include "key_check.h"
#include "small_int.h"

typedef struct {
    PyObject_HEAD
    KeyTable table; /* its slots are NULL before __init__ */
    KeyList recency; /* most recently offered first: the limit forgets from the oldest end */
    Py_ssize_t limit;
    long long proven; /* offers after which a block is admitted whatever its gap */
} History;

/* Record an offer of key at now: *previous_time and *previous_offers receive the last one,
 * *seen whether there was one. -1 with an exception (unhashable key, __eq__, memory). */
static int
offer(History *self, PyObject *key, long long now, int *seen, long long *previous_time,
      long long *previous_offers)
{
    Py_hash_t hash = hash_of(key);
    if (hash == -1)
        return -1;
    size_t slot;
    KeyTable *table = &self->table;
    Py_ssize_t index = key_table_find(table, key, hash, &slot);
    if (index == -2)
        return -1;
    if (index != KEY_NONE) {
        KeyEntry *entry = &table->entries[index];
        *seen = 1;
        *previous_time = entry->time;
        *previous_offers = entry->count;
        entry->time = now;
        entry->count++;
        key_list_unlink(table, &self->recency, index);
        key_list_push(table, &self->recency, index, NEWEST);
        return 0;
    }
    *seen = 0;
    index = key_table_add(table, key, hash, slot, now, 1);
    if (index == KEY_NONE)
        return -1;
    key_list_push(table, &self->recency, index, NEWEST);
    return 0;
}

static int
history_ready(const History *self)
{
    if (self->table.slots != NULL)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "OfferHistory.__init__ was not called");
    return -1;
}

/* Forget the least recently offered blocks beyond the limit. */
static void
history_trim(History *self)
{
    while (self->table.count > self->limit) {
        Py_ssize_t index = self->recency.end[OLDEST];
        key_list_unlink(&self->table, &self->recency, index);
        Py_DECREF(key_table_remove(&self->table, index));
    }
}

/* admit(block_hashes, now, free, oldest) -> (admitted, refused) */
static PyObject *
History_admit(History *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"block_hashes", "now", "free", "oldest"};
    PyObject *given[4] = {NULL, NULL, NULL, NULL};
    if (nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "admit() takes (block_hashes, now, free, oldest)");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        given[i] = args[i];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int placed = 0;
        for (int i = 0; i < 4 && !placed; i++)
            if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, names[i]) == 0 &&
                given[i] == NULL) {
                given[i] = args[nargs + k];
                placed = 1;
            }
        if (!placed) {
            PyErr_SetString(PyExc_TypeError, "admit() takes (block_hashes, now, free, oldest)");
            return NULL;
        }
    }
    for (int i = 0; i < 4; i++)
        if (given[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "admit() missing argument %s", names[i]);
            return NULL;
        }
    if (history_ready(self) < 0)
        return NULL;
    long long now = PyLong_AsLongLong(given[1]);
    if (now == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t free = PyNumber_AsSsize_t(given[2], PyExc_OverflowError);
    if (free == -1 && PyErr_Occurred())
        return NULL;
    int horizon = given[3] != Py_None;
    double oldest = horizon ? PyFloat_AsDouble(given[3]) : 0.0;
    if (oldest == -1.0 && PyErr_Occurred())
        return NULL;
    /* A tuple: a key's __hash__ or __eq__ may change the caller's list while it is read. */
    PyObject *seq = PySequence_Tuple(given[0]);
    if (seq == NULL)
        return NULL;
    PyObject *admitted = PyList_New(0);
    if (admitted == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    PyObject **items = &PyTuple_GET_ITEM(seq, 0);
    long long refused = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int seen;
        long long time = 0, offers = 0; /* read only when seen, which GCC cannot always tell */
        if (offer(self, items[i], now, &seen, &time, &offers) < 0)
            goto fail;
        /* Forgotten as the offers come, not after them: a store of many more blocks than the
         * limit would otherwise grow the table's slots to its size, and they never shrink. */
        history_trim(self);
        if (refused) {
            refused++;
        } else if (free > PyList_GET_SIZE(admitted) || !horizon ||
                   (seen && ((double)time >= oldest || offers >= self->proven - 1))) {
            if (PyList_Append(admitted, items[i]) < 0)
                goto fail;
        } else {
            refused = 1;
        }
    }
    Py_DECREF(seq);
    return Py_BuildValue("(NL)", admitted, refused);
fail:
    Py_DECREF(seq);
    Py_DECREF(admitted);
    return NULL;
}

/* Forget every block (see key_table_empty). */
static void
history_empty(History *self)
{
    self->recency = EMPTY_KEY_LIST;
    key_table_empty(&self->table);
}

static PyObject *
History_clear(History *self, PyObject *Py_UNUSED(ignored))
{
    if (history_ready(self) < 0)
        return NULL;
    history_empty(self);
    Py_RETURN_NONE;
}

static int
History_init(History *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"limit", "proven_offers", NULL};
    Py_ssize_t limit;
    long long proven;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nL:OfferHistory", keywords, &limit, &proven))
        return -1;
    if (limit < 0 || proven < 1) {
        PyErr_Format(PyExc_ValueError,
                     "limit must be >= 0 and proven_offers >= 1, got %zd and %lld", limit, proven);
        return -1;
    }
    KeyTable table;
    if (key_table_init(&table) < 0)
        return -1;
    KeyTable old = self->table; /* slots NULL before the first __init__ */
    self->table = table;
    self->recency = EMPTY_KEY_LIST;
    self->limit = limit;
    self->proven = proven;
    /* Last: a key's finalizer may call back, and finds the history whole and new. */
    key_table_free(&old);
    return 0;
}

static int
History_traverse(History *self, visitproc visit, void *arg)
{
    return key_table_traverse(&self->table, visit, arg);
}

static int
History_clear_refs(History *self)
{
    history_empty(self);
    return 0;
}

static void
History_dealloc(History *self)
{
    PyObject_GC_UnTrack(self);
    self->recency = EMPTY_KEY_LIST;
    key_table_free(&self->table);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
History_len(History *self)
{
    return self->table.count;
}

/* invariant_violations() -> the history's broken invariants, worded as the Python form words
 * those it can have: each block in the recency order once, linked both ways; within its
 * limit. */
static PyObject *
History_invariant_violations(History *self, PyObject *Py_UNUSED(ignored))
{
    if (history_ready(self) < 0)
        return NULL;
    KeyCheck check;
    if (key_check_start(&check, &self->table) < 0)
        return NULL;
    key_check_list(&check, &self->table, &self->recency, "the recency order", -1);
    key_check_unlisted(&check, &self->table, "the recency order");
    if (self->table.count > self->limit)
        key_check_note(&check, NULL, "holds %zd blocks, over its limit of %zd",
                       self->table.count, self->limit);
    return key_check_finish(&check);
}

static PyMethodDef History_methods[] = {
    {"admit", (PyCFunction)(void (*)(void))History_admit, METH_FASTCALL | METH_KEYWORDS,
     "Offer each block at now; the ones the reuse-horizon rule admits, and how many it "
     "refused."},
    {"clear", (PyCFunction)History_clear, METH_NOARGS, "Forget every offer."},
    {"invariant_violations", (PyCFunction)History_invariant_violations, METH_NOARGS,
     "Every broken invariant of the history's tables, worded."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef History_members[] = {
    {"limit", T_PYSSIZET, offsetof(History, limit), READONLY, "Blocks remembered at most."},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods History_as_sequence = {
    .sq_length = (lenfunc)History_len,
};

static PyTypeObject HistoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "offload.cpu.policies._offer_history.OfferHistory",
    .tp_doc = "OfferHistory(limit, proven_offers): the last offer time and offer count of at "
              "most limit blocks, in C.",
    .tp_basicsize = sizeof(History),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)History_init,
    .tp_dealloc = (destructor)History_dealloc,
    .tp_traverse = (traverseproc)History_traverse,
    .tp_clear = (inquiry)History_clear_refs,
    .tp_methods = History_methods,
    .tp_members = History_members,
    .tp_as_sequence = &History_as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_offer_history", "The admission gate's memory, in C.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__offer_history(void)
{
    if (PyType_Ready(&HistoryType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&HistoryType);
    if (PyModule_AddObject(m, "OfferHistory", (PyObject *)&HistoryType) < 0) {
        Py_DECREF(&HistoryType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
