/* A sample test's C form, offered to C callers through a capsule.
 *
 * The worker's recorder (offload/wire/_sample_recorder.c) calls the sampler's test once per
 * request; called through Python, the test must build a list of the sampled hashes, which the
 * recorder reads once and drops. A test in C (offload/insight/_sample_test.c) therefore also
 * offers its selection as a C function, in a capsule under SAMPLE_SELECT_ATTRIBUTE whose
 * context is the test's type: the recorder, which knows no sampler's type, uses it when the
 * test it was given has one and is of that type, and calls the test otherwise. (The selection
 * reads its test's struct: run on an object of another type that copied the capsule, it would
 * read memory that object does not have.)
 */
#ifndef KVSCOPE_SAMPLE_SELECT_H
#define KVSCOPE_SAMPLE_SELECT_H

#include <Python.h>

#define SAMPLE_SELECT_ATTRIBUTE "_c_select"
#define SAMPLE_SELECT_CAPSULE "offload.sample_select"

/* The n hashes in items that the test (of the capsule's context's type) keeps, in order, into
 * kept (room for n; borrowed, as items are); their count, or -1 with an exception (a hash of a
 * type the test cannot read). */
typedef Py_ssize_t (*sample_select)(PyObject *test, PyObject *const *items, Py_ssize_t n,
                                    PyObject **kept);

#define SELECT_ON_STACK 64 /* a request of at most this many hashes needs no allocation */

/* Room for what a selection of n hashes may keep: on_stack (SELECT_ON_STACK slots) when they
 * fit, else the heap; NULL with a MemoryError. select_room_free gives it back. */
static inline PyObject **
select_room(PyObject **on_stack, Py_ssize_t n)
{
    if (n <= SELECT_ON_STACK)
        return on_stack;
    PyObject **room = PyMem_Malloc((size_t)n * sizeof(PyObject *));
    if (room == NULL)
        PyErr_NoMemory();
    return room;
}

static inline void
select_room_free(PyObject **room, PyObject **on_stack)
{
    if (room != on_stack)
        PyMem_Free(room);
}

#endif
