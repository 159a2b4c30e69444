"""sglang's diffusion loader (`sglang.multimodal_gen`, 0.5.23) behind the seam: the upstream row
of the conformance matrix.

`SglangLoader` converts the suite's values to sglang's and calls sglang's own entry points:

    plans          loader.weight_load_plan.WeightLoadPlan (its constructor, `for_component`, and
                   the default `maybe_load_fsdp_model` falls back to)
    load device    component_loaders.transformer_loader._resolve_checkpoint_load_device
    post-process   loader.transformer_load_utils._needs_device_weight_postprocess on the config
                   sglang's registry builds for the method (`get_quantization_config`)
    full state     loader.fsdp_load.load_model_from_full_model_state_dict, then
                   loader.utils.finalize_loaded_model, as every sglang caller runs them
    precision      `--dit-precision` as `param_dtype` (transformer_load_utils.
                   _resolve_target_param_dtype), a VAE's as `--component-precisions.<c>`; on
                   a command line, the flags as `ServerArgs.from_cli_args` hands them over
    DiT            loader.fsdp_load.maybe_load_fsdp_model (meta build, read, full-state load,
                   post-processing, finalisation, deferred CPU placement)
    FP8 offload    transformer_load_utils._ModelOptFp8OffloadAdapter's rule
                   (`_maybe_disable_incompatible_dit_offload_modes`) on a ServerArgs
    arguments      server_args.ServerArgs (construction validates), its argparse flags
                   (`add_cli_args`) and `_extract_component_direct_gpu_weight_loading`
    admission      ComposedPipelineBase._validate_direct_gpu_component_selection (pipeline) and
                   ServerArgs._validate_direct_gpu_weight_loading (arguments)
    VAE            component_loaders.vae_loader.VAELoader.load_customized with the component's
                   direct flag, and its slot check `_direct_gpu_vae_state_slots`
    checkpoints    loader.weight_utils.checkpoint_weights_iterator / safetensors_weights_iterator

Every decision (adopt or copy, refusals, dtype conversion, placement, validation) is sglang's; the
adapter never re-implements one. A zero-copy verdict is read off a real one-tensor sglang load
(is the loaded parameter the handed tensor's memory?), not transcribed from sglang's predicate.
Where sglang and the suite name a concept differently the adapter bridges it, and each bridge is
marked `# bridge:` below: the suite's standard linear classes (`LinearKinds`) stand in for
sglang's own in the two places its loader names them; a `build()` callable becomes a registered
model class; the suite's folder or file becomes the component folder sglang reads; sglang's
platform object answers for the suite's `Platform`; a one-process gloo group stands in for the
tensor-parallel world sglang's ordinary path asks about.

Capabilities: `plans`, `zero_copy`, `direct_dit`, `fp8_defer`, `cli_args`, `admission`,
`vae_stream`, `checkpoint_safety`. Not declared, because sglang has no function to call for them:
`memory_preflight` (sglang has no device-memory preflight: DG-6 is a named gap),
`tensor_parallel` (sglang shards through real process groups of several ranks, which one process
cannot give it), `loader_support` (sglang's transformer loader honours the global DiT flag inside
`load_customized` and has no predicate of its own to ask), `pipelines` (a pipeline component is
loaded by sglang's composed pipeline, which resolves model classes through its own registry and
pipeline configs from the hub, not through the seam).

Importing this module without sglang installed raises ImportError saying how to get it;
sglang itself is imported when a `SglangLoader` is made, never by `reference` otherwise.
`tox -e matrix-sglang` builds the environment it needs (sglang installed with --no-deps over the
pinned CPU torch).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import itertools
import json
import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from reference.errors import CheckpointError, ComponentCheckpointUnsupportedError
from reference.kit.adapters import _torchvision_shim
from reference.kit.seam import (
    ADMISSION,
    CHECKPOINT_SAFETY,
    CLI_ARGS,
    DIRECT_DIT,
    FP8_DEFER,
    PLANS,
    VAE_STREAM,
    ZERO_COPY,
    DitRequest,
    LinearKinds,
    LoadReport,
    OffloadOptions,
    PlanLike,
    Platform,
    Precisions,
    QuantizationSpec,
    ServerArgsLike,
    ServingOptions,
    StateRequest,
    TensorRecord,
    Unsupported,
    VaeRequest,
    Verdict,
)

__all__ = [
    "COMPONENT_OFFLOAD",
    "CPU",
    "INDEX_SUFFIX",
    "INSTALL_HINT",
    "MODEL_PATH",
    "RESIDENT",
    "Sglang",
    "SglangLoader",
    "SglangPlan",
]

INSTALL_HINT = (
    "SglangLoader needs sglang 0.5.23 (`tox -e matrix-sglang` builds that environment: sglang"
    " installed with --no-deps over the pinned CPU torch)"
)
if importlib.util.find_spec("sglang") is None:
    raise ImportError(INSTALL_HINT)

CPU = torch.device("cpu")
# sglang's residency mode names (managers/memory_managers/component_residency.py:19-20)
RESIDENT = "resident"
COMPONENT_OFFLOAD = "component-offload"
INDEX_SUFFIX = ".safetensors.index.json"
# bridge: sglang's ServerArgs needs a model path; its loaders are handed component folders
# explicitly, and only pipeline resolution (not used here) reads this one.
MODEL_PATH = os.path.join(tempfile.gettempdir(), "sglang-adapter-no-pipeline")
# The names under which sglang's loader module refers to its standard linears and their
# unquantized method (fsdp_load.py:29-37, quantization_utils.py imports).
_FSDP_LINEAR_NAMES = {
    "ReplicatedLinear": "replicated",
    "MergedReplicatedLinear": "replicated",
    "ColumnParallelLinear": "column_parallel",
    "MergedColumnParallelLinear": "column_parallel",
    "QKVParallelLinear": "column_parallel",
    "RowParallelLinear": "row_parallel",
}


class Sglang:
    """sglang's loader functions, imported on first use (each attribute is sglang's own object,
    typed Any: the adapter passes values through)."""

    def __init__(self) -> None:
        _torchvision_shim.install()  # before anything imports torchvision (transformers does)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # sglang's config resolution never downloads
        try:
            plan = importlib.import_module("sglang.multimodal_gen.runtime.loader.weight_load_plan")
            fsdp = importlib.import_module("sglang.multimodal_gen.runtime.loader.fsdp_load")
            utils = importlib.import_module("sglang.multimodal_gen.runtime.loader.utils")
            weights = importlib.import_module("sglang.multimodal_gen.runtime.loader.weight_utils")
            tload = importlib.import_module(
                "sglang.multimodal_gen.runtime.loader.transformer_load_utils"
            )
            transformer = importlib.import_module(
                "sglang.multimodal_gen.runtime.loader.component_loaders.transformer_loader"
            )
            vae = importlib.import_module(
                "sglang.multimodal_gen.runtime.loader.component_loaders.vae_loader"
            )
            component = importlib.import_module(
                "sglang.multimodal_gen.runtime.loader.component_loaders.component_loader"
            )
            quant = importlib.import_module("sglang.multimodal_gen.runtime.layers.quantization")
            quant_utils = importlib.import_module(
                "sglang.multimodal_gen.runtime.utils.quantization_utils"
            )
            args = importlib.import_module("sglang.multimodal_gen.runtime.server_args.server_args")
            pipeline = importlib.import_module(
                "sglang.multimodal_gen.runtime.pipelines_core.composed_pipeline_base"
            )
            registry = importlib.import_module("sglang.multimodal_gen.runtime.models.registry")
            parallel = importlib.import_module(
                "sglang.multimodal_gen.runtime.distributed.parallel_state"
            )
        except ImportError as error:
            raise ImportError(f"{INSTALL_HINT} ({error})") from error
        self.WeightLoadPlan: Any = plan.WeightLoadPlan
        self.fsdp_load: Any = fsdp
        self.load_full_state: Any = fsdp.load_model_from_full_model_state_dict
        self.maybe_load_fsdp_model: Any = fsdp.maybe_load_fsdp_model
        self.get_param_names_mapping: Any = utils.get_param_names_mapping
        self.finalize_loaded_model: Any = utils.finalize_loaded_model
        self.list_safetensors_files: Any = utils._list_safetensors_files
        self.checkpoint_weights_iterator: Any = weights.checkpoint_weights_iterator
        self.safetensors_weights_iterator: Any = weights.safetensors_weights_iterator
        self.needs_device_weight_postprocess: Any = tload._needs_device_weight_postprocess
        self.resolve_target_param_dtype: Any = tload._resolve_target_param_dtype
        self.disable_incompatible_offload: Any = (
            tload._ModelOptFp8OffloadAdapter._maybe_disable_incompatible_dit_offload_modes
        )
        self.resolve_checkpoint_load_device: Any = transformer._resolve_checkpoint_load_device
        self.VAELoader: Any = vae.VAELoader
        self.vae_state_slots: Any = vae._direct_gpu_vae_state_slots
        self.unsupported_error: Any = component.ComponentCheckpointUnsupportedError
        self.get_quantization_config: Any = quant.get_quantization_config
        self.quant_utils: Any = quant_utils
        self.server_args_module: Any = args
        self.ServerArgs: Any = args.ServerArgs
        self.validate_selection: Any = (
            pipeline.ComposedPipelineBase._validate_direct_gpu_component_selection
        )
        self.model_registry: Any = registry.ModelRegistry
        self.parallel_state: Any = parallel
        self.FlexibleArgumentParser: Any = args.FlexibleArgumentParser


# --- plans ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SglangPlan:
    """sglang's `WeightLoadPlan` seen through the suite's field names (PLAN-1): sglang calls the
    deferral `defer_cpu_placement`. The value itself is sglang's (`sglang_plan`)."""

    sglang_plan: Any

    @property
    def checkpoint_load_device(self) -> torch.device:
        device: torch.device = self.sglang_plan.checkpoint_load_device
        return device

    @property
    def weight_postprocess_device(self) -> torch.device | None:
        device: torch.device | None = self.sglang_plan.weight_postprocess_device
        return device

    @property
    def defer_cpu_offload(self) -> bool:
        return bool(self.sglang_plan.defer_cpu_placement)

    @property
    def load_full_state_dict_on_device(self) -> bool:
        return bool(self.sglang_plan.load_full_state_dict_on_device)


