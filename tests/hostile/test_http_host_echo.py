"""No response header of the sidecar carries the Host a request gave, on real uvicorn on loopback.

Bound to all addresses (``0.0.0.0``, the image's default) the sidecar serves every
name, so the Host check lets any through. Starlette's trailing-slash redirect then
built its ``Location`` from that Host: ``GET /api/v1/stats/`` with ``Host: evil.example``
was a 307 to ``http://evil.example/api/v1/stats``, a link a cache or a page could
hand to the next client.
"""

from __future__ import annotations

import httpx
import pytest

from tests.support.http_app import AUTH, TOKEN, serving, sidecar_app

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

HOSTS = ("evil.example", "evil.example:8000", "[::1]evil.example")
REQUESTS = (
    ("GET", "/api/v1/stats/"),
    ("GET", "/api/v1/blocks/"),
    ("POST", "/api/v1/lookup/"),
    ("GET", "/metrics/"),
    ("GET", "/static"),
    ("GET", "/healthz/"),
    ("GET", "/nothing/here/"),
    ("GET", f"/?token={TOKEN}"),
    ("GET", "/"),
)


@pytest.mark.parametrize("authorised", [True, False], ids=["token", "no token"])
def test_no_host_a_request_gives_reaches_a_response_header(authorised: bool) -> None:
    app, _ = sidecar_app(host="0.0.0.0", token=TOKEN)
    headers = AUTH if authorised else {}
    with serving(app) as url, httpx.Client(base_url=url, follow_redirects=False) as http:
        for host in HOSTS:
            for method, path in REQUESTS:
                answer = http.request(method, path, headers={**headers, "Host": host})
                echoed = [(k, v) for k, v in answer.headers.items() if "evil" in v.lower()]
                assert echoed == [], (host, method, path, answer.status_code)
                assert answer.status_code != 307, (host, method, path)


def test_a_path_with_a_slash_too_many_is_a_404_not_a_redirect() -> None:
    app, _ = sidecar_app(token=TOKEN)
    with serving(app) as url, httpx.Client(base_url=url, headers=AUTH) as http:
        assert http.get("/api/v1/stats").status_code == 200
        slashed = http.get("/api/v1/stats/")
        assert (slashed.status_code, "location" in slashed.headers) == (404, False)
        login = http.get("/", params={"token": TOKEN}, follow_redirects=False)
        assert (login.status_code, login.headers["location"]) == (303, "/")
