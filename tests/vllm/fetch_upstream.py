"""Fetch vLLM 0.33.0's own manager tests from its source release (test set-up).

vLLM's ``tests/v1/kv_offload/cpu/test_manager.py`` is vLLM's code, so it is
never committed here: ``make test`` runs this script, which downloads the
source release from the package index once (cached beside the wheel in
``~/.cache/kvscope/``), checks it against the index's sha256, and extracts
that one file into ``tests/vllm/upstream/`` (ignored by git), where
``tests/vllm/upstream/conftest.py`` points it at kvscope's manager.

``pip download --no-binary`` cannot be used: it builds the release's metadata,
which needs vLLM's CUDA build toolchain.
"""

from __future__ import annotations

import hashlib
import re
import sys
import tarfile
import urllib.request
from pathlib import Path

VERSION = "0.33.0"
INDEX = "https://pypi.org/simple/vllm/"
SDIST = f"vllm-{VERSION}.tar.gz"
MEMBER = f"vllm-{VERSION}/tests/v1/kv_offload/cpu/test_manager.py"
CACHE = Path.home() / ".cache" / "kvscope"
TARGET = Path(__file__).resolve().parent / "upstream" / "test_vllm_manager.py"


def _sdist_url() -> tuple[str, str]:
    """The release's download address and sha256, read from the simple index."""
    with urllib.request.urlopen(INDEX, timeout=60) as reply:
        page = reply.read().decode()
    found = re.search(rf'href="([^"]*/{re.escape(SDIST)})#sha256=([0-9a-f]{{64}})"', page)
    if found is None:
        raise SystemExit(f"{SDIST} is not listed at {INDEX}")
    return found.group(1), found.group(2)


def _sdist() -> Path:
    path = CACHE / SDIST
    if path.is_file():
        return path
    url, sha256 = _sdist_url()
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=300) as reply, partial.open("wb") as out:
        digest = hashlib.sha256()
        while chunk := reply.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        partial.unlink()
        raise SystemExit(f"{SDIST}: sha256 {digest.hexdigest()} is not the index's {sha256}")
    partial.rename(path)
    return path


def main() -> None:
    if TARGET.is_file():
        return
    with tarfile.open(_sdist()) as release:
        source = release.extractfile(MEMBER)
        if source is None:
            raise SystemExit(f"{MEMBER} is missing from {SDIST}")
        TARGET.write_bytes(source.read())
    print(f"fetched vLLM {VERSION}'s manager tests into {TARGET}", file=sys.stderr)


if __name__ == "__main__":
    main()
