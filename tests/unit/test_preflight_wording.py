"""DG-6: the reference's exact refusal when a direct load cannot fit on the device.

test_adm.py judges every loader on the refusal itself (type, names, nothing read); this pins the
reference's own sentence: the sizes in GiB with two decimals and in bytes, the parts of the sum,
and the fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fakes.platform import FakePlatform
from reference.errors import DeviceMemoryError
from reference.read.checkpoint import Checkpoint
from reference.read.header import TensorInfo
from reference.read.preflight import check_device_memory

GIB = 1024**3


@pytest.mark.rule("DG-6")
@pytest.mark.reference_only("pins the reference's own DeviceMemoryError wording")
def test_the_refusal_states_every_part_of_the_sum() -> None:
    """Headers alone: a 2 GiB tensor that no file holds, since nothing is read."""
    big = TensorInfo("w", Path("model.safetensors"), torch.uint8, (2 * GIB,), 0, 2 * GIB)
    checkpoint = Checkpoint((big.file,), {"w": big})
    with pytest.raises(DeviceMemoryError) as caught:
        check_device_memory(
            checkpoint,
            component="transformer",
            device=torch.device("cuda", 0),
            platform=FakePlatform(free_bytes=3 * GIB),
        )
    needed = 4 * GIB + 256 * 1024**2
    assert str(caught.value) == (
        f"--direct-gpu-weight-loading: component 'transformer' needs 4.25 GiB ({needed} bytes) on"
        " cuda:0 (2.00 GiB of weights from the headers + 2.00 GiB largest tensor in flight +"
        f" 0.25 GiB margin), but only 3.00 GiB ({3 * GIB} bytes) is free; free device memory,"
        " or drop --direct-gpu-weight-loading to load through CPU"
    )
