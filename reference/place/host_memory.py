"""Host memory a construction may take, checked before each allocation it makes (a config with
absurd sizes must be refused before torch allocates, not after).

A model's constructor allocates with torch's factory functions (`torch.empty` in every
`nn.Linear`, `torch.arange` for a rotary table) and with the ops that derive a table from them
(`torch.outer`, `.cos()`). `allocation_guard` watches both through a `TorchFunctionMode`, which
is thread-local like `with torch.device(...)`: before a factory allocates on the CPU, the bytes
it asks for are added to what the construction holds; before an op on CPU tensors runs, it is
run once on `meta` copies of its inputs (free) to learn the bytes of what it returns. Past the
budget, the construction is refused with `HostMemoryError` naming the component, the bytes, the
shape asked for and the config.json keys that sized it, and nothing is allocated. Tensors the
meta build sends to `meta` give their bytes back (`release`).

The budget is the memory the host has available (`MemAvailable`, or the cgroup's limit when that
is lower), and, where the checkpoint is known, what that checkpoint can explain
(`construction_budget`): a config.json that sizes the build far past its weights (a 20000-wide
VAE over a small checkpoint, a rotary table of 20 million positions) is refused in milliseconds
instead of swapping the host.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from reference.errors import HostMemoryError

__all__ = [
    "COPY_FIX",
    "TABLE_FLOOR",
    "allocation_guard",
    "available_host_bytes",
    "construction_budget",
    "construction_guard",
    "default_device",
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


def slot_bytes(tensor: torch.Tensor) -> int:
    """Bytes a fresh tensor of `tensor`'s shape and dtype takes (it may be on meta)."""
    return math.prod(tensor.shape) * tensor.dtype.itemsize


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


