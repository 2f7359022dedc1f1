/* Miss attribution in C: the manager's memory of evictions and refusals (the policy's, and the
 * tier's for want of room), and its counts.
 *
 * offload/cpu/miss_attribution.py states what each reason means and holds
 * the Python form; this is the same contract at a fraction of the cost, since
 * the manager calls it on every missed lookup, every store and every eviction
 * batch. Tests hold both forms to the same scripted sequences.
 *
 * Generations keep each generation as an open-addressing table of the
 * hashes' Python hash values, sized once for the horizon: remembering a block
 * is a probe into a table that never resizes, and the hash objects are not
 * kept alive. Two different hashes with equal hash values read as one (a 1 in
 * 2**64 chance for vLLM's digests; never for ints from 0 to 2**61 - 2, whose
 * hash is themselves).
 *
 * A table larger than the caches makes each probe wait on memory, and a store's evictions
 * and a lookup's miss each probe right after they are known. So both wait for the next call
 * with their slots asked for: an added hash is placed once WAITING newer ones are, or when
 * anything reads the generations; a miss's reason is found when it settles (its next call
 * into the attribution, or a read of the counts). The manager adds to the memories only
 * through stored(), which settles first, so a miss still reads what was remembered at it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "structmember.h"
#include "small_int.h"

/* Asking for a slot's line ahead of its probe (a hint: nothing where the compiler has no such
 * builtin). */
#if defined(__GNUC__)
#define PREFETCH(address) __builtin_prefetch(address)
#else
#define PREFETCH(address) ((void)(address))
#endif
#define WAITING 64 /* added hashes that wait to be placed, their slots asked for */

typedef struct {
    Py_hash_t *slots; /* 0 marks an empty slot */
    Py_ssize_t used;
    int zero; /* hash value 0 is held (it cannot sit in a slot) */
} Table;

typedef struct {
    PyObject_HEAD
    Py_ssize_t horizon;
    int shift;   /* 64 - log2(slots) */
    size_t mask; /* slots - 1 */
    Table tables[2];
    int newest; /* the index of the generation being filled */
    Py_hash_t waiting[WAITING]; /* added hashes whose slots were asked for, not placed yet */
    int waiting_count;
} Generations;

/* A hash's home slot in a table of 2**(64 - shift) slots. Fibonacci hashing: sequential ids
 * spread over the table. */
static inline size_t
home_slot(Py_hash_t hash, int shift)
{
    return (size_t)(((uint64_t)hash * 0x9E3779B97F4A7C15ULL) >> shift);
}

static int
table_has(const Generations *self, const Table *table, Py_hash_t hash)
{
    if (hash == 0)
        return table->zero;
    for (size_t i = home_slot(hash, self->shift);; i = (i + 1) & self->mask) {
        Py_hash_t held = table->slots[i];
        if (held == hash)
            return 1;
        if (held == 0)
            return 0;
    }
}

/* Place a non-zero hash, whose home slot is slot, among slots (mask + 1 of them); returns 1
 * when it was not held before. */
static inline int
slots_put(Py_hash_t *slots, size_t mask, size_t slot, Py_hash_t hash)
{
    Py_hash_t held;
    while ((held = slots[slot]) != 0) {
        if (held == hash)
            return 0;
        slot = (slot + 1) & mask;
    }
    slots[slot] = hash;
    return 1;
}

/* Empty a table in place: its pages stay mapped, so refilling it takes no page faults (a fresh
 * allocation per generation cost more in faults than all the probes into it). */
static void
table_empty(const Generations *self, Table *table)
{
    if (table->used)
        memset(table->slots, 0, (self->mask + 1) * sizeof(Py_hash_t));
    table->used = 0;
    table->zero = 0;
}

