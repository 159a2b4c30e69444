"""Host memory a construction may take, checked before each allocation it makes (a config with
absurd sizes must be refused before torch allocates, not after).

A model's constructor allocates with torch's factory functions (`torch.empty` in every
`nn.Linear`, `torch.arange` for a rotary table) and with the ops that derive a table from them
(`torch.outer`, `.cos()`). `allocation_guard` watches both through a `TorchFunctionMode`, which
is thread-local like `with torch.device(...)`: before a factory allocates on the CPU, the bytes
it asks for are added to what the construction holds; before an op on CPU tensors runs, the
bytes of what it returns are learnt from its shape arithmetic, or from one run on `meta` copies
of its inputs for an op whose arithmetic is not known (`reference.place.op_sizes`). Past the
budget, the construction is refused with `HostMemoryError` naming the component, the bytes, the
shape asked for and the config.json keys that sized it, and nothing is allocated. Tensors the
meta build sends to `meta` give their bytes back (`release`).

One mode watches a thread however many guards enclose the construction (guards nest as
budgets), and a meta build's own work goes through the same mode (`factories_on_meta`): a
factory that a standard layer's constructor calls for its parameters allocates on `meta` at
once, instead of on the host and then swapped to `meta` as the parameter is registered. Its
bytes are still checked against every budget (a layer sized past the budget is refused as
before) but never held. The mode's trips through Python cost less than the allocations and
swaps they save: a guarded meta build now takes less time than an unguarded one took without the
mode (`reference.programs.bench.construction`).

The budget is the memory the host has available (`MemAvailable`, or the cgroup's limit when that
is lower), and, where the checkpoint is known, what that checkpoint can explain
(`construction_budget`): a config.json that sizes the build far past its weights (a 20000-wide
VAE over a small checkpoint, a rotary table of 20 million positions) is refused in milliseconds
instead of swapping the host.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import CodeType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from reference.errors import HostMemoryError
from reference.place.op_sizes import (
    Kind,
    cpu_tensors,
    derived_request,
    factory_request,
    slot_bytes,
    treatment_of,
)
from reference.request.precision import slot_dtype

__all__ = [
    "COPY_FIX",
    "TABLE_FLOOR",
    "allocation_guard",
    "available_host_bytes",
    "construction_budget",
    "construction_guard",
    "default_device",
    "factories_on_meta",
    "refuse_beyond_host",
    "release",
    "sizing_keys",
    "slot_bytes",
]

COPY_FIX = (
    "load the DiT zero-copy under --dit-cpu-offload (adoptable weights stay views of the"
    " files), or onto the GPU with --direct-gpu-weight-loading, or free host memory"
)
"""What to do when a DiT load's copies do not fit in host memory."""

MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")


def available_host_bytes() -> int | None:
    """Bytes the host can give this process now: MemAvailable, lowered to what the cgroup
    (v2 `memory.max` - `memory.current`) still allows; None where neither is known."""
    found: list[int] = []
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    try:
        limit = (CGROUP / "memory.max").read_text().strip()
        if limit != "max":
            used = int((CGROUP / "memory.current").read_text())
            found.append(max(int(limit) - used, 0))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


TABLE_FLOOR = 1 << 30
"""Bytes a construction may allocate beyond what its checkpoint explains, whatever the
checkpoint: tables computed in `__init__` (rotary tables, grids) and transient work."""
WIDEST_RATIO = 4
"""An ordinary build's weights may take this many times its checkpoint's bytes: fp32 slots over
an fp8 checkpoint."""
WIDEST_MULTIPLE = 8
"""A config value sizes a dimension it equals or divides up to this many times (a channel
multiplier: `base_dim` 96 gives 384-channel convolutions)."""


def construction_budget(
    *, checkpoint_bytes: int | None, ordinary: bool, available: int | None = None
) -> int | None:
    """Bytes a construction may allocate on the host: what is `available` (default
    `available_host_bytes()`), and, where `checkpoint_bytes` is known, no more than the
    checkpoint explains: tables up to `TABLE_FLOOR` or the checkpoint's size, plus, for an
    `ordinary` build (one that allocates its weights; the meta builds do not), weights up to
    `WIDEST_RATIO` times the checkpoint. None: no limit known."""
    available = available_host_bytes() if available is None else available
    if checkpoint_bytes is None:
        return available
    explained = max(checkpoint_bytes, TABLE_FLOOR)
    if ordinary:
        explained += WIDEST_RATIO * checkpoint_bytes
    return explained if available is None else min(available, explained)


