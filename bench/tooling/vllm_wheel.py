"""vLLM 0.33.0's own source files, run from its wheel without installing vLLM.

``import vllm`` pulls in the whole framework (CUDA kernels, torch extensions,
a GPU platform check); a compatibility test or a peer benchmark needs one
file of it. The wheel is cached (``~/.cache/kvscope/``, or the repository's
``.bench/``, or the file ``KVSCOPE_VLLM_WHEEL`` names) and downloaded once,
without dependencies; a file is loaded with stand-ins for the vLLM-internal
names it imports, which are removed from ``sys.modules`` afterwards.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from bench.tooling.peer_env import REPO_ROOT, VLLM_VERSION, VLLM_WHEEL_ENV

WHEEL_DIRS = (Path.home() / ".cache" / "kvscope", REPO_ROOT / ".bench")


class WheelUnavailable(RuntimeError):
    """The wheel is neither cached nor downloadable; the message says why."""


def wheel() -> Path:
    """The cached vLLM wheel, downloaded (no dependencies) on first use."""
    return _cached() or _download()


def _cached() -> Path | None:
    named = os.environ.get(VLLM_WHEEL_ENV)
    if named and Path(named).is_file():
        return Path(named)
    for folder in WHEEL_DIRS:
        wheels = sorted(folder.glob(f"vllm-{VLLM_VERSION}-*.whl"))
        if wheels:
            return wheels[0]
    return None


def _download() -> Path:
    cache = WHEEL_DIRS[0]
    cache.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--platform=manylinux_2_28_x86_64",
        f"--dest={cache}",
        f"vllm=={VLLM_VERSION}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = _cached()
    if done.returncode != 0 or found is None:
        raise WheelUnavailable(
            f"vllm=={VLLM_VERSION} wheel not cached and not downloadable: "
            f"{done.stderr.strip()[-400:]}"
        )
    return found


def stand_in(name: str, **attributes: object) -> ModuleType:
    """A module holding just ``attributes``, for a vLLM-internal import."""
    module = ModuleType(name)
    module.__dict__.update(attributes)
    return module


@contextmanager
def in_sys_modules(modules: Mapping[str, ModuleType]) -> Iterator[None]:
    """Provide modules for the duration of a load, then restore what was there."""
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous


def load_member(member: str, module_name: str, stand_ins: Mapping[str, ModuleType]) -> ModuleType:
    """Run one file of the wheel as module ``module_name``, its vLLM imports stood in.

    The file is written to a temporary directory that is kept and imported by
    path, because ``triton.jit`` reads a kernel's source from its file. The
    module stays registered under ``module_name`` (msgspec resolves a struct's
    annotations through its module); the stand-ins do not.
    """
    with zipfile.ZipFile(wheel()) as archive:
        source = archive.read(member)
    path = Path(tempfile.mkdtemp(prefix="kvscope-vllm-")) / Path(member).name
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {member} from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        with in_sys_modules(stand_ins):
            spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
