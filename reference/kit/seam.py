"""The suite's one seam: a loader under test is reached only through the methods of the
capabilities it declares, one small Protocol per capability.

A loader's adapter has a `name`, a frozenset `capabilities`, and the methods of each capability
it declares, no others: a test is marked with the capabilities it needs, it is skipped when the
loader does not declare one of them, and it may call only their methods (the suite's plugin
enforces that: a call outside them fails the test as a defect of the suite, never of the loader).

Values cross the seam in neutral terms: torch devices, tensors, modules, file paths, and the
value types below (import them from here; an adapter needs nothing else of the reference). An
adapter converts to and from its own loader's types at this boundary only.

Invariants every adapter keeps, whatever it declares:
  * `capabilities` is a non-empty subset of ALL_CAPABILITIES and does not change during a run;
  * a refused request raises (a `ValueError` subclass unless the method names another type) before
    anything changed; nothing is returned half-done;
  * files handed to it are never written.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from reference.place.adopt import LinearKinds, Verdict
from reference.place.postload import OffloadOptions
from reference.place.records import TensorRecord
from reference.report.summary import LoadReport
from reference.request.args import ServerArgsLike
from reference.request.platform import Platform
from reference.request.quantization import QuantizationSpec

__all__ = [
    "ADMISSION",
    "ALL_CAPABILITIES",
    "CHECKPOINT_SAFETY",
    "CLI_ARGS",
    "DIRECT_DIT",
    "FP8_DEFER",
    "LOADER_SUPPORT",
    "MEMORY_PREFLIGHT",
    "METHODS",
    "PIPELINES",
    "PLANS",
    "PROTOCOLS",
    "TENSOR_PARALLEL",
    "TEXT_ENCODERS",
    "VAE_STREAM",
    "WHOLE_PIPELINE",
    "ZERO_COPY",
    "Admission",
    "CheckpointSafety",
    "CliArgs",
    "ComponentRequest",
    "DirectDit",
    "DitRequest",
    "EncoderRequest",
    "Fp8Defer",
    "LinearKinds",
    "LoadReport",
    "LoadedPipeline",
    "LoaderAdapter",
    "LoaderSupport",
    "MemoryPreflight",
    "OffloadOptions",
    "PipelineRequest",
    "Pipelines",
    "Plan",
    "PlanLike",
    "Plans",
    "Platform",
    "Precisions",
    "QuantizationSpec",
    "SeamLoader",
    "ServerArgsLike",
    "ServingOptions",
    "StateRequest",
    "TensorParallel",
    "TensorRecord",
    "TextEncoders",
    "Unsupported",
    "VaeRequest",
    "VaeStream",
    "Verdict",
    "WholePipeline",
    "ZeroCopy",
    "capability_of",
]

# Capability names. A test names the ones it needs with @pytest.mark.capability(NAME).
PLANS = "plans"
ZERO_COPY = "zero_copy"
DIRECT_DIT = "direct_dit"
FP8_DEFER = "fp8_defer"
TENSOR_PARALLEL = "tensor_parallel"
VAE_STREAM = "vae_stream"
CLI_ARGS = "cli_args"
ADMISSION = "admission"
LOADER_SUPPORT = "loader_support"
MEMORY_PREFLIGHT = "memory_preflight"
PIPELINES = "pipelines"
CHECKPOINT_SAFETY = "checkpoint_safety"
TEXT_ENCODERS = "text_encoders"
WHOLE_PIPELINE = "whole_pipeline"


# --- value types -------------------------------------------------------------------------------


@runtime_checkable
class PlanLike(Protocol):
    """What the suite reads from a loader's plan (PLAN-1). It must be immutable."""

    @property
    def checkpoint_load_device(self) -> torch.device: ...
    @property
    def weight_postprocess_device(self) -> torch.device | None: ...
    @property
    def defer_cpu_offload(self) -> bool: ...
    @property
    def load_full_state_dict_on_device(self) -> bool: ...


