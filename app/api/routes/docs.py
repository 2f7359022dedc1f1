"""The OpenAPI schema, behind the token like the API.

No Swagger UI or ReDoc page: both load their code from a CDN (a blank page
offline), and a browser opening them cannot send the bearer token that their
fetch of the schema needs. The schema itself is the documentation; any
OpenAPI viewer reads it.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from app.api.deps import require_token

OPENAPI_URL = "/openapi.json"

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_token)])


@router.get(OPENAPI_URL)
def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())
