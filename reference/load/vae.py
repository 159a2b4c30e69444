"""Direct VAE loading: build on meta, prove the state-dict ABI, preflight, stream, finish.

One load, in order:
  1. refusals (VAE-12): quantization or custom code (`auto_map`) in the config, a quantization
     request, or quantization declared in the checkpoint's own metadata;
  2. headers: `open_checkpoint` validates every file and the shard index (CKPT-2, CKPT-4);
  3. build on `meta` (VAE-1, VAE-9): parameters and persistent buffers go to `meta` as they are
     registered, while non-persistent buffers are computed as an ordinary construction computes
     them (real values); a buffer construction itself leaves on meta with no
     `rebuild_buffers(device)` hook to recompute it is refused here, as is a decode dtype the
     VAE cannot hold (VAE-11);
  4. slots (VAE-2..6): the standard state-dict ABI on every submodule, no tied state;
  5. preflight (CKPT-3): names and shapes from the headers against the slots;
  6. stream (VAE-1, VAE-7, VAE-10): one tensor at a time into its slot on `device`, each file
     mapped only while its tensor is copied, so memory holds the module and one tensor;
  7. after the stream (VAE-8, VAE-9): `rebuild_buffers` hooks run, buffers moved to `device`,
     state unchanged by hooks;
  8. policy (VAE-11): channels_last_3d and decode dtype, as on the ordinary path.
CPU and CUDA targets run the same code; the device is an argument (VAE-13). The caller gets a
complete module or an exception, never a half-loaded module (CKPT-5).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from reference.errors import ComponentCheckpointUnsupportedError
from reference.place.build import build_on_meta
from reference.place.cast import cast_slots
from reference.place.host_memory import (
    available_host_bytes,
    construction_guard,
    refuse_beyond_host,
    slot_bytes,
)
from reference.place.modules import (
    Slot,
    in_eval_mode,
    rebuild_non_persistent_buffers,
    refuse_unrebuildable_buffers,
)
from reference.place.records import TensorRecord
from reference.place.slots import REFERENCE_SLOT_CHECKS, SlotChecks, state_slots
from reference.place.stream import StreamPlan, preflight, stream
from reference.place.vae_postload import (
    apply_vae_policy,
    check_state_kept,
    require_decode_dtype_support,
)
from reference.read.checkpoint import (
    Checkpoint,
    StreamingReader,
    TensorReader,
    open_checkpoint,
    skipped_notes,
)
from reference.read.engine import CopyEngine, engine_for
from reference.read.pool import PooledReader
from reference.read.reading import ReadOptions, pool_options
from reference.read.staging import StagingReader
from reference.report.summary import LoadReport
from reference.request.plan import WeightLoadPlan
from reference.request.quantization import QuantizationSpec

__all__ = [
    "QUANTIZATION_KEYS",
    "REFERENCE_VAE_STEPS",
    "VAE_DEFAULTS",
    "VAEOptions",
    "VAESteps",
    "build_vae",
    "load_vae",
    "refuse_beyond_room",
    "refuse_quantized_metadata",
    "refuse_unsupported_config",
    "staging_reader",
    "stream_tensors",
    "vae_reader",
]

# Where a VAE's quantization shows up: its component config, or its checkpoint's __metadata__.
QUANTIZATION_KEYS = ("quantization_config", "quant_method")


def refuse_unsupported_config(
    component: str, config: Mapping[str, object] | None, quantization: QuantizationSpec | None
) -> None:
    """VAE-12: refuse what direct streaming cannot honour, before any file is opened.

    Raises:
        ComponentCheckpointUnsupportedError: for a quantization request, a quantization config,
            or custom code (`auto_map`); no generic fallback loader is tried.
    """
    config = config or {}
    found = [key for key in QUANTIZATION_KEYS if key in config]
    if quantization is not None or found:
        what = f"quantization {quantization.method!r}" if quantization else f"config {found[0]}"
        raise ComponentCheckpointUnsupportedError(
            f"{component}: direct VAE loading was requested for a quantized VAE ({what});"
            " streaming fills native slots only and does not fall back to a generic loader."
            f" Drop the direct-loading flag for {component}"
        )
    if config.get("auto_map"):
        raise ComponentCheckpointUnsupportedError(
            f"{component}: the config declares custom code (auto_map: {config['auto_map']!r});"
            " direct VAE loading builds native classes only and never runs code shipped with a"
            f" checkpoint. Drop the direct-loading flag for {component}"
        )


def refuse_quantized_metadata(
    component: str, file_metadata: Mapping[Path, Mapping[str, str]]
) -> None:
    """VAE-12b: a checkpoint whose own metadata (in any of its files) declares quantization is
    refused.

    Raises:
        ComponentCheckpointUnsupportedError: naming the key and the file.
    """
    for file, metadata in file_metadata.items():
        found = [key for key in QUANTIZATION_KEYS if key in metadata]
        if found:
            raise ComponentCheckpointUnsupportedError(
                f"{component}: {file.name} declares {found[0]} in its metadata; direct VAE"
                " loading does not load quantized checkpoints and does not fall back to a"
                f" generic loader. Drop the direct-loading flag for {component}"
            )


def vae_reader(
    checkpoint: Checkpoint,
    slots: Mapping[str, Slot],
    *,
    reading: ReadOptions | None,
    device: torch.device,
) -> TensorReader:
    """The reference's reader for one VAE stream into `slots`, which copies every tensor.

    The bounded pool where `reference.read.reading.pool_options` says so (given options; not by
    default); onto the CPU it reads the tensors whose buffers become their slots' tensors as
    they are (the slot's dtype), and the others, which are converted, are copied from the
    file's map, mapped for one tensor at a time. Without the pool, a `StreamingReader`.
    """
    pool = pool_options(reading, device=device, load="vae")
    if pool is None:
        return StreamingReader(checkpoint)
    if device.type != "cpu":
        return PooledReader(checkpoint, pool, streaming=True)

    pooled = {
        name
        for name, info in checkpoint.tensors.items()
        if name in slots and slots[name].dtype == info.dtype and slots[name].shape == info.shape
    }
    return PooledReader(checkpoint, pool, pooled=pooled, streaming=True, buffers_kept=True)


def staging_reader(
    checkpoint: Checkpoint,
    slots: Mapping[str, Slot],
    *,
    reading: ReadOptions | None,
    device: torch.device,
    steps: VAESteps,
    component: str,
) -> TensorReader:
    """The reader of a VAE streamed onto a device (DG-8): `steps.staging` reads every tensor
    through a bounded ring of host buffers onto `device` with `steps.engine` (the device's own
    by default), each into one fresh tensor of its file's dtype. A tensor already in its slot's
    dtype and shape becomes the slot's tensor (read ahead freely); the others are converted,
    one at a time (PREC-5)."""
    kept = {
        name
        for name, info in checkpoint.tensors.items()
        if name in slots and slots[name].dtype == info.dtype and slots[name].shape == info.shape
    }
    return steps.staging(
        checkpoint,
        engine=engine_for(device) if steps.engine is None else steps.engine,
        device=device,
        options=ReadOptions() if reading is None else reading,
        kept=kept,
        component=component,
    )


@dataclass(frozen=True)
class VAESteps:
    """The steps of `load_vae` a caller may replace, each with the reference's default, in the
    order they run: build, buffer refusal, slot checks, preflight, reader, stream, buffer
    rebuild, state check. A loader that differs in one step passes its own. `reader` None is
    the reference's choice (`staging_reader` onto a device, else `vae_reader`, tuned by
    `VAEOptions.reading`); a reader given here reads every load, whatever `reading` says.
    `staging` makes the staging reader (`reference.read.staging.StagingReader`'s signature)
    with `engine` as its copy engine: None is the device's own (`engine_for`); an engine given
    here (a test's `DelayedEngine`) stages a stream onto the CPU too."""

    build: Callable[..., nn.Module] = build_on_meta
    refuse_buffers: Callable[..., tuple[str, ...]] = refuse_unrebuildable_buffers
    slot_checks: SlotChecks = REFERENCE_SLOT_CHECKS
    preflight: Callable[..., StreamPlan] = preflight
    reader: Callable[[Checkpoint], TensorReader] | None = None
    stream: Callable[..., tuple[tuple[TensorRecord, ...], dict[str, torch.Tensor]]] = stream
    rebuild_buffers: Callable[..., tuple[str, ...]] = rebuild_non_persistent_buffers
    check_state_kept: Callable[..., None] = check_state_kept
    staging: Callable[..., TensorReader] = StagingReader
    engine: CopyEngine | None = None


REFERENCE_VAE_STEPS = VAESteps()


@dataclass(frozen=True)
class VAEOptions:
    """How a VAE load runs, apart from what it loads: the benchmark's knobs and the steps.

    Attributes:
        reading: how the files are read (`reference.read.reading.ReadOptions`). Onto a device
            (or with an engine in the steps) the stream goes through the staging reader
            (`staging_reader`) with these options, `ReadOptions()` by default. Onto the CPU,
            None is the default: one tensor at a time from the file's map (`StreamingReader`);
            given options (`workers` of 1 or more) read through the bounded reader pool: K
            tensors or B bytes read ahead, each buffer becoming its slot's tensor where no
            conversion is needed, so memory holds the module and at most the window.
            `workers=0` reads from the map on any device.
        host_bytes: the host memory the load may take (default: what the host has available).
            A CPU load whose slots need more is refused after the preflight, before any tensor
            is read.
        steps: the steps of the load (see `VAESteps`); the reference's by default.
    """

    reading: ReadOptions | None = None
    host_bytes: int | None = None
    steps: VAESteps = REFERENCE_VAE_STEPS


VAE_DEFAULTS = VAEOptions()


VAE_FIX = (
    "stream it onto the GPU (--component-direct-gpu-weight-loading.{component}), or free host"
    " memory"
)


def load_vae(
    build: Callable[[], nn.Module],
    checkpoint_path: str | os.PathLike[str],
    *,
    device: torch.device,
    component: str = "vae",
    config: Mapping[str, object] | None = None,
    quantization: QuantizationSpec | None = None,
    decode_dtype: torch.dtype | None = None,
    channels_last_3d: bool = False,
    dtype: torch.dtype | None = None,
    options: VAEOptions = VAE_DEFAULTS,
) -> tuple[nn.Module, LoadReport]:
    """Load a VAE by streaming its checkpoint tensor by tensor into a module built on meta.

    dtype policy: a checkpoint tensor whose dtype differs from its slot's is converted to the
    slot's dtype once, on the way into the slot (the record says so).

    Args:
        build: constructs the VAE; called once, its parameters and persistent buffers sent to
            `meta` (see `reference.place.build.build_on_meta`).
        checkpoint_path: a `.safetensors` file, a shard index, or a folder holding either.
        device: the target device (cpu or cuda).
        component: the pipeline component name, used in messages and the report.
        config: the component's config (refusals only: quantization, auto_map).
        quantization: a requested quantization; direct loading refuses any.
        decode_dtype: hold the decoder in this dtype through the VAE's prepare hook.
        channels_last_3d: store Conv3d weights in channels_last_3d.
        dtype: the component's precision (PREC-1): the slots are given it on meta before the
            preflight (fp32-kept modules, integer and float8 slots aside: PREC-2); each tensor
            of another dtype is converted once, on `device`, as it streams (PREC-4, PREC-5).
            None keeps the dtypes the build gives.
        options: how the load runs (`VAEOptions`: reading, host memory, steps).

    Returns:
        The loaded module (in eval mode), and a report with one "streamed" record per tensor.

    Raises:
        ComponentCheckpointUnsupportedError: VAE-12 refusals, before anything is built.
        CheckpointError: unreadable files or a disagreeing shard index.
        StateDictABIError: a non-standard state-dict ABI, tied state, or non-persistent
            buffers on meta that no hook rebuilds (before any tensor data is read).
        StateMismatchError: unknown, missing or wrong-shape tensors, before any data is read.
        ArgumentError: a decode dtype the VAE cannot hold.
        HostMemoryError: a CPU load whose slots need more than `options.host_bytes`.
    """
    start = time.perf_counter()
    steps = options.steps
    refuse_unsupported_config(component, config, quantization)
    checkpoint = open_checkpoint(checkpoint_path)
    refuse_quantized_metadata(component, checkpoint.file_metadata)
    module = build_vae(
        build, checkpoint, component=component, config=config, dtype=dtype, steps=steps
    )
    if decode_dtype is not None:
        require_decode_dtype_support(module, decode_dtype, component=component)
    slots = state_slots(module, component=component, checks=steps.slot_checks)
    plan = steps.preflight(checkpoint, slots, component=component)
    refuse_beyond_room(slots, plan, device=device, options=options, component=component)
    records, filled = stream_tensors(
        checkpoint, slots, plan, device=device, options=options, component=component
    )
    buffers = steps.rebuild_buffers(module, device=device, component=component)
    steps.check_state_kept(module, filled, component=component)
    policy = apply_vae_policy(
        module, channels_last_3d=channels_last_3d, decode_dtype=decode_dtype, component=component
    )
    events = ("build on meta", "preflight", "stream", f"{len(buffers)} buffers rebuilt", *policy)
    load_plan = WeightLoadPlan(
        checkpoint_load_device=device, load_full_state_dict_on_device=device.type != "cpu"
    )
    notes = skipped_notes(checkpoint.skipped)
    seconds = time.perf_counter() - start
    # In eval mode, as diffusers' from_pretrained returns a model.
    return in_eval_mode(module), LoadReport(
        component, load_plan, records, seconds, events, notes, precision=dtype
    )


def build_vae(
    build: Callable[[], nn.Module],
    checkpoint: Checkpoint,
    *,
    component: str,
    config: Mapping[str, object] | None,
    dtype: torch.dtype | None,
    steps: VAESteps,
) -> nn.Module:
    """The VAE built on meta (`steps.build`), within the host memory its checkpoint explains
    (a config.json that sizes a table past the weights is refused before it allocates), its
    slots given `dtype` (PREC-1, PREC-2), and buffers nothing will rebuild refused (VAE-9).

    Raises:
        HostMemoryError, StateDictABIError: as the steps raise them.
    """
    with construction_guard(
        component, checkpoint_bytes=checkpoint.total_bytes, ordinary=False, config=config
    ):
        module = steps.build(build, component=component)
    if dtype is not None:
        cast_slots(module, dtype)
    steps.refuse_buffers(module, component=component)
    return module


def refuse_beyond_room(
    slots: Mapping[str, Slot],
    plan: StreamPlan,
    *,
    device: torch.device,
    options: VAEOptions,
    component: str,
) -> None:
    """A load onto the CPU whose slots would take more than the host memory it may is refused
    after the preflight, before any tensor is read.

    Raises:
        HostMemoryError: naming the bytes, what is available and the fix.
    """
    if device.type != "cpu":
        return
    room = available_host_bytes() if options.host_bytes is None else options.host_bytes
    needed = sum(slot_bytes(slots[name].tensor) for name in plan.names)
    what = "streaming every tensor into the CPU model"
    fix = VAE_FIX.format(component=component)
    refuse_beyond_host(component, needed, available=room, what=what, fix=fix)


def stream_tensors(
    checkpoint: Checkpoint,
    slots: Mapping[str, Slot],
    plan: StreamPlan,
    *,
    device: torch.device,
    options: VAEOptions,
    component: str = "vae",
) -> tuple[tuple[TensorRecord, ...], dict[str, torch.Tensor]]:
    """Every tensor the preflight planned, streamed into its slot on `device` through the
    steps' reader (the reference's by default: `staging_reader` onto a device or with an
    engine in the steps, else `vae_reader`); the reader is closed either way. Returns one
    record per tensor and the tensors each slot was given."""
    steps = options.steps
    reading = options.reading
    if steps.reader is not None:
        reader = steps.reader(checkpoint)
    elif (device.type != "cpu" or steps.engine is not None) and (
        reading is None or reading.workers
    ):
        reader = staging_reader(
            checkpoint, slots, reading=reading, device=device, steps=steps, component=component
        )
    else:
        reader = vae_reader(checkpoint, slots, reading=options.reading, device=device)
    try:
        return steps.stream(reader, slots, plan, device=device)
    finally:
        reader.close()
