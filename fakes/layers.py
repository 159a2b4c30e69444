"""Linear layers that behave like a serving stack's parallel linears.

A replicated linear holds the whole weight; a column-parallel one holds rows `tp_rank` of
`tp_size` (dim 0); a row-parallel one holds columns (dim 1) and loads its bias whole. Each layer's
quant method creates its parameters and attaches `weight_loader` (a bound method of the layer),
`input_dim` and `output_dim`. The weight loaders narrow by `tp_rank`/`tp_size`, honour
`is_sharded_weight` (the tensor is already this rank's shard), and assert shapes before copying.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from fakes.quant import LinearMethod, UnquantizedLinearMethod, set_weight_attrs
from reference.place.adopt import LinearKinds

__all__ = [
    "LINEAR_KINDS",
    "ColumnParallelLinear",
    "LinearBase",
    "MergedColumnParallelLinear",
    "ReplicatedLinear",
    "RowParallelLinear",
    "default_weight_loader",
]


def _rank_slice(
    tp_rank: int, param: torch.Tensor, loaded: torch.Tensor, dim_attribute: str
) -> torch.Tensor:
    """This rank's slice of `loaded` along the parameter's sharded dim (`input_dim` or
    `output_dim`); the whole tensor when the parameter has no such dim or is already sharded."""
    dim = getattr(param, dim_attribute, None)
    if dim is None or getattr(param, "is_sharded_weight", False):
        return loaded
    size = param.shape[dim]
    return loaded.narrow(dim, tp_rank * size, size)


def _check_and_copy(layer: nn.Module, param: torch.Tensor, loaded: torch.Tensor) -> None:
    assert param.shape == loaded.shape, (
        f"{type(layer).__name__}: loaded shape {tuple(loaded.shape)} does not match"
        f" parameter shape {tuple(param.shape)}"
    )
    param.data.copy_(loaded)


def default_weight_loader(param: torch.Tensor, loaded: torch.Tensor) -> None:
    """A plain-function loader (not a bound method), as stacks attach to odd parameters."""
    assert param.shape == loaded.shape, (
        f"default_weight_loader: loaded shape {tuple(loaded.shape)} does not match"
        f" parameter shape {tuple(param.shape)}"
    )
    param.data.copy_(loaded)


def _split(size: int, tp_size: int, what: str) -> int:
    if tp_size < 1 or size % tp_size:
        raise ValueError(f"{what} {size} does not split evenly over tp_size={tp_size}")
    return size // tp_size


class LinearBase(nn.Module):
    """Shared construction: the quant method creates `weight`; the layer creates `bias`."""

    weight: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        input_per_rank: int,
        output_per_rank: int,
        bias_per_rank: int,
        bias: bool,
        params_dtype: torch.dtype,
        quant_method: LinearMethod | None,
    ) -> None:
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.quant_method = quant_method if quant_method is not None else UnquantizedLinearMethod()
        self.quant_method.create_weights(
            self, input_size=input_per_rank, output_size=output_per_rank, params_dtype=params_dtype
        )
        if bias:
            self.bias = nn.Parameter(
                torch.empty(bias_per_rank, dtype=params_dtype), requires_grad=False
            )
            set_weight_attrs(self.bias, {"output_dim": 0, "weight_loader": self.weight_loader})
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor) -> None:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ReplicatedLinear(LinearBase):
    """The whole weight on every rank; it has no TP size."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        bias: bool = True,
        params_dtype: torch.dtype = torch.float32,
        quant_method: LinearMethod | None = None,
    ) -> None:
        super().__init__(
            input_size,
            output_size,
            input_per_rank=input_size,
            output_per_rank=output_size,
            bias_per_rank=output_size,
            bias=bias,
            params_dtype=params_dtype,
            quant_method=quant_method,
        )

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor) -> None:
        _check_and_copy(self, param, loaded)


class ColumnParallelLinear(LinearBase):
    """Output rows split over ranks: rank r holds rows [r*n, (r+1)*n) of weight and bias."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        bias: bool = True,
        params_dtype: torch.dtype = torch.float32,
        quant_method: LinearMethod | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        self.tp_rank, self.tp_size = tp_rank, tp_size
        per_rank = _split(output_size, tp_size, "output size")
        super().__init__(
            input_size,
            output_size,
            input_per_rank=input_size,
            output_per_rank=per_rank,
            bias_per_rank=per_rank,
            bias=bias,
            params_dtype=params_dtype,
            quant_method=quant_method,
        )

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor) -> None:
        _check_and_copy(self, param, _rank_slice(self.tp_rank, param, loaded, "output_dim"))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs fused in one weight (QKV style).

    Each rank holds its share of *every* part, so the shard is not one slice of the fused tensor:
    this layer overrides `weight_loader`, and zero-copy adoption refuses it (ZC-3).
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: Sequence[int],
        *,
        bias: bool = True,
        params_dtype: torch.dtype = torch.float32,
        quant_method: LinearMethod | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        for size in output_sizes:
            _split(size, tp_size, "output part")
        self.output_sizes = tuple(output_sizes)
        super().__init__(
            input_size,
            sum(output_sizes),
            bias=bias,
            params_dtype=params_dtype,
            quant_method=quant_method,
            tp_rank=tp_rank,
            tp_size=tp_size,
        )

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor) -> None:
        dim = getattr(param, "output_dim", None)
        if dim is None or getattr(param, "is_sharded_weight", False):
            _check_and_copy(self, param, loaded)
            return
        assert loaded.shape[dim] == sum(self.output_sizes), (
            f"{type(self).__name__}: loaded size {loaded.shape[dim]} along dim {dim} is not the"
            f" fused size {sum(self.output_sizes)}"
        )
        source = destination = 0
        for size in self.output_sizes:
            shard = size // self.tp_size
            part = loaded.narrow(dim, source + self.tp_rank * shard, shard)
            _check_and_copy(self, param.data.narrow(dim, destination, shard), part)
            source, destination = source + size, destination + shard


class RowParallelLinear(LinearBase):
    """Input columns split over ranks (dim 1); the bias loads whole and is added once."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        bias: bool = True,
        params_dtype: torch.dtype = torch.float32,
        quant_method: LinearMethod | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        self.tp_rank, self.tp_size = tp_rank, tp_size
        super().__init__(
            input_size,
            output_size,
            input_per_rank=_split(input_size, tp_size, "input size"),
            output_per_rank=output_size,
            bias_per_rank=output_size,
            bias=bias,
            params_dtype=params_dtype,
            quant_method=quant_method,
        )

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor) -> None:
        _check_and_copy(self, param, _rank_slice(self.tp_rank, param, loaded, "input_dim"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.quant_method.apply(self, x, None)
        if self.tp_size > 1:
            dist.all_reduce(out)
        return out if self.bias is None else out + self.bias


LINEAR_KINDS = LinearKinds(
    replicated=ReplicatedLinear,
    column_parallel=ColumnParallelLinear,
    row_parallel=RowParallelLinear,
    unquantized_method=UnquantizedLinearMethod,
)
