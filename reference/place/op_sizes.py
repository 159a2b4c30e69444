"""What one torch call of a construction allocates on the host, known before it runs.

`allocation_guard` (`reference.place.host_memory`) asks this module about every torch call a
construction makes. Each function is classified once (`treatment_of`): a call that cannot allocate a
new tensor (a property, a query, a view, an in-place op) costs a dictionary look-up; a factory
is sized from its arguments (`factory_request`); an op that derives a new tensor from CPU
tensors is sized by its shape arithmetic where the op is known (pointwise ops broadcast their
inputs, `outer`, `cat`, `stack`, `repeat`, `repeat_interleave`, dtype conversions), and by one
run on `meta` copies of its inputs otherwise (`derived_request`).

Shape arithmetic gives the exact shape; the bytes per element of a pointwise op are bounded by
its widest input and the default dtype (an integer table divided by a float is float32), so a
count may be above the truth, never below it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch
from torch.utils import _pytree as pytree

from reference.place import weight_norm_ops

__all__ = [
    "FACTORIES",
    "INITIALISERS",
    "Kind",
    "MetaAnswer",
    "Request",
    "Sizer",
    "Treatment",
    "cpu_tensors",
    "derived_request",
    "factory_request",
    "slot_bytes",
    "treatment_of",
]

Args = tuple[Any, ...]
Kwargs = Mapping[str, Any]
Tensors = list[torch.Tensor]
Request = tuple[int, tuple[int, ...]]
"""Bytes a call would allocate on the host, and the shape of its largest new tensor."""
NOTHING: Request = (0, ())


class Kind(enum.Enum):
    """How the guard treats a torch function."""

    PASS = "allocates no new host tensor (a property, query, view or in-place op)"
    FACTORY = "allocates from its arguments (torch.empty, torch.arange)"
    INITIALISER = "initialises a tensor in place (a no-op on meta)"
    DERIVED = "may return new tensors computed from its tensor arguments"


def slot_bytes(tensor: torch.Tensor) -> int:
    """Bytes a fresh tensor of `tensor`'s shape and dtype takes (it may be on meta)."""
    return math.prod(tensor.shape) * tensor.dtype.itemsize


