"""TP=2 over nccl: what the GPU tier relies on to run it.

The nccl test itself is tests/unit/test_tp.py::test_tp2_over_torch_distributed, which this tier
runs again with --runtime-device=cuda: one process and one GPU per rank over nccl when two devices
are visible, skipped naming the device count on one device. It is not copied here; the run's
"gpu tier figures" section says whether it ran. This test pins the device handling it depends on.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from reference.request.platform import SYSTEM, describe

WORLD = 2


@pytest.mark.internal
def test_the_platform_sees_the_devices_torch_sees_and_nccl_is_there_for_two(
    gpu_device: torch.device,
) -> None:
    count = torch.cuda.device_count()
    assert SYSTEM.cuda_available() is True
    assert SYSTEM.device_count() == count >= 1
    assert f"visible devices: {count}" in describe()
    if count < WORLD:
        pytest.skip(
            f"TP={WORLD} over nccl needs {WORLD} CUDA devices, found {count}; test_tp.py skips"
            " its nccl run for the same reason"
        )
    assert dist.is_available()
    assert dist.is_nccl_available()
    for rank in range(WORLD):
        probe = torch.full((1,), float(rank), device=torch.device("cuda", rank))
        assert probe.device.index == rank
        assert probe.item() == float(rank)
