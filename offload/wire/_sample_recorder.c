/* The worker's hold of the sample in C: SampleRecorder(sample, max_bytes, max_requests,
 * max_request_blocks, period_s)(hashes).
 *
 * offload/wire/sample_recorder.py states the contract (what is held, what is
 * shed, when a frame is due) and holds its Python form; this is the same
 * contract in one C call per request, since the scheduler's thread pays it
 * on every request. Each held request is written as msgpack the moment it is
 * held, so the hold is one byte buffer and no Python object waits in it (no
 * collector work, no objects to build at the frame). Tests hold both forms,
 * byte for byte, to msgspec's own encoding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include "structmember.h"
#include "sample_select.h"
#include "small_int.h"

#define FIRST_ALLOCATION 4096 /* bytes the buffer starts at; it doubles up to max_bytes */

typedef struct {
    PyObject_HEAD
    PyObject *sample;     /* the test: hashes -> a new list of the sampled ones */
    sample_select select; /* its C selection, when it offers one; NULL: it is called */
    char *held;       /* the held requests' msgpack, back to back; NULL before __init__ */
    Py_ssize_t bytes, allocated, requests; /* its length, its capacity, the requests in it */
    Py_ssize_t max_bytes, max_requests, max_request_blocks;
    double period_s;
    double next; /* the monotonic time the period ends */
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
    if (self->held != NULL)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "SampleRecorder.__init__ was not called");
    return -1;
}

/* ---- msgpack, in the smallest form of each value (msgspec's, so the forms agree) ---------- */

/* An int hash as msgpack holds it: its value, and whether it is negative (then in *value as
 * int64's two's complement). -1 with an OverflowError beyond 64 bits. */
static int
int_bits(PyObject *hash, uint64_t *value, int *negative)
{
    int64_t small;
    if (small_int(hash, &small)) {
        *value = (uint64_t)small;
        *negative = small < 0;
        return 0;
    }
    int overflow;
    long long signed_value = PyLong_AsLongLongAndOverflow(hash, &overflow);
    if (!overflow) {
        if (signed_value == -1 && PyErr_Occurred())
            return -1;
        *value = (uint64_t)signed_value;
        *negative = signed_value < 0;
        return 0;
    }
    if (overflow > 0) {
        unsigned long long wide = PyLong_AsUnsignedLongLong(hash);
        if (!(wide == (unsigned long long)-1 && PyErr_Occurred())) {
            *value = wide;
            *negative = 0;
            return 0;
        }
        PyErr_Clear();
    }
    PyErr_SetString(PyExc_OverflowError,
                    "a block hash must be an int from -2**63 to 2**64 - 1 to be framed");
    return -1;
}

static Py_ssize_t
int_size(uint64_t value, int negative)
{
    if (negative) {
        int64_t v = (int64_t)value;
        return v >= -32 ? 1 : v >= INT8_MIN ? 2 : v >= INT16_MIN ? 3 : v >= INT32_MIN ? 5 : 9;
    }
    return value < 128 ? 1 : value <= UINT8_MAX ? 2 : value <= UINT16_MAX ? 3
         : value <= UINT32_MAX ? 5 : 9;
}

static char *
put_be(char *out, uint64_t value, int width)
{
    for (int i = width - 1; i >= 0; i--)
        *out++ = (char)(value >> (8 * i));
    return out;
}

static char *
put_int(char *out, uint64_t value, int negative)
{
    switch (int_size(value, negative)) {
    case 1:
        *out++ = (char)value; /* a positive or a negative fixint: the low byte is the value */
        return out;
    case 2:
        *out++ = (char)(negative ? 0xd0 : 0xcc);
        return put_be(out, value, 1);
    case 3:
        *out++ = (char)(negative ? 0xd1 : 0xcd);
        return put_be(out, value, 2);
    case 5:
        *out++ = (char)(negative ? 0xd2 : 0xce);
        return put_be(out, value, 4);
    default:
        *out++ = (char)(negative ? 0xd3 : 0xcf);
        return put_be(out, value, 8);
    }
}

static Py_ssize_t
header_size(Py_ssize_t length)
{
    return length < 16 ? 1 : length <= UINT16_MAX ? 3 : 5;
}

/* The header of an array (fixarray 0x90, array16 0xdc, array32 0xdd) or of bin data
 * (bin8 0xc4, bin16 0xc5, bin32 0xc6; bin has no fix form). */
static char *
put_header(char *out, Py_ssize_t length, int bin)
{
    if (bin && length <= UINT8_MAX) {
        *out++ = (char)0xc4;
        return put_be(out, (uint64_t)length, 1);
    }
    if (!bin && length < 16) {
        *out++ = (char)(0x90 | length);
        return out;
    }
    if (length <= UINT16_MAX) {
        *out++ = (char)(bin ? 0xc5 : 0xdc);
        return put_be(out, (uint64_t)length, 2);
    }
    *out++ = (char)(bin ? 0xc6 : 0xdd);
    return put_be(out, (uint64_t)length, 4);
}

