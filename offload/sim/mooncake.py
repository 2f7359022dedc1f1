"""Mooncake-format request traces: one JSON object per line with ``hash_ids``.

Traces drive the demo worker, ``kvscope replay`` and the benchmarks. Reading them is strict:
a malformed line is an error naming the file and line, because silently
skipping requests would change every hit ratio computed from the trace.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from importlib import resources
from pathlib import Path
from typing import BinaryIO, Final

from offload.shown import shown

BUNDLED_TRACE = "conversation_trace.jsonl"

BUNDLED_TRACE_BLOCK_SIZE = 512
"""Tokens per block of the bundled trace: one hash id stands for 512 tokens."""


_MAX_HASH_ID = (1 << 64) - 1
"""Mooncake's hash ids are unsigned 64-bit block ids; vLLM's keys carry them as 8 bytes."""


MAX_LINE_BYTES: Final = 16 * 2**20
"""One request's line: about two million hash ids, where a real request has hundreds."""

MAX_BLOCK_REFS: Final = 2**26
"""Block references in one trace (a few GB held as Python lists): about two hundred times
the largest public Mooncake trace."""

MAX_REQUESTS: Final = 2**26
"""Requests in one trace: each is a list held whether or not it names a block, so a
stream of empty requests (``yes '{"hash_ids": []}'``) is bounded too."""

STDIN: Final = "-"
"""The trace name that reads standard input."""

GZIP_MAGIC: Final = b"\x1f\x8b"
UTF8_BOM: Final = b"\xef\xbb\xbf"
"""Written first by some Windows tools; not JSON, so it is skipped."""


JSON_WHITESPACE: Final = " \t\r\n"
"""What a blank line may hold: str.strip() would also take a form feed, U+00A0 or U+001C
for blank, and skip a line that is no JSON at all."""


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file and line."""


def bundled_trace_path() -> Path:
    """The conversation trace shipped inside the package (see its NOTICE)."""
    return Path(str(resources.files("offload.sim.traces") / BUNDLED_TRACE))


def load_trace(path: str | Path) -> list[list[int]]:
    """Every request's block hashes, in trace order; ``-`` reads standard input.

    Read a line at a time (a pipe such as ``<(zcat trace.gz)`` or ``zcat
    trace.gz | kvscope replay -`` works), each line at most ``MAX_LINE_BYTES``,
    the whole at most ``MAX_BLOCK_REFS`` references in at most
    ``MAX_REQUESTS`` requests: a trace is held in memory whole, so a device or
    a runaway file is refused before it takes the machine's memory.
    """
    if not str(path):
        raise TraceError("trace path is empty")  # Path("") is ".", the working directory
    path = Path(path)
    try:
        with _opened(path) as file:
            mode = os.fstat(file.fileno()).st_mode
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                raise TraceError(_device_refused(path))
            requests = _read_requests(file, shown(path))
    except FileNotFoundError:
        raise TraceError(f"trace file not found: {shown(path)}") from None
    except IsADirectoryError:
        raise TraceError(f"trace path is a directory, not a file: {shown(path)}") from None
    except OSError as exc:
        raise TraceError(f"cannot read trace {shown(path)}: {exc.strerror or exc}") from None
    except MemoryError:
        raise TraceError(f"trace {shown(path)} does not fit in this machine's memory") from None
    if not requests:
        raise TraceError(f"trace {shown(path)} holds no requests")
    if not any(requests):
        raise TraceError(
            f"trace {shown(path)} holds no block references: every 'hash_ids' is empty"
        )
    return requests


def _device_refused(path: Path) -> str:
    """Why a device is no trace; for ``-``, said of standard input, which a terminal or a
    redirect from /dev/null makes one (it was called a path named "-")."""
    if str(path) == STDIN:
        return (
            "- reads standard input, which is a terminal or a device (/dev/null), "
            "not a file or pipe: pipe a trace into it"
        )
    return f"trace path is a device, not a file: {shown(path)}"


def _opened(path: Path) -> BinaryIO:
    """The trace's bytes: the file, or for ``-`` (the convention of Unix tools) standard
    input, which was "trace file not found: -". Closing it closes a duplicate of the
    descriptor, so standard input stays open for the rest of the process."""
    if str(path) == STDIN:
        if sys.stdin is None:  # the process was started with it closed (<&-)
            raise OSError(errno.EBADF, "standard input is closed")
        return os.fdopen(os.dup(sys.stdin.fileno()), "rb")
    return path.open("rb")


def _read_requests(file: BinaryIO, name: str) -> list[list[int]]:
    requests: list[list[int]] = []
    block_refs = 0
    # Lines end at "\n" only (JSON Lines): a lone "\r" is JSON whitespace, and U+2028 or
    # U+0085 may sit inside a JSON string.
    for number, raw in enumerate(iter(lambda: file.readline(MAX_LINE_BYTES + 1), b""), 1):
        where = f"{name}:{number}"
        if number == 1 and raw.startswith(GZIP_MAGIC):
            raise TraceError(
                f"{name} is gzip-compressed: decompress it first (zcat), or pass "
                "<(zcat FILE) as the trace"
            )
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise TraceError(f"{where}: a line longer than {MAX_LINE_BYTES:,} bytes")
        if number == 1:
            raw = raw.removeprefix(UTF8_BOM)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(
                f"{where}: not UTF-8 (byte {exc.start + 1} of the line is 0x{raw[exc.start]:02x})"
            ) from None
        if line.strip(JSON_WHITESPACE):
            hash_ids = _parse_request(line, where)
            block_refs += len(hash_ids)
            if block_refs > MAX_BLOCK_REFS:
                raise TraceError(
                    f"{where}: the trace passes {MAX_BLOCK_REFS:,} block references, the most "
                    "a replay holds; split it"
                )
            if len(requests) == MAX_REQUESTS:
                raise TraceError(
                    f"{where}: the trace passes {MAX_REQUESTS:,} requests, the most a replay "
                    "holds; split it"
                )
            requests.append(hash_ids)
    return requests


class _DuplicateHashIds(Exception):
    """Raised inside the decoder; not a ValueError, which names an overlong number."""


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object, refusing a second ``hash_ids``: JSON leaves which one counts open
    (Python's reader keeps the last, others the first), so either would be a guess."""
    record = dict(pairs)
    if len(record) < len(pairs) and sum(key == "hash_ids" for key, _ in pairs) > 1:
        raise _DuplicateHashIds
    return record