@contextmanager
def construction_guard(
    component: str,
    *,
    checkpoint_bytes: int | None,
    ordinary: bool,
    config: Mapping[str, object] | None = None,
) -> Iterator[None]:
    """`allocation_guard` over one build, whose budget is `construction_budget`."""
    budget = construction_budget(checkpoint_bytes=checkpoint_bytes, ordinary=ordinary)
    with allocation_guard(component, budget=budget, config=config):
        yield


def sizing_keys(config: Mapping[str, object], shape: tuple[int, ...]) -> list[str]:
    """The config entries (`key=value`) whose integer value sizes the largest dimension of
    `shape` (the one that makes it large, not the head dimension every small table shares)."""
    widest = max(shape, default=0)
    if widest <= 1:
        return []
    found = []
    for key, value in config.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 1:
            continue
        if widest % value == 0 and widest // value <= WIDEST_MULTIPLE:
            found.append(f"{key}={value}")
    return found


def refuse_beyond_host(
    component: str, needed: int, *, available: int | None, what: str, fix: str
) -> None:
    """Refuse a load whose host allocations (`needed` bytes, for `what`) exceed the bytes the
    host has `available` (None: unknown, no check).

    Raises:
        HostMemoryError: naming the component, the bytes needed and available, and `fix`.
    """
    if available is not None and needed > available:
        raise HostMemoryError(
            f"{component}: {what} needs {needed} bytes of host memory and the host has"
            f" {available} available (MemAvailable, or the cgroup's limit if lower); refused"
            f" before allocating. To load it: {fix}"
        )


def default_device() -> torch.device:
    """Where a factory call without a device allocates (the default device context)."""
    # torch.get_default_device arrived in torch 2.3. Before it, an allocation made inside
    # `with torch.device("cuda")` is counted as the host's (a stricter check, never a looser
    # one), and a build for the CPU enters a CPU device context it did not need.
    get = getattr(torch, "get_default_device", None)
    return get() if get is not None else torch.device("cpu")


class _Budget:
    """One guard's budget and the bytes the construction holds against it."""

    def __init__(self, component: str, budget: int, config: Mapping[str, object] | None) -> None:
        self.component = component
        self.budget = budget
        self.config = config or {}
        self.held = 0


_ACTIVE: ContextVar[tuple[_Budget, ...]] = ContextVar("allocation_guard", default=())
_META = torch.device("meta")


class _Watch(TorchFunctionMode):
    """The one torch function mode that checks every guard active in its thread: guards nest
    as budgets, not as modes, so a call pays one trip through Python however many enclose it.
    `on_meta`: the code of the constructors whose factory calls allocate on meta, and
    `meta_dtype` the precision those are made in (`factories_on_meta`)."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()
        # A call reaches this mode without a device only through the device contexts entered
        # before it (one entered later sits above it and adds the device), so it is asked once.
        self.default_cpu = default_device().type == "cpu"
        self.on_meta: frozenset[CodeType] = frozenset()
        self.meta_dtype: torch.dtype | None = None

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        treatment = treatment_of(func)
        kind = treatment.kind
        if kind is Kind.PASS:
            return func(*args, **kwargs)
        if kind is Kind.INITIALISER:
            # torch.nn.init passes its tensor by keyword, Tensor methods as `self`.
            target = args[0] if args else kwargs.get("tensor")
            if isinstance(target, torch.Tensor) and target.is_meta:
                # Initialising a parameter already sent to meta changes nothing; skipped,
                # since torch runs it through its Python decompositions.
                return target
            return func(*args, **kwargs)
        if kind is Kind.FACTORY:
            asked, shape = factory_request(func, args, kwargs, default_cpu=self.default_cpu)
            # Frame 1 is the Python function that called the factory: torch's dispatch to this
            # handler adds no Python frame of its own (a mode entered above this one would be
            # frame 1, and the call then allocates where it asks).
            if asked and self.on_meta and sys._getframe(1).f_code in self.on_meta:
                _hold(asked, shape, kept=False)
                return func(*args, **self.placed_on_meta(kwargs))
        else:
            tensors = cpu_tensors(args, kwargs)
            if not tensors:
                # On meta, an op torch would answer through its Python references (importing
                # torch._dynamo, over a second once a process) is answered by its shapes.
                answer = None if treatment.on_meta is None else treatment.on_meta(args, kwargs)
                return func(*args, **kwargs) if answer is None else answer
            asked, shape = derived_request(func, treatment.sizer, args, kwargs, tensors)
        if asked:
            _hold(asked, shape)
        return func(*args, **kwargs)

    def placed_on_meta(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """A factory's keyword arguments sent to meta, in `meta_dtype` where `slot_dtype`
        would give it that precision anyway."""
        placed = {**kwargs, "device": _META}
        if self.meta_dtype is not None:
            built = kwargs.get("dtype") or torch.get_default_dtype()
            placed["dtype"] = slot_dtype(built, self.meta_dtype, kept=False)
        return placed


_WATCH: ContextVar[_Watch | None] = ContextVar("allocation_watch", default=None)


def _hold(asked: int, shape: tuple[int, ...], *, kept: bool = True) -> None:
    """Add `asked` bytes to every active guard (`kept`; otherwise only check them: bytes that
    are given back at once), or refuse if any would pass its budget (the innermost is asked
    first, as its own mode once was)."""
    guards = _ACTIVE.get()
    for guard in reversed(guards):
        if guard.held + asked > guard.budget:
            # An outer guard may not know the config an inner one (the class's build) was given.
            config = guard.config or next((g.config for g in guards if g.config), {})
            keys = sizing_keys(config, shape)
            blame = f"sized by {', '.join(keys)}" if keys else "check the sizes"
            raise HostMemoryError(
                f"{guard.component}: constructing the model asks for {asked} bytes more of host"
                f" memory (a {list(shape)} tensor; {guard.held + asked} in all), past the"
                f" {guard.budget} bytes it may take (the host's available memory, and what its"
                f" checkpoint explains); refused before allocating: {blame} in its config.json"
            )
    if kept:
        for guard in guards:
            guard.held += asked


@contextmanager
def _watching() -> Iterator[_Watch]:
    """This thread's watch: the one an enclosing block entered, or a new one for this block."""
    watch = _WATCH.get()
    if watch is not None and watch.thread == threading.get_ident():
        yield watch  # an enclosing block's mode watches this thread already
        return
    watch = _Watch()
    token = _WATCH.set(watch)
    try:
        with watch:
            yield watch
    finally:
        _WATCH.reset(token)


