"""The platform seam and the command line's basics."""

from __future__ import annotations

import pytest
import torch
from pytest_mock import MockerFixture

from fakes.platform import FakePlatform
from reference.__main__ import main
from reference.request import platform
from reference.request.platform import Platform, SystemPlatform

pytestmark = pytest.mark.internal


def test_fake_platform_is_a_platform() -> None:
    fake = FakePlatform(cuda=True, devices=2, free_bytes=123)
    assert isinstance(fake, Platform)
    assert (
        fake.cuda_available(),
        fake.device_count(),
        fake.free_device_memory(torch.device("cuda", 1)),
    ) == (True, 2, 123)
    assert FakePlatform(cuda=False).device_count() == 0
    with pytest.raises(ValueError, match="needs a cuda device"):
        fake.free_device_memory(torch.device("cpu"))


def test_system_platform_asks_torch(mocker: MockerFixture) -> None:
    mocker.patch("torch.cuda.is_available", return_value=True)
    mocker.patch("torch.cuda.device_count", return_value=3)
    mocker.patch("torch.cuda.mem_get_info", return_value=(5, 10))
    system = SystemPlatform()
    assert (system.cuda_available(), system.device_count()) == (True, 3)
    assert system.free_device_memory(torch.device("cuda", 0)) == 5
    with pytest.raises(ValueError, match="needs a cuda device"):
        system.free_device_memory(torch.device("cpu"))
    assert "visible devices: 3" in platform.describe(system)


def test_describe_names_torch_and_cuda_build() -> None:
    line = platform.describe(FakePlatform(cuda=False))
    assert line.startswith(f"torch {torch.__version__}, CUDA build ")
    assert "cuda available: False, visible devices: 0" in line


def test_rules_command_prints_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 86
    assert out[0].startswith("PLAN-1  MUST")
