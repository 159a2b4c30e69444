"""CKPT-3, VAE-1/7/8/10: the reference's own preflight and per-tensor fill (reference.place.stream).

test_vae.py judges every loader on whole VAEs; here `preflight`, `fill_slot` and `stream` are
called directly to pin the reference's messages (how long lists are cut, how problems are
joined), that each slot's tensor lands on the device asked, and that a streamed parameter keeps
the Python attributes of the one it replaces.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from reference.errors import StateMismatchError
from reference.place.slots import state_slots
from reference.place.stream import fill_slot, preflight, stream
from reference.read.checkpoint import TensorReader, open_checkpoint

pytestmark = pytest.mark.reference_only(
    "calls reference.place.stream directly and pins its wording"
)

META = torch.device("meta")  # stands for any device but CPU in the CPU tier


def many(count: int) -> nn.Module:
    """A module with `count` parameters p00, p01, ... of shape (2,)."""
    module = nn.Module()
    for i in range(count):
        module.register_parameter(f"p{i:02d}", nn.Parameter(torch.zeros(2)))
    return module


def checkpoint_of(tmp_path: Path, state: dict[str, torch.Tensor]) -> Path:
    path = tmp_path / "c.safetensors"
    save_file(state, str(path))
    return path


def refusal(tmp_path: Path, module: nn.Module, state: dict[str, torch.Tensor]) -> str:
    checkpoint = open_checkpoint(checkpoint_of(tmp_path, state))
    with pytest.raises(StateMismatchError) as caught:
        preflight(checkpoint, state_slots(module, component="vae"), component="vae")
    return str(caught.value)


@pytest.mark.rule("CKPT-3", "VAE-7")
@pytest.mark.parametrize(
    ("count", "listed"),
    [
        (8, "'p00', 'p01', 'p02', 'p03', 'p04', 'p05', 'p06', 'p07'"),
        (9, "'p00', 'p01', 'p02', 'p03', 'p04', 'p05', 'p06', 'p07' and 1 more"),
        (11, "'p00', 'p01', 'p02', 'p03', 'p04', 'p05', 'p06', 'p07' and 3 more"),
    ],
)
def test_unknown_tensors_are_listed_up_to_eight(tmp_path: Path, count: int, listed: str) -> None:
    state = {f"p{i:02d}": torch.zeros(2) for i in range(count)}
    assert refusal(tmp_path, nn.Module(), state) == (
        f"vae: the checkpoint holds tensors the module has no slot for: {listed} (in"
        " 'c.safetensors'). Check that the checkpoint belongs to this model class and config"
    )


@pytest.mark.rule("CKPT-3", "VAE-8")
def test_missing_slots_are_listed(tmp_path: Path) -> None:
    assert refusal(tmp_path, many(3), {"p01": torch.zeros(2)}) == (
        "vae: the checkpoint ('c.safetensors') lacks tensors for these slots: 'p00', 'p02'."
        " Every parameter and persistent buffer must come from the checkpoint"
    )


@pytest.mark.rule("CKPT-3", "VAE-7")
def test_every_wrong_shape_is_listed(tmp_path: Path) -> None:
    state = {"p00": torch.zeros(3), "p01": torch.zeros(2), "p02": torch.zeros(1, 2)}
    assert refusal(tmp_path, many(3), state) == (
        "vae: wrong shapes: p00 is [3] in c.safetensors, the module expects [2]; p02 is [1, 2]"
        " in c.safetensors, the module expects [2]"
    )


@pytest.mark.rule("VAE-1", "VAE-10")
def test_a_streamed_parameter_keeps_its_attributes_and_lands_on_the_device(
    tmp_path: Path,
) -> None:
    module = nn.Linear(2, 2)
    module.weight.output_dim = 0  # type: ignore[attr-defined]
    checkpoint = open_checkpoint(
        checkpoint_of(tmp_path, {k: v.detach() for k, v in module.state_dict().items()})
    )
    slots = state_slots(module, component="vae")
    filled = fill_slot(TensorReader(checkpoint), slots["weight"], device=META)
    assert filled is module.weight
    assert filled.is_meta
    assert filled.output_dim == 0  # type: ignore[attr-defined]


@pytest.mark.rule("VAE-1", "VAE-13")
def test_stream_fills_every_slot_on_the_device(tmp_path: Path) -> None:
    module = nn.Linear(2, 2)
    module.register_buffer("scale", torch.ones(2))
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    checkpoint = open_checkpoint(checkpoint_of(tmp_path, state))
    slots = state_slots(module, component="vae")
    plan = preflight(checkpoint, slots, component="vae")
    records, filled = stream(TensorReader(checkpoint), slots, plan, device=META)
    assert sorted(filled) == ["bias", "scale", "weight"]
    assert all(t.is_meta for t in filled.values())
    assert all(t.is_meta for t in module.state_dict().values())
    assert [r.name for r in records] == list(plan.names)
