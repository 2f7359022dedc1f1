/* A miniature model of the tier in C: Miniature(slots, horizon, protected_slots,
 * admit_continuations, offers, turnovers).
 *
 * offload/cpu/policies/miniature_model.py states what a model does with a request (its lookup,
 * touch and store, and the admission rule of its candidate) and holds its Python form; this is the
 * same model without the interpreter's cost per block, which the gated tier pays on every
 * request in each of its models. Tests hold both forms to the same sequences.
 *
 * The resident blocks sit in a key table (offload/key_table.h) whose entries carry their rank
 * (the model's clock at their last use) and their segment, linked oldest to newest in the
 * probation and the protected segment. A gated model asks its offer history (an OfferHistory)
 * which of a request's missing blocks earn a slot, once per request.
 *
 * A key's __hash__ or __eq__ may run Python code: the request is read from a tuple of its own,
 * and a model that such code calls back into while it runs a request refuses with a
 * RuntimeError, so its state is whole at every point where Python code may run.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include "structmember.h"
#include "key_table.h"
#include "key_check.h"
#include "small_int.h"

enum { PROBATION = 0, PROTECTED = 1 }; /* an entry's segment, in its count */

typedef struct {
    PyObject_HEAD
    KeyTable table; /* the resident blocks; its slots are NULL before __init__ */
    KeyList probation, protected;
    PyObject *offers; /* the offer history a gated model admits by */
    Py_ssize_t slots, protected_slots;
    int gated;               /* 0: every missing block is stored (no horizon) */
    double horizon;          /* in residency ages; INFINITY: any gap the history remembers */
    int admit_continuations; /* a request whose head the tier held is stored whatever the gate */
    long long clock;
    double hits;
    /* The residency age (offload/cpu/policies/residency.py's ResidencyAge, over this model). */
    long long turnovers, evicted;
    int has_average, has_age;
    double average, age;
    int running; /* a request is being run: a call back into the model is refused */
} Model;

static PyObject *admit_name; /* "admit", interned */
static PyObject *clear_name; /* "clear", interned */

static int
model_ready(const Model *self)
{
    if (self->table.slots == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Miniature.__init__ was not called");
        return -1;
    }
    if (self->running) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Miniature called back while it runs a request (from a key's "
                        "__hash__, __eq__ or finalizer)");
        return -1;
    }
    return 0;
}

static void
observe_eviction(Model *self, long long age, Py_ssize_t evicted)
{
    if (!self->has_average) {
        self->average = (double)age;
        self->has_average = 1;
    } else {
        double weight = fmin(1.0, (double)evicted / (double)self->slots);
        self->average += ((double)age - self->average) * weight;
    }
    if (!self->has_age) {
        self->evicted += evicted;
        /* evicted < turnovers * slots, the product unformed: it may pass 2**63 */
        if (self->evicted / (long long)self->slots < self->turnovers)
            return;
        self->has_age = 1;
    }
    self->age = self->average;
}

/* Evict the oldest block of list. */
static void
evict_oldest(Model *self, KeyList *list)
{
    Py_ssize_t index = list->end[OLDEST];
    key_list_unlink(&self->table, list, index);
    Py_DECREF(key_table_remove(&self->table, index));
}

/* The indices of items (taken head first in the order given by order[0..n)) whose key no
 * earlier one equals, written over order; their count, or -1 with an exception from __eq__. */