@dataclass(frozen=True)
class Plan:
    """A plan as the suite hands it to a loader that takes one (`load_full_state`, `load_dit`):
    the four fields of PLAN-1, nothing more. Tests of other capabilities build their plans with
    this value, so they never need the loader's own plan methods (the `plans` capability);
    an adapter converts it to its loader's plan (and may refuse a contradictory one, PLAN-3)."""

    checkpoint_load_device: torch.device
    weight_postprocess_device: torch.device | None = None
    defer_cpu_offload: bool = False
    load_full_state_dict_on_device: bool = False


@dataclass(frozen=True)
class Precisions:
    """The dtype of each component, as a test hands it to a loader (PREC-1): every DiT
    component in `dit`, the VAEs and the vocoder in `vae`, and `components` over both, by
    component name (text and image encoders take theirs from `components` alone, else the
    dtype their checkpoint stores, TE-3). A test about precision always passes one, so
    no test needs a loader's defaults to judge it (the defaults are judged from the command
    line, `parse_server_args([])`)."""

    dit: torch.dtype
    vae: torch.dtype
    components: Mapping[str, torch.dtype] = field(default_factory=dict)


@dataclass(frozen=True)
class StateRequest:
    """A full-state load as a test asks for it (`load_full_state`): a `meta`-built module, the
    (name, tensor) pairs to fill its slots with, the plan and the standard linear kinds, and the
    component's name for messages and the report."""

    module: nn.Module
    tensors: Iterable[tuple[str, torch.Tensor]]
    _: KW_ONLY
    plan: PlanLike
    kinds: LinearKinds
    component: str = "transformer"


@dataclass(frozen=True)
class DitRequest:
    """One DiT load as a test asks for it (`load_dit`): the module's builder, the checkpoint (a
    file, an index or a folder), and how to load it.

    `dtype`: the component's precision (PREC-1): every floating slot in it, except the class's
    fp32-kept modules and integer or float8 slots (PREC-2); None keeps the dtypes the build
    gives. `quantization`: online quantization (FP8); `fsdp`: the DiT is sharded for inference
    (FP8-6)."""

    build: Callable[[], nn.Module]
    checkpoint: str | os.PathLike[str]
    _: KW_ONLY
    plan: PlanLike
    kinds: LinearKinds
    quantization: QuantizationSpec | None = None
    fsdp: bool = False
    component: str = "transformer"
    dtype: torch.dtype | None = None


@dataclass(frozen=True)
class VaeRequest:
    """One direct VAE load as a test asks for it (`load_vae`).

    `config`: the component's config.json, as read; `decode_dtype` and `channels_last_3d`: the
    post-load steps VAE-8 names; `dtype` as `DitRequest`'s (PREC-1, PREC-2)."""

    build: Callable[[], nn.Module]
    checkpoint: Path
    _: KW_ONLY
    device: torch.device
    component: str = "vae"
    config: Mapping[str, object] | None = None
    quantization: QuantizationSpec | None = None
    decode_dtype: torch.dtype | None = None
    channels_last_3d: bool = False
    dtype: torch.dtype | None = None


@dataclass(frozen=True)
class ComponentRequest:
    """One component of a pipeline folder, as a test asks for it (`load_pipeline_component`):
    the folder, the component's name, the loader's arguments (`make_server_args`' or
    `parse_server_args`' value), the platform facts, and `models`, classes by name for
    components whose model_index.json names the test's own library (None: the loader's own)."""

    pipeline_dir: Path
    component: str
    args: ServerArgsLike
    _: KW_ONLY
    platform: Platform
    models: Mapping[str, type[nn.Module]] | None = None