static int
Generations_init(Generations *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"horizon", NULL};
    Py_ssize_t horizon;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:Generations", keywords, &horizon))
        return -1;
    if (horizon < 1 || horizon > ((Py_ssize_t)1 << 40)) {
        PyErr_Format(PyExc_ValueError, "horizon must be in [1, 2**40], got %zd", horizon);
        return -1;
    }
    /* Each table holds at most horizon hashes at under half load. */
    int bits = 3;
    while (((Py_ssize_t)1 << bits) < 2 * horizon)
        bits++;
    /* Both tables first, then the new size: a failure leaves the object as it was.
     * (calloc: a large table's pages stay the system's zero pages until written.) */
    Py_hash_t *fresh[2];
    for (int t = 0; t < 2; t++) {
        fresh[t] = PyMem_RawCalloc((size_t)1 << bits, sizeof(Py_hash_t));
        if (fresh[t] == NULL) {
            PyMem_RawFree(fresh[0]);
            PyErr_NoMemory();
            return -1;
        }
    }
    for (int t = 0; t < 2; t++) {
        PyMem_RawFree(self->tables[t].slots);
        self->tables[t] = (Table){.slots = fresh[t], .used = 0, .zero = 0};
    }
    self->horizon = horizon;
    self->shift = 64 - bits;
    self->mask = ((size_t)1 << bits) - 1;
    self->newest = 0;
    self->waiting_count = 0;
    return 0;
}

static void
Generations_dealloc(Generations *self)
{
    PyMem_RawFree(self->tables[0].slots);
    PyMem_RawFree(self->tables[1].slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
check_ready(const Generations *self)
{
    if (self->tables[0].slots != NULL)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "Generations.__init__ was not called");
    return -1;
}

/* Place the waiting hashes, oldest first, so the generations hold all that was added. */
static void
place_waiting(Generations *self)
{
    /* The geometry, the slots and the count in locals: a store into the slots (Py_hash_t, the
     * count's own type) would otherwise make the compiler reload them all for every hash. */
    const size_t mask = self->mask;
    const Py_ssize_t horizon = self->horizon;
    const int shift = self->shift;
    Table *table = &self->tables[self->newest];
    Py_hash_t *slots = table->slots;
    Py_ssize_t used = table->used;
    for (int i = 0; i < self->waiting_count; i++) {
        Py_hash_t hash = self->waiting[i];
        int fresh;
        if (hash == 0) { /* hash value 0 cannot sit in a slot: a flag holds it */
            fresh = !table->zero;
            table->zero = 1;
        } else {
            fresh = slots_put(slots, mask, home_slot(hash, shift), hash);
        }
        if (fresh && ++used >= horizon) {
            /* This generation is full: it becomes the old one, the one before it is dropped. */
            table->used = used;
            int oldest = 1 - self->newest;
            table_empty(self, &self->tables[oldest]);
            self->newest = oldest;
            table = &self->tables[oldest];
            slots = table->slots;
            used = 0;
        }
    }
    table->used = used;
    self->waiting_count = 0;
}

/* Remember the hashes of any iterable; 0, or -1 with an exception (an unhashable hash: the
 * hashes before it stay remembered). Each waits, its slot asked for, to be placed later. */
static int
generations_add_all(Generations *self, PyObject *block_hashes)
{
    /* Most stores refuse nothing and find room: their empty tuple or list is passed over here. */
    if ((PyTuple_CheckExact(block_hashes) && PyTuple_GET_SIZE(block_hashes) == 0) ||
        (PyList_CheckExact(block_hashes) && PyList_GET_SIZE(block_hashes) == 0))
        return 0;
    PyObject *seq = PySequence_Fast(block_hashes, "block hashes must be iterable");
    if (seq == NULL)
        return -1;
    /* The count and the slots in locals: a store into waiting (Py_hash_t) would otherwise make
     * the compiler reload them for every hash. A key that is not its own hash runs __hash__,
     * which may run Python code, even code that changes the list or adds to these generations:
     * around it the count is published and everything read afresh, the list's items too. */
    int count = self->waiting_count;
    const Py_hash_t *slots = self->tables[self->newest].slots;
    int status = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        Py_hash_t hash;
        if (!own_hash(PySequence_Fast_GET_ITEM(seq, i), &hash)) {
            self->waiting_count = count;
            hash = hash_of(PySequence_Fast_GET_ITEM(seq, i));
            count = self->waiting_count;
            slots = self->tables[self->newest].slots;
            if (hash == -1) {
                status = -1;
                break;
            }
        }
        if (count == WAITING) {
            self->waiting_count = count;
            place_waiting(self);
            slots = self->tables[self->newest].slots;
            count = 0;
        }
        self->waiting[count++] = hash;
        PREFETCH(&slots[home_slot(hash, self->shift)]);
    }
    self->waiting_count = count;
    Py_DECREF(seq);
    return status;
}

