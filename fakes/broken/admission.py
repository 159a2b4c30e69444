"""Broken arguments and admission: the command line (DG-1, ARGS), the gates (ADM, DG-2/3/7),
the loader gate's fallback (ADM-3, ADM-5), defaults (ADM-6) and the memory preflight (DG-6)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

import torch

from fakes.broken.base import BrokenAdapter
from reference.errors import ArgumentError, DeviceMemoryError
from reference.kit.seam import ComponentRequest, ServingOptions
from reference.load.loaders import loader_kind
from reference.read.checkpoint import open_checkpoint
from reference.request import admission
from reference.request.args import (
    COMPONENT_DIRECT_FLAG,
    DIRECT_FLAG,
    ServerArgs,
    ServerArgsLike,
    own_server_args,
)
from reference.request.model_index import read_pipeline
from reference.request.platform import Platform
from reference.request.quantization import QuantizationSpec

__all__ = [
    "AdmitsOneFlagAtATime",
    "AllowsFsdpWithDirectDit",
    "CaseFoldingArgs",
    "CaseInsensitiveSelection",
    "CaseSensitiveComponentValues",
    "ChecksOnlyTheDitAgainstThePlatform",
    "ChecksOnlyTheMainTransformer",
    "CoercesConstructionValues",
    "IgnoresCheckpointQuantization",
    "IgnoresUnsupportedRequests",
    "LenientDitFlag",
    "MaybeMeansTrue",
    "NoMemoryMargin",
    "ParsesPastDoubleDash",
    "PutsPositionalsFirst",
    "ReadsBeforeRefusingQuantizedDirect",
    "StreamsVaesByDefault",
    "as_true_unless_false",
    "case_folding",
    "quantized_components",
    "spellings",
    "truthy",
    "values_given",
    "without_selections",
]


def spellings(flag: str) -> tuple[str, str]:
    return flag, "--" + flag[2:].replace("-", "_")


def values_given(argv: Sequence[str], flags: tuple[str, ...]) -> list[tuple[int, int, str, str]]:
    """(first index, last index, flag as written, value) of each flag in `argv` given a value
    by `=VALUE` or by a following plain token; flags are prefixes (a `.component` may follow)."""
    found = []
    for i, token in enumerate(argv):
        if token == "--":
            break
        key, eq, value = token.partition("=")
        if not key.startswith(flags):
            continue
        if eq:
            found.append((i, i, key, value))
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            found.append((i, i + 1, key, argv[i + 1]))
    return found


def as_true_unless_false(argv: Sequence[str], flags: tuple[str, ...]) -> list[str]:
    """`argv` with every value of `flags` rewritten: anything but `false` means `true`."""
    out = list(argv)
    for first, last, key, value in reversed(values_given(argv, flags)):
        out[first : last + 1] = [f"{key}={'false' if value.lower() == 'false' else 'true'}"]
    return out


class LenientDitFlag(BrokenAdapter):
    """Reads any value of --direct-gpu-weight-loading other than false as true (DG-1)."""

    name = "broken-lenient-dit-flag"
    breaks = frozenset({"DG-1"})

    def parse_server_args(self, argv: Sequence[str]) -> tuple[ServerArgs, list[str]]:
        return super().parse_server_args(as_true_unless_false(argv, spellings(DIRECT_FLAG)))


class MaybeMeansTrue(BrokenAdapter):
    """Parses `--component-direct-gpu-weight-loading.vae=maybe` (or an empty value, or a
    following `maybe`) as true (ARGS-2)."""

    name = "broken-maybe-means-true"
    breaks = frozenset({"ARGS-2"})

    def parse_server_args(self, argv: Sequence[str]) -> tuple[ServerArgs, list[str]]:
        prefixes = tuple(f"{s}." for s in spellings(COMPONENT_DIRECT_FLAG))
        return super().parse_server_args(as_true_unless_false(argv, prefixes))


class CaseSensitiveComponentValues(BrokenAdapter):
    """Accepts only lowercase `true`/`false` for per-component flags (ARGS-1)."""

    name = "broken-case-sensitive-values"
    breaks = frozenset({"ARGS-1"})

    def parse_server_args(self, argv: Sequence[str]) -> tuple[ServerArgs, list[str]]:
        prefixes = tuple(f"{s}." for s in spellings(COMPONENT_DIRECT_FLAG))
        for _, _, key, value in values_given(argv, prefixes):
            if value.lower() in ("true", "false") and value not in ("true", "false"):
                raise ArgumentError(f"{key}: expected true or false, got {value!r}")
        return super().parse_server_args(argv)


class ParsesPastDoubleDash(BrokenAdapter):
    """Not broken: treats `--` as nothing special, dropping it and parsing the loading flags
    after it, as upstream's parser does. ARGS-3 protects only tokens that cannot be read as a
    flag, and `--` is the start of every flag: SPEC leaves it free, so the suite must fail it on
    nothing."""

    name = "correct-parses-past-double-dash"
    exercises = frozenset({"ARGS-3"})

    def parse_server_args(self, argv: Sequence[str]) -> tuple[ServerArgs, list[str]]:
        return super().parse_server_args([a for a in argv if a != "--"])


class PutsPositionalsFirst(BrokenAdapter):
    """Hands the unrelated arguments back positionals first, then options, as argparse's
    `parse_intermixed_args` orders them (ARGS-3: untouched and in order)."""

    name = "broken-puts-positionals-first"
    breaks = frozenset({"ARGS-3"})

    def parse_server_args(self, argv: Sequence[str]) -> tuple[ServerArgs, list[str]]:
        args, rest = super().parse_server_args(argv)
        return args, [a for a in rest if not a.startswith("-")] + [
            a for a in rest if a.startswith("-")
        ]


def truthy(value: object) -> bool:
    if isinstance(value, str):
        return value.lower() == "true"
    return bool(value)


class CoercesConstructionValues(BrokenAdapter):
    """Built in code, turns `"true"`, `1` or None into bools instead of refusing them (ARGS-4)."""

    name = "broken-coerces-construction-values"
    breaks = frozenset({"ARGS-4"})

    def make_server_args(self, options: ServingOptions) -> ServerArgs:
        selection = options.component_direct_gpu_weight_loading or {}
        coerced = dataclasses.replace(
            options,
            component_direct_gpu_weight_loading={k: truthy(v) for k, v in selection.items()},
            direct_gpu_weight_loading=truthy(options.direct_gpu_weight_loading),
        )
        return super().make_server_args(coerced)


class CaseFoldingArgs(ServerArgs):
    """Server arguments that answer for a component name in any case."""

    def should_direct_gpu_weight_load_component(self, name: str) -> bool:
        return super().should_direct_gpu_weight_load_component(name.lower())


def case_folding(args: ServerArgs) -> CaseFoldingArgs:
    return CaseFoldingArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(args)})


class CaseInsensitiveSelection(BrokenAdapter):
    """Answers `should_direct_gpu_weight_load_component("VIDEO_VAE")` for `video_vae`: names
    match in any case, not exactly (ARGS-5)."""

    name = "broken-case-insensitive-selection"
    breaks = frozenset({"ARGS-5"})

    def parse_server_args(self, argv: Sequence[str]) -> tuple[ServerArgs, list[str]]:
        args, rest = super().parse_server_args(argv)
        return case_folding(args), rest

    def make_server_args(self, options: ServingOptions) -> ServerArgs:
        return case_folding(super().make_server_args(options))


def quantized_components(pipeline_dir: Path) -> tuple[tuple[str, ...], dict[str, QuantizationSpec]]:
    pipeline = read_pipeline(pipeline_dir)
    quantized = {
        name: spec.quantization
        for name, spec in pipeline.components.items()
        if spec.quantization is not None
    }
    return pipeline.names, quantized


def without_selections(args: ServerArgs) -> ServerArgs:
    return dataclasses.replace(args, component_direct_gpu_weight_loading={})


class AdmitsOneFlagAtATime(BrokenAdapter):
    """Admits the DiT flag, then each selected component on its own: the first refusal wins,
    so not every undeclared component is listed (ADM-1)."""

    name = "broken-admits-one-flag-at-a-time"
    breaks = frozenset({"ADM-1"})

    def admit(self, pipeline_dir: Path, args: ServerArgsLike, *, platform: Platform) -> None:
        own = own_server_args(args)
        super().admit(pipeline_dir, without_selections(own), platform=platform)
        for name, selected in own.component_direct_gpu_weight_loading.items():
            if selected:
                one = dataclasses.replace(own, component_direct_gpu_weight_loading={name: True})
                super().admit(pipeline_dir, one, platform=platform)


class ChecksOnlyTheDitAgainstThePlatform(BrokenAdapter):
    """The arguments gate checks the DiT flag only: a selected VAE is admitted without CUDA or
    while offloaded (ADM-2)."""

    name = "broken-checks-only-the-dit"
    breaks = frozenset({"ADM-2"})

    def admit(self, pipeline_dir: Path, args: ServerArgsLike, *, platform: Platform) -> None:
        own = own_server_args(args)
        names, quantized = quantized_components(pipeline_dir)
        admission.check_pipeline(own, declared=names, checkpoint_quantization=quantized)
        admission.check_arguments(without_selections(own), platform=platform, declared=names)


class AllowsFsdpWithDirectDit(BrokenAdapter):
    """Admits direct DiT loading with FSDP inference on (DG-2)."""

    name = "broken-allows-fsdp-with-direct-dit"
    breaks = frozenset({"DG-2"})
    also_fails = MappingProxyType(
        {"DG-7": "the global-cause test refuses FSDP for a pipeline of two DiTs (DG-2 with DG-7)"}
    )

    def admit(self, pipeline_dir: Path, args: ServerArgsLike, *, platform: Platform) -> None:
        own = dataclasses.replace(own_server_args(args), fsdp_inference=False)
        super().admit(pipeline_dir, own, platform=platform)


class IgnoresCheckpointQuantization(BrokenAdapter):
    """Admission refuses a quantized direct DiT only when --quantization says so, not when
    the DiT's own config.json declares it; the DiT's loader still refuses it, later (DG-3b: at
    admission, with the no-fallback error)."""

    name = "broken-ignores-checkpoint-quantization"
    breaks = frozenset({"DG-3b"})
    also_fails = MappingProxyType(
        {
            "ADM-4": "admission and the DiT's own loader then disagree on one request; the test"
            " that pins one rule at every layer pins DG-3b with ADM-4"
        }
    )

    def admit(self, pipeline_dir: Path, args: ServerArgsLike, *, platform: Platform) -> None:
        own = own_server_args(args)
        names, _ = quantized_components(pipeline_dir)
        admission.check_pipeline(own, declared=names)
        admission.check_arguments(own, platform=platform, declared=names)


class ReadsBeforeRefusingQuantizedDirect(BrokenAdapter):
    """Reads a quantized DiT's weights into memory before its loader refuses direct loading
    (DG-3: refused before any tensor data is read)."""

    name = "broken-reads-before-refusing-quantized-direct"
    breaks = frozenset({"DG-3"})

    def load_pipeline_component(self, request: ComponentRequest) -> torch.nn.Module:
        spec = read_pipeline(request.pipeline_dir).component(request.component)
        own = own_server_args(request.args)
        quantized = spec.quantization is not None or own.quantization is not None
        dit = loader_kind(request.component) == "transformer"
        if own.direct_gpu_weight_loading and quantized and dit:
            for file in open_checkpoint(spec.folder).files:
                file.read_bytes()  # everything, before the refusal
        return super().load_pipeline_component(request)


class ChecksOnlyTheMainTransformer(BrokenAdapter):
    """Checks residency, FSDP and TP for `transformer` only, not `transformer_2` (DG-7)."""

    name = "broken-checks-only-transformer"
    breaks = frozenset({"DG-7"})

    def admit(self, pipeline_dir: Path, args: ServerArgsLike, *, platform: Platform) -> None:
        own = own_server_args(args)
        names, quantized = quantized_components(pipeline_dir)
        admission.check_pipeline(own, declared=names, checkpoint_quantization=quantized)
        admission.check_arguments(own, platform=platform, declared=("transformer",))


class IgnoresUnsupportedRequests(BrokenAdapter):
    """A loader that cannot load a component directly drops the request and loads it the
    ordinary way, reading its weights, instead of refusing (ADM-3, ADM-5)."""

    name = "broken-ignores-unsupported-requests"
    breaks = frozenset({"ADM-3", "ADM-5"})

    def load_pipeline_component(self, request: ComponentRequest) -> torch.nn.Module:
        own = own_server_args(request.args)
        component = request.component
        if not self.loader_supports_direct(loader_kind(component), component):
            kept = {
                k: v for k, v in own.component_direct_gpu_weight_loading.items() if k != component
            }
            own = dataclasses.replace(own, component_direct_gpu_weight_loading=kept)
        return super().load_pipeline_component(dataclasses.replace(request, args=own))


class StreamsVaesByDefault(BrokenAdapter):
    """Streams `vae` and `video_vae` directly even when no flag asks for it (ADM-6)."""

    name = "broken-streams-vaes-by-default"
    breaks = frozenset({"ADM-6"})

    def load_pipeline_component(self, request: ComponentRequest) -> torch.nn.Module:
        own = own_server_args(request.args)
        component = request.component
        selection: Mapping[str, bool] = own.component_direct_gpu_weight_loading
        if component in ("vae", "video_vae") and component not in selection:
            selection = {**selection, component: True}
            own = dataclasses.replace(own, component_direct_gpu_weight_loading=selection)
        return super().load_pipeline_component(dataclasses.replace(request, args=own))


class NoMemoryMargin(BrokenAdapter):
    """Compares free device memory with the weights alone: no tensor in flight, no margin
    (DG-6, a SHOULD rule)."""

    name = "broken-no-memory-margin"
    breaks = frozenset({"DG-6"})

    def check_device_memory(
        self, checkpoint: Path, *, component: str, device: torch.device, platform: Platform
    ) -> int:
        needed = open_checkpoint(checkpoint).total_bytes
        free = platform.free_device_memory(device)
        if needed > free:
            raise DeviceMemoryError(
                f"{DIRECT_FLAG}: component {component!r} needs {needed} bytes on {device},"
                f" {free} bytes are free"
            )
        return needed
