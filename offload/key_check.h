/* Self-checks of a key table's lists, for the C forms' invariant_violations().
 *
 * An entry in no list is never forgotten or evicted (its memory held for good); one reached
 * twice, or a list whose count differs from its links, is ranked wrongly. The walk gathers its
 * findings without running Python code: a key's repr could call back into the table's owner
 * and change the lists under the walk. Each finding holds its key until it is worded, after
 * the walk, as "block <repr> <text>" (or the text alone when it names no block).
 */
#ifndef KVSCOPE_KEY_CHECK_H
#define KVSCOPE_KEY_CHECK_H

#include <Python.h>
#include <stdarg.h>
#include "key_table.h"

#define KEY_CHECK_TEXT 120 /* the longest text a finding words, its block's repr apart */
#define KEY_CHECK_LISTS 2  /* lists one check walks, at most */

typedef struct {
    PyObject *key; /* the block it names, held; NULL: none */
    char text[KEY_CHECK_TEXT];
} KeyFinding;

typedef struct {
    KeyFinding *found;
    Py_ssize_t count, allocated;
    unsigned char *marks; /* per entry below high: the number of the list that reached it */
    const char *walked[KEY_CHECK_LISTS]; /* the names of the lists walked, list 1 first */
    int lists;                           /* lists walked */
    int failed;                          /* out of memory: a MemoryError is set */
} KeyCheck;

/* A check of table's entries; -1 with a MemoryError. */
static int
key_check_start(KeyCheck *check, const KeyTable *table)
{
    *check = (KeyCheck){0};
    check->marks = PyMem_Calloc(table->high ? (size_t)table->high : 1, 1);
    if (check->marks == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Note a finding about key (NULL: none), worded by format from the arguments. */
static void
key_check_note(KeyCheck *check, PyObject *key, const char *format, ...)
{
    if (check->failed)
        return;
    if (check->count == check->allocated) {
        Py_ssize_t grown = check->allocated ? 2 * check->allocated : 8;
        KeyFinding *found = PyMem_Realloc(check->found, (size_t)grown * sizeof(KeyFinding));
        if (found == NULL) {
            check->failed = 1;
            PyErr_NoMemory();
            return;
        }
        check->found = found;
        check->allocated = grown;
    }
    KeyFinding *finding = &check->found[check->count++];
    finding->key = Py_XNewRef(key);
    va_list args;
    va_start(args, format);
    PyOS_vsnprintf(finding->text, KEY_CHECK_TEXT, format, args);
    va_end(args);
}

/* Walk list (name, one of KEY_CHECK_LISTS a check walks), oldest to newest: note an entry it
 * links to that holds no block, one reached before (by this list: a cycle, where the walk stops), one
 * linked back to another than the entry before it, one whose count is not tag (tag < 0: the
 * count is no list's tag), and a length that differs from the walk. */
static void
key_check_list(KeyCheck *check, const KeyTable *table, const KeyList *list, const char *name,
               long long tag)
{
    if (check->lists == KEY_CHECK_LISTS)
        Py_FatalError("key_check_list: more lists than KEY_CHECK_LISTS");
    check->walked[check->lists++] = name;
    unsigned char number = (unsigned char)check->lists;
    Py_ssize_t walked = 0, before = KEY_NONE;
    for (Py_ssize_t index = list->end[OLDEST]; index != KEY_NONE;) {
        if (index < 0 || index >= table->high || table->entries[index].key == NULL) {
            key_check_note(check, NULL, "%s links to entry %zd, which holds no block", name,
                           index);
            break;
        }
        const KeyEntry *entry = &table->entries[index];
        unsigned char mark = check->marks[index];
        if (mark == number) {
            key_check_note(check, entry->key, "is in %s twice (its links loop)", name);
            break;
        }
        if (mark != 0)
            key_check_note(check, entry->key, "is in both %s and %s", check->walked[mark - 1], name);
        check->marks[index] = number;
        if (entry->toward[OLDEST] != before)
            key_check_note(check, entry->key, "is linked back to the wrong block in %s", name);
        if (tag >= 0 && entry->count != tag)
            key_check_note(check, entry->key, "is in %s but marked as in another list", name);
        walked++;
        before = index;
        index = entry->toward[NEWEST];
    }
    if (walked != list->length)
        key_check_note(check, NULL, "%s counts %zd blocks but links %zd", name, list->length,
                       walked);
}

/* Note each held entry no list reached (lists: the lists' names), a count that differs from
 * the held entries, and slots that find another number of blocks than are held. */
static void
key_check_unlisted(KeyCheck *check, const KeyTable *table, const char *lists)
{
    Py_ssize_t held = 0, found = 0;
    for (Py_ssize_t index = 0; index < table->high; index++) {
        if (table->entries[index].key == NULL)
            continue;
        held++;
        if (check->marks[index] == 0)
            key_check_note(check, table->entries[index].key, "is held but in none of %s", lists);
    }
    if (held != table->count)
        key_check_note(check, NULL, "the table counts %zd blocks but holds %zd", table->count,
                       held);
    for (size_t i = 0; i <= table->mask; i++)
        found += table->slots[i] != KEY_NONE;
    if (found != held)
        key_check_note(check, NULL, "the table's slots find %zd blocks but it holds %zd", found,
                       held);
}

/* The findings worded, a new list of str, the check's memory released either way; NULL with
 * an exception. */
static PyObject *
key_check_finish(KeyCheck *check)
{
    PyObject *problems = check->failed ? NULL : PyList_New(check->count);
    for (Py_ssize_t i = 0; i < check->count; i++) {
        KeyFinding *finding = &check->found[i];
        if (problems != NULL) {
            PyObject *text =
                finding->key == NULL
                    ? PyUnicode_FromString(finding->text)
                    : PyUnicode_FromFormat("block %.80R %s", finding->key, finding->text);
            if (text == NULL)
                Py_CLEAR(problems);
            else
                PyList_SET_ITEM(problems, i, text);
        }
        Py_XDECREF(finding->key);
    }
    PyMem_Free(check->found);
    PyMem_Free(check->marks);
    *check = (KeyCheck){0};
    return problems;
}

#endif
