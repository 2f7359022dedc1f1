"""A query parameter or header a route reads, given twice, over real HTTP on loopback: a 400.

FastAPI read a repeated query parameter's last value and a repeated header's
first, so ``?medium=CPU&medium=GPU`` was answered for GPU alone, and
``Last-Event-ID: 4`` then ``Last-Event-ID: x`` resumed a stream from 4
(app/api/repeated_parameters.py says why either is refused). So did the token
check: of two ``Authorization`` fields or session cookies the first counted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from app.api.session import COOKIE, session_value
from app.decode import DecodedBatch, DecodedEvent
from tests.support.http_app import AUTH, TOKEN, record, serving, sidecar_app
from tests.support.polling import WAIT_S

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
BLOCKS = "/api/v1/blocks"
EVENTS = "/api/v1/events"
STREAM = "/api/v1/events/stream"


@pytest.fixture(scope="module")
def sidecar() -> Iterator[httpx.Client]:
    """A sidecar with a token on loopback: 5 events in the log, blocks 1 to 3 on CPU."""
    app, state = sidecar_app(token=TOKEN)
    record(state, events=5)
    state.index.apply("p", DecodedBatch(1.0, 0, [DecodedEvent("stored", [1, 2, 3], "CPU")]), 1.0)
    with (
        serving(app) as url,
        httpx.Client(base_url=url, headers=AUTH, timeout=WAIT_S) as http,
    ):
        yield http


def query_parameters(http: httpx.Client) -> list[tuple[str, str]]:
    """Every (path, name) of a query parameter a GET route declares, read off the schema."""
    paths = http.get("/openapi.json").json()["paths"]
    return [
        (path, parameter["name"])
        for path, operations in paths.items()
        for parameter in operations.get("get", {}).get("parameters", [])
        if parameter["in"] == "query"
    ]


def refusal(answer: httpx.Response) -> dict[str, object]:
    """The one error of a 400 in the validation errors' shape."""
    assert answer.status_code == 400, answer.text
    (error,) = answer.json()["detail"]
    return error


def stream_readers(http: httpx.Client) -> float:
    metrics = http.get("/metrics").text
    return float(re.search(r"^kvscope_sidecar_sse_clients (\S+)$", metrics, re.M)[1])


def test_every_query_parameter_given_twice_is_a_400_naming_it(sidecar: httpx.Client) -> None:
    declared = query_parameters(sidecar)
    assert len(declared) == 9, declared  # 4 of the listing's, 2 of the events', 3 of history's
    for path, name in declared:
        error = refusal(sidecar.get(path, params=[(name, "1"), (name, "1")]))
        assert error["loc"] == ["query", name], (path, name)
        assert error["type"] == "repeated_parameter" and "once, not 2 times" in error["msg"]
        assert error["input"] == ["1", "1"]


def test_a_filter_given_twice_is_refused_not_answered_for_the_last(sidecar: httpx.Client) -> None:
    """The listing answered ``medium=CPU&medium=GPU`` with GPU's blocks (none) alone."""
    error = refusal(sidecar.get(BLOCKS, params=[("medium", "CPU"), ("medium", "GPU")]))
    assert error["input"] == ["CPU", "GPU"]
    listed = sidecar.get(BLOCKS, params={"medium": "CPU"}).json()["blocks"]
    assert [block["block_hash"] for block in listed] == ["1", "2", "3"]


def test_a_value_given_twice_is_echoed_cut(sidecar: httpx.Client) -> None:
    long = "\x1b[31m" + "x" * 10_000
    answer = sidecar.get(BLOCKS, params=[("publisher", long), ("publisher", long)])
    assert refusal(answer)["loc"] == ["query", "publisher"]
    assert len(answer.content) < 1000


def test_a_last_event_id_given_twice_is_a_400_and_joins_no_stream(sidecar: httpx.Client) -> None:
    """The first was read: ``4`` then ``x`` resumed from 4, where a proxy reading the second
    would have refused the request."""
    for values in (["4", "x"], ["x", "4"], ["4", "4"]):
        headers = [("Last-Event-ID", value) for value in values]
        with sidecar.stream("GET", STREAM, headers=headers) as answer:  # a 200 never ends
            assert answer.status_code == 400, values
            error = refusal(httpx.Response(400, content=answer.read()))
        assert error["loc"] == ["header", "last-event-id"] and error["input"] == values
        assert stream_readers(sidecar) == 0


