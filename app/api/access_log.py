"""Access-log lines with nothing secret and nothing long: the token redacted, the target cut.

uvicorn logs every request's target with its query string, and a target is
whatever the client sent: ``?token=`` put the bearer token in the log on
every page load, and a target may be kilobytes long. ``REDACT`` rewrites a
record's target before any handler sees it: every ``token=`` value becomes
``REDACTED``, and a target over ``MAX_TARGET_CHARS`` is cut.
"""

from __future__ import annotations

import logging
from typing import Final
from urllib.parse import unquote_plus

ACCESS_LOGGER: Final = "uvicorn.access"
MAX_TARGET_CHARS: Final = 300
_TARGET_ARG: Final = 2
"""uvicorn's access record args: (client, method, target, http version, status)."""


def redact_target(target: str) -> str:
    """``target`` with every ``token=`` value redacted, cut to ``MAX_TARGET_CHARS``.

    A parameter is a token by its decoded name, as the server reads it
    (``%74oken=`` names ``token`` too).
    """
    path, question, query = target.partition("?")
    if question:
        parts = [_redacted(part) for part in query.split("&")]
        target = path + question + "&".join(parts)
    return target if len(target) <= MAX_TARGET_CHARS else target[:MAX_TARGET_CHARS] + "..."


def _redacted(parameter: str) -> str:
    name, equals, _value = parameter.partition("=")
    return name + "=REDACTED" if equals and unquote_plus(name) == "token" else parameter


class RedactTargets(logging.Filter):
    """Redact the target in uvicorn's access records (others pass unchanged)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) > _TARGET_ARG and isinstance(args[2], str):
            record.args = (*args[:_TARGET_ARG], redact_target(args[2]), *args[_TARGET_ARG + 1 :])
        return True


REDACT: Final = RedactTargets()


def redact_access_log() -> None:
    """Install ``REDACT`` on uvicorn's access logger, once (after uvicorn configured logging)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if REDACT not in logger.filters:
        logger.addFilter(REDACT)
