/* The worker's hold of the sample in C: SampleRecorder(sample, max_bytes, max_requests,
 * max_request_blocks, period_s)(hashes).
 *
 * offload/wire/sample_recorder.py states the contract (what is held, what is
 * shed, when a frame is due) and holds its Python form; this is the same
 * contract in one C call per request, since the scheduler's thread pays it
 * on every request. Tests hold both forms to the same sequences.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <time.h>
#include "structmember.h"

#define INT_HASH_BYTES 9 /* the most bytes msgpack spends on an int hash */

typedef struct {
    PyObject_HEAD
    PyObject *sample;  /* the test: hashes -> a new list of the sampled ones */
    PyObject *sampled; /* the held requests' sampled hashes, a list of lists */
    Py_ssize_t *refs;  /* their block counts: max_requests slots, len(sampled) used */
    Py_ssize_t max_bytes, max_requests, max_request_blocks;
    double period_s;
    double next; /* the monotonic time the period ends */
    Py_ssize_t bytes;
    long long shed_requests, shed_block_refs;
    long long unsampled_requests, unsampled_block_refs;
    vectorcallfunc vectorcall;
} Recorder;

/* The clock Python's time.monotonic() reads on Linux, in seconds. Where the system has it,
 * its coarse form: a frame's period is tens of milliseconds, and the coarse clock (a tick
 * behind at most) costs half the fine one, on a call the worker makes every step. */
#ifdef CLOCK_MONOTONIC_COARSE
#define RECORDER_CLOCK CLOCK_MONOTONIC_COARSE
#else
#define RECORDER_CLOCK CLOCK_MONOTONIC
#endif

static double
monotonic_s(void)
{
    struct timespec now;
    clock_gettime(RECORDER_CLOCK, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

static int
recorder_ready(const Recorder *self)
{
    if (self->sampled != NULL)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "SampleRecorder.__init__ was not called");
    return -1;
}

static Py_ssize_t
mixed(PyObject *odd, PyObject *first)
{
    PyErr_Format(PyExc_TypeError,
                 "a request's sampled hashes must be all ints or all bytes: found %.100s in a "
                 "request of %.100s",
                 Py_TYPE(odd)->tp_name, Py_TYPE(first)->tp_name);
    return -1;
}

/* What the sampled hashes take in a frame: ints by count, bytes by their sizes (msgpack:
 * size + 2); -1 with a TypeError naming another type, or a mix (a frame may carry neither).
 * *atomic says every hash is an exact int, bytes or bytearray: objects that refer to nothing. */
static Py_ssize_t
priced(PyObject *sampled, int *atomic)
{
    Py_ssize_t n = PyList_GET_SIZE(sampled);
    PyObject **items = PySequence_Fast_ITEMS(sampled);
    if (PyLong_CheckExact(items[0])) {
        for (Py_ssize_t i = 1; i < n; i++)
            if (!PyLong_CheckExact(items[i]))
                return mixed(items[i], items[0]);
        *atomic = 1;
        return INT_HASH_BYTES * n;
    }
    Py_ssize_t size = 0;
    *atomic = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyBytes_Check(items[i])) {
            size += PyBytes_GET_SIZE(items[i]) + 2;
            *atomic &= PyBytes_CheckExact(items[i]);
        } else if (PyByteArray_Check(items[i])) {
            size += PyByteArray_GET_SIZE(items[i]) + 2;
            *atomic &= PyByteArray_CheckExact(items[i]);
        } else {
            return mixed(items[i], items[0]);
        }
    }
    return size;
}