def test_names_a_route_does_not_read_and_the_token_keep_their_rules(
    sidecar: httpx.Client,
) -> None:
    """Only what the route reads is refused; ``?token=`` takes its first non-empty value."""
    page = sidecar.get(EVENTS, params=[("cursor", "1"), ("cursor", "2"), ("since", "4")])
    assert [event["id"] for event in page.json()["events"]] == [5]
    twice = [("Accept", "application/json"), ("Accept", "text/plain")]
    assert sidecar.get(EVENTS, headers=twice).status_code == 200
    anonymous = httpx.Client(base_url=str(sidecar.base_url), timeout=WAIT_S)
    with (
        anonymous,
        anonymous.stream("GET", STREAM, params=[("token", ""), ("token", TOKEN)]) as opened,
    ):
        assert opened.status_code == 200


def test_a_request_without_the_token_is_a_401_whatever_it_repeats(sidecar: httpx.Client) -> None:
    """The token is checked first, as for a malformed number: what a route reads is told
    only to a client that may call it."""
    with httpx.Client(base_url=str(sidecar.base_url), timeout=WAIT_S) as anonymous:
        for path, name in query_parameters(sidecar):
            answer = anonymous.get(path, params=[(name, "1"), (name, "1")])
            assert answer.status_code == 401, (path, name)
        twice = [("Last-Event-ID", "1"), ("Last-Event-ID", "1")]
        assert anonymous.get(STREAM, headers=twice).status_code == 401


GUARDED = [
    ("GET", "/"),
    ("GET", "/static/app.js"),
    ("GET", "/openapi.json"),
    ("GET", "/metrics"),
    ("GET", "/api/v1/stats"),
    ("GET", "/api/v1/history"),
    ("GET", "/api/v1/insight"),
    ("GET", BLOCKS),
    ("GET", f"{BLOCKS}/1"),
    ("GET", EVENTS),
    ("GET", STREAM),
    ("POST", "/api/v1/lookup"),
]
"""A route of each router that needs the token (the lookup's checks it before its body)."""


def refused_everywhere(
    sidecar: httpx.Client, headers: list[tuple[str, str]]
) -> list[dict[str, object]]:
    """The errors of the 400 each guarded route gives ``headers`` (the same on each)."""
    answers = []
    for method, path in GUARDED:
        with sidecar.stream(method, path, headers=headers, json={"hashes": ["1"]}) as answer:
            assert answer.status_code == 400, (method, path, answer.status_code)
            answers.append(answer.read())
    assert len(set(answers)) == 1, answers
    return httpx.Response(400, content=answers[0]).json()["detail"]


def test_an_authorization_field_given_twice_is_a_400_on_every_guarded_route(
    sidecar: httpx.Client,
) -> None:
    """The first field counted: the right token then a wrong one was let in, where a proxy
    reading the second would have judged an anonymous request. The values stay unechoed;
    the probes, which read no token, answer as before."""
    right, wrong = f"Bearer {TOKEN}", "Bearer wrong"
    for values in ([right, wrong], [wrong, right], [right, right]):
        headers = [("Authorization", value) for value in values]
        (error,) = refused_everywhere(sidecar, headers)
        assert error["loc"] == ["header", "authorization"], values
        assert error["type"] == "repeated_parameter" and "once, not 2 times" in error["msg"]
        assert error["input"] == ["REDACTED", "REDACTED"]
        assert sidecar.get("/healthz", headers=headers).status_code == 200
        assert sidecar.get("/readyz", headers=headers).status_code == 200


def test_a_session_cookie_given_twice_is_a_400_on_every_guarded_route(
    sidecar: httpx.Client,
) -> None:
    """In one ``Cookie`` field or two, and beside a repeated header each is named; one
    header beside one cookie is no repeat."""
    good, stale = f"{COOKIE}={session_value(TOKEN)}", f"{COOKIE}={'0' * 64}"
    for cookies in ([f"{good}; {stale}"], [f"{stale}; other=1; {good}"], [good, good]):
        headers = [("Cookie", field) for field in cookies]
        (error,) = refused_everywhere(sidecar, headers)
        assert error["loc"] == ["cookie", COOKIE], cookies
        assert error["input"] == ["REDACTED", "REDACTED"]
    both = [("Authorization", f"Bearer {TOKEN}")] * 2 + [("Cookie", f"{good}; {good}")]
    assert [error["loc"] for error in refused_everywhere(sidecar, both)] == [
        ["header", "authorization"],
        ["cookie", COOKIE],
    ]
    once_each = [("Authorization", f"Bearer {TOKEN}"), ("Cookie", f"{COOKIE}=x; other=1")]
    assert sidecar.get("/api/v1/stats", headers=once_each).status_code == 200
