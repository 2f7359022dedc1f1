"""The memory bound a CPU tier is checked against: the host's, or a cgroup's limit.

The cgroup files (and ``/proc/self/cgroup``) are real files under a temporary
root, written as the kernel writes them (and as it never does: garbage must
not stop an engine, and is named in a warning).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from offload.vllm import host_memory
from offload.vllm.host_memory import memory_bound

GIB = 1 << 30


def cgroup_memory_limit(root: Path, proc_root: Path | None = None) -> int | None:
    """The limit under ``root``, for a process whose ``/proc`` is ``proc_root`` (none given:
    one with no ``self/cgroup``, so only the root's files are read)."""
    return host_memory.cgroup_memory_limit(root, proc_root or root / "no-proc")


def _own(tmp_path: Path, text: str | bytes) -> Path:
    """A ``/proc`` whose ``self/cgroup`` holds ``text``."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_bytes(text.encode() if isinstance(text, str) else text)
    return proc


def _limit_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _v2(root: Path, text: str | bytes) -> Path:
    path = root / "memory.max"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return root


def _v1(root: Path, text: str) -> Path:
    (root / "memory").mkdir()
    (root / "memory" / "memory.limit_in_bytes").write_text(text)
    return root


def test_cgroup_v2_max_is_no_limit_and_a_number_is_the_limit(tmp_path: Path) -> None:
    assert cgroup_memory_limit(_v2(tmp_path, "max\n")) is None
    assert cgroup_memory_limit(_v2(tmp_path, "8589934592\n")) == 8 << 30
    assert cgroup_memory_limit(_v2(tmp_path, "0\n")) == 0  # a limit of nothing is a limit


def test_cgroup_v1_unlimited_is_no_limit_and_a_number_is_the_limit(tmp_path: Path) -> None:
    assert cgroup_memory_limit(_v1(tmp_path, "9223372036854771712\n")) is None
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("4294967296\n")
    assert cgroup_memory_limit(tmp_path) == 4 << 30


def test_the_lower_of_both_versions_is_the_limit(tmp_path: Path) -> None:
    _v1(_v2(tmp_path, "8589934592\n"), "4294967296\n")
    assert cgroup_memory_limit(tmp_path) == 4 << 30


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"lots\n",
        b"-1\n",
        b" 8589934592\n",
        b"8589934592 bytes\n",
        b"\xff\xfe8\n",
        b"9" * 10**6,
    ],
    ids=["empty", "a word", "negative", "a space", "a unit", "not text", "a megabyte of digits"],
)
def test_garbage_in_a_limit_file_is_no_limit_known(tmp_path: Path, content: bytes) -> None:
    assert cgroup_memory_limit(_v2(tmp_path, content)) is None


def test_garbage_in_a_limit_file_is_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=host_memory.__name__)
    assert cgroup_memory_limit(_v2(tmp_path, b"lots\n")) is None
    assert cgroup_memory_limit(_v2(tmp_path, b"max\n")) is None
    assert [record.getMessage() for record in caplog.records] == [
        f"kvscope: {tmp_path / 'memory.max'} holds no number of bytes; it is ignored, so a "
        "memory limit it sets is not checked"
    ], "max is no limit, not garbage"


def test_missing_or_unreadable_files_are_no_limit_known(tmp_path: Path) -> None:
    assert cgroup_memory_limit(tmp_path / "absent") is None
    (tmp_path / "memory.max").mkdir()  # read as a file: IsADirectoryError
    assert cgroup_memory_limit(tmp_path) is None


def test_a_container_limit_below_the_hosts_memory_is_the_bound_named(tmp_path: Path) -> None:
    bound = memory_bound(_v2(tmp_path, "8589934592\n"), tmp_path / "no-proc")
    assert bound is not None
    assert (bound.num_bytes, bound.what) == (8 << 30, "the cgroup memory limit")


def test_without_a_container_limit_the_hosts_memory_is_the_bound(tmp_path: Path) -> None:
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    proc = tmp_path / "no-proc"
    for root in (_v2(tmp_path, "max\n"), tmp_path / "absent"):
        assert memory_bound(root, proc) == host_memory.MemoryBound(host, "this host's memory")
    # A limit above the host's memory bounds nothing the host's does not.
    assert memory_bound(_v2(tmp_path, f"{host * 2}\n"), proc) == host_memory.MemoryBound(
        host, "this host's memory"
    )


def test_this_machines_cgroup_files_are_read() -> None:
    """Whatever this machine's cgroups say, reading them answers a limit or none."""
    limit = host_memory.cgroup_memory_limit()
    assert limit is None or limit >= 0
    bound = memory_bound()
    assert bound is not None and bound.num_bytes > 0


def test_a_nested_v2_cgroup_is_bound_by_the_tightest_limit_up_to_the_root(
    tmp_path: Path,
) -> None:
    """A pod's limit on the pod, a looser one on its container, none above: the pod's."""
    root = tmp_path / "cgroup"
    proc = _own(tmp_path, "0::/kubepods/pod1/ctr\n")
    _limit_file(root / "kubepods" / "memory.max", "max\n")
    _limit_file(root / "kubepods" / "pod1" / "memory.max", f"{8 * GIB}\n")
    _limit_file(root / "kubepods" / "pod1" / "ctr" / "memory.max", f"{16 * GIB}\n")
    assert cgroup_memory_limit(root, proc) == 8 * GIB
    _limit_file(root / "memory.max", f"{4 * GIB}\n")  # the root's, tighter still
    assert cgroup_memory_limit(root, proc) == 4 * GIB
    # Read from the process's own cgroup up: a sibling's tighter limit is not its.
    _limit_file(root / "kubepods" / "pod2" / "memory.max", f"{GIB}\n")
    assert cgroup_memory_limit(root, proc) == 4 * GIB


def test_a_nested_v1_memory_cgroup_is_bound_by_the_tightest_limit_up_to_the_root(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cgroup"
    proc = _own(tmp_path, "5:cpu,cpuacct:/other\n4:blkio,memory:/a/b\n0::/\n")
    unlimited = "9223372036854771712\n"
    _limit_file(root / "memory" / "memory.limit_in_bytes", unlimited)
    _limit_file(root / "memory" / "a" / "memory.limit_in_bytes", f"{4 * GIB}\n")
    _limit_file(root / "memory" / "a" / "b" / "memory.limit_in_bytes", unlimited)
    _limit_file(root / "memory" / "other" / "memory.limit_in_bytes", f"{GIB}\n")  # cpu's path
    assert cgroup_memory_limit(root, proc) == 4 * GIB


def test_levels_missing_here_add_nothing_and_the_root_still_counts(tmp_path: Path) -> None:
    """Inside a container without a cgroup namespace, /proc/self/cgroup names the host's
    path to it, which is not there: the container's own cgroup is the root it sees."""
    proc = _own(tmp_path, "0::/system.slice/docker-abc.scope\n")
    assert cgroup_memory_limit(_v2(tmp_path, f"{2 * GIB}\n"), proc) == 2 * GIB


@pytest.mark.parametrize(
    "own",
    ["0::/../../outside\n", "0::relative/path\n", "0::/a/../a/b\n"],
    ids=["outside the namespace", "relative", "a step back"],
)
def test_a_cgroup_path_not_below_the_root_reads_the_root_only(tmp_path: Path, own: str) -> None:
    root = tmp_path / "cgroup"
    _limit_file(root / "memory.max", f"{2 * GIB}\n")
    _limit_file(root / "outside" / "memory.max", f"{GIB}\n")
    _limit_file(root / "a" / "b" / "memory.max", f"{GIB}\n")
    assert cgroup_memory_limit(root, _own(tmp_path, own)) == 2 * GIB


def test_a_cgroup_name_may_hold_colons_and_bytes_not_utf8(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    name = b"job:7\xff"
    (root / os.fsdecode(name)).mkdir(parents=True)
    (root / os.fsdecode(name) / "memory.max").write_text(f"{GIB}\n")
    assert cgroup_memory_limit(root, _own(tmp_path, b"0::/" + name + b"\n")) == GIB


@pytest.mark.parametrize(
    ("own", "why"),
    [
        ("no colons here\n", "has a line not 'id:controllers:path': 'no colons here'"),
        ("x::/a\n", "has a line not 'id:controllers:path': 'x::/a'"),
        ("0::/a\n" * 20_000, "is over 65536 bytes"),
    ],
    ids=["a line of one field", "no hierarchy number", "too long"],
)
def test_a_proc_cgroup_file_not_understood_is_named_and_the_root_still_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, own: str, why: str
) -> None:
    caplog.set_level(logging.WARNING, logger=host_memory.__name__)
    root = tmp_path / "cgroup"
    _limit_file(root / "memory.max", f"{2 * GIB}\n")
    _limit_file(root / "a" / "memory.max", f"{GIB}\n")
    proc = _own(tmp_path, own)
    assert cgroup_memory_limit(root, proc) == 2 * GIB
    assert [record.getMessage() for record in caplog.records] == [
        f"kvscope: {proc / 'self' / 'cgroup'} {why}; it is ignored, so a memory limit it "
        "sets is not checked"
    ]


def test_garbage_at_one_level_is_named_and_the_others_still_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=host_memory.__name__)
    root = tmp_path / "cgroup"
    _limit_file(root / "a" / "memory.max", f"{4 * GIB}\n")
    _limit_file(root / "a" / "b" / "memory.max", "-1\n")
    assert cgroup_memory_limit(root, _own(tmp_path, "0::/a/b\n")) == 4 * GIB
    assert [record.getMessage() for record in caplog.records] == [
        f"kvscope: {root / 'a' / 'b' / 'memory.max'} holds no number of bytes; it is "
        "ignored, so a memory limit it sets is not checked"
    ]
