"""A process that runs kvscope as vLLM's worker process does, for tests of how it ends.

Run as ``python -m tests.vllm.kvscope_process MODE PORT``: both halves of kvscope's spec
built through vLLM's ``OffloadingConfig`` (the publisher on PORT with its replay socket on
PORT + 1, the transfer worker), a subscriber and a replay peer that never read what they
are sent, and stores and batches flowing until it prints ``running``. Then, by MODE:

``exit``: it returns with everything open, as a process whose teardown never reached
vLLM's ``shutdown`` hooks; ``signal``: it keeps stores and batches flowing under vLLM's
``WorkerProc`` handler (SystemExit on the first SIGTERM or SIGINT, later ones ignored),
and shuts the connector down as vLLM does, worker side first, on the way out.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

import zmq
from vllm.v1.kv_offload.base import GPULoadStoreSpec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from bench.tooling.vllm_config import SPEC, offloading_config
from offload.base import OffloadingEvent
from offload.vllm import KVScopeOffloadingSpec
from offload.wire.framing import encode_seq
from tests.vllm.test_worker_and_metrics import _caches


def main(mode: str, port: int) -> None:
    extra = {
        **SPEC,
        "kvscope_endpoint": f"tcp://127.0.0.1:{port}",
        "kvscope_replay_endpoint": f"tcp://127.0.0.1:{port + 1}",
        "num_cpu_blocks": 64,
    }
    spec = KVScopeOffloadingSpec(offloading_config(extra))
    manager = spec.get_manager()
    worker = spec.get_worker(_caches())
    assert manager.telemetry is not None
    publisher = manager.telemetry.publisher
    context = zmq.Context()
    deaf = context.socket(zmq.SUB)
    deaf.rcvhwm = 1
    deaf.subscribe(b"")
    deaf.connect(publisher.endpoint)
    asker = context.socket(zmq.DEALER)
    asker.rcvhwm = 1
    asker.connect(publisher.replay_endpoint)
    jobs = iter(range(sys.maxsize))

    def flow(batches: int) -> None:
        for _ in range(batches):
            job = next(jobs)
            event = OffloadingEvent([job * 64 + i for i in range(64)], 16, "CPU", False)
            publisher.publish_events([event])
            asker.send_multipart([b"", encode_seq(0)])
            worker.submit_store(
                job, GPULoadStoreSpec([job % 8], [1], [0]), CPULoadStoreSpec([job % 64])
            )
            worker.get_finished()

    requested = False

    def vllm_worker_handler(signum: int, frame: FrameType | None) -> None:
        nonlocal requested
        if not requested:
            requested = True
            raise SystemExit()

    if mode == "signal":
        signal.signal(signal.SIGTERM, vllm_worker_handler)
        signal.signal(signal.SIGINT, vllm_worker_handler)
    flow(500)
    print("running", flush=True)
    if mode == "exit":
        return
    try:
        while True:
            flow(100)
    finally:
        worker.shutdown()
        manager.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
