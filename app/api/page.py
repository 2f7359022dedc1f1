"""The web page at "/": static files served by the sidecar itself, open without a token.

No build step and no network fetches: the page is plain HTML, CSS and
JavaScript shipped inside the package, and reads the sidecar's own API. It
holds no data, and must load before its script can send the token.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


def mount_page(app: FastAPI) -> None:
    """Serve index.html at "/" and the page's assets under "/static"."""
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")
