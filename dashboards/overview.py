"""kvscope Overview: is the CPU tier earning its keep, are transfers keeping up, is the feed whole.

Rows go from the verdict (health figures) to the causes (stores, loads,
evictions), then transfers, the sidecar's event feed, and vLLM's own
prefix-cache figures beside kvscope's when vLLM is scraped too.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from dashboards import rules
from dashboards.kit import (
    BLOCKS,
    BLOCKS_PER_S,
    MEDIUM,
    ON,
    PUBLISHER,
    SIDECAR,
    TIER,
    TIER_LEGEND,
    TOKENS_PER_S,
    VLLM,
    VLLM_ON,
    WORKER,
    Panel,
    Query,
    build_dashboard,
    rate,
    series,
    stat_panel,
    timeseries_panel,
)

UID = "kvscope-overview"
VLLM_ROW = "vLLM prefix cache: GPU tier (vLLM) beside CPU tier (kvscope)"
"""The row of vLLM's own prefix cache, mostly vLLM's series: data only with vLLM scraped.
(vLLM's transfer series sit in the Transfers row, beside kvscope's.)"""
EVENTS_ROW = "Event feed (sidecar)"
"""The row of the feed's two ends: the workers' publishers and the sidecars that follow them."""
LAG = series("kvscope_sidecar_ingest_lag_seconds", PUBLISHER)
STATS = series("kvscope_blocks_capacity", TIER)
"""A series only a publisher that sends stats frames has (kvscope's, not vLLM's own
event stream): matched on a stream, it tells whether that stream should never be quiet."""
SIDECAR_SHEDS = (
    ("sse_shed", "event-stream readers shed"),
    ("event_log_shed", "events not logged"),
    ("history_refused", "history readings refused"),
    ("refused_media_events", "events past the media tracked"),
    ("refused_location_events", "events past the groups tracked"),
)
"""A sidecar's own counters of what it let go (kvscope_sidecar_<name>_total), by legend."""
SIDECAR_BUFFERS = (
    ("event_log", "event log"),
    ("history", "history"),
    ("insight", "hit-ratio curves"),
    ("insight_queue", "queue to the shadow tiers"),
    ("http_response_buffer", "response buffers"),
    ("worker_text", "workers' text"),
)
"""A sidecar's bounded buffers (kvscope_sidecar_<name>_bytes), by legend."""
STREAM = "instance, publisher"
"""A sidecar's stream: every pod's sidecar may name its publisher alike (the pod's
loopback, tcp://127.0.0.1:5560), so the scrape target tells them apart (legend: ON)."""


def _by(labels: str, expr: str) -> str:
    return f"sum by ({labels}) ({expr})"


def _quantiles(
    histogram: str, scope: tuple[str, ...], by: str, *matchers: str, legend: str | None = None
) -> list[Query]:
    """p50 and p99 of a kvscope histogram, one series per ``by`` value (labels, comma
    separated); ``legend`` follows the quantile in the legend (default: the ``by`` label)."""
    buckets = _by(f"{by}, le", rate(f"{histogram}_bucket", scope, *matchers))
    shown = f"{{{{{by}}}}}" if legend is None else legend
    return [
        Query(f"histogram_quantile({q}, {buckets})", f"p{round(q * 100)} {shown}")
        for q in (0.5, 0.99)
    ]


def _health() -> list[Panel]:
    return [
        stat_panel(
            "Invariant violations",
            "Broken bookkeeping invariants in the tier (free + used = capacity, one owner per "
            "slot). Healthy: 0, always; anything else is a bug, see the alert's runbook.",
            "none",
            Query(f"max({series('kvscope_invariant_violations', TIER)})", "violations"),
            red_from=1,
        ),
        stat_panel(
            "Lookup hit ratio (5m)",
            "Blocks found in the CPU tier over blocks asked for, per tier (engine/rank medium, "
            "publisher on its sidecar). Healthy depends on reuse in the workload: steady, and "
            "well above 0 for chat.",
            "percentunit",
            Query(series(rules.HIT_RATIO, TIER), TIER_LEGEND),
        ),
        stat_panel(
            "Occupancy",
            "Resident over capacity. Healthy: climbs to ~100% and stays there once warm; "
            "a full tier is the point, thrashing is not (see evictions and dead writes).",
            "percentunit",
            Query(series(rules.OCCUPANCY, TIER), TIER_LEGEND),
        ),
        stat_panel(
            "Publishers silent > 60 s",
            "Streams of publishers that send stats frames (kvscope's) whose last frame is "
            "over a minute old, the streams KVScopePublisherSilent watches. Healthy: 0; a "
            "live kvscope publisher sends a stats frame at least every 5 s, idle or not. "
            "vLLM's own event stream sends none and is quiet whenever its engine idles, so "
            "it is left out (its lag is on the Event lag panel).",
            "none",
            Query(
                f"count({LAG} > 60 and on (job, instance, publisher) {STATS}) or vector(0)",
                "silent",
            ),
            red_from=1,
        ),
    ]


