"""Block hashes as text: one rule, round-tripping, for ints and bytes alike.

An int is written in decimal (``"12345"``, ``"-7"``); bytes as ``0x`` and
lower-case hex. Text reads as an int when it is written so: ASCII digits with
no leading zero, at most ``MAX_DIGITS`` of them (a 64-bit hash, the widest
the wire carries), after an optional ``-`` (offload/decimal_text.py); as bytes
when it is ``0x`` and an even number (two or more) of hex digits, or exactly 64
hex digits (a sha256 hash as vLLM logs it). Ints travel as strings because
64-bit hashes exceed what JavaScript numbers hold exactly.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import AfterValidator, Field, PlainValidator, StrictInt, WithJsonSchema
from pydantic_core import PydanticCustomError

from app.api.json_body import LongInteger
from offload.decimal_text import MAX_DIGITS, POSITIVE_PATTERN

MAX_HASH_TEXT: Final = 2 + 2 * 128
"""Longest hash text: 0x and a 128-byte hash (vLLM's are 32 bytes). Checked before the
patterns run, and bounds the text an error echoes."""

BLOCK_HASH_PARSING: Final = "block_hash_parsing"
"""The error type of text that is no block hash."""

_INT_TEXT = re.compile(rf"0|-?(?:{POSITIVE_PATTERN})")
_HEX_TEXT = re.compile(r"(?:0[xX](?:[0-9a-fA-F]{2})+|[0-9a-fA-F]{64})")


def parse_block_hash(text: str) -> bytes | int:
    """Read a hash written by ``render_block_hash`` (see the module doc for the rule)."""
    if len(text) <= MAX_HASH_TEXT:
        if _INT_TEXT.fullmatch(text):
            return int(text)
        if _HEX_TEXT.fullmatch(text):
            return bytes.fromhex(text.removeprefix("0x").removeprefix("0X"))
    raise PydanticCustomError(
        BLOCK_HASH_PARSING,
        "Input is not a block hash: use decimal digits for an int hash (at most {digits}, "
        "an optional '-', no leading zero), or 0x and an even number of hex digits (or "
        "exactly 64 hex digits) for a bytes hash, at most {length} characters",
        {"digits": MAX_DIGITS, "length": MAX_HASH_TEXT},
    )


def render_block_hash(block_hash: object) -> str:
    return "0x" + block_hash.hex() if isinstance(block_hash, bytes) else str(block_hash)


_EXACT_IN_A_DOUBLE: Final = 2**53


def _hash_input(value: object) -> bytes | int:
    """A hash in a JSON body, by exact type (as JSON gives it): one Python call per item, where
    a union of pydantic's types and a check of the integers' length took two.

    A number with a zero fraction (``5.0``) is the integer it equals, as JSON Schema counts
    it one (clients and schemathesis send it for the schema's ``integer``), while a double
    holds every integer up to it exactly (2**53); past that it may not be what was written."""
    if type(value) is int:  # not bool, as pydantic's StrictInt
        return value
    if type(value) is str:
        return parse_block_hash(value)
    if type(value) is float and value.is_integer() and abs(value) <= _EXACT_IN_A_DOUBLE:
        return int(value)
    if type(value) is LongInteger:  # the body's reader left it unconverted (app/api/json_body.py)
        raise PydanticCustomError(
            BLOCK_HASH_PARSING,
            "Input is a JSON integer of {digits} digits: an int block hash has at most {most}",
            {"digits": len(value.lstrip("-")), "most": MAX_DIGITS},
        )
    raise PydanticCustomError(
        "block_hash_type", "Input should be a block hash: a JSON integer or a string"
    )


_HashText = Annotated[
    str,
    WithJsonSchema(
        {
            "type": "string",
            "maxLength": MAX_HASH_TEXT,
            "pattern": rf"^(?:{_INT_TEXT.pattern}|{_HEX_TEXT.pattern})$",
            "description": "Decimal digits (an int hash), or 0x and hex digits (bytes).",
        }
    ),
]
"""The schema states the rule (a client can check text before sending it); the
validator below applies it, with a message saying what a hash looks like."""

BlockHashText = Annotated[_HashText, AfterValidator(parse_block_hash)]
"""A hash given as text (a path parameter), parsed to int or bytes."""

_PAST_WIDEST: Final = 10**MAX_DIGITS
_HashInteger = Annotated[StrictInt, Field(gt=-_PAST_WIDEST, lt=_PAST_WIDEST)]
"""The schema's JSON integer: at most ``MAX_DIGITS`` digits, as ``_hash_input`` reads. Bounds
written exclusive, 1e20 itself, which a double holds exactly (99999999999999999999 it rounds
up to 1e20, so a client comparing in doubles would take 1e20 for within)."""

BlockHashInput = Annotated[
    bytes | int, PlainValidator(_hash_input, json_schema_input_type=_HashInteger | _HashText)
]
"""A hash in a JSON body: a JSON integer of at most ``MAX_DIGITS`` digits, or text by the
same rule."""