static PyObject *
Generations_add(Generations *self, PyObject *block_hashes)
{
    if (check_ready(self) < 0 || generations_add_all(self, block_hashes) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static void
generations_empty(Generations *self)
{
    self->waiting_count = 0;
    table_empty(self, &self->tables[0]);
    table_empty(self, &self->tables[1]);
}

static PyObject *
Generations_clear(Generations *self, PyObject *Py_UNUSED(ignored))
{
    if (check_ready(self) < 0)
        return NULL;
    generations_empty(self);
    Py_RETURN_NONE;
}

/* Whether any hash is held or waiting, in one test: a memory that stays empty (no_room while
 * every store finds room, refused under a policy that admits all) then costs a miss only this
 * test. */
static inline int
generations_hold_any(const Generations *generations)
{
    return (generations->waiting_count | generations->tables[0].used |
            generations->tables[1].used) != 0;
}

/* Ask for the slots a lookup of hash will read, in the tables that hold anything. */
static void
generations_prefetch(const Generations *generations, Py_hash_t hash)
{
    if (!generations_hold_any(generations))
        return;
    size_t slot = home_slot(hash, generations->shift);
    for (int t = 0; t < 2; t++)
        if (generations->tables[t].used)
            PREFETCH(&generations->tables[t].slots[slot]);
}

static int
generations_has(Generations *generations, Py_hash_t hash)
{
    if (!generations_hold_any(generations))
        return 0;
    place_waiting(generations);
    const Table *tables = generations->tables;
    return (tables[0].used && table_has(generations, &tables[0], hash)) ||
           (tables[1].used && table_has(generations, &tables[1], hash));
}

static int
Generations_contains(Generations *self, PyObject *key)
{
    if (check_ready(self) < 0)
        return -1;
    Py_hash_t hash = hash_of(key);
    if (hash == -1)
        return -1;
    return generations_has(self, hash);
}

static Py_ssize_t
Generations_len(Generations *self)
{
    place_waiting(self);
    return self->tables[0].used + self->tables[1].used;
}

static PyMethodDef Generations_methods[] = {
    {"add", (PyCFunction)Generations_add, METH_O, "Remember these hashes (any iterable)."},
    {"clear", (PyCFunction)Generations_clear, METH_NOARGS, "Forget every hash."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Generations_members[] = {
    {"horizon", T_PYSSIZET, offsetof(Generations, horizon), READONLY,
     "Hashes a generation holds before it becomes the old one."},
    {NULL, 0, 0, 0, NULL},
};

static PySequenceMethods Generations_as_sequence = {
    .sq_length = (lenfunc)Generations_len,
    .sq_contains = (objobjproc)Generations_contains,
};

static PyTypeObject GenerationsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "offload.cpu._miss_attribution.Generations",
    .tp_doc = "Recent hashes in two generations of at most `horizon` each, in C.",
    .tp_basicsize = sizeof(Generations),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Generations_init,
    .tp_dealloc = (destructor)Generations_dealloc,
    .tp_methods = Generations_methods,
    .tp_members = Generations_members,
    .tp_as_sequence = &Generations_as_sequence,
};


/* ---- MissAttribution ------------------------------------------------------------------ */

enum { COLD, EVICTED, NOT_ADMITTED, NO_ROOM, IN_FLIGHT, PREFIX_LOST, REASONS, UNSETTLED = -1 };
/* Tokens of one block at most (the manager's MAX_BLOCK_SIZE): a miss's tokens, its blocks
 * times this, stay far inside a long long for any sequence of blocks memory can hold. */
#define MAX_BLOCK_TOKENS 2147483647LL
static const char *const REASON_NAMES[REASONS] = {
    "cold", "evicted", "not_admitted", "no_room", "in_flight", "prefix_lost"};

typedef struct {
    PyObject_HEAD
    Generations *evicted;
    Generations *refused;
    Generations *no_room;
    long long lookups[REASONS];
    long long blocks[REASONS];
    long long tokens[REASONS];
    PyObject *pending_hash; /* the last miss's break block, NULL when none is pending */
    Py_hash_t pending_value; /* its hash value, which its reason is found by */
    int pending_reason;      /* UNSETTLED until the miss settles */
    long long pending_lost;
    long long pending_block_tokens; /* tokens of each of its blocks */
} Attribution;

static Generations *
new_generations(Py_ssize_t horizon)
{
    PyObject *args = Py_BuildValue("(n)", horizon);
    if (args == NULL)
        return NULL;
    PyObject *made = PyObject_CallObject((PyObject *)&GenerationsType, args);
    Py_DECREF(args);
    return (Generations *)made;
}

static int
Attribution_init(Attribution *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"capacity", "horizon_capacities", NULL};
    Py_ssize_t capacity, horizon_capacities; /* no default: the Python module holds it */
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "nn:MissAttribution", keywords, &capacity,
                                     &horizon_capacities))
        return -1;
    if (capacity < 0 || horizon_capacities < 1) {
        PyErr_Format(PyExc_ValueError,
                     "capacity must be >= 0 and horizon_capacities >= 1, got %zd and %zd",
                     capacity, horizon_capacities);
        return -1;
    }
    Py_ssize_t horizon = capacity > PY_SSIZE_T_MAX / horizon_capacities
                             ? PY_SSIZE_T_MAX
                             : capacity * horizon_capacities;
    if (horizon < 1) /* a tier of no blocks still remembers one */
        horizon = 1;
    Generations *evicted = new_generations(horizon);
    if (evicted == NULL)
        return -1;
    Generations *refused = new_generations(horizon);
    if (refused == NULL) {
        Py_DECREF(evicted);
        return -1;
    }
    Generations *no_room = new_generations(horizon);
    if (no_room == NULL) {
        Py_DECREF(evicted);
        Py_DECREF(refused);
        return -1;
    }
    Py_XSETREF(self->evicted, evicted);
    Py_XSETREF(self->refused, refused);
    Py_XSETREF(self->no_room, no_room);
    memset(self->lookups, 0, sizeof self->lookups);
    memset(self->blocks, 0, sizeof self->blocks);
    memset(self->tokens, 0, sizeof self->tokens);
    Py_CLEAR(self->pending_hash);
    return 0;
}