@dataclass(frozen=True)
class EncoderRequest:
    """One text or image encoder of a pipeline folder, as a test asks for it
    (`load_text_encoder`): the folder, the component's name (`text_encoder`, `text_encoder_2`,
    `image_encoder`, ...), the loader's arguments (`make_server_args`' or `parse_server_args`'
    value: offload, precisions) and the platform facts. Its class is the one model_index.json
    names (`["transformers", "<Class>"]`), which the loader builds by itself."""

    pipeline_dir: Path
    component: str
    _: KW_ONLY
    args: ServerArgsLike
    platform: Platform


@dataclass(frozen=True)
class PipelineRequest:
    """A whole pipeline folder, as a test asks for it (`load_pipeline`): the folder, the
    loader's arguments (`make_server_args`' value), the platform facts (CUDA, free device
    memory, available host memory: the memory preflight asks them), and `models`, classes by
    name for components whose model_index.json names the test's own library (None: the
    loader's own)."""

    pipeline_dir: Path
    _: KW_ONLY
    args: ServerArgsLike
    platform: Platform
    models: Mapping[str, type[nn.Module]] | None = None


@dataclass(frozen=True)
class LoadedPipeline:
    """What a whole-pipeline load returns.

    Attributes:
        components: every weight-bearing component the pipeline declares and the loader
            loads, by name, in model_index.json order, each ready for inference (OUT-1).
        not_loaded: each declared component that was not loaded, with why (schedulers,
            tokenizers: no weights).
        reports: the loader's report of each component's load, in the same order (empty where
            a loader keeps none; judged by no rule).
    """

    components: Mapping[str, nn.Module]
    not_loaded: Mapping[str, str] = field(default_factory=dict)
    reports: Sequence[object] = ()


@dataclass(frozen=True, kw_only=True)
class ServingOptions:
    """Loading options as a test writes them in code (`make_server_args`), unvalidated: the
    loader validates them as it would its command line (ARGS-4). Per-component maps go in as
    given (a malformed value is the loader's to refuse). `precisions` None keeps the loader's
    own defaults (PREC-1)."""

    runtime_device: torch.device
    dit_cpu_offload: bool = False
    dit_layerwise_offload: bool = False
    component_cpu_offload: Mapping[str, Any] = field(default_factory=dict)
    fsdp_inference: bool = False
    tp_size: int = 1
    quantization: QuantizationSpec | None = None
    direct_gpu_weight_loading: bool = False
    component_direct_gpu_weight_loading: Mapping[str, Any] = field(default_factory=dict)
    precisions: Precisions | None = None


class Unsupported(NotImplementedError):
    """Raised by an adapter for an option of a seam method that its loader does not take from
    the caller (a decode dtype it decides itself, a quantization it reads only from files).

    The test that asked is skipped with this reason: the rule is not credited, and no other
    error is read as a skip (a NotImplementedError from inside a load stays a failure).
    """


# --- one Protocol per capability ----------------------------------------------------------------


@runtime_checkable
class LoaderAdapter(Protocol):
    """What every adapter has, whatever it declares.

    One optional attribute: `runtime_device_setting = False` says the loader has no
    runtime-device setting (its DiT and components run on CUDA whenever the platform is CUDA;
    `make_server_args` then ignores `runtime_device`), so the cases SPEC DG-2 exempts, a CPU
    runtime device under a CUDA platform, are skipped for it. Absent means True.
    """

    name: str
    capabilities: frozenset[str]