_SHAPED = frozenset({torch.empty, torch.zeros, torch.ones, torch.rand, torch.randn, torch.full})
FACTORIES = frozenset({*_SHAPED, torch.arange, torch.range, torch.eye})
INITIALISERS = frozenset(
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

# Calls that return no new tensor: queries, views of their input, autograd switches.
_NO_NEW_TENSOR = frozenset(
    {
        "_set_grad_enabled",
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "stride",
        "storage_offset",
        "element_size",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "is_signed",
        "is_pinned",
        "is_shared",
        "data_ptr",
        "untyped_storage",
        "get_device",
        "tolist",
        "item",
        "__len__",
        "__bool__",
        "__float__",
        "__format__",
        "__repr__",
        "__hash__",
        "__contains__",
        "register_hook",
        "view",
        "view_as",
        "expand",
        "expand_as",
        "permute",
        "transpose",
        "swapaxes",
        "swapdims",
        "t",
        "unsqueeze",
        "squeeze",
        "narrow",
        "select",
        "split",
        "split_with_sizes",
        "tensor_split",
        "chunk",
        "unbind",
        "unflatten",
        "movedim",
        "moveaxis",
        "detach",
        "as_strided",
        "diagonal",
        "real",
        "imag",
        "view_as_real",
        "view_as_complex",
        "__iter__",
    }
)

# Python operators under the aten op they run.
_OPERATORS = {
    "__add__": "add",
    "__radd__": "add",
    "__sub__": "sub",
    "__rsub__": "sub",
    "__mul__": "mul",
    "__rmul__": "mul",
    "__truediv__": "div",
    "__rtruediv__": "div",
    "__div__": "div",
    "__rdiv__": "div",
    "__floordiv__": "floor_divide",
    "__rfloordiv__": "floor_divide",
    "__mod__": "remainder",
    "__rmod__": "remainder",
    "__pow__": "pow",
    "__rpow__": "pow",
    "__neg__": "neg",
    "__pos__": "positive",
    "__abs__": "abs",
    "__invert__": "bitwise_not",
    "__and__": "bitwise_and",
    "__rand__": "bitwise_and",
    "__or__": "bitwise_or",
    "__ror__": "bitwise_or",
    "__xor__": "bitwise_xor",
    "__rxor__": "bitwise_xor",
    "__lt__": "lt",
    "__le__": "le",
    "__gt__": "gt",
    "__ge__": "ge",
    "__eq__": "eq",
    "__ne__": "ne",
}

_CONVERSIONS = {
    "float": torch.float32,
    "double": torch.float64,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "int": torch.int32,
    "long": torch.int64,
    "short": torch.int16,
    "char": torch.int8,
    "byte": torch.uint8,
    "bool": torch.bool,
    "cfloat": torch.complex64,
    "cdouble": torch.complex128,
}


def _pointwise(name: str) -> bool:
    """Whether aten's op of that name is tagged pointwise (its result broadcasts its inputs)."""
    try:
        packet = getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        return False
    overloads = [getattr(packet, o) for o in packet.overloads()]
    # One result per call (frexp's two are left to meta).
    single = all(len(o._schema.returns) <= 1 for o in overloads)
    return single and any(torch.Tag.pointwise in o.tags for o in overloads)


Sizer = Callable[[Args, Kwargs, Tensors], Request | None]
"""An op's shape arithmetic: its request from its arguments, or None where meta must decide."""


MetaAnswer = Callable[[Args, Kwargs], torch.Tensor | None]
"""An op's result on meta inputs, made without running it (None: run it)."""


@dataclass(frozen=True, slots=True)
class Treatment:
    """How the guard treats one torch function: its kind, for a derived op the shape
    arithmetic that sizes it (None: a run on meta does), and the op's result on meta inputs
    where torch would compute it through its Python references (`weight_norm_ops`)."""

    kind: Kind
    sizer: Sizer | None = None
    on_meta: MetaAnswer | None = None


_TREATMENTS: dict[Any, Treatment] = {}


def treatment_of(func: Callable[..., Any]) -> Treatment:
    """How the guard treats `func`; decided once per function."""
    try:
        return _TREATMENTS[func]
    except KeyError:
        found = _TREATMENTS[func] = _classify(func)
        return found
    except TypeError:  # unhashable: decided each time
        return _classify(func)


def _classify(func: Callable[..., Any]) -> Treatment:
    if func in INITIALISERS:
        return Treatment(Kind.INITIALISER)
    if func in FACTORIES:
        return Treatment(Kind.FACTORY)
    name = getattr(func, "__name__", "")
    known = name in _OPERATORS or name in _SHAPE_RULES
    in_place = name.endswith("_") or name.startswith("__i")  # add_, __iadd__, __get__
    if (in_place and not known) or name in _NO_NEW_TENSOR:
        return Treatment(Kind.PASS)
    aten = _OPERATORS.get(name, name)
    if aten in _SHAPE_RULES:
        return Treatment(Kind.DERIVED, _SHAPE_RULES[aten], weight_norm_ops.META_ANSWERS.get(aten))
    if name in _CONVERSIONS:
        return Treatment(Kind.DERIVED, _converted(_CONVERSIONS[name]))
    if _pointwise(aten):
        return Treatment(Kind.DERIVED, _broadcast)
    return Treatment(Kind.DERIVED)


def cpu_tensors(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[torch.Tensor]:
    """The tensors among a call's arguments, one level into lists and tuples (`torch.cat`'s),
    when at least one is on the CPU; [] otherwise."""
    found: list[torch.Tensor] = []
    for value in chain(args, kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, list | tuple):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    if any(t.device.type == "cpu" for t in found):
        return found
    return []


def derived_request(
    func: Callable[..., Any],
    sizer: Sizer | None,
    args: Args,
    kwargs: Kwargs,
    tensors: Tensors,
) -> Request:
    """Bytes (and shape) of the new host tensors `func` would return given CPU `tensors` among
    its arguments: from the op's shape arithmetic (`sizer`) where it is known, otherwise from
    one run on `meta` copies of its inputs; views and ops that cannot run on meta count
    nothing."""
    if sizer is not None:
        try:
            sized = sizer(args, kwargs, tensors)
        except (IndexError, TypeError, ValueError, RuntimeError):
            sized = None  # arguments the rule does not know: meta decides
        if sized is not None:
            return sized
    return _on_meta(func, args, kwargs)


def _on_meta(func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Request:
    def to_meta(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            return value.to("meta")
        return value

    try:
        out = func(*pytree.tree_map(to_meta, args), **pytree.tree_map(to_meta, dict(kwargs)))
    except Exception:  # data-dependent or CPU-only ops: run as they are
        return NOTHING
    fresh = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t._base is None]
    if not fresh:
        return NOTHING
    largest = max(fresh, key=slot_bytes)
    return sum(map(slot_bytes, fresh)), tuple(largest.shape)


def _widest(tensors: list[torch.Tensor], *, floor: int = 0) -> int:
    return max([floor, *(t.dtype.itemsize for t in tensors)])


def _sized(shape: Sequence[int], itemsize: int) -> Request:
    return math.prod(shape) * itemsize, tuple(shape)


def _broadcast(args: Args, kwargs: Kwargs, tensors: Tensors) -> Request:
    """A pointwise op: its inputs' broadcast shape, at most its widest dtype (or the default
    floating dtype an integer input is promoted to, or the `dtype` it is given)."""
    dtype = kwargs.get("dtype")
    if isinstance(dtype, torch.dtype):
        itemsize = dtype.itemsize
    else:
        itemsize = _widest(tensors, floor=torch.get_default_dtype().itemsize)
    return _sized(_broadcast_shape([t.shape for t in tensors]), itemsize)


def _broadcast_shape(shapes: list[torch.Size]) -> list[int]:
    """The shape `shapes` broadcast to (torch's rule: trailing dimensions equal, or one is 1)."""
    rank = max(len(shape) for shape in shapes)
    out = [1] * rank
    for shape in shapes:
        for i, size in enumerate(shape, start=rank - len(shape)):
            if size != 1:
                if out[i] not in (1, size):
                    raise ValueError("shapes do not broadcast")
                out[i] = size
    return out


def _converted(
    target: torch.dtype,
) -> Callable[[tuple[Any, ...], Mapping[str, Any], list[torch.Tensor]], Request]:
    """`tensor.float()` and its kin: a copy in `target`, or the tensor itself when it is one."""

    def size(args: Args, kwargs: Kwargs, tensors: Tensors) -> Request:
        (tensor,) = tensors
        if tensor.dtype == target:
            return NOTHING
        return _sized(tensor.shape, target.itemsize)

    return size


def _to(args: Args, kwargs: Kwargs, tensors: Tensors) -> Request | None:
    """`tensor.to(...)`: nothing when it returns the tensor or leaves the host, a copy otherwise."""
    tensor = args[0]
    if not isinstance(tensor, torch.Tensor):
        return None
    dtype, device = tensor.dtype, None
    for value in chain(args[1:], kwargs.values()):
        if isinstance(value, torch.dtype):
            dtype = value
        elif isinstance(value, torch.Tensor):
            dtype, device = value.dtype, value.device
        elif isinstance(value, str | torch.device | int) and not isinstance(value, bool):
            device = torch.device(value)
    if device is not None and device.type != "cpu":
        return NOTHING  # off the host (meta included)
    if dtype == tensor.dtype and not kwargs.get("copy", False):
        return NOTHING  # the tensor itself
    return _sized(tensor.shape, dtype.itemsize)


def _copied(args: Args, kwargs: Kwargs, tensors: Tensors) -> Request:
    """`clone`: a copy of the tensor."""
    tensor = tensors[0]
    return _sized(tensor.shape, tensor.dtype.itemsize)


def _contiguous(args: Args, kwargs: Kwargs, tensors: Tensors) -> Request:
    """`contiguous`: a copy of a strided tensor, the tensor itself otherwise."""
    tensor = tensors[0]
    if tensor.is_contiguous():
        return NOTHING
    return _sized(tensor.shape, tensor.dtype.itemsize)


def _outer(args: Args, kwargs: Kwargs, tensors: Tensors) -> Request:
    first, second = tensors
    return _sized((first.numel(), second.numel()), _widest(tensors))


def _dim(args: tuple[Any, ...], kwargs: Mapping[str, Any], rank: int) -> int:
    dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError("dim")
    return dim % rank if rank else 0


def _cat(args: Args, kwargs: Kwargs, tensors: Tensors) -> Request | None:
    parts = [t for t in tensors if t.dim() != 1 or t.numel()]  # cat skips 1-d empty tensors
    if not parts or len(parts) != len(tensors) or any(t.dim() != parts[0].dim() for t in parts):
        return None
    dim = _dim(args, kwargs, parts[0].dim())
    shape = list(parts[0].shape)
    shape[dim] = sum(t.shape[dim] for t in parts)
    return _sized(shape, _widest(parts))


def _stack(args: Args, kwargs: Kwargs, tensors: Tensors) -> Request | None:
    if not tensors or any(t.shape != tensors[0].shape for t in tensors):
        return None
    shape = list(tensors[0].shape)
    shape.insert(_dim(args, kwargs, len(shape) + 1), len(tensors))
    return _sized(shape, _widest(tensors))


def _repeat(args: Args, kwargs: Kwargs, tensors: Tensors) -> Request | None:
    (tensor,) = tensors
    counts = args[1:] if len(args) > 2 else args[1] if len(args) == 2 else kwargs.get("repeats")
    if isinstance(counts, int):
        counts = (counts,)
    if not isinstance(counts, Sequence) or not all(isinstance(c, int) for c in counts):
        return None
    shape = (1,) * (len(counts) - tensor.dim()) + tuple(tensor.shape)
    return _sized([s * c for s, c in zip(shape, counts, strict=True)], tensor.dtype.itemsize)


def _repeat_interleave(args: Args, kwargs: Kwargs, tensors: Tensors) -> Request | None:
    tensor = args[0]
    repeats = kwargs.get("repeats", args[1] if len(args) > 1 else None)
    if not isinstance(tensor, torch.Tensor) or not isinstance(repeats, int) or len(tensors) > 1:
        return None  # repeats given as a tensor: its values decide, meta cannot say
    dim = kwargs.get("dim", args[2] if len(args) > 2 else None)
    if dim is None:
        return _sized((tensor.numel() * repeats,), tensor.dtype.itemsize)
    shape = list(tensor.shape)
    shape[dim % len(shape)] *= repeats
    return _sized(shape, tensor.dtype.itemsize)


def _indexed(args: Args, kwargs: Kwargs, tensors: Tensors) -> Request | None:
    """`tensor[...]`: a view for ints, slices and None; meta sizes a gather by tensor or list."""
    index = args[1] if len(args) > 1 else None
    parts = index if isinstance(index, tuple) else (index,)
    if any(isinstance(p, torch.Tensor | list) for p in parts):
        return None
    return NOTHING


_SHAPE_RULES: dict[str, Callable[..., Request | None]] = {
    "__getitem__": _indexed,
    "outer": _outer,
    "ger": _outer,
    "cat": _cat,
    "concat": _cat,
    "concatenate": _cat,
    "stack": _stack,
    "repeat": _repeat,
    "repeat_interleave": _repeat_interleave,
    "to": _to,
    "clone": _copied,
    "contiguous": _contiguous,
    **weight_norm_ops.SIZES,
}


_SHAPES = (torch.Size, tuple, list)


def _size(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[int, ...] | None:
    # Asked for every parameter a build makes: a loop, not a generator, and no union built.
    shape = kwargs.get("size", args[0] if args else None)
    if isinstance(shape, int):
        shape = args if all(isinstance(a, int) for a in args) else (shape,)
    if not isinstance(shape, _SHAPES):
        return None
    for size in shape:
        if not isinstance(size, int):
            return None
    return tuple(shape)


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


def factory_request(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    default_cpu: bool,
) -> Request:
    """Bytes (and shape) a factory call (`FACTORIES`) would allocate on the CPU ((0, ()) for
    one on another device); `default_cpu`: a call that names no device allocates on the CPU."""
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        return NOTHING
    if device is None and not default_cpu:
        return NOTHING
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
        return NOTHING
    return math.prod(shape) * dtype.itemsize, shape
