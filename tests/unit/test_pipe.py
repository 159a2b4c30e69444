"""PIPE: a whole pipeline loaded in one call (PIPE-1..4), judged through `load_pipeline`.

A DiT, a text encoder and a VAE of a few MiB each, every tensor stored in fp32 and asked for in
bf16 (the VAE in fp32), so what any loader must hold is known from the headers alone
(`reference.kit.judging.pipelines`); and the seven hub pipelines written by diffusers' and
transformers' own `save_pretrained`. Refusals are judged by what was read before them
(`DataReads`: every file of every component), atomicity by what is left alive (modules by weak
reference, threads, open files, memory in a fresh process), concurrency by equality with each
component loaded alone.
"""

from __future__ import annotations

import contextlib
import gc
import json
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import nn

from fakes import pipeline_loads
from fakes.diffusers_pipelines import HUB_PIPELINES, write_hub_pipeline
from fakes.pipeline_loads import (
    FailingVAE,
    InterruptedVAE,
    alive,
    built,
    write_big_pipeline,
    write_with_connectors,
)
from fakes.platform import FakePlatform
from reference.extras import install_hint
from reference.kit.isolated import Attempt
from reference.kit.judging.evidence import DataReads, data_bytes, safetensors_files
from reference.kit.judging.judge import assert_identifies
from reference.kit.judging.pipelines import (
    args_in,
    component_growth,
    held_bytes,
    largest_bytes,
    load_whole,
    memory_kept_by_a_failed_load,
    open_files_under,
    pipeline_growth,
    threads_started_since,
)
from reference.kit.seam import (
    PIPELINES,
    WHOLE_PIPELINE,
    ComponentRequest,
    PipelineRequest,
    SeamLoader,
    ServingOptions,
)

from .written import copy_of_written

pytestmark = pytest.mark.capability(WHOLE_PIPELINE)

EXTRA = f"needs the diffusers extra (diffusers, transformers): {install_hint('diffusers')}"
WEIGHTED = ("transformer", "text_encoder", "vae")
"""The big pipeline's weight-bearing components, in model_index.json order."""


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_big_pipeline(tmp_path_factory.mktemp("pipe") / "big")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`hub(name)`: the hub pipeline `name` written by its own `save_pretrained` (the DiT in
    bf16, as users get it), once per module, when first asked for."""
    pytest.importorskip("diffusers", reason=EXTRA)
    pytest.importorskip("transformers", reason=EXTRA)
    base = tmp_path_factory.mktemp("hub")
    written: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in written:
            written[name] = copy_of_written(
                ("hub", name),
                base / name,
                partial(write_hub_pipeline, pipeline=HUB_PIPELINES[name], seed=3),
            )
        return written[name]

    return get


def _all_data(root: Path) -> int:
    return data_bytes(*safetensors_files(root))


def _refused_reading_nothing(root: Path, call: Callable[[], object]) -> BaseException:
    """`call` refused, and not a byte of the pipeline's tensor data read by it. The same call
    runs once before, unmeasured: a process's first build imports much of torch (reads that
    are no loader's own, SPEC: "Memory is the load's own" holds for reads too)."""
    with contextlib.suppress(Exception):
        call()
    with DataReads() as seen:
        raised = _refused(call)
    seen.assert_no_data_read(_all_data(root))
    return raised


def _refused(call: object) -> BaseException:
    """What `call` raised. PIPE names no type: a ValueError, or for memory a MemoryError or a
    RuntimeError (a device's out-of-memory error is one); what it read before, and what it
    names, are judged."""
    try:
        call()  # type: ignore[operator]
    except (ValueError, MemoryError, RuntimeError) as raised:
        return raised
    raise AssertionError("expected the pipeline load to be refused; it returned")


# --- PIPE-1: every weight-bearing component, weightless ones listed -----------------------------