def _tier() -> list[Panel]:
    return [
        timeseries_panel(
            "Capacity and occupancy per medium",
            "Blocks resident against the tier's capacity. Healthy: resident rises to capacity "
            "and holds; a gap that never closes means the tier is larger than the reuse.",
            BLOCKS,
            Query(_by("medium", series("kvscope_blocks_resident", TIER)), "resident {{medium}}"),
            Query(_by("medium", series("kvscope_blocks_capacity", TIER)), "capacity {{medium}}"),
        ),
        timeseries_panel(
            "Hit ratio (5m)",
            "Lookups' hits over lookups, in blocks and in tokens, from counter rates "
            "(recording rules). Healthy: steady; a sudden fall means the working set no "
            "longer fits or the traffic changed.",
            "percentunit",
            Query(series(rules.HIT_RATIO, TIER), f"blocks {TIER_LEGEND}"),
            Query(series(rules.TOKEN_HIT_RATIO, TIER), f"tokens {TIER_LEGEND}"),
            percent=True,
        ),
        timeseries_panel(
            "Stores",
            "Blocks offered to the tier and what became of them: skipped (held already), "
            "not_admitted (the policy's admission judged them not worth a slot: gated, "
            "store_threshold), refused (no room, every slot pinned) or admitted, then "
            "completed or failed. Healthy: completed tracks admitted; refused and failed "
            "stay at 0.",
            BLOCKS_PER_S,
            *(
                Query(
                    _by("medium", rate(f"kvscope_store_{kind}_blocks_total", TIER)),
                    f"{kind} {{{{medium}}}}",
                )
                for kind in (
                    "requested",
                    "skipped",
                    "not_admitted",
                    "refused",
                    "admitted",
                    "completed",
                    "failed",
                )
            ),
        ),
        timeseries_panel(
            "Loads",
            "Blocks brought back to the GPU on a prefix hit. Healthy: completed tracks "
            "submitted; their rate is the tier's pay-off.",
            BLOCKS_PER_S,
            Query(_by("medium", rate("kvscope_load_blocks_total", TIER)), "submitted {{medium}}"),
            Query(
                _by("medium", rate("kvscope_load_completed_blocks_total", TIER)),
                "completed {{medium}}",
            ),
        ),
        timeseries_panel(
            "Evictions by reason",
            "Blocks leaving the tier: capacity (room for a store), failed_store (rolled back), "
            "clear (a cache reset). Healthy: capacity only, at or below the store rate.",
            BLOCKS_PER_S,
            Query(_by("reason", rate("kvscope_evicted_blocks_total", TIER)), "{{reason}}"),
        ),
        timeseries_panel(
            "Dead writes",
            "Share of evicted blocks that were never loaded: writes that bought nothing "
            "(recording rule). Healthy: well under 90%; near 100% means the tier stores "
            "what is never reused (raise store_threshold, try policy arc).",
            "percentunit",
            Query(series(rules.DEAD_WRITE_RATIO, TIER), TIER_LEGEND),
            percent=True,
        ),
        timeseries_panel(
            "Pinned blocks (in flight)",
            "Blocks held by loads or stores still in flight. Healthy: small and returning "
            "to 0; a level that only grows means transfers are not completing.",
            BLOCKS,
            Query(_by("reason", series("kvscope_blocks_pinned", TIER)), "{{reason}}"),
            width=8,
        ),
        timeseries_panel(
            "Transfer jobs in flight",
            "Jobs submitted but not finished, per direction, from kvscope's own transfer "
            "backends where kvscope drives them (the demo, an engine calling them itself). "
            "Inside vLLM 0.33 vLLM counts the transfers and keeps no in-flight figure, so "
            "this panel stays empty there. Healthy: a handful, back to 0 when idle; growth "
            "means the copy engine falls behind.",
            "suffix: jobs",
            Query(
                f"{_by('direction', series('kvscope_transfer_jobs_submitted_total', WORKER))}"
                f" - {_by('direction', series('kvscope_transfer_jobs_total', WORKER))}",
                "{{direction}}",
            ),
            width=8,
        ),
        timeseries_panel(
            "Manager call latency",
            "Time in manager calls that evict and allocate (prepare_store), p50 and p99. "
            "Healthy: microseconds; it runs on the scheduler's critical path.",
            "s",
            *_quantiles("kvscope_manager_operation_duration_seconds", TIER, "operation"),
            width=8,
        ),
    ]


