"""The CUDA backend's CPU tier: every layer in one host allocation, pinned, seen from the device.

One allocation makes the tier's planes evenly strided, so one kernel can index
all of them; pinned memory is mapped into the device's address space, so
kernels reach it without the copy engine's staging round trip. Importing this
module needs no CUDA.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from offload.transfer.layout import KVLayout

logger = logging.getLogger(__name__)


def allocate(
    layout: KVLayout, num_cpu_blocks: int, allow_pageable: bool
) -> tuple[torch.Tensor, bool]:
    """``(tier, pageable)``: every layer's CPU tensor stacked in one zero-filled allocation
    (every page touched now, at start-up), pinned unless pinning fails and that is allowed.

    Without ``allow_pageable`` a failure to pin raises, naming the bytes asked for.
    """
    shape = layout.cpu_shape(num_cpu_blocks)  # validates num_cpu_blocks
    try:
        return zeros(shape, layout.dtype, layout.num_layers, pin=True), False
    except RuntimeError as exc:
        # Pinned memory freed before the failure sits in torch's pinned-memory cache;
        # hand it back, or a pageable retry (or the rest of the process) starves.
        empty_host_cache = getattr(torch.accelerator, "empty_host_cache", None)
        if empty_host_cache is not None:
            with contextlib.suppress(Exception):
                empty_host_cache()
        total = num_cpu_blocks * layout.bytes_per_cpu_block
        asked = 1 << (total - 1).bit_length()
        what = (
            f"cannot pin {size_text(total)} of host memory for {num_cpu_blocks} "
            f"CPU blocks of {size_text(layout.bytes_per_cpu_block)}"
            + (
                f" (torch's pinned allocator asks for {size_text(asked)}, the next power of two)"
                if asked > total
                else ""
            )
        )
        if not allow_pageable:
            raise RuntimeError(
                f"{what}; lower cpu_bytes_to_use or pass allow_pageable=True"
            ) from exc
        logger.warning(
            "%s; allow_pageable=True, so the CPU tier falls back to pageable host memory", what
        )
    return zeros(shape, layout.dtype, layout.num_layers, pin=False), True


def zeros(shape: tuple[int, ...], dtype: torch.dtype, count: int, *, pin: bool) -> torch.Tensor:
    """``count`` zeroed layers of ``shape``, stacked in one allocation."""
    return torch.zeros((count, *shape), dtype=dtype, pin_memory=pin)


def planes(tier: torch.Tensor, rows: list[torch.Tensor]) -> torch.Tensor:
    """Every plane of the tier as one (planes, rows, row) view, typed like ``rows``.

    ``rows`` lists the planes layer-major and K before V, the order in which
    they lie in the tier's one allocation, so plane i of the view is row view i.
    """
    return tier.view(len(rows), rows[0].shape[0], -1).view(rows[0].dtype)


class MappedRows:
    """Host rows described by the CUDA array interface, which torch wraps without copying.

    The view torch makes keeps this object, and so the host tensor, alive.
    """

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows
        self.__cuda_array_interface__ = rows.numpy().__array_interface__


def device_view(host: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """The pinned tier as a CUDA tensor over the same memory, or None if torch copies it.

    With unified addressing (every 64-bit CUDA platform), pinned host memory
    is mapped into the device's address space at its host address, so
    index kernels can gather from and scatter into it over the bus: the copy
    engine's staging round trip and the host's share of the copy disappear.
    A view at another address would be a copy, not the tier, so it is refused.
    """
    try:
        view = torch.as_tensor(MappedRows(host), device=device)
    except (RuntimeError, TypeError, ValueError):
        return None
    return view if view.data_ptr() == host.data_ptr() else None


def size_text(num_bytes: int) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1, one decimal."""
    if num_bytes < 1024:
        return f"{num_bytes} B"
    size = float(num_bytes)
    units = ("KiB", "MiB", "GiB", "TiB", "PiB")
    for unit in units:
        size /= 1024
        if size < 1024 or unit == units[-1]:
            return f"{size:.1f} {unit}"
    raise AssertionError("unreachable")
