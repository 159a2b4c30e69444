"""Host memory a construction may take, checked before each allocation it makes (issue: a config
with absurd sizes must be refused before torch allocates, not after).

A model's constructor allocates with torch's factory functions (`torch.empty` in every
`nn.Linear`, `torch.arange` for a rotary table). `allocation_guard` watches them through a
`TorchFunctionMode`, which is thread-local like `with torch.device(...)`: before a factory
allocates on the CPU, the bytes it asks for are added to what the construction holds and
compared with the memory the host has available (`MemAvailable`, or the cgroup's limit when
that is lower); past it, the construction is refused with `HostMemoryError` naming the
component, the bytes asked for and the bytes available, and nothing is allocated. Tensors the
meta build sends to `meta` give their bytes back (`release`).
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

from reference.errors import HostMemoryError

__all__ = [
    "COPY_FIX",
    "allocation_guard",
    "available_host_bytes",
    "default_device",
    "refuse_beyond_host",
    "release",
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
) -> int:
    """Bytes a factory call would allocate on the CPU (0 for anything else); `default_cpu`:
    a call that names no device allocates on the CPU."""
    if func not in _FACTORIES:  # most calls a constructor makes; asked first, since it is cheap
        return 0
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        return 0
    if device is None and not default_cpu:
        return 0
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    if func in _SHAPED:
        shape = _size(args if func is not torch.full else args[:1], kwargs)
        count = math.prod(shape) if shape is not None else None
    elif func in (torch.arange, torch.range):
        count = _arange_count(args, kwargs)
        if kwargs.get("dtype") is None and all(isinstance(a, int) for a in args):
            dtype = torch.int64
    elif func is torch.eye:
        n = args[0] if args else kwargs.get("n", 0)
        m = args[1] if len(args) > 1 and isinstance(args[1], int) else kwargs.get("m", n)
        count = n * m if isinstance(n, int) and isinstance(m, int) else None
    else:
        return 0
    return 0 if count is None else count * dtype.itemsize


class _Guard(TorchFunctionMode):
    def __init__(self, component: str, budget: int) -> None:
        super().__init__()
        self.component = component
        self.budget = budget
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
        asked = _request(func, args, kwargs, default_cpu=self.default_cpu)
        if asked and self.held + asked > self.budget:
            raise HostMemoryError(
                f"{self.component}: constructing the model asks for {asked} bytes more of host"
                f" memory ({self.held + asked} in all) and the host has {self.budget} available;"
                " refused before allocating. Check the sizes in its config.json, or free"
                " memory"
            )
        self.held += asked
        return func(*args, **kwargs)


_ACTIVE: ContextVar[_Guard | None] = ContextVar("allocation_guard", default=None)


@contextmanager
def allocation_guard(component: str, *, budget: int | None = None) -> Iterator[None]:
    """Refuse any CPU allocation of the construction in this block that would take more host
    memory than is available (`budget`, default `available_host_bytes()`; no check where that
    is unknown).

    Raises:
        HostMemoryError: before the allocation, naming the component and the bytes.
    """
    budget = available_host_bytes() if budget is None else budget
    if budget is None:
        yield
        return
    guard = _Guard(component, budget)
    token = _ACTIVE.set(guard)
    try:
        with guard:
            yield
    finally:
        _ACTIVE.reset(token)


def release(tensor: torch.Tensor) -> None:
    """`tensor`'s bytes are no longer held by the construction (it went to meta)."""
    guard = _ACTIVE.get()
    if guard is not None and tensor.device.type == "cpu":
        guard.held = max(guard.held - tensor.nbytes, 0)