def _why() -> list[Panel]:
    return [
        timeseries_panel(
            "Lost blocks by reason",
            "Blocks lookups lost, by the reason of the lookup's first missing block: cold "
            "(never stored), evicted (stored, then evicted for room), not_admitted (refused "
            "by the policy's admission), no_room (its store refused for want of room: a "
            "request longer than the tier, or every slot pinned), in_flight (still being "
            "written); prefix_lost: held, "
            "but behind the break. Healthy: mostly cold; evicted dominating means the tier is "
            "too small or the policy evicts what returns (see the curve).",
            BLOCKS_PER_S,
            Query(_by("reason", rate("kvscope_lookup_miss_blocks_total", TIER)), "{{reason}}"),
        ),
        timeseries_panel(
            "Stranded blocks",
            "Blocks held that no prefix lookup can reach, because a block before them in "
            "their chain is held nowhere (from the events, by the sidecar). Healthy: a small "
            "share of occupancy; a large one is capacity spent on nothing.",
            BLOCKS,
            Query(
                _by("medium", series("kvscope_sidecar_stranded_blocks", PUBLISHER, MEDIUM)),
                "{{medium}}",
            ),
        ),
        timeseries_panel(
            "Hit ratio at other capacities",
            "The sidecar's estimate, from the worker's sampled references, of the hit ratio "
            "the tier would reach at a multiple of its capacity, per publisher and simulated "
            "policy. Read it as: what would more memory, or another policy, buy. Healthy: x1 "
            "of the tier's policy near the measured hit ratio; a steep rise towards x2 means a "
            "larger tier pays.",
            "percentunit",
            Query(
                series("kvscope_sidecar_hit_ratio_curve", PUBLISHER),
                f"{{{{policy}}}} x{{{{multiple}}}} {ON}",
            ),
            percent=True,
        ),
        timeseries_panel(
            "Admission candidates (gated)",
            "Under the gated policy, per tier: the recent hit ratio of the tier's small model "
            "of each admission candidate (a hash sample of the traffic, at the same share of the "
            "capacity), and the candidate the tier runs as. Read it as: which admission rule "
            "pays on this traffic, and by how much. Healthy: the followed candidate at or "
            "near the top; another far ahead for long means a switch is pending (the tier "
            "waits for a lead beyond chance). No data under other policies.",
            "percentunit",
            Query(
                series("kvscope_admission_candidate_hit_ratio", TIER),
                f"{{{{candidate}}}} {TIER_LEGEND}",
            ),
            # `and` matches on every label: a tier's candidate, not another pod's alike
            Query(
                f"{series('kvscope_admission_candidate_hit_ratio', TIER)} "
                f"and ({series('kvscope_admission_candidate_followed', TIER)} == 1)",
                f"followed: {{{{candidate}}}} {TIER_LEGEND}",
            ),
            percent=True,
        ),
        timeseries_panel(
            "Efficiency against the optimum",
            "The tier's policy's hits over those of a clairvoyant cache of the same size "
            "(farthest next use, with bypass), both replayed by the sidecar from empty over "
            "the last sampled references, and the two hit ratios over that window. Read it "
            "as: how much of the reachable hit ratio the policy gets. Healthy: near 100%; far "
            "below it, a better policy or admission could gain up to the optimum's hit ratio "
            "without more memory; both low, only more capacity helps.",
            "percentunit",
            Query(series(rules.WINDOW_EFFICIENCY, PUBLISHER), f"efficiency {ON}"),
            Query(series(rules.WINDOW_OPTIMUM_HIT_RATIO, PUBLISHER), f"optimum {ON}"),
            Query(series(rules.WINDOW_TIER_HIT_RATIO, PUBLISHER), f"the policy {ON}"),
            percent=True,
        ),
    ]


