"""Numbers and block hashes in URLs and headers, over real HTTP on loopback: one form only.

Every integer a route reads from the query string, a header or its path is
ASCII digits with no sign, space, underscore or leading zero, at most 20 of
them (app/decimal_text.py); a fractional one (``since`` on the history) the
same with a fraction and an exponent as Python and JavaScript print them.
Each other spelling that Python's ``int`` or pydantic's lax mode would read
is a 400 naming the parameter and the
problem, in the 422's JSON shape; a number so written but out of bounds
stays a 422; and no refused request leaves anything behind.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from app.decode import DecodedBatch, DecodedEvent
from offload.decimal_text import MAX_DIGITS
from tests.support.http_app import record, serving, sidecar_app, sse_events
from tests.support.polling import WAIT_S, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
EVENTS = "/api/v1/events"
BLOCKS = "/api/v1/blocks"
STREAM = "/api/v1/events/stream"

LAX_FORMS = {
    "1_0": "an underscore",
    "+3": "a sign",
    "-1": "a sign",
    "-0": "a sign",
    " 3 ": "white space",
    "3\t": "white space",
    "03": "a leading zero",
    "00": "a leading zero",
    "3.0": "not a digit",
    "1e3": "not a digit",
    "0x10": "not a digit",
    "\uff13": "not ASCII",  # full-width 3
    "\u0663": "not ASCII",  # Arabic-Indic 3
    "": "empty",
    "1" * (MAX_DIGITS + 1): f"more than {MAX_DIGITS}",
}
"""Text a lax reader takes for a number, and the words its 400 uses."""

QUERY_NUMBERS = [
    (EVENTS, "since"),
    (EVENTS, "limit"),
    (BLOCKS, "cursor"),
    (BLOCKS, "limit"),
    ("/api/v1/history", "resolution"),
]
"""Every integer query parameter of every route."""

INDEXED = (*range(10), -7)


@pytest.fixture(scope="module")
def sidecar() -> Iterator[httpx.Client]:
    """A sidecar on loopback: 5 events in the log, blocks 0 to 9 and -7 in the index."""
    app, state = sidecar_app()
    record(state, events=5)
    stored = DecodedEvent("stored", [*INDEXED], "CPU", 16)
    state.index.apply("p", DecodedBatch(1.0, 0, [stored]), now=1.0)
    with serving(app) as url, httpx.Client(base_url=url, timeout=WAIT_S) as http:
        yield http


def refusal(answer: httpx.Response) -> dict[str, Any]:
    """The one error of a 400 in the validation errors' shape."""
    assert answer.status_code == 400, answer.text
    (error,) = answer.json()["detail"]
    return error


@pytest.mark.parametrize(("path", "name"), QUERY_NUMBERS)
@pytest.mark.parametrize("text", list(LAX_FORMS), ids=ascii)
def test_a_query_number_in_any_other_form_is_a_400_naming_it_and_why(
    sidecar: httpx.Client, path: str, name: str, text: str
) -> None:
    error = refusal(sidecar.get(path, params={name: text}))
    assert error["loc"] == ["query", name]
    assert error["type"] == "int_parsing"
    assert LAX_FORMS[text] in error["msg"]
    assert error["input"] == text


LAX_FRACTIONS = {
    "1_0": "an underscore",
    "+3": "a plus sign",
    "-+3": "not in that form",
    " 3 ": "white space",
    "03.5": "not in that form",
    "1.2.3": "not in that form",
    ".5": "not in that form",
    "inf": "not a digit",
    "nan": "not a digit",
    "0x10": "not a digit",
    "\u0663.5": "not ASCII",  # Arabic-Indic 3
    "": "empty",
    "1" * 65: "more than 64",
    "-0": "a negative zero",  # equal to 0: a second spelling of it
    "1e-400": "too small",  # 0 to a double, though not written as 0
}
"""Text a lax float reader takes for a number, and the words its 400 uses."""


@pytest.mark.parametrize("text", list(LAX_FRACTIONS), ids=ascii)
def test_a_fractional_query_number_in_any_other_form_is_a_400_naming_it_and_why(
    sidecar: httpx.Client, text: str
) -> None:
    error = refusal(sidecar.get("/api/v1/history", params={"since": text}))
    assert error["loc"] == ["query", "since"]
    assert error["type"] == "float_parsing"
    assert LAX_FRACTIONS[text] in error["msg"]


