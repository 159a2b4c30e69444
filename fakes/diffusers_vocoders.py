"""Real diffusers vocoder folders: diffusers' own vocoder classes with tiny configs and seeded
random weights, written by diffusers' own `save_pretrained` as the `vocoder` of a pipeline
folder, with the library entry a real pipeline's model_index.json gives it: `diffusers` for the
vocoders diffusers exports (`MMAudioVocoder`, `MiniMaxMusic3Vocoder`), the pipeline package for
one a pipeline package defines (LTX-2's `["ltx2", "LTX2Vocoder"]`).

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

__all__ = ["LTX2_VOCODER", "MINIMAX_VOCODER", "MMAUDIO_VOCODER", "VOCODERS", "DiffusersVocoder"]


@dataclass(frozen=True)
class DiffusersVocoder:
    """One diffusers vocoder class with a tiny config.

    Attributes:
        library: the library model_index.json names (`diffusers`, or a pipeline package).
        module: the module that defines the class.
        class_name: the class.
        config: constructor arguments.
        inputs: the shape of what its forward takes (batch first).
    """

    library: str
    module: str
    class_name: str
    config: Mapping[str, Any]
    inputs: tuple[int, ...]

    def model_class(self) -> Any:
        """The diffusers class (AttributeError when this diffusers version lacks it)."""
        return getattr(importlib.import_module(self.module), self.class_name)

    def build(self, seed: int = 0) -> nn.Module:
        """The model with every state entry drawn from `seed`."""
        model: nn.Module = self.model_class()(**self.config)
        model.load_state_dict(randomized_state(model, seed))
        return model.eval()

    def write(self, root: Path, *, seed: int = 0) -> Path:
        """A pipeline folder at `root` whose only component is this vocoder, saved by
        diffusers' `save_pretrained`. Returns `root`."""
        model: Any = self.build(seed)
        model.save_pretrained(str(root / "vocoder"))
        diffusers = importlib.import_module("diffusers")
        index = {
            "_class_name": "VocoderPipeline",
            "_diffusers_version": diffusers.__version__,
            "vocoder": [self.library, self.class_name],
        }
        (root / "model_index.json").write_text(json.dumps(index, indent=2))
        return root

    def output(self, model: nn.Module, seed: int = 0) -> torch.Tensor:
        """`model`'s output for inputs drawn from `seed`."""
        inputs = torch.randn(*self.inputs, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            out = model(inputs.to(next(model.parameters()).device))
        return out if isinstance(out, torch.Tensor) else out[0]


LTX2_VOCODER = DiffusersVocoder(
    "ltx2",
    "diffusers.pipelines.ltx2.vocoder",
    "LTX2Vocoder",
    {
        "in_channels": 8,
        "hidden_channels": 16,
        "out_channels": 2,
        "upsample_kernel_sizes": [4, 4],
        "upsample_factors": [2, 2],
        "resnet_kernel_sizes": [3],
        "resnet_dilations": [[1, 3]],
    },
    (1, 2, 5, 4),
)
MINIMAX_VOCODER = DiffusersVocoder(
    "diffusers",
    "diffusers",
    "MiniMaxMusic3Vocoder",
    {
        "latent_channels": 8,
        "decoder_input_dim": 16,
        "decoder_hidden_dim": 16,
        "upsampling_ratios": (2, 2),
    },
    (1, 8, 5),
)
MMAUDIO_VOCODER = DiffusersVocoder(
    "diffusers",
    "diffusers",
    "MMAudioVocoder",
    {
        "num_mels": 8,
        "upsample_initial_channel": 16,
        "upsample_rates": (2, 2),
        "upsample_kernel_sizes": (4, 4),
        "resblock_kernel_sizes": (3,),
        "resblock_dilation_sizes": ((1, 3),),
    },
    (1, 8, 5),
)
VOCODERS = (LTX2_VOCODER, MINIMAX_VOCODER, MMAUDIO_VOCODER)
