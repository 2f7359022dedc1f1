"""What orchestrators call: Prometheus metrics (token required) and the probes (open)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, status
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.deps import UNAUTHORIZED, Metrics, Settings, State, is_authorized, require_token
from app.api.schemas import Liveness, Readiness

router = APIRouter(
    tags=["operations"], dependencies=[Depends(require_token)], responses=UNAUTHORIZED
)
probes = APIRouter(tags=["operations"])
"""Open: orchestrators call the probes without credentials."""


# A plain function, run in the thread pool: its rendering grows with the publishers and it
# waits on SidecarState.lock, neither of which the event loop should wait out. It reads what
# other threads change as it runs (the ingest thread's state; the loop's HTTP counts), as a
# coroutine would too (the ingest thread is no task of the loop), and that is safe because it
# walks no mapping another thread grows: the publishers mapping is replaced, never changed;
# the dicts it iterates (replays by outcome, refused media, HTTP refusals) hold every key from
# the start; the index is read under its lock, the event log, history and curves under
# theirs; stats frames, worker totals and renderings are replaced whole; the paused
# transports are copied first. Two counts read one after the other may be a frame apart.
@router.get("/metrics", response_class=Response)
def metrics(exposition: Metrics) -> Response:
    """Prometheus exposition: every worker's metrics, labelled, and the sidecar's own."""
    return Response(exposition.render(), media_type=CONTENT_TYPE_LATEST)


@probes.get("/healthz", response_model=Liveness, responses={503: {"model": Liveness}})
def healthz(state: State) -> JSONResponse:
    """Liveness: 200 while the process serves and its ingest thread runs, else 503.

    A sidecar whose ingest thread ended (a bug; the log says which) still answers the API
    from a view that no longer moves: only a restart brings it back.
    """
    if state.ingest_stopped:
        return JSONResponse({"status": "ingest stopped"}, status.HTTP_503_SERVICE_UNAVAILABLE)
    return JSONResponse({"status": "ok"})


@probes.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
def readyz(request: Request, state: State, settings: Settings) -> JSONResponse:
    """Readiness: 200 once every publisher has been heard from, else 503 counting the rest.

    Their names (the publishers' addresses) only to a request with the token, when one is set.
    """
    unseen = [name for name, publisher in state.publishers.items() if not publisher.seen]
    named = is_authorized(request, settings)
    body = Readiness(ready=not unseen, unseen_count=len(unseen), unseen=unseen if named else None)
    code = status.HTTP_503_SERVICE_UNAVAILABLE if unseen else status.HTTP_200_OK
    return JSONResponse(body.model_dump(), code)
