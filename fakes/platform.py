"""A platform with chosen facts: CUDA present or not, any free device memory, any host memory."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.request.platform import host_available_bytes

__all__ = ["FakePlatform"]


@dataclass(frozen=True)
class FakePlatform:
    """Answers platform questions from its fields (see reference.request.platform.Platform)."""

    cuda: bool = True
    devices: int = 1
    free_bytes: int = 80 * 1024**3
    host_bytes: int | None = None
    """Available host memory; None: the real host's (`host_available_bytes`)."""

    def cuda_available(self) -> bool:
        return self.cuda

    def device_count(self) -> int:
        return self.devices if self.cuda else 0

    def free_device_memory(self, device: torch.device) -> int:
        if device.type != "cuda":
            raise ValueError(f"free_device_memory needs a cuda device, got {device}")
        return self.free_bytes

    def available_host_memory(self) -> int | None:
        return host_available_bytes() if self.host_bytes is None else self.host_bytes