static Py_ssize_t
bin_size(Py_ssize_t length)
{
    return (length <= UINT8_MAX ? 2 : length <= UINT16_MAX ? 3 : 5) + length;
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

/* The msgpack size of one held request, [block_refs, [hash, ...]]; -1 with a TypeError naming
 * a type a frame cannot carry (or a mix of ints and bytes), or an OverflowError. Every type is
 * checked before any value, as the Python form does: a mix is named as one even behind a value
 * too wide to frame. */
static Py_ssize_t
request_size(Py_ssize_t refs, PyObject *const *items, Py_ssize_t n)
{
    Py_ssize_t size = 1 + int_size((uint64_t)refs, 0) + header_size(n);
    int ints = PyLong_CheckExact(items[0]);
    for (Py_ssize_t i = 0; i < n; i++)
        if (ints ? !PyLong_CheckExact(items[i])
                 : !PyBytes_Check(items[i]) && !PyByteArray_Check(items[i]))
            return mixed(items[i], items[0]);
    uint64_t value;
    int negative;
    if (ints) {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (int_bits(items[i], &value, &negative) < 0)
                return -1;
            size += int_size(value, negative);
        }
        return size;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t length = PyBytes_Check(items[i]) ? PyBytes_GET_SIZE(items[i])
                                                    : PyByteArray_GET_SIZE(items[i]);
        if ((uint64_t)length > UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError,
                            "a block hash of 2**32 bytes or more cannot be framed");
            return -1;
        }
        size += bin_size(length);
    }
    return size;
}

/* Write a request request_size has passed: its checks hold, so nothing here fails. */
static char *
put_request(char *out, Py_ssize_t refs, PyObject *const *items, Py_ssize_t n)
{
    *out++ = (char)0x92;
    out = put_int(out, (uint64_t)refs, 0);
    out = put_header(out, n, 0);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *hash = items[i];
        if (PyLong_CheckExact(hash)) {
            uint64_t value;
            int negative;
            (void)int_bits(hash, &value, &negative);
            out = put_int(out, value, negative);
        } else {
            int is_bytes = PyBytes_Check(hash);
            Py_ssize_t length = is_bytes ? PyBytes_GET_SIZE(hash) : PyByteArray_GET_SIZE(hash);
            out = put_header(out, length, 1);
            memcpy(out, is_bytes ? PyBytes_AS_STRING(hash) : PyByteArray_AS_STRING(hash),
                   (size_t)length);
            out += length;
        }
    }
    return out;
}

/* Room for size more bytes (bytes + size <= max_bytes already); -1 with a MemoryError, the
 * buffer as it was. */