@pytest.mark.parametrize("text", ["0", "1001", "1732850000.25", "1e-05", "2.5E+3", "-1.5"])
def test_fractional_numbers_as_python_and_javascript_print_them_are_read(
    sidecar: httpx.Client, text: str
) -> None:
    answer = sidecar.get("/api/v1/history", params={"since": text})
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (b"+3", "a sign"),
        (b"1_0", "an underscore"),
        (b"03", "a leading zero"),
        (b"3 4", "white space"),
        (b"3.0", "not a digit"),
        (b"\xb2", "not ASCII"),  # superscript 2 in latin-1, which a header's bytes are read as
        (b"1" * (MAX_DIGITS + 1), f"more than {MAX_DIGITS}"),
    ],
    ids=ascii,
)
def test_a_last_event_id_in_any_other_form_is_a_400_and_joins_no_stream(
    sidecar: httpx.Client, value: bytes, problem: str
) -> None:
    """(Spaces around a header's value are HTTP's, dropped before the app sees it.)"""
    wait_until(lambda: stream_readers(sidecar) == 0, "no reader left from an earlier test")
    error = refusal(sidecar.get(STREAM, headers={"Last-Event-ID": value}))
    assert error["loc"] == ["header", "last-event-id"] and problem in error["msg"]
    assert stream_readers(sidecar) == 0


@pytest.mark.parametrize("padding", [b" ", b"\t", b" \t "], ids=ascii)
def test_white_space_after_a_header_value_is_http_s_not_the_value_s(
    sidecar: httpx.Client, padding: bytes
) -> None:
    """RFC 9112 (5) has a parser drop white space after a field's value as before it;
    httptools dropped only that before, so ``Last-Event-ID: 3`` with a space after it was
    a 400 saying the id "has white space". httpx strips it, so this is written on a socket."""
    wait_until(lambda: stream_readers(sidecar) == 0, "no reader left from an earlier test")
    url = httpx.URL(str(sidecar.base_url))
    head = b"GET %s HTTP/1.1\r\nHost: %s\r\nLast-Event-ID: 3%s\r\nConnection: close\r\n\r\n" % (
        STREAM.encode(),
        url.netloc,
        padding,
    )
    with socket.create_connection((url.host, url.port), timeout=WAIT_S) as raw:
        raw.sendall(head)
        received = b""
        while b"\nid: 5\n" not in received and (chunk := raw.recv(65536)):
            received += chunk
    assert received.startswith(b"HTTP/1.1 200 "), received[:300]
    assert re.findall(rb"\nid: (\d+)\n", received) == [b"4", b"5"]


def test_numbers_in_their_one_form_are_read_and_bounds_stay_422s(sidecar: httpx.Client) -> None:
    page = sidecar.get(EVENTS, params={"since": "2", "limit": "2"}).json()
    assert [event["id"] for event in page["events"]] == [3, 4]
    assert sidecar.get(EVENTS, params={"since": "0"}).json()["events"][0]["id"] == 1
    first = sidecar.get(BLOCKS, params={"limit": "3"}).json()
    rest = sidecar.get(BLOCKS, params={"limit": "10", "cursor": str(first["next_cursor"])})
    listed = [b["block_hash"] for b in first["blocks"] + rest.json()["blocks"]]
    assert listed == [str(h) for h in INDEXED]
    assert sidecar.get("/api/v1/history", params={"resolution": "10"}).json()["resolution_s"] == 10
    with sidecar.stream("GET", STREAM, headers={"Last-Event-ID": "3"}) as resumed:
        assert [event["id"] for event in sse_events(resumed, 2)] == [4, 5]
    for path, params in [
        (EVENTS, {"limit": "0"}),
        (EVENTS, {"since": "9" * MAX_DIGITS}),  # the form, but past any id
        (BLOCKS, {"limit": "1001"}),
    ]:
        answer = sidecar.get(path, params=params)
        assert answer.status_code == 422, (path, params)
        assert answer.json()["detail"][0]["loc"] == ["query", *params]