static Py_ssize_t
first_of_each(PyObject *const *items, const Py_hash_t *hashes, Py_ssize_t *order, Py_ssize_t n)
{
    if (n < 2)
        return n;
    size_t size = 4;
    while (size < 2 * (size_t)n)
        size *= 2;
    Py_ssize_t *seen = key_empty_slots(size);
    if (seen == NULL)
        return -1;
    Py_ssize_t kept = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t item = order[j];
        size_t i = (size_t)(((uint64_t)hashes[item] * FIBONACCI_MIX) >> 32) & (size - 1);
        int repeated = 0;
        for (; seen[i] != KEY_NONE && !repeated; i = (i + 1) & (size - 1)) {
            Py_ssize_t other = seen[i];
            if (hashes[other] != hashes[item])
                continue;
            repeated = items[other] == items[item]
                           ? 1
                           : PyObject_RichCompareBool(items[other], items[item], Py_EQ);
            if (repeated < 0) {
                PyMem_Free(seen);
                return -1;
            }
        }
        if (!repeated) {
            seen[i] = item;
            order[kept++] = item;
        }
    }
    PyMem_Free(seen);
    return kept;
}

/* The blocks of offered the model stores: all of them ungated, else its offer history's
 * verdict at its horizon. A new reference to a list, or NULL with an exception. */