@pytest.mark.rule("PIPE-1")
def test_every_weight_bearing_component_comes_back_ready(
    loader: SeamLoader, big: Path, runtime_device: torch.device
) -> None:
    """Each component with weights is returned, in eval mode with nothing on meta; the
    scheduler, which holds none, is listed as not loaded with a reason."""
    request = PipelineRequest(
        big,
        args=loader.make_server_args(ServingOptions(runtime_device=runtime_device)),
        platform=FakePlatform(cuda=False),
        models=pipeline_loads.tracked_classes(),
    )
    loaded = loader.load_pipeline(request)
    assert set(loaded.components) == set(WEIGHTED)
    for name, module in loaded.components.items():
        assert not module.training, name
        assert not any(t.is_meta for t in [*module.parameters(), *module.buffers()]), name
    assert "scheduler" in loaded.not_loaded
    assert loaded.not_loaded["scheduler"].strip()


@pytest.mark.rule("PIPE-1")
def test_a_component_the_loader_cannot_build_is_refused_before_any_read(
    loader: SeamLoader, tmp_path: Path
) -> None:
    """The last component names a class no library has: the load is refused naming it, and
    not a byte of the other components' tensor data was read."""
    root = write_big_pipeline(tmp_path / "p")
    index = json.loads((root / "model_index.json").read_text())
    index["vae"] = ["fakes", "NoSuchVAEModel"]
    (root / "model_index.json").write_text(json.dumps(index))
    raised = _refused_reading_nothing(root, lambda: load_whole(loader, root))
    assert_identifies(raised, "vae", "NoSuchVAEModel")


@pytest.mark.rule("PIPE-1")
def test_a_weight_bearing_component_of_no_named_kind_is_loaded_or_refused(
    loader: SeamLoader, tmp_path: Path, runtime_device: torch.device
) -> None:
    """The pipeline also declares `connectors`, a model of its own library with a config.json
    and weights, of none of the kinds PIPE-1 names (as LTX-2 declares its text connectors).
    Either branch conforms: it comes back holding its checkpoint's values, or the load is
    refused naming it before any tensor data is read. Returned without it, listed as not
    loaded or not, the pipeline is short of weights it needs."""
    from safetensors.torch import load_file

    root = write_with_connectors(tmp_path / "p")
    request = PipelineRequest(
        root,
        args=loader.make_server_args(ServingOptions(runtime_device=runtime_device)),
        platform=FakePlatform(cuda=False),
        models=pipeline_loads.tracked_classes(),
    )
    try:
        loaded = loader.load_pipeline(request)
    except (ValueError, MemoryError, RuntimeError):
        raised = _refused_reading_nothing(root, lambda: loader.load_pipeline(request))
        assert_identifies(raised, "connectors")
        return
    assert "connectors" in loaded.components, (
        f"returned {sorted(loaded.components)} without the weight-bearing component"
        f" 'connectors' (not loaded: {dict(loaded.not_loaded)})"
    )
    state = loaded.components["connectors"].state_dict()
    stored = {
        name: tensor
        for file in sorted((root / "connectors").glob("*.safetensors"))
        for name, tensor in load_file(str(file)).items()
    }
    assert set(state) == set(stored)
    for name, tensor in stored.items():
        assert state[name].dtype.is_floating_point, name
        assert torch.equal(state[name].cpu(), tensor.to(state[name].dtype)), name


# --- PIPE-2: every refusal first, one memory preflight per device -------------------------------


@pytest.mark.rule("PIPE-2")
def test_headers_that_disagree_in_the_last_component_are_refused_before_any_read(
    loader: SeamLoader, tmp_path: Path
) -> None:
    """The VAE's config asks for other shapes than its checkpoint holds: refused naming it
    before any tensor data of the DiT or the text encoder (loaded first) is read."""
    root = write_big_pipeline(tmp_path / "p")
    config = json.loads((root / "vae" / "config.json").read_text())
    config["hidden"] = 2 * config["hidden"]
    (root / "vae" / "config.json").write_text(json.dumps(config))
    raised = _refused_reading_nothing(root, lambda: load_whole(loader, root))
    assert_identifies(raised, "vae")


