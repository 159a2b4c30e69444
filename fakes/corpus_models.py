"""Models that fit the bad-checkpoint corpus, and pipelines whose weights are a corpus entry.

Every corpus entry (fakes/corrupt.py) is broken from one valid base, `small_state()`:
`proj.weight` (8, 4) F32, `proj.bias` (8,) F32, `norm.weight` (4,) BF16. The models here have
exactly those slots, so the base loads on every path and a corpus entry can only fail for being
corrupt, never for belonging to another model.

Every instance is tracked weakly, so a test can prove that no model built by a failed load is
still alive once the error is gone (CKPT-5). `while_building(hook)` runs a hook at the end of each
construction: a test's stand-in for another process that cuts a shard while a load runs.
Both classes are in `MODEL_CLASSES`
(`python -m reference load DIR --models fakes.corpus_models`).
"""

from __future__ import annotations

import gc
import itertools
import shutil
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from fakes.layers import LINEAR_KINDS, ReplicatedLinear
from fakes.pipelines import FakeComponent, write_pipeline
from fakes.quant import quant_method_factory
from reference.request.quantization import QuantizationSpec

__all__ = [
    "CORPUS_PIPELINE",
    "MODEL_CLASSES",
    "CorpusDiT",
    "CorpusVAE",
    "corpus_pipeline",
    "mark",
    "survivors",
    "while_building",
]

_SERIALS = itertools.count()

ROPE_DIM = 32
"""Frequencies per position of the corpus models' rotary tables (`rope_max_seq_len`)."""
_LIVE: weakref.WeakValueDictionary[int, nn.Module] = weakref.WeakValueDictionary()


_HOOKS: list[Callable[[], None]] = []


def _built(module: nn.Module) -> None:
    _LIVE[next(_SERIALS)] = module
    for hook in list(_HOOKS):
        hook()


@contextmanager
def while_building(hook: Callable[[], None]) -> Iterator[None]:
    """Within the block, `hook()` runs each time a corpus model has been constructed."""
    _HOOKS.append(hook)
    try:
        yield
    finally:
        _HOOKS.remove(hook)


def mark() -> int:
    """A point in time: models built after it are the ones `survivors(mark)` looks at."""
    return next(_SERIALS)


def survivors(since: int) -> list[nn.Module]:
    """Corpus models built after `since` that are still reachable (after a full collection)."""

    def alive() -> list[nn.Module]:
        return [module for serial, module in list(_LIVE.items()) if serial > since]

    if not alive():
        return []
    gc.collect()  # linear layers hold their loaders, which hold them: a cycle only gc frees
    return alive()


class CorpusDiT(nn.Module):
    """A DiT-shaped model of the corpus's slots: a standard replicated linear (adoptable) and a
    bf16 norm without `weight_loader` (copied)."""

    linear_kinds = LINEAR_KINDS

    def __init__(
        self,
        *,
        quantization: QuantizationSpec | None = None,
        table_length: int = 0,
        rope_max_seq_len: int = 0,
    ) -> None:
        super().__init__()
        self.proj = ReplicatedLinear(4, 8, quant_method=quant_method_factory(quantization)())
        self.norm = nn.LayerNorm(4, bias=False, dtype=torch.bfloat16)
        if table_length:  # a table computed in __init__, sized by config.json (a rotary table)
            table = torch.arange(table_length, dtype=torch.float32)
            self.register_buffer("table", table, persistent=False)
        if rope_max_seq_len:  # a rotary table as diffusers' DiTs derive one: positions x freqs
            positions = torch.arange(rope_max_seq_len, dtype=torch.float32)
            angles = torch.outer(positions, torch.linspace(0.0, 1.0, ROPE_DIM))
            self.register_buffer("rope", angles.cos(), persistent=False)
        _built(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(self.norm(x.to(torch.bfloat16)).float())
        return out


class CorpusVAE(nn.Module):
    """A VAE-shaped model of the corpus's slots, under the standard state-dict ABI."""

    def __init__(self, *, extra_width: int = 0, rope_max_seq_len: int = 0) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 8)
        self.norm = nn.LayerNorm(4, bias=False, dtype=torch.bfloat16)
        if extra_width:  # a layer sized by config.json; no checkpoint holds it
            self.extra = nn.Linear(extra_width, extra_width, bias=False)
        if rope_max_seq_len:  # a table computed in __init__ (a video VAE's temporal frequencies)
            positions = torch.arange(rope_max_seq_len, dtype=torch.float32)
            angles = torch.outer(positions, torch.linspace(0.0, 1.0, ROPE_DIM))
            self.register_buffer("rope", angles.cos(), persistent=False)
        _built(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(self.norm(x.to(torch.bfloat16)).float())
        return out


MODEL_CLASSES: dict[str, type[nn.Module]] = {cls.__name__: cls for cls in (CorpusDiT, CorpusVAE)}
"""The corpus pipelines' classes by name, handed to a loader through the seam."""

CORPUS_PIPELINE = {
    "transformer": FakeComponent(CorpusDiT, seed=4),
    "vae": FakeComponent(CorpusVAE, seed=5),
}
"""A pipeline of the corpus models; its own weights are valid."""


def corpus_pipeline(root: Path, *, emptied: str | None = None) -> Path:
    """Write `CORPUS_PIPELINE` into `root`; with `emptied`, that component's folder keeps its
    config.json but loses its weights, ready for a corpus entry to be written into it.

    Returns:
        The emptied component's folder, or `root` when none was emptied.
    """
    write_pipeline(root, CORPUS_PIPELINE)
    if emptied is None:
        return root
    folder = root / emptied
    for path in folder.iterdir():
        if path.name != "config.json":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return folder
