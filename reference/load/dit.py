"""Loading one DiT component: plan -> checkpoint -> adopt or copy -> post-load -> report.

The model is built by a zero-argument factory with its parameters and persistent buffers on
`meta` (construction keeps none of them) and its non-persistent buffers computed for real, as the
VAE is built (`build_dit`); each slot then gets its tensor from the
checkpoint, one tensor at a time. Nothing is returned until the whole load succeeded, and the
checkpoint files are only ever mapped privately (never written).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from reference.errors import StateMismatchError, listed, shown
from reference.place.adopt import (
    REFERENCE_ADOPT_STEPS,
    AdoptSteps,
    LinearKinds,
    keeps_read_tensor,
    load_full_state,
    zero_copy_verdict,
)
from reference.place.build import build_on_meta
from reference.place.cast import cast_slots
from reference.place.host_memory import (
    COPY_FIX,
    available_host_bytes,
    construction_guard,
    refuse_beyond_host,
)
from reference.place.modules import (
    Slots,
    find_slots,
    in_eval_mode,
    rebuild_non_persistent_buffers,
    refuse_unrebuildable_buffers,
)
from reference.place.postload import offload_to_cpu, process_weights
from reference.place.records import TensorRecord
from reference.read.checkpoint import (
    Checkpoint,
    TensorInfo,
    TensorReader,
    open_checkpoint,
    skipped_notes,
)
from reference.read.engine import CopyEngine, engine_for
from reference.read.pool import PooledReader
from reference.read.reading import InOrder, ReadOptions, pool_options, prefetch_workers
from reference.read.staging import StagingReader
from reference.report.steps import StepClock
from reference.report.summary import LoadReport
from reference.request.plan import WeightLoadPlan, effective_plan
from reference.request.quantization import QuantizationSpec

__all__ = [
    "DIT_DEFAULTS",
    "REFERENCE_DIT_STEPS",
    "DiTOptions",
    "DiTSteps",
    "build_dit",
    "built_dit",
    "check_names",
    "direct_reader",
    "dit_reader",
    "finish",
    "host_room",
    "load_dit",
    "place_tensors",
]


def check_names(
    module: nn.Module,
    names: set[str],
    *,
    component: str,
    slots: Slots,
    files: Sequence[Path] = (),
) -> None:
    """CKPT-3: the checkpoint's names are exactly the `slots` of `module` (`find_slots`;
    aliases count), checked from the headers before any tensor is read.

    Raises:
        StateMismatchError: listing the unknown and the missing names.
    """
    by_name, aliases = slots.by_name, slots.aliases
    where = f" ({listed(sorted({f.name for f in files}))})" if files else ""
    unknown = sorted(names - by_name.keys() - aliases.keys())
    missing = sorted(by_name.keys() - names)
    if unknown or missing:
        raise StateMismatchError(
            f"{component}: checkpoint{where} and model disagree before any tensor was read;"
            f" unknown in the model: {listed(unknown) or 'none'};"
            f" missing from the checkpoint: {listed(missing) or 'none'}"
        )


def build_dit(
    build: Callable[[], nn.Module],
    *,
    component: str,
    dtype: torch.dtype | None = None,
    checkpoint: Checkpoint | None = None,
) -> nn.Module:
    """Construct the DiT as the VAE is constructed (reference.place.build.build_on_meta):
    parameters and persistent buffers go to `meta` as they are registered, while non-persistent
    buffers (rotary tables, index ranges) are computed for real on the default device, as an
    ordinary construction computes them; the load moves them to its device afterwards
    (`rebuild_non_persistent_buffers`). A buffer construction itself leaves on meta needs a
    `rebuild_buffers(device)` method on its submodule; without one the load is refused here,
    naming it, before any tensor data is read.

    Construction never runs under the load device: a layer allocates its parameter before it
    registers it, so a build under a CUDA device would book every parameter on the device once
    more before it went to meta (DG-5 counts device allocations).

    With `dtype`, the slots are then given the component's precision on meta
    (`reference.place.cast.cast_slots`: PREC-1, PREC-2). With `checkpoint`, the construction may
    take no more host memory than that checkpoint explains
    (`reference.place.host_memory.construction_budget`: a config.json that sizes a table far
    past the weights is refused before the table is allocated).

    Raises:
        StateDictABIError: non-persistent buffers on meta that no `rebuild_buffers` recomputes.
        HostMemoryError: the construction would take more host memory than it may.
    """
    module = _constructed(build, component=component, dtype=dtype, checkpoint=checkpoint)
    if dtype is not None:
        cast_slots(module, dtype)
    return module


def built_dit(
    build: Callable[[], nn.Module],
    *,
    component: str,
    dtype: torch.dtype | None = None,
    checkpoint: Checkpoint | None = None,
) -> tuple[nn.Module, Slots]:
    """`build_dit`, and the module's slots as built (`find_slots`) for the steps of a load."""
    module = _constructed(build, component=component, dtype=dtype, checkpoint=checkpoint)
    return module, find_slots(module) if dtype is None else cast_slots(module, dtype)


