"""The memory bound a CPU tier is checked against: the host's, or a container's limit.

The cgroup files are real files under a temporary root, written as the
kernel writes them (and as it never does: garbage must not stop an engine).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from offload.vllm import host_memory
from offload.vllm.host_memory import CGROUP_ROOT, cgroup_memory_limit, memory_bound


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


def test_missing_or_unreadable_files_are_no_limit_known(tmp_path: Path) -> None:
    assert cgroup_memory_limit(tmp_path / "absent") is None
    (tmp_path / "memory.max").mkdir()  # read as a file: IsADirectoryError
    assert cgroup_memory_limit(tmp_path) is None


def test_a_container_limit_below_the_hosts_memory_is_the_bound_named(tmp_path: Path) -> None:
    bound = memory_bound(_v2(tmp_path, "8589934592\n"))
    assert bound is not None
    assert (bound.num_bytes, bound.what) == (8 << 30, "the container's memory limit")


def test_without_a_container_limit_the_hosts_memory_is_the_bound(tmp_path: Path) -> None:
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for root in (_v2(tmp_path, "max\n"), tmp_path / "absent"):
        assert memory_bound(root) == host_memory.MemoryBound(host, "this host's memory")
    # A limit above the host's memory bounds nothing the host's does not.
    assert memory_bound(_v2(tmp_path, f"{host * 2}\n")) == host_memory.MemoryBound(
        host, "this host's memory"
    )


def test_this_machines_cgroup_files_are_read() -> None:
    """Whatever this machine's cgroup says, reading it answers a limit or none."""
    limit = cgroup_memory_limit(CGROUP_ROOT)
    assert limit is None or limit >= 0
    bound = memory_bound()
    assert bound is not None and bound.num_bytes > 0
