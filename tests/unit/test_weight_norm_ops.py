"""Weight normalisation's ops answered by their shapes in a guarded build
(`reference.place.weight_norm_ops`): the same shapes, strides, dtypes and `requires_grad` as
torch's own results, sizes equal to what torch allocates, and no `torch._dynamo` imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from reference.place.build import build_on_meta
from reference.place.weight_norm_ops import META_ANSWERS, SIZES

pytestmark = pytest.mark.internal

CASES = [
    ((8, 4, 3), -1),
    ((8, 4, 3), 0),
    ((8, 4, 3), 1),
    ((8, 4, 3), 2),
    ((8, 4, 3), -2),
    ((8, 4, 3, 5), 2),
    ((6,), 0),
]


def layout(tensor: torch.Tensor) -> tuple[object, ...]:
    return tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("shape", "dim"), CASES)
def test_each_answer_is_laid_out_as_torchs_result(
    shape: tuple[int, ...], dim: int, dtype: torch.dtype
) -> None:
    v = torch.randn(shape).to(dtype).requires_grad_()
    norm = torch.norm_except_dim(v, 2, dim)
    on_meta = META_ANSWERS["norm_except_dim"]((v.to("meta"), 2, dim), {})
    assert on_meta is not None
    assert on_meta.is_meta
    assert layout(on_meta) == layout(norm)
    g = norm.detach()
    weight = torch._weight_norm(v, g, dim)
    on_meta = META_ANSWERS["_weight_norm"]((v.to("meta"), g.to("meta")), {"dim": dim})
    assert on_meta is not None
    assert on_meta.is_meta
    assert layout(on_meta) == layout(weight)
    with torch.no_grad():
        unrecorded = META_ANSWERS["_weight_norm"]((v.to("meta"), g.to("meta"), dim), {})
    assert unrecorded is not None
    assert not unrecorded.requires_grad


@pytest.mark.parametrize(("shape", "dim"), CASES)
def test_each_size_is_what_torch_allocates(shape: tuple[int, ...], dim: int) -> None:
    v = torch.randn(shape)
    norm = torch.norm_except_dim(v, 2, dim)
    assert SIZES["norm_except_dim"]((v, 2, dim), {}, [v]) == (norm.nbytes, tuple(norm.shape))
    weight = torch._weight_norm(v, norm, dim)
    assert SIZES["_weight_norm"]((v, norm, dim), {}, [v, norm]) == (
        weight.nbytes,
        tuple(weight.shape),
    )


def test_what_it_does_not_cover_is_left_to_torch() -> None:
    meta = torch.empty(4, 3, device="meta")
    assert META_ANSWERS["norm_except_dim"]((torch.empty(4, 3), 2, 0), {}) is None  # not meta
    assert META_ANSWERS["norm_except_dim"]((meta.int(), 2, 0), {}) is None  # an integer weight
    assert META_ANSWERS["norm_except_dim"]((meta, 2, 5), {}) is None  # no such dimension
    half = torch.empty(4, 1, device="meta", dtype=torch.float16)
    assert META_ANSWERS["_weight_norm"]((meta, half, 0), {}) is None  # two dtypes


def test_a_meta_build_with_weight_norm_keeps_torchs_slots() -> None:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(
            weight_norm(nn.Conv1d(4, 8, 3)),
            weight_norm(nn.Conv1d(8, 8, 3), dim=1),
            weight_norm(nn.Linear(5, 5), dim=None),
        )

    real, meta = build(), build_on_meta(build, component="vocoder")
    expected = {name: layout(t.detach()) for name, t in real.state_dict().items()}
    assert {name: layout(t.detach()) for name, t in meta.state_dict().items()} == expected
    assert meta[1].weight.shape == real[1].weight.shape


def test_a_first_meta_build_with_weight_norm_imports_no_dynamo() -> None:
    """Catches torch renaming either op (the answers would stop applying, and a first meta
    build would cost over a second again)."""
    code = textwrap.dedent(
        """
        import sys
        from torch import nn
        from torch.nn.utils.parametrizations import weight_norm
        from reference.place.build import build_on_meta
        build_on_meta(lambda: weight_norm(nn.Conv1d(4, 8, 3)), component="vocoder")
        print("torch._dynamo" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False"
