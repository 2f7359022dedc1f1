/* An exact int's value read straight from the object, for the C forms on the hot paths.
 *
 * Block hashes are often small ints (trace ids), and a call through the C API for each one
 * (PyLong_AsLongLong, PyObject_Hash) costs more than the work done with it. A value that does
 * not fit (or a subclass, or another type) reports 0, and the caller takes the C API's path.
 */
#ifndef KVSCOPE_SMALL_INT_H
#define KVSCOPE_SMALL_INT_H

#include <Python.h>
#include <stdint.h>

static inline int
small_int(PyObject *object, int64_t *value)
{
    if (!PyLong_CheckExact(object))
        return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)object))
        return 0;
    *value = PyUnstable_Long_CompactValue((PyLongObject *)object);
    return 1;
#else
    const digit *digits = ((PyLongObject *)object)->ob_digit;
    switch (Py_SIZE(object)) { /* the digit count, negative for a negative int */
    case 0:
        *value = 0;
        return 1;
    case 1:
        *value = digits[0];
        return 1;
    case -1:
        *value = -(int64_t)digits[0];
        return 1;
    case 2:
        *value = (int64_t)digits[0] | (int64_t)digits[1] << PyLong_SHIFT;
        return 1;
    default:
        return 0;
    }
#endif
}

/* A non-negative int below 2**61 - 1 is its own Python hash value: 1 and the value, read without
 * a call (so no Python code runs); 0 for any other key. */
static inline int
own_hash(PyObject *key, Py_hash_t *hash)
{
    int64_t value;
    if (!small_int(key, &value) || value < 0 || value >= ((int64_t)1 << 61) - 1)
        return 0;
    *hash = (Py_hash_t)value;
    return 1;
}

/* A key's Python hash value; -1 with an exception for an unhashable key. A key that is not its
 * own hash takes PyObject_Hash, whose __hash__ may run Python code: the key is held through it,
 * since that code may drop the caller's reference. */
static inline Py_hash_t
hash_of(PyObject *key)
{
    Py_hash_t hash;
    if (own_hash(key, &hash))
        return hash;
    Py_INCREF(key);
    hash = PyObject_Hash(key);
    Py_DECREF(key);
    return hash;
}

#endif
