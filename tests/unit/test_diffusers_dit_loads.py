"""The full-state path (`load_dit`) on a real diffusers DiT, built unedited from its config.

A class the user does not own must load without a buffer hook: construction computes its rotary
tables for real while its parameters go to `meta`. Judged by the report's counts (ZC-14), by
where each parameter's bytes live and what they hold (ZC-2b), and by its buffers (ZC-15: the
load must succeed, every buffer a buffer holding the file's or construction's value; the other
tests skip a load that raised, which is ZC-15's to judge).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from fakes.diffusers_pipelines import WAN_DIT
from fakes.layers import LINEAR_KINDS
from reference.extras import install_hint
from reference.kit.judging.file_maps import file_position, tensor_positions
from reference.kit.judging.judge import loaded_or_skip
from reference.kit.seam import ZERO_COPY, DitRequest, Plan, SeamLoader

EXTRA = f"needs the diffusers extra: {install_hint('diffusers')}"

pytestmark = pytest.mark.capability(ZERO_COPY)


@pytest.fixture(scope="module")
def diffusers() -> ModuleType:
    module = pytest.importorskip("diffusers", reason=EXTRA)
    module.utils.logging.set_verbosity_error()
    return module


def dit_build(folder: Path, diffusers: ModuleType) -> Callable[[], nn.Module]:
    """A zero-argument build of the diffusers class from the folder's config.json, unedited."""
    config = json.loads((folder / "config.json").read_text())
    cls = getattr(diffusers, config["_class_name"])
    return lambda: cls.from_config(config)


@pytest.mark.rule("ZC-14")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_load_report_counts_a_diffusers_dit_as_it_was_loaded(
    loader: SeamLoader, tmp_path: Path, diffusers: ModuleType, dtype: str
) -> None:
    """ZC-14: the report of a plain-torch DiT counts as adopted exactly the parameters whose
    bytes are the file's (judged from where they live), with their bytes, the rest as copied,
    and gives each copy its first failing condition as a rule ID."""
    folder = tmp_path / "transformer"
    model: Any = WAN_DIT.build(seed=4)
    model.to(getattr(torch, dtype)).save_pretrained(str(folder))
    plan = Plan(checkpoint_load_device=torch.device("cpu"))  # CPU offload: DEV-1
    module, report = loaded_or_skip(
        lambda: loader.load_dit(
            DitRequest(dit_build(folder, diffusers), folder, plan=plan, kinds=LINEAR_KINDS)
        ),
        judged_by="ZC-15",
    )
    params = dict(module.named_parameters())
    mapped = {name for name, p in params.items() if file_position(p) is not None}
    records = {r.name: r for r in report.records}
    assert {name for name in params if records[name].how == "adopted"} == mapped
    assert report.adopted == (len(mapped), sum(params[name].nbytes for name in mapped))
    copied = set(params) - mapped
    assert report.copied == (len(copied), sum(params[name].nbytes for name in copied))
    assert all((records[name].reason or "").startswith("ZC-") for name in copied), records


@pytest.mark.rule("ZC-2b")
def test_a_diffusers_dit_from_a_bfloat16_file_is_converted_once(
    loader: SeamLoader, tmp_path: Path, diffusers: ModuleType
) -> None:
    """ZC-2b: a plain parameter whose file tensor has another dtype takes it converted once to
    the slot's dtype: fresh float32 memory (not the file's), values equal the conversion; the
    class is diffusers' own, built unedited (its rotary buffers computed by construction)."""
    folder = tmp_path / "transformer"
    model: Any = WAN_DIT.build(seed=4)
    model.to(torch.bfloat16).save_pretrained(str(folder))
    plan = Plan(checkpoint_load_device=torch.device("cpu"))  # CPU offload: DEV-1
    module, _ = loaded_or_skip(
        lambda: loader.load_dit(
            DitRequest(dit_build(folder, diffusers), folder, plan=plan, kinds=LINEAR_KINDS)
        ),
        judged_by="ZC-15",
    )
    stored = model.state_dict()
    for name, param in module.named_parameters():
        assert param.dtype == torch.float32, name
        assert file_position(param) is None, name
        assert torch.equal(param.detach(), stored[name].float()), name


@pytest.mark.rule("ZC-2b")
@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
def test_a_diffusers_dit_from_a_float32_file_is_the_file(
    loader: SeamLoader, tmp_path: Path, diffusers: ModuleType, sharded: bool
) -> None:
    """ZC-2b: every plain parameter whose file tensor fits (float32, contiguous) is adopted
    under the offload plan: its first byte maps the checkpoint file at that tensor's offset."""
    folder = tmp_path / "transformer"
    model: Any = WAN_DIT.build(seed=4)
    model.save_pretrained(str(folder), max_shard_size="1MB" if sharded else "10GB")
    plan = Plan(checkpoint_load_device=torch.device("cpu"))  # CPU offload: DEV-1
    module, _ = loaded_or_skip(
        lambda: loader.load_dit(
            DitRequest(dit_build(folder, diffusers), folder, plan=plan, kinds=LINEAR_KINDS)
        ),
        judged_by="ZC-15",
    )
    positions = tensor_positions(folder)
    stored = model.state_dict()
    for name, param in module.named_parameters():
        assert file_position(param) == positions[name], name
        assert torch.equal(param.detach(), stored[name]), name


@pytest.mark.rule("ZC-15")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_diffusers_dit_keeps_the_buffers_construction_gave_it(
    loader: SeamLoader, tmp_path: Path, diffusers: ModuleType, dtype: str
) -> None:
    """ZC-15: the class's buffers computed by construction (its rotary tables, not in the file)
    come back as buffers holding what construction gave them, never on meta; the load neither
    refuses nor breaks on them."""
    folder = tmp_path / "transformer"
    model: Any = WAN_DIT.build(seed=4)
    model.to(getattr(torch, dtype)).save_pretrained(str(folder))
    plan = Plan(checkpoint_load_device=torch.device("cpu"))  # CPU offload: DEV-1
    module, _ = loader.load_dit(
        DitRequest(dit_build(folder, diffusers), folder, plan=plan, kinds=LINEAR_KINDS)
    )
    constructed = dict(dit_build(folder, diffusers)().named_buffers())
    assert constructed, "the diffusers DiT has buffers"
    buffers = dict(module.named_buffers())
    parameters = dict(module.named_parameters())
    for name, value in constructed.items():
        assert name in buffers, f"buffer {name} is no longer a buffer"
        assert name not in parameters, f"buffer {name} came back as a Parameter"
        assert not buffers[name].is_meta, f"buffer {name} was left on meta"
        assert torch.equal(buffers[name].cpu(), value), f"{name} does not hold construction's value"
