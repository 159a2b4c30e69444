"""Real diffusers pipelines in the Hub layout, tiny: written by diffusers' own `save_pretrained`.

A folder holds `model_index.json` naming diffusers' classes, a `transformer` (a
`WanTransformer3DModel` or `FluxTransformer2DModel`, one safetensors file or shards with an
index), a `vae` (`AutoencoderKLWan` or `AutoencoderKL`), a `scheduler` saved by diffusers, and
text encoder and tokenizer entries from the transformers library whose folders hold only a
config (the reference lists them as not loaded; transformers need not be installed).

Each transformer has a few MiB of float32 weights drawn from a seed, so adopted bytes show in the
load table and file evidence dwarfs noise. diffusers is imported only when something is built,
so this module imports without it.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fakes.diffusers_vaes import IMAGE_KL, VIDEO_WAN, DiffusersVAE, write_diffusers_vae
from fakes.vae import randomized_state

SHARD_SIZE = "1MB"
"""A `max_shard_size` that splits each tiny transformer below into several shards."""


@dataclass(frozen=True)
class DiffusersDiT:
    """One diffusers transformer class with a tiny config and the inputs of one forward pass.

    Attributes:
        class_name: the class in the `diffusers` package (and in model_index.json).
        config: constructor arguments.
        inputs: forward keyword -> shape of a float input (None: pass None); integer position
            ids and timesteps are made by `sample_inputs`.
    """

    class_name: str
    config: Mapping[str, Any]
    inputs: Mapping[str, tuple[int, ...]]

    def model_class(self) -> Any:
        """The diffusers class (AttributeError when this diffusers version lacks it)."""
        return getattr(importlib.import_module("diffusers"), self.class_name)

    def build(self, seed: int = 0) -> nn.Module:
        """The model with every state entry drawn from `seed`, in eval mode."""
        model: nn.Module = self.model_class()(**self.config)
        model.load_state_dict(randomized_state(model, seed))
        return model.eval()

    def sample_inputs(self, device: torch.device, seed: int = 1) -> dict[str, Any]:
        """Seeded inputs for one forward pass on `device`."""
        g = torch.Generator().manual_seed(seed)
        kwargs: dict[str, Any] = {
            name: torch.randn(shape, generator=g).to(device) for name, shape in self.inputs.items()
        }
        kwargs["timestep"] = torch.tensor([500.0], device=device)
        if self.class_name == "FluxTransformer2DModel":
            seq = self.inputs["hidden_states"][1]
            text = self.inputs["encoder_hidden_states"][1]
            kwargs["img_ids"] = torch.stack(
                [torch.zeros(seq), torch.arange(seq) // 4, torch.arange(seq) % 4], dim=1
            ).to(device)
            kwargs["txt_ids"] = torch.zeros(text, 3, device=device)
            kwargs["timestep"] = torch.tensor([0.5], device=device)
        return kwargs

    def forward(self, model: nn.Module, device: torch.device) -> torch.Tensor:
        """The model's output on `sample_inputs(device)`, without autograd."""
        with torch.no_grad():
            out = model(**self.sample_inputs(device), return_dict=False)[0]
        result: torch.Tensor = out
        return result


WAN_DIT = DiffusersDiT(
    "WanTransformer3DModel",
    {
        "patch_size": (1, 2, 2),
        "num_attention_heads": 4,
        "attention_head_dim": 32,
        "in_channels": 4,
        "out_channels": 4,
        "text_dim": 64,
        "freq_dim": 32,
        "ffn_dim": 512,
        "num_layers": 2,
        "rope_max_seq_len": 32,
    },
    {"hidden_states": (1, 4, 2, 8, 8), "encoder_hidden_states": (1, 6, 64)},
)
FLUX_DIT = DiffusersDiT(
    "FluxTransformer2DModel",
    {
        "patch_size": 1,
        "in_channels": 16,
        "num_layers": 1,
        "num_single_layers": 2,
        "attention_head_dim": 32,
        "num_attention_heads": 4,
        "joint_attention_dim": 64,
        "pooled_projection_dim": 32,
        "axes_dims_rope": (8, 12, 12),
    },
    {
        "hidden_states": (1, 16, 16),
        "encoder_hidden_states": (1, 6, 64),
        "pooled_projections": (1, 32),
    },
)


