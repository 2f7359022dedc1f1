"""The CUDA backend's CPU tier: its allocation, the refusal to pin, its device view's description.

These run everywhere: without CUDA nothing can be pinned, which is the refusal
and the pageable fallback to check; the device view itself is tested on a GPU
(tests/offload/test_transfer_cuda.py).
"""

from __future__ import annotations

import logging

import pytest
import torch

from offload.transfer import host_tier
from tests.support import kv_caches

HAS_CUDA = torch.cuda.is_available()


def test_the_mapped_rows_describe_the_host_rows_exactly() -> None:
    """What torch wraps as the tier's device view: the same address, shape and byte strides."""
    tier = torch.arange(2 * 6 * 4, dtype=torch.int32).view(2, 6, 4)
    for rows in (tier[1], tier[:, 2:5].reshape(-1, 4), tier.view(torch.int64)[0, 1:, 1:]):
        interface = host_tier.MappedRows(rows).__cuda_array_interface__
        assert interface["data"] == (rows.data_ptr(), False)
        assert tuple(interface["shape"]) == tuple(rows.shape)
        contiguous = rows.is_contiguous()
        strides = interface["strides"]
        assert (strides is None) is contiguous
        if not contiguous:
            assert strides == tuple(s * rows.element_size() for s in rows.stride())


@pytest.mark.skipif(HAS_CUDA, reason="checks the tier where nothing can be pinned")
def test_an_unpinnable_tier_is_refused_or_falls_back_as_asked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without CUDA no memory can be pinned: the refusal names the bytes (and what torch's
    power-of-two allocator would have asked for); allow_pageable gives one zeroed allocation."""
    layout = kv_caches.make_layout(num_layers=3, num_gpu_blocks=4, geometry=(2, 1, 4))
    with pytest.raises(
        RuntimeError,
        match=r"cannot pin 480 B of host memory for 5 CPU blocks of 96 B "
        r"\(torch's pinned allocator asks for 512 B, the next power of two\); "
        r"lower cpu_bytes_to_use or pass allow_pageable=True",
    ):
        host_tier.allocate(layout, 5, allow_pageable=False)
    with caplog.at_level(logging.WARNING, logger=host_tier.__name__):
        tier, pageable = host_tier.allocate(layout, 5, allow_pageable=True)
    assert pageable
    assert "falls back to pageable host memory" in caplog.text
    assert tier.shape == (3, *layout.cpu_shape(5)) and not tier.any()
    two_layers = kv_caches.make_layout(num_layers=2, num_gpu_blocks=4, geometry=(2, 1, 4))
    with pytest.raises(RuntimeError, match=r"cannot pin 256 B .* 4 CPU blocks of 64 B; lower"):
        host_tier.allocate(two_layers, 4, allow_pageable=False)  # a power of two: asked as is


def test_size_text() -> None:
    size_text = host_tier.size_text
    assert size_text(5) == "5 B"
    assert size_text(3 << 20) == "3.0 MiB"
    assert size_text(12 << 30) == "12.0 GiB"
    assert size_text(3 << 59) == "1536.0 PiB"
