"""The OpenAPI schema and its pages (Swagger UI, ReDoc), behind the token like the API."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from app.api.deps import require_token

OPENAPI_URL = "/openapi.json"

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_token)])


@router.get(OPENAPI_URL)
def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=_root(request) + OPENAPI_URL, title=f"{request.app.title} - Swagger UI"
    )


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(
        openapi_url=_root(request) + OPENAPI_URL, title=f"{request.app.title} - ReDoc"
    )


def _root(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/")
