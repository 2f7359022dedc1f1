/* The spatial sample's test in C: SampleTest(multiplier, threshold, prime)(hashes).
 *
 * offload/insight/sampling.py states the test (a hash's int times the
 * multiplier, modulo the prime, below the threshold) and holds its Python
 * form; this is the same test without the interpreter's cost per hash, which
 * the worker pays on every block reference, and called straight from Python
 * (vectorcall: no argument parsing per request). The results are the same
 * hashes in the same order (tests/offload/test_insight_sampling.py holds both
 * forms to each other).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include "structmember.h"
#include "sample_select.h"
#include "small_int.h"

/* x modulo prime without a divide: Barrett reduction by inverse = floor(2**64 / prime). The
 * estimate of the quotient is low by at most 2, so two conditional subtractions finish it. */
static inline uint64_t
reduce(uint64_t x, uint64_t prime, uint64_t inverse)
{
    uint64_t r = x - (uint64_t)(((unsigned __int128)x * inverse) >> 64) * prime;
    r = r >= prime ? r - prime : r;
    return r >= prime ? r - prime : r;
}

/* An int hash's residue modulo prime; a small int is read without a call (a trace's ids), ints
 * beyond 64 bits take Python's arithmetic. */
static inline int
int_residue(PyObject *hash, uint64_t prime, uint64_t inverse, uint64_t *residue)
{
    int overflow = 0;
    int64_t value;
    if (!small_int(hash, &value)) {
        value = PyLong_AsLongLongAndOverflow(hash, &overflow);
        if (!overflow && value == -1 && PyErr_Occurred())
            return -1;
    }
    if (!overflow) {
        if (value >= 0) { /* a trace's ids are mostly below the prime already */
            *residue = (uint64_t)value < prime ? (uint64_t)value : reduce(value, prime, inverse);
        } else { /* Python's modulo is floored: -v mod p is p - (v mod p), or 0 */
            uint64_t r = reduce(0 - (uint64_t)value, prime, inverse);
            *residue = r ? prime - r : 0;
        }
        return 0;
    }
    PyObject *modulus = PyLong_FromUnsignedLongLong(prime);
    if (modulus == NULL)
        return -1;
    PyObject *r = PyNumber_Remainder(hash, modulus); /* floor modulo: in [0, prime) */
    Py_DECREF(modulus);
    if (r == NULL)
        return -1;
    *residue = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    return PyErr_Occurred() ? -1 : 0;
}

/* A bytes hash stands as the little-endian int of its first 8 bytes (fewer when shorter). */
static uint64_t
bytes_residue(const unsigned char *data, Py_ssize_t size, uint64_t prime, uint64_t inverse)
{
    uint64_t value = 0;
    Py_ssize_t n = size < 8 ? size : 8;
    for (Py_ssize_t i = 0; i < n; i++)
        value |= (uint64_t)data[i] << (8 * i);
    return reduce(value, prime, inverse);
}

static inline int
residue_of(PyObject *hash, uint64_t prime, uint64_t inverse, uint64_t *residue)
{
    if (PyLong_CheckExact(hash))
        return int_residue(hash, prime, inverse, residue);
    if (PyBytes_Check(hash)) {
        *residue = bytes_residue(
            (const unsigned char *)PyBytes_AS_STRING(hash), PyBytes_GET_SIZE(hash), prime, inverse);
        return 0;
    }
    if (PyByteArray_Check(hash)) {
        *residue = bytes_residue(
            (const unsigned char *)PyByteArray_AS_STRING(hash), PyByteArray_GET_SIZE(hash), prime, inverse);
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "cannot sample a block hash of type %.100s",
                 Py_TYPE(hash)->tp_name);
    return -1;
}

typedef struct {
    PyObject_HEAD
    uint64_t multiplier, threshold, prime, inverse;
    vectorcallfunc vectorcall;
} SampleTest;

/* The hashes from items[start] on that pass, after the count already kept: any hash type. */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static Py_ssize_t
select_any(const SampleTest *self, PyObject *const *items, Py_ssize_t start, Py_ssize_t n,
           PyObject **kept, Py_ssize_t count)
{
    const uint64_t prime = self->prime, inverse = self->inverse;
    for (Py_ssize_t i = start; i < n; i++) {
        uint64_t residue;
        if (residue_of(items[i], prime, inverse, &residue) < 0)
            return -1;
        /* residue and multiplier are below 2**32: the product fits in 64 bits */
        if (reduce(residue * self->multiplier, prime, inverse) < self->threshold)
            kept[count++] = items[i];
    }
    return count;
}

