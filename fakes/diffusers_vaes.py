"""Real diffusers VAE folders: diffusers' own classes with tiny configs and seeded random weights,
written by diffusers' own `save_pretrained` (config.json plus one safetensors file or shards
with an index), alone or as the `vae` of a pipeline folder.

diffusers is imported only when a model is built, so this module imports without it.
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

from fakes.vae import randomized_state

__all__ = [
    "IMAGE_DC",
    "IMAGE_KL",
    "IMAGE_TINY",
    "SHARD_SIZE",
    "VIDEO_COGVIDEOX",
    "VIDEO_COSMOS",
    "VIDEO_LTX",
    "VIDEO_WAN",
    "DiffusersVAE",
    "write_diffusers_pipeline",
    "write_diffusers_vae",
]

SHARD_SIZE = "20KB"
"""A `max_shard_size` that splits every tiny VAE below into several shards."""


@dataclass(frozen=True)
class DiffusersVAE:
    """One diffusers VAE class with a tiny config.

    Attributes:
        class_name: the class in the `diffusers` package (and in model_index.json).
        config: constructor arguments.
        latents: the shape of latents its decoder takes (batch first).
    """

    class_name: str
    config: Mapping[str, Any]
    latents: tuple[int, ...]

    def model_class(self) -> Any:
        """The diffusers class (AttributeError when this diffusers version lacks it)."""
        return getattr(importlib.import_module("diffusers"), self.class_name)

    def build(self, seed: int = 0) -> nn.Module:
        """The model with every state entry drawn from `seed` (no constant init left)."""
        model: nn.Module = self.model_class()(**self.config)
        model.load_state_dict(randomized_state(model, seed))
        return model.eval()

    def sample_latents(self, device: torch.device, seed: int = 1) -> torch.Tensor:
        """Seeded latents for a decode."""
        g = torch.Generator().manual_seed(seed)
        return torch.randn(self.latents, generator=g).to(device)


IMAGE_KL = DiffusersVAE(
    "AutoencoderKL",
    {
        "block_out_channels": (8, 16),
        "down_block_types": ("DownEncoderBlock2D",) * 2,
        "up_block_types": ("UpDecoderBlock2D",) * 2,
        "latent_channels": 4,
        "norm_num_groups": 4,
        "layers_per_block": 1,
    },
    (1, 4, 4, 4),
)
VIDEO_WAN = DiffusersVAE(
    "AutoencoderKLWan",
    {
        "base_dim": 8,
        "z_dim": 4,
        "dim_mult": [1, 2],
        "num_res_blocks": 1,
        "temperal_downsample": [False],
    },
    (1, 4, 2, 4, 4),
)
VIDEO_COGVIDEOX = DiffusersVAE(
    "AutoencoderKLCogVideoX",
    {
        "down_block_types": ("CogVideoXDownBlock3D",) * 2,
        "up_block_types": ("CogVideoXUpBlock3D",) * 2,
        "block_out_channels": (8, 16),
        "latent_channels": 4,
        "layers_per_block": 1,
        "norm_num_groups": 4,
        "temporal_compression_ratio": 2,
    },
    (1, 4, 2, 4, 4),
)
IMAGE_TINY = DiffusersVAE(
    "AutoencoderTiny",
    {
        "encoder_block_out_channels": (8, 8),
        "decoder_block_out_channels": (8, 8),
        "num_encoder_blocks": (1, 1),
        "num_decoder_blocks": (1, 1),
    },
    (1, 4, 4, 4),
)
IMAGE_DC = DiffusersVAE(
    "AutoencoderDC",
    {
        "in_channels": 3,
        "latent_channels": 4,
        "attention_head_dim": 2,
        "encoder_block_types": ("ResBlock", "EfficientViTBlock"),
        "decoder_block_types": ("ResBlock", "EfficientViTBlock"),
        "encoder_block_out_channels": (8, 8),
        "decoder_block_out_channels": (8, 8),
        "encoder_qkv_multiscales": ((), (5,)),
        "decoder_qkv_multiscales": ((), (5,)),
        "encoder_layers_per_block": (1, 1),
        "decoder_layers_per_block": (1, 1),
        "downsample_block_type": "conv",
        "upsample_block_type": "interpolate",
        "decoder_norm_types": "rms_norm",
        "decoder_act_fns": "silu",
        "scaling_factor": 0.41407,
    },
    (1, 4, 4, 4),
)
VIDEO_LTX = DiffusersVAE(
    "AutoencoderKLLTXVideo",
    {
        "in_channels": 3,
        "out_channels": 3,
        "latent_channels": 8,
        "block_out_channels": (8, 8, 8, 8),
        "decoder_block_out_channels": (8, 8, 8, 8),
        "layers_per_block": (1, 1, 1, 1, 1),
        "decoder_layers_per_block": (1, 1, 1, 1, 1),
        "spatio_temporal_scaling": (True, True, False, False),
        "decoder_spatio_temporal_scaling": (True, True, False, False),
        "decoder_inject_noise": (False, False, False, False, False),
        "upsample_residual": (False, False, False, False),
        "upsample_factor": (1, 1, 1, 1),
        "timestep_conditioning": False,
        "patch_size": 1,
        "patch_size_t": 1,
        "encoder_causal": True,
        "decoder_causal": False,
    },
    (1, 8, 2, 4, 4),
)
# Builds its patching index ranges with torch.arange in __init__ as non-persistent buffers: on
# meta they stay meta, and nothing rebuilds them (VAE-9).
VIDEO_COSMOS = DiffusersVAE(
    "AutoencoderKLCosmos",
    {
        "latent_channels": 4,
        "encoder_block_out_channels": (8, 16),
        "decode_block_out_channels": (8, 16),
        "attention_resolutions": (),
        "resolution": 32,
        "num_layers": 1,
        "patch_size": 2,
        "spatial_compression_ratio": 4,
        "temporal_compression_ratio": 2,
        "latents_mean": None,
        "latents_std": None,
    },
    (1, 4, 2, 4, 4),
)


def write_diffusers_vae(
    folder: Path,
    vae: DiffusersVAE,
    *,
    seed: int = 0,
    sharded: bool = False,
    dtype: torch.dtype | None = None,
) -> dict[str, Any]:
    """Save `vae.build(seed)` into `folder` with diffusers' `save_pretrained`.

    Args:
        folder: the component folder (created).
        vae: what to build.
        seed: seed of the weights.
        sharded: split the weights into shards of SHARD_SIZE, with an index.
        dtype: store the weights in this dtype (the config still builds float32 modules).

    Returns:
        The config.json diffusers wrote.
    """
    model: Any = vae.build(seed)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(str(folder), max_shard_size=SHARD_SIZE if sharded else "10GB")
    config: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return config


def write_diffusers_pipeline(
    root: Path, vae: DiffusersVAE, *, seed: int = 0, sharded: bool = False
) -> Path:
    """A pipeline folder whose `vae` is `vae` (saved by diffusers) and whose model_index.json
    also names a scheduler, saved in its own folder as a real pipeline holds it (no weights:
    the load skips it). Returns `root`."""
    write_diffusers_vae(root / "vae", vae, seed=seed, sharded=sharded)
    diffusers = importlib.import_module("diffusers")
    diffusers.FlowMatchEulerDiscreteScheduler().save_pretrained(root / "scheduler")
    index = {
        "_class_name": "DiffusersVAEPipeline",
        "_diffusers_version": diffusers.__version__,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "vae": ["diffusers", vae.class_name],
    }
    (root / "model_index.json").write_text(json.dumps(index, indent=2))
    return root
