"""The web page at "/": static files served by the sidecar itself, behind the token like the API.

No build step and no network fetches: the page is plain HTML, CSS and
JavaScript shipped inside the package, and reads the sidecar's own API. With
a token, a browser opens ``/?token=TOKEN`` once: the answer sets the session
cookie (app/api/session.py) and redirects to ``/``, and the page, its assets,
its API calls and its event stream then carry the cookie, so the token is in
no later URL (nor in the access log, nor in the browser's history).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Final

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, status
from fastapi.responses import FileResponse, RedirectResponse, Response

from app.api.deps import login_token, require_token
from app.api.session import set_session

STATIC_DIR: Final = Path(__file__).resolve().parent.parent / "static"
ASSETS: Final = frozenset({"app.js", "style.css"})
"""Everything under /static: a fixed list, so no request names another file."""


def mount_page(app: FastAPI) -> None:
    """Serve index.html at "/" and the page's assets under "/static"."""
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    def page(request: Request, login: Annotated[str | None, Depends(login_token)]) -> Response:
        if login is None:
            return FileResponse(STATIC_DIR / "index.html")
        root = request.scope.get("root_path", "").rstrip("/")
        redirect = RedirectResponse(root + "/", status.HTTP_303_SEE_OTHER)
        set_session(redirect, login, root + "/")
        return redirect

    @router.get("/static/{name}", dependencies=[Depends(require_token)])
    def asset(name: str) -> FileResponse:
        if name not in ASSETS:
            raise HTTPException(status.HTTP_404_NOT_FOUND, "no such asset")
        return FileResponse(STATIC_DIR / name)

    app.include_router(router)
