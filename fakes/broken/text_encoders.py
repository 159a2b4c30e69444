"""Broken text and image encoder loading (TE-1..4): each the reference with one step done the way
a loader that "loads the text encoders too" plausibly gets it wrong."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

import torch
from torch import nn

from fakes.broken.base import BrokenAdapter
from reference.errors import ComponentCheckpointUnsupportedError
from reference.kit.seam import EncoderRequest
from reference.load.encoder import EncoderOptions, EncoderSteps
from reference.read.checkpoint import Checkpoint
from reference.request.args import normalise_component, own_server_args
from reference.request.model_index import read_pipeline

__all__ = [
    "HandsUnknownClassesToAutoModel",
    "InitialisesTheEncoderBuild",
    "LoadsEncodersAtTheDitPrecision",
    "ReadsNamesAsWritten",
    "UntiesTheEmbeddings",
]


class UntiesTheEmbeddings(BrokenAdapter):
    """Fills both of T5's tied embedding names with the checkpoint's values but gives each its
    own tensor (as a `load_state_dict` into an untied model does): twice the bytes, and an
    update of one no longer reaches the other (TE-2)."""

    name = "broken-unties-the-embeddings"
    breaks = frozenset({"TE-2"})

    def load_text_encoder(self, request: EncoderRequest) -> nn.Module:
        module = super().load_text_encoder(request)
        ties = getattr(module, "get_expanded_tied_weights_keys", None)
        for target in ties(all_submodels=True) if callable(ties) else {}:
            path, _, attr = target.rpartition(".")
            owner = module.get_submodule(path)
            tied = owner._parameters[attr]
            if tied is not None:
                owner._parameters[attr] = nn.Parameter(tied.detach().clone(), tied.requires_grad)
        return module


def _names_as_written(checkpoint: Checkpoint, names: object, **_: object) -> Checkpoint:
    """The checkpoint's names as its files write them, whatever the library renames."""
    return checkpoint


class ReadsNamesAsWritten(BrokenAdapter):
    """Matches the checkpoint's names to the slots as the files write them, without the
    renames transformers applies on load: Gemma 3 and Qwen2.5-VL, which transformers 5 saves
    under a former layout (`language_model.model.*`), are refused as a checkpoint that does not
    fit their class (TE-1)."""

    name = "broken-reads-names-as-written"
    breaks = frozenset({"TE-1"})

    def encoder_options(self) -> EncoderOptions:
        return EncoderOptions(steps=EncoderSteps(rename=_names_as_written))


def _built_for_real(build: Callable[[], nn.Module], **_: object) -> nn.Module:
    """The build without the meta device: every weight allocated and initialised."""
    return build()


class InitialisesTheEncoderBuild(BrokenAdapter):
    """Builds encoders for real (every weight allocated on the host and initialised from the
    random generator) before loading the checkpoint over them: the values end right, the cold
    start and the host memory do not (TE-1)."""

    name = "broken-initialises-the-encoder-build"
    breaks = frozenset({"TE-1"})

    def encoder_options(self) -> EncoderOptions:
        return EncoderOptions(steps=EncoderSteps(build=_built_for_real))


class LoadsEncodersAtTheDitPrecision(BrokenAdapter):
    """Gives a text encoder with no precision of its own the DiT's (`--dit-precision`, bf16 by
    default) instead of the dtype its checkpoint stores: an fp32 encoder is silently halved
    (TE-3)."""

    name = "broken-loads-encoders-at-the-dit-precision"
    breaks = frozenset({"TE-3"})

    def load_text_encoder(self, request: EncoderRequest) -> nn.Module:
        args = own_server_args(request.args)
        key = normalise_component(request.component)
        if (
            key not in args.component_precisions
            and not args.text_encoder_precisions
            and args.image_encoder_precision is None
        ):
            precisions = {**args.component_precisions, key: args.dit_precision}
            args = dataclasses.replace(args, component_precisions=precisions)
        return super().load_text_encoder(dataclasses.replace(request, args=args))


class HandsUnknownClassesToAutoModel(BrokenAdapter):
    """A class its transformers does not have goes to `transformers.AutoModel` (whatever the
    config's `model_type` picks), instead of being refused (TE-4)."""

    name = "broken-hands-unknown-classes-to-automodel"
    breaks = frozenset({"TE-4"})

    def load_text_encoder(self, request: EncoderRequest) -> nn.Module:
        try:
            return super().load_text_encoder(request)
        except ComponentCheckpointUnsupportedError:
            spec = read_pipeline(request.pipeline_dir).component(request.component)
            transformers = importlib.import_module("transformers")
            if hasattr(transformers, spec.class_name):
                raise
            model: nn.Module = transformers.AutoModel.from_pretrained(
                str(spec.folder), torch_dtype=torch.float32
            )
            return model.eval()
