/* A sample test's C form, offered to C callers through a capsule.
 *
 * The worker's recorder (offload/wire/_sample_recorder.c) calls the sampler's test once per
 * request; called through Python, the test must build a list of the sampled hashes, which the
 * recorder reads once and drops. A test in C (offload/insight/_sample_test.c) therefore also
 * offers its selection as a C function, in a capsule under SAMPLE_SELECT_ATTRIBUTE: the
 * recorder, which knows no sampler's type, uses it when the test it was given has one, and
 * calls the test otherwise.
 */
#ifndef KVSCOPE_SAMPLE_SELECT_H
#define KVSCOPE_SAMPLE_SELECT_H

#include <Python.h>

#define SAMPLE_SELECT_ATTRIBUTE "_c_select"
#define SAMPLE_SELECT_CAPSULE "offload.sample_select"

/* The n hashes in items that the test keeps, in order, into kept (room for n; borrowed, as
 * items are); their count, or -1 with an exception (a hash of a type the test cannot read). */
typedef Py_ssize_t (*sample_select)(PyObject *test, PyObject *const *items, Py_ssize_t n,
                                    PyObject **kept);

#endif