class Plans(Protocol):
    """PLAN, DEV, FP8-1: the per-component weight-load plan and where a checkpoint lands.

    Invariants: plans are immutable values (assignment raises); a contradictory plan raises a
    ValueError at construction (PLAN-3); nothing here reads a file.
    """

    def plan_for_component(
        self,
        *,
        checkpoint_load_device: torch.device,
        needs_device_weight_postprocess: bool,
        component_cpu_offload: bool,
        load_full_state_dict_on_device: bool = False,
    ) -> PlanLike:
        """The plan of one component (PLAN-2). Raises ValueError for a contradictory plan."""
        ...

    def default_plan(self, runtime_device: torch.device) -> PlanLike:
        """The plan used when none is given (PLAN-4)."""
        ...

    def make_plan(
        self,
        *,
        checkpoint_load_device: torch.device,
        weight_postprocess_device: torch.device | None,
        defer_cpu_offload: bool,
        load_full_state_dict_on_device: bool,
    ) -> PlanLike:
        """A plan from explicit fields. Raises ValueError when they contradict (PLAN-3)."""
        ...

    def resolve_checkpoint_load_device(
        self,
        runtime_device: torch.device,
        *,
        component_cpu_offload: bool,
        quantization: QuantizationSpec | None,
    ) -> torch.device:
        """Where a component's checkpoint lands (DEV-1, DEV-2)."""
        ...

    def requires_device_weight_processing(self, quantization: QuantizationSpec | None) -> bool:
        """Whether loaded weights need processing on the device (FP8-1)."""
        ...


class _DiTLoading(Protocol):
    def load_full_state(self, request: StateRequest) -> LoadReport:
        """Fill every slot of a `meta`-built module from (name, tensor) pairs, adopting eligible
        tensors. Raises ValueError for names or shapes that do not fit; on error the module is
        left untouched (CKPT-5)."""
        ...

    def load_dit(self, request: DitRequest) -> tuple[nn.Module, LoadReport]:
        """Build the DiT on meta (parameters and persistent buffers; non-persistent buffers as
        construction makes them), in the request's dtype, load the checkpoint as its plan says,
        post-process, maybe defer the offload. Returns the module ready for inference (OUT-1)
        and its report."""
        ...


class ZeroCopy(_DiTLoading, Protocol):
    """ZC: zero-copy adoption of CPU checkpoint tensors (the full-state path).

    Invariants: a tensor is adopted (the parameter *is* it: same memory, requires_grad False)
    exactly when the rules allow; anything else gets fresh memory holding the checkpoint's values
    in the slot's dtype; persistent buffers stay buffers (ZC-15); the files are never written
    (ZC-13).
    """

    def zero_copy_verdict(
        self,
        param: torch.Tensor,
        checkpoint_tensor: torch.Tensor,
        target: torch.Tensor,
        *,
        kinds: LinearKinds,
        direct_device: torch.device | None = None,
    ) -> Verdict:
        """Adopt or copy (only `adopt` is judged; `reason` is ZC-14's); with `direct_device`
        the tensor must be there instead of on CPU (DG-5)."""
        ...


class DirectDit(ZeroCopy, Protocol):
    """DG-4, DG-5: direct DiT loading (a plan with `load_full_state_dict_on_device`).

    Invariants: tensors go from the files straight to the plan's load device, with no CPU
    pre-read; eligible tensors are adopted there.
    """


class Fp8Defer(_DiTLoading, Protocol):
    """FP8-2..6: online quantization processed on the device, then a deferred CPU offload.

    Invariants: load -> process -> offload, in that order; a quantized load that fails raises
    and never returns an unquantized model (FP8-5).
    """

    def offload_for_quantization(
        self, options: OffloadOptions, quantization: QuantizationSpec | None
    ) -> OffloadOptions:
        """The offload options a quantization leaves in force (FP8-3)."""
        ...


class TensorParallel(_DiTLoading, Protocol):
    """ZC-5, ZC-10 under TP > 1: sharded layers are filled by their own weight_loader."""