def _constructed(
    build: Callable[[], nn.Module],
    *,
    component: str,
    dtype: torch.dtype | None,
    checkpoint: Checkpoint | None,
) -> nn.Module:
    total = None if checkpoint is None else checkpoint.total_bytes
    with construction_guard(component, checkpoint_bytes=total, ordinary=False):
        # Standard layers' parameters are made in `dtype` already (cast_slots then has less to do).
        module = build_on_meta(build, component=component, dtype=dtype)
    refuse_unrebuildable_buffers(module, component=component)
    return module


def dit_reader(
    checkpoint: Checkpoint,
    *,
    slots: Slots,
    reading: ReadOptions | None,
    copies_every_tensor: bool,
    device: torch.device,
    kinds: LinearKinds,
) -> TensorReader:
    """The reference's reader for one DiT load into a module whose `slots` are given (built,
    not yet loaded: `find_slots`).

    A load that copies every tensor (adoption off; or direct mode with `workers=0`, the one
    direct load that comes here instead of `direct_reader`) reads through the pool where
    `reference.read.reading.pool_options` says so (by default the copy path onto the CPU). On a
    CPU load device the pool reads the tensors whose buffers become the loaded tensors as they
    are (`reference.place.adopt.keeps_read_tensor`, or the zero-copy verdict: a standard layer's
    loader at TP=1 copies the tensor unchanged); the others (a layer's `weight_loader` fills
    them, or they are converted) are copied from the file's map, so no tensor is copied twice. A
    load that may adopt CPU tensors needs views of the file's map (`TensorReader`), populated in
    the background when `reading.prefetch`.
    """
    pool = pool_options(reading, device=device, load="dit") if copies_every_tensor else None
    if pool is None:
        return TensorReader(checkpoint, prefetch=prefetch_workers(reading))
    if device.type != "cpu":
        return PooledReader(checkpoint, pool)
    by_name = slots.by_name
    probe = TensorReader(checkpoint)  # map views to judge by: nothing is read

    def kept(info: TensorInfo) -> bool:
        slot = by_name.get(info.name)
        if slot is None:
            return False
        if keeps_read_tensor(slot, info.dtype, info.shape, device):
            return True
        # A standard layer's loader at TP=1 copies the tensor unchanged (the zero-copy verdict
        # holds): its fresh buffer can be the parameter.
        view = probe.read(info.name, device=device)
        return (
            slot.is_parameter
            and zero_copy_verdict(slot.tensor, view, slot.tensor, kinds=kinds).adopt
        )

    try:
        pooled = {info.name for info in checkpoint.tensors.values() if kept(info)}
    finally:
        probe.close()
    return PooledReader(checkpoint, pool, pooled=pooled, buffers_kept=True)