static int
Attribution_traverse(Attribution *self, visitproc visit, void *arg)
{
    Py_VISIT(self->evicted);
    Py_VISIT(self->refused);
    Py_VISIT(self->no_room);
    Py_VISIT(self->pending_hash);
    return 0;
}

static int
Attribution_clear_refs(Attribution *self)
{
    Py_CLEAR(self->evicted);
    Py_CLEAR(self->refused);
    Py_CLEAR(self->no_room);
    Py_CLEAR(self->pending_hash);
    return 0;
}

static void
Attribution_dealloc(Attribution *self)
{
    PyObject_GC_UnTrack(self);
    Attribution_clear_refs(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
attribution_ready(const Attribution *self)
{
    if (self->evicted != NULL)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "MissAttribution.__init__ was not called");
    return -1;
}

/* Ask for the slots judging this hash will read, in every memory that holds anything. */
static inline void
prefetch_memories(const Attribution *self, Py_hash_t hash)
{
    generations_prefetch(self->evicted, hash);
    generations_prefetch(self->refused, hash);
    generations_prefetch(self->no_room, hash);
}

/* The reason a lookup of this hash (not being written) is charged, by what is remembered now. */
static int
judge(Attribution *self, Py_hash_t hash)
{
    return generations_has(self->evicted, hash)   ? EVICTED
           : generations_has(self->refused, hash) ? NOT_ADMITTED
           : generations_has(self->no_room, hash) ? NO_ROOM
                                                  : COLD;
}

/* Find the pending miss's reason and count its lookup, if not done yet (its slots were asked
 * for at the miss). */
static void
settle(Attribution *self)
{
    if (self->pending_hash == NULL || self->pending_reason != UNSETTLED)
        return;
    Py_hash_t hash = self->pending_value;
    /* Its slots again (the work since the miss may have pushed them out of the caches): each
     * probe places its memory's waiting hashes first, while they come. */
    prefetch_memories(self, hash);
    int reason = judge(self, hash);
    self->lookups[reason]++;
    self->pending_reason = reason;
}

/* Charge the pending miss's blocks and their tokens: ``behind`` of them to prefix_lost, the
 * rest to its reason. Returns its break block, for the caller to release once its own state is
 * whole: the block's finalizer may run Python code, even a miss, which must not be overwritten
 * by the caller's own. */
static PyObject *
charge_pending(Attribution *self, long long behind)
{
    long long own = self->pending_lost - behind;
    self->blocks[self->pending_reason] += own;
    self->tokens[self->pending_reason] += own * self->pending_block_tokens;
    self->blocks[PREFIX_LOST] += behind;
    self->tokens[PREFIX_LOST] += behind * self->pending_block_tokens;
    PyObject *block_hash = self->pending_hash;
    self->pending_hash = NULL;
    return block_hash;
}

/* Charge the pending miss's blocks, all to its reason; its break block (NULL: none was
 * pending), for the caller to release as charge_pending's. */
static PyObject *
take_pending(Attribution *self)
{
    if (self->pending_hash == NULL)
        return NULL;
    settle(self);
    return charge_pending(self, 0);
}

/* An int argument's value, read straight from a small exact int (a C API call per miss and per
 * store costs more than the work done with it), else through PyLong_AsLongLong: -1 with an
 * exception where that fails. */
static inline long long
int_arg(PyObject *object)
{
    int64_t value;
    return small_int(object, &value) ? (long long)value : PyLong_AsLongLong(object);
}

#define MISS_ARGS "miss() takes (block_hashes, hits, in_flight, block_tokens=1, reason=None)"

/* A reason reason() judged, by name; -1 with a ValueError for anything else (or in_flight). */
static int
judged_reason(PyObject *name, int in_flight)
{
    if (!in_flight && PyUnicode_Check(name)) {
        static const int judged[] = {COLD, EVICTED, NOT_ADMITTED, NO_ROOM};
        for (size_t i = 0; i < sizeof judged / sizeof judged[0]; i++)
            if (PyUnicode_CompareWithASCIIString(name, REASON_NAMES[judged[i]]) == 0)
                return judged[i];
    }
    PyErr_Format(PyExc_ValueError,
                 "reason must be 'cold', 'evicted', 'not_admitted' or 'no_room' with in_flight "
                 "false, got %R",
                 name);
    return -1;
}

/* miss(block_hashes, hits, in_flight, block_tokens=1) */
static PyObject *
Attribution_miss(Attribution *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *in_flight_arg = nargs > 2 ? args[2] : NULL;
    PyObject *block_tokens_arg = nargs > 3 ? args[3] : NULL;
    PyObject *reason_arg = nargs > 4 ? args[4] : NULL;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        PyObject **slot = NULL;
        if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "in_flight") == 0)
            slot = &in_flight_arg;
        else if (PyUnicode_Check(name) &&
                 PyUnicode_CompareWithASCIIString(name, "block_tokens") == 0)
            slot = &block_tokens_arg;
        else if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "reason") == 0)
            slot = &reason_arg;
        if (slot == NULL || *slot != NULL) {
            PyErr_SetString(PyExc_TypeError, MISS_ARGS);
            return NULL;
        }
        *slot = args[nargs + k];
    }
    if (nargs < 2 || nargs > 5 || in_flight_arg == NULL) {
        PyErr_SetString(PyExc_TypeError, MISS_ARGS);
        return NULL;
    }
    if (attribution_ready(self) < 0)
        return NULL;
    long long hits = int_arg(args[1]);
    if (hits == -1 && PyErr_Occurred())
        return NULL;
    long long block_tokens = 1;
    if (block_tokens_arg != NULL) {
        block_tokens = int_arg(block_tokens_arg);
        if (block_tokens == -1 && PyErr_Occurred())
            return NULL;
        if (block_tokens < 1 || block_tokens > MAX_BLOCK_TOKENS) {
            PyErr_Format(PyExc_ValueError, "block_tokens must be from 1 to %lld, got %lld",
                         (long long)MAX_BLOCK_TOKENS, block_tokens);
            return NULL;
        }
    }
    int in_flight = PyObject_IsTrue(in_flight_arg);
    if (in_flight < 0)
        return NULL;
    int given = UNSETTLED; /* a reason judged at the lookup, charged now */
    if (reason_arg != NULL && reason_arg != Py_None &&
        (given = judged_reason(reason_arg, in_flight)) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "block_hashes must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t length = PySequence_Fast_GET_SIZE(seq);
    if (hits < 0 || hits >= length) {
        PyErr_Format(PyExc_ValueError,
                     "a missed lookup needs 0 <= hits < len(block_hashes), got %lld of %zd", hits,
                     length);
        Py_DECREF(seq);
        return NULL;
    }
    PyObject *block_hash = Py_NewRef(PySequence_Fast_ITEMS(seq)[hits]);
    Py_DECREF(seq);
    Py_hash_t hash = 0;
    if (!in_flight && given == UNSETTLED && (hash = hash_of(block_hash)) == -1) {
        Py_DECREF(block_hash);
        return NULL;
    }
    PyObject *charged = take_pending(self);
    if (in_flight)
        given = IN_FLIGHT;
    if (given != UNSETTLED) {
        self->lookups[given]++;
    } else {
        prefetch_memories(self, hash);
    }
    self->pending_hash = block_hash;
    self->pending_value = hash;
    self->pending_reason = given;
    self->pending_lost = length - hits;
    self->pending_block_tokens = block_tokens;
    Py_XDECREF(charged);
    Py_RETURN_NONE;
}

