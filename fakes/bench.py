"""Models and checkpoints for the benchmark, sized to a requested number of bytes.

`BenchDiT` is a stack of MLP blocks made of a column-parallel up projection and a row-parallel
down projection (TP=1, unquantized): every large tensor is adoptable, which the zero-copy figures
need. (`TinyDiT`'s fused QKV layer overrides `weight_loader`, so it is always copied.) Only the
per-block norms are copied, and they are tiny. The VAE is `StandardVAE` with a wider `hidden`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fakes.checkpoints import write_checkpoint
from fakes.layers import ColumnParallelLinear, RowParallelLinear
from fakes.vae import StandardVAE, VAEConfig

__all__ = [
    "DIFFUSERS_HEAD_DIM",
    "DIT_DTYPE",
    "MAX_DIFFUSERS_HEADS",
    "MAX_HIDDEN",
    "MIB",
    "MLP_RATIO",
    "PIPELINE_VAE_CONFIG",
    "VAE_BYTES_PER_HIDDEN_SQUARED",
    "BenchBlock",
    "BenchDiT",
    "BenchShapes",
    "diffusers_dit_config",
    "filled_state",
    "text_encoder_config",
    "write_bench_checkpoints",
    "write_diffusers_bench",
    "write_pipeline_bench",
    "write_text_encoder_bench",
]

MIB = 1024 * 1024
DIT_DTYPE = torch.bfloat16
MLP_RATIO = 4
MAX_HIDDEN = 2048
# StandardVAE holds about this many float32 values per hidden**2 (four 3x3x3 convolutions and a
# linear): 4 * 27 + 1 = 109 values, 436 bytes.
VAE_BYTES_PER_HIDDEN_SQUARED = 436


class BenchBlock(nn.Module):
    def __init__(self, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden, dtype=dtype)
        self.up = ColumnParallelLinear(hidden, MLP_RATIO * hidden, params_dtype=dtype)
        self.down = RowParallelLinear(MLP_RATIO * hidden, hidden, params_dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.relu(self.up(self.norm(x))))
        return out


class BenchDiT(nn.Module):
    """`depth` MLP blocks of width `hidden`; all linears column/row-parallel at TP=1."""

    def __init__(self, hidden: int = 64, depth: int = 2, dtype: torch.dtype = DIT_DTYPE) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(BenchBlock(hidden, dtype) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


@dataclass(frozen=True)
class BenchShapes:
    """Constructor arguments that make each model about the requested size."""

    dit_hidden: int
    dit_depth: int
    vae_hidden: int

    @classmethod
    def for_bytes(cls, target: int) -> BenchShapes:
        """Shapes for checkpoints of about `target` bytes each (at least 8 DiT blocks)."""
        itemsize = DIT_DTYPE.itemsize
        hidden = MAX_HIDDEN
        while hidden > 64 and 2 * MLP_RATIO * hidden * hidden * itemsize > target // 8:
            hidden //= 2
        block = 2 * MLP_RATIO * hidden * hidden * itemsize
        depth = max(1, round(target / block))
        vae_hidden = max(8, 8 * round(math.sqrt(target / VAE_BYTES_PER_HIDDEN_SQUARED) / 8))
        return cls(dit_hidden=hidden, dit_depth=depth, vae_hidden=vae_hidden)

    def dit(self) -> BenchDiT:
        return BenchDiT(self.dit_hidden, self.dit_depth)

    def vae(self) -> StandardVAE:
        return StandardVAE(VAEConfig(hidden=self.vae_hidden))


def filled_state(module: nn.Module, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """A checkpoint state for `module` (built on meta is fine): small uniform values.

    Floating tensors of 2 bytes or more get values in [-0.02, 0.02); others (float8, integers)
    are zeros. Cheap enough to write a gigabyte in seconds.
    """
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, slot in module.state_dict().items():
        if slot.dtype.is_floating_point and slot.dtype.itemsize >= 2:
            state[name] = torch.empty(slot.shape, dtype=slot.dtype).uniform_(
                -0.02, 0.02, generator=generator
            )
        else:
            state[name] = torch.zeros(slot.shape, dtype=slot.dtype)
    return state


def write_bench_checkpoints(folder: Path, shapes: BenchShapes) -> tuple[Path, Path]:
    """Write the DiT and the VAE checkpoint (one safetensors file each) under `folder`.

    Returns:
        The DiT checkpoint file and the VAE checkpoint file.
    """
    paths = []
    for name, build in (("dit", shapes.dit), ("vae", shapes.vae)):
        with torch.device("meta"):
            module = build()
        state = filled_state(module)
        paths.append(write_checkpoint(state, folder / name))
        del state
    return paths[0], paths[1]


# --- a real diffusers DiT of about the same size (the [diffusers] extra) --------------------------

DIFFUSERS_HEAD_DIM = 64
MAX_DIFFUSERS_HEADS = 16


def diffusers_dit_config(target: int) -> dict[str, object]:
    """A `WanTransformer3DModel` config of about `target` bytes of float32 weights.

    A Wan block holds about 16 * dim**2 values (self- and cross-attention, a 4x feed-forward);
    the width grows with the target up to 16 heads of 64, then blocks are added (at least 4).
    """
    heads = MAX_DIFFUSERS_HEADS
    while heads > 1 and 64 * (heads * DIFFUSERS_HEAD_DIM) ** 2 > target // 4:
        heads //= 2
    dim = heads * DIFFUSERS_HEAD_DIM
    layers = max(1, round(target / (64 * dim * dim)))
    return {
        "patch_size": (1, 2, 2),
        "num_attention_heads": heads,
        "attention_head_dim": DIFFUSERS_HEAD_DIM,
        "in_channels": 4,
        "out_channels": 4,
        "text_dim": dim,
        "freq_dim": 64,
        "ffn_dim": 4 * dim,
        "num_layers": layers,
        "rope_max_seq_len": 64,
    }


def write_diffusers_bench(folder: Path, target: int) -> Path:
    """A one-component Hub-layout pipeline in `folder`: model_index.json and a `transformer`
    (`WanTransformer3DModel` of about `target` bytes at fp32, stored in bf16) written by
    diffusers' `save_pretrained`.

    Returns the transformer's folder.

    Raises:
        ImportError: diffusers is not installed.
    """
    import importlib
    import json

    from fakes.diffusers_pipelines import resave_in

    diffusers = importlib.import_module("diffusers")
    model = diffusers.WanTransformer3DModel(**diffusers_dit_config(target))
    transformer = folder / "transformer"
    model.save_pretrained(str(transformer))
    resave_in(transformer, diffusers.WanTransformer3DModel, torch.bfloat16)  # as users get it
    index = {
        "_class_name": "WanPipeline",
        "_diffusers_version": diffusers.__version__,
        "transformer": ["diffusers", "WanTransformer3DModel"],
    }
    (folder / "model_index.json").write_text(json.dumps(index, indent=2))
    return transformer


TEXT_ENCODER_VOCAB = 32128
"""UMT5's own vocabulary is 256384 wide; this T5 one keeps the embedding a fraction of the
benchmark's smaller sizes, as the blocks are in UMT5-XXL."""


