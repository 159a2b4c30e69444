"""Loading one text or image encoder: checkpoint -> meta build -> ties -> precision -> names ->
adopt or copy -> report (TE-1, TE-2).

The DiT's and VAE's steps, in the same order: the build runs under the construction guard with
parameters and persistent buffers on `meta` (`reference.load.dit.build_dit`: no initialisation
of their values, no host allocation for them); the ties the class declares are re-established
(`reference.place.ties.tie_slots`); the slots get the component's precision, keeping fp32 what
the library's own rule keeps (`keeps_fp32`); the headers are checked against the slots (CKPT-3,
tied names counted as one slot, `reference.place.ties.tied_names`); then every tensor takes
its slot through the DiT's full-state path (`reference.load.dit.place_tensors`): adopted from
the file's private map when it is on the CPU in its slot's dtype (ZC-2b, ZC-2c, PREC-4),
converted once otherwise, read straight onto the device when the component is resident.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from reference.load.dit import (
    REFERENCE_DIT_STEPS,
    DiTOptions,
    DiTSteps,
    host_room,
    place_tensors,
)
from reference.place.build import build_on_meta
from reference.place.cast import cast_slots
from reference.place.diffusers_models import PLAIN_TORCH_KINDS
from reference.place.host_memory import construction_guard
from reference.place.modules import Slots, in_eval_mode, refuse_unrebuildable_buffers
from reference.place.ties import Twins, check_twins, renamed, tie_slots, tied_names
from reference.read.checkpoint import Checkpoint, open_checkpoint, skipped_notes
from reference.report.steps import StepClock
from reference.report.summary import LoadReport
from reference.request.plan import WeightLoadPlan

__all__ = [
    "ENCODER_DEFAULTS",
    "REFERENCE_ENCODER_STEPS",
    "BuiltEncoder",
    "EncoderModel",
    "EncoderOptions",
    "EncoderSteps",
    "build_encoder",
    "build_tied_encoder",
    "load_encoder",
]


@dataclass(frozen=True)
class EncoderModel:
    """What the library of an encoder says about it, as functions of the built module.

    Attributes:
        build: constructs the class from its config (called once, under the meta build).
        ties: the tied names the class declares: tied name -> source name.
        keeps_fp32: which state keys stay fp32 under a precision (PREC-2).
        mark: called on each slot the build sends to meta (the library's flag that it needs no
            initialisation), or None.
        renames: the checkpoint names the library loads under another name, given the built
            module, the checkpoint's names and `component=` (checkpoint name -> slot name:
            transformers' conversion mapping), or None.
    """

    build: Callable[[], nn.Module]
    ties: Callable[[nn.Module], Mapping[str, str]]
    keeps_fp32: Callable[[nn.Module, torch.dtype], Callable[[str], bool]]
    mark: Callable[[nn.Module, torch.Tensor], None] | None = None
    renames: Callable[..., Mapping[str, str]] | None = None


def build_encoder(
    build: Callable[[], nn.Module],
    *,
    component: str,
    checkpoint: Checkpoint,
    mark: Callable[[nn.Module, torch.Tensor], None] | None = None,
) -> nn.Module:
    """The DiT's meta build (`reference.load.dit.build_dit`), with `mark` on each slot sent to
    meta: under the construction guard, parameters and persistent buffers on meta,
    non-persistent buffers real; a buffer left on meta with no rebuild hook is refused here.

    Raises:
        StateDictABIError: non-persistent buffers on meta that nothing recomputes.
        HostMemoryError: the construction would take more host memory than it may.
    """
    with construction_guard(component, checkpoint_bytes=checkpoint.total_bytes, ordinary=False):
        module = build_on_meta(build, component=component, mark=mark)
    refuse_unrebuildable_buffers(module, component=component)
    return module


@dataclass(frozen=True)
class BuiltEncoder:
    """An encoder built on meta for its checkpoint (`build_tied_encoder`).

    Attributes:
        module: the module, its ties made and its slots given their precision.
        opened: the checkpoint as the module's slots name it (`reference.place.ties.tied_names`).
        twins: the tied names the checkpoint holds twice, whose values `check_twins` compares.
        slots: the module's slots (`find_slots`), found once for every step after the build.
        named: the checkpoint with the names the library renames renamed, its ties not yet
            folded (what `check_twins` reads).
    """

    module: nn.Module
    opened: Checkpoint
    twins: tuple[Twins, ...]
    slots: Slots
    named: Checkpoint


def build_tied_encoder(
    model: EncoderModel,
    written: Checkpoint,
    *,
    dtype: torch.dtype,
    component: str,
    steps: EncoderSteps,
) -> BuiltEncoder:
    """The encoder built on meta (`steps.build`), its declared ties made (TE-2), its slots given
    `dtype` (TE-3, fp32-kept modules aside), the checkpoint's names as the library loads them
    (`model.renames`), and those names checked against its slots from the headers (CKPT-3).
    Reads no tensor data.

    Raises:
        StateMismatchError: names that disagree, or a declared tie the module cannot hold.
        ComponentCheckpointUnsupportedError: a layout the library converts on load.
        HostMemoryError, StateDictABIError: from the build.
    """
    module = steps.build(model.build, component=component, checkpoint=written, mark=model.mark)
    steps.tie(module, model.ties(module), component=component)
    slots = cast_slots(module, dtype, keeps_fp32_key=model.keeps_fp32(module, dtype))
    names = model.renames(module, written.tensors, component=component) if model.renames else {}
    named = steps.rename(written, names, component=component)
    opened, twins = tied_names(named, slots)
    steps.dit.check_names(
        module, set(opened.tensors), component=component, files=opened.files, slots=slots
    )
    return BuiltEncoder(module, opened, twins, slots, named)


@dataclass(frozen=True)
class EncoderSteps:
    """The steps of `load_encoder` a caller may replace, each with the reference's default:
    the meta build (`build_encoder`'s signature), the tie step (`tie_slots`'), the checkpoint's
    names as the library renames them (`renamed`'s), and the DiT's steps for the tensors."""

    build: Callable[..., nn.Module] = build_encoder
    tie: Callable[..., None] = tie_slots
    rename: Callable[..., Checkpoint] = renamed
    dit: DiTSteps = REFERENCE_DIT_STEPS


REFERENCE_ENCODER_STEPS = EncoderSteps()


@dataclass(frozen=True)
class EncoderOptions:
    """How an encoder load runs apart from what it loads: the steps, the host memory it may
    take (as `DiTOptions.host_bytes`), and `adopt` (False copies every tensor, as
    `DiTOptions.adopt`: the benchmark's copy path)."""

    steps: EncoderSteps = REFERENCE_ENCODER_STEPS
    host_bytes: int | None = None
    adopt: bool = True


ENCODER_DEFAULTS = EncoderOptions()


def load_encoder(
    model: EncoderModel,
    checkpoint: str | os.PathLike[str],
    *,
    plan: WeightLoadPlan,
    dtype: torch.dtype,
    component: str = "text_encoder",
    options: EncoderOptions = ENCODER_DEFAULTS,
) -> tuple[nn.Module, LoadReport]:
    """Load a text or image encoder as `plan` says; report what happened to each tensor.

    Args:
        model: the class's build, declared ties and fp32 rule (`EncoderModel`).
        checkpoint: a safetensors file, shard index, or folder.
        plan: where tensors land (the CPU when the component is offloaded, else the runtime
            device); no post-processing, no deferral.
        dtype: the component's precision (TE-3): every floating slot in it, except those the
            library keeps in fp32.
        component: the component's name, for messages and the report.
        options: the steps and the host memory (`EncoderOptions`).

    Returns:
        The loaded module, in eval mode with nothing on meta (OUT-1), and its report.

    Raises:
        CheckpointError: the checkpoint is malformed.
        StateMismatchError: checkpoint and model disagree (names before any tensor is read,
            shapes), or the checkpoint holds two tied names with different values (TE-2).
        HostMemoryError: the construction or the copies would not fit in host memory.
    """
    started = time.perf_counter()
    clock = StepClock()
    steps = options.steps
    dit_options = DiTOptions(host_bytes=options.host_bytes, steps=steps.dit, adopt=options.adopt)
    with clock.step("open"):
        written = open_checkpoint(checkpoint)
        host_bytes = host_room(
            written, plan.checkpoint_load_device, dit_options, component=component
        )
    with clock.step("build"):
        built = build_tied_encoder(model, written, dtype=dtype, component=component, steps=steps)
        check_twins(built.named, built.twins, component=component)
    module = built.module
    records = place_tensors(
        module,
        built.opened,
        plan=plan,
        kinds=PLAIN_TORCH_KINDS,
        options=dit_options,
        host_bytes=host_bytes,
        component=component,
        clock=clock,
        slots=built.slots,
    )
    with clock.step("finish"):
        device = plan.checkpoint_load_device
        steps.dit.rebuild_buffers(module, device=device, component=component)
    report = LoadReport(
        component=component,
        plan=plan,
        records=records,
        seconds=time.perf_counter() - started,
        events=("load",),
        notes=skipped_notes(written.skipped),
        precision=dtype,
        steps=clock.seconds(),
    )
    return in_eval_mode(module), report
