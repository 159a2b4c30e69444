"""What the construction guard costs: a meta build of the Wan2.1-T2V-14B DiT with and without it.

`guarded_build` builds diffusers' `WanTransformer3DModel` from the real Wan2.1-T2V-14B
config.json values the way the reference's pipeline loader does (`build_dit` over
`model_builder`: the construction guard, the meta build's guard and the class build's guard, each
with its budget); `unguarded_build` runs the same meta build (`MetaBuild`: parameters and
persistent buffers to meta as they are registered, the standard layers' made there at once) with
no guard. Neither reads a file: the figures are the construction's alone, and their ratio is the
guard's cost (`reference.programs.bench.ratios`).

Both builds run under the one torch function mode the meta build and the guard share
(`reference.place.host_memory`); the guard adds its sizing and its checks to it. Measured on 2
shared vCPUs, minimum of 15: guarded 43 ms, unguarded 41 ms; before the mode was shared
(the guard's own mode over a meta build that allocated each parameter on the host and then swapped
it to meta), 66 ms and 50 ms.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["WAN_T2V_14B", "guarded_build", "unguarded_build"]

WAN_T2V_14B: dict[str, Any] = {
    "_class_name": "WanTransformer3DModel",
    "patch_size": [1, 2, 2],
    "num_attention_heads": 40,
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 13824,
    "num_layers": 40,
    "cross_attn_norm": True,
    "eps": 1e-6,
    "rope_max_seq_len": 1024,
}
"""The transformer config.json of Wan2.1-T2V-14B (about 14 billion parameters)."""


def _wan_class() -> type[nn.Module]:
    cls: type[nn.Module] = importlib.import_module("diffusers").WanTransformer3DModel
    return cls


def guarded_build() -> nn.Module:
    """The 14B DiT on meta as the reference's pipeline loader builds it, every guard on."""
    from reference.load.dit import build_dit
    from reference.place.diffusers_models import model_builder
    from reference.request.model_index import ComponentSpec

    spec = ComponentSpec(
        name="transformer",
        library="diffusers",
        class_name="WanTransformer3DModel",
        folder=Path("transformer"),  # never read: the config is given
        config=WAN_T2V_14B,
        quantization=None,
    )
    return build_dit(model_builder(spec, _wan_class()), component="transformer")


def unguarded_build() -> nn.Module:
    """The same meta build with no construction guard."""
    from reference.place.meta import MetaBuild

    diffusers_class: Any = _wan_class()
    config = {k: v for k, v in WAN_T2V_14B.items() if not k.startswith("_")}
    with MetaBuild.building():
        module: nn.Module = diffusers_class.from_config(config)
        MetaBuild.settle(module)
    return module
