"""The reference's own shape: a load runs its steps in order and never climbs back.

Traced, not read off the source: every call inside the library (the kit and the programs
aside) is recorded with the library files on its stack. A stack that holds one file twice with
another between them is a call back into a file the load had left (a base class calling an
override in the module above it, a generator or closure handed down and called from below); the
lint tier's import graph (.ci/import_graph.py) pins the matching rule for imports. docs/flow.md
shows the call order these tests keep.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch

import reference
from fakes.layers import LINEAR_KINDS as KINDS
from fakes.pipelines import MODEL_CLASSES, SMALL_PIPELINE, write_pipeline
from reference.load.dit import DiTOptions, load_dit
from reference.load.pipeline import load_pipeline
from reference.load.vae import VAEOptions, load_vae
from reference.read.reading import ReadOptions
from reference.request.args import ServerArgs
from reference.request.model_index import ModelRegistry
from reference.request.plan import WeightLoadPlan

pytestmark = pytest.mark.internal

LIBRARY = Path(reference.__file__).parent
OUTSIDE = ("kit", "programs", "__main__.py")
CPU = torch.device("cpu")
STEPS = ("request", "read", "place")


_FILES: dict[str, str | None] = {}


def library_file(frame: FrameType) -> str | None:
    """The library file `frame` runs in, relative to the package; None outside the library."""
    name = frame.f_code.co_filename
    if name not in _FILES:
        try:
            relative = Path(name).relative_to(LIBRARY)
        except ValueError:
            _FILES[name] = None
        else:
            _FILES[name] = None if relative.parts[0] in OUTSIDE else relative.as_posix()
    return _FILES[name]


class Trace:
    """The library's file-level call stacks during a run, and the order files were entered."""

    def __init__(self) -> None:
        self.returns: dict[tuple[str, ...], int] = {}
        self.entered: list[str] = []

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or library_file(frame) is None:
            return
        files: list[str] = []
        walked: FrameType | None = frame
        while walked is not None:
            file = library_file(walked)
            if file is not None and (not files or files[-1] != file):
                files.append(file)
            walked = walked.f_back
        files.reverse()
        if files[-1] not in self.entered:
            self.entered.append(files[-1])
        if len(set(files)) != len(files):
            key = tuple(files)
            self.returns[key] = self.returns.get(key, 0) + 1

    def problems(self) -> list[str]:
        return [" > ".join(stack) for stack in sorted(self.returns)]


@contextmanager
def traced() -> Iterator[Trace]:
    trace = Trace()
    previous = sys.getprofile()
    sys.setprofile(trace)
    try:
        yield trace
    finally:
        sys.setprofile(previous)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pipeline(tmp_path_factory.mktemp("flow") / "pipeline", SMALL_PIPELINE)


def registry() -> ModelRegistry:
    found = ModelRegistry()
    for name, cls in MODEL_CLASSES.items():
        found.register(cls, name=name)
    return found


def dit_build() -> torch.nn.Module:
    spec = SMALL_PIPELINE["transformer"]
    return spec.cls(**spec.config)


def vae_build() -> torch.nn.Module:
    spec = SMALL_PIPELINE["vae"]
    return spec.cls(**spec.config)


POOL = ReadOptions(workers=2)


def pipeline_load(root: Path) -> object:
    return load_pipeline(root, ServerArgs(), registry=registry())


def dit_copy_path(root: Path) -> object:
    plan = WeightLoadPlan(checkpoint_load_device=CPU)
    options = DiTOptions(adopt=False, reading=POOL)
    return load_dit(dit_build, root / "transformer", plan=plan, kinds=KINDS, options=options)


def dit_direct_onto_the_cpu(root: Path) -> object:
    plan = WeightLoadPlan(checkpoint_load_device=CPU, load_full_state_dict_on_device=True)
    return load_dit(dit_build, root / "transformer", plan=plan, kinds=KINDS)


def vae_stream_through_the_pool(root: Path) -> object:
    return load_vae(vae_build, root / "vae", device=CPU, options=VAEOptions(reading=POOL))


LOADS: dict[str, Callable[[Path], Any]] = {
    "pipeline": pipeline_load,
    "dit-copy-path-pooled": dit_copy_path,
    "dit-direct-onto-cpu": dit_direct_onto_the_cpu,
    "vae-stream-pooled": vae_stream_through_the_pool,
}


@pytest.mark.parametrize("load", list(LOADS), ids=list(LOADS))
def test_no_call_climbs_back_into_a_file_the_load_left(load: str, pipeline: Path) -> None:
    with traced() as trace:
        LOADS[load](pipeline)
    assert trace.entered, "the trace saw no library call"
    assert trace.problems() == [], "a call returned into a file it had left on the same stack"


def test_a_pipeline_load_enters_the_steps_in_the_order_data_flows(pipeline: Path) -> None:
    args, models = ServerArgs(), registry()  # built before the trace: the load enters by the spine
    with traced() as trace:
        load_pipeline(pipeline, args, registry=models)
    assert trace.entered[0] == "load/pipeline.py", f"the load entered by {trace.entered[0]}"
    first = [file.split("/")[0] for file in trace.entered]
    order = [step for step in dict.fromkeys(first) if step in STEPS]
    assert order == list(STEPS), f"steps first entered in the order {order}"


def in_file(relative: str) -> Callable[[Callable[[], object]], object]:
    """A function whose code says it lives in the library file `relative`: it calls its
    argument."""
    namespace: dict[str, Any] = {}
    exec(
        compile("def call(then):\n    return then()\n", str(LIBRARY / relative), "exec"), namespace
    )
    return namespace["call"]  # type: ignore[no-any-return]


def test_the_trace_names_a_call_back_into_a_file_the_stack_left() -> None:
    spine, step = in_file("load/dit.py"), in_file("place/adopt.py")
    with traced() as trace:
        spine(lambda: step(lambda: spine(lambda: None)))
        step(lambda: step(lambda: None))  # the same file twice in a row is no return
    assert trace.problems() == ["load/dit.py > place/adopt.py > load/dit.py"]
    assert trace.entered == ["load/dit.py", "place/adopt.py"]
