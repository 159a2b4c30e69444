"""DG-6 against the real free memory of the device, shrunk by a reserving allocation.

The checkpoint is a real safetensors file whose headers declare a 2 GiB DiT; its data section is
a sparse hole (no disk space, never read). It fits in the device's free memory until the test
reserves all but 1 GiB of that memory; then a direct load of it must be refused before any byte
moves.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fakes.pipelines import MODEL_CLASSES, FakeComponent, PipelineDiT, write_pipeline
from reference.errors import DeviceMemoryError
from reference.kit.judging.evidence import DataReads, data_bytes, evidence_missing
from reference.kit.judging.judge import refusal
from reference.kit.seam import (
    DIRECT_DIT,
    MEMORY_PREFLIGHT,
    PIPELINES,
    ComponentRequest,
    SeamLoader,
    ServingOptions,
)
from reference.read.checkpoint import DTYPES
from reference.request.platform import SYSTEM

pytestmark = pytest.mark.capability(DIRECT_DIT, MEMORY_PREFLIGHT, PIPELINES)

GIB = 1024**3
BIG_DIT = {"hidden": 4096, "heads": 32, "depth": 4}  # 4 * 8 * 4096^2 float32 weights: 2 GiB
LEFT_FREE = 1 * GIB
CODES = {dtype: code for code, dtype in DTYPES.items()}


def write_sparse_checkpoint(path: Path, slots: dict[str, torch.Tensor]) -> int:
    """A safetensors file whose header declares `slots` (shapes and dtypes) over a sparse data
    section of zeros. Returns the bytes the header declares."""
    header: dict[str, object] = {}
    offset = 0
    for name, slot in slots.items():
        nbytes = math.prod(slot.shape) * slot.dtype.itemsize
        header[name] = {
            "dtype": CODES[slot.dtype],
            "shape": list(slot.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)  # a hole: nothing is written, nothing is stored
    return offset


@pytest.fixture
def big_pipeline(tmp_path: Path) -> tuple[Path, int]:
    """A pipeline whose transformer is the 2 GiB DiT (sparse weights); and the header bytes."""
    root = write_pipeline(tmp_path / "pipeline", {"transformer": FakeComponent(PipelineDiT)})
    folder = root / "transformer"
    for old in folder.glob("*.safetensors"):
        old.unlink()
    config = {"_class_name": PipelineDiT.__name__, **BIG_DIT}
    (folder / "config.json").write_text(json.dumps(config))
    with torch.device("meta"):
        slots = PipelineDiT(**BIG_DIT).state_dict()
    total = write_sparse_checkpoint(folder / "diffusion_pytorch_model.safetensors", slots)
    return root, total


def reserve_all_but(device: torch.device, left: int) -> torch.Tensor:
    """Allocate the device's free memory except `left` bytes; the tensor holds it."""
    torch.cuda.empty_cache()  # cached blocks would count as used: start from what is truly free
    free = SYSTEM.free_device_memory(device)
    return torch.empty(free - left, dtype=torch.uint8, device=device)


@pytest.mark.rule("DG-6")
def test_direct_load_beyond_the_real_free_memory_is_refused_before_any_byte_moves(
    loader: SeamLoader,
    gpu_device: torch.device,
    big_pipeline: tuple[Path, int],
    gpu_figures: Callable[..., None],
) -> None:
    reason = evidence_missing()
    if reason is not None:
        pytest.skip(reason)
    root, total = big_pipeline
    folder = root / "transformer"
    files = sorted(folder.glob("*.safetensors"))
    needed = loader.check_device_memory(
        folder, component="transformer", device=gpu_device, platform=SYSTEM
    )
    assert needed >= total  # and it fits now: no reservation yet, so no refusal
    args = loader.make_server_args(
        ServingOptions(runtime_device=gpu_device, direct_gpu_weight_loading=True)
    )
    reservation = reserve_all_but(gpu_device, LEFT_FREE)
    try:
        free = SYSTEM.free_device_memory(gpu_device)
        assert free < total, f"the reservation left {free} bytes free, not less than {total}"
        allocated = torch.cuda.memory_allocated(gpu_device)
        with DataReads() as reads:
            error = refusal(
                lambda: loader.load_pipeline_component(
                    ComponentRequest(
                        root, "transformer", args, platform=SYSTEM, models=MODEL_CLASSES
                    )
                ),
                error=DeviceMemoryError,
            )
        assert torch.cuda.memory_allocated(gpu_device) == allocated
        gpu_figures(
            "DG-6 preflight on CUDA",
            {"headers": total, "needed": needed, "free after reserving": free},
        )
    finally:
        del reservation
        torch.cuda.empty_cache()
    assert "transformer" in str(error)
    reads.assert_no_data_read(data_bytes(*files))