/* recorder(hashes): one request's references to the tier, in prompt order. */
static PyObject *
Recorder_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Recorder *self = (Recorder *)callable;
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "a sample recorder takes one sequence of block hashes");
        return NULL;
    }
    if (recorder_ready(self) < 0)
        return NULL;
    PyObject *sampled = PyObject_Vectorcall(self->sample, args, 1, NULL);
    if (sampled == NULL)
        return NULL;
    if (!PyList_CheckExact(sampled)) {
        PyErr_Format(PyExc_TypeError, "the sample test returned a %.100s, not a list",
                     Py_TYPE(sampled)->tp_name);
        goto fail;
    }
    Py_ssize_t refs = PyObject_Size(args[0]);
    if (refs < 0)
        goto fail;
    if (PyList_GET_SIZE(sampled) == 0) {
        if (refs) {
            self->unsampled_requests++;
            self->unsampled_block_refs += refs;
        }
        Py_DECREF(sampled);
        Py_RETURN_NONE;
    }
    int atomic;
    Py_ssize_t size = priced(sampled, &atomic);
    if (size < 0)
        goto fail;
    Py_ssize_t held = PyList_GET_SIZE(self->sampled);
    if (refs > self->max_request_blocks || size > self->max_bytes - self->bytes ||
        held >= self->max_requests) {
        self->shed_requests++;
        self->shed_block_refs += refs;
        Py_DECREF(sampled);
        Py_RETURN_NONE;
    }
    if (PyList_Append(self->sampled, sampled) < 0)
        goto fail;
    /* The test's new list of hashes that refer to nothing can be in no reference cycle: the
     * collector need not walk it again at each of its passes while the frame waits. */
    if (atomic)
        PyObject_GC_UnTrack(sampled);
    Py_DECREF(sampled);
    self->refs[held] = refs;
    self->bytes += size;
    Py_RETURN_NONE;
fail:
    Py_DECREF(sampled);
    return NULL;
}

static PyObject *
Recorder_due(Recorder *self, PyObject *Py_UNUSED(ignored))
{
    if (recorder_ready(self) < 0)
        return NULL;
    Py_ssize_t held = PyList_GET_SIZE(self->sampled);
    return PyBool_FromLong(monotonic_s() >= self->next || 2 * self->bytes >= self->max_bytes ||
                           2 * held >= self->max_requests);
}

static PyObject *
Recorder_drain(Recorder *self, PyObject *Py_UNUSED(ignored))
{
    if (recorder_ready(self) < 0)
        return NULL;
    Py_ssize_t held = PyList_GET_SIZE(self->sampled);
    PyObject *fresh = PyList_New(0);
    PyObject *refs = PyList_New(held);
    if (fresh == NULL || refs == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < held; i++) {
        PyObject *count = PyLong_FromSsize_t(self->refs[i]);
        if (count == NULL)
            goto fail;
        PyList_SET_ITEM(refs, i, count);
    }
    PyObject *out = Py_BuildValue("(NOLL)", refs, self->sampled, self->unsampled_requests,
                                  self->unsampled_block_refs);
    if (out == NULL) {
        refs = NULL; /* N: Py_BuildValue took it, even on failure */
        goto fail;
    }
    Py_SETREF(self->sampled, fresh);
    self->unsampled_requests = self->unsampled_block_refs = 0;
    self->bytes = 0;
    self->next = monotonic_s() + self->period_s;
    return out;
fail:
    Py_XDECREF(fresh);
    Py_XDECREF(refs);
    return NULL;
}