/* Split the pending miss's blocks when a store starts at its break: the held ones are those it
 * lost behind the break. 0, or -1 with an exception (a hash whose compare raised). */
static int
split_pending(Attribution *self, PyObject *first, long long held)
{
    if (self->pending_hash == NULL)
        return 0;
    settle(self); /* a key's __hash__ in this store may have made a new miss */
    /* Both held through the compare, whose __eq__ may run Python code (even a miss, which
     * replaces the pending one: then this store splits nothing). */
    PyObject *pending = Py_NewRef(self->pending_hash);
    Py_INCREF(first);
    int same = PyObject_RichCompareBool(pending, first, Py_EQ);
    Py_DECREF(first);
    int replaced = self->pending_hash != pending;
    Py_DECREF(pending);
    if (same <= 0 || replaced)
        return same < 0 ? -1 : 0;
    long long lost = self->pending_lost;
    Py_DECREF(charge_pending(self, held < lost - 1 ? held : lost - 1));
    return 0;
}

/* stored(requested, held, refused, evicted, no_room=()): one call per store, the manager's
 * only one. */
static PyObject *
Attribution_stored(Attribution *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "stored() takes (requested, held, refused, evicted, no_room=())");
        return NULL;
    }
    if (attribution_ready(self) < 0)
        return NULL;
    long long held = int_arg(args[1]);
    if (held == -1 && PyErr_Occurred())
        return NULL;
    PyObject *requested = PySequence_Fast(args[0], "requested must be a sequence of hashes");
    if (requested == NULL)
        return NULL;
    settle(self); /* by what was remembered at the miss, before this store's refusals and evictions */
    int status = generations_add_all(self->refused, args[2]);
    if (status == 0)
        status = generations_add_all(self->evicted, args[3]);
    if (status == 0 && nargs == 5)
        status = generations_add_all(self->no_room, args[4]);
    if (status == 0 && PySequence_Fast_GET_SIZE(requested) > 0)
        status = split_pending(self, PySequence_Fast_ITEMS(requested)[0], held);
    Py_DECREF(requested);
    if (status < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* reason(block_hash): why a lookup stopping at it (not being written) misses, judged now. */
static PyObject *
Attribution_reason(Attribution *self, PyObject *block_hash)
{
    if (attribution_ready(self) < 0)
        return NULL;
    Py_hash_t hash = hash_of(block_hash);
    if (hash == -1)
        return NULL;
    return PyUnicode_FromString(REASON_NAMES[judge(self, hash)]);
}

static PyObject *
Attribution_flush(Attribution *self, PyObject *Py_UNUSED(ignored))
{
    Py_XDECREF(take_pending(self));
    Py_RETURN_NONE;
}

static PyObject *
Attribution_reset(Attribution *self, PyObject *Py_UNUSED(ignored))
{
    if (attribution_ready(self) < 0)
        return NULL;
    PyObject *charged = take_pending(self);
    generations_empty(self->evicted);
    generations_empty(self->refused);
    generations_empty(self->no_room);
    Py_XDECREF(charged);
    Py_RETURN_NONE;
}

static PyObject *
counts_dict(const long long *counts)
{
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (int r = 0; r < REASONS; r++) {
        PyObject *count = PyLong_FromLongLong(counts[r]);
        if (count == NULL || PyDict_SetItemString(out, REASON_NAMES[r], count) < 0) {
            Py_XDECREF(count);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(count);
    }
    return out;
}

static PyObject *
Attribution_lookups(Attribution *self, void *Py_UNUSED(closure))
{
    settle(self);
    return counts_dict(self->lookups);
}

static PyObject *
Attribution_blocks(Attribution *self, void *Py_UNUSED(closure))
{
    return counts_dict(self->blocks);
}

static PyObject *
Attribution_tokens(Attribution *self, void *Py_UNUSED(closure))
{
    return counts_dict(self->tokens);
}

static PyObject *
Attribution_remembered(Attribution *self, void *Py_UNUSED(closure))
{
    if (attribution_ready(self) < 0)
        return NULL;
    return PyLong_FromSsize_t(Generations_len(self->evicted) + Generations_len(self->refused) +
                              Generations_len(self->no_room));
}

static PyMethodDef Attribution_methods[] = {
    {"miss", (PyCFunction)(void (*)(void))Attribution_miss, METH_FASTCALL | METH_KEYWORDS,
     "Charge a lookup of block_hashes that found the first hits and stopped at the next."},
    {"stored", (PyCFunction)(void (*)(void))Attribution_stored, METH_FASTCALL,
     "A store of requested found held of them already held; refused and evicted these, and "
     "had no room for no_room."},
    {"reason", (PyCFunction)Attribution_reason, METH_O,
     "Why a lookup stopping at block_hash (not being written) misses, judged now."},
    {"flush", (PyCFunction)Attribution_flush, METH_NOARGS,
     "Charge the pending miss's blocks, all to its reason."},
    {"reset", (PyCFunction)Attribution_reset, METH_NOARGS,
     "Charge what is pending and forget every remembered hash."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Attribution_members[] = {
    {"evicted", T_OBJECT_EX, offsetof(Attribution, evicted), READONLY,
     "Blocks recently evicted for room."},
    {"refused", T_OBJECT_EX, offsetof(Attribution, refused), READONLY,
     "Blocks recently refused by the policy's admission."},
    {"no_room", T_OBJECT_EX, offsetof(Attribution, no_room), READONLY,
     "Blocks recently admitted but not stored: the tier could not make room."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Attribution_getset[] = {
    {"lookups", (getter)Attribution_lookups, NULL, "Lookups charged to each reason.", NULL},
    {"blocks", (getter)Attribution_blocks, NULL, "Blocks lost to each reason.", NULL},
    {"tokens", (getter)Attribution_tokens, NULL, "Tokens of the blocks lost to each reason.",
     NULL},
    {"remembered", (getter)Attribution_remembered, NULL,
     "Hashes held to tell evicted, refused and no-room blocks from cold ones.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject AttributionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "offload.cpu._miss_attribution.MissAttribution",
    .tp_doc = "Per-reason counts of missed lookups and blocks, in C.",
    .tp_basicsize = sizeof(Attribution),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Attribution_init,
    .tp_dealloc = (destructor)Attribution_dealloc,
    .tp_traverse = (traverseproc)Attribution_traverse,
    .tp_clear = (inquiry)Attribution_clear_refs,
    .tp_methods = Attribution_methods,
    .tp_members = Attribution_members,
    .tp_getset = Attribution_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_miss_attribution", "Miss attribution, in C.", -1, NULL,
    NULL, NULL, NULL, NULL,
};

static int
add_type(PyObject *m, const char *name, PyTypeObject *type)
{
    if (PyType_Ready(type) < 0)
        return -1;
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__miss_attribution(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (add_type(m, "Generations", &GenerationsType) < 0 ||
        add_type(m, "MissAttribution", &AttributionType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
