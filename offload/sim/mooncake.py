"""Mooncake-format request traces: one JSON object per line with ``hash_ids``.

Traces drive the demo worker, ``kvscope replay`` and the benchmarks. Reading them is strict:
a malformed line is an error naming the file and line, because silently
skipping requests would change every hit ratio computed from the trace.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

BUNDLED_TRACE = "conversation_trace.jsonl"

BUNDLED_TRACE_BLOCK_SIZE = 512
"""Tokens per block of the bundled trace: one hash id stands for 512 tokens."""


_MAX_HASH_ID = (1 << 64) - 1
"""Mooncake's hash ids are unsigned 64-bit block ids; vLLM's keys carry them as 8 bytes."""


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file and line."""


def bundled_trace_path() -> Path:
    """The conversation trace shipped inside the package (see its NOTICE)."""
    return Path(str(resources.files("offload.sim.traces") / BUNDLED_TRACE))


def load_trace(path: str | Path) -> list[list[int]]:
    """Every request's block hashes, in trace order."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"trace file not found: {path}") from None
    except IsADirectoryError:
        raise TraceError(f"trace path is a directory, not a file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace {path}: {exc}") from None
    requests: list[list[int]] = []
    # Lines end at "\n" only (JSON Lines): str.splitlines would also split inside a JSON
    # string at U+2028 or U+0085 and call a valid line invalid.
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            requests.append(_parse_request(line, f"{path}:{number}"))
    if not requests:
        raise TraceError(f"trace {path} holds no requests")
    if not any(requests):
        raise TraceError(f"trace {path} holds no block references: every 'hash_ids' is empty")
    return requests


def _parse_request(line: str, where: str) -> list[int]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise TraceError(f"{where}: JSON nested too deeply") from None
    except ValueError:  # an integer of more digits than Python converts
        raise TraceError(f"{where}: a number too long to be a hash id") from None
    if not isinstance(record, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "hash_ids" not in record:
        raise TraceError(f"{where}: missing 'hash_ids' list")
    hash_ids = record["hash_ids"]
    if not isinstance(hash_ids, list):
        raise TraceError(f"{where}: 'hash_ids' must be a list, got {type(hash_ids).__name__}")
    if not all(type(h) is int and 0 <= h <= _MAX_HASH_ID for h in hash_ids):
        raise TraceError(f"{where}: 'hash_ids' must hold integers from 0 to 2**64 - 1 only")
    return hash_ids
