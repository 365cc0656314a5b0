"""Moving small tensors between the host and the device without stalling the device's queue.

A GPU step should wait for the device once: where its results are read. `to_device` copies host-built tensors
(token ids, positions, block tables, masks) from pinned memory without blocking, so the kernels queued before keep
running; `to_host` reads every result a step needs at one synchronization. On CPU both are plain copies.
"""
from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def to_host(tensors: list[torch.Tensor]) -> list[list]:
    """The tensors' values as (nested) lists, read at one synchronization of the device they are on."""
    if not tensors:
        return []
    device = tensors[0].device
    if device.type == "cuda":
        host = [t.to("cpu", non_blocking=True) for t in tensors]  # into pinned buffers
        torch.cuda.current_stream(device).synchronize()
        tensors = host
    return [t.tolist() for t in tensors]