class VaeStream(Protocol):
    """VAE, CKPT-2/3: direct VAE loading by per-tensor streaming into a meta-built module.

    Invariants: refusals come before any tensor data is read; the module is returned complete
    (OUT-1) or not at all; a quantized or custom-code VAE raises
    `ComponentCheckpointUnsupportedError` before `build` is called.
    """

    def vae_state_slots(self, module: nn.Module) -> frozenset[str]:
        """Names of the module's slots: its parameters and persistent buffers (VAE-4).

        Raises ValueError when the module departs from the standard state-dict ABI on any
        submodule (VAE-2, VAE-3), its state-dict keys differ from its slots (VAE-5), it ties
        state (VAE-6) or holds a lazy parameter (VAE-4b), naming the offending entries.
        """
        ...

    def load_vae(self, request: VaeRequest) -> tuple[nn.Module, LoadReport]:
        """Direct VAE load: `build()` with parameters and persistent buffers on `meta`,
        headers checked against the slots before any tensor data is read, tensors streamed one
        at a time into their slots on the request's device, converted to each slot's dtype. The
        report holds one "streamed" record per tensor."""
        ...


class _ServerArgsFactory(Protocol):
    def make_server_args(self, options: ServingOptions) -> ServerArgsLike:
        """The loader's own options from `options`, validated like its command line (ARGS-4)."""
        ...


class CliArgs(_ServerArgsFactory, Protocol):
    """ARGS, DG-1: the loading flags on a command line and in code.

    Invariants: a malformed option raises a ValueError naming the flag; arguments that are not
    loading options come back untouched and in order (ARGS-3).
    """

    def parse_server_args(self, argv: Sequence[str]) -> tuple[ServerArgsLike, list[str]]:
        """Loading options from a command line, and the other arguments in order."""
        ...


class Admission(_ServerArgsFactory, Protocol):
    """ADM-1/2, DG-2/3/3b/7: the pipeline and arguments gates, before any weight is read.

    Invariants: `admit` reads `model_index.json` and component configs, never weights; a
    refusal raises `ComponentCheckpointUnsupportedError` or another ValueError naming the flag,
    the component and the fix.
    """

    def admit(self, pipeline_dir: Path, args: ServerArgsLike, *, platform: Platform) -> None:
        """The pipeline and arguments gates for `args` on the pipeline at `pipeline_dir`."""
        ...


class LoaderSupport(Protocol):
    """ADM-3: which components each of the loader's component loaders can load directly."""

    def loader_supports_direct(self, loader_kind: str, component: str) -> bool:
        """Declared support of a loader kind (`transformer`, `vae`, `vocoder`) for `component`."""
        ...


class MemoryPreflight(Protocol):
    """DG-6: the device-memory preflight of a direct load, from the headers alone."""

    def check_device_memory(
        self, checkpoint: Path, *, component: str, device: torch.device, platform: Platform
    ) -> int:
        """Bytes a direct load of `checkpoint` needs on `device` (headers + margin). Raises
        `DeviceMemoryError` when the platform reports less free memory; reads no tensor data."""
        ...


class Pipelines(_ServerArgsFactory, Protocol):
    """ADM-3/5/6, OUT-1 and the component paths: one component of a pipeline folder loaded by
    its component loader, whose own gate runs first.

    Invariants: model classes come from `models` (the classes model_index.json names, by class
    name) or from a library the loader knows by itself (diffusers); nothing is imported by a name
    a config gives.
    """

    def load_pipeline_component(self, request: ComponentRequest) -> nn.Module:
        """Load one component; returns it ready for inference (OUT-1)."""
        ...


class TextEncoders(_ServerArgsFactory, Protocol):
    """TE-1..4: the `transformers` components of a pipeline (text encoders, and image encoders
    where a pipeline declares one) loaded through the loader's own paths.

    Invariants: the class is the one model_index.json names, built with no initialisation and
    no host allocation for its slots; after the load every slot holds what
    `<Class>.from_pretrained(folder, torch_dtype=<the component's precision>)` gives it (names,
    dtypes, values), tied slots share one storage, and a CPU-offloaded encoder's tensors in
    their slot's dtype are adopted from the files; the precision defaults to the dtype the
    checkpoint stores; a class, custom code, a quantization or a missing library the loader
    cannot build is refused before any tensor data is read, naming the component, the class and
    the fix.
    """

    def load_text_encoder(self, request: EncoderRequest) -> nn.Module:
        """Load one encoder component; returns it ready for inference (OUT-1)."""
        ...


