"""Schemathesis against the live OpenAPI schema of a running sidecar: every check, bounded.

The sidecar (uvicorn on loopback, a token set, a few events logged) serves
its own /openapi.json; schemathesis reads it and sends generated requests,
valid and invalid, at every operation, 50 examples each with a fixed seed,
running all of its checks: no 5xx, every status and header documented, every
body matching its schema, invalid input refused and valid input accepted, and
the token enforced where the schema declares it. The event stream is left
out: it never ends, so no response to it completes (test_http_streams.py
covers it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.http_app import AUTH, record, serving, sidecar_app

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
SCHEMATHESIS = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
EXAMPLES = 50
SEED = 15
STREAM = "/api/v1/events/stream"


@pytest.mark.skipif(SCHEMATHESIS is None, reason="schemathesis is in the dev extras")
def test_every_operation_meets_its_schema_under_generated_requests(tmp_path: Path) -> None:
    assert SCHEMATHESIS is not None
    app, state = sidecar_app(token=AUTH["Authorization"].removeprefix("Bearer "))
    record(state, events=20)
    # Every operation but the stream: each must have been tested, none skipped for good.
    operations = sum(
        len(methods) for path, methods in app.openapi()["paths"].items() if path != STREAM
    )
    with serving(app) as url:
        done = subprocess.run(
            [SCHEMATHESIS, "run", f"{url}/openapi.json", "--checks", "all",
             "--max-examples", str(EXAMPLES), "--seed", str(SEED),
             "--header", f"Authorization: {AUTH['Authorization']}",
             "--exclude-path", STREAM, "--request-timeout", "30",
             "--report-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=240, cwd=tmp_path,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    tested = f"Tested: {operations}"
    assert " passed" in done.stdout and tested in done.stdout, done.stdout[-3000:]
