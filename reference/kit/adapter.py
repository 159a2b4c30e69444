"""The suite's one seam: a loader under test is reached only through a `LoaderAdapter`.

Contract tests never import the reference loader directly; they call the adapter the `loader`
fixture hands them. An adapter declares which capabilities it implements; tests of capabilities it
does not declare are skipped with that reason, and every MUST rule of a declared capability runs.

Values cross the seam in neutral terms (torch devices, `QuantizationSpec`, tensors, modules, file
paths), so another loader's adapter converts to and from its own types at this boundary only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from reference.adopt import LinearKinds, Verdict
from reference.args import ServerArgsLike
from reference.platform import Platform
from reference.postload import OffloadOptions
from reference.quantization import QuantizationSpec
from reference.report import LoadReport

# Capability names. A test names the one it needs with @pytest.mark.capability(NAME).
PLANS = "plans"
ZERO_COPY = "zero_copy"
DIRECT_DIT = "direct_dit"
FP8_DEFER = "fp8_defer"
TENSOR_PARALLEL = "tensor_parallel"
VAE_STREAM = "vae_stream"
CLI_ARGS = "cli_args"
ADMISSION = "admission"
PIPELINES = "pipelines"
CHECKPOINT_SAFETY = "checkpoint_safety"
ALL_CAPABILITIES = frozenset(
    {
        PLANS,
        ZERO_COPY,
        DIRECT_DIT,
        FP8_DEFER,
        TENSOR_PARALLEL,
        VAE_STREAM,
        CLI_ARGS,
        ADMISSION,
        PIPELINES,
        CHECKPOINT_SAFETY,
    }
)


@runtime_checkable
class PlanLike(Protocol):
    """What the suite reads from a loader's plan. It must be immutable (assignment raises)."""

    @property
    def checkpoint_load_device(self) -> torch.device: ...
    @property
    def weight_postprocess_device(self) -> torch.device | None: ...
    @property
    def defer_cpu_offload(self) -> bool: ...
    @property
    def load_full_state_dict_on_device(self) -> bool: ...


