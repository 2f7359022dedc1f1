"""Hostile requests to the HTTP API, in process: each is refused with a 4xx naming why, never a 500.

Issue 15's HTTP items that need no server: bodies past the limit (item 5;
that the limit stops the reading is shown on a socket, in test_http_streams.py),
ids past any id (8), non-finite numbers (9), and what the token, the Host
check and the response headers guard (14). fastapi's TestClient drives a real
app over a real state (tests/support/http_app.py); the stream and the access
log, which need a real server, are in test_http_streams.py.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.api.guards.security_headers import HEADERS
from app.api.hash_text import MAX_HASH_TEXT
from app.api.limits import HttpLimits
from app.api.schemas import MAX_LOOKUP_HASHES
from app.decode import DecodedBatch, DecodedEvent
from tests.support.http_app import AUTH, TOKEN, in_process, record, serving, sidecar_app

pytestmark = pytest.mark.timeout(120)
LOOKUP = "/api/v1/lookup"
JSON = {"Content-Type": "application/json"}


def refused(metrics: str, reason: str) -> float:
    """``kvscope_sidecar_http_refused_total{reason=...}`` from an exposition."""
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "kvscope_sidecar_http_refused_total" and sample.labels == {
                "reason": reason
            }:
                return sample.value
    raise AssertionError(f"no refusals counted for {reason}")


def strict_json(text: str) -> Any:
    """Parse as strict JSON: NaN and the infinities are not JSON."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} in a response body")

    return json.loads(text, parse_constant=refuse)


# --- item 5: the body limit, enforced while reading, and bounded lists ------------------


def test_a_body_over_the_limit_is_a_413_counted_declared_or_streamed() -> None:
    app, _ = sidecar_app(HttpLimits(max_body_bytes=1000))
    with in_process(app) as http:
        body = json.dumps({"block_hashes": ["1" * 200] * 10}).encode()  # 2 KB of valid hashes
        declared = http.post(LOOKUP, content=body, headers=JSON)
        assert declared.status_code == 413
        assert declared.json() == {
            "detail": "request body larger than 1000 bytes, the sidecar's limit"
        }

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts as it reads
            for start in range(0, len(body), 100):
                yield body[start : start + 100]

        streamed = http.post(LOOKUP, content=chunks(), headers=JSON)
        assert streamed.status_code == 413 and "1000 bytes" in streamed.json()["detail"]
        assert http.post(LOOKUP, json={"block_hashes": ["1", "2"]}).status_code == 200
        assert refused(http.get("/metrics").text, "body_too_large") == 2


def test_lookup_lists_and_hash_texts_are_bounded_and_say_so_in_the_schema() -> None:
    app, _ = sidecar_app()
    with in_process(app) as http:
        too_many = http.post(LOOKUP, json={"block_hashes": [1] * (MAX_LOOKUP_HASHES + 1)})
        assert too_many.status_code == 422
        assert too_many.json()["detail"][0]["type"] == "too_long"
        assert len(too_many.text) < 2000, "the 422 echoed the whole list"
        long_text = http.post(LOOKUP, json={"block_hashes": ["1" * (MAX_HASH_TEXT + 1)]})
        assert long_text.status_code == 422 and len(long_text.text) < 2000
        assert http.post(LOOKUP, json={"block_hashes": ["0x" + "ab" * 128]}).status_code == 200
        assert http.get("/api/v1/blocks/" + "1" * (MAX_HASH_TEXT + 1)).status_code == 400
        schema = http.get("/openapi.json").json()["components"]["schemas"]["LookupRequest"]
        hashes = schema["properties"]["block_hashes"]
        assert hashes["maxItems"] == MAX_LOOKUP_HASHES
        text = next(kind for kind in hashes["items"]["anyOf"] if kind["type"] == "string")
        assert (text["maxLength"], text["pattern"].startswith("^")) == (MAX_HASH_TEXT, True)


# --- item 8: ids past any id ------------------------------------------------------------


