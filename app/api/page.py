"""The web page at "/": static files served by the sidecar itself, behind the token like the API.

No build step and no network fetches: the page is plain HTML, CSS and native
ES modules shipped inside the package, plus uPlot (its charts), which
``make vendor`` copies from npm into ``static/vendor/`` with its licence; the
page reads the sidecar's own API. With a token, a browser opens
``/?token=TOKEN`` once: the answer sets the session cookie
(app/api/session.py) and redirects to ``/``, and the page, its assets, its
API calls and its event stream then carry the cookie, so the token is in no
later URL (nor in the access log, nor in the browser's history).

The files served are a list fixed when the app is built (the page's own files
found in the package, and the vendored ones by name): a request names one of
them or gets a 404, so no request reaches another file. They are read into
memory then, with an ETag each: a page load's burst of module requests costs
the sidecar no file system call, and a reload only revalidates.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Annotated, Final

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, status
from fastapi.responses import PlainTextResponse, RedirectResponse, Response

from app.api.deps import login_token, require_token
from app.api.entity_tags import not_modified
from app.api.session import set_session

log = logging.getLogger(__name__)

STATIC_DIR: Final = Path(__file__).resolve().parent.parent / "static"
VENDORED: Final = ("vendor/uPlot.iife.min.js", "vendor/uPlot.min.css", "vendor/LICENSE")
"""What ``make vendor`` copies from npm's uPlot package: the page cannot draw without them."""
VENDOR_COMMAND: Final = "make vendor (npm ci --ignore-scripts, then a copy into app/static/vendor/)"
OWN_SUFFIXES: Final = frozenset({".js", ".css", ".svg"})
MEDIA_TYPES: Final = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    "": "text/plain; charset=utf-8",  # the vendored LICENSE
}
"""Stated, not guessed from the host's MIME table: module scripts need a JavaScript type."""
REVALIDATE: Final = {"Cache-Control": "no-cache"}
"""Cached but checked (ETag) on every load, so an upgraded sidecar never mixes old modules in."""
FAVICON: Final = "favicon.svg"


def page_assets(static_dir: Path) -> frozenset[str]:
    """The names served under /static: the page's own files and the vendored ones."""
    own = (
        path.relative_to(static_dir).as_posix()
        for path in static_dir.rglob("*")
        if path.suffix in OWN_SUFFIXES and "vendor" not in path.relative_to(static_dir).parts
    )
    return frozenset({*own, *VENDORED})


def missing_vendored(static_dir: Path = STATIC_DIR) -> list[str]:
    """The vendored files absent from ``static_dir`` (none once ``make vendor`` ran)."""
    return [name for name in VENDORED if not (static_dir / name).is_file()]


class Asset:
    """One file's bytes, media type and ETag, read once."""

    __slots__ = ("body", "etag", "media_type")

    def __init__(self, path: Path) -> None:
        self.body = path.read_bytes()
        self.etag = f'"{hashlib.sha256(self.body).hexdigest()[:32]}"'
        self.media_type = MEDIA_TYPES.get(path.suffix, "text/html; charset=utf-8")

    def response(self, request: Request) -> Response:
        headers = {**REVALIDATE, "ETag": self.etag}
        if not_modified(request.headers.getlist("if-none-match"), self.etag):
            return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
        return Response(self.body, media_type=self.media_type, headers=headers)


def mount_page(app: FastAPI, static_dir: Path = STATIC_DIR) -> None:
    """Serve index.html at "/", the page's assets under "/static", and the favicon.

    Without the vendored files the page cannot draw: start-up logs an error
    naming them and the command that makes them, and "/" answers a 500 that
    says the same, rather than a page that fails in the browser.
    """
    router = APIRouter(include_in_schema=False)
    assets = {
        name: Asset(static_dir / name)
        for name in page_assets(static_dir)
        if (static_dir / name).is_file()
    }
    index = Asset(static_dir / "index.html")
    missing = missing_vendored(static_dir)
    if missing:
        log.error("%s", _missing_text(static_dir, missing))

    @router.get("/")
    async def page(
        request: Request, login: Annotated[str | None, Depends(login_token)]
    ) -> Response:
        if login is None:
            if missing:
                return PlainTextResponse(_missing_text(static_dir, missing), 500)
            return index.response(request)
        root = request.scope.get("root_path", "").rstrip("/")
        redirect = RedirectResponse(root + "/", status.HTTP_303_SEE_OTHER)
        set_session(redirect, login, root + "/")
        return redirect

    @router.get("/static/{name:path}", dependencies=[Depends(require_token)])
    async def asset(name: str, request: Request) -> Response:
        found = assets.get(name)
        if found is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, "no such asset")
        return found.response(request)

    @router.get("/favicon.ico")
    async def favicon(request: Request) -> Response:
        """Open, unlike the page: browsers ask for it without the cookie (on a 401 page too),
        and a picture of a magnifier tells no one anything."""
        return assets[FAVICON].response(request)

    app.include_router(router)


def _missing_text(static_dir: Path, missing: list[str]) -> str:
    names = ", ".join(str(static_dir / name) for name in missing)
    return (
        f"kvscope's web page is missing its vendored files: {names}; "
        f"run {VENDOR_COMMAND} and restart the sidecar"
    )
