"""The benchmark's whole-pipeline rows (PIPE-4): a Wan pipeline written by
`WanPipeline(...).save_pretrained` (`fakes.bench.write_pipeline_bench`: a DiT and a UMT5 text
encoder of about half the benchmark's size each, in bf16, and a VAE in fp32), loaded

  * whole, its components at once (`reference.load.pipeline.load_pipeline`), and one after
    another (`PipelineOptions(concurrency=1)`), on the copy path (every tensor copied,
    `PipelineOptions(adopt=False)`) and under CPU offload of the DiT and the text encoder
    (their tensors adopted from the files);
  * each component alone, on the copy path (`load_pipeline(components=[name])`);
  * by diffusers' own `DiffusionPipeline.from_pretrained(folder, torch_dtype=torch.bfloat16)`.

Every load ends with every component on the CPU.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn

from reference.load.pipeline import PipelineOptions, load_pipeline
from reference.request.args import ServerArgs
from reference.request.plan import CPU

__all__ = ["COMPONENTS", "PIPELINE_FOLDER", "load_whole", "pipeline_from_pretrained"]

PIPELINE_FOLDER = "pipe"
"""The benchmark folder's Wan pipeline (written when diffusers and transformers are installed)."""
COMPONENTS = ("transformer", "text_encoder", "vae")
"""Its weight-bearing components."""


def _args(offload: bool) -> ServerArgs:
    if not offload:
        return ServerArgs(runtime_device=CPU)
    return ServerArgs(
        runtime_device=CPU, dit_cpu_offload=True, component_cpu_offload={"text_encoder": True}
    )


def load_whole(
    folder: Any,
    *,
    offload: bool = False,
    concurrency: int | None = None,
    components: tuple[str, ...] | None = None,
) -> tuple[nn.Module, dict[str, int], tuple[tuple[str, float], ...]]:
    """The reference's whole-pipeline load of `folder`: the components (one module), the
    bytes they adopted, copied and streamed, and each component's seconds (`<name>_s`)."""
    options = PipelineOptions(
        adopt=offload, concurrency=concurrency or PipelineOptions().concurrency
    )
    loaded = load_pipeline(
        folder,
        _args(offload),
        components=list(components) if components is not None else None,
        options=options,
    )
    fates = {"adopted": 0, "copied": 0, "streamed": 0}
    for item in loaded:
        fates["adopted"] += item.report.adopted.bytes
        fates["copied"] += item.report.copied.bytes
        fates["streamed"] += item.report.streamed.bytes
    steps = tuple((f"{item.name}_s", item.report.seconds) for item in loaded)
    return nn.ModuleDict({item.name: item.module for item in loaded}), fates, steps


def pipeline_from_pretrained(folder: Any) -> nn.Module:
    """diffusers' `DiffusionPipeline.from_pretrained(folder, torch_dtype=torch.bfloat16)` (no
    tokenizer: the folder holds none); its weight-bearing components, as one module."""
    diffusers = importlib.import_module("diffusers")  # the [diffusers] extra; untyped
    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    pipeline = diffusers.DiffusionPipeline.from_pretrained(
        str(folder), torch_dtype=torch.bfloat16, tokenizer=None
    )
    return nn.ModuleDict({name: getattr(pipeline, name) for name in COMPONENTS})