@runtime_checkable
class LoaderAdapter(Protocol):
    """A loader under test, as the suite sees it.

    Invariants every adapter keeps:
      * `capabilities` is a subset of ALL_CAPABILITIES and does not change during a run;
      * a method belonging to an undeclared capability is never called by the suite;
      * refusals raise (ValueError subclasses unless a rule says otherwise); nothing is returned
        half-done.
    """

    name: str
    capabilities: frozenset[str]

    # --- plans (PLAN, DEV, FP8-1) -------------------------------------------------------------
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

    # --- DiT: zero-copy, copy path, direct mode, FP8 defer, TP (ZC, DG-4/5, FP8-2..6) ---------
    def zero_copy_verdict(
        self,
        param: torch.Tensor,
        checkpoint_tensor: torch.Tensor,
        target: torch.Tensor,
        *,
        kinds: LinearKinds,
        direct_device: torch.device | None = None,
    ) -> Verdict:
        """Adopt or copy, with the first failing condition as "ZC-n: ..." (ZC-1..8; DG-5 when
        `direct_device` is given: the tensor must be there instead of on CPU)."""
        ...

    def load_full_state(
        self,
        module: nn.Module,
        tensors: Iterable[tuple[str, torch.Tensor]],
        *,
        plan: PlanLike,
        kinds: LinearKinds,
        component: str = "transformer",
    ) -> LoadReport:
        """Fill every slot of a `meta`-built module from (name, tensor) pairs, adopting eligible
        tensors (ZC-9..12, DG-5). Raises ValueError for names or shapes that do not fit; on error
        the module is left untouched."""
        ...

    def load_dit(
        self,
        build: Callable[[], nn.Module],
        checkpoint: str | os.PathLike[str],
        *,
        plan: PlanLike,
        kinds: LinearKinds,
        quantization: QuantizationSpec | None = None,
        fsdp: bool = False,
        component: str = "transformer",
    ) -> tuple[nn.Module, LoadReport]:
        """Build on meta, load the checkpoint as the plan says, post-process, maybe defer the
        offload (ZC, DG-4/5, FP8-2..6). A failed quantized load raises (FP8-5)."""
        ...

    def offload_for_quantization(
        self, options: OffloadOptions, quantization: QuantizationSpec | None
    ) -> OffloadOptions:
        """The offload options a quantization leaves in force (FP8-3)."""
        ...

    # --- VAE: slots, preflight, streaming (VAE, CKPT-2/3) --------------------------------------
    def vae_state_slots(self, module: torch.nn.Module) -> frozenset[str]:
        """Names of the module's slots: its parameters and persistent buffers (VAE-4).

        Raises ValueError when the module departs from the standard state-dict ABI on any
        submodule (VAE-2, VAE-3), its state-dict keys differ from its slots (VAE-5), or it ties
        state (VAE-6), naming the offending entries.
        """
        ...

    def load_vae(
        self,
        build: Callable[[], torch.nn.Module],
        checkpoint: Path,
        *,
        device: torch.device,
        component: str = "vae",
        config: Mapping[str, object] | None = None,
        quantization: QuantizationSpec | None = None,
        decode_dtype: torch.dtype | None = None,
        channels_last_3d: bool = False,
    ) -> tuple[torch.nn.Module, LoadReport]:
        """Direct VAE load (VAE-1..13, CKPT-2/3): `build()` puts parameters and persistent
        buffers on `meta` while non-persistent buffers are computed for real (VAE-9); the
        checkpoint's headers are checked against the slots before any tensor data is read;
        tensors stream one at a time into their slots on `device`, converted to each slot's
        dtype. Refusals raise ValueError subclasses; quantized or custom-code VAEs raise
        `ComponentCheckpointUnsupportedError` before `build` is called. The report holds one
        "streamed" record per tensor.
        """
        ...

    # --- arguments and admission (ARGS, DG-1..3/6/7, ADM) --------------------------------------
    def parse_server_args(self, argv: Sequence[str]) -> tuple[ServerArgsLike, list[str]]:
        """Loading options from a command line, and the other arguments untouched, in order.

        Raises ValueError naming the flag for a malformed option (DG-1, ARGS-1/2).
        """
        ...

    def make_server_args(
        self,
        *,
        runtime_device: torch.device,
        dit_cpu_offload: bool = False,
        dit_layerwise_offload: bool = False,
        component_cpu_offload: Mapping[str, Any] | None = None,
        fsdp_inference: bool = False,
        tp_size: int = 1,
        quantization: QuantizationSpec | None = None,
        direct_gpu_weight_loading: bool = False,
        component_direct_gpu_weight_loading: Mapping[str, Any] | None = None,
    ) -> ServerArgsLike:
        """Loading options built in code; validated like the command line (ARGS-4)."""
        ...

    def admit(self, pipeline_dir: Path, args: ServerArgsLike, *, platform: Platform) -> None:
        """The pipeline and arguments gates for `args` on a pipeline (ADM-1/2, DG-2/3/7).

        Raises ComponentCheckpointUnsupportedError or ArgumentError (both ValueErrors).
        """
        ...

    def loader_supports_direct(self, loader_kind: str, component: str) -> bool:
        """Declared support of a loader kind (`transformer`, `vae`, `vocoder`) for `component`."""
        ...

    def load_pipeline_component(
        self, pipeline_dir: Path, component: str, args: ServerArgsLike, *, platform: Platform
    ) -> torch.nn.Module:
        """Load one component of a pipeline with its loader (whose gate runs first, ADM-3)."""
        ...

    def check_device_memory(
        self, checkpoint: Path, *, component: str, device: torch.device, platform: Platform
    ) -> int:
        """DG-6: bytes a direct load of `checkpoint` needs on `device` (headers + margin).

        Raises DeviceMemoryError when the platform reports less free memory; reads no tensor data.
        """
        ...

    # --- checkpoints and bad input (CKPT-1, CKPT-2, CKPT-4, ZC-13) -----------------------------
    def inspect_checkpoint(
        self, path: str | os.PathLike[str]
    ) -> Mapping[str, tuple[torch.dtype, tuple[int, ...]]]:
        """Validate a checkpoint's headers and shard index; list its tensors. Reads no tensor
        data and never unpickles anything (CKPT-1, CKPT-2, CKPT-4).

        Args:
            path: a `.safetensors` file, a `*.safetensors.index.json`, or a folder holding either.

        Returns:
            (dtype, shape) of every tensor, by name.

        Raises:
            CheckpointError: for a pickle, missing, truncated or malformed file, or an index that
                disagrees with its shards. `file` is the file at fault; `entry` the tensor name or
                header field at fault (None when the whole file is); the message names both and
                says what is wrong. An adapter converts its loader's errors to this type.
        """
        ...

    def read_checkpoint_tensor(
        self, path: str | os.PathLike[str], name: str, *, device: torch.device
    ) -> torch.Tensor:
        """One tensor of the checkpoint at `path`, on `device`, with its header's dtype and shape.

        Writing to the returned tensor never changes the file (ZC-13).

        Raises:
            CheckpointError: as `inspect_checkpoint` does, and for a name the checkpoint does not
                hold (`entry` is that name).
        """
        ...
