"""The vLLM compatibility tier: skipped as a whole where vLLM 0.33.0 is not installed."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "vllm.v1.kv_offload.factory", reason="needs vllm==0.33.0 (make test installs it)"
)
