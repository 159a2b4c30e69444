"""A platform with chosen facts: CUDA present or not, any free device memory."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["FakePlatform"]


@dataclass(frozen=True)
class FakePlatform:
    """Answers platform questions from its fields (see reference.request.platform.Platform)."""

    cuda: bool = True
    devices: int = 1
    free_bytes: int = 80 * 1024**3

    def cuda_available(self) -> bool:
        return self.cuda

    def device_count(self) -> int:
        return self.devices if self.cuda else 0

    def free_device_memory(self, device: torch.device) -> int:
        if device.type != "cuda":
            raise ValueError(f"free_device_memory needs a cuda device, got {device}")
        return self.free_bytes
