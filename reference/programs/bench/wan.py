"""The GPU table's real model: diffusers' `WanTransformer3DModel`, written as users get it.

`WAN_1_3B` is the Wan2.1-T2V-1.3B transformer's config (dim 1536 = 12 heads of 128, 30 layers,
ffn 8960, 16 latent channels in and out, text_dim 4096, freq_dim 256, patch (1, 2, 2)): about
1.42 billion values, 2.8 GB in bf16. `TINY_WAN` is the same class at a few hundred KiB, for the
warm-up loads and the CPU tests.

`write_wan` builds the model on meta, gives it the dtypes `from_pretrained(torch_dtype=bf16)`
gives (bf16; float32 for a parameter with a part of its name in the class's
`_keep_in_fp32_modules`), fills it with small values and writes it with the model's own
`save_pretrained`, beside a one-component `model_index.json`.
The meta build spares the 5.7 GB float32 construction and its initialisation: only the bytes
written are ever allocated.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = ["TINY_WAN", "WAN_1_3B", "WAN_CLASS", "write_wan"]

WAN_CLASS = "WanTransformer3DModel"
WAN_1_3B: Mapping[str, Any] = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 12,
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 8960,
    "num_layers": 30,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "rope_max_seq_len": 1024,
}
TINY_WAN: Mapping[str, Any] = dict(
    WAN_1_3B,
    num_attention_heads=2,
    attention_head_dim=16,
    in_channels=4,
    out_channels=4,
    text_dim=32,
    freq_dim=16,
    ffn_dim=64,
    num_layers=2,
    rope_max_seq_len=32,
)


def write_wan(folder: Path, config: Mapping[str, Any] = WAN_1_3B) -> Path:
    """Write a Hub-layout pipeline holding one `transformer` (`WanTransformer3DModel(**config)`
    in bf16, its fp32-kept modules in float32) into `folder`; returns the transformer's folder.

    Raises:
        ImportError: diffusers is not installed.
    """
    from fakes.bench import filled_state

    diffusers = importlib.import_module("diffusers")  # the [diffusers] extra; untyped
    cls = getattr(diffusers, WAN_CLASS)
    with torch.device("meta"):
        model = cls(**config)
    # torch's own `to`: diffusers' override warns about the fp32-kept parameters, kept below.
    torch.nn.Module.to(model, torch.bfloat16)
    keep = set(getattr(cls, "_keep_in_fp32_modules", None) or ())
    state = filled_state(model)
    for name in state:  # diffusers' own rule: a part of the parameter's name is in the list
        if keep & set(name.split(".")) and state[name].is_floating_point():
            state[name] = state[name].float()
    model.load_state_dict(state, assign=True)
    transformer = folder / "transformer"
    model.save_pretrained(str(transformer))
    index = {
        "_class_name": "WanPipeline",
        "_diffusers_version": diffusers.__version__,
        "transformer": ["diffusers", WAN_CLASS],
    }
    (folder / "model_index.json").write_text(json.dumps(index, indent=2))
    return transformer