_DECODER: Final = json.JSONDecoder(object_pairs_hook=_object)


def _parse_request(line: str, where: str) -> list[int]:
    try:
        record = _DECODER.decode(line)
    except _DuplicateHashIds:
        raise TraceError(f"{where}: 'hash_ids' given more than once") from None
    except json.JSONDecodeError as exc:
        # Some of json's messages end in "at" already ("Invalid control character at").
        message = exc.msg.removesuffix(" at")
        raise TraceError(
            f"{where}: not valid JSON ({message} {_json_error_place(line, exc.pos)})"
        ) from None
    except RecursionError:
        raise TraceError(f"{where}: JSON nested too deeply") from None
    except ValueError:  # an integer of more digits than Python converts
        raise TraceError(
            f"{where}: a number of more than {sys.get_int_max_str_digits():,} digits"
        ) from None
    if not isinstance(record, dict):
        raise TraceError(f"{where}: expected a JSON object, got {_json_kind(record)}")
    if "hash_ids" not in record:
        raise TraceError(f"{where}: missing 'hash_ids' list")
    hash_ids = record["hash_ids"]
    if not isinstance(hash_ids, list):
        raise TraceError(f"{where}: 'hash_ids' must be a list, got {_json_kind(hash_ids)}")
    if not all(map(_is_hash_id, hash_ids)):
        index, bad = next((i, h) for i, h in enumerate(hash_ids) if not _is_hash_id(h))
        raise TraceError(
            f"{where}: hash_ids[{index}] is {shown(json.dumps(bad), 40)}; hash ids are "
            "integers from 0 to 2**64 - 1"
        )
    return hash_ids


def _json_error_place(line: str, position: int) -> str:
    """Where in its line the JSON reader stopped. Past the last character that is not
    whitespace, the line was cut short (a trace truncated mid-write): json counts the
    line's own newline as the start of a second line and called that column 1."""
    if not line[position:].strip(JSON_WHITESPACE):
        return "at the end of the line: is it cut short?"
    return f"at column {position + 1}"


def _is_hash_id(value: object) -> bool:
    return type(value) is int and 0 <= value <= _MAX_HASH_ID


def _json_kind(value: object) -> str:
    """What JSON calls a decoded value (the trace's author wrote JSON, not Python)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
