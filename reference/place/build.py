"""Building a component's module on the host, within host memory: its class from its
config.json (`build_module`), and any build with its parameters and persistent buffers on
`meta` (`build_on_meta`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from reference.errors import CheckpointError, StateDictABIError
from reference.place.host_memory import allocation_guard
from reference.place.meta import MetaBuild
from reference.request.model_index import CONFIG, ComponentSpec

__all__ = ["build_module", "build_on_meta"]


def build_module(cls: type[nn.Module], spec: ComponentSpec, **extra: object) -> nn.Module:
    """`cls(**config, **extra)`: the component's class constructed from its config.json (and
    `extra`, such as the quantization in force).

    Raises:
        CheckpointError: when the config does not fit the class.
        HostMemoryError: when constructing it would take more host memory than is available.
    """
    try:
        with allocation_guard(spec.name, config=spec.init_kwargs):
            return cls(**spec.init_kwargs, **extra)
    except TypeError as exc:
        raise CheckpointError(
            str(spec.folder / CONFIG), None, f"does not fit {cls.__name__}: {exc}"
        ) from None


def build_on_meta(
    build: Callable[[], nn.Module],
    *,
    component: str,
    mark: Callable[[nn.Module, torch.Tensor], None] | None = None,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """VAE-1, VAE-9: run `build()` with every parameter and persistent buffer on `meta`.

    No parameter or persistent buffer storage is kept (each is sent to meta as it is
    registered); non-persistent buffers are computed as an ordinary construction computes them,
    so they hold their real values. Safe to call from several threads at once: each build is
    seen only by its own thread, and torch itself is not changed. Every CPU allocation of the
    construction is checked against the host's available memory first, or against the budget
    of a guard around the call (`reference.place.host_memory.allocation_guard`); the standard
    layers' parameters are made on meta at once, checked all the same (`MetaBuild`).

    `mark`, if given, is called with the module and the meta tensor of each slot it registers
    (transformers' flag that a weight and its layer need no initialisation: its own
    initialisation of meta tensors would cost the build a third of its time, for nothing).
    `dtype`, if given, is the precision the caller gives the slots next
    (`reference.place.cast.cast_slots`): the standard layers' floating parameters are made in
    it on meta, so that the cast has little left to convert.

    Raises:
        StateDictABIError: `build` did not return an `nn.Module`.
        HostMemoryError: the construction would take more host memory than is available.
    """
    with MetaBuild.building(mark, dtype=dtype), allocation_guard(component):
        module = build()
        if not isinstance(module, nn.Module):
            raise StateDictABIError(
                f"{component}: build() returned {type(module).__name__}, not an nn.Module;"
                " pass the model class or a function that constructs it"
            )
        MetaBuild.settle(module)
    return module