def test_a_request_with_a_malformed_number_and_a_number_out_of_bounds_is_a_400_naming_both(
    sidecar: httpx.Client,
) -> None:
    answer = sidecar.get(EVENTS, params={"since": "+1", "limit": "5000"})
    assert answer.status_code == 400
    found = {(e["loc"][1], e["type"]) for e in answer.json()["detail"]}
    assert found == {("since", "int_parsing"), ("limit", "less_than_equal")}


MALFORMED_HASHES = ["007", "-0", "+7", "1_0", "\u0663", " 7", "7.0", "1" * 21, "-" + "1" * 21]


@pytest.mark.parametrize("text", MALFORMED_HASHES, ids=ascii)
def test_a_block_hash_in_a_path_in_another_form_is_a_400_but_in_a_body_a_422(
    sidecar: httpx.Client, text: str
) -> None:
    error = refusal(sidecar.get(f"{BLOCKS}/{quote(text, safe='')}"))
    assert error["loc"] == ["path", "block_hash"] and error["type"] == "block_hash_parsing"
    assert error["input"] == text and "no leading zero" in error["msg"]
    body = sidecar.post("/api/v1/lookup", json={"block_hashes": ["1", text]})
    assert body.status_code == 422 and body.json()["detail"][0]["loc"] == [
        "body",
        "block_hashes",
        1,
    ]


def test_block_hashes_in_their_form_are_read(sidecar: httpx.Client) -> None:
    for text in ("0", "7", "-7"):
        assert sidecar.get(f"{BLOCKS}/{text}").json()["block_hash"] == text
    for unknown in ("-6", "9" * MAX_DIGITS, "-" + "9" * MAX_DIGITS, "0x0a", "ab" * 32):
        assert sidecar.get(f"{BLOCKS}/{unknown}").status_code == 404, unknown
    lookup = sidecar.post("/api/v1/lookup", json={"block_hashes": ["0", "1", 2]})
    assert lookup.json()["runs"] == {"CPU": 3}


def test_a_refused_request_changes_nothing(sidecar: httpx.Client) -> None:
    wait_until(lambda: stream_readers(sidecar) == 0, "no reader left from an earlier test")
    before = [sidecar.get(path).json() for path in (EVENTS, BLOCKS)]
    for path, name in QUERY_NUMBERS:
        for text in LAX_FORMS:
            assert sidecar.get(path, params={name: text}).status_code == 400
    for value in ("+1", "01"):
        assert sidecar.get(STREAM, headers={"Last-Event-ID": value}).status_code == 400
    assert [sidecar.get(path).json() for path in (EVENTS, BLOCKS)] == before
    assert stream_readers(sidecar) == 0
    with sidecar.stream("GET", STREAM, headers={"Last-Event-ID": "4"}) as resumed:
        assert [event["id"] for event in sse_events(resumed, 1)] == [5]


def test_the_schema_documents_the_400_and_states_each_form_and_bound(sidecar: httpx.Client) -> None:
    paths = sidecar.get("/openapi.json").json()["paths"]
    for path in (EVENTS, STREAM, BLOCKS, f"{BLOCKS}/{{block_hash}}", "/api/v1/history"):
        assert "400" in paths[path]["get"]["responses"], path
    (parameter,) = paths[f"{BLOCKS}/{{block_hash}}"]["get"]["parameters"]
    pattern = re.compile(parameter["schema"]["pattern"])
    assert all(pattern.fullmatch(text) for text in ("0", "-7", "9" * MAX_DIGITS, "0xab"))
    assert not any(pattern.fullmatch(text) for text in MALFORMED_HASHES)
    integers = [
        kind
        for path in paths.values()
        for parameter in path.get("get", {}).get("parameters", [])
        for kind in parameter["schema"].get("anyOf", [parameter["schema"]])
        if kind.get("type") == "integer"
    ]
    assert len(integers) == len(QUERY_NUMBERS) + 1  # and Last-Event-ID
    for kind in integers:  # bounds a client reads (pydantic wrote ge and le, which none does)
        assert kind["minimum"] >= 0 and kind["maximum"] < 10**MAX_DIGITS, kind
        assert "ge" not in kind and "le" not in kind, kind


def stream_readers(http: httpx.Client) -> float:
    metrics = http.get("/metrics").text
    return float(re.search(r"^kvscope_sidecar_sse_clients (\S+)$", metrics, re.M)[1])
