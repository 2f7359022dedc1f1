"""Every module imports on its own, the core never reaches into the sidecar, the
sidecar never loads torch (its image carries none), and nothing but offload.vllm
loads vLLM (``import offload`` must work without it).

Each module is imported in a fresh interpreter: an import cycle only shows
when its first import comes from the wrong side, which a test process that
already imported everything would hide.
"""

from __future__ import annotations

import ast
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
    if not name.startswith("offload.vllm") and "vllm" in sys.modules:
        sys.exit(f"{name} imports vLLM: only offload.vllm may")
"""


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_alone_offload_stays_below_app_and_app_needs_no_torch(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHECK, module], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]


# Each layer may import its own and the lower layers only (docs/ARCHITECTURE.md, "Layers").
LAYERS = {
    "offload": {
        "base": 0,
        "shown": 0,
        "decimal_text": 0,
        "unknown_keys": 0,
        "wire": 1,
        "telemetry": 2,
        "cpu": 3,
        "transfer": 3,
        "worker_telemetry": 4,
        "sim": 5,
        "insight": 5,
        "vllm": 6,
    },
    "app": {
        "settings": 0,
        "decimal_text": 0,
        "streams": 0,
        "otel": 0,
        "gc_pauses": 0,
        "decode": 1,
        "http_socket": 1,
        "state": 2,
        "ingest": 3,
        "api": 3,
        "server": 4,
        "cli": 5,
    },
}


def _layer(module: str) -> tuple[str, int] | None:
    """The layer a dotted module name belongs to; None for a package's own __init__."""
    package, _, rest = module.partition(".")
    if package not in LAYERS or not rest:
        return None
    name = rest.split(".")[0]
    return name, LAYERS[package][name]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("module", [m for m in MODULES if _layer(m) is not None])
def test_imports_point_down_the_layers(module: str) -> None:
    importer = _layer(module)
    assert importer is not None
    path = ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    upward = [
        imported
        for imported in _imports(path)
        if imported.split(".")[0] == module.split(".")[0]
        and (target := _layer(imported)) is not None
        and target[1] > importer[1]
    ]
    assert upward == [], f"{module} (layer {importer}) imports higher layers: {upward}"