def _report(component: str, plan: SglangPlan, records: Iterable[TensorRecord] = ()) -> LoadReport:
    # LoadReport names the reference's plan type; the report carries sglang's own plan, read
    # through the suite's field names (PlanLike).
    return LoadReport(component=component, plan=cast(Any, plan), records=tuple(records))


# --- bridges --------------------------------------------------------------------------------------

_PATCH_LOCK = threading.RLock()


@contextlib.contextmanager
def _patched(module: Any, values: Mapping[str, object]) -> Iterator[None]:
    """`module`'s globals rebound to `values` for the duration, then restored."""
    with _PATCH_LOCK:
        saved = {name: getattr(module, name) for name in values}
        try:
            for name, value in values.items():
                setattr(module, name, value)
            yield
        finally:
            for name, value in saved.items():
                setattr(module, name, value)


@contextlib.contextmanager
def _standard_linears(lib: Sglang, kinds: LinearKinds) -> Iterator[None]:
    """bridge: sglang's zero-copy predicate (fsdp_load.py:108) and its post-load processing
    (quantization_utils.py:60) name sglang's own linear classes; the suite names the serving
    stack's linears in `kinds`. For the load, those names denote the suite's classes (the
    merged/QKV variants denote the kind they derive from), so sglang's own code decides."""
    fsdp = {name: getattr(kinds, kind) for name, kind in _FSDP_LINEAR_NAMES.items()}
    fsdp["UnquantizedLinearMethod"] = kinds.unquantized_method
    quant = {
        "LinearBase": kinds.layers,
        "UnquantizedLinearMethod": kinds.unquantized_method,
    }
    with _patched(lib.fsdp_load, fsdp), _patched(lib.quant_utils, quant):
        yield