def text_encoder_config(target: int) -> dict[str, object]:
    """A `UMT5Config` of about `target` bytes of float32 weights: width 512, 8 heads of 64, a
    gated feed-forward of 1024, an embedding of at most a quarter of the target, and as many
    blocks as the rest holds (at least 1). A block holds about 4 * 512**2 (attention) +
    3 * 512 * 1024 (feed-forward) values."""
    d_model, d_ff = 512, 1024
    vocab = min(TEXT_ENCODER_VOCAB, max(256, target // (16 * d_model)))
    per_block = 4 * d_model * d_model + 3 * d_model * d_ff
    layers = max(1, round((target // 4 - vocab * d_model) / per_block))
    return {
        "vocab_size": vocab,
        "d_model": d_model,
        "d_kv": 64,
        "d_ff": d_ff,
        "num_layers": layers,
        "num_heads": 8,
        "feed_forward_proj": "gated-gelu",
    }


def write_text_encoder_bench(folder: Path, target: int) -> Path:
    """A one-component Hub-layout pipeline in `folder`: model_index.json and a `text_encoder`
    (`UMT5EncoderModel` of about `target` bytes at fp32, stored in bf16 as UMT5-XXL ships)
    written by transformers' `save_pretrained`.

    Returns the text encoder's folder.

    Raises:
        ImportError: transformers is not installed.
    """
    import importlib
    import json

    transformers = importlib.import_module("transformers")
    config = transformers.UMT5Config(**text_encoder_config(target))
    model = transformers.UMT5EncoderModel(config).to(torch.bfloat16)
    encoder = folder / "text_encoder"
    model.save_pretrained(str(encoder))
    index = {
        "_class_name": "WanPipeline",
        "_diffusers_version": "0.42.1",
        "text_encoder": ["transformers", "UMT5EncoderModel"],
    }
    (folder / "model_index.json").write_text(json.dumps(index, indent=2))
    return encoder


PIPELINE_VAE_CONFIG: dict[str, object] = {
    "base_dim": 32,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "temperal_downsample": [False, True, True],
}
"""An `AutoencoderKLWan` of about 54 MiB in fp32: Wan 2.1's layout at a third of its width
(a quarter as wide, about 3.5 MiB, for a benchmark under 256 MiB)."""


def write_pipeline_bench(folder: Path, target: int) -> Path:
    """A Wan pipeline in `folder`, written by `WanPipeline(...).save_pretrained`: a
    `WanTransformer3DModel` and a `UMT5EncoderModel` of about `target / 2` bytes of float32
    weights each, both stored in bf16 (as Wan 2.1 and UMT5-XXL ship), and an `AutoencoderKLWan`
    in fp32 (`PIPELINE_VAE_CONFIG`); no tokenizer (its files are not weights).

    Returns `folder`.

    Raises:
        ImportError: diffusers or transformers is not installed.
    """
    import importlib

    diffusers = importlib.import_module("diffusers")
    transformers = importlib.import_module("transformers")
    vae_config = dict(PIPELINE_VAE_CONFIG)
    if target < 256 * MIB:
        vae_config["base_dim"] = 8
    torch.manual_seed(0)
    dit = diffusers.WanTransformer3DModel(**diffusers_dit_config(target // 2))
    config = transformers.UMT5Config(**text_encoder_config(target // 2))
    pipeline = diffusers.WanPipeline(
        transformer=dit.to(torch.bfloat16),
        vae=diffusers.AutoencoderKLWan(**vae_config),
        text_encoder=transformers.UMT5EncoderModel(config).to(torch.bfloat16),
        tokenizer=None,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
    )
    logging = diffusers.utils.logging
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # "tokenizer=None cannot be saved": there is none to save
    try:
        pipeline.save_pretrained(str(folder))
    finally:
        logging.set_verbosity(verbosity)
    return folder