def direct_reader(
    checkpoint: Checkpoint,
    *,
    slots: Slots,
    reading: ReadOptions | None,
    device: torch.device,
    kinds: LinearKinds,
    steps: DiTSteps,
    component: str,
) -> TensorReader:
    """Direct mode's reader (DG-4, DG-8): `steps.staging` reads every tensor through a bounded
    ring of host buffers onto `device` with `steps.engine` (the device's own by default), each
    into one fresh device tensor of its file's dtype. The tensors the load keeps as they are
    read (adopted: the zero-copy verdict in direct mode, ZC-2..8, judged from the header; or,
    onto the CPU, kept by the copy path as the slot's tensor) are read ahead freely; the others
    are transient, one at a time, so device memory stays within the model plus one tensor
    (DG-5, PREC-5). `slots`: the slots of the module the load fills (`find_slots`)."""
    by_name = slots.by_name
    meta = torch.device("meta")

    def kept(info: TensorInfo) -> bool:
        slot = by_name.get(info.name)
        if slot is None:
            return False
        if keeps_read_tensor(slot, info.dtype, info.shape, device):
            return True
        shaped = torch.empty(info.shape, dtype=info.dtype, device=meta)
        verdict = steps.adopt.verdict(
            slot.tensor, shaped, slot.tensor, kinds=kinds, direct_device=meta
        )
        return slot.is_parameter and verdict.adopt

    return steps.staging(
        checkpoint,
        engine=engine_for(device) if steps.engine is None else steps.engine,
        device=device,
        options=ReadOptions() if reading is None else reading,
        kept={info.name for info in checkpoint.tensors.values() if kept(info)},
        component=component,
    )


@dataclass(frozen=True)
class DiTSteps:
    """The steps of `load_dit` a caller may replace, each with the reference's default: the
    adoption steps, the tensor reader, the name check before reading, weight processing and the
    deferred offload. A loader that differs in one step passes its own (`Platform`'s way).

    `reader` None is the reference's choice (`direct_reader` in direct mode, else `dit_reader`,
    tuned by `DiTOptions.reading`); a reader given here reads every load, whatever `reading`
    says. `staging` makes direct mode's reader (`reference.read.staging.StagingReader`'s
    signature), with `engine` as its copy engine: None is the device's own
    (`reference.read.engine.engine_for`: the CPU's for `cpu`, CUDA's for `cuda`); a test passes
    a fake engine here (the kit's `DelayedEngine`). `check_names` is called as `check_names`
    is, with the module's slots as `slots=`."""

    adopt: AdoptSteps = REFERENCE_ADOPT_STEPS
    reader: Callable[[Checkpoint], TensorReader] | None = None
    staging: Callable[..., TensorReader] = StagingReader
    engine: CopyEngine | None = None
    check_names: Callable[..., None] = check_names
    rebuild_buffers: Callable[..., tuple[str, ...]] = rebuild_non_persistent_buffers
    process: Callable[..., int] = process_weights
    offload: Callable[[nn.Module], None] = offload_to_cpu


REFERENCE_DIT_STEPS = DiTSteps()


@dataclass(frozen=True)
class DiTOptions:
    """How a DiT load runs, apart from what it loads: the benchmark's knobs and the steps.

    Attributes:
        adopt: False copies every tensor, eligible or not (the benchmark's copy path).
        reading: how the files are read (`reference.read.reading.ReadOptions`); None is the
            default: the copy path onto the CPU (adopt=False) reads through the reader pool with
            `ReadOptions()`, every other load reads views of the file's map, without prefetch.
            Given options (`workers` of 1 or more) send the copy path (adopt=False) through the
            pool, whose buffers become the copied tensors where no conversion is involved and
            the layer has no `weight_loader` or a standard one at TP=1 (see `dit_reader`).
            Direct mode reads through the staging reader (`direct_reader`) with these options,
            or `ReadOptions()` by default; `workers=0` reads every load from the map;
            `prefetch` populates a zero-copy load's maps in the background (the load does not
            wait for it).
        host_bytes: the host memory the load may take (default: what the host has available,
            `reference.place.host_memory.available_host_bytes`). A load onto the CPU that would
            copy more than this is refused before it allocates: with `adopt=False` from the
            headers, before the build; otherwise at the copy that would pass it.
        steps: the steps of the load (see `DiTSteps`); the reference's by default.
    """

    adopt: bool = True
    reading: ReadOptions | None = None
    host_bytes: int | None = None
    steps: DiTSteps = REFERENCE_DIT_STEPS


