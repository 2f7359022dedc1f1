"""Every module imports on its own, the core never reaches into the sidecar, and the
sidecar never loads torch (its image carries none).

Each module is imported in a fresh interpreter: an import cycle only shows
when its first import comes from the wrong side, which a test process that
already imported everything would hide.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for package in ("offload", "app")
    for path in (ROOT / package).rglob("*.py")
)

CHECK = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
    if name.startswith("offload") and any(m == "app" or m.startswith("app.") for m in sys.modules):
        sys.exit(f"{name} imports the sidecar package app")
    if name.startswith("app") and "torch" in sys.modules:
        sys.exit(f"{name} imports torch")
"""


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_alone_offload_stays_below_app_and_app_needs_no_torch(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHECK, module], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