def test_events_since_an_id_past_any_id_is_an_empty_page_a_422_or_a_400_never_a_500() -> None:
    app, state = sidecar_app()
    record(state, events=3)
    with in_process(app) as http:
        for since in (3, 2**40, 2**63 - 1):
            page = http.get("/api/v1/events", params={"since": since})
            assert page.status_code == 200, since
            assert page.json() == {"events": [], "first_id": 1, "last_id": 3}
        assert http.get("/api/v1/events", params={"since": "9" * 20}).status_code == 422
        for since in ("9" * 5000, "-1", "1e3"):  # no number in its form (test_http_numbers.py)
            assert http.get("/api/v1/events", params={"since": since}).status_code == 400, since
        stream = "/api/v1/events/stream"
        too_far = http.get(stream, headers={"Last-Event-ID": "99999999999999999999"})
        assert too_far.status_code == 422


# --- item 9: numbers strict JSON cannot carry ----------------------------------------


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_a_non_finite_number_in_a_body_is_a_422_in_strict_json(number: str) -> None:
    app, _ = sidecar_app()
    with in_process(app) as http:
        for body in (f'{{"block_hashes": [{number}]}}', f'{{"block_hashes": {number}}}'):
            answer = http.post(LOOKUP, content=body, headers=JSON)
            assert answer.status_code == 422, body
            detail = strict_json(answer.text)["detail"]
            assert detail[0]["loc"][:2] == ["body", "block_hashes"], body


def test_a_422_echoes_at_most_a_little_of_what_was_sent() -> None:
    app, _ = sidecar_app()
    with in_process(app) as http:
        bad = http.post(LOOKUP, json={"block_hashes": ["1", "nope", "z" * MAX_HASH_TEXT]})
        assert bad.status_code == 422
        errors = bad.json()["detail"]
        assert errors[0]["loc"] == ["body", "block_hashes", 1]
        assert errors[0]["input"] == "nope" and "is not a block hash" in errors[0]["msg"]
        assert all(len(json.dumps(error["input"])) < 250 for error in errors)
        nested = http.post(LOOKUP, json={"block_hashes": {"deep": ["x" * 1000] * 100}})
        assert nested.status_code == 422 and len(nested.text) < 2000


@pytest.mark.parametrize(
    "body",
    [
        '{"block_hashes": ["1", "\\ud800"]}',
        '{"block_hashes": "\\udfff"}',
        '{"block_hashes": [["\\ud800x"]]}',
        '{"block_hashes": {"\\ud800": 1}}',
    ],
)
def test_a_lone_surrogate_in_a_body_is_echoed_escaped_in_a_422(body: str) -> None:
    """JSON's \\ud800 escape reads as a string UTF-8 cannot write: the 422 was a 500."""
    app, _ = sidecar_app()
    with in_process(app) as http:
        answer = http.post(LOOKUP, content=body, headers=JSON)
        assert answer.status_code == 422, answer.text
        shown = json.dumps(strict_json(answer.text)["detail"])
        assert "ud800" in shown or "udfff" in shown
        assert http.post(LOOKUP, json={"block_hashes": ["1"]}).status_code == 200


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "application/octet-stream", ";;="],
)
def test_a_body_not_labelled_as_json_is_a_415_saying_so_and_echoing_nothing(
    content_type: str | None,
) -> None:
    """FastAPI handed such a body's bytes to the model unread: a JSON object sent by
    ``curl -d`` (a form's type) was a 422 saying it should be "a valid dictionary or object",
    echoing it, and bytes that are not UTF-8 were first a 500 that logged the whole body."""
    app, _ = sidecar_app()
    headers = {} if content_type is None else {"Content-Type": content_type}
    with in_process(app) as http:
        for body in (b'{"block_hashes": ["1"]}', b"\xff\xfe" + b"x" * 100_000):
            answer = http.post(LOOKUP, content=body, headers=headers)
            assert answer.status_code == 415, answer.text
            assert answer.json() == {
                "detail": "the body is not labelled as JSON (its Content-Type is missing or "
                "another type); send it with Content-Type: application/json"
            }
        assert http.post(LOOKUP, headers=headers).json()["detail"][0]["type"] == "missing"


def test_a_body_labelled_as_any_json_type_is_read() -> None:
    app, _ = sidecar_app()
    with in_process(app) as http:
        for content_type in ("application/json; charset=utf-8", "application/vnd.kv+json"):
            sent = http.post(
                LOOKUP, content=b'{"block_hashes": ["1"]}', headers={"Content-Type": content_type}
            )
            assert sent.json() == {"runs": {}, "break_index": 0}, content_type


