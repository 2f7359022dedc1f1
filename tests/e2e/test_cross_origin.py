"""Another site can neither read the sidecar's answers nor reach into its page, in a real browser.

The sidecar serves its page and API to anyone on the network who can reach it,
so a page on another origin that a user of the sidecar visits can point an
image, a script or a ``no-cors`` fetch at it: the browser makes the request,
cookies and all, and the answer lands in that site's process, where a
side channel may read it. ``Cross-Origin-Resource-Policy: same-origin`` makes
the browser refuse every such load. And a page that other site opens kept a
handle back to it (``window.opener``) until ``Cross-Origin-Opener-Policy:
same-origin`` put the two in separate browsing context groups.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support.http_app import serving, sidecar_app

if TYPE_CHECKING:
    from playwright import sync_api

BARE = '<!doctype html><link rel="icon" href="data:,">'
"""A page of the other site (which asks for no favicon of its own)."""

LOADS = (
    BARE
    + """<script>
window.results = {};
const done = (what, how) => () => { window.results[what] = how; };
const img = new Image();
img.onload = done("img", "loaded");
img.onerror = done("img", "refused");
img.src = SIDECAR + "/favicon.ico";
fetch(SIDECAR + "/api/v1/stats", { mode: "no-cors" })
  .then(done("fetch", "loaded"), done("fetch", "refused"));
</script>"""
)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """The other site's requests are no news."""


@contextmanager
def another_site(folder: Path, page: str) -> Iterator[str]:
    """``page`` served as ``/`` by a server of its own on loopback, named ``localhost``: another
    origin than the sidecar's ``127.0.0.1``."""
    (folder / "index.html").write_text(page)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_another_origin_can_load_none_of_the_sidecars_answers(
    page: sync_api.Page, allowed_errors: list[str], tmp_path: Path
) -> None:
    allowed_errors.append("ERR_BLOCKED_BY_RESPONSE")  # the browser says what it refused
    app, _ = sidecar_app()
    with serving(app) as sidecar:
        script = LOADS.replace("SIDECAR", repr(sidecar))
        with another_site(tmp_path, script) as site:
            page.goto(f"{site}/")
            page.wait_for_function("() => Object.keys(window.results).length === 2")
            assert page.evaluate("() => window.results") == {"img": "refused", "fetch": "refused"}
            page.goto(f"{sidecar}/favicon.ico")  # where the sidecar itself is the page: served
            assert page.evaluate("() => document.contentType") == "image/svg+xml"


def test_a_page_another_origin_opens_has_no_handle_back_to_it(
    page: sync_api.Page, tmp_path: Path
) -> None:
    app, _ = sidecar_app()
    with serving(app) as sidecar, another_site(tmp_path, BARE) as site:
        page.goto(f"{site}/")
        with page.context.expect_page() as opened:
            page.evaluate("url => { window.opened = window.open(url); }", f"{sidecar}/")
        popup = opened.value
        popup.wait_for_load_state()
        assert popup.evaluate("() => window.opener === null")
        page.wait_for_function("() => window.opened.closed")  # severed: it sees a closed one
