"""The page's session cookie: the token exchanged once, so that it leaves the URL.

A browser cannot put the token in a header for a page load or an
EventSource, so the token used to ride in ``?token=`` on every page load and
every stream, and so in every access log line. Now ``/?token=TOKEN`` is
answered with this cookie and a redirect to ``/``: the token crosses the
wire once, and the page, its assets, its API calls and its stream all carry
the cookie. The cookie holds a digest of the token, not the token: a
leaked cookie opens this sidecar only, not whatever else shares the token.
``HttpOnly`` keeps it from scripts, ``SameSite=Strict`` from other sites'
requests (no cross-site request carries it, so it needs no CSRF token).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

from fastapi import Response

COOKIE: Final = "kvscope_session"
_PURPOSE: Final = b"kvscope session cookie v1"


def session_value(token: str) -> str:
    """The cookie's value for ``token``: stable while the token is, useless without it."""
    return hmac.new(token.encode(), _PURPOSE, hashlib.sha256).hexdigest()


def set_session(response: Response, token: str, path: str) -> None:
    response.set_cookie(COOKIE, session_value(token), path=path, httponly=True, samesite="strict")
