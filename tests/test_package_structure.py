"""Every module imports on its own, the core never reaches into the sidecar, the
sidecar never loads torch (its image carries none), and nothing but offload.vllm
loads vLLM (``import offload`` must work without it).

Each module is imported in a fresh interpreter: an import cycle only shows
when its first import comes from the wrong side, which a test process that
already imported everything would hide.
"""

from __future__ import annotations

import ast
import re
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
        "stop_signals": 0,
        "decode": 1,
        "http_socket": 1,
        "state": 2,
        "ingest": 3,
        "api": 3,
        "server": 4,
        "cli": 5,
        "entry_point": 6,
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


ARCHITECTURE = (ROOT / "docs" / "ARCHITECTURE.md").read_text()


def _tree_entries() -> dict[str, str]:
    """docs/ARCHITECTURE.md's tree ("The tree"): each path it lists, with its line's text
    and the lines that continue it. An entry sits at two spaces a level; a description
    starts at column 25, and a line indented that far continues the one before."""
    block = ARCHITECTURE.split("## The tree", 1)[1].split("```")[1]
    entries: dict[str, str] = {}
    parents: list[str] = []
    last = ""
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip():
            continue
        if indent >= 25:
            entries[last] += " " + line.strip()
            continue
        name = line.split()[0]
        parents = parents[: indent // 2]
        last = "/".join([*parents, name.rstrip("/")])
        entries[last] = line[indent + len(name) :].strip()
        if name.endswith("/"):
            parents.append(name.rstrip("/"))
    return entries


def _source_files(package: str) -> list[str]:
    return sorted(
        str(path.relative_to(ROOT))
        for suffix in ("*.py", "*.c", "*.h")
        for path in (ROOT / package).rglob(suffix)
        if path.name != "__init__.py" and "vendor" not in path.parts
    )


def test_the_architecture_tree_names_every_module_and_only_modules_that_exist() -> None:
    """Each source file under offload/ and app/ has a line of its own in the tree, or is
    named in its folder's line (app/api/guards/ lists its middlewares so); each file the
    tree lists there exists."""
    entries = _tree_entries()
    unlisted = [
        path
        for path in _source_files("offload") + _source_files("app")
        if path not in entries
        and Path(path).stem not in re.findall(r"\w+", entries.get(str(Path(path).parent), ""))
    ]
    assert not unlisted, f"docs/ARCHITECTURE.md's tree leaves out {unlisted}"
    listed = [
        path
        for path in entries
        if path.startswith(("offload/", "app/")) and not (ROOT / path).exists()
    ]
    assert not listed, f"docs/ARCHITECTURE.md's tree lists what is not there: {listed}"
    assert len(entries) > 150, "the tree's parser no longer finds its entries"


def _chain(text: str) -> dict[str, int]:
    return {
        name.strip(): layer
        for layer, names in enumerate(text.split("->"))
        for name in names.split(",")
    }


def test_the_architecture_layer_chains_are_the_layers_checked_here() -> None:
    """The two orders docs/ARCHITECTURE.md writes out ("Layers") are LAYERS above."""
    offload_chain, app_chain = (
        re.search(rf"^`({first}, [^`]*)`$", ARCHITECTURE, re.MULTILINE)
        for first in ("base", "settings")
    )
    assert offload_chain and app_chain, "docs/ARCHITECTURE.md's layer chains moved"
    assert _chain(offload_chain.group(1)) == LAYERS["offload"]
    assert _chain(app_chain.group(1)) == LAYERS["app"]


def _offload_names_imported(path: Path) -> set[str]:
    """What a module takes from offload/, each as module.name (``from m import n``) or
    module (``import m``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "offload")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "offload":
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_sidecar_takes_from_offload_only_what_the_architecture_says() -> None:
    """docs/ARCHITECTURE.md: "`app/` imports `offload/` only for ..." names each part
    (the command line, app/cli.py, composes both sides and is left out)."""
    bullet = ARCHITECTURE.split("- `app/` imports `offload/` only for", 1)[1].split("\n- ", 1)[0]
    allowed = {span.removesuffix(".*") for span in re.findall(r"`(offload\.[\w.*]+)`", bullet)}
    assert "offload.insight" in allowed, "the bullet's names are no longer read"
    taken = {
        name
        for path in (ROOT / "app").rglob("*.py")
        if path != ROOT / "app" / "cli.py"
        for name in _offload_names_imported(path)
    }
    beyond = sorted(
        name for name in taken if not any(name == a or name.startswith(a + ".") for a in allowed)
    )
    assert not beyond, f"app/ takes from offload/ what docs/ARCHITECTURE.md leaves out: {beyond}"


CODE_NAME = re.compile(
    r"\b(?:[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+"  # CamelCase
    r"|[a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b"  # snake_case
)
"""A CamelCase or snake_case word: a class, function or field, as the tree's lines name them."""


def test_the_names_the_architecture_tree_gives_a_module_are_in_the_code() -> None:
    """Each class or function a module's line in the tree names (``ZmqHeld``,
    ``set_heartbeat``) is in that module, or, for a line that points elsewhere
    (``KVLayout.from_canonical``, a setting), somewhere under offload/ or app/."""
    sources = {path: (ROOT / path).read_text() for path in _source_files("offload")}
    sources |= {path: (ROOT / path).read_text() for path in _source_files("app")}
    everywhere = "\n".join(sources.values())
    stale = {
        path: missing
        for path, text in _tree_entries().items()
        if path in sources
        and (
            missing := sorted(
                name
                for name in set(CODE_NAME.findall(text))
                if name not in sources[path] and name not in everywhere
            )
        )
    }
    assert not stale, f"docs/ARCHITECTURE.md's tree names what the code does not: {stale}"
