/* A table of Python keys with recency lists, for the C forms that hold blocks by their hash.
 *
 * The keys sit in an array of entries, and an open-addressing table of entry indices finds a
 * key by its Python hash, then by equality, as a dict would: keys are held, and two keys are
 * one only when equal. Each entry carries two numbers its user names (a time and a count, say)
 * and links into one of the user's recency lists, newest to oldest: the offer history keeps
 * one list (the order its limit forgets blocks in), a miniature model two (its probation and
 * protected segments). A removed key's slot is closed by moving later ones back (no
 * tombstones), and its entry is reused.
 */
#ifndef KVSCOPE_KEY_TABLE_H
#define KVSCOPE_KEY_TABLE_H

#include <Python.h>
#include <stdint.h>

#define KEY_NONE (-1) /* no entry: an empty slot, or a list's end */
#define KEY_FIRST_BITS 4 /* the table starts at 2**4 slots and doubles at half load */
#define KEY_FIRST_ENTRIES 16 /* entries allocated at first; they double as needed */

typedef struct {
    PyObject *key; /* NULL: the entry is free */
    Py_hash_t hash;
    long long time;  /* the user's: when the key was last seen */
    long long count; /* the user's: how often, or which list the entry is in */
    /* Its neighbours in its list, toward[NEWEST] the newer one (a free entry: the next free
     * entry), toward[OLDEST] the older. */
    Py_ssize_t toward[2];
} KeyEntry;

enum { NEWEST = 0, OLDEST = 1 }; /* a list's ends, and an entry's sides */

typedef struct {
    Py_ssize_t end[2]; /* end[NEWEST], end[OLDEST]: KEY_NONE when the list is empty */
    Py_ssize_t length;
} KeyList;

typedef struct {
    KeyEntry *entries;
    Py_ssize_t allocated, high; /* entries allocated; entries ever used (the rest never were) */
    Py_ssize_t count;
    Py_ssize_t *slots; /* entry indices, KEY_NONE when empty; NULL before key_table_init */
    size_t mask;       /* slots - 1 */
    int shift;         /* 64 - log2(slots) */
    Py_ssize_t free;   /* the first free entry below high */
} KeyTable;

/* Bumped by every change to the slots or entries of any table (of the extension that includes
 * this header): a lookup whose key's __eq__ ran Python code that changed them starts again, as a
 * dict's does, instead of going on through slots that moved or entries that are gone. */
static size_t key_table_changes;

/* Fibonacci hashing's multiplier (miniature_model.py's _MIX): spreads sequential ids. */
#define FIBONACCI_MIX 0x9E3779B97F4A7C15ULL

static const KeyList EMPTY_KEY_LIST = {{KEY_NONE, KEY_NONE}, 0};

static inline size_t
key_home(const KeyTable *table, Py_hash_t hash)
{
    return (size_t)(((uint64_t)hash * FIBONACCI_MIX) >> table->shift);
}

