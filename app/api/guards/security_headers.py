"""Headers that keep browsers from misusing what the sidecar sends: every response carries them.

The page loads only its own script, style and API (``'self'``), so a strict
Content-Security-Policy costs it nothing and leaves an injected script
nowhere to load from or send to; no site may frame it (clickjacking) or learn
its URL from a Referer; nothing is sniffed into another type. Nor may another
site load an answer as an image, script or ``no-cors`` fetch (the browser
would send the session cookie and put the answer in that site's process), or
keep a handle to a window of the page it opened.
"""

from __future__ import annotations

from typing import Final

from app.api.guards.response_headers import Header, ResponseHeaders

CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEADERS: Final = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
)


class SecurityHeaders(ResponseHeaders):
    """Add ``HEADERS`` to every HTTP response."""

    def headers(self, began: float) -> tuple[Header, ...]:
        return HEADERS