DIT_DEFAULTS = DiTOptions()


def load_dit(
    build: Callable[[], nn.Module],
    checkpoint: str | os.PathLike[str],
    *,
    plan: WeightLoadPlan,
    kinds: LinearKinds,
    quantization: QuantizationSpec | None = None,
    fsdp: bool = False,
    component: str = "transformer",
    dtype: torch.dtype | None = None,
    options: DiTOptions = DIT_DEFAULTS,
) -> tuple[nn.Module, LoadReport]:
    """Load a DiT component as `plan` says and report what happened to each tensor.

    Tensors are read from the files onto `plan.checkpoint_load_device`, one at a time (in direct
    mode too: no CPU pre-read of the checkpoint, DG-4). Eligible tensors are adopted: CPU tensors
    in ordinary mode (ZC-1..8), device tensors in direct mode (DG-5). Then `rebuild_buffers`
    hooks run and non-persistent buffers move to the load device, layers process their weights
    (on the post-process device, FP8-2/3), and a deferred component moves to CPU last (FP8-2,
    FP8-6). Under FSDP the plan's post-process override and deferral are dropped with a warning
    (FP8-4).

    Args:
        build: makes the model; called once, with parameters and persistent buffers sent to
            `meta` as they are registered (see `build_dit`).
        checkpoint: a safetensors file, shard index, or folder.
        plan: where tensors land and what happens after.
        kinds: the standard linear classes and unquantized method (for the zero-copy rule).
        quantization: the requested quantization, if any (it is never silently dropped).
        fsdp: FSDP inference is on (FSDP itself is not done here).
        component: the component's name, for messages and the report.
        dtype: the component's precision (PREC-1): its slots are given this dtype on meta,
            before any tensor is read, except modules the class keeps in fp32 and integer or
            float8 slots (PREC-2, `reference.place.cast.cast_slots`); a checkpoint tensor of
            another dtype is converted once (PREC-4). None keeps the dtypes the build gives.
        options: how the load runs (`DiTOptions`: adoption, reading, host memory, steps).

    Returns:
        The loaded module (in eval mode) and its load report.

    Raises:
        CheckpointError: the checkpoint is malformed.
        StateMismatchError: checkpoint and model disagree (names before any read; shapes).
        QuantizationLoadError: quantization was requested and could not be applied (FP8-5).
        HostMemoryError: the copies onto the CPU would not fit in `options.host_bytes`.
    """
    started = time.perf_counter()
    clock = StepClock()
    with clock.step("open"):
        plan = effective_plan(plan, fsdp=fsdp, component=component)
        opened = open_checkpoint(checkpoint)
        host_bytes = host_room(opened, plan.checkpoint_load_device, options, component=component)
    with clock.step("build"):
        module, slots = built_dit(build, component=component, dtype=dtype, checkpoint=opened)
        options.steps.check_names(
            module, set(opened.tensors), component=component, files=opened.files, slots=slots
        )
    records = place_tensors(
        module,
        opened,
        plan=plan,
        kinds=kinds,
        options=options,
        host_bytes=host_bytes,
        component=component,
        clock=clock,
        slots=slots,
    )
    with clock.step("finish"):
        events = finish(
            module,
            plan,
            quantization=quantization,
            kinds=kinds,
            options=options,
            component=component,
        )
    report = LoadReport(
        component=component,
        plan=plan,
        records=records,
        seconds=time.perf_counter() - started,
        events=events,
        notes=skipped_notes(opened.skipped),
        precision=dtype,
        steps=clock.seconds(),
    )
    # In eval mode, as diffusers' from_pretrained returns a model.
    return in_eval_mode(module), report