@pytest.mark.rule("PIPE-2")
def test_components_that_fit_alone_but_not_together_in_host_memory_are_refused(
    loader: SeamLoader, big: Path
) -> None:
    """The host has room for less than what the components will hold together: refused before
    any tensor data is read, naming every component (whatever margin the loader adds, the
    pipeline cannot fit)."""
    held = held_bytes(big)
    platform = FakePlatform(cuda=False, host_bytes=sum(held.values()) * 3 // 4)
    raised = _refused_reading_nothing(big, lambda: load_whole(loader, big, platform=platform))
    for name in WEIGHTED:
        assert_identifies(raised, name)


@pytest.mark.rule("PIPE-2")
def test_components_that_do_not_fit_the_device_together_are_refused(
    loader: SeamLoader, big: Path
) -> None:
    """All resident on a GPU with less free memory than the components will hold together:
    refused before any tensor data is read, naming the device and every component."""
    held = held_bytes(big)
    platform = FakePlatform(cuda=True, free_bytes=sum(held.values()) * 3 // 4)
    raised = _refused_reading_nothing(
        big, lambda: load_whole(loader, big, device=torch.device("cuda", 0), platform=platform)
    )
    assert_identifies(raised, "cuda")
    for name in WEIGHTED:
        assert_identifies(raised, name)


# --- PIPE-3: all or nothing ---------------------------------------------------------------------


def _leftovers(root: Path, before: set[int], since: int) -> list[str]:
    gc.collect()
    return [
        *(f"module {name} alive" for name in alive(since)),
        *(f"thread {name} running" for name in threads_started_since(before)),
        *(f"file {path} open" for path in open_files_under(root)),
    ]


@pytest.mark.rule("PIPE-3")
@pytest.mark.parametrize("failure", [FailingVAE, InterruptedVAE], ids=["error", "ctrl-c"])
def test_a_component_that_fails_leaves_nothing_of_the_load_alive(
    loader: SeamLoader, tmp_path: Path, failure: type[nn.Module]
) -> None:
    """The VAE fails once its tensors are in, while the others load (or Ctrl-C comes then):
    the load raises, naming the VAE for an error, and afterwards no module the load built is
    alive, no thread it started runs, no file of the pipeline is open."""
    root = write_big_pipeline(tmp_path / "p", vae=failure)
    # A load first, so threads a loader keeps for every load (a pool started once) exist
    # before the count: only what this load leaves behind is judged.
    load_whole(loader, write_big_pipeline(tmp_path / "ok", small=True))
    since = built()
    before = {t.ident for t in threading.enumerate() if t.ident is not None}
    if failure is InterruptedVAE:
        with pytest.raises(KeyboardInterrupt):
            load_whole(loader, root)
    else:
        # Which type a failure that is not a refusal takes is the loader's choice.
        with pytest.raises(Exception) as raised:  # noqa: PT011
            load_whole(loader, root)
        assert_identifies(raised.value, "vae", failure.__name__)
        del raised
    assert not _leftovers(root, before, since)


@pytest.mark.rule("PIPE-3")
def test_a_failed_load_gives_its_memory_back(
    isolated_with: Callable[..., Attempt], tmp_path: Path
) -> None:
    """In a fresh process warmed by the same kind of load (a smaller pipeline whose VAE fails
    too: a first failure's one-time costs are the process's, not the load's): after the failed
    load, the process holds no more anonymous memory than before it (within 8 MiB), though the
    components loaded before the failure (the VAE fails late) held tens of MiB."""
    small = write_big_pipeline(tmp_path / "small", vae=FailingVAE, small=True)
    root = write_big_pipeline(tmp_path / "p", vae=FailingVAE)
    warm = (memory_kept_by_a_failed_load, (small,), {})
    attempt = isolated_with(memory_kept_by_a_failed_load, root, warm=warm)
    assert attempt.outcome == "returned", attempt.message
    kept = attempt.value
    assert isinstance(kept, int)
    assert kept < 8 * 1024**2, f"{kept} bytes of anonymous memory stayed after the failed load"


def _warm(loader: SeamLoader, root: Path) -> None:
    load_whole(loader, root)


# --- PIPE-4: concurrent as sequential; no more memory ---------------------------------------------


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().reshape(-1).view(torch.uint8)


def _assert_same_state(whole: nn.Module, alone: nn.Module, name: str) -> None:
    a, b = whole.state_dict(), alone.state_dict()
    assert sorted(a) == sorted(b), name
    for key, tensor in a.items():
        assert tensor.dtype == b[key].dtype, f"{name}.{key}"
        assert tensor.device == b[key].device, f"{name}.{key}"
        assert torch.equal(_bits(tensor), _bits(b[key])), f"{name}.{key}"


@pytest.mark.rule("PIPE-4")
@pytest.mark.capability(PIPELINES)
def test_the_whole_load_is_each_component_loaded_alone(
    loader: SeamLoader, big: Path, runtime_device: torch.device
) -> None:
    """Every slot's value, dtype and device as loading that component alone gives it, and the
    components in the pipeline's declared order."""
    args = args_in(loader, runtime_device)
    models = pipeline_loads.tracked_classes()
    platform = FakePlatform(cuda=False)
    whole = loader.load_pipeline(PipelineRequest(big, args=args, platform=platform, models=models))
    assert list(whole.components) == list(WEIGHTED)
    for name, module in whole.components.items():
        request = ComponentRequest(big, name, args, platform=platform, models=models)
        _assert_same_state(module, loader.load_pipeline_component(request), name)


HUB_IN_UNIT = ("wan", "flux")


@pytest.mark.rule("PIPE-4")
@pytest.mark.capability(PIPELINES)
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=() if n in HUB_IN_UNIT else pytest.mark.long) for n in HUB_PIPELINES],
)
def test_a_hub_pipeline_loads_whole_as_component_by_component(
    loader: SeamLoader, hub: Callable[[str], Path], runtime_device: torch.device, name: str
) -> None:
    """A pipeline written by diffusers' and transformers' own `save_pretrained` (bf16 DiT,
    fp32 VAE and encoders): the whole load's components, each slot as the component loaded
    alone gives it."""
    root = hub(name)
    args = loader.make_server_args(ServingOptions(runtime_device=runtime_device))
    platform = FakePlatform(cuda=False)
    whole = loader.load_pipeline(PipelineRequest(root, args=args, platform=platform))
    index = json.loads((root / "model_index.json").read_text())
    declared = [k for k in index if k in whole.components]
    assert list(whole.components) == declared
    for component, module in whole.components.items():
        request = ComponentRequest(root, component, args, platform=platform)
        _assert_same_state(module, loader.load_pipeline_component(request), component)


