"""The sidecar's HTTP API end to end: real uvicorn on loopback, real ZMQ publishers.

Each test starts kvscope's own EventPublisher(s) and a ``Sidecar`` on port 0,
publishes through a real ``CPUOffloadingManager`` (or hand-made events where
a test needs GPU blocks or bytes hashes), and reads everything back over HTTP
with httpx. Waits poll the API for up to WAIT_S; nothing asserts on time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from app.server import Sidecar
from app.settings import SidecarSettings
from offload.base import OffloadingEvent
from offload.cpu.manager import CPUOffloadingManager
from offload.wire.publisher import EventPublisher
from offload.worker_telemetry import WorkerTelemetry
from tests.support.http_app import sse_events
from tests.support.polling import WAIT_S, wait_for
from tests.support.zmq_peers import RawPublisher, kv_payload

pytestmark = pytest.mark.timeout(120)
TOKEN = "s3cret-token"


class Worker:
    """A real manager with telemetry, publishing on a real socket (with replay)."""

    def __init__(self, engine_id: str) -> None:
        self.publisher = EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        self.manager = CPUOffloadingManager(
            block_size=16, num_blocks=64, cache_policy="lru", enable_events=True
        )
        self.telemetry = WorkerTelemetry(
            self.manager, engine_id=engine_id, publisher=self.publisher, bytes_per_block=4096
        )

    @property
    def name(self) -> str:
        return self.publisher.endpoint

    def store(self, *hashes: int) -> None:
        out = self.manager.prepare_store(list(hashes))
        assert out is not None
        self.manager.complete_store(out.block_hashes_to_store)
        self.telemetry.publish_events()

    def close(self) -> None:
        self.publisher.close()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    made = [Worker("engine-a"), Worker("engine-b")]
    yield made
    for worker in made:
        worker.close()


@contextmanager
def serve(*workers: Worker, **overrides: Any) -> Iterator[httpx.Client]:
    settings = SidecarSettings(
        connect=[w.publisher.endpoint for w in workers],
        replay=[w.publisher.replay_endpoint for w in workers],
        port=0,
        **overrides,
    )
    with Sidecar(settings) as sidecar, httpx.Client(base_url=sidecar.url, timeout=WAIT_S) as http:
        yield http


def stats(http: httpx.Client) -> dict[str, Any]:
    response = http.get("/api/v1/stats")
    assert response.status_code == 200, response.text
    return response.json()


def connect(http: httpx.Client, *workers: Worker) -> None:
    """Probe with stats frames until the sidecar hears every worker (ZMQ's slow joiner)."""

    def probe() -> dict[str, Any]:
        for worker in workers:
            worker.telemetry.publish_stats()
        return stats(http)

    names = {worker.name for worker in workers}

    def heard(body: dict[str, Any]) -> bool:
        return all(p["seen"] for p in body["publishers"] if p["name"] in names)

    wait_for(probe, heard, "the workers are heard")


def all_blocks(http: httpx.Client, **params: Any) -> list[str]:
    response = http.get("/api/v1/blocks", params=params)
    assert response.status_code == 200, response.text
    return [block["block_hash"] for block in response.json()["blocks"]]


def test_readiness_then_stats_and_hit_ratio_match_what_was_published(
    workers: list[Worker],
) -> None:
    a, b = workers
    with serve(a, b) as http:
        assert http.get("/healthz").status_code == 200
        unready = http.get("/readyz")
        assert unready.status_code == 503
        assert sorted(unready.json()["unseen"]) == sorted([a.name, b.name])

        connect(http, a)
        half = http.get("/readyz")
        assert half.status_code == 503 and half.json()["unseen"] == [b.name]
        connect(http, a, b)
        assert http.get("/readyz").json() == {"ready": True, "unseen_count": 0, "unseen": []}
        assert stats(http)["hit_ratio"] is None  # no lookups yet

        a.store(1, 2, 3, 4, 5)
        b.store(100, 101)
        assert a.manager.lookup([1, 2, 3, 99]) == 3
        assert a.manager.lookup([42]) == 0  # 3 hits of 5 blocks asked
        a.telemetry.publish_stats()
        b.telemetry.publish_stats()
        body = wait_for(
            lambda: stats(http),
            lambda s: (
                (s["blocks_by_medium"], s["stores_completed"]) == ({"CPU": 7}, 7)
                and s["hit_ratio"] is not None
            ),
            "blocks and lookups reach the sidecar",
        )
        assert body["hit_ratio"] == pytest.approx(3 / 5)
        assert (body["lookup_hit_blocks"], body["lookup_blocks"]) == (3, 5)
        assert body["bytes_by_medium"] == {"CPU": 7 * 4096}
        assert (body["tracked_blocks"], body["overflow"], body["stores_completed"]) == (7, 0, 7)
        assert body["evictions"] == {"capacity": 0, "failed_store": 0, "clear": 0}
        assert body["stores_per_s"] > 0  # from the probe frame to the frame after the stores
        assert body["events_per_s"] > 0
        info = {p["name"]: p for p in body["publishers"]}[a.name]
        assert (info["engine_id"], info["rank"], info["policy"]) == ("engine-a", 0, "lru")
        assert (info["capacity_blocks"], info["block_size"], info["dropped"]) == (64, 16, 0)
        assert info["connected"] and (info["gaps"], info["missed"], info["malformed"]) == (0, 0, 0)


def test_blocks_pages_filters_detail_and_lookup(workers: list[Worker]) -> None:
    a, b = workers
    with serve(a, b, page_limit=10) as http:
        connect(http, a, b)
        a.store(*range(1, 26))
        wait_for(lambda: stats(http)["tracked_blocks"], lambda n: n == 25, "CPU blocks indexed")
        gpu = OffloadingEvent([1, 2, b"\xab" * 32], 16, "GPU", False)
        b.publisher.publish_events([gpu])
        wait_for(lambda: stats(http)["tracked_blocks"], lambda n: n == 26, "26 blocks indexed")

        first = http.get("/api/v1/blocks", params={"limit": 10}).json()
        assert [blk["block_hash"] for blk in first["blocks"]] == [str(h) for h in range(1, 11)]
        # Blocks come and go between pages: the cursor neither repeats nor skips survivors.
        a.publisher.publish_events([OffloadingEvent([12], 16, "CPU", True)])
        a.store(500)
        wait_for(
            lambda: (
                http.get("/api/v1/blocks/500").status_code,
                http.get("/api/v1/blocks/12").status_code,
            ),
            lambda codes: codes == (200, 404),
            "churn applied",
        )
        seen, cursor = [blk["block_hash"] for blk in first["blocks"]], first["next_cursor"]
        while cursor is not None:
            page = http.get("/api/v1/blocks", params={"limit": 10, "cursor": cursor}).json()
            seen += [blk["block_hash"] for blk in page["blocks"]]
            cursor = page["next_cursor"]
        expected = [str(h) for h in range(1, 26) if h != 12] + ["0x" + "ab" * 32, "500"]
        assert seen == expected

        too_big = http.get("/api/v1/blocks", params={"limit": 11})
        assert too_big.status_code == 422
        assert too_big.json()["detail"][0]["loc"] == ["query", "limit"]
        assert "10" in too_big.json()["detail"][0]["msg"]

        assert all_blocks(http, medium="GPU") == ["1", "2", "0x" + "ab" * 32]
        assert all_blocks(http, publisher=b.name) == ["1", "2", "0x" + "ab" * 32]
        assert all_blocks(http, medium="GPU", publisher=a.name) == []
        assert all_blocks(http, medium="DISK") == []

        detail = http.get("/api/v1/blocks/2").json()
        assert detail["media"] == ["CPU", "GPU"]
        assert sorted(detail["publishers"]) == sorted([a.name, b.name])
        for spelling in ("0x" + "ab" * 32, "AB" * 32):
            response = http.get(f"/api/v1/blocks/{spelling}")
            assert response.status_code == 200 and response.json()["media"] == ["GPU"]
        assert http.get("/api/v1/blocks/12").status_code == 404  # removed
        assert http.get("/api/v1/blocks/0xabcd").status_code == 404
        for malformed in ("xyz", "0xabc", "ab" * 31, "1.5", "012"):
            response = http.get(f"/api/v1/blocks/{malformed}")
            assert response.status_code == 400, malformed
            assert response.json()["detail"][0]["input"] == malformed

        chain = {"block_hashes": [1, "2", 3, "4", 12, 5]}  # 12 was removed: the chain breaks
        match = http.post("/api/v1/lookup", json=chain).json()
        assert match == {"runs": {"CPU": 4, "GPU": 2}, "break_index": 4}
        bad = http.post("/api/v1/lookup", json={"block_hashes": ["1", "nope"]})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == 1


def test_a_lookup_body_with_a_key_it_does_not_take_is_a_422_naming_the_key(
    workers: list[Worker],
) -> None:
    """Unknown keys were dropped: a typo (``block_hash``) was answered as a missing field,
    and ``{"block_hashes": [...], "extra": 1}`` as if ``extra`` meant something."""
    a, _ = workers
    with serve(a) as http:
        connect(http, a)
        a.store(1, 2, 3)
        wait_for(lambda: stats(http)["tracked_blocks"], lambda n: n == 3, "blocks indexed")

        def refused(body: dict[str, Any]) -> str:
            # A lone surrogate goes as JSON's \\ud800 escape, which httpx's json= cannot write.
            sent = json.dumps(body).encode()
            answer = http.post(
                "/api/v1/lookup", content=sent, headers={"Content-Type": "application/json"}
            )
            assert answer.status_code == 422, answer.text
            assert len(answer.content) < 2000  # one error, the body's echo cut
            [error] = answer.json()["detail"]
            assert (error["type"], error["loc"]) == ("extra_forbidden", ["body"])
            return error["msg"]

        assert refused({"block_hashes": [1, 2], "extra": 1}) == (
            "the body has key(s) it does not take: 'extra'; it takes: block_hashes"
        )
        assert refused({"block_hash": [1, 2]}) == (
            "the body has key(s) it does not take: 'block_hash' (did you mean "
            "'block_hashes'?); it takes: block_hashes"
        )
        # Escaped and cut as every message is, and at most five named: one short line.
        forged = refused({"block_hashes": [1], "x\n{y}\ud800" + "z" * 1000: 1})
        assert forged.startswith("the body has key(s) it does not take: 'x\\n{y}\\ud800zzz")
        assert "\n" not in forged and len(forged) < 300
        many = refused({"block_hashes": [1], **{f"k{n:06}": n for n in range(100_000)}})
        assert "'k000004', and 99995 more; it takes: block_hashes" in many

        chain = http.post("/api/v1/lookup", json={"block_hashes": [1, 2, 3, 4]})
        assert chain.json() == {"runs": {"CPU": 3}, "break_index": 3}
        schema = http.get("/openapi.json").json()["components"]["schemas"]["LookupRequest"]
        assert schema["additionalProperties"] is False


def test_events_json_and_stream_resume_with_last_event_id(workers: list[Worker]) -> None:
    a, _ = workers
    with serve(a) as http:
        connect(http, a)
        a.store(1, 2)
        a.publisher.publish_events([OffloadingEvent([b"\x01\x02"], 16, "CPU", True)])
        a.store(3)
        page = wait_for(
            lambda: http.get("/api/v1/events").json(),
            lambda p: p["last_id"] == 3,
            "three events logged",
        )
        assert [e["id"] for e in page["events"]] == [1, 2, 3]
        assert [(e["kind"], e["medium"], e["block_hashes"]) for e in page["events"]] == [
            ("stored", "CPU", ["1", "2"]),
            ("removed", "CPU", ["0x0102"]),
            ("stored", "CPU", ["3"]),
        ]
        assert page["events"][0]["publisher"] == a.name and page["first_id"] == 1
        after = http.get("/api/v1/events", params={"since": 1, "limit": 1}).json()
        assert [e["id"] for e in after["events"]] == [2]
        assert http.get("/api/v1/events", params={"since": 3}).json()["events"] == []

        headers = {"Last-Event-ID": "1"}
        with http.stream("GET", "/api/v1/events/stream", headers=headers) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            stream = sse_events(response, 3)
            backlog = [next(stream), next(stream)]
            assert [e["id"] for e in backlog] == [2, 3]
            a.store(4)  # published while the stream waits: arrives live
            live = next(stream)
            assert (live["id"], live["block_hashes"]) == (4, ["4"])


def test_metrics_reexport_workers_and_the_sidecar_health(workers: list[Worker]) -> None:
    a, b = workers
    with serve(a, b) as http:
        connect(http, a, b)
        a.store(1, 2, 3)
        a.manager.lookup([1, 2, 9])
        a.telemetry.publish_stats()

        def families() -> dict[str, Any]:
            response = http.get("/metrics")
            assert response.status_code == 200
            return {f.name: f for f in text_string_to_metric_families(response.text)}

        def hits(found: dict[str, Any]) -> dict[str, float]:
            family = found.get("kvscope_lookup_hit_blocks")
            return {s.labels["publisher"]: s.value for s in family.samples} if family else {}

        def arrived(found: dict[str, Any]) -> bool:
            tracked = found["kvscope_sidecar_tracked_blocks"].samples[0].value
            return hits(found).get(a.name) == 2 and tracked == 3

        found = wait_for(families, arrived, "worker metrics and events")
        sample = next(
            s for s in found["kvscope_lookup_hit_blocks"].samples if s.labels["publisher"] == a.name
        )
        assert sample.labels == {
            "publisher": a.name,
            "engine": "engine-a",
            "rank": "0",
            "medium": "CPU",
        }
        assert hits(found)[b.name] == 0
        frames = {s.labels["publisher"]: s.value for s in found["kvscope_sidecar_frames"].samples}
        assert frames[a.name] > 0 and frames[b.name] > 0
        for name in (
            "kvscope_sidecar_gaps",
            "kvscope_sidecar_missed_batches",
            "kvscope_sidecar_restarts",
            "kvscope_sidecar_malformed_frames",
            "kvscope_sidecar_replayed_batches",
            "kvscope_sidecar_ingest_lag_seconds",
        ):
            assert {s.labels["publisher"] for s in found[name].samples} == {a.name, b.name}, name
        totals = {
            name: found[name].samples[0].value
            for name in (
                "kvscope_sidecar_tracked_blocks",
                "kvscope_sidecar_tracked_blocks_max",
                "kvscope_sidecar_index_overflow",
                "kvscope_sidecar_events",
            )
        }
        assert totals == {
            "kvscope_sidecar_tracked_blocks": 3,
            "kvscope_sidecar_tracked_blocks_max": 1_000_000,
            "kvscope_sidecar_index_overflow": 0,
            "kvscope_sidecar_events": 1,
        }


def test_a_token_guards_every_route_but_the_probes(workers: list[Worker]) -> None:
    a, _ = workers
    with serve(a, token=TOKEN) as http:
        good = {"Authorization": f"Bearer {TOKEN}"}
        for path in ("/api/v1/stats", "/api/v1/blocks", "/api/v1/events", "/metrics",
                     "/openapi.json", "/", "/static/app.js"):  # fmt: skip
            missing = http.get(path)
            assert missing.status_code == 401, path
            assert missing.headers["www-authenticate"].startswith("Bearer")
            wrong = http.get(path, headers={"Authorization": "Bearer not-it"})
            assert wrong.status_code == 401, path
            assert http.get(path, headers=good).status_code == 200, path
        assert http.post("/api/v1/lookup", json={"block_hashes": []}).status_code == 401
        assert http.get("/healthz").status_code == 200
        unready = http.get("/readyz")  # open, not yet ready, and naming no address
        assert unready.status_code == 503 and unready.json()["unseen"] is None
        # EventSource cannot send headers: the stream alone also takes ?token=.
        stream = "/api/v1/events/stream"
        assert http.get(stream, params={"token": "not-it"}).status_code == 401
        with http.stream("GET", stream, params={"token": TOKEN}) as response:
            assert response.status_code == 200
        assert http.get("/api/v1/stats", params={"token": TOKEN}).status_code == 401
        # A browser opens /?token= once and carries the session cookie from then on.
        login = http.get("/", params={"token": TOKEN}, follow_redirects=True)
        assert login.status_code == 200 and login.url.query == b""
        assert http.get("/api/v1/stats").status_code == 200


def test_the_page_is_served_with_its_assets_and_no_outside_references(
    workers: list[Worker],
) -> None:
    a, _ = workers
    with serve(a) as http:
        page = http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        for asset in ("/static/app.js", "/static/style.css"):
            response = http.get(asset)
            assert response.status_code == 200, asset
            assert "http://" not in response.text and "https://" not in response.text, asset
        for anchor in ('id="tabs"', 'id="views"', 'src="static/app.js"'):
            assert anchor in page.text  # the shell the views render into (js/views/)


def test_the_openapi_schema_lists_every_route(workers: list[Worker]) -> None:
    a, _ = workers
    with serve(a) as http:
        schema = http.get("/openapi.json").json()
        assert http.get("/docs").status_code == 404  # no page that loads a CDN's code
    assert {path: sorted(ops) for path, ops in schema["paths"].items()} == {
        "/api/v1/stats": ["get"],
        "/api/v1/history": ["get"],
        "/api/v1/insight": ["get"],
        "/api/v1/blocks": ["get"],
        "/api/v1/blocks/{block_hash}": ["get"],
        "/api/v1/lookup": ["post"],
        "/api/v1/events": ["get"],
        "/api/v1/events/stream": ["get"],
        "/metrics": ["get"],
        "/healthz": ["get"],
        "/readyz": ["get"],
    }
    stats_schema = schema["components"]["schemas"]["StatsResponse"]["properties"]
    assert {"hit_ratio", "blocks_by_medium", "publishers", "stores_per_s"} <= set(stats_schema)


def test_settings_read_the_environment_and_name_bad_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVSCOPE_CONNECT", "tcp://127.0.0.1:5557, tcp://127.0.0.1:5558")
    monkeypatch.setenv("KVSCOPE_REPLAY", '["tcp://127.0.0.1:5559"]')
    monkeypatch.setenv("KVSCOPE_PORT", "9000")
    settings = SidecarSettings()
    assert [(p.endpoint, p.replay_endpoint) for p in settings.publishers()] == [
        ("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5559"),
        ("tcp://127.0.0.1:5558", None),
    ]
    assert (settings.host, settings.port, settings.token) == ("127.0.0.1", 9000, None)
    for bad, named in (
        ({"port": 70000}, "port"),
        ({"page_limit": 5000}, "page_limit"),
        ({"max_blocks": 0}, "max_blocks"),
        ({"connect": ["not-an-endpoint"]}, "connect"),
        ({"replay": ["tcp://a:1", "tcp://b:1", "tcp://c:1"]}, "replay"),
        ({"token": "  "}, "token"),
    ):
        with pytest.raises(ValidationError, match=named):
            SidecarSettings(**bad)


def test_the_api_follows_a_late_start_a_lost_frame_a_restart_and_garbage() -> None:
    """Through uvicorn: what the sidecar serves stays true to a misbehaving stream."""
    raw = RawPublisher()
    try:
        # Published before the sidecar exists: only the replay buffer holds it.
        raw.send(0, kv_payload(OffloadingEvent([1, 2], 16, "CPU", False)))
        settings = SidecarSettings(
            connect=[raw.endpoints.endpoint], replay=[raw.endpoints.replay_endpoint], port=0
        )
        with Sidecar(settings) as sidecar, httpx.Client(base_url=sidecar.url) as http:
            name = raw.endpoints.endpoint

            def publisher() -> dict[str, Any]:
                return next(p for p in stats(http)["publishers"] if p["name"] == name)

            def probe() -> dict[str, Any]:
                raw.pub.send_multipart([b"", b"short", b""])  # malformed: a bad sequence
                return publisher()

            wait_for(probe, lambda p: p["seen"], "the sidecar hears the publisher")
            raw.send(1, kv_payload(OffloadingEvent([3], 16, "CPU", False)))  # late start
            raw.send(2, kv_payload(OffloadingEvent([4], 16, "CPU", False)), lose=True)
            raw.send(3, kv_payload(OffloadingEvent([1], 16, "CPU", True)))  # gap: 2 lost
            wait_for(lambda: all_blocks(http), lambda b: sorted(b) == ["2", "3", "4"], "gap")
            state = publisher()
            assert (state["gaps"], state["missed"], state["last_seq"]) == (1, 0, 3)
            assert state["malformed"] >= 1 and state["replayed"] >= 1

            with raw._lock:
                raw.buffer.clear()  # a restarted process starts with an empty buffer
            raw.send(0, kv_payload(OffloadingEvent([9], 16, "CPU", False)))
            wait_for(lambda: all_blocks(http), lambda b: b == ["9"], "restart reset the view")
            assert publisher()["restarts"] == 1
            assert stats(http)["blocks_by_medium"] == {"CPU": 1}
    finally:
        raw.close()
