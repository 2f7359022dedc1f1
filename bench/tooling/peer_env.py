"""Build (or reuse) the virtual environment that runs vLLM's own offloading manager.

The peer benchmark compares kvscope's manager with vLLM 0.33.0's
``CPUOffloadingManager`` on the same trace. vLLM cannot live in kvscope's own
environment: it pins a different torch and a very large dependency set, and
importing it there would change what kvscope's tests and benchmarks run
against. So the peer runs in a separate venv at ``.bench/peer-venv``
(git-ignored), driven as a subprocess by ``bench/tooling/peer_workload.py``.

vLLM is installed with ``--no-deps`` and then only the third-party packages
that the import chain of ``vllm.v1.kv_offload.cpu.manager`` actually needs,
found by trying the import. Where vLLM itself declares a version range for one
of them, that range is used, so the peer runs with versions vLLM supports.
Torch is the exception: it is pinned to the CPU build 2.13.0 available offline
(vLLM 0.33.0 declares torch 2.14.0, but the manager only uses torch through
type imports and tensor-free code paths, so any recent CPU torch imports it).

Use it as a module (``from bench.tooling.peer_env import ensure_peer_python``) or run
it (``python -m bench.tooling.peer_env [--force]``): the second form prints the venv's
python on stdout and exits non-zero with a one-line error when it cannot.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_DIR = REPO_ROOT / ".bench" / "peer-venv"
STAMP_FILE = VENV_DIR / "kvscope-peer.stamp"
LOCK_FILE = REPO_ROOT / ".bench" / "peer-venv.lock"
BUILD_LOG = REPO_ROOT / ".bench" / "peer-venv-build.log"

VLLM_VERSION = "0.33.0"
TORCH_SPEC = "torch==2.13.0"
# Environment variable naming a local vLLM wheel, for machines without PyPI.
VLLM_WHEEL_ENV = "KVSCOPE_VLLM_WHEEL"
# The module whose import the peer needs; the venv is good when it imports.
PEER_MODULE = "vllm.v1.kv_offload.cpu.manager"

# Distributions the import chain of PEER_MODULE needs under `vllm --no-deps`,
# found by importing it in a bare venv and adding what was missing, one
# ModuleNotFoundError at a time. The chain is long because manager.py imports
# vllm.distributed.kv_transfer (whose package __init__ pulls the whole
# connector stack, the scheduler output, multimodal, the OpenAI entrypoints'
# parsers and structured-output backends). Their own dependencies come with
# them. `oss-harmony` provides the `openai_harmony` module vLLM imports.
PEER_EXTRAS: tuple[str, ...] = (
    "numpy",
    "packaging",
    "psutil",
    "pyzmq",
    "regex",
    "requests",
    "transformers",
    "cbor2",
    "aiohttp",
    "oss-harmony",
    "openai",
    "pillow",
    "pybase64",
    "cachetools",
    "msgspec",
    "cloudpickle",
    "uvloop",
    "py-cpuinfo",
    "prometheus_client",
    "xgrammar",
    "fastapi",
    "partial-json-parser",
    "llguidance",
)


class PeerEnvError(RuntimeError):
    """The peer venv cannot be built; the message is one line for the user."""


def _log(message: str) -> None:
    """Progress goes to stderr so stdout stays clean for the python path."""
    print(f"[peer-env] {message}", file=sys.stderr, flush=True)


def _venv_python(venv: Path = VENV_DIR) -> Path:
    return venv / "bin" / "python"


def _spec_digest() -> str:
    """What the stamp certifies; a change here makes the next call rebuild."""
    spec = {
        "python": list(sys.version_info[:2]),
        "torch": TORCH_SPEC,
        "vllm": VLLM_VERSION,
        "vllm_wheel": os.environ.get(VLLM_WHEEL_ENV, ""),
        "extras": list(PEER_EXTRAS),
        "module": PEER_MODULE,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _stamp_ok() -> bool:
    if not _venv_python().exists() or not STAMP_FILE.exists():
        return False
    try:
        return json.loads(STAMP_FILE.read_text()).get("digest") == _spec_digest()
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """Serialise builds, so two bench scripts started together share one venv."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# Lines that say the package index could not be reached or had nothing to offer.
_UNREACHABLE = re.compile(
    r"(?i)failed to establish a new connection|name resolution|max retries exceeded"
    r"|network is unreachable|connection (refused|reset)|timed out|no matching distribution"
    r"|could not find a version|conflicting dependencies"
)


