"""Errors and number parsing for the offloading settings vLLM hands over.

vLLM's ``kv_connector_extra_config`` arrives loosely typed (often JSON typed
on a command line), so every value is parsed here, with an error naming the
key, before a single byte of the tier is allocated: a typo must fail at
start-up, not as an out-of-memory an hour later. The keys themselves and the
tier's sizing are read by ``offload/vllm/settings.py``.
"""

from __future__ import annotations

import math
import re
from typing import Any

from offload.shown import shown_repr

_DECIMAL = re.compile(r"[+-]?[0-9]+")
_MAX_DIGITS = 30
"""More digits than any count or byte size needs (2**64 has 20); past about 4,300,
``int()`` itself refuses, with a message that names no key."""


class ConfigError(ValueError):
    """A bad offloading setting; the message names the key and what it accepts."""


def positive_int(
    key: str, value: Any, where: str = "kv_connector_extra_config", minimum: int = 1
) -> int:
    """An integer >= ``minimum`` from an int, an integral float or a decimal string."""
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        # ASCII digits only: int() would also take "1_000" and other scripts' digits.
        digits = len(value.strip().lstrip("+-"))
        if digits > _MAX_DIGITS:
            raise ConfigError(f"{where} {key} has {digits} digits: no setting is that large")
        number = int(value.strip())
    if number is None:
        raise ConfigError(f"{where} {key}={shown_repr(value)} is not a whole number")
    if number < minimum:
        raise ConfigError(f"{where} {key}={shown_repr(value)} must be at least {minimum}")
    return number


def whole_bytes(value: Any) -> Any:
    """A finite float of bytes floored, as vLLM's CPU spec floors it; any other value as is.

    vLLM's ``--kv-offloading-size`` is GiB as a float, and vLLM writes it into the extra
    config as float bytes (0.3 GiB: 322122547.2), so a fraction of a byte is vLLM's own
    value, not a typo.
    """
    if isinstance(value, float) and math.isfinite(value):
        return math.floor(value)
    return value