class WholePipeline(_ServerArgsFactory, Protocol):
    """PIPE-1..4: a pipeline folder loaded whole, in one call with one request value.

    Invariants: every refusal that needs no tensor data (admission, arguments, precisions,
    headers against slots, and one memory preflight per device for all the components
    together) comes before any tensor data of any component is read, naming the device, the
    bytes and the components; the load is atomic: a component that fails stops the others,
    the load raises naming it, and nothing of the load stays alive (modules, memory, reader
    threads, open files); components may load concurrently, with the result a sequential load
    gives.
    """

    def load_pipeline(self, request: PipelineRequest) -> LoadedPipeline:
        """Load every weight-bearing component of the pipeline; returns them (or raises)."""
        ...


class CheckpointSafety(Protocol):
    """CKPT-1/2/4, ZC-13: reading safetensors checkpoints, and refusing everything else.

    Invariants: nothing is unpickled; no file is written; a bad input raises `CheckpointError`
    (file and entry named), never a crash or a hang.
    """

    def inspect_checkpoint(
        self, path: str | os.PathLike[str]
    ) -> Mapping[str, tuple[torch.dtype, tuple[int, ...]]]:
        """Validate the headers and the shard index; (dtype, shape) of every tensor by name.
        Reads no tensor data. `path`: a file, an index or a folder holding either."""
        ...

    def read_checkpoint_tensor(
        self, path: str | os.PathLike[str], name: str, *, device: torch.device
    ) -> torch.Tensor:
        """One tensor, on `device`, with its header's dtype and shape; writing to it never
        changes the file (ZC-13). Raises `CheckpointError` as `inspect_checkpoint` does, and for
        an unknown name (`entry` is that name)."""
        ...


class SeamLoader(
    LoaderAdapter,
    Plans,
    DirectDit,
    Fp8Defer,
    TensorParallel,
    VaeStream,
    CliArgs,
    Admission,
    LoaderSupport,
    MemoryPreflight,
    Pipelines,
    TextEncoders,
    WholePipeline,
    CheckpointSafety,
    Protocol,
):
    """The loader under test as a test holds it (the `loader` fixture): typed with every
    capability's methods, of which a test may call only those of the capabilities it is marked
    with. An adapter implements only the Protocols of the capabilities it declares."""


PROTOCOLS: Mapping[str, type] = {
    PLANS: Plans,
    ZERO_COPY: ZeroCopy,
    DIRECT_DIT: DirectDit,
    FP8_DEFER: Fp8Defer,
    TENSOR_PARALLEL: TensorParallel,
    VAE_STREAM: VaeStream,
    CLI_ARGS: CliArgs,
    ADMISSION: Admission,
    LOADER_SUPPORT: LoaderSupport,
    MEMORY_PREFLIGHT: MemoryPreflight,
    PIPELINES: Pipelines,
    TEXT_ENCODERS: TextEncoders,
    WHOLE_PIPELINE: WholePipeline,
    CHECKPOINT_SAFETY: CheckpointSafety,
}
"""Each capability's Protocol."""
ALL_CAPABILITIES = frozenset(PROTOCOLS)


def _methods(protocol: type) -> frozenset[str]:
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls is object or cls is Protocol or cls.__module__ != __name__:
            continue
        names.update(n for n, v in vars(cls).items() if callable(v) and not n.startswith("_"))
    return frozenset(names)


METHODS: Mapping[str, frozenset[str]] = {name: _methods(p) for name, p in PROTOCOLS.items()}
"""The methods each capability obliges a loader to implement (and allows a test to call)."""


def capability_of(method: str) -> tuple[str, ...]:
    """The capabilities whose Protocol has `method`, sorted (empty: not a seam method)."""
    return tuple(sorted(c for c, names in METHODS.items() if method in names))