def _size(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[int, ...] | None:
    shape = kwargs.get("size", args[0] if args else None)
    if isinstance(shape, int):
        shape = args if all(isinstance(a, int) for a in args) else (shape,)
    if isinstance(shape, torch.Size | tuple | list) and all(isinstance(d, int) for d in shape):
        return tuple(shape)
    return None


def _arange_count(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int | None:
    numbers = [a for a in args if isinstance(a, int | float) and not isinstance(a, bool)]
    start, end, step = 0.0, None, 1.0
    if len(numbers) == 1:
        end = numbers[0]
    elif len(numbers) >= 2:
        start, end = numbers[0], numbers[1]
        step = numbers[2] if len(numbers) > 2 else kwargs.get("step", 1)
    end = kwargs.get("end", end)
    if end is None or not step:
        return None
    count: int = max(math.ceil((float(end) - start) / float(step)), 0)
    return count


def default_device() -> torch.device:
    """Where a factory call without a device allocates (the default device context)."""
    # torch.get_default_device arrived in torch 2.3. Before it, an allocation made inside
    # `with torch.device("cuda")` is counted as the host's (a stricter check, never a looser
    # one), and a build for the CPU enters a CPU device context it did not need.
    get = getattr(torch, "get_default_device", None)
    return get() if get is not None else torch.device("cpu")


_SHAPED = {torch.empty, torch.zeros, torch.ones, torch.rand, torch.randn, torch.full}


_FACTORIES = frozenset({*_SHAPED, torch.arange, torch.range, torch.eye})
_INITIALISERS = frozenset(
    {
        torch.Tensor.uniform_,
        torch.Tensor.normal_,
        torch.Tensor.fill_,
        torch.Tensor.zero_,
        torch.nn.init.uniform_,
        torch.nn.init.normal_,
        torch.nn.init.trunc_normal_,
        torch.nn.init.constant_,
        torch.nn.init.ones_,
        torch.nn.init.zeros_,
        torch.nn.init.xavier_uniform_,
        torch.nn.init.xavier_normal_,
        torch.nn.init.kaiming_uniform_,
        torch.nn.init.kaiming_normal_,
        torch.nn.init.orthogonal_,
    }
)
"""In-place initialisers: on a meta tensor each is a no-op that returns the tensor."""


def _request(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    default_cpu: bool,
) -> tuple[int, tuple[int, ...]]:
    """Bytes (and shape) a factory call would allocate on the CPU ((0, ()) for anything
    else); `default_cpu`: a call that names no device allocates on the CPU."""
    if func not in _FACTORIES:  # most calls a constructor makes; asked first, since it is cheap
        return 0, ()
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        return 0, ()
    if device is None and not default_cpu:
        return 0, ()
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    shape: tuple[int, ...] | None
    if func in _SHAPED:
        shape = _size(args if func is not torch.full else args[:1], kwargs)
    elif func in (torch.arange, torch.range):
        count = _arange_count(args, kwargs)
        shape = None if count is None else (count,)
        if kwargs.get("dtype") is None and all(isinstance(a, int) for a in args):
            dtype = torch.int64
    else:  # torch.eye
        n = args[0] if args else kwargs.get("n", 0)
        m = args[1] if len(args) > 1 and isinstance(args[1], int) else kwargs.get("m", n)
        shape = (n, m) if isinstance(n, int) and isinstance(m, int) else None
    if shape is None:
        return 0, ()
    return math.prod(shape) * dtype.itemsize, shape


def _on_cpu(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cpu"


def _derived(func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether `func` may allocate a new CPU tensor from CPU tensors (not in place, not a
    factory): the ops that derive a table (`torch.outer`, `.cos()`, `*`)."""
    name = getattr(func, "__name__", "")
    if name.endswith("_") or name.startswith("__i") or func in _FACTORIES:
        return False  # in place, or a factory (asked by `_request`)
    leaves = pytree.tree_leaves((args, dict(kwargs)))
    return any(_on_cpu(leaf) for leaf in leaves)


def _derived_request(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> tuple[int, tuple[int, ...]]:
    """Bytes (and shape) of the new tensors `func` would return, learnt by running it on `meta`
    copies of its CPU inputs; views and ops that cannot run on meta count nothing."""

    def to_meta(value: Any) -> Any:
        return value.to("meta") if _on_cpu(value) else value

    try:
        out = func(*pytree.tree_map(to_meta, args), **pytree.tree_map(to_meta, dict(kwargs)))
    except Exception:  # data-dependent or CPU-only ops: run as they are
        return 0, ()
    fresh = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t._base is None]
    if not fresh:
        return 0, ()
    largest = max(fresh, key=slot_bytes)
    return sum(map(slot_bytes, fresh)), tuple(largest.shape)


class _Guard(TorchFunctionMode):
    def __init__(self, component: str, budget: int, config: Mapping[str, object] | None) -> None:
        super().__init__()
        self.component = component
        self.budget = budget
        self.config = config or {}
        self.held = 0
        # A call reaches this mode without a device only through the device contexts entered
        # before it (one entered later sits above it and adds the device), so it is asked once.
        self.default_cpu = default_device().type == "cpu"

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _INITIALISERS:
            # torch.nn.init passes its tensor by keyword, Tensor methods as `self`.
            target = args[0] if args else kwargs.get("tensor")
            if isinstance(target, torch.Tensor) and target.is_meta:
                # Initialising a parameter already sent to meta changes nothing; skipped,
                # since torch runs it through its Python decompositions.
                return target
        asked, shape = _request(func, args, kwargs, default_cpu=self.default_cpu)
        if not asked and _derived(func, args, kwargs):
            asked, shape = _derived_request(func, args, kwargs)
        if asked and self.held + asked > self.budget:
            # An outer guard may not know the config an inner one (the class's build) was given.
            config = self.config or next((g.config for g in _ACTIVE.get() if g.config), {})
            keys = sizing_keys(config, shape)
            blame = f"sized by {', '.join(keys)}" if keys else "check the sizes"
            raise HostMemoryError(
                f"{self.component}: constructing the model asks for {asked} bytes more of host"
                f" memory (a {list(shape)} tensor; {self.held + asked} in all), past the"
                f" {self.budget} bytes it may take (the host's available memory, and what its"
                f" checkpoint explains); refused before allocating: {blame} in its config.json"
            )
        self.held += asked
        return func(*args, **kwargs)


_ACTIVE: ContextVar[tuple[_Guard, ...]] = ContextVar("allocation_guard", default=())


@contextmanager
def allocation_guard(
    component: str, *, budget: int | None = None, config: Mapping[str, object] | None = None
) -> Iterator[None]:
    """Refuse any CPU allocation of the construction in this block that would take the
    construction past `budget` bytes (default `available_host_bytes()`; no check where that is
    unknown; `construction_budget` bounds it by the checkpoint too). `config`: the component's
    config.json, whose keys a refusal names when they sized the tensor asked for. Guards nest:
    each checks against its own budget.

    Raises:
        HostMemoryError: before the allocation, naming the component and the bytes.
    """
    budget = available_host_bytes() if budget is None else budget
    if budget is None:
        yield
        return
    guard = _Guard(component, budget, config)
    token = _ACTIVE.set((*_ACTIVE.get(), guard))
    try:
        with guard:
            yield
    finally:
        _ACTIVE.reset(token)


def release(tensor: torch.Tensor) -> None:
    """`tensor`'s bytes are no longer held by the constructions in progress (it went to meta)."""
    if tensor.device.type == "cpu":
        for guard in _ACTIVE.get():
            guard.held = max(guard.held - tensor.nbytes, 0)