def host_room(
    opened: Checkpoint, device: torch.device, options: DiTOptions, *, component: str
) -> int | None:
    """The host memory a load onto the CPU may take (None for a load elsewhere). The copy path
    (adopt=False) copies every tensor, so it is refused here, from the headers, before the
    build, when the checkpoint alone would not fit.

    Raises:
        HostMemoryError: the copy path's checkpoint would not fit.
    """
    if device.type != "cpu":
        return None
    room = available_host_bytes() if options.host_bytes is None else options.host_bytes
    if not options.adopt:
        what = "copying every tensor"
        refuse_beyond_host(component, opened.total_bytes, available=room, what=what, fix=COPY_FIX)
    return room


def place_tensors(
    module: nn.Module,
    opened: Checkpoint,
    *,
    plan: WeightLoadPlan,
    kinds: LinearKinds,
    options: DiTOptions,
    host_bytes: int | None,
    component: str,
    slots: Slots,
    clock: StepClock | None = None,
) -> tuple[TensorRecord, ...]:
    """Read every tensor onto the plan's load device and give it its slot among `slots`
    (`module`'s, `find_slots`), adopted or copied (`reference.place.adopt.load_full_state`). A
    mismatch found while a tensor was in hand names that tensor's file. With `clock`, making
    the reader and waiting on it count as the `read` step, the rest as `place`.

    Raises:
        StateMismatchError: a tensor and its slot disagree.
        HostMemoryError: a copy would pass `host_bytes`.
    """
    clock = StepClock() if clock is None else clock
    began = time.perf_counter()
    device = plan.checkpoint_load_device
    direct = plan.load_full_state_dict_on_device
    steps = options.steps
    if steps.reader is not None:
        reader = steps.reader(opened)
    elif direct and (options.reading is None or options.reading.workers):
        reader = direct_reader(
            opened,
            slots=slots,
            reading=options.reading,
            device=device,
            kinds=kinds,
            steps=steps,
            component=component,
        )
    else:
        copies_every_tensor = direct or not options.adopt
        reader = dit_reader(
            opened,
            slots=slots,
            reading=options.reading,
            copies_every_tensor=copies_every_tensor,
            device=device,
            kinds=kinds,
        )
    clock.add("read", time.perf_counter() - began)
    began = time.perf_counter()
    tensors = InOrder(reader, device=device)
    try:
        return load_full_state(
            module,
            tensors,
            load_device=device,
            kinds=kinds,
            direct=direct,
            adopt=options.adopt,
            fresh=reader.fresh_names,
            steps=steps.adopt,
            host_bytes=host_bytes,
            component=component,
            map_views=True,
            slots=slots,
        )
    except StateMismatchError as exc:
        if tensors.current is None:
            raise
        file = opened.tensors[tensors.current].file
        failure = StateMismatchError(f"{exc} (tensor of {shown(file)})")
        # The weight_loader's assertion stays the cause; `exc` is not chained, since its
        # traceback holds the half-loaded module (CKPT-5: nothing of a failed load survives).
        failure.__cause__ = exc.__cause__
    finally:
        reader.close()
        clock.add("read", tensors.waited)
        clock.add("place", time.perf_counter() - began - tensors.waited)
    raise failure


def finish(
    module: nn.Module,
    plan: WeightLoadPlan,
    *,
    quantization: QuantizationSpec | None,
    kinds: LinearKinds,
    options: DiTOptions,
    component: str,
) -> tuple[str, ...]:
    """After the tensors are in: non-persistent buffers onto the load device, weight processing
    (FP8-2/3), then the deferred offload (FP8-2, FP8-6). Returns the events, in order."""
    events = ["load"]
    steps = options.steps
    steps.rebuild_buffers(module, device=plan.checkpoint_load_device, component=component)
    if steps.process(module, quantization=quantization, kinds=kinds, component=component):
        events.append("process")
    if plan.defer_cpu_offload:
        steps.offload(module)
        events.append("offload")
    return tuple(events)
