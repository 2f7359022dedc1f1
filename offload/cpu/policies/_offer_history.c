/* The admission gate's memory in C: OfferHistory(limit, proven_offers).
 *
 * offload/cpu/policies/offer_history.py states the contract (what an offer
 * records, the reuse-horizon rule, the least recently offered forgotten first)
 * and holds its Python form; this is the same contract without the
 * interpreter's cost per offered block, which the gated tier and its gated
 * models pay on every store. Tests hold both forms to the same sequences.
 *
 * The blocks sit in an array of entries, linked from the most recently offered
 * to the least (the order the limit forgets them in), and an open-addressing
 * table of entry indices finds a block by its Python hash, then by equality,
 * as a dict would: keys are held, and two blocks are one only when equal.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include "structmember.h"
#include "small_int.h"

#define NONE (-1) /* no entry: an empty slot, or a list's end */
#define FIRST_BITS 4 /* the table starts at 2**4 slots and doubles at half load */
#define FIRST_SLOTS (1 << FIRST_BITS)
#define FIRST_ENTRIES 16 /* entries allocated at first; they double as needed */

typedef struct {
    PyObject *key; /* NULL: the entry is free */
    Py_hash_t hash;
    long long time;   /* of the last offer */
    long long offers; /* remembered so far */
    Py_ssize_t newer, older; /* the recency list (a free entry: newer is the next free one) */
} Entry;

typedef struct {
    PyObject_HEAD
    Entry *entries;
    Py_ssize_t allocated, high; /* entries allocated; entries ever used (the rest never were) */
    Py_ssize_t count;
    Py_ssize_t *slots; /* entry indices, NONE when empty */
    size_t mask;       /* slots - 1; 0 before __init__ */
    int shift;         /* 64 - log2(slots) */
    Py_ssize_t newest, oldest, free;
    Py_ssize_t limit;
    long long proven; /* offers after which a block is admitted whatever its gap */
} History;

static inline size_t
home_of(const History *self, Py_hash_t hash)
{
    /* Fibonacci hashing: sequential ids spread over the table. */
    return (size_t)(((uint64_t)hash * 0x9E3779B97F4A7C15ULL) >> self->shift);
}

/* The entry holding key, or NONE with *slot the empty slot it would take; -2 with an error
 * from a key's __eq__. */
static Py_ssize_t
find(const History *self, PyObject *key, Py_hash_t hash, size_t *slot)
{
    for (size_t i = home_of(self, hash);; i = (i + 1) & self->mask) {
        Py_ssize_t index = self->slots[i];
        if (index == NONE) {
            *slot = i;
            return NONE;
        }
        const Entry *entry = &self->entries[index];
        if (entry->hash == hash) {
            if (entry->key == key)
                return index;
            /* A key's __eq__ may run Python code: the held key stays alive through it, as a
             * dict keeps its own. */
            PyObject *held = Py_NewRef(entry->key);
            int equal = PyObject_RichCompareBool(held, key, Py_EQ);
            Py_DECREF(held);
            if (equal < 0)
                return -2;
            if (equal)
                return index;
        }
    }
}

/* The first empty slot from hash's home (for a hash known not to be held). */
static size_t
empty_slot(const History *self, Py_hash_t hash)
{
    size_t i = home_of(self, hash);
    while (self->slots[i] != NONE)
        i = (i + 1) & self->mask;
    return i;
}

static void
unlink_entry(History *self, Py_ssize_t index)
{
    Entry *entry = &self->entries[index];
    if (entry->newer == NONE)
        self->newest = entry->older;
    else
        self->entries[entry->newer].older = entry->older;
    if (entry->older == NONE)
        self->oldest = entry->newer;
    else
        self->entries[entry->older].newer = entry->newer;
}

static void
link_newest(History *self, Py_ssize_t index)
{
    Entry *entry = &self->entries[index];
    entry->newer = NONE;
    entry->older = self->newest;
    if (self->newest == NONE)
        self->oldest = index;
    else
        self->entries[self->newest].newer = index;
    self->newest = index;
}

