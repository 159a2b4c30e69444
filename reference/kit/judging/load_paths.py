"""The loading paths a checkpoint can take, each reached through a `SeamLoader`.

    dit-adopt    load_dit with the plan of a CPU-offloaded, unquantized DiT: it loads on CPU,
                 where eligible tensors are adopted (zero-copy)
    dit-direct   load_dit in direct mode: straight onto the runtime device (in the CPU tier
                 the device `cpu`: fresh host memory instead of the file's map, PLAN-3)
    vae-stream   load_vae: meta build, header preflight, one tensor at a time into the slots
    transformer, vae
                 a pipeline component through its component loader (load_pipeline_component);
                 the transformer is CPU-offloaded (adoption), the VAE loads the ordinary way

Each path loads the corpus models (fakes/corpus_models.py) unless a `build` is given.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from fakes import corpus_models, pipelines
from fakes.corpus_models import CorpusDiT, CorpusVAE, while_building
from fakes.dit import DiTConfig, TinyDiT, write_dit_checkpoint
from fakes.layers import LINEAR_KINDS
from fakes.platform import FakePlatform
from reference.kit.seam import (
    DIRECT_DIT,
    PIPELINES,
    VAE_STREAM,
    ZERO_COPY,
    ComponentRequest,
    DitRequest,
    Plan,
    SeamLoader,
    ServingOptions,
    VaeRequest,
)
from reference.report.memory import PeakSampler

__all__ = [
    "CAPABILITY",
    "CHECKPOINT_PATHS",
    "CPU",
    "MODEL_CLASSES",
    "PIPELINE_COMPONENTS",
    "direct_device",
    "direct_load_host_growth",
    "load_built",
    "load_checkpoint",
    "load_component",
    "load_on_path",
    "load_with_a_shard_swapped_for_a_pipe",
    "sees_zc3",
    "sized_past",
]

CHECKPOINT_PATHS = ("dit-adopt", "dit-direct", "vae-stream")
PIPELINE_COMPONENTS = ("transformer", "vae")
CAPABILITY = {
    "dit-adopt": ZERO_COPY,
    "dit-direct": DIRECT_DIT,
    "vae-stream": VAE_STREAM,
    "transformer": PIPELINES,
    "vae": PIPELINES,
}
"""The adapter capability each path needs."""


MODEL_CLASSES = {**pipelines.MODEL_CLASSES, **corpus_models.MODEL_CLASSES}
"""Every class the fakes' pipelines name, handed to the loader with each component load."""
CPU = torch.device("cpu")


def direct_device(runtime_device: torch.device) -> torch.device:
    """Where direct mode loads: the runtime device. In the CPU tier that is `cpu` (PLAN-3: a
    direct plan on the CPU reads into fresh host memory); never `meta`, which no real reader
    can load onto (SPEC, "Real inputs")."""
    return runtime_device


def load_checkpoint(
    path: str,
    loader: SeamLoader,
    checkpoint: Path,
    *,
    runtime_device: torch.device,
    build: Callable[[], nn.Module] | None = None,
) -> nn.Module:
    """Load `checkpoint` on one of CHECKPOINT_PATHS; returns the loaded module."""
    if path == "vae-stream":
        module, _ = loader.load_vae(
            VaeRequest(build or CorpusVAE, checkpoint, device=runtime_device)
        )
        return module
    direct = path == "dit-direct"
    # The offload plan loads on CPU (DEV-1); the direct plan on the runtime device (DG-4).
    plan = Plan(
        checkpoint_load_device=direct_device(runtime_device) if direct else CPU,
        load_full_state_dict_on_device=direct,
    )
    module, _ = loader.load_dit(
        DitRequest(build or CorpusDiT, checkpoint, plan=plan, kinds=LINEAR_KINDS)
    )
    return module


def load_component(
    loader: SeamLoader, root: Path, component: str, *, runtime_device: torch.device
) -> nn.Module:
    """Load one component of the pipeline at `root` (transformer CPU-offloaded)."""
    args = loader.make_server_args(
        ServingOptions(runtime_device=runtime_device, dit_cpu_offload=True)
    )
    platform = FakePlatform(cuda=runtime_device.type == "cuda")
    return loader.load_pipeline_component(
        ComponentRequest(root, component, args, platform=platform, models=MODEL_CLASSES)
    )