def _last_error_line(output: str) -> str:
    """The most telling line of a failed command, for a one-line message.

    pip words "nothing installable was found" in several ways (with a
    constraints file it even reports a dependency conflict), so such lines get
    a hint that the index is probably unreachable.
    """
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if _UNREACHABLE.search(line):
            return f"{line} (is the package index reachable?)"
    for line in reversed(lines):
        if line.startswith(("ERROR:", "ModuleNotFoundError", "ImportError", "OSError")):
            return line
    return lines[-1] if lines else "no output"


def _run(argv: Sequence[str | Path], what: str) -> str:
    """Run one build step, append its output to the build log, fail in one line."""
    _log(what)
    proc = subprocess.run(
        [str(a) for a in argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    with BUILD_LOG.open("a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(str(a) for a in argv)}\n{proc.stdout}\n")
    if proc.returncode != 0:
        raise PeerEnvError(f"{what} failed: {_last_error_line(proc.stdout)} [log: {BUILD_LOG}]")
    return proc.stdout


def _pip(python: Path, args: Sequence[str], what: str) -> None:
    _run([python, "-m", "pip", "install", "--no-input", *args], what)


def _vllm_declared_specs(python: Path) -> dict[str, str]:
    """vLLM's own requirement strings (markers kept, extras dropped), by name.

    Installing the extras with vLLM's ranges keeps the peer on versions vLLM
    supports, even though we skip most of its dependency set.
    """
    script = "from importlib.metadata import requires\nprint('\\n'.join(requires('vllm') or []))"
    out = _run([python, "-c", script], "reading vLLM's declared requirements")
    specs: dict[str, str] = {}
    for line in out.splitlines():
        req = line.strip()
        if not req or "extra ==" in req:
            continue
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?(.*)", req)
        if match is None:
            continue
        name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
        specs.setdefault(name, match.group(1) + match.group(3))
    return specs


def _extras_with_specs(declared: dict[str, str]) -> list[str]:
    resolved = []
    for extra in PEER_EXTRAS:
        key = re.sub(r"[-_.]+", "-", extra).lower()
        resolved.append(declared.get(key, extra))
    return resolved


def _check_import(python: Path) -> None:
    """The venv is only good if the manager really imports in it."""
    proc = subprocess.run(
        [str(python), "-c", f"import {PEER_MODULE}"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise PeerEnvError(
            f"import {PEER_MODULE} fails in the peer venv: {_last_error_line(proc.stderr)}"
        )


def build_peer_env(force: bool = False) -> Path:
    """Create or reuse the peer venv and return its python; raises PeerEnvError."""
    with _build_lock():
        if force and VENV_DIR.exists():
            _log(f"removing {VENV_DIR}")
            shutil.rmtree(VENV_DIR)
        if _stamp_ok():
            return _venv_python()
        BUILD_LOG.parent.mkdir(parents=True, exist_ok=True)
        BUILD_LOG.write_text("")
        STAMP_FILE.unlink(missing_ok=True)
        python = _venv_python()
        if not python.exists():
            _run([sys.executable, "-m", "venv", VENV_DIR], f"creating venv {VENV_DIR}")
        _pip(python, [TORCH_SPEC], f"installing {TORCH_SPEC} (CPU)")
        wheel = os.environ.get(VLLM_WHEEL_ENV)
        vllm_target = wheel if wheel else f"vllm=={VLLM_VERSION}"
        _pip(python, ["--no-deps", vllm_target], f"installing {vllm_target} without dependencies")
        extras = _extras_with_specs(_vllm_declared_specs(python))
        # Constrain torch so no extra can drag in a different (CUDA) build.
        _pip(
            python,
            [*extras, TORCH_SPEC],
            f"installing {len(extras)} packages the manager's import chain needs",
        )
        _log(f"checking that {PEER_MODULE} imports")
        _check_import(python)
        STAMP_FILE.write_text(json.dumps({"digest": _spec_digest(), "extras": extras}) + "\n")
        _log(f"peer venv ready: {python}")
        return python


def ensure_peer_python() -> Path | None:
    """The peer venv's python, building it on first use; None (reason on stderr) if it can't.

    Bench scripts call this and skip the vLLM column instead of failing the
    whole benchmark when the peer cannot be built (e.g. offline).
    """
    try:
        return build_peer_env()
    except (PeerEnvError, OSError) as exc:
        _log(f"vLLM peer unavailable: {exc}")
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: print the peer python on stdout, or one error line and exit 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="delete and rebuild the venv")
    args = parser.parse_args(argv)
    try:
        python = build_peer_env(force=args.force)
    except (PeerEnvError, OSError) as exc:
        print(f"peer_env: error: {exc}", file=sys.stderr)
        return 1
    print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