TRANSFER_SOURCES = (
    "Two sources: the series legended by direction are kvscope_transfer_*, from kvscope's "
    "own transfer backends where kvscope drives them (kvscope demo, an engine calling them "
    "itself); inside vLLM 0.33 vLLM counts the transfers itself (series legended vLLM: "
    "store = gpu_to_cpu, load = cpu_to_gpu) and kvscope's stay empty."
)
"""Which transfer series come from where, for every panel that plots both."""


def _vllm_transfer_rates(store: str, load: str) -> list[Query]:
    """Per-second rates of vLLM's store and load counters, per served model."""
    return [
        Query(_by("model_name", rate(metric, VLLM)), f"vLLM {kind} {{{{model_name}}}}")
        for kind, metric in (("store", store), ("load", load))
    ]


def _transfers() -> list[Panel]:
    return [
        timeseries_panel(
            "Transfer bandwidth",
            "Bytes per second moved by successful jobs, per direction. "
            + TRANSFER_SOURCES
            + " Healthy: gpu_to_cpu (vLLM store) follows the store rate, cpu_to_gpu (vLLM "
            "load) the load rate; far below the link's speed.",
            "Bps",
            Query(_by("direction", rate("kvscope_transfer_bytes_total", WORKER)), "{{direction}}"),
            *_vllm_transfer_rates(
                "vllm:kv_offload_store_bytes_total", "vllm:kv_offload_load_bytes_total"
            ),
        ),
        timeseries_panel(
            "Transfer latency",
            "Job time from submit to finish: kvscope's p50 and p99 per direction; vLLM keeps "
            "no per-job time histogram, only the total, so its series is the mean job time "
            "over 5 minutes (recording rule). "
            + TRANSFER_SOURCES
            + " Healthy: steady and well under a scheduler step (milliseconds); see the "
            "Transfers dashboard.",
            "s",
            *_quantiles("kvscope_transfer_duration_seconds", WORKER, "direction"),
            Query(
                series(rules.VLLM_OFFLOAD_MEAN_SECONDS, VLLM),
                f"vLLM mean {{{{direction}}}} {VLLM_ON}",
            ),
        ),
    ]


