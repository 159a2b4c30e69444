"""Device-memory preflight for direct-GPU loading (DG-6).

Before any byte moves, a direct load compares the bytes its checkpoint headers declare (plus the
largest tensor in flight and a stated margin) with the free memory the platform reports, and
refuses with a clear error instead of running out of memory halfway.
"""

from __future__ import annotations

import torch

from reference.errors import DeviceMemoryError
from reference.read.checkpoint import Checkpoint
from reference.request.args import DIRECT_FLAG
from reference.request.platform import Platform

__all__ = [
    "MARGIN_FRACTION",
    "MIN_MARGIN_BYTES",
    "check_device_memory",
    "device_memory_margin",
    "required_device_bytes",
]

MARGIN_FRACTION = 0.05
MIN_MARGIN_BYTES = 256 * 1024**2


def device_memory_margin(total_bytes: int) -> int:
    """The stated margin: 5% of the weights, at least 256 MiB (allocator slack, CUDA context)."""
    return max(MIN_MARGIN_BYTES, int(total_bytes * MARGIN_FRACTION))


def required_device_bytes(checkpoint: Checkpoint) -> int:
    """Device bytes a direct load needs: every tensor the headers declare, plus the largest one
    in flight (the peak DG-5 allows), plus the margin."""
    total = checkpoint.total_bytes
    return total + checkpoint.largest_tensor_bytes + device_memory_margin(total)


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


def check_device_memory(
    checkpoint: Checkpoint,
    *,
    component: str,
    device: torch.device,
    platform: Platform,
    flag: str = DIRECT_FLAG,
) -> int:
    """DG-6: refuse a direct load that cannot fit, before any byte moves.

    Reads nothing but the headers already parsed into `checkpoint`. A CPU target is not an
    accelerator and is not checked.

    Returns:
        The bytes required (0 for a CPU target).

    Raises:
        DeviceMemoryError: naming the component, the device, the bytes needed and free, and
            what to do.
    """
    if device.type == "cpu":
        return 0
    total = checkpoint.total_bytes
    needed = required_device_bytes(checkpoint)
    free = platform.free_device_memory(device)
    if needed > free:
        raise DeviceMemoryError(
            f"{flag}: component {component!r} needs {_gib(needed)} ({needed} bytes) on {device}"
            f" ({_gib(total)} of weights from the headers + {_gib(checkpoint.largest_tensor_bytes)}"
            f" largest tensor in flight + {_gib(device_memory_margin(total))} margin), but only"
            f" {_gib(free)} ({free} bytes) is free; free device memory, or drop {flag} to load"
            " through CPU"
        )
    return needed