@pytest.mark.parametrize(
    ("body", "headers", "problem"),
    [
        (b'{"block_hashes": ["\xff"]}', {}, "the body is not UTF-8 (byte 19 is not)"),
        (gzip.compress(b'{"block_hashes": ["1"]}'), {"Content-Encoding": "gzip"}, "uncompressed"),
        (b'{"block_hashes": ["1"]}', {"Content-Encoding": "gzip"}, "uncompressed"),
        (b'{"block_hashes": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}, "nested too deeply"),
    ],
    ids=["not utf-8", "gzip", "labelled gzip, sent plain", "nested"],
)
def test_a_json_body_that_cannot_be_read_is_a_400_naming_why(
    body: bytes, headers: dict[str, str], problem: str
) -> None:
    app, _ = sidecar_app()
    with in_process(app) as http:
        answer = http.post(LOOKUP, content=body, headers={**JSON, **headers})
        assert answer.status_code == 400
        assert problem in answer.json()["detail"]
        assert http.get("/api/v1/blocks/12345").status_code == 404  # other errors as before


@pytest.mark.parametrize(
    ("digits", "encoding"),
    [(21, "utf-8"), (4300, "utf-8"), (5000, "utf-8"), (100_000, "utf-8"), (30, "utf-16")],
)
def test_a_json_integer_of_more_digits_than_a_hash_is_a_422_naming_its_place(
    digits: int, encoding: str
) -> None:
    """A JSON integer had no digit limit (Python reads 4,300), while the same number as text
    was refused past 20: it is refused as the text is, naming the list item, and unread.
    Python's reader takes UTF-16 too, whose digits are no run of bytes."""
    app, state = sidecar_app()
    state.index.apply("p", DecodedBatch(0.0, None, [DecodedEvent("stored", [1, 2], "CPU")]), 0.0)
    long = "9" * digits
    body = f'{{"block_hashes": [1, 2, -{long}, {long}]}}'.encode(encoding)
    with in_process(app) as http:
        answer = http.post(LOOKUP, content=body, headers=JSON)
        assert answer.status_code == 422
        errors = answer.json()["detail"]
        assert [error["loc"] for error in errors] == [["body", "block_hashes", i] for i in (2, 3)]
        assert {error["msg"] for error in errors} == {
            f"Input is a JSON integer of {digits} digits: an int block hash has at most 20"
        }
        assert all(len(error["input"]) <= 203 for error in errors)  # cut, as text is
        widest = b'{"block_hashes": [1, 2, -99999999999999999999, 99999999999999999999]}'
        assert http.post(LOOKUP, content=widest, headers=JSON).json() == {
            "runs": {"CPU": 2},
            "break_index": 2,
        }


def test_an_item_that_is_no_integer_or_string_is_one_error_naming_it() -> None:
    """Each item was read as a union of an int and a string, so ``true`` made two errors
    whose ``loc`` ended in the union's member names (``int``, ``str``). A number with a zero
    fraction is an integer to JSON Schema, and read as one while a double holds it exactly."""
    app, state = sidecar_app()
    state.index.apply("p", DecodedBatch(0.0, None, [DecodedEvent("stored", [1, 2], "CPU")]), 0.0)
    with in_process(app) as http:
        body = b'{"block_hashes": [1, true, 1.5, null, [1], {"a": 1}, "2", 1e19]}'
        errors = http.post(LOOKUP, content=body, headers=JSON).json()["detail"]
        zero_fraction = http.post(LOOKUP, content=b'{"block_hashes": [1.0, 2e0]}', headers=JSON)
    assert [(error["loc"], error["type"]) for error in errors] == [
        (["body", "block_hashes", i], "block_hash_type") for i in (1, 2, 3, 4, 5, 7)
    ]
    assert errors[0]["msg"] == "Input should be a block hash: a JSON integer or a string"
    assert zero_fraction.json() == {"runs": {"CPU": 2}, "break_index": 2}


def test_a_content_encoding_in_any_of_its_fields_refuses_the_body() -> None:
    """Only the first ``Content-Encoding`` field was read: ``identity`` ahead of ``gzip``
    took a body labelled compressed for plain JSON."""
    app, _ = sidecar_app()
    body = b'{"block_hashes": ["1"]}'
    with in_process(app) as http:
        for codings in (["identity", "gzip"], ["gzip", "identity"], ["identity", ""]):
            fields = [("Content-Type", "application/json")]
            fields += [("Content-Encoding", coding) for coding in codings]
            answer = http.post(LOOKUP, content=body, headers=fields)
            assert answer.status_code == 400, codings
            assert "uncompressed" in answer.json()["detail"]
        plain = [("Content-Type", "application/json"), *[("Content-Encoding", "identity")] * 2]
        assert http.post(LOOKUP, content=body, headers=plain).status_code == 200


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (b'{"block_hashes": ["1"], "block_hashes": ["2", "3"]}', "'block_hashes'"),
        (b'{"block_hashes": [{"a": 1, "a": 2}]}', "'a'"),
        (b'{"\\u001b[31m\\n": 1, "\\u001b[31m\\n": 2}', "'\\x1b[31m\\n'"),
    ],
    ids=["top level", "nested", "escaped"],
)
def test_a_body_giving_a_key_twice_is_a_400_naming_it(body: bytes, key: str) -> None:
    """JSON leaves which of two equal keys counts open: the sidecar kept the last, so
    `{"block_hashes": [A], "block_hashes": [B]}` was answered for B where a proxy that read
    the first would have checked A."""
    app, state = sidecar_app()
    state.index.apply("p", DecodedBatch(0.0, None, [DecodedEvent("stored", [1, 2, 3], "CPU")]), 0.0)
    with in_process(app) as http:
        answer = http.post(LOOKUP, content=body, headers=JSON)
        assert answer.status_code == 400
        assert answer.json() == {
            "detail": f"the body's JSON gives the key {key} twice in one object; JSON leaves "
            "which one counts open, so send it once"
        }
        once = http.post(LOOKUP, content=b'{"block_hashes": ["1", "2", "3"]}', headers=JSON)
        assert once.json() == {"runs": {"CPU": 3}, "break_index": 3}


