"""Pipeline folders written into a directory: model_index.json, one folder per component with
config.json and real safetensors weights, and the tiny model classes they name (`MODEL_CLASSES`,
what `--models fakes.pipelines` hands the command line).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from fakes.checkpoints import write_checkpoint
from fakes.dit import DiTConfig, RotaryDiT, TinyDiT
from fakes.layers import LINEAR_KINDS
from fakes.vae import StandardVAE, VAEConfig
from reference.request.model_index import MODEL_INDEX
from reference.request.quantization import QuantizationSpec

__all__ = [
    "FULL_PIPELINE",
    "MODEL_CLASSES",
    "SMALL_PIPELINE",
    "FakeBlock",
    "FakeComponent",
    "FakeVocoder",
    "PipelineDiT",
    "PipelineRotaryDiT",
    "PipelineVAE",
    "demo_pipeline",
    "write_component",
    "write_pipeline",
]


class FakeVocoder(nn.Module):
    """A tiny vocoder: upsampling transposed conv, a conv, and a persistent gain buffer."""

    def __init__(self, channels: int = 4, upsample: int = 2) -> None:
        super().__init__()
        self.up = nn.ConvTranspose1d(channels, channels, kernel_size=upsample, stride=upsample)
        self.conv = nn.Conv1d(channels, 1, kernel_size=3, padding=1)
        self.gain: torch.Tensor
        self.register_buffer("gain", torch.ones(1))

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(self.up(mel))) * self.gain


class FakeBlock(nn.Module):
    """A stand-in for any component whose weights a test does not look at."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(x)
        return out


class PipelineDiT(TinyDiT):
    """The tiny DiT, built from config.json keywords (dtype by name, e.g. "bfloat16")."""

    linear_kinds = LINEAR_KINDS

    def __init__(
        self,
        *,
        in_channels: int = 8,
        hidden: int = 32,
        heads: int = 2,
        mlp_ratio: int = 2,
        depth: int = 2,
        num_steps: int = 16,
        dtype: str = "float32",
        quantization: QuantizationSpec | None = None,
    ) -> None:
        config = DiTConfig(
            in_channels=in_channels,
            hidden=hidden,
            heads=heads,
            mlp_ratio=mlp_ratio,
            depth=depth,
            num_steps=num_steps,
            params_dtype=getattr(torch, dtype),
        )
        super().__init__(config, quantization=quantization)


class PipelineKeptDiT(PipelineDiT):
    """The tiny DiT with modules its class keeps in fp32 whatever the precision, as diffusers'
    `_keep_in_fp32_modules` (Wan keeps its norms and time embedder), and an integer persistent
    buffer (PREC-2)."""

    _keep_in_fp32_modules: ClassVar[list[str]] = ["norm1", "time_embed"]

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.register_buffer("positions", torch.arange(4))


class PipelineRotaryDiT(RotaryDiT):
    """The tiny DiT with its rotary table computed in `__init__` (ZC-15), from config.json."""

    linear_kinds = LINEAR_KINDS

    def __init__(self, *, hidden: int = 32, depth: int = 2, heads: int = 2) -> None:
        super().__init__(DiTConfig(hidden=hidden, depth=depth, heads=heads))


class PipelineVAE(StandardVAE):
    """The standard video VAE fake, built from config.json keywords."""

    def __init__(
        self,
        *,
        in_channels: int = 3,
        hidden: int = 8,
        latent_channels: int = 4,
        frames: int = 4,
        groups: int = 4,
    ) -> None:
        super().__init__(VAEConfig(in_channels, hidden, latent_channels, frames, groups))


MODEL_CLASSES: Mapping[str, type[nn.Module]] = {
    cls.__name__: cls
    for cls in (
        FakeVocoder,
        FakeBlock,
        PipelineDiT,
        PipelineKeptDiT,
        PipelineRotaryDiT,
        PipelineVAE,
    )
}
"""The classes these pipelines name, by class name: what a test hands a loader through the seam
(`load_pipeline_component(ComponentRequest(..., models=MODEL_CLASSES))`), and what
`python -m reference load DIR --models fakes.pipelines` registers."""


@dataclass(frozen=True)
class FakeComponent:
    """How to write one component.

    Attributes:
        cls: the model class (its name goes into model_index.json; it must be registered to load).
        config: constructor arguments, written as config.json.
        library: the library named in model_index.json.
        quantization_config: written as config.json's "quantization_config" when given.
        shards: number of safetensors shards (1: a single file).
        seed: seed of the weights.
        checkpoint_dtype: the dtype its floating tensors are saved in (integer and float8 ones
            keep theirs), as a real checkpoint may differ from the dtype its class builds in
            (FLUX.1-dev's transformer is stored in bf16); None saves them as built.
    """

    cls: type[nn.Module]
    config: Mapping[str, Any] = field(default_factory=dict)
    library: str = "fakes"
    quantization_config: Mapping[str, Any] | None = None
    shards: int = 1
    seed: int = 0
    checkpoint_dtype: torch.dtype | None = None