@pytest.mark.rule("PIPE-4")
@pytest.mark.capability(PIPELINES)
def test_loading_at_once_takes_no_more_memory_than_the_components_hold(
    isolated_with: Callable[..., Attempt], tmp_path: Path
) -> None:
    """Each in a fresh process warmed by the same kind of load of a smaller pipeline: the peak
    anonymous growth of the whole load stays within what the components hold at the end (known
    from the headers: every tensor converted), plus the most any one of them takes beyond its
    own bytes when loaded alone, plus one largest tensor per component in flight, plus 16 MiB:
    concurrency shares what a load reads through, it does not multiply it (a loader that stages
    a whole component at a time conforms; one that stages them all at once does not)."""
    root = write_big_pipeline(tmp_path / "p")
    warm = write_big_pipeline(tmp_path / "warm", small=True)
    held = held_bytes(root)
    beyond = 0
    for name in WEIGHTED:
        alone = isolated_with(
            component_growth, root, name, warm=(component_growth, (warm, name), {})
        )
        assert alone.outcome == "returned", alone.message
        assert isinstance(alone.value, int)
        beyond = max(beyond, alone.value - held[name])
    attempt = isolated_with(pipeline_growth, root, warm=(_warm, (warm,), {}))
    assert attempt.outcome == "returned", attempt.message
    peak = attempt.value
    assert isinstance(peak, int)
    bound = sum(held.values()) + beyond + sum(largest_bytes(root).values()) + 16 * 1024**2
    assert peak <= bound, (
        f"peak anonymous growth {peak} bytes; the components hold {sum(held.values())}, and"
        f" take at most {beyond} more each alone"
    )