@dataclass(frozen=True)
class HubPipeline:
    """What a Hub-layout pipeline folder holds besides its transformer and VAE.

    Attributes:
        class_name: model_index.json's `_class_name`.
        dit: the transformer.
        vae: the VAE.
        others: weightless or foreign entries: component -> [library, class].
    """

    class_name: str
    dit: DiffusersDiT
    vae: DiffusersVAE
    others: Mapping[str, tuple[str, str]]


WAN_PIPELINE = HubPipeline(
    "WanPipeline",
    WAN_DIT,
    VIDEO_WAN,
    {
        "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
        "text_encoder": ("transformers", "UMT5EncoderModel"),
        "tokenizer": ("transformers", "AutoTokenizer"),
    },
)
FLUX_PIPELINE = HubPipeline(
    "FluxPipeline",
    FLUX_DIT,
    IMAGE_KL,
    {
        "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
        "text_encoder": ("transformers", "CLIPTextModel"),
        "text_encoder_2": ("transformers", "T5EncoderModel"),
        "tokenizer": ("transformers", "CLIPTokenizer"),
        "tokenizer_2": ("transformers", "T5TokenizerFast"),
    },
)


def write_diffusers_dit(
    folder: Path, dit: DiffusersDiT, *, seed: int = 0, sharded: bool = False
) -> nn.Module:
    """Save `dit.build(seed)` into `folder` with diffusers' `save_pretrained`; returns the model."""
    model: Any = dit.build(seed)
    model.save_pretrained(str(folder), max_shard_size=SHARD_SIZE if sharded else "10GB")
    saved: nn.Module = model
    return saved


def _write_foreign(folder: Path, library: str, class_name: str) -> None:
    """A weightless or foreign component: only the config its library would read."""
    folder.mkdir(parents=True, exist_ok=True)
    if class_name.endswith("Scheduler"):
        scheduler = getattr(importlib.import_module(library), class_name)()
        scheduler.save_pretrained(str(folder))
        return
    name = "tokenizer_config.json" if "Tokenizer" in class_name else "config.json"
    config = {"architectures": [class_name], "model_type": class_name.lower()}
    (folder / name).write_text(json.dumps(config, indent=2))


def write_hub_pipeline(
    root: Path, pipeline: HubPipeline, *, seed: int = 0, sharded: bool = False
) -> Path:
    """Write a Hub-layout pipeline folder into `root` (created) and return `root`.

    Args:
        root: the pipeline folder.
        pipeline: what to write.
        seed: seed of the transformer's weights (the VAE's is `seed + 1`).
        sharded: transformer and VAE in shards with an index, as large Hub models are.
    """
    root.mkdir(parents=True, exist_ok=True)
    write_diffusers_dit(root / "transformer", pipeline.dit, seed=seed, sharded=sharded)
    write_diffusers_vae(root / "vae", pipeline.vae, seed=seed + 1, sharded=sharded)
    for name, (library, class_name) in pipeline.others.items():
        _write_foreign(root / name, library, class_name)
    index: dict[str, Any] = {
        "_class_name": pipeline.class_name,
        "_diffusers_version": importlib.import_module("diffusers").__version__,
    }
    for name, entry in sorted(
        {
            **pipeline.others,
            "transformer": ("diffusers", pipeline.dit.class_name),
            "vae": ("diffusers", pipeline.vae.class_name),
        }.items()
    ):
        index[name] = list(entry)
    (root / "model_index.json").write_text(json.dumps(index, indent=2))
    return root