def _stand_in(**config: Any) -> FakeComponent:
    return FakeComponent(FakeBlock, config)


# A pipeline that declares every component kind the admission rules talk about.
FULL_PIPELINE: Mapping[str, FakeComponent] = {
    "transformer": _stand_in(width=8),
    "transformer_2": _stand_in(width=8),
    "vae": _stand_in(),
    "video_vae": _stand_in(),
    "audio_vae": _stand_in(),
    "vocoder": FakeComponent(FakeVocoder, {"channels": 4, "upsample": 2}, seed=1),
}


def write_component(root: Path, name: str, component: FakeComponent) -> dict[str, torch.Tensor]:
    """Write `root/name/config.json` and its weights; returns the state written."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {"_class_name": component.cls.__name__, **component.config}
    if component.quantization_config is not None:
        config["quantization_config"] = dict(component.quantization_config)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    torch.manual_seed(component.seed)
    state = {
        k: v.detach().clone() for k, v in component.cls(**component.config).state_dict().items()
    }
    # Serving-stack layers allocate with torch.empty: give every float tensor real values.
    generator = torch.Generator().manual_seed(component.seed)
    for key, value in state.items():
        if value.is_floating_point():
            saved = value.dtype
            # Saved as diffusers saves a model it loaded in that dtype: the class's fp32 modules
            # stay fp32, float8 keeps its dtype.
            kept = getattr(component.cls, "_keep_in_fp32_modules", None) or []
            in_kept = any(module in key.split(".") for module in kept)
            if component.checkpoint_dtype is not None and value.element_size() > 1:
                saved = torch.float32 if in_kept else component.checkpoint_dtype
            state[key] = torch.randn(value.shape, generator=generator).to(saved)
    write_checkpoint(state, folder, shards=component.shards, stem="diffusion_pytorch_model")
    return state


def write_pipeline(
    root: Path,
    components: Mapping[str, FakeComponent] = FULL_PIPELINE,
    *,
    class_name: str = "FakePipeline",
    extra_index: Mapping[str, Any] | None = None,
) -> Path:
    """Write a pipeline folder into `root` (created if missing) and return `root`.

    Args:
        root: the pipeline directory.
        components: the components to write, by name, in model_index.json order.
        class_name: model_index.json's `_class_name`.
        extra_index: more model_index.json entries written as given (for weightless entries
            such as a scheduler, `[null, null]` placeholders, or malformed entries).
    """
    root.mkdir(parents=True, exist_ok=True)
    index: dict[str, Any] = {"_class_name": class_name, "_diffusers_version": "0.0.0"}
    for name, component in components.items():
        index[name] = [component.library, component.cls.__name__]
        write_component(root, name, component)
    index.update(extra_index or {})
    (root / MODEL_INDEX).write_text(json.dumps(index, indent=2))
    return root


# A pipeline of the real fakes: a DiT with zero-copy-eligible layers, a video VAE, a vocoder.
SMALL_PIPELINE: Mapping[str, FakeComponent] = {
    # Saved in bf16, as serving's DiT precision runs it: adopted under CPU offload (PREC-4).
    "transformer": FakeComponent(
        PipelineDiT, {"hidden": 32, "depth": 2}, seed=2, checkpoint_dtype=torch.bfloat16
    ),
    "vae": FakeComponent(PipelineVAE, {}, shards=2, seed=3),
    "vocoder": FakeComponent(FakeVocoder, {"channels": 4, "upsample": 2}, seed=1),
}


def demo_pipeline(*, hidden: int = 1024, depth: int = 3) -> Mapping[str, FakeComponent]:
    """The demo's pipeline: a DiT of about 8 * hidden^2 * depth parameters saved in bf16 (~50 MiB
    at the defaults, in 2 shards) and a video VAE in fp32."""
    return {
        "transformer": FakeComponent(
            PipelineDiT,
            {"hidden": hidden, "depth": depth, "heads": 8},
            shards=2,
            seed=2,
            checkpoint_dtype=torch.bfloat16,
        ),
        "vae": FakeComponent(PipelineVAE, {"hidden": 32, "groups": 8}, seed=3),
    }
