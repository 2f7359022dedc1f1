"""The C forms' state as ctypes structures, for tests that corrupt it to prove a self-check.

The layouts mirror offload/key_table.h, _miniature.c's Model and _offer_history.c's History;
``c_state`` refuses a layout whose size differs from the type's, so a changed struct fails
the test that uses it instead of corrupting memory it does not mean to.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from offload.cpu.policies.miniature_model import BaseMiniature
from offload.cpu.policies.offer_history import BaseOfferHistory
from tests.support.native import require_a_build_toolchain


class KeyEntry(ctypes.Structure):
    """key_table.h's KeyEntry."""

    _fields_ = [
        ("key", ctypes.c_void_p),
        ("hash", ctypes.c_ssize_t),
        ("time", ctypes.c_longlong),
        ("count", ctypes.c_longlong),
        ("toward", ctypes.c_ssize_t * 2),  # NEWEST, OLDEST
    ]


class KeyTable(ctypes.Structure):
    """key_table.h's KeyTable."""

    _fields_ = [
        ("entries", ctypes.POINTER(KeyEntry)),
        ("allocated", ctypes.c_ssize_t),
        ("high", ctypes.c_ssize_t),
        ("count", ctypes.c_ssize_t),
        ("slots", ctypes.c_void_p),
        ("mask", ctypes.c_size_t),
        ("shift", ctypes.c_int),
        ("free", ctypes.c_ssize_t),
    ]


class KeyList(ctypes.Structure):
    """key_table.h's KeyList."""

    _fields_ = [("end", ctypes.c_ssize_t * 2), ("length", ctypes.c_ssize_t)]


HEAD = [("refcnt", ctypes.c_ssize_t), ("type", ctypes.c_void_p)]
"""PyObject_HEAD, as a release build of CPython lays it out."""


class ModelLayout(ctypes.Structure):
    """_miniature.c's Model."""

    _fields_ = [
        *HEAD,
        ("table", KeyTable),
        ("probation", KeyList),
        ("protected", KeyList),
        ("offers", ctypes.c_void_p),
        ("slots", ctypes.c_ssize_t),
        ("protected_slots", ctypes.c_ssize_t),
        ("gated", ctypes.c_int),
        ("horizon", ctypes.c_double),
        ("admit_continuations", ctypes.c_int),
        ("clock", ctypes.c_longlong),
        ("hits", ctypes.c_double),
        ("turnovers", ctypes.c_longlong),
        ("evicted", ctypes.c_longlong),
        ("has_average", ctypes.c_int),
        ("has_age", ctypes.c_int),
        ("average", ctypes.c_double),
        ("age", ctypes.c_double),
        ("running", ctypes.c_int),
    ]


class HistoryLayout(ctypes.Structure):
    """_offer_history.c's History."""

    _fields_ = [
        *HEAD,
        ("table", KeyTable),
        ("recency", KeyList),
        ("limit", ctypes.c_ssize_t),
        ("proven", ctypes.c_longlong),
    ]


NEWEST, OLDEST = 0, 1
"""A list's ends, and an entry's sides (key_table.h)."""


LAYOUTS: tuple[tuple[type, type[ctypes.Structure]], ...] = (
    (BaseMiniature, ModelLayout),
    (BaseOfferHistory, HistoryLayout),
)


@contextmanager
def c_state(obj: object) -> Iterator[Any]:
    """The C object's struct, to corrupt in place; put back as it was afterwards (its
    entries too), so that freeing the object finds its own state."""
    require_a_build_toolchain()
    c_type, layout = next((c, layout) for c, layout in LAYOUTS if isinstance(obj, c))
    assert c_type.__basicsize__ == ctypes.sizeof(layout), "the layout here is stale"
    state = layout.from_address(id(obj))
    saved = bytes(state)
    entries = state.table.entries
    saved_entries = [bytes(entries[i]) for i in range(state.table.high)]
    try:
        yield state
    finally:
        ctypes.memmove(ctypes.addressof(state), saved, len(saved))
        for i, raw in enumerate(saved_entries):
            ctypes.memmove(ctypes.addressof(entries[i]), raw, len(raw))


def key_of(state: Any, index: int) -> object:
    """The block an entry holds."""
    return ctypes.cast(state.table.entries[index].key, ctypes.py_object).value


def unlink_oldest(state: Any, name: str) -> object:
    """Drop the oldest entry from the named list (of two or more), left in the table: the
    block it holds."""
    order = getattr(state, name)
    oldest = order.end[OLDEST]
    following = state.table.entries[oldest].toward[NEWEST]
    order.end[OLDEST] = following
    state.table.entries[following].toward[OLDEST] = -1
    order.length -= 1
    return key_of(state, oldest)
