"""Checkpoint readers with one defect each, for loaders that read the wrong way."""

from __future__ import annotations

import os

import safetensors.torch
import torch

from reference.read.checkpoint import Checkpoint, TensorReader

__all__ = ["SharedMapReader", "WholeFileReader"]


class WholeFileReader(TensorReader):
    """Reads every file whole onto CPU first (a full CPU state dict), then hands out its tensors."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        super().__init__(checkpoint)
        self.state: dict[str, torch.Tensor] = {}

    def read(self, name: str, *, device: torch.device) -> torch.Tensor:
        if not self.state:
            for file in self.checkpoint.files:
                self.state.update(safetensors.torch.load_file(str(file)))
        return self.state[name].to(device)


class SharedMapReader(TensorReader):
    """Maps the files shared instead of copy-on-write: a write to a CPU tensor reaches the file.
    Everything else is the reference's reader (the file checked before it is mapped)."""

    def read(self, name: str, *, device: torch.device) -> torch.Tensor:
        info = self.checkpoint.tensors[name]
        fd = self._open(info)
        try:
            size = os.fstat(fd).st_size
            storage = torch.UntypedStorage.from_file(
                f"/proc/self/fd/{fd}", shared=True, nbytes=size
            )
        finally:
            os.close(fd)
        raw = torch.empty(0, dtype=torch.uint8).set_(storage)[info.start : info.end]  # type: ignore[arg-type]
        tensor = raw.view(info.dtype).view(info.shape)
        return tensor if device.type == "cpu" else tensor.to(device)