def _events() -> list[Panel]:
    return [
        timeseries_panel(
            "Event lag per publisher",
            "Seconds since the sidecar's last frame from each publisher, per sidecar. "
            "Healthy: about a second or less while the engine serves (stats frames come once "
            "a second).",
            "s",
            Query(LAG, ON),
            width=8,
        ),
        timeseries_panel(
            "Gaps and lost batches per publisher",
            "Sequence jumps the sidecar saw, batches lost for good (not replayable), "
            "publisher restarts, live frames dropped while a replay held them past "
            "KVSCOPE_REPLAY_HOLD_BYTES, and connect sockets made again (or replay endpoints "
            "switched) for the address family an unheard publisher's host name came to "
            "resolve to, per sidecar. Healthy: 0; gaps that replay fills and frames dropped "
            "while replaying (replayed afterwards) are recoverable, lost batches are not; a "
            "family change or two while a service's pods come up (its name resolving late) "
            "is the sidecar following it; a source of the other family (a connect from a "
            "source address whose host name came to resolve to the other family alone) "
            "cannot connect until the name resolves to the source's family again.",
            "cps",
            *(
                Query(
                    _by(STREAM, rate(f"kvscope_sidecar_{name}_total", PUBLISHER)),
                    f"{label} {ON}",
                )
                for name, label in (
                    ("gaps", "gaps"),
                    ("missed_batches", "lost"),
                    ("held_dropped_frames", "dropped while replaying"),
                    ("family_changes", "address family changes"),
                    ("source_family_mismatches", "sources of the other family"),
                )
            ),
            Query(
                _by(STREAM, rate("kvscope_sidecar_restarts_total", PUBLISHER)),
                f"restarts {ON}",
            ),
            width=8,
        ),
        timeseries_panel(
            "Drops and replays per publisher",
            "Frames the worker's publisher dropped (consumer slow or absent), events it left "
            "out because a hash could not be encoded, batches the sidecar fetched by replay, "
            "the replays it asked for by how they ended (unstarted: its replay socket could "
            "not be made), replay requests answered and replay answers cut short (their "
            "batches are lost), per sidecar. Healthy: drops, unsendable events and cut "
            "answers 0; replays only after a gap, and none unstarted.",
            "cps",
            Query(
                _by(STREAM, rate("kvscope_publisher_dropped_frames_total", WORKER)),
                f"dropped {ON}",
            ),
            Query(
                _by(STREAM, rate("kvscope_publisher_unsendable_events_total", WORKER)),
                f"unsendable events {ON}",
            ),
            Query(
                _by(STREAM, rate("kvscope_sidecar_replayed_batches_total", PUBLISHER)),
                f"replayed {ON}",
            ),
            Query(
                _by(f"{STREAM}, outcome", rate("kvscope_sidecar_replays_total", PUBLISHER)),
                f"replays {{{{outcome}}}} {ON}",
            ),
            Query(
                _by(
                    f"{STREAM}, outcome",
                    rate("kvscope_publisher_replay_requests_total", WORKER),
                ),
                f"replay requests {{{{outcome}}}} {ON}",
            ),
            Query(
                _by(STREAM, rate("kvscope_publisher_truncated_replays_total", WORKER)),
                f"replays cut short {ON}",
            ),
            width=8,
        ),
        timeseries_panel(
            "Frames per publisher",
            "Frames each publisher sent, by kind, and those each sidecar received and "
            "skipped as malformed. Healthy: a steady rate while serving, received as many as "
            "sent, malformed 0 (non-zero: a version mismatch).",
            "cps",
            Query(
                _by(f"{STREAM}, kind", rate("kvscope_publisher_frames_total", WORKER)),
                f"sent {{{{kind}}}} {ON}",
            ),
            Query(
                _by(STREAM, rate("kvscope_sidecar_frames_total", PUBLISHER)),
                f"received {ON}",
            ),
            Query(
                _by(STREAM, rate("kvscope_sidecar_malformed_frames_total", PUBLISHER)),
                f"malformed {ON}",
            ),
        ),
        timeseries_panel(
            "Listen-socket peers (listen mode)",
            "Peers each listening sidecar has admitted and still connected: one per engine "
            "rank and listen endpoint. Healthy: the engines' count, below "
            "KVSCOPE_LISTEN_MAX_CONNECTIONS (128). No data: no sidecar listens.",
            "suffix: peers",
            Query(
                _by("instance", series("kvscope_sidecar_listen_connections", SIDECAR)),
                "admitted {{instance}}",
            ),
        ),
        timeseries_panel(
            "Listen-socket frames and refusals (listen mode)",
            "Frames each listening sidecar received on its listen socket, those skipped "
            "before they named a stream, and those of new streams past its most publishers; "
            "handshakes it refused past its most peers, past a host's share, or from outside "
            "KVSCOPE_LISTEN_ALLOW (each has an alert and a runbook); connections it counted "
            "as admitted before they settled, past 16 waiting per place (a flood of "
            "connections); frames of a stream from another host than its last (its "
            "locations move to that host's share: an engine back from a new address, or "
            "two peers sending under one name) and those of the moves the new host's share "
            "could not take (the stream's blocks forgotten). Healthy: a steady rate "
            "received, everything else 0 (a refused engine is not followed; a move or two "
            "when a pod is rescheduled).",
            "cps",
            *(
                Query(
                    _by("instance", rate(f"kvscope_sidecar_listen_{name}_total", SIDECAR)),
                    f"{label} {{{{instance}}}}",
                )
                for name, label in (
                    ("frames", "received"),
                    ("malformed_frames", "malformed"),
                    ("refused_frames", "frames past the most publishers"),
                    ("refused_connections", "handshakes past the most peers"),
                    ("refused_host_connections", "handshakes past a host's share"),
                    ("refused_addresses", "handshakes outside the allowed networks"),
                    ("shed_connections", "connections admitted unsettled"),
                    ("stream_moves", "streams moved to another host"),
                    ("stream_move_resets", "moves that forgot a stream's blocks"),
                )
            ),
        ),
        timeseries_panel(
            "Sidecar block index",
            "Blocks each sidecar indexes against the most it holds. Healthy: tracked below "
            "max (else raise the index size: refusals follow).",
            BLOCKS,
            Query(
                _by("instance", series("kvscope_sidecar_tracked_blocks", SIDECAR)),
                "tracked {{instance}}",
            ),
            Query(
                _by("instance", series("kvscope_sidecar_tracked_blocks_max", SIDECAR)),
                "max {{instance}}",
            ),
        ),
        timeseries_panel(
            "Sidecar index refusals",
            "Blocks a full index refused, per second and sidecar: the API and the web page "
            "miss them (metrics are unaffected). Healthy: 0 (else raise KVSCOPE_MAX_BLOCKS).",
            BLOCKS_PER_S,
            Query(
                _by("instance", rate("kvscope_sidecar_index_overflow_total", SIDECAR)),
                "refused {{instance}}",
            ),
        ),
        timeseries_panel(
            "Sidecar faults",
            "Faults of each sidecar's own that its ingest got past, per second: a frame "
            "dropped, a step of its ingest loop skipped, a batch applied in part, each logged "
            "with its traceback. Healthy: 0 (else a bug: its alert's runbook says what to "
            "save).",
            "suffix: faults/s",
            Query(
                _by("instance", rate("kvscope_sidecar_ingest_faults_total", SIDECAR)),
                "faults {{instance}}",
            ),
        ),
        timeseries_panel(
            "Worker samples left out of /metrics",
            "Worker samples each sidecar's last scrape left out of its /metrics to keep the "
            "exposition valid: a metric another publisher named first with another type or "
            "labels, or a series another family prints (the sidecar's own process_* and "
            "python_* included). Other samples are served; these reach no panel or rule. "
            "Healthy: 0 (else workers disagree about a metric: check that they run one "
            "kvscope version, and that no worker exports a name the sidecar prints).",
            "suffix: samples",
            Query(
                _by("instance", series("kvscope_sidecar_conflicting_samples", SIDECAR)),
                "left out {{instance}}",
            ),
        ),
        timeseries_panel(
            "Sidecar sheds and refusals",
            "What each sidecar refused or let go to stay within its bounds, per second: HTTP "
            "requests refused by reason (body_too_large, connections_full, "
            "response_buffer_full, send_too_slow, pipeline_too_large, ...), event-stream "
            "readers shed for falling behind, events the recent-events log did not keep, "
            "history readings refused past its series, events naming a medium or a KV cache "
            "group past what the index tracks; per publisher, sample frames the hit-ratio "
            "curve missed and block references it shed (where: worker or shadows). Healthy: "
            "0, but for HTTP refusals of clients that misbehave.",
            "cps",
            Query(
                _by("instance, reason", rate("kvscope_sidecar_http_refused_total", SIDECAR)),
                "HTTP {{reason}} {{instance}}",
            ),
            *(
                Query(
                    _by("instance", rate(f"kvscope_sidecar_{name}_total", SIDECAR)),
                    f"{label} {{{{instance}}}}",
                )
                for name, label in SIDECAR_SHEDS
            ),
            Query(
                _by(STREAM, rate("kvscope_sidecar_sample_missed_frames_total", PUBLISHER)),
                f"curve frames missed {ON}",
            ),
            Query(
                _by(
                    f"{STREAM}, where",
                    rate("kvscope_sidecar_sample_shed_block_refs_total", PUBLISHER),
                ),
                f"curve block refs shed ({{{{where}}}}) {ON}",
            ),
        ),
        timeseries_panel(
            "Sidecar memory held",
            "Bytes each sidecar's bounded buffers hold: the recent-events log (at most "
            "KVSCOPE_EVENT_BUFFER_BYTES), the history's points, the hit-ratio curves' "
            "simulations (at most KVSCOPE_INSIGHT_MAX_BYTES per publisher), the queue to the "
            "shadow tiers, response bytes held for clients still reading (at most "
            "KVSCOPE_RESPONSE_BUFFER_BYTES), and the workers' exposition text kept between "
            "scrapes (about twice one stats frame's text per publisher). Healthy: each flat "
            "below its bound; a buffer at its bound sheds (see sheds and refusals).",
            "bytes",
            *(
                Query(
                    _by("instance", series(f"kvscope_sidecar_{name}_bytes", SIDECAR)),
                    f"{label} {{{{instance}}}}",
                )
                for name, label in SIDECAR_BUFFERS
            ),
        ),
        timeseries_panel(
            "Sidecar pauses (garbage collection)",
            "How long each sidecar's garbage collections held its requests and ingest, p50 "
            "and p99 by generation (2: a full collection). Healthy: milliseconds, flat as the "
            "index grows.",
            "s",
            *_quantiles(
                "kvscope_sidecar_gc_pause_seconds",
                SIDECAR,
                "instance, generation",
                legend="generation {{generation}} {{instance}}",
            ),
        ),
    ]