/* Double the table and place every entry again; -1 with a MemoryError, the table as it was. */
static int
grow_slots(History *self)
{
    size_t size = 2 * (self->mask + 1);
    Py_ssize_t *slots = PyMem_Malloc(size * sizeof(Py_ssize_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < size; i++)
        slots[i] = NONE;
    PyMem_Free(self->slots);
    self->slots = slots;
    self->mask = size - 1;
    self->shift--;
    for (Py_ssize_t index = self->newest; index != NONE; index = self->entries[index].older)
        slots[empty_slot(self, self->entries[index].hash)] = index;
    return 0;
}

/* A free entry's index; NONE with a MemoryError. */
static Py_ssize_t
take_entry(History *self)
{
    if (self->free != NONE) {
        Py_ssize_t index = self->free;
        self->free = self->entries[index].newer;
        return index;
    }
    if (self->high == self->allocated) {
        Py_ssize_t grown = self->allocated ? 2 * self->allocated : FIRST_ENTRIES;
        if ((size_t)grown > PY_SSIZE_T_MAX / sizeof(Entry)) {
            PyErr_NoMemory();
            return NONE;
        }
        Entry *entries = PyMem_Realloc(self->entries, (size_t)grown * sizeof(Entry));
        if (entries == NULL) {
            PyErr_NoMemory();
            return NONE;
        }
        self->entries = entries;
        self->allocated = grown;
    }
    return self->high++;
}

/* Forget the least recently offered block. The table closes the gap behind the slot it
 * leaves (backward-shift deletion), so lookups need no tombstones. */
static void
forget_oldest(History *self)
{
    Py_ssize_t index = self->oldest;
    Entry *entry = &self->entries[index];
    size_t mask = self->mask;
    size_t hole = home_of(self, entry->hash);
    while (self->slots[hole] != index)
        hole = (hole + 1) & mask;
    for (size_t next = (hole + 1) & mask; self->slots[next] != NONE; next = (next + 1) & mask) {
        size_t home = home_of(self, self->entries[self->slots[next]].hash);
        /* The entry at next may move back to the hole unless its home lies after the hole
         * (cyclically, in (hole, next]). */
        int stays = hole <= next ? (hole < home && home <= next) : (hole < home || home <= next);
        if (!stays) {
            self->slots[hole] = self->slots[next];
            hole = next;
        }
    }
    self->slots[hole] = NONE;
    unlink_entry(self, index);
    PyObject *key = entry->key;
    entry->key = NULL;
    entry->newer = self->free;
    self->free = index;
    self->count--;
    Py_DECREF(key); /* last: a key's finalizer may run Python code, which finds all in order */
}

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
    Py_ssize_t index = find(self, key, hash, &slot);
    if (index == -2)
        return -1;
    if (index != NONE) {
        Entry *entry = &self->entries[index];
        *seen = 1;
        *previous_time = entry->time;
        *previous_offers = entry->offers;
        entry->time = now;
        entry->offers++;
        unlink_entry(self, index);
        link_newest(self, index);
        return 0;
    }
    *seen = 0;
    if ((size_t)(2 * (self->count + 1)) > self->mask + 1) {
        if (grow_slots(self) < 0)
            return -1;
        slot = empty_slot(self, hash);
    }
    index = take_entry(self);
    if (index == NONE)
        return -1;
    self->entries[index] = (Entry){.key = Py_NewRef(key), .hash = hash, .time = now, .offers = 1};
    self->slots[slot] = index;
    link_newest(self, index);
    self->count++;
    return 0;
}

static int
history_ready(const History *self)
{
    if (self->mask != 0)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "OfferHistory.__init__ was not called");
    return -1;
}

static void
history_trim(History *self)
{
    while (self->count > self->limit)
        forget_oldest(self);
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
    PyObject *seq = PySequence_Fast(given[0], "block hashes must be a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *admitted = PyList_New(0);
    if (admitted == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    long long refused = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int seen;
        long long time, offers;
        if (offer(self, items[i], now, &seen, &time, &offers) < 0)
            goto fail;
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
    history_trim(self);
    return Py_BuildValue("(NL)", admitted, refused);
fail:
    Py_DECREF(seq);
    Py_DECREF(admitted);
    return NULL;
}

/* Forget every block. The entries leave the object before their keys are released: a key's
 * finalizer may run Python code, which then finds an empty history, not a half-cleared one. */
static void
history_empty(History *self)
{
    Entry *entries = self->entries;
    Py_ssize_t high = self->high;
    self->entries = NULL;
    self->allocated = self->high = self->count = 0;
    self->newest = self->oldest = self->free = NONE;
    for (size_t i = 0; i <= self->mask && self->slots != NULL; i++)
        self->slots[i] = NONE;
    for (Py_ssize_t i = 0; i < high; i++)
        Py_XDECREF(entries[i].key);
    PyMem_Free(entries);
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
    Py_ssize_t *slots = PyMem_Malloc(FIRST_SLOTS * sizeof(Py_ssize_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (self->mask != 0)
        history_empty(self);
    PyMem_Free(self->slots);
    self->slots = slots;
    self->mask = FIRST_SLOTS - 1;
    self->shift = 64 - FIRST_BITS;
    for (size_t i = 0; i <= self->mask; i++)
        slots[i] = NONE;
    self->high = self->count = 0;
    self->newest = self->oldest = self->free = NONE;
    self->limit = limit;
    self->proven = proven;
    return 0;
}

static int
History_traverse(History *self, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < self->high; i++)
        Py_VISIT(self->entries[i].key);
    return 0;
}

static int
History_clear_refs(History *self)
{
    if (self->mask != 0)
        history_empty(self);
    return 0;
}

static void
History_dealloc(History *self)
{
    PyObject_GC_UnTrack(self);
    History_clear_refs(self);
    PyMem_Free(self->entries);
    PyMem_Free(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
History_len(History *self)
{
    return self->count;
}

static PyMethodDef History_methods[] = {
    {"admit", (PyCFunction)(void (*)(void))History_admit, METH_FASTCALL | METH_KEYWORDS,
     "Offer each block at now; the ones the reuse-horizon rule admits, and how many it "
     "refused."},
    {"clear", (PyCFunction)History_clear, METH_NOARGS, "Forget every offer."},
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