static int
make_room(Recorder *self, Py_ssize_t size)
{
    Py_ssize_t need = self->bytes + size;
    if (need <= self->allocated)
        return 0;
    Py_ssize_t grown = self->allocated > self->max_bytes / 2 ? self->max_bytes : 2 * self->allocated;
    if (grown < need)
        grown = need;
    char *moved = PyMem_Realloc(self->held, (size_t)grown);
    if (moved == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->held = moved;
    self->allocated = grown;
    return 0;
}

/* Hold one request of refs references whose n sampled hashes are sampled (or count it); NULL
 * with an exception for hashes a frame cannot carry (nothing held changes). */
static PyObject *
hold(Recorder *self, Py_ssize_t refs, PyObject *const *sampled, Py_ssize_t n)
{
    if (n == 0) {
        if (refs) {
            self->unsampled_requests++;
            self->unsampled_block_refs += refs;
        }
        Py_RETURN_NONE;
    }
    Py_ssize_t size = request_size(refs, sampled, n);
    if (size < 0)
        return NULL;
    if (refs > self->max_request_blocks || size > self->max_bytes - self->bytes ||
        self->requests >= self->max_requests) {
        self->shed_requests++;
        self->shed_block_refs += refs;
        Py_RETURN_NONE;
    }
    if (make_room(self, size) < 0)
        return NULL;
    put_request(self->held + self->bytes, refs, sampled, n);
    self->bytes += size;
    self->requests++;
    Py_RETURN_NONE;
}

/* The request through the test's C selection (sample_select.h): no list between the two. */
static PyObject *
record_selected(Recorder *self, PyObject *hashes)
{
    PyObject *seq = PySequence_Fast(hashes, "block hashes must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *on_stack[SELECT_ON_STACK];
    PyObject **kept = select_room(on_stack, n);
    PyObject *out = NULL;
    if (kept != NULL) {
        Py_ssize_t count = self->select(self->sample, PySequence_Fast_ITEMS(seq), n, kept);
        if (count >= 0)
            out = hold(self, n, kept, count);
        select_room_free(kept, on_stack);
    }
    Py_DECREF(seq);
    return out;
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
    if (self->select != NULL)
        return record_selected(self, args[0]);
    PyObject *sampled = PyObject_Vectorcall(self->sample, args, 1, NULL);
    if (sampled == NULL)
        return NULL;
    PyObject *out = NULL;
    if (!PyList_CheckExact(sampled)) {
        PyErr_Format(PyExc_TypeError, "the sample test returned a %.100s, not a list",
                     Py_TYPE(sampled)->tp_name);
    } else {
        Py_ssize_t refs = PyObject_Size(args[0]);
        if (refs >= 0)
            out = hold(self, refs, PySequence_Fast_ITEMS(sampled), PyList_GET_SIZE(sampled));
    }
    Py_DECREF(sampled);
    return out;
}

/* due(): METH_FASTCALL, whose bound form the interpreter calls directly (METH_NOARGS it does not,
 * in 3.11), since the worker asks once per step. */
static PyObject *
Recorder_due(Recorder *self, PyObject *const *Py_UNUSED(args), Py_ssize_t nargs)
{
    if (nargs != 0) {
        PyErr_SetString(PyExc_TypeError, "due() takes no arguments");
        return NULL;
    }
    if (recorder_ready(self) < 0)
        return NULL;
    return PyBool_FromLong(monotonic_s() >= self->next || 2 * self->bytes >= self->max_bytes ||
                           2 * self->requests >= self->max_requests);
}

static PyObject *
Recorder_drain(Recorder *self, PyObject *Py_UNUSED(ignored))
{
    if (recorder_ready(self) < 0)
        return NULL;
    Py_ssize_t header = header_size(self->requests);
    PyObject *requests = PyBytes_FromStringAndSize(NULL, header + self->bytes);
    if (requests == NULL)
        return NULL;
    char *out = put_header(PyBytes_AS_STRING(requests), self->requests, 0);
    memcpy(out, self->held, (size_t)self->bytes);
    PyObject *drained = Py_BuildValue("(NnLL)", requests, self->requests,
                                      self->unsampled_requests, self->unsampled_block_refs);
    if (drained == NULL)
        return NULL; /* N: Py_BuildValue released the bytes, even on failure */
    self->bytes = self->requests = 0;
    self->unsampled_requests = self->unsampled_block_refs = 0;
    self->next = monotonic_s() + self->period_s;
    return drained;
}

/* The test's C selection, when it offers one for its own type (sample_select.h); NULL
 * otherwise. */
static sample_select
offered_selection(PyObject *sample)
{
    PyObject *capsule = PyObject_GetAttrString(sample, SAMPLE_SELECT_ATTRIBUTE);
    if (capsule == NULL) {
        PyErr_Clear();
        return NULL;
    }
    sample_select select = PyCapsule_IsValid(capsule, SAMPLE_SELECT_CAPSULE) &&
                                   PyCapsule_GetContext(capsule) == (void *)Py_TYPE(sample)
                               ? (sample_select)PyCapsule_GetPointer(capsule, SAMPLE_SELECT_CAPSULE)
                               : NULL;
    Py_DECREF(capsule);
    return select;
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
    /* The allocation first: a failure leaves the object as it was. */
    Py_ssize_t first = max_bytes < FIRST_ALLOCATION ? max_bytes : FIRST_ALLOCATION;
    char *held = PyMem_Malloc((size_t)first);
    if (held == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(self->held);
    self->held = held;
    self->allocated = first;
    self->bytes = self->requests = 0;
    Py_XSETREF(self->sample, Py_NewRef(sample));
    self->select = offered_selection(sample);
    self->max_bytes = max_bytes;
    self->max_requests = max_requests;
    self->max_request_blocks = max_request_blocks;
    self->period_s = period_s;
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
    return 0;
}

static int
Recorder_clear_refs(Recorder *self)
{
    Py_CLEAR(self->sample);
    return 0;
}

static void
Recorder_dealloc(Recorder *self)
{
    PyObject_GC_UnTrack(self);
    Recorder_clear_refs(self);
    PyMem_Free(self->held);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Recorder_selects_in_c(Recorder *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->select != NULL);
}

static PyGetSetDef Recorder_getset[] = {
    {"selects_in_c", (getter)Recorder_selects_in_c, NULL,
     "The recorder runs its test's C selection, with no list between them.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Recorder_methods[] = {
    {"due", (PyCFunction)(void (*)(void))Recorder_due, METH_FASTCALL,
     "A frame is due: its period passed, or the hold is half full."},
    {"drain", (PyCFunction)Recorder_drain, METH_NOARGS,
     "Everything held (the held requests as one msgpack array, their count, the unsampled "
     "requests and block refs), and start over (the period too)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Recorder_members[] = {
    {"sample", T_OBJECT_EX, offsetof(Recorder, sample), READONLY, "The sampler's test."},
    {"max_bytes", T_PYSSIZET, offsetof(Recorder, max_bytes), READONLY, NULL},
    {"max_requests", T_PYSSIZET, offsetof(Recorder, max_requests), READONLY, NULL},
    {"max_request_blocks", T_PYSSIZET, offsetof(Recorder, max_request_blocks), READONLY, NULL},
    {"period_s", T_DOUBLE, offsetof(Recorder, period_s), READONLY, NULL},
    {"bytes", T_PYSSIZET, offsetof(Recorder, bytes), READONLY, "Bytes of msgpack held."},
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
    .tp_getset = Recorder_getset,
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
