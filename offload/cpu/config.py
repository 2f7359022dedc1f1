"""Errors and number parsing for the offloading settings vLLM hands over.

vLLM's ``kv_connector_extra_config`` arrives loosely typed (often JSON typed
on a command line), so every value is parsed here, with an error naming the
key, before a single byte of the tier is allocated: a typo must fail at
start-up, not as an out-of-memory an hour later. The keys themselves and the
tier's sizing are read by ``offload/vllm/settings.py``.
"""

from __future__ import annotations

import math
from typing import Any

from offload.decimal_text import NEGATIVE_ZERO, is_negative_zero, whole_number
from offload.shown import shown_repr


class ConfigError(ValueError):
    """A bad offloading setting; the message names the key and what it accepts."""


def positive_int(
    key: str,
    value: Any,
    where: str = "kv_connector_extra_config",
    minimum: int = 1,
    *,
    floor: bool = False,
) -> int:
    """An integer >= ``minimum`` from an int, an integral float or a string of digits; with
    ``floor``, any finite float, floored.

    ``floor`` is for byte sizes: vLLM's ``--kv-offloading-size`` is GiB as a
    float, and vLLM writes it into the extra config as float bytes (0.3 GiB:
    322122547.2), floored where it is read, so a fraction of a byte is vLLM's
    own value, not a typo. The bound is checked on the floored number but an
    error names the value given (``-1.5``, not the ``-2`` it floors to).

    A string is read by kvscope's one rule for numbers in text
    (``offload/decimal_text.py``), as the sidecar reads its ``KVSCOPE_*``
    variables: ``int()`` would also take ``" 32 "``, ``"+32"``, ``"0032"``,
    ``"3_2"`` and other scripts' digits, and past about 4,300 digits it fails
    with a message that names no key.
    """
    number: int | None = None
    if isinstance(value, float) and is_negative_zero(value):  # refused as the text "-0" is
        raise ConfigError(
            f"{where} {key}={shown_repr(value)} is not a whole number: {NEGATIVE_ZERO}"
        )
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and (value.is_integer() or (floor and math.isfinite(value))):
        number = math.floor(value)
    elif isinstance(value, str):
        try:
            number = whole_number(value)
        except ValueError as exc:
            raise ConfigError(
                f"{where} {key}={shown_repr(value)} is not a whole number: {exc}"
            ) from None
    if number is None:
        raise ConfigError(f"{where} {key}={shown_repr(value)} is not a whole number")
    if number < minimum:
        raise ConfigError(f"{where} {key}={shown_repr(value)} must be at least {minimum}")
    return number