class _PlatformView:
    """bridge: sglang asks its global `current_platform` whether it runs on CUDA; the suite
    passes the platform in. This view answers `is_cuda` / `is_cpu` as `cuda` says and delegates
    everything else to sglang's platform."""

    def __init__(self, real: Any, *, cuda: bool, cpu: bool) -> None:
        self._real = real
        self._cuda = cuda
        self._cpu = cpu

    def is_cuda(self) -> bool:
        return self._cuda

    def is_cpu(self) -> bool:
        return self._cpu

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


@contextlib.contextmanager
def _platform(lib: Sglang, *, cuda: bool, cpu: bool | None = None) -> Iterator[None]:
    module = lib.server_args_module
    real = module.current_platform
    view = _PlatformView(real, cuda=cuda, cpu=bool(real.is_cpu()) if cpu is None else cpu)
    with _patched(module, {"current_platform": view}):
        yield


def _free_port() -> int:
    """A port nothing listens on now: every process (a worker, an isolated attempt) gets its own."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _tensor_parallel_group(lib: Sglang) -> None:
    """bridge: sglang's ordinary DiT path asks the tensor-parallel world size
    (rank_local_checkpoint.py:395); one process is a world of one, on a gloo group."""
    state = lib.parallel_state
    if state.model_parallel_is_initialized():
        return
    state.maybe_init_distributed_environment_and_model_parallel(
        1, 1, distributed_init_method=f"tcp://127.0.0.1:{_free_port()}"
    )


def _native_model(build: Callable[[], nn.Module]) -> Callable[..., nn.Module]:
    """bridge: sglang builds a model from a class and its init params, and expects sglang's
    model hooks on it: `param_names_mapping` (checkpoint renames; none here) and
    `post_load_weights` (nothing to do here), `_fsdp_forward_methods` under FSDP (the model is
    driven through `__call__`). A module from `build()` that lacks one gets the neutral one."""

    def construct(**_init_params: object) -> nn.Module:
        module = build()
        hooks: dict[str, object] = {
            "param_names_mapping": {},
            "post_load_weights": lambda: None,
            "_fsdp_forward_methods": [],
        }
        for name, neutral in hooks.items():
            if not hasattr(module, name):
                setattr(module, name, neutral)
        return module

    return construct


def _renamed(error: Exception, old: str, new: str) -> Exception:
    """`error` with the path `old` written as `new` in its message: the same type, or `error`
    itself when its type cannot be rebuilt from one message."""
    message = str(error)
    if old not in message:
        return error
    try:
        renamed = type(error)(message.replace(old, new))
    except Exception:
        return error
    return renamed if str(renamed) == message.replace(old, new) else error


def _unsupported(error: BaseException) -> ComponentCheckpointUnsupportedError:
    """sglang's no-fallback error as the type the Protocol names (message unchanged)."""
    converted = ComponentCheckpointUnsupportedError(str(error))
    converted.__cause__ = error
    return converted


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` is `b`'s memory: same device, layout and address (for a sparse tensor: its
    values' address)."""
    if a.device != b.device or a.layout != b.layout:
        return False
    if a.layout == torch.strided:
        return a.data_ptr() == b.data_ptr()
    if a.layout == torch.sparse_csr:
        return a.values().data_ptr() == b.values().data_ptr()
    return False


# --- checkpoints ----------------------------------------------------------------------------------


_UPSTREAM_PRECISION = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# sglang's precision flags that are fields of its PipelineConfig (configs/pipeline_configs/base.py:
# 880-895, `--dit-precision` and `--vae-precision`); `component_precisions` is ServerArgs' own.
_PIPELINE_PRECISIONS = ("dit_precision", "vae_precision")


def _precision_fields(precisions: Precisions | None) -> dict[str, Any]:
    """The suite's precisions as sglang's own ServerArgs fields (none: its defaults)."""
    if precisions is None:
        return {}
    return {
        "dit_precision": _upstream_precision(precisions.dit),
        "vae_precision": _upstream_precision(precisions.vae),
        "component_precisions": {
            name: _upstream_precision(dtype) for name, dtype in precisions.components.items()
        },
    }


def _upstream_precision(dtype: torch.dtype) -> str:
    """sglang's name for `dtype` (PRECISION_TO_TYPE's keys)."""
    name = _UPSTREAM_PRECISION.get(dtype)
    if name is None:
        raise Unsupported(f"sglang's precisions are fp32, fp16 and bf16, not {dtype}")
    return name


def _index_in(folder: Path) -> Path | None:
    indexes = sorted(folder.glob(f"*{INDEX_SUFFIX}"))
    return indexes[0] if indexes else None


def _checkpoint_error(path: str | os.PathLike[str], error: BaseException) -> CheckpointError:
    message = " ".join(str(error).split()) or type(error).__name__
    return CheckpointError(os.fspath(path), None, f"{type(error).__name__}: {message}")


class SglangLoader:
    """sglang 0.5.23's diffusion loader as a conformance-suite adapter."""

    name = "sglang"
    # sglang's ServerArgs has no runtime-device field: the DiT runs on CUDA whenever the
    # platform is CUDA (the seam's LoaderAdapter documents what this exempts).
    runtime_device_setting = False
    capabilities: frozenset[str] = frozenset(
        {
            PLANS,
            ZERO_COPY,
            DIRECT_DIT,
            FP8_DEFER,
            CLI_ARGS,
            ADMISSION,
            VAE_STREAM,
            CHECKPOINT_SAFETY,
        }
    )

    def __init__(self) -> None:
        self.lib = Sglang()

    # --- plans (PLAN, DEV, FP8-1) -----------------------------------------------------------------
    def plan_for_component(
        self,
        *,
        checkpoint_load_device: torch.device,
        needs_device_weight_postprocess: bool,
        component_cpu_offload: bool,
        load_full_state_dict_on_device: bool = False,
    ) -> SglangPlan:
        return SglangPlan(
            self.lib.WeightLoadPlan.for_component(
                checkpoint_load_device=checkpoint_load_device,
                needs_device_weight_postprocess=needs_device_weight_postprocess,
                component_starts_on_cpu=component_cpu_offload,
                load_full_state_dict_on_device=load_full_state_dict_on_device,
            )
        )

    def default_plan(self, runtime_device: torch.device) -> SglangPlan:
        """The plan `maybe_load_fsdp_model` uses when none is given (fsdp_load.py:338)."""
        return SglangPlan(self.lib.WeightLoadPlan(checkpoint_load_device=runtime_device))

    def make_plan(
        self,
        *,
        checkpoint_load_device: torch.device,
        weight_postprocess_device: torch.device | None,
        defer_cpu_offload: bool,
        load_full_state_dict_on_device: bool,
    ) -> SglangPlan:
        return SglangPlan(
            self.lib.WeightLoadPlan(
                checkpoint_load_device=checkpoint_load_device,
                weight_postprocess_device=weight_postprocess_device,
                defer_cpu_placement=defer_cpu_offload,
                load_full_state_dict_on_device=load_full_state_dict_on_device,
            )
        )

    def resolve_checkpoint_load_device(
        self,
        runtime_device: torch.device,
        *,
        component_cpu_offload: bool,
        quantization: QuantizationSpec | None,
    ) -> torch.device:
        # bridge: sglang reads only whether a runtime quant config exists, and derives
        # `quantized_cpu_load_supported` from the checkpoint's format (a GGUF file, ConvRot
        # int8, serialized kitchen W4A8: transformer_loader.py:500-504); the spec states both.
        device: torch.device = self.lib.resolve_checkpoint_load_device(
            runtime_device,
            component_starts_on_cpu=component_cpu_offload,
            runtime_quant_config=quantization,
            quantized_cpu_load_supported=quantization is not None and quantization.loads_on_cpu,
        )
        return device

    def requires_device_weight_processing(self, quantization: QuantizationSpec | None) -> bool:
        return bool(self.lib.needs_device_weight_postprocess(self._quant_config(quantization)))

    def _quant_config(self, quantization: QuantizationSpec | None) -> Any:
        """The config sglang builds for `quantization`: for an online request, its flag path's
        no-argument config (transformer_load_utils.py:1062-1068); for a serialized checkpoint,
        `from_config` on the `quantization_config` such a checkpoint declares. An unregistered
        method raises sglang's ValueError."""
        if quantization is None:
            return None
        config_cls = self.lib.get_quantization_config(quantization.method)
        if not quantization.serialized:
            return config_cls()
        declared: dict[str, object] = {"quant_method": quantization.method}
        # the fields a serialized checkpoint of these methods declares beside quant_method
        declared.update(
            {"fp8": {"activation_scheme": "dynamic"}, "modelopt_fp8": {"quant_algo": "FP8"}}.get(
                quantization.method, {}
            )
        )
        return config_cls.from_config(declared)

    @staticmethod
    def _plan(plan: PlanLike) -> SglangPlan:
        """sglang's plan for the suite's plan value (sglang validates nothing: PLAN-3 is a gap)."""
        if isinstance(plan, SglangPlan):
            return plan
        lib_plan = _sglang_plan_type()
        return SglangPlan(
            lib_plan(
                checkpoint_load_device=plan.checkpoint_load_device,
                weight_postprocess_device=plan.weight_postprocess_device,
                defer_cpu_placement=plan.defer_cpu_offload,
                load_full_state_dict_on_device=plan.load_full_state_dict_on_device,
            )
        )

    # --- DiT: zero-copy, direct, FP8 defer -------------------------------------------------------
    def zero_copy_verdict(
        self,
        param: torch.Tensor,
        checkpoint_tensor: torch.Tensor,
        target: torch.Tensor,
        *,
        kinds: LinearKinds,
        direct_device: torch.device | None = None,
    ) -> Verdict:
        """Read off a real one-tensor sglang full-state load: `param` (with its attributes and
        its bound `weight_loader`) is the one slot of a fresh holder module, `checkpoint_tensor`
        is handed for it, and the answer is whether the loaded slot is that tensor's memory.
        The caller's module is not touched. sglang compares against the slot itself, so
        `target` must describe `param`; the load device is `direct_device` in direct mode, else
        where the tensor is (sglang's ordinary path moves it there).

        Raises:
            Unsupported: `target` differs from `param` in shape, dtype or strides.
        """
        if target is not param and (
            target.shape != param.shape
            or target.dtype != param.dtype
            or target.layout != param.layout
            or (param.layout == torch.strided and target.stride() != param.stride())
        ):
            raise Unsupported("sglang judges a tensor against its slot itself")
        holder = nn.Module()
        slot = param if isinstance(param, nn.Parameter) else nn.Parameter(param)
        holder._parameters["weight"] = slot
        device = direct_device if direct_device is not None else checkpoint_tensor.device
        try:
            with _standard_linears(self.lib, kinds):
                self.lib.load_full_state(
                    holder,
                    iter([("weight", checkpoint_tensor)]),
                    device,
                    None,
                    strict=True,
                    param_names_mapping=self.lib.get_param_names_mapping({}),
                    allow_device_tensor_assignment=direct_device is not None,
                )
        except Exception as error:  # sglang could not take it: not adopted
            return Verdict(False, f"sglang's load raised {type(error).__name__}: {error}")
        loaded = holder._parameters["weight"]
        if loaded is not None and _same_memory(loaded, checkpoint_tensor):
            return Verdict(True)
        return Verdict(False, "sglang's load gave the slot fresh memory")

    def load_full_state(self, request: StateRequest) -> LoadReport:
        """`load_model_from_full_model_state_dict(strict=True)` on the plan's load device, with
        adoption of device tensors in direct mode, then `finalize_loaded_model`, as
        `maybe_load_fsdp_model` runs them (fsdp_load.py:471-483, 501).

        Every sglang caller of the full-state load finalises what it loaded: the DiT path in
        `maybe_load_fsdp_model` (fsdp_load.py:501), every component again in
        `ComponentLoader.load` (component_loader.py:506), and Hunyuan3D's own loader inline
        (pipelines/hunyuan3d_pipeline.py:277-283). Finalisation refuses a slot left on meta,
        turns `requires_grad` off and sets eval mode."""
        real = self._plan(request.plan)
        handed = list(request.tensors)
        module = request.module
        with _standard_linears(self.lib, request.kinds):
            self.lib.load_full_state(
                module,
                iter(handed),
                real.checkpoint_load_device,
                # `maybe_load_fsdp_model` passes its param_dtype; the full-state load takes each
                # slot's dtype from the module (fsdp_load.py:686) and reads no other.
                None,
                strict=True,
                param_names_mapping=self.lib.get_param_names_mapping({}),
                allow_device_tensor_assignment=real.load_full_state_dict_on_device,
            )
        self.lib.finalize_loaded_model(module)
        return _report(request.component, real, self._records(module, handed))

    def load_dit(self, request: DitRequest) -> tuple[nn.Module, LoadReport]:
        """`maybe_load_fsdp_model` with the plan, as sglang's transformer loader calls it.

        `quantization` reaches sglang as the quant config it would build (and the model built
        by `build()` carries its layers' quant methods, as sglang's models take theirs from the
        config). sglang's transformer loader refuses a quantized direct load before calling
        this function (transformer_loader.py:507-513); that refusal runs in `admit` here only
        through the arguments gate, as sglang keeps it inside `load_customized`.
        """
        lib = self.lib
        quant_config = self._quant_config(request.quantization)
        if request.dtype is None:
            # bridge: no precision asked for keeps the dtypes the suite's build declares, so
            # sglang builds under torch's default dtype.
            param_dtype: torch.dtype | None = torch.get_default_dtype()
        else:
            # sglang's transformer loader: `--dit-precision` on its server args, resolved by
            # `_resolve_target_param_dtype` (transformer_load_utils.py:1118-1126; None when the
            # DiT is quantized), becomes `maybe_load_fsdp_model`'s param_dtype
            # (transformer_loader.py:557, component_loader.py:770), under which the model is
            # built (fsdp_load.py:303, 326).
            precision = _upstream_precision(request.dtype)
            args = self._server_args(dit_precision=precision)
            param_dtype = lib.resolve_target_param_dtype(
                quant_config=quant_config, nunchaku_config=None, server_args=args
            )
        real = self._plan(request.plan)
        files = self._weight_files(request.checkpoint)
        if request.fsdp or not real.load_full_state_dict_on_device:
            _tensor_parallel_group(lib)
        # bridge: the suite's plan carries no residency; sglang learns it from
        # `component_starts_on_cpu`: a component whose offload is deferred, or that loads on the
        # host, starts on CPU.
        starts_on_cpu = real.defer_cpu_offload or real.checkpoint_load_device.type == "cpu"
        runtime = real.weight_postprocess_device or real.checkpoint_load_device
        with _standard_linears(lib, request.kinds):
            module: nn.Module = lib.maybe_load_fsdp_model(
                model_cls=_native_model(request.build),
                init_params={"quant_config": quant_config},
                weight_dir_list=files,
                device=runtime,
                hsdp_replicate_dim=1,
                hsdp_shard_dim=1,
                param_dtype=param_dtype,
                reduce_dtype=torch.float32,
                component_starts_on_cpu=starts_on_cpu,
                fsdp_inference=request.fsdp,
                strict=True,
                weight_load_plan=real.sglang_plan,
            )
        return module, _report(request.component, real, self._file_records(module, files))

    def offload_for_quantization(
        self, options: OffloadOptions, quantization: QuantizationSpec | None
    ) -> OffloadOptions:
        """sglang's ModelOpt FP8 offload rule on a ServerArgs holding `options` (no component
        name: the legacy DiT offload, the form observable on this platform)."""
        args = self._server_args()
        # bridge: on a CPU platform sglang's construction ignores offload flags; set after it
        args.dit_cpu_offload = options.component_cpu_offload
        args.dit_layerwise_offload = options.layerwise_offload
        self.lib.disable_incompatible_offload(args, self._quant_config(quantization), None)
        return OffloadOptions(
            component_cpu_offload=bool(args.dit_cpu_offload),
            layerwise_offload=bool(args.dit_layerwise_offload),
        )

    @staticmethod
    def _records(module: nn.Module, handed: list[tuple[str, torch.Tensor]]) -> list[TensorRecord]:
        """One record per handed tensor: adopted when its slot is that tensor's memory."""
        held = module.state_dict(keep_vars=True)
        records = []
        for name, tensor in handed:
            slot = held.get(name)
            if slot is None:
                continue
            adopted = _same_memory(slot, tensor)
            records.append(TensorRecord(name, "adopted" if adopted else "copied", slot.nbytes))
        return records

    @staticmethod
    def _file_records(module: nn.Module, files: list[str]) -> list[TensorRecord]:
        """One record per slot: adopted when its data lies in a mapping of a checkpoint file."""
        wanted = {os.path.realpath(f) for f in files}
        ranges = []
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/maps").read_text().splitlines():
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and os.path.realpath(fields[5]) in wanted:
                    start, end = fields[0].split("-")
                    ranges.append((int(start, 16), int(end, 16)))
        records = []
        for name, tensor in module.state_dict(keep_vars=True).items():
            if tensor.is_meta or tensor.layout != torch.strided:
                continue
            inside = tensor.device.type == "cpu" and any(
                lo <= tensor.data_ptr() < hi for lo, hi in ranges
            )
            records.append(TensorRecord(name, "adopted" if inside else "copied", tensor.nbytes))
        return records

    def _weight_files(self, checkpoint: str | os.PathLike[str]) -> list[str]:
        """The safetensors files sglang reads for `checkpoint`: `_list_safetensors_files` on the
        folder (its index is authoritative), a file itself."""
        path = Path(checkpoint)
        if path.name.endswith(INDEX_SUFFIX):
            files: list[str] = self.lib.list_safetensors_files(
                str(path.parent), index_file=path.name
            )
            return files
        if path.is_dir():
            index = _index_in(path)
            kwargs = {} if index is None else {"index_file": index.name}
            found: list[str] = self.lib.list_safetensors_files(str(path), **kwargs)
            return found
        return [str(path)]

    # --- VAE --------------------------------------------------------------------------------------
    def vae_state_slots(self, module: nn.Module) -> frozenset[str]:
        """sglang's `_direct_gpu_vae_state_slots` (vae_loader.py:393): its ABI, slot and tie
        checks, its error converted to the Protocol's ValueError type."""
        try:
            _state, slots = self.lib.vae_state_slots(module, component_name="vae")
        except self.lib.unsupported_error as error:
            raise _unsupported(error) from error
        return frozenset(slots)

    def load_vae(self, request: VaeRequest) -> tuple[nn.Module, LoadReport]:
        """`VAELoader.load_customized` with `--component-direct-gpu-weight-loading.<component>`.

        Raises:
            Unsupported: a `device` other than sglang's local device (sglang places a
                VAE on its platform's device), a `quantization` request (sglang's VAE loader
                takes quantization from the component config only), `decode_dtype` or
                `channels_last_3d` (sglang decides both from its pipeline config and platform,
                never from the caller).
            ComponentCheckpointUnsupportedError: sglang refused (its error, converted).
        """
        lib = self.lib
        # The precision as `--component-precisions.<component>`, which sglang's VAE loader
        # resolves first (vae_loader.py:600-605, utils/precision.py:79-91) and builds and
        # streams in (vae_loader.py:667-672, 474-475); none: its `--vae-precision` default.
        precision = (
            {}
            if request.dtype is None
            else {"component_precisions": {request.component: _upstream_precision(request.dtype)}}
        )
        local = torch.device(lib.server_args_module.current_platform.device_type)
        if request.device.type != local.type:
            raise Unsupported(f"sglang places a VAE on its platform device {local}")
        if request.quantization is not None:
            raise Unsupported("sglang's VAE loader takes quantization from config.json")
        if request.decode_dtype is not None or request.channels_last_3d:
            raise Unsupported(
                "sglang picks the decode dtype and channels_last_3d from its pipeline config"
            )
        args = self._server_args(**precision)
        # bridge: sglang refuses the direct flag at construction on a non-CUDA platform
        # (server_args.py:4086); the VAE loader itself runs on any device, so the flag is set
        # after construction.
        args.component_direct_gpu_weight_loading = {request.component: True}
        with self._component_folder(request.build, request.checkpoint, request.config) as folder:
            try:
                module: nn.Module = lib.VAELoader().load_customized(
                    str(folder), args, request.component
                )
            except lib.unsupported_error as error:
                raise _unsupported(error) from error
        # sglang's `ComponentLoader.load` finalises every component after `load_customized`
        # (component_loader.py:506): eval mode, frozen parameters, nothing left on meta.
        lib.finalize_loaded_model(module)
        plan = SglangPlan(lib.WeightLoadPlan(checkpoint_load_device=request.device))
        records = [
            TensorRecord(name, "streamed", tensor.nbytes)
            for name, tensor in module.state_dict().items()
        ]
        return module, _report(request.component, plan, records)

    @contextlib.contextmanager
    def _component_folder(
        self,
        build: Callable[[], nn.Module],
        checkpoint: Path,
        config: Mapping[str, object] | None,
    ) -> Iterator[Path]:
        """bridge: sglang's VAE loader reads a component folder (config.json naming a class in
        its ModelRegistry, and the weights). The suite hands a `build` callable, a config and
        the checkpoint; the folder is laid out in a temporary directory, the checkpoint's files
        linked (never copied or written), and `build` registered under a fresh class name."""
        source = Path(checkpoint)
        files = (
            [source.parent / source.name]
            if source.is_file() and not source.name.endswith(INDEX_SUFFIX)
            else [p for p in (source.parent if source.is_file() else source).iterdir()]
        )
        class_name = f"SuiteVAE{next(_CLASS_IDS)}"

        def construct(**_init_params: object) -> nn.Module:
            return build()

        registry = self.lib.model_registry
        registry.register_model(class_name, cast(Any, construct))
        with tempfile.TemporaryDirectory(prefix="sglang-vae-") as tmp:
            folder = Path(tmp)
            declared = dict(config or {})
            declared["_class_name"] = class_name
            (folder / "config.json").write_text(json.dumps(declared, default=str))
            for file in files:
                if file.name != "config.json":
                    (folder / file.name).symlink_to(file.resolve())
            home = source.parent if source.is_file() else source
            try:
                yield folder
            except Exception as error:
                # bridge: sglang names the files it read, which are the links; the user gave
                # their own folder, so its errors name that one (type and wording unchanged).
                renamed = _renamed(error, str(folder), str(home))
                if renamed is error:
                    raise
                raise renamed from error
            finally:
                registry.registered_models.pop(class_name, None)

    # --- arguments and admission -----------------------------------------------------------------
    def _server_args(self, **fields: Any) -> Any:
        """`ServerArgs(...)` with `fields`; `dit_precision` and `vae_precision` are fields of its
        `PipelineConfig`, not of ServerArgs, and go there.

        bridge: sglang's `from_kwargs`/`from_dict` resolve a PipelineConfig from the model path
        (a pipeline folder or the hub) and then apply the precision kwargs to it with
        `PipelineConfig.update_config_from_dict` (configs/pipeline_configs/base.py:1195); this
        adapter loads components without a pipeline, so the same function applies them to the
        default PipelineConfig `ServerArgs(...)` holds."""
        pipeline = {name: fields.pop(name) for name in _PIPELINE_PRECISIONS if name in fields}
        args = self.lib.ServerArgs(model_path=MODEL_PATH, **fields)
        if pipeline:
            args.pipeline_config.update_config_from_dict(pipeline)
        return args

    def make_server_args(self, options: ServingOptions) -> ServerArgsLike:
        """`ServerArgs(...)`: sglang's construction normalises and validates (ARGS-4, DG-2).

        `precisions` map onto sglang's own `dit_precision`, `vae_precision` and
        `component_precisions` (upstream spells the dtypes fp32, fp16, bf16).

        `component_cpu_offload` becomes sglang's per-component `component_residency`
        (True: "component-offload", False: "resident").

        Raises:
            Unsupported: a serialized `quantization` (sglang reads those from the
                checkpoint, not from an argument).
        """
        residency = {
            name: COMPONENT_OFFLOAD
            if offloaded is True
            else RESIDENT
            if offloaded is False
            else offloaded
            for name, offloaded in (options.component_cpu_offload or {}).items()
        }
        if options.quantization is not None and options.quantization.serialized:
            raise Unsupported("sglang reads a serialized quantization from config.json")
        # bridge: sglang has no runtime-device setting, and checks the platform while
        # constructing; the suite checks it at admission with the platform it passes (`admit`
        # runs the same sglang validation there). Construction here answers CUDA, whatever
        # `options.runtime_device` says.
        with _platform(self.lib, cuda=True):
            args = self._server_args(
                dit_cpu_offload=options.dit_cpu_offload,
                dit_layerwise_offload=options.dit_layerwise_offload,
                use_fsdp_inference=options.fsdp_inference,
                tp_size=options.tp_size,
                component_residency=residency or None,
                quantization=None if options.quantization is None else options.quantization.method,
                direct_gpu_weight_loading=options.direct_gpu_weight_loading,
                component_direct_gpu_weight_loading=dict(
                    options.component_direct_gpu_weight_loading or {}
                ),
                **_precision_fields(options.precisions),
            )
        return cast(ServerArgsLike, args)

    def parse_server_args(self, argv: Sequence[str]) -> tuple[ServerArgsLike, list[str]]:
        """sglang's own parser (`ServerArgs.add_cli_args`, parse_known_args, as
        `prepare_server_args` does) and its component-flag extraction; the loading fields go
        to `ServerArgs(...)`. What neither consumed is returned, in order (sglang's
        `from_cli_args` would exit on it)."""
        lib = self.lib
        parser = lib.FlexibleArgumentParser()
        lib.ServerArgs.add_cli_args(parser)
        raw, unknown = parser.parse_known_args(list(argv))
        # The per-component maps in the order `from_cli_args` extracts them
        # (server_args.py:3693-3696): precisions, then direct-GPU flags.
        precisions, remaining = lib.ServerArgs._extract_component_precisions(list(unknown))
        components, remaining = lib.ServerArgs._extract_component_direct_gpu_weight_loading(
            remaining
        )
        fields = {
            name: getattr(raw, name)
            for name in (
                "dit_cpu_offload",
                "dit_layerwise_offload",
                "use_fsdp_inference",
                "tp_size",
                "quantization",
                "direct_gpu_weight_loading",
                # `--dit-precision` and `--vae-precision` (PipelineConfig.add_cli_args, with
                # their defaults bf16 and fp32)
                *_PIPELINE_PRECISIONS,
            )
            if getattr(raw, name, None) is not None
        }
        # bridge: sglang checks the platform while constructing; the suite checks it at
        # admission, with the platform it passes (`admit` runs the same sglang validation).
        # A command line names no platform, so construction here answers CUDA.
        with _platform(lib, cuda=True):
            args = self._server_args(
                **fields,
                component_precisions=precisions,
                component_direct_gpu_weight_loading=components,
            )
        return cast(ServerArgsLike, args), list(remaining)

    def admit(self, pipeline_dir: Path, args: ServerArgsLike, *, platform: Platform) -> None:
        """Layer 1: `_validate_direct_gpu_component_selection` on model_index.json; layer 2:
        `ServerArgs._validate_direct_gpu_weight_loading` on `platform`."""
        lib = self.lib
        if not isinstance(args, lib.ServerArgs):
            raise TypeError("admit takes the ServerArgs this adapter built")
        model_index = json.loads((Path(pipeline_dir) / "model_index.json").read_text())
        lib.validate_selection(model_index, args)
        cuda = platform.cuda_available()
        with _platform(lib, cuda=cuda, cpu=not cuda):
            args._validate_direct_gpu_weight_loading()

    # --- checkpoints -----------------------------------------------------------------------------
    def inspect_checkpoint(
        self, path: str | os.PathLike[str]
    ) -> Mapping[str, tuple[torch.dtype, tuple[int, ...]]]:
        """(dtype, shape) of what sglang's reader yields, by name (its mmap views: no tensor
        data is read)."""
        return {n: (t.dtype, tuple(t.shape)) for n, t in self._iterate(path, CPU, None)}

    def read_checkpoint_tensor(
        self, path: str | os.PathLike[str], name: str, *, device: torch.device
    ) -> torch.Tensor:
        found: torch.Tensor | None = None
        for _name, tensor in self._iterate(path, device, lambda key: key == name):
            found = tensor
        if found is None:
            raise CheckpointError(os.fspath(path), name, "no file of the checkpoint holds it")
        return found

    def _iterate(
        self,
        path: str | os.PathLike[str],
        device: torch.device,
        key_filter: Callable[[str], bool] | None,
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """sglang's readers: `checkpoint_weights_iterator` for a folder or index,
        `safetensors_weights_iterator` for one file, straight to `device` (its direct plan)
        when that is not the CPU; their errors as CheckpointError naming the path."""
        lib = self.lib
        source = Path(path)
        plan = (
            None
            if device.type == "cpu"
            else lib.WeightLoadPlan(
                checkpoint_load_device=device, load_full_state_dict_on_device=True
            )
        )
        try:
            if source.is_file() and not source.name.endswith(INDEX_SUFFIX):
                yield from lib.safetensors_weights_iterator(
                    [str(source)], key_filter=key_filter, weight_load_plan=plan
                )
                return
            folder = source.parent if source.is_file() else source
            index = source if source.is_file() else _index_in(folder)
            kwargs = {} if index is None else {"index_file": index.name}
            if plan is None:
                yield from lib.checkpoint_weights_iterator(
                    str(folder), key_filter=key_filter, **kwargs
                )
            else:
                files = lib.list_safetensors_files(str(folder), key_filter=key_filter, **kwargs)
                yield from lib.safetensors_weights_iterator(
                    files, key_filter=key_filter, weight_load_plan=plan
                )
        except CheckpointError:
            raise
        except Exception as error:  # sglang's reader refused or failed: named by the path
            raise _checkpoint_error(path, error) from error


_CLASS_IDS = itertools.count()


def _sglang_plan_type() -> Any:
    return importlib.import_module(
        "sglang.multimodal_gen.runtime.loader.weight_load_plan"
    ).WeightLoadPlan
