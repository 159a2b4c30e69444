"""The reference's whole-pipeline load, inside (PIPE's contract tests are tests/unit/test_pipe.py):
its options, its memory preflight's arithmetic and wording, one component at a time and many at
once giving the same modules, and the concurrency runner's failure paths."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from fakes.pipeline_loads import tracked_classes, write_big_pipeline
from fakes.platform import FakePlatform
from reference.errors import ArgumentError, DeviceMemoryError, HostMemoryError, LoadError
from reference.load.pipeline import (
    PipelineOptions,
    iter_load,
    load_pipeline,
    prepare_pipeline,
)
from reference.load.pipeline_memory import ComponentNeeds, check_pipeline_memory
from reference.load.together import LOADER_THREAD_NAME, Stopped, run_together
from reference.read.checkpoint import reading_progress
from reference.read.preflight import device_memory_margin
from reference.request.args import ServerArgs
from reference.request.model_index import ModelRegistry

pytestmark = pytest.mark.internal

CPU = torch.device("cpu")
GPU = torch.device("cuda", 0)
NO_CUDA = FakePlatform(cuda=False)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_big_pipeline(tmp_path_factory.mktemp("pipeline") / "p", small=True)


def registry() -> ModelRegistry:
    return ModelRegistry.of(tracked_classes())


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2"])
def test_options_refuse_what_is_no_count(value: object) -> None:
    with pytest.raises(ArgumentError, match="concurrency"):
        PipelineOptions(concurrency=value)  # type: ignore[arg-type]


def test_one_at_a_time_and_all_at_once_give_the_same_modules(root: Path) -> None:
    args = ServerArgs(runtime_device=CPU)
    together = load_pipeline(root, args, registry=registry(), platform=NO_CUDA)
    alone = load_pipeline(
        root, args, registry=registry(), platform=NO_CUDA, options=PipelineOptions(concurrency=1)
    )
    stepwise = list(iter_load(root, args, registry=registry(), platform=NO_CUDA))
    assert [c.name for c in together] == [c.name for c in alone] == [c.name for c in stepwise]
    for a, b, c in zip(together, alone, stepwise, strict=True):
        for (name, x), y, z in zip(
            a.module.state_dict().items(),
            b.module.state_dict().values(),
            c.module.state_dict().values(),
            strict=True,
        ):
            assert torch.equal(x, y), f"{a.name}.{name}"
            assert torch.equal(x, z), f"{a.name}.{name}"


def test_one_progress_callback_hears_every_byte_of_every_component(root: Path) -> None:
    heard: list[int] = []
    threads: set[str] = set()

    def count(n: int) -> None:
        heard.append(n)
        threads.add(threading.current_thread().name)

    with reading_progress(count):
        load_pipeline(root, ServerArgs(runtime_device=CPU), registry=registry(), platform=NO_CUDA)
    data = sum(f.stat().st_size for f in root.glob("*/*.safetensors"))
    assert data * 0.9 < sum(heard) <= data
    assert all(name.startswith(LOADER_THREAD_NAME) for name in threads)


def test_the_preflight_counts_every_component_before_any_loads(root: Path) -> None:
    args = ServerArgs(runtime_device=CPU)
    prepared = prepare_pipeline(root, args, registry=registry(), platform=NO_CUDA)
    needs = {item.needs.component: item.needs for _, item in prepared}
    assert list(needs) == ["transformer", "text_encoder", "vae"]
    assert all(n.device == CPU for n in needs.values())
    # The DiT is converted to bf16 and the VAE built for real: their own memory. The text
    # encoder keeps the fp32 its files store: views of the files, none of its own.
    assert needs["transformer"].held > 0
    assert needs["vae"].held > 0
    assert needs["text_encoder"].held == 0
    args = ServerArgs(runtime_device=CPU, component_precisions={"text_encoder": torch.bfloat16})
    converted = prepare_pipeline(root, args, registry=registry(), platform=NO_CUDA)
    assert {i.needs.component: i.needs.held for _, i in converted}["text_encoder"] > 0


def _needs(*held: int, device: torch.device = CPU) -> list[ComponentNeeds]:
    return [ComponentNeeds(f"c{i}", device, h, h // 2) for i, h in enumerate(held)]


def test_the_memory_preflight_adds_the_largest_tensor_and_the_margin() -> None:
    needs = _needs(100, 300)
    total = 400 + 150 + device_memory_margin(400)
    assert check_pipeline_memory(needs, platform=FakePlatform(host_bytes=total), pipeline="p") == {
        CPU: total
    }
    with pytest.raises(HostMemoryError, match=r"pipeline p: .* on cpu .*'c0'.*'c1'"):
        check_pipeline_memory(needs, platform=FakePlatform(host_bytes=total - 1), pipeline="p")
    with pytest.raises(DeviceMemoryError, match=r"on cuda:0 .*'c0'.*'c1'"):
        check_pipeline_memory(
            _needs(100, 300, device=GPU), platform=FakePlatform(free_bytes=total - 1), pipeline="p"
        )


def test_an_unknown_host_budget_is_not_checked() -> None:
    class Unknown(FakePlatform):
        def available_host_memory(self) -> int | None:
            return None

    assert check_pipeline_memory(_needs(10**15), platform=Unknown(), pipeline="p")


def test_a_failure_stops_the_jobs_not_yet_started_and_is_raised_with_a_note() -> None:
    started: list[int] = []

    def job(i: int) -> int:
        started.append(i)
        if i == 0:
            raise ValueError("job 0 fails")
        return i

    jobs = [lambda i=i: job(i) for i in range(6)]
    with pytest.raises(ValueError, match="job 0 fails") as raised:
        run_together(jobs, names=[f"n{i}" for i in range(6)], concurrency=1)
    assert started == [0]
    notes = getattr(raised.value, "__notes__", ["'n0' (no notes before Python 3.11)"])
    assert any("'n0'" in note for note in notes)


def test_a_job_reading_after_a_failure_is_stopped() -> None:
    failed = threading.Event()

    def fails() -> None:
        failed.set()
        raise RuntimeError("first")

    def reads() -> None:
        from reference.read.checkpoint import current_progress

        failed.wait(5)
        progress = current_progress()
        assert progress is not None
        for _ in range(500):  # the runner notices the failure within a tenth of a second
            progress(1)
            threading.Event().wait(0.01)

    with pytest.raises(RuntimeError, match="first"):
        run_together([fails, reads], names=["a", "b"], concurrency=2)


def test_stopped_is_a_load_error() -> None:
    assert issubclass(Stopped, LoadError)