@contextmanager
def allocation_guard(
    component: str, *, budget: int | None = None, config: Mapping[str, object] | None = None
) -> Iterator[None]:
    """Refuse any CPU allocation of the construction in this block that would take the
    construction past `budget` bytes (`construction_budget` bounds it by the checkpoint too).
    By default, the budget of the innermost guard around this one in this context (read from
    the host as that guard began, and no more than the host had available then), else
    `available_host_bytes()`; no check where that is unknown. `config`: the component's
    config.json, whose keys a refusal names when they sized the tensor asked for. Guards nest:
    each checks against its own budget.

    Raises:
        HostMemoryError: before the allocation, naming the component and the bytes.
    """
    if budget is None:
        enclosing = _ACTIVE.get()
        # The enclosing guard's budget is the tighter of the two: it is what the host had
        # available moments ago, or less; reading /proc again would cost each nested build.
        budget = enclosing[-1].budget if enclosing else available_host_bytes()
    if budget is None:
        yield
        return
    token = _ACTIVE.set((*_ACTIVE.get(), _Budget(component, budget, config)))
    try:
        with _watching():
            yield
    finally:
        _ACTIVE.reset(token)


@contextmanager
def factories_on_meta(
    constructors: frozenset[CodeType], *, dtype: torch.dtype | None = None
) -> Iterator[None]:
    """In this block, in this thread, a factory call that one of `constructors` makes itself
    (the code of an `__init__`, not of what it calls) and that would allocate on the host
    allocates on `meta` instead.

    For a meta build: `constructors` are those of layers whose every factory call makes one of
    their parameters, which the build sends to meta as it is registered anyway; made on meta
    at once, it costs neither the host allocation nor the swap. Every guard still checks its
    bytes against its budget (a layer sized past it is refused, as when it was allocated and
    then given back), and holds none of them. Blocks nest; the constructors add up.

    `dtype`: the precision the build's slots are given next (`reference.place.cast.cast_slots`);
    where `slot_dtype` gives a tensor that precision (a floating dtype of two bytes or more),
    the tensor is made in it, so that cast finds it done. A slot the cast then keeps in fp32
    loses nothing (a meta tensor holds no values). None (or an enclosing block's): as asked.
    """
    with _watching() as watch:
        before = watch.on_meta, watch.meta_dtype
        watch.on_meta = before[0] | constructors
        watch.meta_dtype = before[1] if dtype is None else dtype
        try:
            yield
        finally:
            watch.on_meta, watch.meta_dtype = before


def release(tensor: torch.Tensor) -> None:
    """`tensor`'s bytes are no longer held by the constructions in progress (it went to meta)."""
    if tensor.device.type == "cpu":
        for guard in _ACTIVE.get():
            guard.held = max(guard.held - tensor.nbytes, 0)
