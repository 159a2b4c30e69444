"""Real diffusers component folders: diffusers' own model classes with tiny configs and seeded
random weights, written by diffusers' own `save_pretrained` as one component of a pipeline
folder, with the library entry a real pipeline's model_index.json gives it: `diffusers` for the
classes diffusers exports (`MMAudioVocoder`, `UNet2DConditionModel`), the pipeline package for
one a pipeline package defines (LTX-2's `["ltx2", "LTX2Vocoder"]` and `["ltx2",
"LTX2TextConnectors"]`).

`VOCODERS` are `vocoder` components; `MODULES` are components of no named kind (the module
loader's: a UNet, LTX-2's text connectors).

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
    "LTX2_CONNECTORS",
    "LTX2_VOCODER",
    "MINIMAX_VOCODER",
    "MMAUDIO_VOCODER",
    "MODULES",
    "UNET",
    "VOCODERS",
    "DiffusersModel",
    "ltx2_pipeline",
    "qwen_image_pipeline",
]


@dataclass(frozen=True)
class DiffusersModel:
    """One diffusers model class with a tiny config, as one component of a pipeline.

    Attributes:
        library: the library model_index.json names (`diffusers`, or a pipeline package).
        module: the module that defines the class.
        class_name: the class.
        config: constructor arguments.
        inputs: the shapes of the tensors its forward takes, in order (batch first), drawn
            from a seed (those at the positions `integer` names: ones, as int64).
        component: the component's name in model_index.json.
        integer: positions among `inputs` that take int64 ones (a timestep, a mask).
    """

    library: str
    module: str
    class_name: str
    config: Mapping[str, Any]
    inputs: tuple[tuple[int, ...], ...]
    component: str = "vocoder"
    integer: tuple[int, ...] = ()

    def model_class(self) -> Any:
        """The diffusers class (AttributeError when this diffusers version lacks it)."""
        return getattr(importlib.import_module(self.module), self.class_name)

    def build(self, seed: int = 0) -> nn.Module:
        """The model with every state entry drawn from `seed`."""
        model: nn.Module = self.model_class()(**self.config)
        model.load_state_dict(randomized_state(model, seed))
        return model.eval()

    def write(self, root: Path, *, seed: int = 0, dtype: torch.dtype | None = None) -> Path:
        """A pipeline folder at `root` whose only component is this model, saved by
        diffusers' `save_pretrained` (in `dtype` where given, as built otherwise). Returns
        `root`."""
        model: Any = self.build(seed)
        if dtype is not None:
            model.to(dtype)
        model.save_pretrained(str(root / self.component))
        diffusers = importlib.import_module("diffusers")
        index = {
            "_class_name": "OneComponentPipeline",
            "_diffusers_version": diffusers.__version__,
            self.component: [self.library, self.class_name],
        }
        (root / "model_index.json").write_text(json.dumps(index, indent=2))
        return root

    def output(self, model: nn.Module, seed: int = 0) -> torch.Tensor:
        """`model`'s first output for inputs drawn from `seed`, in its parameters' dtype."""
        generator = torch.Generator().manual_seed(seed)
        weight = next(model.parameters())
        inputs = [
            torch.ones(shape, dtype=torch.int64, device=weight.device)
            if i in self.integer
            else torch.randn(*shape, generator=generator).to(weight.device, weight.dtype)
            for i, shape in enumerate(self.inputs)
        ]
        with torch.no_grad():
            out = model(*inputs)
        first = out if isinstance(out, torch.Tensor) else out[0]  # a tuple, or an output class
        assert isinstance(first, torch.Tensor)
        return first


LTX2_VOCODER = DiffusersModel(
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
    ((1, 2, 5, 4),),
)
MINIMAX_VOCODER = DiffusersModel(
    "diffusers",
    "diffusers",
    "MiniMaxMusic3Vocoder",
    {
        "latent_channels": 8,
        "decoder_input_dim": 16,
        "decoder_hidden_dim": 16,
        "upsampling_ratios": (2, 2),
    },
    ((1, 8, 5),),
)
MMAUDIO_VOCODER = DiffusersModel(
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
    ((1, 8, 5),),
)
VOCODERS = (LTX2_VOCODER, MINIMAX_VOCODER, MMAUDIO_VOCODER)
LTX2_CONNECTORS = DiffusersModel(
    "ltx2",
    "diffusers.pipelines.ltx2.connectors",
    "LTX2TextConnectors",
    {
        "caption_channels": 8,
        "text_proj_in_factor": 2,
        "video_connector_num_attention_heads": 2,
        "video_connector_attention_head_dim": 4,
        "video_connector_num_layers": 1,
        "video_connector_num_learnable_registers": 4,
        "audio_connector_num_attention_heads": 2,
        "audio_connector_attention_head_dim": 4,
        "audio_connector_num_layers": 1,
        "audio_connector_num_learnable_registers": 4,
        "connector_rope_base_seq_len": 32,
        "video_hidden_dim": 8,
        "audio_hidden_dim": 8,
    },
    ((1, 4, 16), (1, 4)),  # per-layer text hidden states, flattened; the attention mask
    component="connectors",
    integer=(1,),
)
UNET = DiffusersModel(
    "diffusers",
    "diffusers",
    "UNet2DConditionModel",
    {
        "sample_size": 8,
        "in_channels": 4,
        "out_channels": 4,
        "layers_per_block": 1,
        "block_out_channels": (8, 16),
        "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
        "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"),
        "cross_attention_dim": 32,  # fakes.text_encoders' width
        "norm_num_groups": 4,
        "attention_head_dim": 2,
    },
    ((1, 4, 8, 8), (1,), (1, 3, 32)),  # latents, the timestep, the text embeddings
    component="unet",
    integer=(1,),
)
MODULES = (LTX2_CONNECTORS, UNET)


def ltx2_pipeline(seed: int = 0) -> Any:
    """A whole `LTX2Pipeline` of diffusers' and transformers' own classes, tiny: its DiT, video
    and audio VAEs, Gemma 3 text encoder (`fakes.text_encoders`) and tokenizer, text
    connectors, vocoder, duration head (LTX-2.5's) and scheduler; `save_pretrained` writes it
    as LTX-2's folder is written (its absent optional components as `[null, null]`). Each model
    seeded from `seed`."""
    from fakes import text_encoders

    diffusers = importlib.import_module("diffusers")
    ltx2 = importlib.import_module("diffusers.pipelines.ltx2")
    torch.manual_seed(seed)
    text_encoder = text_encoders.build("Gemma3ForConditionalGeneration")
    width = text_encoders.WIDTH
    transformer = diffusers.LTX2VideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=4,
        audio_cross_attention_dim=8,
        num_layers=2,
        qk_norm="rms_norm_across_heads",
        caption_channels=width,
        rope_double_precision=False,
        rope_type="split",
    )
    connectors = ltx2.LTX2TextConnectors(
        caption_channels=width,
        text_proj_in_factor=2,  # the text encoder's layers + 1
        video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=8,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32,
        rope_double_precision=False,
        rope_type="split",
    )
    vae = diffusers.AutoencoderKLLTX2Video(
        latent_channels=4,
        block_out_channels=(8,),
        decoder_block_out_channels=(8,),
        layers_per_block=(1,),
        decoder_layers_per_block=(1, 1),
        spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False),
        downsample_type=("spatial",),
        upsample_residual=(False,),
        upsample_factor=(1,),
        timestep_conditioning=False,
        patch_size=1,
        patch_size_t=1,
    )
    audio_vae = diffusers.AutoencoderKLLTX2Audio(
        base_channels=4,
        output_channels=2,
        ch_mult=(1,),
        num_res_blocks=1,
        attn_resolutions=None,
        in_channels=2,
        resolution=32,
        latent_channels=2,
        mid_block_add_attention=False,
        mel_bins=8,
    )
    vocoder = ltx2.LTX2Vocoder(
        in_channels=16,  # the audio VAE's output channels x mel bins
        hidden_channels=32,
        out_channels=2,
        upsample_kernel_sizes=[4, 4],
        upsample_factors=[2, 2],
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]],
    )
    duration_head = ltx2.LTX2DurationHead(
        video_cross_attention_dim=32,  # the connectors' width: 4 heads x 8
        audio_cross_attention_dim=32,
        pooler_hidden_dim=8,
        num_queries=1,
        num_pooler_heads=2,
        mlp_hidden_dim=8,
    )
    for model in (transformer, connectors, vae, audio_vae, vocoder, duration_head):
        model.load_state_dict(randomized_state(model, seed))
    return diffusers.LTX2Pipeline(
        duration_head=duration_head,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        audio_vae=audio_vae,
        text_encoder=text_encoder,
        tokenizer=text_encoders.build("GemmaTokenizer"),
        connectors=connectors,
        transformer=transformer,
        vocoder=vocoder,
    )


def qwen_image_pipeline(seed: int = 0) -> Any:
    """A whole `QwenImagePipeline` of diffusers' and transformers' own classes, tiny: its DiT,
    VAE, Qwen2.5-VL text encoder (`fakes.text_encoders`), tokenizer and scheduler. Each model
    seeded from `seed`."""
    from fakes import text_encoders

    diffusers = importlib.import_module("diffusers")
    torch.manual_seed(seed)
    transformer = diffusers.QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=text_encoders.WIDTH,
        axes_dims_rope=(8, 4, 4),
    )
    vae = diffusers.AutoencoderKLQwenImage(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 2],
        num_res_blocks=1,
        temperal_downsample=[False],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    )
    for model in (transformer, vae):
        model.load_state_dict(randomized_state(model, seed))
    return diffusers.QwenImagePipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=text_encoders.build("Qwen2_5_VLForConditionalGeneration"),
        tokenizer=text_encoders.build("Qwen2Tokenizer"),
        transformer=transformer,
    )
