"""Real diffusers pipelines, tiny, written end to end by the pipeline class's own `save_pretrained`.

`write_hub_pipeline` builds a diffusers pipeline (`WanPipeline(...)`, `FluxPipeline(...)`, ...)
from tiny components and saves it: `model_index.json` exactly as diffusers writes it (component
entries, `[null, null]` for an absent one, and the pipeline's own settings such as Wan's
`boundary_ratio` or HunyuanDiT's `requires_safety_checker`), the transformer and the VAE (one
safetensors file, or shards with an index), the scheduler's config, and real transformers text
encoders and tokenizers (fakes/text_encoders.py; the encoders load through the loader, TE, and
the tokenizers are listed as not loaded).

Each transformer has tens of KiB to a few MiB of float32 weights drawn from a seed, and the inputs
of one forward pass. diffusers and transformers are imported only when something is built, so
this module imports without them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fakes import text_encoders
from fakes.diffusers_vaes import (
    IMAGE_DC,
    IMAGE_KL,
    VIDEO_LTX,
    VIDEO_WAN,
    DiffusersVAE,
)
from fakes.vae import randomized_state

__all__ = [
    "FLOW",
    "FLUX_DIT",
    "FLUX_PIPELINE",
    "HUB_PIPELINES",
    "HUNYUAN_DIT",
    "HUNYUAN_PIPELINE",
    "LTX_DIT",
    "LTX_PIPELINE",
    "PIXART_DIT",
    "PIXART_PIPELINE",
    "SANA_DIT",
    "SANA_PIPELINE",
    "SD3_DIT",
    "SD3_PIPELINE",
    "SHARD_SIZE",
    "T5",
    "WAN22_PIPELINE",
    "WAN_DIT",
    "WAN_PIPELINE",
    "WIDTH",
    "DiffusersDiT",
    "HubPipeline",
    "Inputs",
    "resave_in",
    "write_diffusers_dit",
    "write_hub_pipeline",
]

SHARD_SIZE = "100KB"
"""A `max_shard_size` that splits every tiny transformer and VAE below into several shards."""
WIDTH = text_encoders.WIDTH

Inputs = Callable[[torch.Generator], dict[str, Any]]


@dataclass(frozen=True)
class DiffusersDiT:
    """One diffusers transformer class with a tiny config and the inputs of one forward pass.

    Attributes:
        class_name: the class in the `diffusers` package (and in model_index.json).
        config: constructor arguments.
        inputs: seeded CPU inputs of one forward pass, by keyword.
    """

    class_name: str
    config: Mapping[str, Any]
    inputs: Inputs

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
        inputs = self.inputs(torch.Generator().manual_seed(seed))
        return {name: _to(value, device) for name, value in inputs.items()}

    def forward(self, model: nn.Module, device: torch.device) -> torch.Tensor:
        """The model's output on `sample_inputs(device)`, without autograd; floating inputs in
        the model's own dtype (diffusers' `ModelMixin.dtype`), as its pipeline passes them."""
        dtype = getattr(model, "dtype", None)
        inputs = {
            name: value.to(dtype)
            if isinstance(value, torch.Tensor) and value.is_floating_point() and dtype is not None
            else value
            for name, value in self.sample_inputs(device).items()
        }
        with torch.no_grad():
            out = model(**inputs, return_dict=False)[0]
        result: torch.Tensor = out
        return result


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_to(v, device) for v in value)
    return value


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=g)


def _wan_inputs(g: torch.Generator) -> dict[str, Any]:
    return {
        "hidden_states": _randn(g, 1, 4, 2, 8, 8),
        "encoder_hidden_states": _randn(g, 1, 6, WIDTH),
        "timestep": torch.tensor([500.0]),
    }


def _flux_inputs(g: torch.Generator) -> dict[str, Any]:
    seq, text = 16, 6
    return {
        "hidden_states": _randn(g, 1, seq, 16),
        "encoder_hidden_states": _randn(g, 1, text, WIDTH),
        "pooled_projections": _randn(g, 1, WIDTH),
        "img_ids": torch.stack(
            [torch.zeros(seq), torch.arange(seq) // 4, torch.arange(seq) % 4], dim=1
        ),
        "txt_ids": torch.zeros(text, 3),
        "timestep": torch.tensor([0.5]),
    }


def _sd3_inputs(g: torch.Generator) -> dict[str, Any]:
    return {
        "hidden_states": _randn(g, 1, 4, 8, 8),
        "encoder_hidden_states": _randn(g, 1, 6, WIDTH),
        "pooled_projections": _randn(g, 1, 2 * WIDTH),
        "timestep": torch.tensor([500.0]),
    }


def _pixart_inputs(g: torch.Generator) -> dict[str, Any]:
    return {
        "hidden_states": _randn(g, 1, 4, 8, 8),
        "encoder_hidden_states": _randn(g, 1, 6, WIDTH),
        "timestep": torch.tensor([500]),
        "added_cond_kwargs": {"resolution": None, "aspect_ratio": None},
    }


def _sana_inputs(g: torch.Generator) -> dict[str, Any]:
    return {
        "hidden_states": _randn(g, 1, 4, 8, 8),
        "encoder_hidden_states": _randn(g, 1, 6, WIDTH),
        "timestep": torch.tensor([500]),
    }


def _ltx_inputs(g: torch.Generator) -> dict[str, Any]:
    frames, height, width = 2, 4, 4
    return {
        "hidden_states": _randn(g, 1, frames * height * width, 8),
        "encoder_hidden_states": _randn(g, 1, 6, WIDTH),
        "timestep": torch.tensor([500]),
        "encoder_attention_mask": torch.ones(1, 6),
        "num_frames": frames,
        "height": height,
        "width": width,
    }


def _hunyuan_inputs(g: torch.Generator) -> dict[str, Any]:
    embeddings = importlib.import_module("diffusers.models.embeddings")
    grid = 8  # 16 latent pixels in patches of 2
    rotary = embeddings.get_2d_rotary_pos_embed(8, ((0, 0), (grid, grid)), (grid, grid))
    return {
        "hidden_states": _randn(g, 1, 4, 16, 16),
        "timestep": torch.tensor([500.0]),
        "encoder_hidden_states": _randn(g, 1, 8, WIDTH),
        "text_embedding_mask": torch.ones(1, 8),
        "encoder_hidden_states_t5": _randn(g, 1, 8, WIDTH),
        "text_embedding_mask_t5": torch.ones(1, 8),
        "image_meta_size": torch.tensor([[128.0, 128.0, 128.0, 128.0, 0.0, 0.0]]),
        "style": torch.tensor([0]),
        "image_rotary_emb": tuple(rotary),
    }


WAN_DIT = DiffusersDiT(
    "WanTransformer3DModel",
    {
        "patch_size": (1, 2, 2),
        "num_attention_heads": 4,
        "attention_head_dim": 32,
        "in_channels": 4,
        "out_channels": 4,
        "text_dim": WIDTH,
        "freq_dim": 32,
        "ffn_dim": 512,
        "num_layers": 2,
        "rope_max_seq_len": 32,
    },
    _wan_inputs,
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
        "joint_attention_dim": WIDTH,
        "pooled_projection_dim": WIDTH,
        "axes_dims_rope": (8, 12, 12),
    },
    _flux_inputs,
)
SD3_DIT = DiffusersDiT(
    "SD3Transformer2DModel",
    {
        "sample_size": 8,
        "patch_size": 1,
        "in_channels": 4,
        "num_layers": 2,
        "attention_head_dim": 16,
        "num_attention_heads": 4,
        "caption_projection_dim": 64,
        "joint_attention_dim": WIDTH,
        "pooled_projection_dim": 2 * WIDTH,
        "out_channels": 4,
        "pos_embed_max_size": 16,
    },
    _sd3_inputs,
)
PIXART_DIT = DiffusersDiT(
    "PixArtTransformer2DModel",
    {
        "sample_size": 8,
        "num_layers": 2,
        "patch_size": 2,
        "attention_head_dim": 16,
        "num_attention_heads": 4,
        "caption_channels": WIDTH,
        "in_channels": 4,
        "cross_attention_dim": 64,
        "out_channels": 8,
        "attention_bias": True,
        "activation_fn": "gelu-approximate",
        "num_embeds_ada_norm": 1000,
        "norm_type": "ada_norm_single",
        "norm_elementwise_affine": False,
        "norm_eps": 1e-6,
    },
    _pixart_inputs,
)
SANA_DIT = DiffusersDiT(
    "SanaTransformer2DModel",
    {
        "patch_size": 1,
        "in_channels": 4,
        "out_channels": 4,
        "num_layers": 2,
        "num_attention_heads": 4,
        "attention_head_dim": 16,
        "num_cross_attention_heads": 4,
        "cross_attention_head_dim": 16,
        "cross_attention_dim": 64,
        "caption_channels": WIDTH,
        "sample_size": 8,
    },
    _sana_inputs,
)
LTX_DIT = DiffusersDiT(
    "LTXVideoTransformer3DModel",
    {
        "in_channels": 8,
        "out_channels": 8,
        "patch_size": 1,
        "patch_size_t": 1,
        "num_attention_heads": 4,
        "attention_head_dim": 16,
        "cross_attention_dim": 64,
        "num_layers": 2,
        "caption_channels": WIDTH,
    },
    _ltx_inputs,
)
HUNYUAN_DIT = DiffusersDiT(
    "HunyuanDiT2DModel",
    {
        "sample_size": 16,
        "num_layers": 2,
        "patch_size": 2,
        "attention_head_dim": 8,
        "num_attention_heads": 3,
        "in_channels": 4,
        "cross_attention_dim": WIDTH,
        "cross_attention_dim_t5": WIDTH,
        "pooled_projection_dim": 16,
        "hidden_size": 24,
        "text_len": 8,
        "text_len_t5": 8,
        "activation_fn": "gelu-approximate",
    },
    _hunyuan_inputs,
)


@dataclass(frozen=True)
class HubPipeline:
    """A diffusers pipeline class and the tiny components it is built from.

    Attributes:
        class_name: the pipeline class in the `diffusers` package (`_class_name`).
        dit: the transformer.
        vae: the VAE.
        scheduler: the scheduler class in the `diffusers` package.
        text: text encoders and tokenizers: component -> transformers class (text_encoders).
        settings: the pipeline's other constructor arguments (absent components as None, and
            its settings, which diffusers writes into model_index.json beside the components).
        dit_2: a second transformer (`transformer_2`, Wan 2.2's low-noise expert), or None.
    """

    class_name: str
    dit: DiffusersDiT
    vae: DiffusersVAE
    scheduler: str
    text: Mapping[str, str]
    settings: Mapping[str, Any] = field(default_factory=dict)
    dit_2: DiffusersDiT | None = None

    @property
    def others(self) -> Mapping[str, tuple[str, str]]:
        """The components that hold no DiT or VAE: component -> (library, class)."""
        found = {name: ("transformers", cls) for name, cls in self.text.items()}
        return {**found, "scheduler": ("diffusers", self.scheduler)}

    def build(self, seed: int = 0) -> Any:
        """The pipeline object: transformer seeded `seed`, VAE `seed + 1`, a second transformer
        `seed + 2`, text parts seeded."""
        diffusers = importlib.import_module("diffusers")
        torch.manual_seed(seed)
        parts = {name: text_encoders.build(cls) for name, cls in self.text.items()}
        if self.dit_2 is not None:
            parts["transformer_2"] = self.dit_2.build(seed + 2)
        return getattr(diffusers, self.class_name)(
            transformer=self.dit.build(seed),
            vae=self.vae.build(seed + 1),
            scheduler=getattr(diffusers, self.scheduler)(),
            **parts,
            **self.settings,
        )


FLOW = "FlowMatchEulerDiscreteScheduler"
T5 = {"text_encoder": "T5EncoderModel", "tokenizer": "T5Tokenizer"}
WAN_PIPELINE = HubPipeline(
    "WanPipeline",
    WAN_DIT,
    VIDEO_WAN,
    FLOW,
    {"text_encoder": "UMT5EncoderModel", "tokenizer": "T5Tokenizer"},
)
"""Wan 2.1: `transformer_2` absent ([null, null]); settings boundary_ratio, expand_timesteps."""
WAN22_PIPELINE = HubPipeline(
    "WanPipeline",
    WAN_DIT,
    VIDEO_WAN,
    FLOW,
    {"text_encoder": "UMT5EncoderModel", "tokenizer": "T5Tokenizer"},
    {"boundary_ratio": 0.875},
    dit_2=WAN_DIT,
)
"""Wan 2.2: two experts, `transformer` (high noise) and `transformer_2`, switched at
boundary_ratio."""
FLUX_PIPELINE = HubPipeline(
    "FluxPipeline",
    FLUX_DIT,
    IMAGE_KL,
    FLOW,
    {
        "text_encoder": "CLIPTextModel",
        "tokenizer": "CLIPTokenizer",
        "text_encoder_2": "T5EncoderModel",
        "tokenizer_2": "T5Tokenizer",
    },
)
SD3_PIPELINE = HubPipeline(
    "StableDiffusion3Pipeline",
    SD3_DIT,
    IMAGE_KL,
    FLOW,
    {
        "text_encoder": "CLIPTextModelWithProjection",
        "tokenizer": "CLIPTokenizer",
        "text_encoder_2": "CLIPTextModelWithProjection",
        "tokenizer_2": "CLIPTokenizer",
        "text_encoder_3": "T5EncoderModel",
        "tokenizer_3": "T5Tokenizer",
    },
)
PIXART_PIPELINE = HubPipeline(
    "PixArtSigmaPipeline", PIXART_DIT, IMAGE_KL, "DPMSolverMultistepScheduler", T5
)
SANA_PIPELINE = HubPipeline(
    "SanaPipeline",
    SANA_DIT,
    IMAGE_DC,
    "DPMSolverMultistepScheduler",
    {"text_encoder": "Gemma2Model", "tokenizer": "GemmaTokenizer"},
)
LTX_PIPELINE = HubPipeline("LTXPipeline", LTX_DIT, VIDEO_LTX, FLOW, T5)
HUNYUAN_PIPELINE = HubPipeline(
    "HunyuanDiTPipeline",
    HUNYUAN_DIT,
    IMAGE_KL,
    "DDPMScheduler",
    {
        "text_encoder": "BertModel",
        "tokenizer": "BertTokenizer",
        "text_encoder_2": "T5EncoderModel",
        "tokenizer_2": "T5Tokenizer",
    },
    {"safety_checker": None, "feature_extractor": None, "requires_safety_checker": False},
)
"""HunyuanDiT: a boolean setting (requires_safety_checker) and two absent components."""

HUB_PIPELINES: Mapping[str, HubPipeline] = {
    "wan": WAN_PIPELINE,
    "flux": FLUX_PIPELINE,
    "sd3": SD3_PIPELINE,
    "pixart": PIXART_PIPELINE,
    "sana": SANA_PIPELINE,
    "ltx": LTX_PIPELINE,
    "hunyuan": HUNYUAN_PIPELINE,
}
"""Every pipeline the suite writes, by short name (the README lists their classes)."""


def write_diffusers_dit(
    folder: Path,
    dit: DiffusersDiT,
    *,
    seed: int = 0,
    sharded: bool = False,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """Save `dit.build(seed)` into `folder` with diffusers' `save_pretrained` (with `dtype`, then
    read back in it by `from_pretrained(torch_dtype=dtype)` and saved again, as in
    `write_hub_pipeline`); returns the model as built (fp32)."""
    model: Any = dit.build(seed)
    shard_size = SHARD_SIZE if sharded else "10GB"
    model.save_pretrained(str(folder), max_shard_size=shard_size)
    if dtype is not None:
        resave_in(folder, dit.model_class(), dtype, max_shard_size=shard_size)
    saved: nn.Module = model
    return saved


def write_hub_pipeline(
    root: Path,
    pipeline: HubPipeline,
    *,
    seed: int = 0,
    sharded: bool = False,
    dit_dtype: torch.dtype | None = torch.bfloat16,
) -> Path:
    """Build `pipeline` and write it with the pipeline's own `save_pretrained`; returns `root`.

    Args:
        root: the pipeline folder (created).
        pipeline: what to build.
        seed: seed of the transformer's weights (the VAE's is `seed + 1`).
        sharded: every model in shards of SHARD_SIZE with an index, as large Hub models are.
        dit_dtype: the dtype the transformers are stored in, as a user gets them: each is read
            back by diffusers' own `from_pretrained(torch_dtype=dit_dtype)` (which keeps the
            class's `_keep_in_fp32_modules` in fp32) and written again by its `save_pretrained`
            (FLUX.1-dev's transformer ships in bf16); None keeps them as built (fp32).
    """
    built = pipeline.build(seed)
    shard_size = SHARD_SIZE if sharded else None
    built.save_pretrained(str(root), max_shard_size=shard_size)
    dit_shards = SHARD_SIZE if sharded else "10GB"
    if dit_dtype is not None:
        dits = {"transformer": pipeline.dit, "transformer_2": pipeline.dit_2}
        for name, dit in dits.items():
            if dit is not None:
                resave_in(root / name, dit.model_class(), dit_dtype, max_shard_size=dit_shards)
    return root


def resave_in(
    folder: Path, model_class: Any, dtype: torch.dtype, *, max_shard_size: str = "10GB"
) -> None:
    """Read the diffusers model at `folder` back in `dtype` with diffusers' own
    `from_pretrained(torch_dtype=dtype)` (the class's `_keep_in_fp32_modules` stay fp32) and
    write it again in its place with its `save_pretrained`: a checkpoint as users get it."""
    model = model_class.from_pretrained(str(folder), torch_dtype=dtype)
    for old in folder.glob("*.safetensors*"):
        old.unlink()
    model.save_pretrained(str(folder), max_shard_size=max_shard_size)
