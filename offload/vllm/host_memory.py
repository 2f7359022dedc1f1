"""The memory a CPU tier may take here: the host's, or a cgroup's limit when lower.

A tier above the host's memory is refused at start-up; in a container
(Kubernetes, podman) or a systemd slice the cgroup's memory limit is the
real bound, and a tier above it passed that check only for the worker to be
killed for memory during its zero-fill at start-up, naming no key. A limit
may sit on any cgroup from the process's own up to the root (a pod's limit
on the pod, a container's below it, a slice's above a session), so the
process's cgroup is read from ``/proc/self/cgroup`` and every level's
limit file on the way up is read: the tightest one bounds the tier. What
cannot be read or understood is taken as no limit known, with a warning
naming the file, so an odd file never stops an engine that would fit.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final

from offload.decimal_text import whole_number
from offload.shown import shown

CGROUP_ROOT: Final = Path("/sys/fs/cgroup")
PROC_ROOT: Final = Path("/proc")
V1_UNLIMITED_FROM: Final = 2**62
"""cgroup v1 writes "no limit" as the largest page-aligned 63-bit number
(9223372036854771712 with 4 KiB pages); any value this large (4 EiB) is taken as that."""
_READ_AT_MOST: Final = 64
"""Bytes read of a limit file: a limit is at most 20 digits; more is not a limit."""
_CGROUPS_AT_MOST: Final = 1 << 16
"""Bytes read of ``/proc/self/cgroup``: a line per hierarchy (about a dozen), each naming one
path; more is not that file."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MemoryBound:
    """The lowest memory bound known here, and what it is, for an error to name."""

    num_bytes: int
    what: str
    """"this host's memory" or "the cgroup memory limit"."""


def memory_bound(
    cgroup_root: Path = CGROUP_ROOT, proc_root: Path = PROC_ROOT
) -> MemoryBound | None:
    """The host's memory or the cgroup limit (``cgroup_memory_limit``), whichever is
    lower; None when neither is known."""
    bounds = []
    host = _physical_memory()
    if host is not None:
        bounds.append(MemoryBound(host, "this host's memory"))
    limit = cgroup_memory_limit(cgroup_root, proc_root)
    if limit is not None:
        bounds.append(MemoryBound(limit, "the cgroup memory limit"))
    return min(bounds, key=lambda bound: bound.num_bytes, default=None)


def cgroup_memory_limit(root: Path = CGROUP_ROOT, proc_root: Path = PROC_ROOT) -> int | None:
    """The tightest cgroup memory limit in bytes on this process, None when there is none
    or none can be read.

    The process's cgroups are named in ``proc_root/self/cgroup``: v2's unified one
    (``0::/path``) and v1's memory controller's (``N:...memory...:/path``). Each is
    walked from its own directory up to the hierarchy's root under ``root``, reading
    v2's ``memory.max`` and v1's ``memory/.../memory.limit_in_bytes`` at each level.
    A level missing here (a container sees its own cgroup at the root, its host's path
    to it absent) adds nothing; the root's files are always read.
    """
    unified, memory = _own_cgroups(proc_root / "self" / "cgroup")
    limits = [
        *(_limit(level / "memory.max", None) for level in _levels(root, unified)),
        *(
            _limit(level / "memory.limit_in_bytes", V1_UNLIMITED_FROM)
            for level in _levels(root / "memory", memory)
        ),
    ]
    return min((limit for limit in limits if limit is not None), default=None)


def _own_cgroups(path: Path) -> tuple[str | None, str | None]:
    """The process's v2 cgroup path and its v1 memory controller's, as ``/proc/self/cgroup``
    names them (None: not named, or the file missing or not understood)."""
    try:
        with path.open("rb") as file:
            raw = file.read(_CGROUPS_AT_MOST + 1)
    except FileNotFoundError:  # not Linux: the root's files only
        return None, None
    except OSError as exc:
        _ignored(path, f"cannot be read ({type(exc).__name__})")
        return None, None
    if len(raw) > _CGROUPS_AT_MOST:
        _ignored(path, f"is over {_CGROUPS_AT_MOST} bytes")
        return None, None
    unified = memory = None
    # A cgroup's name is bytes, and may hold ':' (the path is the third field, whole).
    for line in raw.decode("utf-8", "surrogateescape").splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3 or not (fields[0].isascii() and fields[0].isdigit()):
            _ignored(path, f"has a line not 'id:controllers:path': '{shown(line)}'")
            return None, None
        hierarchy, controllers, cgroup = fields
        if hierarchy == "0" and not controllers:
            unified = cgroup
        elif "memory" in controllers.split(","):
            memory = cgroup
    return unified, memory


def _levels(base: Path, cgroup: str | None) -> list[Path]:
    """The directories of ``cgroup`` and each cgroup above it, under ``base``, its own first.

    Only ``base`` for no cgroup named, or one not below this namespace's root (the
    kernel writes ``/../x`` for a cgroup outside it).
    """
    if cgroup is None or not cgroup.startswith("/"):
        return [base]
    parts = PurePosixPath(cgroup).parts[1:]
    if ".." in parts:
        return [base]
    return [base.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _limit(path: Path, unlimited_from: int | None) -> int | None:
    """One limit file's bytes; None for v2's "max", v1's huge "no limit", a file missing,
    or one unreadable or holding anything but a number (with a warning)."""
    try:
        with path.open("rb") as file:
            raw = file.read(_READ_AT_MOST + 1)
    except FileNotFoundError:  # no limit at this level, or not this cgroup version
        return None
    except OSError as exc:
        _ignored(path, f"cannot be read ({type(exc).__name__})")
        return None
    text = raw.removesuffix(b"\n")
    if text == b"max":
        return None
    try:
        if len(raw) > _READ_AT_MOST:
            raise ValueError("too long")
        limit = whole_number(text.decode("ascii"))
    except ValueError:  # garbage (UnicodeDecodeError is a ValueError)
        _ignored(path, "holds no number of bytes")
        return None
    if unlimited_from is not None and limit >= unlimited_from:
        return None
    return limit


def _ignored(path: Path, why: str) -> None:
    """Warn that a cgroup file was not understood, so a limit it holds is not applied."""
    _log.warning(
        "kvscope: %s %s; it is ignored, so a memory limit it sets is not checked",
        shown(path),
        why,
    )


def _physical_memory() -> int | None:
    """The host's physical memory; None where sysconf does not say."""
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # no such sysconf name here
        return None
    return host if host > 0 else None  # -1: the system cannot tell