static int
Recorder_init(Recorder *self, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"sample", "max_bytes", "max_requests", "max_request_blocks",
                               "period_s", NULL};
    PyObject *sample;
    Py_ssize_t max_bytes, max_requests, max_request_blocks;
    double period_s;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Onnnd:SampleRecorder", keywords, &sample,
                                     &max_bytes, &max_requests, &max_request_blocks, &period_s))
        return -1;
    const char *names[] = {"max_bytes", "max_requests", "max_request_blocks"};
    const Py_ssize_t limits[] = {max_bytes, max_requests, max_request_blocks};
    for (int i = 0; i < 3; i++)
        if (limits[i] < 1) {
            PyErr_Format(PyExc_ValueError, "%s must be an int of at least 1, got %zd", names[i],
                         limits[i]);
            return -1;
        }
    if (!(isfinite(period_s) && period_s > 0)) {
        char *shown = PyOS_double_to_string(period_s, 'r', 0, 0, NULL);
        if (shown != NULL) {
            PyErr_Format(PyExc_ValueError,
                         "period_s must be a positive number of seconds, got %s", shown);
            PyMem_Free(shown);
        }
        return -1;
    }
    if (!PyCallable_Check(sample)) {
        PyErr_SetString(PyExc_TypeError, "sample must be callable");
        return -1;
    }
    if ((size_t)max_requests > PY_SSIZE_T_MAX / sizeof(Py_ssize_t)) {
        PyErr_NoMemory();
        return -1;
    }
    /* Every allocation first: a failure leaves the object as it was. */
    Py_ssize_t *counts = PyMem_Malloc((size_t)max_requests * sizeof(Py_ssize_t));
    PyObject *held = PyList_New(0);
    if (counts == NULL || held == NULL) {
        PyMem_Free(counts);
        Py_XDECREF(held);
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(self->refs);
    self->refs = counts;
    Py_XSETREF(self->sampled, held);
    Py_XSETREF(self->sample, Py_NewRef(sample));
    self->max_bytes = max_bytes;
    self->max_requests = max_requests;
    self->max_request_blocks = max_request_blocks;
    self->period_s = period_s;
    self->bytes = 0;
    self->shed_requests = self->shed_block_refs = 0;
    self->unsampled_requests = self->unsampled_block_refs = 0;
    self->next = monotonic_s() + period_s;
    self->vectorcall = Recorder_vectorcall;
    return 0;
}

static int
Recorder_traverse(Recorder *self, visitproc visit, void *arg)
{
    Py_VISIT(self->sample);
    Py_VISIT(self->sampled);
    return 0;
}

static int
Recorder_clear_refs(Recorder *self)
{
    Py_CLEAR(self->sample);
    Py_CLEAR(self->sampled);
    return 0;
}

static void
Recorder_dealloc(Recorder *self)
{
    PyObject_GC_UnTrack(self);
    Recorder_clear_refs(self);
    PyMem_Free(self->refs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Recorder_methods[] = {
    {"due", (PyCFunction)Recorder_due, METH_NOARGS,
     "A frame is due: its period passed, or the hold is half full."},
    {"drain", (PyCFunction)Recorder_drain, METH_NOARGS,
     "Everything held (block counts, sampled hashes, unsampled requests and block refs), and "
     "start over (the period too)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Recorder_members[] = {
    {"sample", T_OBJECT_EX, offsetof(Recorder, sample), READONLY, "The sampler's test."},
    {"max_bytes", T_PYSSIZET, offsetof(Recorder, max_bytes), READONLY, NULL},
    {"max_requests", T_PYSSIZET, offsetof(Recorder, max_requests), READONLY, NULL},
    {"max_request_blocks", T_PYSSIZET, offsetof(Recorder, max_request_blocks), READONLY, NULL},
    {"period_s", T_DOUBLE, offsetof(Recorder, period_s), READONLY, NULL},
    {"bytes", T_PYSSIZET, offsetof(Recorder, bytes), READONLY, "Bytes of hashes held."},
    {"shed_requests", T_LONGLONG, offsetof(Recorder, shed_requests), READONLY,
     "Requests shed whole since the start."},
    {"shed_block_refs", T_LONGLONG, offsetof(Recorder, shed_block_refs), READONLY,
     "Their block references."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "offload.wire._sample_recorder.SampleRecorder",
    .tp_doc = "SampleRecorder(sample, max_bytes, max_requests, max_request_blocks, "
              "period_s)(hashes): the worker's hold of the sample, in C.",
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Recorder_init,
    .tp_dealloc = (destructor)Recorder_dealloc,
    .tp_traverse = (traverseproc)Recorder_traverse,
    .tp_clear = (inquiry)Recorder_clear_refs,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Recorder, vectorcall),
    .tp_methods = Recorder_methods,
    .tp_members = Recorder_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sample_recorder", "The worker's hold of the sample, in C.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__sample_recorder(void)
{
    if (PyType_Ready(&RecorderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RecorderType);
    if (PyModule_AddObject(m, "SampleRecorder", (PyObject *)&RecorderType) < 0) {
        Py_DECREF(&RecorderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