# --- item 14: the token, the Host, HEAD, the headers and the documentation ------------


def test_with_a_token_the_page_and_its_assets_need_it_too() -> None:
    app, _ = sidecar_app(token=TOKEN)
    with in_process(app) as http:
        for path in ("/", "/static/app.js", "/static/style.css", "/openapi.json"):
            assert http.get(path).status_code == 401, path
            assert http.get(path, headers=AUTH).status_code == 200, path
        for path in ("/healthz", "/readyz"):
            assert http.get(path).status_code == 200, path


@pytest.mark.parametrize(
    "body",
    [
        b'{"block_hashes": [1',
        b"\xff",
        b'{"block_hashes": [1], "block_hashes": [2]}',
        b'{"block_hashes": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"block_hashes": [1]}',
    ],
    ids=["no json", "not utf-8", "key twice", "nested", "well formed"],
)
def test_a_lookup_without_the_token_is_a_401_whatever_its_body(body: bytes) -> None:
    """FastAPI reads a JSON body before any dependency runs, the token's included: a body
    that was no JSON was a 422, one that was no UTF-8 or gave a key twice a 400 naming the
    key, to a client without the token, and the sidecar parsed its body for it."""
    app, _ = sidecar_app(token=TOKEN)
    with serving(app) as url, httpx.Client(base_url=url) as http:
        for credentials in ({}, {"Authorization": "Bearer wrong"}):
            answer = http.post(LOOKUP, content=body, headers={**JSON, **credentials})
            assert answer.status_code == 401, answer.text
            assert answer.headers["www-authenticate"].startswith("Bearer")
            assert "block_hashes" not in answer.text and "body" not in answer.text
        assert http.post(LOOKUP, content=body, headers={**JSON, **AUTH}).status_code != 401


def test_readyz_counts_unseen_publishers_but_names_them_only_with_the_token() -> None:
    app, _ = sidecar_app(token=TOKEN, connect=["tcp://10.1.2.3:5557"])
    with in_process(app) as http:
        anonymous = http.get("/readyz")
        assert (anonymous.status_code, anonymous.json()) == (
            503,
            {"ready": False, "unseen_count": 1, "unseen": None},
        )
        assert "10.1.2.3" not in anonymous.text
        named = http.get("/readyz", headers=AUTH).json()
        assert named["unseen"] == ["tcp://10.1.2.3:5557"]


