"""The one place that asks the machine about CUDA.

Contract functions take a `Platform` argument instead of calling `torch.cuda` themselves, so tests
can pass a fake platform (CUDA present or not, any amount of free memory) and the real one is used
only at the edges (command line, GPU tier).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from reference.errors import ArgumentError

__all__ = [
    "SYSTEM",
    "Platform",
    "SystemPlatform",
    "default_runtime_device",
    "describe",
    "host_available_bytes",
]


@runtime_checkable
class Platform(Protocol):
    """Facts about the machine that loading decisions depend on."""

    def cuda_available(self) -> bool:
        """Whether a CUDA device can be used."""
        ...

    def device_count(self) -> int:
        """Number of visible CUDA devices (0 without CUDA)."""
        ...

    def free_device_memory(self, device: torch.device) -> int:
        """Free bytes on `device` right now. Raises ArgumentError for a non-CUDA device."""
        ...

    def available_host_memory(self) -> int | None:
        """Bytes of host memory this process can still take (None: not known, no check)."""
        ...


@dataclass(frozen=True)
class SystemPlatform:
    """The real machine, as torch sees it."""

    def cuda_available(self) -> bool:
        return torch.cuda.is_available()

    def device_count(self) -> int:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def free_device_memory(self, device: torch.device) -> int:
        if device.type != "cuda":
            raise ArgumentError(
                f"free_device_memory needs a cuda device, got {device}; ask it of a cuda device"
            )
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)

    def available_host_memory(self) -> int | None:
        return host_available_bytes()


def host_available_bytes(
    *, meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """Bytes the host can give this process now: MemAvailable, lowered to what the cgroup
    (v2 `memory.max` - `memory.current`) still allows; None where neither is known."""
    found: list[int] = []
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            used = int((cgroup / "memory.current").read_text())
            found.append(max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


SYSTEM = SystemPlatform()


def default_runtime_device(platform: Platform) -> torch.device:
    """Where components compute when no device is given: cuda:0 when `platform` reports CUDA,
    else the CPU (the same choice on the command line and through the library)."""
    return torch.device("cuda", 0) if platform.cuda_available() else torch.device("cpu")


def describe(platform: Platform = SYSTEM) -> str:
    """One line naming torch, its CUDA build and the visible devices (for reports and errors)."""
    cuda_build = torch.version.cuda or "none (CPU-only build)"
    return (
        f"torch {torch.__version__}, CUDA build {cuda_build}, "
        f"cuda available: {platform.cuda_available()}, visible devices: {platform.device_count()}"
    )
