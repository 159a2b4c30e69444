"""The loading paths a checkpoint can take, each reached through a `LoaderAdapter`.

    dit-adopt    load_dit with the plan of a CPU-offloaded, unquantized DiT: it loads on CPU,
                 where eligible tensors are adopted (zero-copy)
    dit-direct   load_dit in direct mode: straight onto the device (`meta` when the runtime
                 device is the CPU, as in the CPU tier)
    vae-stream   load_vae: meta build, header preflight, one tensor at a time into the slots
    transformer, vae
                 a pipeline component through its component loader (load_pipeline_component);
                 the transformer is CPU-offloaded (adoption), the VAE loads the ordinary way

Each path loads the corpus models (fakes/corpus_models.py) unless a `build` is given.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from fakes.corpus_models import CorpusDiT, CorpusVAE
from fakes.layers import LINEAR_KINDS
from fakes.platform import FakePlatform
from reference.kit.adapter import DIRECT_DIT, PIPELINES, VAE_STREAM, ZERO_COPY, LoaderAdapter

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


def direct_device(runtime_device: torch.device) -> torch.device:
    """Where direct mode loads: the runtime device, or `meta` when that is the CPU."""
    return runtime_device if runtime_device.type != "cpu" else torch.device("meta")


def load_checkpoint(
    path: str,
    loader: LoaderAdapter,
    checkpoint: Path,
    *,
    runtime_device: torch.device,
    build: Callable[[], nn.Module] | None = None,
) -> nn.Module:
    """Load `checkpoint` on one of CHECKPOINT_PATHS; returns the loaded module."""
    if path == "vae-stream":
        module, _ = loader.load_vae(build or CorpusVAE, checkpoint, device=runtime_device)
        return module
    direct = path == "dit-direct"
    if direct:
        device = direct_device(runtime_device)
    else:
        device = loader.resolve_checkpoint_load_device(
            runtime_device, component_cpu_offload=True, quantization=None
        )
    plan = loader.plan_for_component(
        checkpoint_load_device=device,
        needs_device_weight_postprocess=False,
        component_cpu_offload=not direct,
        load_full_state_dict_on_device=direct,
    )
    module, _ = loader.load_dit(build or CorpusDiT, checkpoint, plan=plan, kinds=LINEAR_KINDS)
    return module


def load_component(
    loader: LoaderAdapter, root: Path, component: str, *, runtime_device: torch.device
) -> nn.Module:
    """Load one component of the pipeline at `root` (transformer CPU-offloaded)."""
    args = loader.make_server_args(runtime_device=runtime_device, dit_cpu_offload=True)
    platform = FakePlatform(cuda=runtime_device.type == "cuda")
    return loader.load_pipeline_component(root, component, args, platform=platform)