def _vllm() -> list[Panel]:
    tokens = "Healthy: GPU hits first, the CPU tier catching part of what the GPU lost."
    return [
        timeseries_panel(
            "Prefix-cache hit ratio: GPU and CPU tiers",
            "Token hit ratios: vLLM's GPU prefix cache, vLLM's external (connector) cache, "
            "and kvscope's CPU tier (recording rules). " + tokens + " vLLM series need vLLM "
            "scraped.",
            "percentunit",
            Query(series(rules.VLLM_GPU_HIT_RATIO, VLLM), f"GPU (vLLM) {VLLM_ON}"),
            Query(
                series(rules.VLLM_EXTERNAL_HIT_RATIO, VLLM),
                f"external, as vLLM counts it {VLLM_ON}",
            ),
            Query(series(rules.TOKEN_HIT_RATIO, TIER), f"CPU (kvscope) {TIER_LEGEND}"),
            percent=True,
        ),
        timeseries_panel(
            "KV-cache usage: GPU and CPU tiers",
            "vLLM's GPU KV-cache usage beside kvscope's CPU tier occupancy. Healthy: the GPU "
            "runs near full under load and the CPU tier holds what it evicts.",
            "percentunit",
            Query(series("vllm:kv_cache_usage_perc", VLLM), f"GPU (vLLM) {VLLM_ON}"),
            Query(series(rules.OCCUPANCY, TIER), f"CPU (kvscope) {TIER_LEGEND}"),
            percent=True,
        ),
        timeseries_panel(
            "Prompt tokens by source",
            "vLLM's prompt tokens: computed, from the local (GPU) prefix cache, or from "
            "an external KV transfer (the CPU tier). Healthy: computed a minority once warm.",
            TOKENS_PER_S,
            Query(_by("source", rate("vllm:prompt_tokens_by_source_total", VLLM)), "{{source}}"),
        ),
        timeseries_panel(
            "Cached prompt tokens by tier",
            "Prefix-cache hit tokens by the tier that supplied them (device = GPU, host = "
            "CPU). " + tokens,
            TOKENS_PER_S,
            Query(
                _by("source", rate("vllm:prompt_tokens_cached_by_source_total", VLLM)),
                "{{source}}",
            ),
        ),
    ]


def build() -> Dashboard:
    """The Overview dashboard."""
    return build_dashboard(
        UID,
        "kvscope / Overview",
        "kvscope's CPU tier, its transfers (kvscope's own, or vLLM's inside vLLM) and the "
        "sidecar's event feed; vLLM's prefix cache beside it when vLLM is scraped too.",
        [
            ("Health", _health()),
            ("CPU tier", _tier()),
            ("Why no hits", _why()),
            ("Transfers", _transfers()),
            (EVENTS_ROW, _events()),
            (VLLM_ROW, _vllm()),
        ],
    )
