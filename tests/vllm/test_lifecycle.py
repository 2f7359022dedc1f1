"""kvscope's spec torn down by vLLM 0.33's connector and built again in the same process.

vLLM tears its connector down with ``shutdown()``: the worker side first (its transfer
threads), then the scheduler side (the manager, with kvscope's publisher). An engine
restarted in the same process, as tests and ``LLM`` objects built one after another do,
builds the connector again from the same config: the same endpoint to bind, the same
policy, the same caches.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest
import torch
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from bench.tooling.vllm_config import SPEC, offloading_config
from offload.vllm import KVScopeOffloadingSpec
from offload.vllm import manager as manager_module
from tests.support.ports import held_tcp_ports
from tests.vllm.test_scheduler_connector import HYBRIDS, PAGE, Engine, _reuse
from tests.vllm.test_worker_and_metrics import _caches

HANG_S = 60
"""Far past the few seconds a process takes to end: only a hang reaches it."""


def _threads(name: str) -> int:
    return sum(thread.name == name for thread in threading.enumerate())


def test_vllms_scheduler_connector_built_again_on_the_same_endpoint_works_as_before() -> None:
    """Shut down, the manager has published what it held, closed its publisher and joined
    its thread, so the next connector binds the same endpoint and decides the same."""
    traces = []
    with held_tcp_ports() as port:  # the same port for both: none other may take it between
        extra = {
            **SPEC,
            "kvscope_endpoint": f"tcp://127.0.0.1:{port}",
            "cpu_bytes_to_use": 64 * PAGE,
        }
        for _ in range(2):
            engine = Engine(extra, HYBRIDS["full16+swa16"])
            assert _threads("kvscope-publisher") == 1
            _reuse(engine)
            engine.connector.shutdown()
            assert _threads("kvscope-publisher") == 0
            traces.append(engine.trace)
    assert traces[0] == traces[1]
    assert any(entry[0] == "load" for entry in traces[0])


def test_a_worker_shut_down_finishes_its_queued_jobs_and_joins_its_threads() -> None:
    """vLLM shuts the worker down with stores it queued possibly still running: each lands
    before shutdown returns, no transfer thread is left, and a worker built again on the
    same caches moves them as the first did."""
    caches = _caches()
    before = _threads("kvscope-transfer")
    for attempt in range(2):
        spec = KVScopeOffloadingSpec(offloading_config({"num_cpu_blocks": 8}))
        worker = spec.get_worker(caches)
        assert _threads("kvscope-transfer") == before + 1
        for job in range(4):
            gpu, cpu = GPULoadStoreSpec([job + attempt], [1], [0]), CPULoadStoreSpec([job])
            assert worker.submit_store(job, gpu, cpu)
        worker.shutdown()
        assert _threads("kvscope-transfer") == before
        for job in range(4):
            for tensor, tier in zip(caches.tensors, worker.backend.cpu_tensors, strict=True):
                assert torch.equal(
                    tier[job].view(torch.int8).flatten(), tensor.tensor[job + attempt]
                )


def test_the_scheduler_connector_shut_down_twice_with_stats_due_does_not_raise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second shutdown once a stats frame is due again (a second later, or at once here)
    published it to the closed publisher, which raised out of vLLM's teardown."""
    monkeypatch.setattr(manager_module, "STATS_INTERVAL_S", 0.0)
    extra = {**SPEC, "kvscope_endpoint": "tcp://127.0.0.1:*", "cpu_bytes_to_use": 64 * PAGE}
    engine = Engine(extra, HYBRIDS["full16+swa16"])
    _reuse(engine)
    engine.connector.shutdown()
    engine.connector.shutdown()
    assert _threads("kvscope-publisher") == 0


@pytest.mark.parametrize("mode", ["exit", "signal"])
def test_a_process_running_kvscope_ends_however_vllm_ends_it(mode: str) -> None:
    """It ends, and with status 0, with peers that never read connected: where no shutdown
    hook runs (``exit``: its publisher closes at exit, before pyzmq stops the garbage thread
    zero-copy frames need, and its transfer worker too; either, left running, aborted the
    process, the publisher in half the runs), and on
    two SIGTERMs microseconds apart under vLLM's worker handler, stores, batches and replay
    requests in flight (``signal``: the shutdown runs as the handler's SystemExit unwinds)."""
    with held_tcp_ports(2) as port:
        _ends(mode, port)


def _ends(mode: str, port: int) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.vllm.kvscope_process", mode, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "running\n"
        if mode == "signal":
            process.send_signal(signal.SIGTERM)
            process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=HANG_S) == 0
    finally:
        process.kill()
        process.wait()