/* The hashes that pass, in order, into kept (sample_select.h). A trace's ids, small ints below
 * the prime, are their own residues: this loop takes only those, and hands the rest of the
 * request to select_any at the first other hash, so it calls nothing and keeps its constants
 * in registers. */
static Py_ssize_t
SampleTest_select(PyObject *callable, PyObject *const *items, Py_ssize_t n, PyObject **kept)
{
    const SampleTest *self = (const SampleTest *)callable;
    if (self->prime == 0) {
        PyErr_SetString(PyExc_RuntimeError, "SampleTest.__init__ was not called");
        return -1;
    }
    const uint64_t prime = self->prime, inverse = self->inverse;
    const uint64_t multiplier = self->multiplier, threshold = self->threshold;
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t value;
        if (!small_int(items[i], &value) || value < 0 || (uint64_t)value >= prime)
            return select_any(self, items, i, n, kept, count);
        if (reduce((uint64_t)value * multiplier, prime, inverse) < threshold)
            kept[count++] = items[i];
    }
    return count;
}

/* test(hashes): the hashes that pass, in order (a new list). */
static PyObject *
SampleTest_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "a sample test takes one sequence of block hashes");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(args[0], "block hashes must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *on_stack[SELECT_ON_STACK];
    PyObject **kept = select_room(on_stack, n);
    PyObject *out = NULL;
    if (kept != NULL) {
        Py_ssize_t count = SampleTest_select(callable, items, n, kept);
        if (count >= 0 && (out = PyList_New(count)) != NULL)
            for (Py_ssize_t j = 0; j < count; j++)
                PyList_SET_ITEM(out, j, Py_NewRef(kept[j]));
        select_room_free(kept, on_stack);
    }
    Py_DECREF(seq);
    return out;
}

static int
SampleTest_init(SampleTest *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"multiplier", "threshold", "prime", NULL};
    unsigned long long multiplier, threshold, prime;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "KKK:SampleTest", keywords, &multiplier,
                                     &threshold, &prime))
        return -1;
    if (prime < 3 || prime >= (1ULL << 32) || !(prime & 1) || multiplier >= prime ||
        threshold > prime) {
        PyErr_SetString(PyExc_ValueError,
                        "SampleTest needs multiplier < prime, threshold <= prime and an odd "
                        "prime < 2**32");
        return -1;
    }
    self->multiplier = multiplier;
    self->threshold = threshold;
    self->prime = prime;
    self->inverse = UINT64_MAX / prime; /* floor(2**64 / prime): prime is no power of two */
    self->vectorcall = SampleTest_vectorcall;
    return 0;
}

static PyMemberDef SampleTest_members[] = {
    {"multiplier", T_ULONGLONG, offsetof(SampleTest, multiplier), READONLY, NULL},
    {"threshold", T_ULONGLONG, offsetof(SampleTest, threshold), READONLY, NULL},
    {"prime", T_ULONGLONG, offsetof(SampleTest, prime), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SampleTestType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "offload.insight._sample_test.SampleTest",
    .tp_doc = "SampleTest(multiplier, threshold, prime)(hashes) -> the hashes whose int times "
              "multiplier, modulo prime, is below threshold, in order.",
    .tp_basicsize = sizeof(SampleTest),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)SampleTest_init,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(SampleTest, vectorcall),
    .tp_members = SampleTest_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sample_test", "The spatial sample's test, in C.", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__sample_test(void)
{
    if (PyType_Ready(&SampleTestType) < 0)
        return NULL;
    /* The selection for C callers, on the type: every test offers it (sample_select.h). */
    PyObject *select = PyCapsule_New((void *)SampleTest_select, SAMPLE_SELECT_CAPSULE, NULL);
    if (select == NULL)
        return NULL;
    int added = PyCapsule_SetContext(select, &SampleTestType) < 0
                    ? -1
                    : PyDict_SetItemString(SampleTestType.tp_dict, SAMPLE_SELECT_ATTRIBUTE, select);
    Py_DECREF(select);
    if (added < 0)
        return NULL;
    PyType_Modified(&SampleTestType);
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SampleTestType);
    if (PyModule_AddObject(m, "SampleTest", (PyObject *)&SampleTestType) < 0) {
        Py_DECREF(&SampleTestType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
