"""The memory a CPU tier may take here: the host's, or a container's limit when lower.

A tier above the host's memory is refused at start-up; in a container
(Kubernetes, podman) the cgroup's memory limit is the real bound, and a tier
above it passed that check only for the worker to be killed for memory
during its zero-fill at start-up, naming no key. The limit is read from the
cgroup files a container sees at its cgroup root; what cannot be read or
understood is taken as no limit known, so an odd file never stops an engine
that would fit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from offload.decimal_text import whole_number

CGROUP_ROOT: Final = Path("/sys/fs/cgroup")
V1_UNLIMITED_FROM: Final = 2**62
"""cgroup v1 writes "no limit" as the largest page-aligned 63-bit number
(9223372036854771712 with 4 KiB pages); any value this large (4 EiB) is taken as that."""
_READ_AT_MOST: Final = 64
"""Bytes read of a limit file: a limit is at most 20 digits; more is not a limit."""


@dataclass(frozen=True, slots=True)
class MemoryBound:
    """The lowest memory bound known here, and what it is, for an error to name."""

    num_bytes: int
    what: str
    """"this host's memory" or "the container's memory limit"."""


def memory_bound(cgroup_root: Path = CGROUP_ROOT) -> MemoryBound | None:
    """The host's memory or the container's limit under ``cgroup_root``, whichever is
    lower; None when neither is known."""
    bounds = []
    host = _physical_memory()
    if host is not None:
        bounds.append(MemoryBound(host, "this host's memory"))
    limit = cgroup_memory_limit(cgroup_root)
    if limit is not None:
        bounds.append(MemoryBound(limit, "the container's memory limit"))
    return min(bounds, key=lambda bound: bound.num_bytes, default=None)


def cgroup_memory_limit(root: Path = CGROUP_ROOT) -> int | None:
    """The cgroup memory limit in bytes under ``root`` (v2's ``memory.max``, v1's
    ``memory/memory.limit_in_bytes``, the lower where both are), None when there is none or
    it cannot be read."""
    limits = [
        limit
        for limit in (
            _limit(root / "memory.max", unlimited_from=None),
            _limit(root / "memory" / "memory.limit_in_bytes", unlimited_from=V1_UNLIMITED_FROM),
        )
        if limit is not None
    ]
    return min(limits, default=None)


def _limit(path: Path, unlimited_from: int | None) -> int | None:
    """One limit file's bytes; None for v2's "max", v1's huge "no limit", or a file missing,
    unreadable or holding anything but a number."""
    try:
        with path.open("rb") as file:
            raw = file.read(_READ_AT_MOST + 1)
    except OSError:
        return None
    if len(raw) > _READ_AT_MOST:
        return None
    try:
        text = raw.decode("ascii").removesuffix("\n")
        limit = whole_number(text)
    except ValueError:  # "max", or garbage (UnicodeDecodeError is a ValueError)
        return None
    if unlimited_from is not None and limit >= unlimited_from:
        return None
    return limit


def _physical_memory() -> int | None:
    """The host's physical memory; None where sysconf does not say."""
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # no such sysconf name here
        return None
    return host if host > 0 else None  # -1: the system cannot tell