/* size empty slots (KEY_NONE), for PyMem_Free; NULL with a MemoryError. */
static Py_ssize_t *
key_empty_slots(size_t size)
{
    Py_ssize_t *slots = size > SIZE_MAX / sizeof(Py_ssize_t)
                            ? NULL
                            : PyMem_Malloc(size * sizeof(Py_ssize_t));
    if (slots == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (size_t i = 0; i < size; i++)
        slots[i] = KEY_NONE;
    return slots;
}

/* An empty table with its first slots; -1 with a MemoryError, the table untouched. */
static int
key_table_init(KeyTable *table)
{
    size_t size = (size_t)1 << KEY_FIRST_BITS;
    Py_ssize_t *slots = key_empty_slots(size);
    if (slots == NULL)
        return -1;
    *table = (KeyTable){.slots = slots, .mask = size - 1, .shift = 64 - KEY_FIRST_BITS,
                        .free = KEY_NONE};
    key_table_changes++; /* a table that replaces another (re-initialisation) is a change */
    return 0;
}

/* The entry holding key, or KEY_NONE with *slot the empty slot it would take; -2 with an error
 * from a key's __eq__. */
static Py_ssize_t
key_table_find(const KeyTable *table, PyObject *key, Py_hash_t hash, size_t *slot)
{
again:
    for (size_t i = key_home(table, hash);; i = (i + 1) & table->mask) {
        Py_ssize_t index = table->slots[i];
        if (index == KEY_NONE) {
            *slot = i;
            return KEY_NONE;
        }
        const KeyEntry *entry = &table->entries[index];
        if (entry->hash == hash) {
            if (entry->key == key)
                return index;
            /* A key's __eq__ may run Python code: the held key stays alive through it, as a
             * dict keeps its own, and a table it changed is searched again from the start. */
            size_t changes = key_table_changes;
            PyObject *held = Py_NewRef(entry->key);
            int equal = PyObject_RichCompareBool(held, key, Py_EQ);
            Py_DECREF(held);
            if (equal < 0)
                return -2;
            if (key_table_changes != changes)
                goto again;
            if (equal)
                return index;
        }
    }
}

/* The first empty slot from hash's home (for a hash known not to be held). */
static size_t
key_empty_slot(const KeyTable *table, Py_hash_t hash)
{
    size_t i = key_home(table, hash);
    while (table->slots[i] != KEY_NONE)
        i = (i + 1) & table->mask;
    return i;
}

/* Double the slots and place every held entry again; -1 with a MemoryError, the table as it
 * was. */
static int
key_grow_slots(KeyTable *table)
{
    size_t size = 2 * (table->mask + 1);
    Py_ssize_t *slots = key_empty_slots(size);
    if (slots == NULL)
        return -1;
    PyMem_Free(table->slots);
    table->slots = slots;
    table->mask = size - 1;
    table->shift--;
    key_table_changes++;
    for (Py_ssize_t index = 0; index < table->high; index++)
        if (table->entries[index].key != NULL)
            slots[key_empty_slot(table, table->entries[index].hash)] = index;
    return 0;
}

/* A free entry's index; KEY_NONE with a MemoryError. */
static Py_ssize_t
key_take_entry(KeyTable *table)
{
    if (table->free != KEY_NONE) {
        Py_ssize_t index = table->free;
        table->free = table->entries[index].toward[NEWEST];
        return index;
    }
    if (table->high == table->allocated) {
        Py_ssize_t grown = table->allocated ? 2 * table->allocated : KEY_FIRST_ENTRIES;
        if ((size_t)grown > PY_SSIZE_T_MAX / sizeof(KeyEntry)) {
            PyErr_NoMemory();
            return KEY_NONE;
        }
        KeyEntry *entries = PyMem_Realloc(table->entries, (size_t)grown * sizeof(KeyEntry));
        if (entries == NULL) {
            PyErr_NoMemory();
            return KEY_NONE;
        }
        table->entries = entries;
        table->allocated = grown;
    }
    return table->high++;
}

/* Hold key (not held yet) in the slot key_table_find gave, its numbers set and in no list yet;
 * its index, or KEY_NONE with a MemoryError and the table as it was. */
static Py_ssize_t
key_table_add(KeyTable *table, PyObject *key, Py_hash_t hash, size_t slot, long long time,
              long long count)
{
    if ((size_t)(2 * (table->count + 1)) > table->mask + 1) {
        if (key_grow_slots(table) < 0)
            return KEY_NONE;
        slot = key_empty_slot(table, hash);
    }
    Py_ssize_t index = key_take_entry(table);
    if (index == KEY_NONE)
        return KEY_NONE;
    table->entries[index] = (KeyEntry){.key = Py_NewRef(key), .hash = hash, .time = time,
                                       .count = count, .toward = {KEY_NONE, KEY_NONE}};
    table->slots[slot] = index;
    table->count++;
    key_table_changes++;
    return index;
}

static void
key_list_unlink(KeyTable *table, KeyList *list, Py_ssize_t index)
{
    const Py_ssize_t *toward = table->entries[index].toward;
    for (int side = NEWEST; side <= OLDEST; side++) {
        Py_ssize_t neighbour = toward[side];
        if (neighbour == KEY_NONE)
            list->end[side] = toward[!side];
        else
            table->entries[neighbour].toward[!side] = toward[!side];
    }
    list->length--;
}

/* Link the entry (in no list) in at the list's end (NEWEST or OLDEST). */
static void
key_list_push(KeyTable *table, KeyList *list, Py_ssize_t index, int end)
{
    KeyEntry *entry = &table->entries[index];
    entry->toward[end] = KEY_NONE;
    entry->toward[!end] = list->end[end];
    if (list->end[end] == KEY_NONE)
        list->end[!end] = index;
    else
        table->entries[list->end[end]].toward[end] = index;
    list->end[end] = index;
    list->length++;
}

/* Drop the entry (already out of its list) from the table; the key's reference, for the
 * caller to release once its own state is whole again: a key's finalizer may run Python code. */
static PyObject *
key_table_remove(KeyTable *table, Py_ssize_t index)
{
    KeyEntry *entry = &table->entries[index];
    size_t mask = table->mask;
    size_t hole = key_home(table, entry->hash);
    while (table->slots[hole] != index)
        hole = (hole + 1) & mask;
    for (size_t next = (hole + 1) & mask; table->slots[next] != KEY_NONE;
         next = (next + 1) & mask) {
        size_t home = key_home(table, table->entries[table->slots[next]].hash);
        /* The entry at next may move back to the hole unless its home lies after the hole
         * (cyclically, in (hole, next]). */
        int stays = hole <= next ? (hole < home && home <= next) : (hole < home || home <= next);
        if (!stays) {
            table->slots[hole] = table->slots[next];
            hole = next;
        }
    }
    table->slots[hole] = KEY_NONE;
    PyObject *key = entry->key;
    entry->key = NULL;
    entry->toward[NEWEST] = table->free;
    table->free = index;
    table->count--;
    key_table_changes++;
    return key;
}

/* Forget every key, keeping the slots. The entries leave the table before their keys are
 * released: a key's finalizer may run Python code, which then finds an empty table, not a
 * half-cleared one. The caller empties its lists first. */
static void
key_table_empty(KeyTable *table)
{
    KeyEntry *entries = table->entries;
    Py_ssize_t high = table->high;
    table->entries = NULL;
    table->allocated = table->high = table->count = 0;
    table->free = KEY_NONE;
    for (size_t i = 0; table->slots != NULL && i <= table->mask; i++)
        table->slots[i] = KEY_NONE;
    key_table_changes++;
    for (Py_ssize_t i = 0; i < high; i++)
        Py_XDECREF(entries[i].key);
    PyMem_Free(entries);
}

static int
key_table_traverse(const KeyTable *table, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < table->high; i++)
        Py_VISIT(table->entries[i].key);
    return 0;
}

/* Release everything, slots included (dealloc). */
static void
key_table_free(KeyTable *table)
{
    key_table_empty(table);
    PyMem_Free(table->slots);
    table->slots = NULL;
}

#endif
