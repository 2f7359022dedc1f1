"""The FastAPI app in-process over a real SidecarState: auth, paging, and stats computed at ingest.

Routes are driven through fastapi's TestClient (no server), under a name the
sidecar serves (``localhost``; TestClient's own ``testserver`` is refused by the
Host check, tests/hostile/test_http_input.py); the state is fed
by a real Ingestor from kvscope's real EventPublisher where a test needs
ingest. Waits poll the ingest thread's own counters (never the API, whose
first read is what a test checks) for up to 15 s; nothing asserts on time.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.api import create_app
from app.decode import DecodedBatch, DecodedEvent
from app.ingest import Ingestor
from app.settings import SidecarSettings
from app.state.block_index import PAGE_SCAN
from app.state.publisher import CONNECTED_WITHIN_S
from app.state.sidecar import SidecarState
from app.state.worker_stats import WorkerStats
from offload.base import OffloadingEvent
from offload.telemetry import metrics as m
from offload.wire.publisher import EventPublisher
from offload.wire.stats_frame import Sample, StatsFrame, WorkerConfig, encode_stats_frame
from tests.support.polling import wait_until
from tests.support.zmq_peers import RawPublisher, free_tcp_endpoint, kv_payload

pytestmark = pytest.mark.timeout(120)
TOKEN = "s3cret-token"
ENDPOINT = "tcp://127.0.0.1:1"  # never connected to: these tests ingest nothing


def served(settings: SidecarSettings, state: SidecarState) -> TestClient:
    return TestClient(create_app(settings, state), base_url="http://localhost")


def client(**overrides: object) -> TestClient:
    settings = SidecarSettings(connect=[ENDPOINT], **overrides)
    return served(settings, SidecarState.from_settings(settings))


def test_the_token_guards_every_route_but_the_probes() -> None:
    with client(token=TOKEN) as http:
        good = {"Authorization": f"Bearer {TOKEN}"}
        for path in ("/api/v1/stats", "/api/v1/blocks", "/api/v1/events", "/metrics",
                     "/openapi.json", "/", "/static/app.js", "/static/style.css"):  # fmt: skip
            missing = http.get(path)
            assert missing.status_code == 401, path
            assert missing.headers["www-authenticate"] == 'Bearer realm="kvscope"'
            assert missing.json() == {"detail": "missing bearer token"}
            for wrong in ("Bearer not-it", f"Basic {TOKEN}", TOKEN):
                refused = http.get(path, headers={"Authorization": wrong})
                assert refused.status_code == 401, (path, wrong)
                assert refused.json() == {"detail": "invalid token"}
                assert refused.headers["www-authenticate"] == (
                    'Bearer realm="kvscope", error="invalid_token"'
                )
            assert http.get(path, headers=good).status_code == 200, path
            assert http.get(path, headers={"Authorization": f"bearer  {TOKEN} "}).is_success
        assert http.post("/api/v1/lookup", json={"block_hashes": []}).status_code == 401
        assert http.post("/api/v1/lookup", json={"block_hashes": []}, headers=good).is_success
        assert http.get("/api/v1/blocks/7", headers=good).status_code == 404
        assert http.get("/healthz").status_code == 200
        assert http.get("/readyz").status_code == 503
        for gone in ("/docs", "/redoc", "/static/index.html", "/static/../server.py"):
            assert http.get(gone, headers=good).status_code == 404, gone
        stream = "/api/v1/events/stream"
        assert http.get(stream).json() == {"detail": "missing bearer token"}
        assert http.get(stream, params={"token": "not-it"}).json() == {"detail": "invalid token"}
        assert http.get("/api/v1/stats", params={"token": TOKEN}).status_code == 401


def test_without_a_token_everything_is_open() -> None:
    with client() as http:
        for path in ("/api/v1/stats", "/metrics", "/openapi.json", "/", "/static/app.js"):
            assert http.get(path).status_code == 200, path


def test_a_browser_trades_the_token_in_the_url_for_a_session_cookie() -> None:
    with client(token=TOKEN) as http:
        assert http.get("/", params={"token": "not-it"}).status_code == 401
        login = http.get("/", params={"token": TOKEN}, follow_redirects=False)
        assert (login.status_code, login.headers["location"]) == (303, "/")
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN not in cookie
        # From now on the client carries the cookie, and no URL the token.
        for path in ("/", "/static/app.js", "/api/v1/stats", "/metrics", "/openapi.json"):
            assert http.get(path).status_code == 200, path
        with http.stream("GET", "/api/v1/events/stream") as stream:
            assert stream.status_code == 200
        assert http.get("/readyz").json()["unseen"] == [ENDPOINT]
        # A stale cookie (another token) is refused, and a new login replaces it (the one
        # the sidecar set, made stale: a second of the same name would be a 400).
        (session,) = http.cookies.jar
        session.value = "0" * 64
        assert http.get("/api/v1/stats").json() == {"detail": "invalid token"}
        assert http.get("/", params={"token": TOKEN}).status_code == 200
        assert http.get("/api/v1/stats").status_code == 200


def test_page_size_defaults_under_the_cap_and_a_larger_one_is_a_422() -> None:
    with client(page_limit=10) as http:
        assert http.get("/api/v1/events").status_code == 200
        assert http.get("/api/v1/blocks", params={"limit": 10}).status_code == 200
        too_big = http.get("/api/v1/blocks", params={"limit": 11})
        assert too_big.status_code == 422
        assert too_big.json()["detail"][0]["loc"] == ["query", "limit"]
        assert "10" in too_big.json()["detail"][0]["msg"]
        assert http.get("/api/v1/events", params={"limit": 0}).status_code == 422


def test_a_selective_filter_pages_short_with_a_cursor_and_the_schema_says_so() -> None:
    """The one block on the CPU comes last, past a page's scan: the first page is empty
    yet has a cursor, and following cursors until null finds the block."""
    settings = SidecarSettings(connect=[ENDPOINT])
    state = SidecarState.from_settings(settings)
    last = PAGE_SCAN + 1
    gpu = DecodedEvent("stored", list(range(last + 1)), "GPU", 16)
    cpu = DecodedEvent("stored", [last], "CPU", 16, last - 1)
    state.index.apply("w", DecodedBatch(1.0, 0, [gpu, cpu]), 1.0)
    with served(settings, state) as http:
        first = http.get("/api/v1/blocks", params={"medium": "CPU"}).json()
        assert first["blocks"] == [] and first["next_cursor"] is not None
        rest = http.get("/api/v1/blocks", params={"medium": "CPU", "cursor": first["next_cursor"]})
        assert [block["block_hash"] for block in rest.json()["blocks"]] == [str(last)]
        assert rest.json()["next_cursor"] is None
        listing = http.get("/openapi.json").json()["paths"]["/api/v1/blocks"]["get"]
    assert f"at most {PAGE_SCAN:,} entries" in listing["description"]


# --- worker stats are computed when a stats frame arrives ------------------------------


def a_frame(ts: float, stores: int, moved: int, *, bytes_per_block: int | None) -> StatsFrame:
    return StatsFrame(
        ts=ts,
        engine_id="e0",
        rank=0,
        config=WorkerConfig(
            policy="lru", capacity_blocks=8, block_size=16, bytes_per_block=bytes_per_block
        ),
        counters=[
            Sample(name=m.STORE_COMPLETED_BLOCKS_TOTAL.name, value=stores),
            Sample(name=m.TRANSFER_BYTES_TOTAL.name, labels={"direction": "h2d"}, value=moved),
        ],
        gauges=[Sample(name=m.BLOCKS_CAPACITY.name, labels={"medium": "CPU"}, value=8)],
    )


@pytest.fixture
def ingesting() -> Iterator[tuple[EventPublisher, SidecarState]]:
    with EventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*") as publisher:
        state = SidecarState.from_settings(SidecarSettings(connect=[publisher.endpoint]))
        ingestor = Ingestor(state)
        ingestor.start()
        try:
            yield publisher, state
        finally:
            ingestor.close()


def test_rates_and_block_bytes_come_from_ingest_not_from_reads(
    ingesting: tuple[EventPublisher, SidecarState],
) -> None:
    publisher, state = ingesting
    heard = state.publishers[publisher.endpoint]

    def probe() -> bool:  # ZMQ's slow joiner: frames before the subscription are lost
        publisher.publish_stats(a_frame(1.0, 0, 0, bytes_per_block=None))
        return heard.stats_frames > 0

    wait_until(probe, "the sidecar receives the publisher")
    publisher.publish_events([OffloadingEvent([1, 2, 3], 16, "CPU", False)])
    wait_until(lambda: state.event_log.last_id == 1, "the stores are ingested")

    def ingested(ts: float) -> Callable[[], bool]:  # probes may still be in flight: wait by ts
        return lambda: heard.stats is not None and heard.stats.ts == ts

    # Three frames, nobody reading: 0 -> 10 -> 30 stores a second apart.
    publisher.publish_stats(a_frame(10.0, 0, 0, bytes_per_block=4096))
    publisher.publish_stats(a_frame(11.0, 10, 1000, bytes_per_block=4096))
    publisher.publish_stats(a_frame(12.0, 30, 5000, bytes_per_block=4096))
    wait_until(ingested(12.0), "the stats frames are ingested")
    with state.lock:  # declared by the ingest thread, before anyone asked
        assert state.index.bytes_by_medium() == {"CPU": 3 * 4096}

    settings = SidecarSettings(connect=[publisher.endpoint])
    with served(settings, state) as http:
        first = http.get("/api/v1/stats").json()
        # The first read already sees the block bytes and the rate of the last two frames.
        assert first["bytes_by_medium"] == {"CPU": 3 * 4096}
        assert first["stores_per_s"] == pytest.approx(20.0)
        assert first["transfer_bytes_per_s"] == {"h2d": pytest.approx(4000.0)}
        assert first["stores_completed"] == 30
        # Reading again, or often, changes nothing: the rate spans frames, not reads.
        for _ in range(3):
            again = http.get("/api/v1/stats").json()
            assert (again["stores_per_s"], again["bytes_by_medium"]) == (
                first["stores_per_s"],
                first["bytes_by_medium"],
            )

        publisher.publish_stats(a_frame(13.0, 30, 5000, bytes_per_block=4096))  # idle
        wait_until(ingested(13.0), "the idle frame is ingested")
        idle = http.get("/api/v1/stats").json()
        assert (idle["stores_per_s"], idle["transfer_bytes_per_s"]) == (0.0, {"h2d": 0.0})

        publisher.publish_stats(a_frame(14.0, 0, 0, bytes_per_block=4096))  # a restart
        wait_until(ingested(14.0), "the reset frame is ingested")
        reset = http.get("/api/v1/stats").json()
        assert (reset["stores_per_s"], reset["transfer_bytes_per_s"]) == (None, {})
        assert reset["stores_completed"] == 0


# --- listen mode: publishers that connect show as connect-mode ones do -------------------


def test_listen_mode_publishers_show_in_stats_metrics_and_readiness() -> None:
    settings = SidecarSettings(
        listen=["tcp://127.0.0.1:*"],
        listen_replay=[f"engine-a@0={free_tcp_endpoint()}"],
        listen_allow=["127.0.0.0/8", "::1"],
    )
    state = SidecarState.from_settings(settings)
    ingestor = Ingestor(state)
    ingestor.start()
    assert state.listener is not None
    raw = RawPublisher(connect=state.listener.bound[0], topic=b"engine-b")
    try:
        with served(settings, state) as http:
            unready = http.get("/readyz")
            assert (unready.status_code, unready.json()["unseen"]) == (503, ["engine-a@0"])
            frame = StatsFrame(  # names stream engine-b@0: its engine id is its topic
                ts=1.0, engine_id="engine-b", rank=0,
                config=WorkerConfig(policy="arc", capacity_blocks=8, block_size=16,
                                    bytes_per_block=4096),
                gauges=[Sample(name=m.BLOCKS_CAPACITY.name, labels={"medium": "CPU"}, value=8)],
            )  # fmt: skip

            def probe() -> bool:  # ZMQ's slow joiner: frames before the connection are lost
                raw.pub.send_multipart([b"kvscope.stats", b"\0" * 8, encode_stats_frame(frame)])
                heard = state.publishers.get("engine-b@0")
                return heard is not None and heard.stats_frames > 0

            wait_until(probe, "the sidecar hears the publisher on its listen socket")
            raw.send(0, kv_payload(OffloadingEvent([1, 2], 16, "CPU", False), rank=0))
            wait_until(lambda: state.event_log.last_id == 1, "the stores are ingested")

            stats = http.get("/api/v1/stats").json()
            publishers = {p["name"]: p for p in stats["publishers"]}
            listened = publishers["engine-b@0"]
            assert (listened["mode"], listened["seen"], listened["last_seq"]) == ("listen", True, 0)
            assert (listened["engine_id"], listened["policy"]) == ("engine-b", "arc")
            assert (publishers["engine-a@0"]["mode"], publishers["engine-a@0"]["seen"]) == (
                "listen",
                False,
            )
            assert stats["bytes_by_medium"] == {"CPU": 2 * 4096}
            listener = stats["listener"]
            assert listener["endpoints"] == [state.listener.bound[0]]
            assert listener["frames"] >= 2
            assert (listener["malformed"], listener["refused"]) == (0, 0)
            assert (listener["publishers"], listener["max_publishers"]) == (2, 64)
            assert (listener["connections"], listener["max_connections"]) == (1, 128)
            assert listener["refused_connections"] == 0
            assert (listener["max_connections_per_host"], listener["refused_host_connections"]) == (
                32,
                0,
            )
            assert listener["allow"] == ["127.0.0.0/8", "::1/128"]
            assert (listener["refused_addresses"], listener["shed_connections"]) == (0, 0)
            assert (listener["stream_moves"], listener["stream_move_resets"]) == (0, 0)

            metrics = http.get("/metrics").text
            assert 'kvscope_sidecar_frames_total{publisher="engine-b@0"}' in metrics
            assert 'kvscope_sidecar_frames_total{publisher="engine-a@0"} 0.0' in metrics
            assert "kvscope_sidecar_listen_frames_total " in metrics
            assert "kvscope_sidecar_listen_refused_frames_total 0.0" in metrics
            assert "kvscope_sidecar_listen_connections 1.0" in metrics
            assert "kvscope_sidecar_listen_refused_connections_total 0.0" in metrics
            assert "kvscope_sidecar_listen_refused_host_connections_total 0.0" in metrics
            assert "kvscope_sidecar_listen_refused_addresses_total 0.0" in metrics
            assert "kvscope_sidecar_listen_shed_connections_total 0.0" in metrics
            assert "kvscope_sidecar_listen_stream_moves_total 0.0" in metrics
            assert "kvscope_sidecar_listen_stream_move_resets_total 0.0" in metrics
            for reason in ("publisher", "host", "max_media"):
                refused = f'kvscope_sidecar_refused_media_events_total{{reason="{reason}"}} 0.0'
                assert refused in metrics
            capacity = next(
                sample
                for family in text_string_to_metric_families(metrics)
                for sample in family.samples
                if sample.name == m.BLOCKS_CAPACITY.name
            )
            assert capacity.labels == {
                "medium": "CPU", "publisher": "engine-b@0", "engine": "engine-b", "rank": "0"
            }  # fmt: skip
    finally:
        ingestor.close()
        raw.close()


def test_metrics_count_stranded_blocks_per_publisher_and_medium() -> None:
    settings = SidecarSettings(connect=[ENDPOINT])
    state = SidecarState.from_settings(settings)
    chain = DecodedEvent("stored", [1, 2, 3], "CPU", 16)
    state.index.apply("w", DecodedBatch(1.0, 0, [chain, DecodedEvent("removed", [1], "CPU")]), 1.0)
    with served(settings, state) as http:
        families = {f.name: f for f in text_string_to_metric_families(http.get("/metrics").text)}
    (sample,) = families["kvscope_sidecar_stranded_blocks"].samples
    assert sample.labels == {"publisher": "w", "medium": "CPU"} and sample.value == 2


def full_collections(http: TestClient) -> tuple[float, float]:
    """How many full collections /metrics counts, and their total seconds."""
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(http.get("/metrics").text)
        if family.name == "kvscope_sidecar_gc_pause_seconds"
        for sample in family.samples
        if sample.labels == {"generation": "2"}  # the count and the sum (buckets have le)
    }
    return (
        samples["kvscope_sidecar_gc_pause_seconds_count"],
        samples["kvscope_sidecar_gc_pause_seconds_sum"],
    )


def test_metrics_time_the_garbage_collections_and_serve_the_process_families() -> None:
    with client() as http:
        count, seconds = full_collections(http)
        gc.collect()
        gc.collect()
        after, after_seconds = full_collections(http)
        names = {f.name for f in text_string_to_metric_families(http.get("/metrics").text)}
    assert after >= count + 2 and after_seconds > seconds
    assert {"process_resident_memory_bytes", "python_info", "python_gc_collections"} <= names


def test_a_publisher_silent_past_the_connected_window_adds_no_rate_only_its_totals() -> None:
    """A worker that died kept its last rates in the sums and the history for good (27 s after
    the demo stopped, 4,378 stores per second); its totals stand, its rates stop."""
    live, gone = "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"
    settings = SidecarSettings(connect=[live, gone])
    state = SidecarState.from_settings(settings)
    now = time.time()
    for name, heard_at, stores in ((live, now, 10), (gone, now - CONNECTED_WITHIN_S - 1, 100)):
        publisher = state.publishers[name]
        first, second = (
            a_frame(1.0, 0, 0, bytes_per_block=None),
            a_frame(2.0, stores, 0, bytes_per_block=None),
        )
        publisher.worker = WorkerStats.between(first, second)
        publisher.last_frame_at = heard_at
    body = served(settings, state).get("/api/v1/stats").json()
    assert body["stores_per_s"] == pytest.approx(10.0)  # the live one's alone
    assert body["stores_completed"] == 110  # both totals
    assert [p["connected"] for p in body["publishers"]] == [True, False]
    for offset in (0.0, 1.0, 2.0):  # points close once the next second begins
        state.sample_history(now + offset)
    rates = {
        series["publisher"]
        for series in served(settings, state).get("/api/v1/history").json()["series"]
        if series["metric"] == "stores_per_s"
    }
    assert rates == {live}
