"""Whether this machine can build kvscope's C extensions (setup.py makes them optional)."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import pytest


def require_a_build_toolchain() -> None:
    """Skip unless a C compiler and Python's headers are here: where they are, as in CI, a
    C form that fell back to Python silently would pass every other test, so its test fails."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler: the Python form serves, by design")
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        pytest.skip("no Python headers: the Python form serves, by design")