static PyObject *
admitted(Model *self, PyObject *offered, long long now, int continues)
{
    if (!self->gated)
        return Py_NewRef(offered);
    PyObject *oldest;
    if (!self->has_age || (continues && self->admit_continuations))
        oldest = Py_NewRef(Py_None);
    else if (isinf(self->horizon))
        oldest = PyFloat_FromDouble(-INFINITY);
    else
        oldest = PyFloat_FromDouble((double)now - self->horizon * self->age);
    PyObject *clock = PyLong_FromLongLong(now);
    PyObject *free = PyLong_FromSsize_t(self->slots - self->table.count);
    PyObject *verdict = NULL;
    if (oldest != NULL && clock != NULL && free != NULL) {
        PyObject *args[] = {self->offers, offered, clock, free, oldest};
        verdict = PyObject_VectorcallMethod(admit_name, args,
                                            5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    Py_XDECREF(oldest);
    Py_XDECREF(clock);
    Py_XDECREF(free);
    if (verdict == NULL)
        return NULL;
    PyObject *stored = NULL;
    if (PyTuple_Check(verdict) && PyTuple_GET_SIZE(verdict) == 2 &&
        PyList_Check(PyTuple_GET_ITEM(verdict, 0)))
        stored = Py_NewRef(PyTuple_GET_ITEM(verdict, 0));
    else
        PyErr_SetString(PyExc_TypeError, "the offer history's admit() must return "
                                         "(list of admitted blocks, refused count)");
    Py_DECREF(verdict);
    return stored;
}

/* Store key as probation's newest unless it is resident: its entry; KEY_NONE when it was
 * resident already (the history admitted a block it was not offered); -2 with an exception (a
 * key's hash, memory). */
static Py_ssize_t
store_block(Model *self, PyObject *key, long long clock)
{
    KeyTable *table = &self->table;
    Py_hash_t hash = hash_of(key);
    if (hash == -1)
        return -2;
    size_t slot;
    Py_ssize_t index = key_table_find(table, key, hash, &slot);
    if (index != KEY_NONE)
        return index == -2 ? -2 : KEY_NONE;
    index = key_table_add(table, key, hash, slot, clock, PROBATION);
    if (index == KEY_NONE)
        return -2;
    key_list_push(table, &self->probation, index, NEWEST);
    return index;
}

/* Store the blocks of new (tail first, so the head is newest), the chain's last block then
 * ranked as probation's oldest if demote; -1 with an exception. new is the offer history's
 * list, which a key's __hash__ or __eq__ may shorten while it is read: the store ends there, as
 * the Python form's reversed() does, and each key is held while it is stored. */
static int
store(Model *self, PyObject *new, long long clock, int demote)
{
    KeyTable *table = &self->table;
    Py_ssize_t n = PyList_GET_SIZE(new), last = KEY_NONE;
    for (Py_ssize_t j = n - 1; j >= 0; j--) {
        if (j >= PyList_GET_SIZE(new))
            break;
        PyObject *key = Py_NewRef(PyList_GET_ITEM(new, j));
        Py_ssize_t index = store_block(self, key, clock);
        Py_DECREF(key);
        if (index == -2)
            return -1;
        if (j == n - 1)
            last = index;
    }
    if (last != KEY_NONE && demote) {
        long long oldest = table->entries[self->probation.end[OLDEST]].time;
        key_list_unlink(table, &self->probation, last);
        key_list_push(table, &self->probation, last, OLDEST);
        table->entries[last].time = oldest;
    }
    return 0;
}

/* One request's blocks (a tuple), head first, their hashes given: its lookup, touch and
 * store, its last stored block demoted if ends (see the Python form); where has room for n
 * indices. -1 with an exception; the state stays whole (what was done before stays done). */
static int
run_request(Model *self, PyObject *const *items, const Py_hash_t *hashes, Py_ssize_t n,
            double decay, int continues, int ends, Py_ssize_t *where)
{
    KeyTable *table = &self->table;
    /* Each block's entry, found once: the touch below moves entries between lists but adds
     * or removes none, and no call back can change the table meanwhile. */
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t slot;
        where[i] = key_table_find(table, items[i], hashes[i], &slot);
        if (where[i] == -2)
            return -1;
    }
    Py_ssize_t hit = 0;
    while (hit < n && where[hit] != KEY_NONE)
        hit++;
    double kept = self->hits * decay;
    self->hits = kept + (double)hit;
    KeyList *segment = self->protected_slots ? &self->protected : &self->probation;
    for (Py_ssize_t i = n - 1; i >= 0; i--) { /* tail first, so the head ends newest */
        Py_ssize_t index = where[i];
        if (index == KEY_NONE)
            continue;
        KeyEntry *entry = &table->entries[index];
        key_list_unlink(table, entry->count == PROTECTED ? &self->protected : &self->probation,
                        index);
        entry->time = ++self->clock;
        entry->count = segment == &self->protected ? PROTECTED : PROBATION;
        key_list_push(table, segment, index, NEWEST);
    }
    while (self->protected.length > self->protected_slots) { /* SLRU's demotion */
        Py_ssize_t index = self->protected.end[OLDEST];
        key_list_unlink(table, &self->protected, index);
        table->entries[index].time = self->clock;
        table->entries[index].count = PROBATION;
        key_list_push(table, &self->probation, index, NEWEST);
    }
    Py_ssize_t *absent = where; /* the missing blocks' positions, head first, in place */
    Py_ssize_t missing = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (where[i] == KEY_NONE)
            absent[missing++] = i;
    missing = first_of_each(items, hashes, absent, missing);
    if (missing < 0)
        return -1;
    PyObject *offered = PyList_New(missing);
    if (offered == NULL)
        return -1;
    for (Py_ssize_t j = 0; j < missing; j++)
        PyList_SET_ITEM(offered, j, Py_NewRef(items[absent[j]]));
    long long now = self->clock;
    PyObject *new = admitted(self, offered, now, continues);
    Py_DECREF(offered);
    if (new == NULL)
        return -1;
    self->clock = now + missing; /* refused blocks were seen too, as in the tier */
    if (PyList_GET_SIZE(new) > self->slots) { /* the tier cannot make that much room */
        Py_SETREF(new, PyList_New(0));
        if (new == NULL)
            return -1;
    }
    Py_ssize_t excess = table->count + PyList_GET_SIZE(new) - self->slots;
    if (excess > 0) {
        /* As the tier times an eviction: the oldest block's age, weighed by the count. */
        KeyList *first = self->probation.length ? &self->probation : &self->protected;
        long long oldest = table->entries[first->end[OLDEST]].time;
        Py_ssize_t from_probation = excess < self->probation.length ? excess
                                                                     : self->probation.length;
        for (Py_ssize_t j = 0; j < from_probation; j++)
            evict_oldest(self, &self->probation);
        for (Py_ssize_t j = from_probation; j < excess; j++)
            evict_oldest(self, &self->protected);
        observe_eviction(self, self->clock - oldest, excess);
    }
    int status = store(self, new, self->clock, ends);
    Py_DECREF(new);
    return status;
}

#define ON_STACK 64 /* a request of at most this many blocks needs no allocation */

/* run(request, decay, continues, ends=True) */
static PyObject *
Model_run(Model *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "run() takes (request, decay, continues[, ends])");
        return NULL;
    }
    if (model_ready(self) < 0)
        return NULL;
    double decay = PyFloat_AsDouble(args[1]);
    if (decay == -1.0 && PyErr_Occurred())
        return NULL;
    int continues = PyObject_IsTrue(args[2]);
    if (continues < 0)
        return NULL;
    int ends = nargs == 4 ? PyObject_IsTrue(args[3]) : 1;
    if (ends < 0)
        return NULL;
    PyObject *request = PySequence_Tuple(args[0]);
    if (request == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(request);
    PyObject *const *items = &PyTuple_GET_ITEM(request, 0);
    Py_hash_t hashes_on_stack[ON_STACK];
    Py_ssize_t where_on_stack[ON_STACK];
    Py_hash_t *hashes = hashes_on_stack;
    Py_ssize_t *where = where_on_stack;
    if (n > ON_STACK) {
        hashes = PyMem_Malloc((size_t)n * sizeof(Py_hash_t));
        where = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
    }
    int status = -1;
    if (hashes == NULL || where == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    self->running = 1;
    Py_ssize_t i = 0;
    for (; i < n && (hashes[i] = hash_of(items[i])) != -1; i++)
        ;
    if (i == n)
        status = run_request(self, items, hashes, n, decay, continues, ends, where);
    self->running = 0;
done:
    if (n > ON_STACK) {
        PyMem_Free(hashes);
        PyMem_Free(where);
    }
    Py_DECREF(request);
    if (status < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Forget every block, offer and eviction (see key_table_empty). */
static void
model_empty(Model *self)
{
    self->probation = self->protected = EMPTY_KEY_LIST;
    key_table_empty(&self->table);
}

static PyObject *
Model_clear(Model *self, PyObject *Py_UNUSED(ignored))
{
    if (model_ready(self) < 0)
        return NULL;
    model_empty(self);
    self->clock = self->evicted = 0;
    self->has_average = self->has_age = 0;
    self->hits = 0.0;
    PyObject *cleared = PyObject_VectorcallMethod(
        clear_name, &self->offers, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (cleared == NULL)
        return NULL;
    Py_DECREF(cleared);
    Py_RETURN_NONE;
}

static int
Model_init(Model *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"slots",  "horizon",   "protected_slots", "admit_continuations",
                               "offers", "turnovers", NULL};
    Py_ssize_t slots, protected_slots;
    PyObject *horizon, *offers;
    int admit_continuations;
    long long turnovers;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nOnpOL:Miniature", keywords, &slots, &horizon,
                                     &protected_slots, &admit_continuations, &offers, &turnovers))
        return -1;
    if (slots < 1 || protected_slots < 0 || protected_slots > slots || turnovers < 0) {
        PyErr_Format(PyExc_ValueError,
                     "slots must be >= 1, protected_slots in [0, slots] and turnovers >= 0, "
                     "got %zd, %zd and %lld",
                     slots, protected_slots, turnovers);
        return -1;
    }
    double reach = 0.0;
    if (horizon != Py_None) {
        reach = PyFloat_AsDouble(horizon);
        if (reach == -1.0 && PyErr_Occurred())
            return -1;
        if (!(reach > 0.0)) {
            PyErr_Format(PyExc_ValueError, "horizon must be None or > 0, got %R", horizon);
            return -1;
        }
    }
    if (self->running) {
        PyErr_SetString(PyExc_RuntimeError, "Miniature re-initialised while it runs a request");
        return -1;
    }
    KeyTable table;
    if (key_table_init(&table) < 0)
        return -1;
    KeyTable old = self->table; /* slots NULL before the first __init__ */
    PyObject *old_offers = self->offers;
    self->table = table;
    self->probation = self->protected = EMPTY_KEY_LIST;
    self->offers = Py_NewRef(offers);
    self->slots = slots;
    self->protected_slots = protected_slots;
    self->gated = horizon != Py_None;
    self->horizon = reach;
    self->admit_continuations = admit_continuations;
    self->turnovers = turnovers;
    self->clock = self->evicted = 0;
    self->has_average = self->has_age = 0;
    self->hits = 0.0;
    /* Last: a key's finalizer may call back, and finds the model whole and new. */
    key_table_free(&old);
    Py_XDECREF(old_offers);
    return 0;
}

static int
Model_traverse(Model *self, visitproc visit, void *arg)
{
    Py_VISIT(self->offers);
    return key_table_traverse(&self->table, visit, arg);
}

static int
Model_clear_refs(Model *self)
{
    model_empty(self);
    Py_CLEAR(self->offers);
    return 0;
}

static void
Model_dealloc(Model *self)
{
    PyObject_GC_UnTrack(self);
    self->probation = self->protected = EMPTY_KEY_LIST;
    key_table_free(&self->table);
    Py_CLEAR(self->offers);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
Model_len(Model *self)
{
    return self->table.count;
}

static int
Model_contains(Model *self, PyObject *key)
{
    if (self->table.slots == NULL)
        return 0;
    Py_hash_t hash = hash_of(key);
    if (hash == -1)
        return -1;
    size_t slot;
    Py_ssize_t index = key_table_find(&self->table, key, hash, &slot);
    return index == -2 ? -1 : index != KEY_NONE;
}

/* A segment's blocks, oldest first. */
static PyObject *
segment_keys(Model *self, const KeyList *list)
{
    PyObject *keys = PyList_New(list->length);
    if (keys == NULL)
        return NULL;
    const KeyEntry *entries = self->table.entries;
    Py_ssize_t j = 0, index = list->end[OLDEST];
    for (; index != KEY_NONE; index = entries[index].toward[NEWEST])
        PyList_SET_ITEM(keys, j++, Py_NewRef(entries[index].key));
    return keys;
}

static PyObject *
Model_probation(Model *self, void *Py_UNUSED(closure))
{
    return segment_keys(self, &self->probation);
}

static PyObject *
Model_protected(Model *self, void *Py_UNUSED(closure))
{
    return segment_keys(self, &self->protected);
}

static PyObject *
Model_age(Model *self, void *Py_UNUSED(closure))
{
    if (!self->has_age)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(self->age);
}

/* invariant_violations() -> the model's broken invariants, worded as the Python form words
 * those it can have: each block in one segment, linked both ways; within its slots and its
 * protected share. */
static PyObject *
Model_invariant_violations(Model *self, PyObject *Py_UNUSED(ignored))
{
    if (model_ready(self) < 0)
        return NULL;
    KeyCheck check;
    if (key_check_start(&check, &self->table) < 0)
        return NULL;
    key_check_list(&check, &self->table, &self->probation, "probation", PROBATION);
    key_check_list(&check, &self->table, &self->protected, "protected", PROTECTED);
    key_check_unlisted(&check, &self->table, "probation, protected");
    if (self->table.count > self->slots)
        key_check_note(&check, NULL, "holds %zd blocks, over its %zd slots", self->table.count,
                       self->slots);
    if (self->protected.length > self->protected_slots)
        key_check_note(&check, NULL, "protected holds %zd blocks, over its %zd slots",
                       self->protected.length, self->protected_slots);
    return key_check_finish(&check);
}

static PyMethodDef Model_methods[] = {
    {"run", (PyCFunction)(void (*)(void))Model_run, METH_FASTCALL,
     "One request's sampled blocks, head first: its lookup, touch and store."},
    {"clear", (PyCFunction)Model_clear, METH_NOARGS, "Forget every block and offer."},
    {"invariant_violations", (PyCFunction)Model_invariant_violations, METH_NOARGS,
     "Every broken invariant of the model's tables, worded."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Model_members[] = {
    {"slots", T_PYSSIZET, offsetof(Model, slots), READONLY, "Resident blocks at most."},
    {"protected_slots", T_PYSSIZET, offsetof(Model, protected_slots), READONLY,
     "Blocks the protected segment holds at most."},
    {"offers", T_OBJECT, offsetof(Model, offers), READONLY, "The model's offer history."},
    {"hits", T_DOUBLE, offsetof(Model, hits), 0, "Hits counted, decayed per request."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Model_getset[] = {
    {"probation", (getter)Model_probation, NULL, "Blocks not reused since their store, oldest "
                                                 "first.", NULL},
    {"protected", (getter)Model_protected, NULL, "Blocks reused since their store, oldest first.",
     NULL},
    {"age", (getter)Model_age, NULL, "The residency age; None until the model turned over.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Model_as_sequence = {
    .sq_length = (lenfunc)Model_len,
    .sq_contains = (objobjproc)Model_contains,
};

static PyTypeObject ModelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "offload.cpu.policies._miniature.Miniature",
    .tp_doc = "Miniature(slots, horizon, protected_slots, admit_continuations, offers, "
              "turnovers): a hash-only model of the tier, in C.",
    .tp_basicsize = sizeof(Model),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Model_init,
    .tp_dealloc = (destructor)Model_dealloc,
    .tp_traverse = (traverseproc)Model_traverse,
    .tp_clear = (inquiry)Model_clear_refs,
    .tp_methods = Model_methods,
    .tp_members = Model_members,
    .tp_getset = Model_getset,
    .tp_as_sequence = &Model_as_sequence,
};

/* sampled(block_hashes, mask) -> the blocks whose Python hash, mixed, has no bit of mask set.
 * Python reads the product's bits 32 and up at unbounded precision; for a mask below 2**32
 * they lie within the product's low 64 bits, which unsigned arithmetic keeps exactly. */
static PyObject *
sampled(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "sampled() takes (block_hashes, mask)");
        return NULL;
    }
    unsigned long long mask = PyLong_AsUnsignedLongLong(args[1]);
    if (mask == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (mask >= ((unsigned long long)1 << 32)) {
        PyErr_Format(PyExc_ValueError, "mask must be below 2**32, got %llu", mask);
        return NULL;
    }
    PyObject *blocks = PySequence_Tuple(args[0]);
    if (blocks == NULL)
        return NULL;
    PyObject *kept = PyList_New(0);
    for (Py_ssize_t i = 0; kept != NULL && i < PyTuple_GET_SIZE(blocks); i++) {
        PyObject *key = PyTuple_GET_ITEM(blocks, i);
        Py_hash_t hash = hash_of(key);
        if (hash == -1 || (((uint64_t)hash * FIBONACCI_MIX >> 32 & mask) == 0 &&
                           PyList_Append(kept, key) < 0))
            Py_CLEAR(kept);
    }
    Py_DECREF(blocks);
    return kept;
}

static PyMethodDef module_methods[] = {
    {"sampled", (PyCFunction)(void (*)(void))sampled, METH_FASTCALL,
     "The blocks a duel's models see: those whose mixed hash has no bit of mask set."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_miniature", "A miniature model of the tier, in C.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__miniature(void)
{
    admit_name = PyUnicode_InternFromString("admit");
    clear_name = PyUnicode_InternFromString("clear");
    if (admit_name == NULL || clear_name == NULL || PyType_Ready(&ModelType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ModelType);
    if (PyModule_AddObject(m, "Miniature", (PyObject *)&ModelType) < 0) {
        Py_DECREF(&ModelType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