def test_the_schema_declares_how_to_authenticate_and_every_401() -> None:
    app, _ = sidecar_app(token=TOKEN)
    with in_process(app) as http:
        schema = http.get("/openapi.json", headers=AUTH).json()
    schemes = schema["components"]["securitySchemes"]
    assert schemes["HTTPBearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "`Authorization: Bearer <token>`.",
    }
    assert schemes["APIKeyCookie"]["in"] == "cookie" and schemes["APIKeyQuery"]["in"] == "query"
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            probe = path in ("/healthz", "/readyz")
            assert ("security" in operation) != probe, (method, path)
            assert ("401" in operation["responses"]) != probe, (method, path)
    stream = schema["paths"]["/api/v1/events/stream"]["get"]
    assert {"APIKeyQuery": []} in stream["security"]
    assert {"APIKeyQuery": []} not in schema["paths"]["/api/v1/stats"]["get"]["security"]


def test_every_response_carries_the_browser_security_headers() -> None:
    app, _ = sidecar_app(token=TOKEN)
    too_large = b"x" * (HttpLimits().max_body_bytes + 1)
    with in_process(app) as http:
        answers = [
            http.get("/", headers=AUTH),
            http.get("/static/app.js", headers=AUTH),
            http.get("/api/v1/stats"),  # a 401
            http.get("/healthz"),
            http.get("/healthz", headers={"Host": "elsewhere.example"}),
            http.post(LOOKUP, content=too_large, headers=AUTH),  # a 413
        ]
        answers.append(http.get("/api/v1/stats", headers={**AUTH, "Host": "evil.example"}))
    for answer in answers:
        for name, value in HEADERS:
            assert answer.headers[name.decode()] == value.decode(), (answer.url, name)
        # the sidecar's own time, refusals included, and nothing else
        assert re.fullmatch(r"app;dur=\d+\.\d{3}", answer.headers["server-timing"]), answer.url
    csp = answers[0].headers["content-security-policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp


def test_a_host_the_sidecar_is_not_named_by_is_refused_and_counted_but_probes_answer() -> None:
    app, _ = sidecar_app(host="127.0.0.1")
    with in_process(app) as http:
        for host in ("localhost", "LOCALHOST:8000", "127.0.0.1", "127.0.0.1:9", "[::1]:8000"):
            assert http.get("/api/v1/stats", headers={"Host": host}).status_code == 200, host
        for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example", "", "[::2]"):
            answer = http.get("/api/v1/stats", headers={"Host": host})
            assert answer.status_code == 400, host
            assert host not in answer.text or not host, "the refusal echoed the Host"
        rebound = {"Host": "evil.example"}
        assert http.get("/healthz", headers=rebound).status_code == 200
        assert http.get("/readyz", headers=rebound).status_code == 200
        assert http.get("/", headers=rebound).status_code == 400
        assert refused(http.get("/metrics").text, "host_not_allowed") == 6


def test_allowed_hosts_follow_the_bound_address_and_can_be_given() -> None:
    bound, _ = sidecar_app(host="10.0.0.7")
    with in_process(bound) as http:
        assert http.get("/api/v1/stats", headers={"Host": "10.0.0.7:8000"}).status_code == 200
        assert http.get("/api/v1/stats", headers={"Host": "sidecar:8000"}).status_code == 400
    everywhere, _ = sidecar_app(host="0.0.0.0")  # the image: clients use names it cannot know
    with in_process(everywhere) as http:
        assert http.get("/api/v1/stats", headers={"Host": "kvscope:8000"}).status_code == 200
    given, _ = sidecar_app(HttpLimits(allowed_hosts=("kvscope",)), host="0.0.0.0")
    with in_process(given) as http:
        assert http.get("/api/v1/stats", headers={"Host": "kvscope:8000"}).status_code == 200
        assert http.get("/api/v1/stats", headers={"Host": "localhost"}).status_code == 400


def test_head_answers_every_get_route_with_its_headers_and_no_body() -> None:
    app, state = sidecar_app(token=TOKEN)
    record(state, events=2)
    paths = ("/", "/static/app.js", "/api/v1/stats", "/api/v1/blocks", "/api/v1/events",
             "/metrics", "/openapi.json", "/healthz", "/readyz",
             "/api/v1/events/stream")  # fmt: skip
    with in_process(app) as http:
        for path in paths:
            got = http.get(path, headers=AUTH) if "stream" not in path else None
            head = http.head(path, headers=AUTH)
            assert head.status_code == 200, path
            assert head.content == b"", path
            if got is not None:
                assert head.headers["content-type"] == got.headers["content-type"], path
        assert http.head("/api/v1/stats").status_code == 401
        assert (
            http.head("/api/v1/events/stream", headers=AUTH)
            .headers["content-type"]
            .startswith("text/event-stream")
        )
        assert http.post("/healthz").status_code == 405  # HEAD, not every method


def test_a_405_names_head_among_the_methods_of_a_route_that_serves_get() -> None:
    """A 405's ``Allow`` must list every method served (RFC 9110, 15.5.6): it said ``GET``
    alone where HEAD is answered too."""
    app, _ = sidecar_app(token=TOKEN)
    with in_process(app) as http:
        for path in ("/", "/api/v1/stats", "/api/v1/events/stream", "/metrics", "/healthz"):
            for method in ("OPTIONS", "PATCH", "DELETE", "TRACE"):
                answer = http.request(method, path, headers=AUTH)
                assert answer.status_code == 405, (method, path)
                assert answer.headers["allow"] == "GET, HEAD", (method, path)
                assert http.head(path, headers=AUTH).status_code == 200, path
        refused = http.request("PATCH", LOOKUP, headers=AUTH)
        assert (refused.status_code, refused.headers["allow"]) == (405, "POST")
        assert http.head(LOOKUP, headers=AUTH).headers["allow"] == "POST"


def test_no_documentation_page_loads_anything_from_elsewhere() -> None:
    app, _ = sidecar_app(token=TOKEN)
    with in_process(app) as http:
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            assert http.get(path, headers=AUTH).status_code == 404, path
        for path in ("/", "/static/app.js", "/static/style.css"):
            text = http.get(path, headers=AUTH).text
            assert "http://" not in text and "https://" not in text, path
        assert http.get("/openapi.json", headers=AUTH).json()["openapi"].startswith("3.")


def test_the_limits_are_kvscope_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """KVSCOPE_MAX_BODY_BYTES and KVSCOPE_ALLOWED_HOSTS reach the app built from the settings."""
    monkeypatch.setenv("KVSCOPE_MAX_BODY_BYTES", "4096")
    monkeypatch.setenv("KVSCOPE_ALLOWED_HOSTS", "kvscope,localhost")
    app, _ = sidecar_app(host="0.0.0.0")
    with in_process(app) as http:
        too_large = http.post(LOOKUP, content=b"x" * 4097, headers=JSON)
        elsewhere = http.get("/api/v1/stats", headers={"Host": "elsewhere.example"})
        named = http.get("/api/v1/stats", headers={"Host": "kvscope:8000"})
    assert too_large.status_code == 413
    assert elsewhere.status_code == 400
    assert named.status_code == 200


@pytest.mark.parametrize("host", ["evil.example/x", "a b", "x" * 300])
def test_an_allowed_host_that_is_no_host_name_is_refused(host: str) -> None:
    with pytest.raises(ValueError, match="is not a host name or address"):
        sidecar_app(allowed_hosts=[host])


def test_a_host_with_a_served_name_inside_it_or_beside_another_is_refused() -> None:
    """``[::1]evil.example`` read as ``::1`` (all before the ``]``), and of two Host headers
    only the first was checked: each let a name the sidecar does not serve through."""
    app, _ = sidecar_app(host="127.0.0.1")
    with in_process(app) as http:
        for host in ("[::1]evil.example", "[::1]:80evil", "[::1]:", "[::1"):
            answer = http.get("/api/v1/stats", headers={"Host": host})
            assert answer.status_code == 400, host
        twice = [("Host", "localhost"), ("Host", "evil.example")]
        assert http.get("/api/v1/stats", headers=twice).status_code == 400
        assert http.get("/api/v1/stats", headers={"Host": "[::1]:8000"}).status_code == 200
        assert refused(http.get("/metrics").text, "host_not_allowed") == 5