def load_on_path(
    loader: SeamLoader, path: str, target: Path, *, runtime_device: torch.device
) -> nn.Module:
    """Load `target` on `path`: one of CHECKPOINT_PATHS (`target` is the checkpoint) or of
    PIPELINE_COMPONENTS (`target` is the pipeline's root). Module-level, so an isolated attempt
    (`reference.kit.isolated.attempt_with`) can run it in a child process."""
    if path in PIPELINE_COMPONENTS:
        return load_component(loader, target, path, runtime_device=runtime_device)
    return load_checkpoint(path, loader, target, runtime_device=runtime_device)


def load_built(
    loader: SeamLoader,
    path: str,
    checkpoint: Path,
    *,
    build: Callable[[], nn.Module],
    runtime_device: torch.device,
) -> nn.Module:
    """`load_checkpoint` of `build` (which must pickle) on one of CHECKPOINT_PATHS, the loader
    first: module-level, for an isolated attempt."""
    return load_checkpoint(path, loader, checkpoint, runtime_device=runtime_device, build=build)


def sized_past(path: str, length: int) -> Callable[[], nn.Module]:
    """The corpus model `path` loads, built with a rotary table of `length` positions computed
    in `__init__` (derived with `torch.outer` and `.cos()`: no single factory call asks for
    it), as a config.json's `rope_max_seq_len` sizes one."""
    model = CorpusVAE if path == "vae-stream" else CorpusDiT
    return functools.partial(model, rope_max_seq_len=length)


def load_with_a_shard_swapped_for_a_pipe(
    loader: SeamLoader, path: str, target: Path, *, shard: Path, runtime_device: torch.device
) -> nn.Module:
    """`load_on_path`, with `shard` replaced by a named pipe the first time a corpus model is
    built (on the checkpoint paths, after the headers were checked): another process swapping
    a file between the check and the read. Module-level, for an isolated attempt: a loader that
    opens the pipe blocking never returns, and only a deadline can stop it."""
    swapped: list[bool] = []

    def swap() -> None:
        if not swapped:
            swapped.append(True)
            shard.unlink()
            os.mkfifo(shard)

    with while_building(swap):
        return load_on_path(loader, path, target, runtime_device=runtime_device)


def sees_zc3(loader: SeamLoader, folder: Path) -> bool:
    """Whether `loader` copies the merged QKV layer of a TP=1 TinyDiT, whose one failing
    zero-copy condition is ZC-3.

    A report names each copy's first failing condition (ZC-14). The merged layer also fails a
    later one where TP > 1 (ZC-5) or it is quantized (ZC-4); a loader that misjudges ZC-3 (ZC-3's
    own tests catch that) names the later one, which is first *among the conditions it sees*.
    ZC-14's tests ask for that, so that one defect fails its own rule only.
    """
    path, _ = write_dit_checkpoint(folder)
    _, report = loader.load_dit(
        DitRequest(TinyDiT, path, plan=Plan(torch.device("cpu")), kinds=LINEAR_KINDS)
    )
    return any(r.how == "copied" for r in report.records if ".qkv." in r.name)


def direct_load_host_growth(
    loader: SeamLoader,
    checkpoint: Path,
    config: DiTConfig,
    device: torch.device,
    *,
    dtype: torch.dtype | None = None,
) -> tuple[int, tuple[str, ...], int]:
    """A direct load of a TinyDiT of `config` onto `device` (in precision `dtype`, if given):
    the peak anonymous host memory it took above the process's state before it, the device
    types its state ended on, and the bytes of its state as loaded.
    Module-level, so an isolated attempt (`reference.kit.isolated.attempt_with`) runs it in a
    fresh process, whose heap holds no memory freed by earlier tests that a load could reuse
    unseen."""
    plan = Plan(checkpoint_load_device=device, load_full_state_dict_on_device=True)
    with PeakSampler() as host:
        build = functools.partial(TinyDiT, config)
        # Without a precision, the call a loader predating PREC also takes: DG-4's use of this
        # helper must not hinge on PREC-1's keyword.
        if dtype is None:
            module, _ = loader.load_dit(
                DitRequest(build, checkpoint, plan=plan, kinds=LINEAR_KINDS)
            )
        else:
            module, _ = loader.load_dit(
                DitRequest(build, checkpoint, plan=plan, kinds=LINEAR_KINDS, dtype=dtype)
            )
    devices = sorted({t.device.type for t in [*module.parameters(), *module.buffers()]})
    model = sum(t.nbytes for t in module.state_dict().values())
    return host.anon_growth, tuple(devices), model
